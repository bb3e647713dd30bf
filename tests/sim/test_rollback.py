"""End to end: `inv rollback` puts an upgraded host back exactly on its snapshot (packages, HEAD, local edits)."""

from __future__ import annotations

import pytest

from tests.sim.helpers import inv, inv_json

pytestmark = pytest.mark.sim

HOST = "gpu2"


def _state(fleet) -> str:
    return fleet.run_on(HOST, "cd /root/sglang-main && /root/venv/bin/pip freeze --all && git rev-parse HEAD "
                              "&& git diff && git status --porcelain && git stash list").stdout


@pytest.fixture
def fresh(sim_fleet):
    sim_fleet.reset_host(HOST)
    yield sim_fleet
    sim_fleet.reset_host(HOST)


def test_rollback_restores_the_old_stack_exactly(fresh):
    inv_path = str(fresh.inventory_path)
    before = _state(fresh)
    proc = inv("upgrade", "--host", HOST, "--inventory", inv_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    upgraded = _state(fresh)
    assert "torch==2.12.0.dev20260307+cu130" in upgraded and upgraded != before

    proc, rows = inv_json("rollback", "--host", HOST, "--inventory", inv_path, "--dry-run")
    assert proc.returncode == 0 and rows[0]["restored"] is False
    assert _state(fresh) == upgraded

    proc, rows = inv_json("rollback", "--host", HOST, "--inventory", inv_path)
    assert proc.returncode == 0, proc.stderr
    assert rows[0]["restored"] is True and "match the snapshot" in rows[0]["proof"]
    assert _state(fresh) == before
    out = fresh.run_on(HOST, "/root/venv/bin/python -c 'import torch, flashinfer, sgl_kernel; print(torch.__version__)'")
    assert out.stdout.strip() == "2.9.1+cu130"
    audit = fresh.run_on(HOST, "tail -n 1 /var/lib/gpufleet/audit.log").stdout
    assert '"outcome": "rolled back"' in audit


def test_rollback_without_snapshot_is_a_clear_error(fresh):
    proc, rows = inv_json("rollback", "--host", HOST, "--inventory", str(fresh.inventory_path))
    assert proc.returncode == 1
    assert "no snapshot" in rows[0]["error"] and HOST in rows[0]["error"]
