"""End to end: upstream's mid-2026 layout (sgl-kernel under python/sglang/kernels/aot, the size table inside
torch_symm_mem.py) on the simulated upstream: the kernel directory is found, `inv patches` says the size patch no
longer does anything there, and an upgrade to that commit stops before the checkout moves or a build starts."""

from __future__ import annotations

import pytest

from gpufleet.sim import upstream as up
from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

S1, S2 = "0001-symm-mem-all-reduce-sizes-sm120.patch", "0002-symm-mem-multimem-world-sizes-sm120.patch"
KERNEL = "0001-fa3-can-be-turned-off.patch"


@pytest.fixture
def moved(sim_fleet):
    sha = up.add_new_layout_commit(sim_fleet.upstream_bare)
    try:
        yield sim_fleet, sha
    finally:
        up.build_upstream(sim_fleet.upstream_bare)
        sim_fleet.reset_host("gpu2")  # its origin/main was fetched past the reset upstream


def checkout_state(fleet, host: str) -> str:
    return fleet.run_on(host, "cd /root/sglang-main && git rev-parse HEAD && git status --porcelain=v1 && "
                              "git stash list && git diff HEAD | sha256sum").stdout


def test_patches_on_the_mid_2026_layout(moved):
    fleet, sha = moved
    proc, [row] = inv_json("patches", "--inventory", str(fleet.inventory_path), "--host", "gpu2")
    assert row["upstream"] == sha, row
    found = {p["patch"]: p for p in row["patches"]}
    size = found[S1]
    # the checkout still has it (old layout); upstream's table moved into torch_symm_mem.py, where it lacks 12
    assert size["checkout"] == "applied" and size["upstream"] == "no effect", size
    assert "torch_symm_mem.py" in size["detail"] and "no key 12" in size["detail"], size
    assert found[S2]["upstream"] == "will apply"
    # the kernel patch is judged in the kernel's new directory, and still applies there
    assert found[KERNEL]["upstream"] == "will apply", found[KERNEL]
    table = inv("patches", "--inventory", str(fleet.inventory_path), "--host", "gpu2", "--no-fetch")
    assert "no effect" in table.stdout


def test_upgrade_to_the_moved_layout_stops_before_the_checkout_or_a_build(moved, tmp_path):
    fleet, sha = moved
    path = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu2"], extra=f'[hosts.gpu2.stack.sglang]\ncommit = "{sha}"\n')
    before = checkout_state(fleet, "gpu2")
    proc, [report] = inv_json("upgrade", "--inventory", str(path), "--host", "gpu2")
    assert proc.returncode != 0
    assert report["outcome"] == "failed", report
    error = report["error"]
    assert f"sglang patch {S1} no effect on {sha[:10]}" in error and "no key 12" in error, error
    assert "the checkout was not touched" in error
    assert not any(e["role"] == "sgl-kernel" for e in report["entries"]), report["entries"]
    assert checkout_state(fleet, "gpu2") == before
    starts = "journalctl --no-pager -o cat | grep -c '^Started gpufleet-build-'"
    assert fleet.run_on("gpu2", starts, check=False).stdout.strip() == "0"
