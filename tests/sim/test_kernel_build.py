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

from gpufleet.sim.fleet import GITHUB_ADDR, GITHUB_PORT

from gpufleet.engine import detached
from gpufleet.kernel.buildcache import record_path
from gpufleet.engine.command import Cmd
from gpufleet.config.inventory import load_inventory
from gpufleet.engine.runner import session_for
from gpufleet.sim import upstream as up

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

    # A snapshot: the key covers the patches, so an edit to them during the test would ask gpu3 for a new build.
    patches = shutil.copytree(REPO / "patches/sgl-kernel", tmp_path / "patches")
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu1", "gpu3"],
                           extra="".join(f'[hosts.{h}.stack.sgl_kernel]\npatches = "{patches}"\n'
                                         for h in ("gpu1", "gpu3")))
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
        assert "[gpu1] applied: 0001-fa3-can-be-turned-off.patch" in proc1.stderr
        # built from its own tree (HEAD's sgl-kernel/ exported and patched in the job's directory), removed once
        # the wheel was installed
        assert re.search(r"\[gpu1\] build tree: sgl-kernel at [0-9a-f]{12} from /root/sglang-main, 1 patch\(es\) "
                         r"applied, in /var/lib/gpufleet/builds/[0-9a-f]{64}/src", proc1.stderr), proc1.stderr[-3000:]
        # the plan said what each library would target under the stack's options, as the patched CMakeLists reads
        assert "common_ops_sm90_build, common_ops_sm100_build: sm_90,sm_100a,sm_103a,sm_120a" in built["reason"]
        [key] = [k for k in sim_fleet.run_on("gpu1", "ls /var/lib/gpufleet/builds").stdout.split()
                 if k.startswith(key12)]
        assert sim_fleet.run_on("gpu1", f"test -e /var/lib/gpufleet/builds/{key}/src", check=False).returncode == 1
        rec1 = json.loads(sim_fleet.run_on("gpu1", f"cat {record_path(key)}").stdout)
        # what was really built, read off the installed libraries (no build_info: real sgl_kernel has none)
        assert rec1["origin"] == "built-here" and rec1["fp4"] is True
        assert rec1["archs"] == ["sm_90", "sm_100a", "sm_103a", "sm_120a"], rec1
        assert set(rec1["fp4_ops"].values()) == {"sgl_kernel"} and rec1["torch"].startswith("2.12.0")
        libs = rec1["libraries"]
        assert {"sm90", "sm100"} <= {name.split("/")[0] for name in libs}, libs
        assert not any("flash_ops" in name for name in libs)  # FA3 turned off through the site patch
        # FetchContent: the control node's archive was handed over and CMake was told to stay offline
        cache = sim_fleet.run_on("gpu1", f"cat /var/lib/gpufleet/builds/{key}/cmake-build/CMakeCache.txt").stdout
        assert "FETCHCONTENT_FULLY_DISCONNECTED:UNINITIALIZED=ON" in cache or "FETCHCONTENT_FULLY_DISCONNECTED:BOOL=ON" in cache
        assert "FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS:UNINITIALIZED=/var/cache/gpufleet/sources/repo-cutlass-" in cache \
            or "FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS:PATH=/var/cache/gpufleet/sources/repo-cutlass-" in cache
        # the host cannot reach the sim's "GitHub" (loopback of the control node): the sources came from gpufleet
        assert sim_fleet.run_on("gpu1", f"timeout 10 git ls-remote git://{GITHUB_ADDR}:{GITHUB_PORT}/NVIDIA/cutlass",
                                check=False).returncode != 0
        # the build left the checkout as it found it: only the two local SM120 edits
        status = sim_fleet.run_on("gpu1", "git -C /root/sglang-main status --porcelain").stdout.split("\n")
        assert sorted(line[3:] for line in status if line) == [up.SIZES_FILE, up.SYMM_MEM_FILE]
        assert (tmp_path / "cache" / "sgl-kernel" / key / "record.json").exists()

        proc3, [r3] = upgrade("--host", "gpu3")
        installed = kernel(r3)
        assert installed["status"] == "changed", installed
        assert installed["title"].startswith("install sgl-kernel wheel") and installed["title"].endswith(
            f"(build {key12})"), installed
        assert next(e for e in r3["entries"] if e["role"] == "verify")["reason"].endswith("with FP4 ops import together"), r3
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
