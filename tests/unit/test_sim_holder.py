"""The simulated fleet's holder lock: a second run with the same prefix or subnet is refused, naming the first."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpufleet.sim import holder
from gpufleet.sim.holder import FleetInUse


def _other_process(lock_dir, prefix, subnet):
    """Another process holding the fleet until its stdin closes; returns once it holds it."""
    code = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from gpufleet.sim import holder
        holder.hold({prefix!r}, {subnet!r}, Path({str(lock_dir)!r}))
        print("held", flush=True)
        sys.stdin.read()
    """)
    proc = subprocess.Popen([sys.executable, "-c", code, "--the-other-run"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def _end(proc):
    proc.stdin.close()
    proc.wait(timeout=10)


@pytest.fixture(autouse=True)
def _nothing_held():
    yield
    for path in list(holder._held):
        holder._drop(path)


def test_a_second_run_on_the_same_prefix_is_refused_naming_the_first(tmp_path):
    other = _other_process(tmp_path, "gpt", "10.238.0")
    try:
        with pytest.raises(FleetInUse) as err:
            holder.hold("gpt", "10.238.0", tmp_path)
        text = str(err.value)
        assert f"pid {other.pid}" in text and "--the-other-run" in text
        assert "GPUFLEET_SIM_PREFIX=gpt" in text and "another GPUFLEET_SIM_PREFIX and GPUFLEET_SIM_SUBNET" in text
    finally:
        _end(other)
    holder.hold("gpt", "10.238.0", tmp_path)  # the kernel dropped the lock with its process


def test_the_same_subnet_under_another_prefix_is_refused_and_takes_nothing(tmp_path):
    other = _other_process(tmp_path, "gpa", "10.238.0")
    try:
        with pytest.raises(FleetInUse, match="gpufleet-sim-subnet-10.238.0.lock"):
            holder.hold("gpb", "10.238.0", tmp_path)
        assert holder._held == {}  # the prefix lock it took first was given back
        third = _other_process(tmp_path, "gpb", "10.239.0")
        _end(third)
    finally:
        _end(other)


def test_holding_twice_is_one_hold_and_release_frees_it(tmp_path):
    holder.hold("gpt", "10.238.0", tmp_path)
    holder.hold("gpt", "10.238.0", tmp_path)  # up() after a fixture's hold, down() inside a held session
    with pytest.raises(AssertionError):
        _other_process(tmp_path, "gpt", "10.238.0")
    holder.release("gpt", "10.238.0", tmp_path)
    _end(_other_process(tmp_path, "gpt", "10.238.0"))


def test_a_server_the_fleet_started_does_not_keep_the_lock(tmp_path):
    holder.hold("gpt", "10.238.0", tmp_path)
    server = subprocess.Popen(["sleep", "60"])  # the index and git daemon outlive the run that started them
    try:
        holder.release("gpt", "10.238.0", tmp_path)
        _end(_other_process(tmp_path, "gpt", "10.238.0"))
    finally:
        server.kill()
        server.wait()
