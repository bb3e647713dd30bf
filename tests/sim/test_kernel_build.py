"""End to end: a detached build job survives a cut link and is followed to its exit code exactly once; through
`inv upgrade`, a second host with the same build key installs the first host's wheel instead of compiling."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
import uuid

import pytest

from gpufleet import detached
from gpufleet.buildcache import record_path
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


def test_wait_cmd_run_again_attaches_to_the_running_job(sim_fleet):
    """What a reattach after a lost connection does: the same wait command again follows the job, starts nothing."""
    key = uuid.uuid4().hex
    job = detached.Job.for_key(key, base="/var/lib/gpufleet/test-jobs")
    marker = f"/tmp/gpufleet-runs-{key}"
    cmd = Cmd.of("bash", "-c", f"echo run >> {marker}; for i in $(seq 1 6); do echo step $i; sleep 1; done; exit 5")
    first, second = _session(sim_fleet, "gpu2"), _session(sim_fleet, "gpu2")
    results = {}
    try:
        waiter = threading.Thread(target=lambda: results.setdefault(
            "first", first.run(detached.wait_cmd(job, cmd, poll=0.5), "first", check=False, timeout=60)))
        waiter.start()
        deadline = time.monotonic() + 30
        while detached.state(second, job).status != "running" and time.monotonic() < deadline:
            time.sleep(0.2)
        again = second.run(detached.wait_cmd(job, cmd, poll=0.5), "again", check=False, timeout=60)
        waiter.join(60)
        assert results["first"].exit_code == 5 and again.exit_code == 5, (results, again)
        assert again.output.splitlines()[0] == "running" and "step 6" in again.output, again.output
        assert "started" not in again.output.splitlines()
        assert second.run(Cmd.of("cat", marker), "count runs").output.split() == ["run"]
    finally:
        first.close(), second.close()


def test_second_host_with_the_same_build_key_installs_the_first_hosts_wheel(sim_fleet, tmp_path, monkeypatch):
    """`inv upgrade` on gpu1 builds sgl-kernel; then on gpu3 (same key) installs gpu1's wheel and compiles nothing."""
    from tests.sim.helpers import REPO, inv_json, write_inventory

    if not (REPO / "patches/sgl-kernel/series").exists():
        pytest.skip("no site patches for sgl-kernel: the simulated upstream does not build unpatched on CMake < 3.31")
    # A snapshot: the key covers the patches, so an edit to them during the test would ask gpu3 for a new build.
    patches = shutil.copytree(REPO / "patches/sgl-kernel", tmp_path / "patches")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1", "gpu3"],
                           extra=f'[defaults.stack.sgl_kernel]\npatches = "{patches}"\n')
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))  # empty: gpu1 must build
    starts = "journalctl --no-pager -o cat | grep -c '^Started gpufleet-build-'"

    def upgrade(*args):
        proc, reports = inv_json("upgrade", "--inventory", str(path), *args)
        assert proc.returncode == 0, (reports, proc.stderr[-3000:])
        return proc, reports

    def kernel(report):
        [entry] = [e for e in report["entries"] if e["role"] == "sgl-kernel"]
        return entry

    try:
        for name in ("gpu1", "gpu3"):
            sim_fleet.reset_host(name)
        proc1, [r1] = upgrade("--host", "gpu1")
        built = kernel(r1)
        assert built["status"] == "changed" and built["title"].startswith("build sgl-kernel"), built
        key12 = re.search(r"\(build ([0-9a-f]{12}),", built["title"])[1]
        assert "[gpu1] applied: 0002-cmake-policy-guards.patch" in proc1.stderr
        [key] = [k for k in sim_fleet.run_on("gpu1", "ls /var/lib/gpufleet/builds").stdout.split()
                 if k.startswith(key12)]
        rec1 = json.loads(sim_fleet.run_on("gpu1", f"cat {record_path(key)}").stdout)
        assert rec1["origin"] == "built-here" and rec1["fp4"] is True and "sm_120a" in rec1["archs"]
        assert (tmp_path / "cache" / "sgl-kernel" / key / "record.json").exists()

        proc3, [r3] = upgrade("--host", "gpu3")
        installed = kernel(r3)
        assert installed["status"] == "changed", installed
        assert installed["title"].startswith("install sgl-kernel wheel") and installed["title"].endswith(
            f"(build {key12})"), installed
        assert r3["entries"][-1]["reason"].endswith("with FP4 ops import together"), r3["entries"][-1]
        rec3 = json.loads(sim_fleet.run_on("gpu3", f"cat {record_path(key)}").stdout)
        assert rec3["key"] == key and rec3["origin"] == "copied-from gpu1" and rec3["archs"] == rec1["archs"]
        # No compile on gpu3: no build log, no CMake build dir, no build unit, no patch applied.
        assert sim_fleet.run_on("gpu3", f"test -e /var/lib/gpufleet/builds/{key}/build.log", check=False
                                ).returncode == 1
        assert sim_fleet.run_on("gpu3", f"test -d /var/lib/gpufleet/builds/{key}/cmake-build", check=False
                                ).returncode == 1
        assert sim_fleet.run_on("gpu3", starts, check=False).stdout.strip() == "0"
        assert "applied:" not in proc3.stderr
        # Both converged: the plan for both changes nothing and builds nothing.
        _, plans = upgrade("--hosts", "gpu1,gpu3", "--dry-run")
        assert {(r["host"], e["status"]) for r in plans for e in r["entries"]} == {("gpu1", "unchanged"),
                                                                                  ("gpu3", "unchanged")}
        assert [sim_fleet.run_on(h, starts, check=False).stdout.strip() for h in ("gpu1", "gpu3")] == ["1", "0"]
    finally:
        # The fleet is shared by the whole session: later tests expect the old stack on every host.
        for name in ("gpu1", "gpu3"):
            sim_fleet.reset_host(name)
