"""One holder at a time for a simulated fleet: its prefix and subnet name namespaces, cgroups and links that are the
whole machine's, so a second test run or `inv sim.up` with the same ones would tear down the first one's hosts."""

from __future__ import annotations

import fcntl
import os
import shlex
import sys
from pathlib import Path

from gpufleet.errors import GpufleetError

# Outside each fleet's run directory (down() removes that) and in a tmpfs, so a reboot leaves no stale file behind;
# the kernel drops the lock with its process, so a killed run's lock never outlives it.
LOCK_DIR = Path("/run/lock") if Path("/run/lock").is_dir() else Path("/run")

_held: dict[str, int] = {}  # lock path -> open descriptor, for this process's life


class FleetInUse(GpufleetError):
    """Another live process holds the simulated fleet's prefix or subnet."""


def paths(prefix: str, subnet: str, lock_dir: Path = LOCK_DIR) -> list[Path]:
    """The lock files for a fleet: one per prefix, one per subnet (two prefixes on one subnet collide too)."""
    return [lock_dir / f"gpufleet-sim-prefix-{prefix}.lock", lock_dir / f"gpufleet-sim-subnet-{subnet}.lock"]


def hold(prefix: str, subnet: str, lock_dir: Path = LOCK_DIR) -> None:
    """Take the fleet's locks until release() or this process's end; FleetInUse naming the holder when taken."""
    taken = []
    try:
        for path in paths(prefix, subnet, lock_dir):
            if str(path) not in _held:
                _take(path, prefix, subnet)
                taken.append(path)
    except FleetInUse:
        for path in taken:
            _drop(path)
        raise


def release(prefix: str, subnet: str, lock_dir: Path = LOCK_DIR) -> None:
    """Give the fleet's locks back (a no-op for locks this process does not hold)."""
    for path in paths(prefix, subnet, lock_dir):
        _drop(path)


def _take(path: Path, prefix: str, subnet: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited: the servers the fleet starts outlive us
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 1024, 0).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise FleetInUse(f"the simulated fleet with GPUFLEET_SIM_PREFIX={prefix} and GPUFLEET_SIM_SUBNET={subnet} "
                         f"is in use by {holder} (lock {path}): wait for it to end, or run this one with another "
                         f"GPUFLEET_SIM_PREFIX and GPUFLEET_SIM_SUBNET") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} ({shlex.join(sys.argv)[:300]})\n".encode(), 0)
    _held[str(path)] = fd


def _drop(path: Path) -> None:
    fd = _held.pop(str(path), None)
    if fd is not None:
        os.close(fd)
