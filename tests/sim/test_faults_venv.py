"""End to end, faults injected for real: the live venv is the old stack or the new one, never a mix.

gpufleet killed (SIGKILL) while pip installs, a wheel that is corrupt although the index lists its own hash, and a
venv on a filesystem too small for the new wheels."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.sim import wheels
from tests.sim.helpers import REPO, inv_json, write_inventory

pytestmark = pytest.mark.sim

TORCH = wheels.TARGET["torch"]
# The live venv as a user's server sees it: packages, every file with its size and mtime, every directory and link
# (a directory's own size is left out: overlayfs reports another one once the sim's root copies it up).
LIVE = r"""
cd / && {venv}/bin/python -m pip freeze --all
find {venv} -name __pycache__ -prune -o -type f -printf '%p %s %T@\n' | sort
find {venv} -name __pycache__ -prune -o -type d -printf '%p\n' -o -type l -printf '%p -> %l\n' | sort
"""


def on(fleet, host: str, command: str, check: bool = True) -> str:
    return fleet.run_on(host, command, check=check).stdout


def live(fleet, host: str, venv: str = "/root/venv") -> str:
    return on(fleet, host, LIVE.format(venv=venv))


def pip_check(fleet, host: str, venv: str = "/root/venv") -> subprocess.CompletedProcess:
    return fleet.run_on(host, f"cd / && {venv}/bin/python -m pip check", check=False)


def torch_of(fleet, host: str, venv: str = "/root/venv") -> str:
    out = on(fleet, host, f"cd / && {venv}/bin/python -m pip list --format=freeze")
    return dict(line.split("==", 1) for line in out.splitlines() if "==" in line)["torch"]


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)
    yield sim_fleet
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)


def wait_for(predicate, what: str, timeout: float = 300.0, every: float = 0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_while_pip_installs_leaves_the_live_venv_as_it_was_and_a_rerun_converges(fleet, tmp_path):
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu1"])
    before = live(fleet, "gpu1")
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "upgrade", "--inventory", str(inventory), "--host", "gpu1",
                             "--only", "torch,flashinfer"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        # pip at work in the staged copy: kill gpufleet there, as a dropped laptop or an OOM killer would
        wait_for(lambda: fleet.run_on("gpu1", "pgrep -f 'venv.gpufleet-next/bin/python .*pip install --progress-bar off --no-index'",
                                      check=False).returncode == 0, "pip installing into the staged venv")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # The orphaned pip may run on to its end on the host; the live venv never sees it either way.
    wait_for(lambda: fleet.run_on("gpu1", "pgrep -f 'pip install'", check=False).returncode != 0, "pip to end")
    assert live(fleet, "gpu1") == before
    assert pip_check(fleet, "gpu1").returncode == 0
    assert on(fleet, "gpu1", "cat /root/venv.gpufleet-next.json")  # the copy and its state stay for the re-run
    assert on(fleet, "gpu1", "test -d /var/lib/gpufleet/lock && echo held").strip() == "held"

    again, [report] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu1", "--only",
                               "torch,flashinfer")
    assert again.returncode == 0, (report, again.stderr[-3000:])
    assert "took over a stale lock" in again.stderr
    assert "discarded an earlier staged copy: a run stopped in the middle of changing it" in again.stderr
    assert report["changed"][-1] == "venv: switch /root/venv to the staged copy in one atomic swap"
    assert torch_of(fleet, "gpu1") == TORCH and pip_check(fleet, "gpu1").returncode == 0
    assert fleet.run_on("gpu1", "ls -d /root/venv.gpufleet-next*", check=False).returncode != 0
    assert fleet.run_on("gpu1", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1
    audit = [json.loads(line) for line in on(fleet, "gpu1", "cat /var/lib/gpufleet/audit.log").splitlines()]
    assert audit[-1]["outcome"] == "ok" and audit[-1]["snapshot"] == report["snapshot"]
    # the re-run's snapshot is of the old stack (the live venv), so a rollback goes back to it
    assert "torch==2.9.1+cu130" in on(fleet, "gpu1", f"cat {report['snapshot']}/pip-freeze.txt").splitlines()


def corrupt_a_member(wheel: Path) -> None:
    """Flip one byte inside a package file's data: the wheel still opens and its metadata reads, but pip's unpacking
    fails its CRC check halfway through the install."""
    import struct
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        victim = max((i for i in z.infolist() if ".dist-info/" not in i.filename), key=lambda i: i.compress_size)
    data = bytearray(wheel.read_bytes())
    name_len, extra_len = struct.unpack("<HH", data[victim.header_offset + 26: victim.header_offset + 30])
    start = victim.header_offset + 30 + name_len + extra_len
    data[start + victim.compress_size // 2] ^= 0xFF
    wheel.write_bytes(bytes(data))


def test_a_corrupt_wheel_the_index_vouches_for_fails_the_install_and_the_live_venv_stays(fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))  # the control node fetches the bad file
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu2"])
    good = fleet.index_root / "files" / f"torch-{TORCH}-py3-none-any.whl"
    saved = tmp_path / good.name
    saved.write_bytes(good.read_bytes())
    before = live(fleet, "gpu2")
    try:
        corrupt_a_member(good)
        fleet.publish(good)  # the index now lists the corrupt file's own sha256
        proc, [report] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu2", "--only",
                                  "torch,flashinfer")
    finally:
        good.write_bytes(saved.read_bytes())
        fleet.publish(good)
    assert proc.returncode == 1 and report["outcome"] == "failed"
    assert report["entries"][0]["status"] == "failed" and "install torch" in report["entries"][0]["title"]
    assert "the live venv /root/venv is untouched" in report["next"]
    assert live(fleet, "gpu2") == before and pip_check(fleet, "gpu2").returncode == 0
    assert fleet.run_on("gpu2", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1

    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache2"))
    again, [report] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu2", "--only",
                               "torch,flashinfer")
    assert again.returncode == 0, (report, again.stderr[-3000:])
    assert torch_of(fleet, "gpu2") == TORCH and pip_check(fleet, "gpu2").returncode == 0


def test_a_venv_on_a_filesystem_too_small_for_the_wheels_is_refused_before_any_change(fleet, tmp_path):
    fleet.run_on("gpu3", "mkdir -p /mnt/small && mount -t tmpfs -o size=40m gpufleet-small /mnt/small && "
                         "cp -a /root/venv /mnt/small/venv")
    try:
        inventory = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu3"],
                                    extra='[hosts.gpu3]\nvenv = "/mnt/small/venv"\n')
        before = live(fleet, "gpu3", "/mnt/small/venv")
        proc, [report] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu3")
        assert proc.returncode == 1 and report["outcome"] == "failed"
        error = report["error"]
        assert error.startswith("host gpu3: too little disk for /mnt/small/venv: it needs "), error
        assert "unpacked into the venv" in error and "MiB is free there; nothing was written" in error
        assert live(fleet, "gpu3", "/mnt/small/venv") == before
        assert on(fleet, "gpu3", "ls -A /mnt/small").split() == ["venv"]  # no staged copy, no state file
        assert fleet.run_on("gpu3", "ls /var/lib/gpufleet/snapshots 2>/dev/null | grep -q .",
                            check=False).returncode == 1  # refused before the snapshot too
        assert fleet.run_on("gpu3", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1
    finally:
        fleet.run_on("gpu3", "umount /mnt/small", check=False)


def test_a_second_real_run_on_a_host_being_upgraded_is_refused_naming_the_first(fleet, tmp_path):
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu3"])
    first = subprocess.Popen([sys.executable, "-m", "invoke", "upgrade", "--inventory", str(inventory), "--host", "gpu3",
                              "--only", "torch,flashinfer"], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: fleet.run_on("gpu3", "test -s /var/lib/gpufleet/lock/holder", check=False).returncode == 0,
                 "the first run to take the host's lock")
        second, [report] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu3")
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == 1 and report["outcome"] == "locked"
    assert "host gpu3 is locked by " in report["error"] and f"(pid {first.pid}, since " in report["error"]
    assert "still runs on" in report["error"], report["error"]
    assert first.returncode == 0, out[-2000:] + err[-3000:]
    assert torch_of(fleet, "gpu3") == TORCH and pip_check(fleet, "gpu3").returncode == 0
    assert fleet.run_on("gpu3", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1
