"""End to end: a detached build job survives a cut link and is followed to its exit code exactly once."""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from gpufleet import detached
from gpufleet.command import Cmd
from gpufleet.inventory import load_inventory
from gpufleet.runner import session_for

pytestmark = pytest.mark.sim


def _session(fleet, name):
    inv = load_inventory(fleet.inventory_path)
    return session_for(inv.hosts[name], inv).open()


def test_detached_job_survives_a_cut_link(sim_fleet):
    key = uuid.uuid4().hex
    job = detached.Job.for_key(key, base="/var/lib/gpufleet/test-jobs")
    marker = f"/tmp/gpufleet-runs-{key}"
    cmd = Cmd.of("bash", "-c", f"echo run >> {marker}; for i in $(seq 1 12); do echo step $i; sleep 1; done; exit 3")
    session = _session(sim_fleet, "gpu1")
    try:
        assert detached.start(session, job, cmd) == "started"
        assert detached.state(session, job).status == "running"
        # A second start picks up the running job instead of starting another.
        assert detached.start(session, job, cmd) == "running"
        cut = threading.Timer(1.0, lambda: sim_fleet.set_link("gpu1", False))
        cut.start()
        restore = threading.Timer(6.0, lambda: sim_fleet.set_link("gpu1", True))
        restore.start()
        seen: list[str] = []
        rc = detached.follow(session, job, echo=seen.append, poll=0.5, reconnect_for=60)
        cut.join(), restore.join()
        assert rc == 3
        assert [line for line in seen if "step" in line] == [f"[gpu1] step {i}" for i in range(1, 13)]
        assert detached.state(session, job) == detached.State("finished", 3)
        assert detached.start(session, job, cmd) == "finished 3"
        runs = session.run(Cmd.of("cat", marker), "count runs").output.split()
        assert runs == ["run"]
        unit = session.run(Cmd.of("systemctl", "is-active", job.unit), "unit", check=False).output.strip()
        assert unit in ("inactive", "unknown", "failed")
    finally:
        sim_fleet.set_link("gpu1", True)
        session.close()


def test_wait_cmd_streams_and_returns_exit_code(sim_fleet):
    key = uuid.uuid4().hex
    job = detached.Job.for_key(key, base="/var/lib/gpufleet/test-jobs")
    session = _session(sim_fleet, "gpu2")
    try:
        res = session.run(detached.wait_cmd(job, Cmd.of("bash", "-c", "echo hello; sleep 2; echo bye; exit 4"),
                                            poll=0.5), "wait", check=False, timeout=60)
        assert res.exit_code == 4
        assert "hello" in res.output and "bye" in res.output
    finally:
        session.close()
