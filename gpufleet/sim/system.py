"""Thin wrappers over the Linux primitives the simulated fleet is made of: mounts, netns, links, cgroups, pids."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

CGROUP_HIERARCHIES = (Path("/sys/fs/cgroup/systemd"), Path("/sys/fs/cgroup/unified"))


def sh(*argv: str, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    """Run a local command; on failure raise with its output so the harness error says what broke."""
    proc = subprocess.run(list(argv), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(argv)}` exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()}")
    return proc


def mounts_under(prefix: Path) -> list[str]:
    """Mount points at or below prefix, deepest last in mount order (so reversed() unmounts safely)."""
    found = []
    for line in Path("/proc/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target == str(prefix) or target.startswith(str(prefix) + "/"):
            found.append(target)
    return found


def unmount_all(prefix: Path) -> None:
    """Unmount everything below prefix, innermost first; a busy mount is detached lazily."""
    for target in reversed(mounts_under(prefix)):
        if sh("umount", target, check=False).returncode != 0:
            sh("umount", "-l", target, check=False)


def netns_list(prefix: str) -> list[str]:
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(prefix)]


def links(prefix: str) -> list[str]:
    out = sh("ip", "-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if name.startswith(prefix):
            names.append(name)
    return names


def cgroup_dirs(name: str) -> list[Path]:
    return [h / name for h in CGROUP_HIERARCHIES]


def cgroup_pids(name: str) -> set[int]:
    """Every pid inside our own cgroup (and its children): processes we started, nothing else."""
    pids: set[int] = set()
    for top in cgroup_dirs(name):
        if not top.is_dir():
            continue
        for procs in top.rglob("cgroup.procs"):
            try:
                pids.update(int(p) for p in procs.read_text().split())
            except OSError:
                pass
    return pids


def remove_cgroup(name: str, timeout: float = 15.0) -> None:
    """Kill what is left in our cgroup, then remove its directories depth-first."""
    deadline = time.monotonic() + timeout
    while (pids := cgroup_pids(name)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.2)
    for top in cgroup_dirs(name):
        if not top.is_dir():
            continue
        for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            d.rmdir()
        top.rmdir()


def pid_alive(pid: int, cmd_marker: str) -> bool:
    """True when pid runs and its command line contains the marker (guards against pid reuse)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return cmd_marker in cmdline


def stop_pid(pid: int, cmd_marker: str, timeout: float = 20.0) -> None:
    """SIGTERM a process we started (checked by its command line), SIGKILL it after timeout."""
    if not pid_alive(pid, cmd_marker):
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid, cmd_marker) and time.monotonic() < deadline:
        _reap(pid)
        time.sleep(0.1)
    if pid_alive(pid, cmd_marker):
        os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)
    _reap(pid)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def spawn_detached(argv: list[str], log: Path, cgroup: str | None = None) -> int:
    """Start a process in its own session that outlives us; optionally first move it into a cgroup of its own."""
    if cgroup:
        for d in cgroup_dirs(cgroup):
            d.mkdir(exist_ok=True)
        moves = "; ".join(f"echo $$ > {d}/cgroup.procs" for d in cgroup_dirs(cgroup))
        argv = ["sh", "-c", f'{moves}; exec "$@"', "sh", *argv]
    with open(log, "ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    return proc.pid
