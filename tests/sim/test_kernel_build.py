"""End to end: a detached build job survives a cut link and is followed to its exit code exactly once."""

from __future__ import annotations

import json
import shutil
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


def _execute(session, step, echo=None):
    """Run one planned step the way the engine does: uploads, commands, then verify."""
    from urllib.parse import unquote, urlsplit

    for up in step.uploads:
        session.run(Cmd.of("mkdir", "-p", up.remote.rsplit("/", 1)[0]), "upload dir")
        session.conn.sftp().put(unquote(urlsplit(up.url).path), up.remote)
    for cmd in step.commands:
        session.run(cmd, step.title, echo=echo, timeout=600)
    for cmd in step.verify:
        session.run(cmd, "verify " + step.title)


def test_build_once_then_install_cached_wheel_elsewhere(sim_fleet, tmp_path):
    from gpufleet.buildcache import LocalCache, fetch_to_cache, record_path
    from gpufleet.gather import gather_facts
    from gpufleet.plan import PlanContext, Step, Unchanged
    from gpufleet.stack import load_stack, stack_for_host
    from roles import sgl_kernel
    from tests.sim.helpers import REPO

    if not (REPO / "patches/sgl-kernel/series").exists():
        pytest.skip("no site patches for sgl-kernel: the simulated upstream does not build unpatched on CMake < 3.31")
    # A snapshot: the key covers the patches, so an edit to them during the test would ask for a new build.
    patches = shutil.copytree(REPO / "patches/sgl-kernel", tmp_path / "patches")
    inv = load_inventory(sim_fleet.inventory_path)
    cache = LocalCache(tmp_path / "cache")

    def plan(session):
        host = inv.hosts[session.name]
        stack = stack_for_host(load_stack(REPO / "stack.toml"), host.stack_overrides,
                               source=str(inv.path), host=host.name)
        stack = stack.model_copy(update={"sgl_kernel": stack.sgl_kernel.model_copy(update={"patches": patches})})
        ctx = PlanContext(host=host, stack=stack, facts=gather_facts(session),
                          probe=lambda cmd, step: session.run(cmd, step, check=False), repo=REPO)
        return sgl_kernel.plan(ctx, cache), sgl_kernel.inputs(ctx, "x")

    s1, s3 = _session(sim_fleet, "gpu1"), _session(sim_fleet, "gpu3")
    try:
        [step], _ = plan(s1)
        assert isinstance(step, Step) and step.title.startswith("build"), step
        lines: list[str] = []
        _execute(s1, step, echo=lines.append)
        key = step.title.split("(build ")[1].split(",")[0]
        full_key = next(k for k in s1.run(Cmd.of("ls", "/var/lib/gpufleet/builds"), "ls").output.split()
                        if k.startswith(key))
        rec1 = json.loads(s1.run(Cmd.of("cat", record_path(full_key)), "record").output)
        assert rec1["origin"] == "built-here" and rec1["fp4"] is True and "sm_120a" in rec1["archs"]
        assert any("applied: 0002-cmake-policy-guards.patch" in ln for ln in lines)
        assert fetch_to_cache(s1, full_key, cache) is not None
        [again], _ = plan(s1)
        assert isinstance(again, Unchanged), (step.title, again.title, again.reason)

        [step3], _ = plan(s3)
        assert step3.title.startswith("install sgl-kernel wheel") and step3.uploads, step3
        _execute(s3, step3)
        rec3 = json.loads(s3.run(Cmd.of("cat", record_path(full_key)), "record").output)
        assert rec3["key"] == full_key and rec3["origin"] == "copied-from gpu1"
        assert rec3["archs"] == rec1["archs"]
        # No compile on gpu3: no build log, no CMake build dir.
        assert s3.run(Cmd.of("test", "-e", f"/var/lib/gpufleet/builds/{full_key}/build.log"), "log",
                      check=False).exit_code == 1
        assert s3.run(Cmd.of("test", "-d", f"/var/lib/gpufleet/builds/{full_key}/cmake-build"), "dir",
                      check=False).exit_code == 1
        [after], _ = plan(s3)
        assert isinstance(after, Unchanged), (after.title, after.reason)
    finally:
        s1.close(), s3.close()
        # The fleet is shared by the whole session: later tests expect the old stack on every host.
        for name in ("gpu1", "gpu3"):
            sim_fleet.reset_host(name)
