"""End to end on the simulated fleet: a stale lock taken over by the next run, `inv unlock` (stale, live, forced), `inv upgrade --only` on one host with the
plan showing skipped roles, a refused dependency, snapshot retention and `inv snapshots`."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpufleet.fleet.hoststate import utc_now
from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

HOST = "gpu3"
LOCK = "/var/lib/gpufleet/lock"
SNAPS = "/var/lib/gpufleet/snapshots"


@pytest.fixture
def fleet(sim_fleet):
    sim_fleet.reset_host(HOST)
    yield sim_fleet
    sim_fleet.reset_host(HOST)


def hold(fleet, pid: int, started: str, node: str | None = None) -> None:
    """A lock on the host as a run from `node` (default this control node) with `pid` would have left it."""
    node = node or os.uname().nodename
    fleet.run_on(HOST, f"mkdir -p {LOCK} && printf 'holder=alice@{node}\\npid={pid}\\nstarted={started}\\n"
                       f"command=inv upgrade --host {HOST}\\ntoken=t{pid}\\n' > {LOCK}/holder")


def locked(fleet) -> bool:
    return fleet.run_on(HOST, f"test -d {LOCK}", check=False).returncode == 0


def test_unlock_removes_a_stale_lock_refuses_a_live_one_unless_forced(fleet):
    path = str(fleet.inventory_path)
    proc = inv("unlock", "--host", HOST, "--inventory", path)
    assert proc.returncode == 0 and f"{HOST}: not locked" in proc.stdout, proc.stdout + proc.stderr

    gone = subprocess.Popen(["true"])
    gone.wait()
    # a lock whose holder provably died on this control node: the next run takes it over and says so
    hold(fleet, gone.pid, "2026-12-02T10:00:00Z")
    proc = inv("upgrade", "--host", HOST, "--inventory", path, "--only", "flashinfer")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"took over a stale lock: alice@{os.uname().nodename} (pid {gone.pid}" in proc.stdout
    assert f"pid {gone.pid} no longer runs on" in proc.stdout and not locked(fleet)
    # `inv unlock` removes one too
    hold(fleet, gone.pid, "2026-12-02T10:00:00Z")
    proc = inv("unlock", "--host", HOST, "--inventory", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"locked by alice@{os.uname().nodename} (pid {gone.pid}" in proc.stdout
    assert f"lock removed (pid {gone.pid} no longer runs on" in proc.stdout and not locked(fleet)

    # live: this test's own process, which started before the lock was "taken"
    hold(fleet, os.getpid(), utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"))
    proc = inv("upgrade", "--host", HOST, "--inventory", path, "--only", "flashinfer")
    assert proc.returncode == 1 and f"is locked by alice@{os.uname().nodename} (pid {os.getpid()}" in proc.stdout
    assert "still runs" in proc.stdout and locked(fleet)
    proc, rows = inv_json("unlock", "--host", HOST, "--inventory", path)
    assert proc.returncode == 1 and rows[0]["state"] == "live" and not rows[0]["removed"], rows
    assert "refusing to remove the lock" in rows[0]["message"] and locked(fleet)
    proc = inv("unlock", "--host", HOST, "--inventory", path, "--force")
    assert proc.returncode == 0 and "lock removed (forced: " in proc.stdout and not locked(fleet)

    # from another control node: cannot be told from here, refused the same way
    hold(fleet, 4242, "2026-12-02T10:00:00Z", node="ops-laptop")
    proc = inv("unlock", "--host", HOST, "--inventory", path)
    assert proc.returncode == 1 and "another control node (ops-laptop)" in proc.stdout and locked(fleet)
    assert inv("unlock", "--host", HOST, "--inventory", path, "--force").returncode == 0 and not locked(fleet)


def test_only_one_role_on_one_host_then_retention_and_the_snapshot_list(fleet, tmp_path):
    path = write_inventory(fleet, tmp_path / "hosts.toml", [HOST], extra="[settings]\nsnapshots_keep = 2\n")
    path = str(path)
    # sgl-kernel alone is refused while torch and the checkout are behind; the dry run names them
    proc, [plan] = inv_json("upgrade", "--host", HOST, "--inventory", path, "--only", "sgl-kernel", "--dry-run")
    assert proc.returncode == 1 and plan["outcome"] == "failed", plan
    assert plan["error"].startswith(f"sgl-kernel needs torch, which --only/--skip leaves out and which is not on "
                                    f"target on {HOST} (torch: venv has torch 2.9.1+cu130"), plan["error"]
    assert {e["role"]: e["status"] for e in plan["entries"]}["torch"] == "skipped"

    old = ["20200101T000000Z", "20200102T000000Z", "20200103T000000Z"]
    for stamp in old:
        fleet.run_on(HOST, f"mkdir -p {SNAPS}/{stamp} && echo '{{\"created\": \"{stamp}\"}}' > "
                           f"{SNAPS}/{stamp}/manifest.json")
    proc = inv("upgrade", "--host", HOST, "--inventory", path, "--only", "flashinfer")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "skipped (not in --only)" in proc.stdout
    versions = fleet.run_on(HOST, "cd / && /root/venv/bin/python -m pip list --format=freeze").stdout
    assert "flashinfer-python==0.6.5" in versions and "torch==2.9.1+cu130" in versions  # torch left as it was

    proc, [listing] = inv_json("snapshots", "--host", HOST, "--inventory", path)
    assert proc.returncode == 0, proc.stderr
    kept = [s["path"].rsplit("/", 1)[-1] for s in listing["snapshots"]]
    assert len(kept) == 2 and kept[0] == old[-1] and kept[1].startswith(utc_now().strftime("%Y"))
    taken = listing["snapshots"][1]
    assert taken["kib"] > 0 and taken["command"].startswith("inv upgrade --host") and listing["total_kib"] > 0
    table = inv("snapshots", "--hosts", HOST, "--inventory", path)
    assert table.returncode == 0 and kept[1] in table.stdout and "2 snapshot(s)" in table.stdout
