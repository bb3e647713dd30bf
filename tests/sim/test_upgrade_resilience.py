"""End to end: the link to a host is cut during its sgl-kernel build; `inv upgrade` reattaches and builds once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.kernel.buildcache import installed_record
from tests.sim.helpers import REPO, inv_json, write_inventory

pytestmark = pytest.mark.sim

HOST = "gpu2"
HOLD = "/root/gpufleet-test-hold-build"
# A compiler launcher (CMake's CMAKE_CXX_COMPILER_LAUNCHER, as ccache is used) that holds every compile while the
# hold file exists: the simulated build takes seconds, the link must be cut while it runs. Bounded: 5 minutes.
LAUNCHER = "/usr/local/bin/gpufleet-test-held-cxx"
LAUNCHER_TEXT = f"""#!/bin/sh
n=0
while [ -e {HOLD} ] && [ $n -lt 600 ]; do sleep 0.5; n=$((n + 1)); done
exec "$@"
"""
UNITS = "systemctl list-units --no-legend --all 'gpufleet-build-*'"
STARTS = "journalctl --no-pager -o cat | grep -c '^Started gpufleet-build-'"  # build units ever started


def _wait_for(what: str, check, timeout: float, proc: subprocess.Popen, output: Path, poll: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            raise AssertionError(f"inv upgrade exited {proc.returncode} before {what}:\n{output.read_text()}")
        time.sleep(poll)
    raise AssertionError(f"no {what} within {timeout:.0f}s:\n{output.read_text()}")


def _link_down_until_lost(fleet, proc: subprocess.Popen, output: Path, at_least: float) -> float:
    """Cut the link, keep it down until the tool has noticed (and at least `at_least` s); return how long it was."""
    cut = time.monotonic()
    fleet.set_link(HOST, False)
    try:
        _wait_for("lost connection noticed", lambda: "reattaching" in output.read_text(), 60, proc, output)
        time.sleep(max(0.0, cut + at_least - time.monotonic()))
    finally:
        fleet.set_link(HOST, True)
    return time.monotonic() - cut


@pytest.fixture
def fresh_host(sim_fleet):
    """HOST on the old stack with the held compiler launcher; the link is up and HOST fresh again afterwards."""
    sim_fleet.reset_host(HOST)
    sim_fleet.run_on(HOST, f"cat > {LAUNCHER} <<'EOF'\n{LAUNCHER_TEXT}EOF\nchmod +x {LAUNCHER} && touch {HOLD}")
    try:
        yield sim_fleet
    finally:
        sim_fleet.set_link(HOST, True)
        sim_fleet.reset_host(HOST)


def test_link_cut_during_the_kernel_build_reattaches_and_builds_once(fresh_host, tmp_path, monkeypatch):
    """The issue: the link is cut for several seconds during the sgl-kernel build; the build finishes, the tool
    reattaches, nothing is built twice."""
    fleet = fresh_host
    extra = f'[hosts.{HOST}.stack.sgl_kernel]\nextra_cmake_args = ["-DCMAKE_CXX_COMPILER_LAUNCHER={LAUNCHER}"]\n'
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", [HOST], extra=extra)
    # A dead link shows after 3 unanswered keepalives: 1 s here instead of the default 15 s.
    text = inventory.read_text()
    assert text.count("[settings]\n") == 1 and "keepalive" not in text
    inventory.write_text(text.replace("[settings]\n", "[settings]\nkeepalive = 1\n"))
    # No wheel from another test on the control node: this run must build.
    env = {**os.environ, "GPUFLEET_CACHE_DIR": str(tmp_path / "empty-cache")}
    output, report_file = tmp_path / "upgrade.out", tmp_path / "upgrade.json"
    command = [sys.executable, "-m", "invoke", "upgrade", "--inventory", str(inventory), "--host", HOST, "--json"]
    with open(output, "w") as err, open(report_file, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err, text=True)
    try:
        _wait_for("active build unit", lambda: " running " in fleet.run_on(HOST, UNITS, check=False).stdout, 300,
                  proc, output)
        down = _link_down_until_lost(fleet, proc, output, at_least=8)
        # The re-run of the build command finds the job still running (held) and follows it.
        _wait_for("reattached to the running build",
                  lambda: f"[{HOST}] running" in output.read_text().split("reattaching", 1)[1], 120, proc, output)
        fleet.run_on(HOST, f"rm -f {HOLD}")
        assert proc.wait(timeout=300) == 0, output.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        fleet.set_link(HOST, True)
        fleet.run_on(HOST, f"rm -f {HOLD}", check=False)

    text = output.read_text()
    [report] = json.loads(report_file.read_text())
    assert report["outcome"] == "ok", report
    statuses = [(e["role"], e["status"]) for e in report["entries"]]
    assert statuses == [("torch", "changed"), ("flashinfer", "changed"), ("flashinfer", "done-already"),
                        ("sglang-checkout", "unchanged"), ("sglang-checkout", "unchanged"),
                        ("sgl-kernel", "changed"), ("verify", "unchanged"), ("venv", "changed")], (statuses, down)
    build = next(e for e in report["entries"] if e["role"] == "sgl-kernel")
    assert build["title"].startswith("build sgl-kernel"), build
    assert f"[{HOST}] connection lost during '{build['title']}'; reattaching" in text
    assert text.count("reattaching") == 1, text

    # Built exactly once: the transient unit was started once, and its log holds one build.
    starts = fleet.run_on(HOST, STARTS, check=False)
    assert starts.stdout.strip() == "1", starts
    [key] = [k for k in fleet.run_on(HOST, "ls /var/lib/gpufleet/builds").stdout.split() if len(k) == 64]
    log = fleet.run_on(HOST, f"cat /var/lib/gpufleet/builds/{key}/build.log").stdout
    assert log.count("Processing ") == 1, log  # one build, of the build's own export of the checkout
    record = json.loads(fleet.run_on(HOST, f"cat /var/lib/gpufleet/builds/{key}/record.json").stdout)
    assert record["origin"] == "built-here" and record["key"] == key and record["fp4"] is True
    assert LAUNCHER in " ".join(record["inputs"]["extra_cmake_args"])
    installed = json.loads(fleet.run_on(HOST, f"cat {installed_record('/root/venv')}").stdout)
    assert installed["key"] == key

    # The host verifies: a second run (same control-node cache) finds every role done and builds nothing.
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", env["GPUFLEET_CACHE_DIR"])
    proc2, [again] = inv_json("upgrade", "--inventory", str(inventory), "--host", HOST)
    assert proc2.returncode == 0 and again["outcome"] == "ok", again
    assert {e["status"] for e in again["entries"]} == {"unchanged"}, again["entries"]
    assert "FP4 ops import together" in next(e for e in again["entries"] if e["role"] == "verify")["reason"]
    assert fleet.run_on(HOST, STARTS, check=False).stdout.strip() == "1"
