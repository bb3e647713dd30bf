"""End to end: after a killed run, the next run's cleanup leaves no process, mount, link, netns or cgroup.

Named to run last: it takes the session's fleet down."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gpufleet.sim import system
from gpufleet.sim.fleet import BRIDGE, PREFIX, VETH_PREFIX, SimFleet

pytestmark = pytest.mark.sim


def _leftovers(fleet: SimFleet, pids: list[int]) -> dict:
    return {
        "netns": system.netns_list(f"{PREFIX}-"),
        "links": system.links(VETH_PREFIX) + system.links(BRIDGE),
        "mounts": system.mounts_under(fleet.run_dir),
        "cgroups": [str(p) for h in system.CGROUP_HIERARCHIES if h.is_dir() for p in h.glob(f"{PREFIX}-*")],
        "pids": [p for p in pids if _running(p)],
    }


def _running(pid: int) -> bool:
    """Alive and not a zombie (this machine's init may reap orphans late)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def test_cleanup_after_killed_run_leaves_nothing(sim_fleet):
    state = sim_fleet.state()
    pids = [h.pid for h in state.hosts] + [state.index_pid, state.git_pid]
    inside = set()
    for h in state.hosts:
        inside |= system.cgroup_pids(h.cgroup)
    assert inside, "containers should have processes in their own cgroups"
    before = _leftovers(sim_fleet, pids)
    assert before["netns"] and before["mounts"] and before["cgroups"]

    # The session is killed: every process the harness started dies at once; nothing is unmounted.
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass

    SimFleet().down()  # what the next run (or CI) does first
    assert _leftovers(sim_fleet, pids + sorted(inside)) == {"netns": [], "links": [], "mounts": [], "cgroups": [],
                                                            "pids": []}
