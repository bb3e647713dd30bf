"""End to end: `inv patches` over real SSH: the shipped series judged on each simulated host, and upstream moving."""

from __future__ import annotations

import pytest

from gpufleet.sim import upstream as up
from tests.sim.helpers import inv, inv_json

pytestmark = pytest.mark.sim

S1, S2 = "0001-symm-mem-all-reduce-sizes-sm120.patch", "0002-symm-mem-multimem-world-sizes-sm120.patch"
KERNEL = ("0001-fa3-can-be-turned-off.patch",)
SIZES = (up.TREE / up.SIZES_FILE).read_text()


def by_patch(row: dict) -> dict[str, dict]:
    return {f"{p['series']}/{p['patch']}": p for p in row["patches"]}


def test_local_edits_are_the_sglang_patches_on_every_host(sim_fleet):
    proc, rows = inv_json("patches", "--inventory", str(sim_fleet.inventory_path))
    assert proc.returncode == 0, proc.stderr
    assert [r["host"] for r in rows] == ["gpu1", "gpu2", "gpu3"]
    for row in rows:
        assert row["reachable"] and row["error"] is None and row["fetch_error"] is None
        assert row["head"] == row["upstream"]
        found = {k: v["status"] for k, v in by_patch(row).items()}
        assert found == {f"sglang/{S1}": "applied", f"sglang/{S2}": "applied",
                         **{f"sgl-kernel/{k}": "will apply" for k in KERNEL}}
    table = inv("patches", "--inventory", str(sim_fleet.inventory_path), "--hosts", "gpu1,gpu3", "--no-fetch")
    assert table.returncode == 0, table.stderr
    assert "gpufleet patches" in table.stdout and "gpu1" in table.stdout and "gpu3" in table.stdout
    assert f"sglang/{S1}" in table.stdout and "will apply" in table.stdout


@pytest.fixture
def upstream_moves(sim_fleet):
    try:
        yield sim_fleet
    finally:
        up.build_upstream(sim_fleet.upstream_bare)
        sim_fleet.reset_host("gpu2")  # its origin/main was fetched past the reset upstream


def test_upstream_commit_with_the_sizes_entry_is_upstreamed(upstream_moves):
    fleet = upstream_moves
    sha = up.add_upstream_commit(fleet.upstream_bare, {up.SIZES_FILE: up.add_sizes_entry(SIZES)},
                                 "Add symm-mem sizes for SM120")
    proc, [row] = inv_json("patches", "--inventory", str(fleet.inventory_path), "--host", "gpu2")
    assert proc.returncode == 0, proc.stderr
    assert row["upstream"] == sha and row["head"] != sha
    found = by_patch(row)
    assert found[f"sglang/{S1}"]["status"] == "upstreamed"
    assert found[f"sglang/{S1}"]["checkout"] == "applied" and "retire" in found[f"sglang/{S1}"]["detail"]
    assert found[f"sglang/{S2}"]["status"] == "applied"
    table = inv("patches", "--inventory", str(fleet.inventory_path), "--host", "gpu2", "--no-fetch")
    assert f"ready to retire: sglang/{S1}" in " ".join(table.stdout.split())


def test_conflicting_checkout_names_the_hunk_and_fails(upstream_moves):
    fleet = upstream_moves
    fleet.run_on("gpu2", f"cd /root/sglang-main && git checkout -q . && sed -i 's/^    }},$/    }},\\n    11: {{}},/' "
                         f"{up.SIZES_FILE} && sed -n '/^    11/p' {up.SIZES_FILE}")
    proc, [row] = inv_json("patches", "--inventory", str(fleet.inventory_path), "--host", "gpu2", "--no-fetch")
    assert proc.returncode == 1
    s1 = by_patch(row)[f"sglang/{S1}"]
    assert s1["status"] == "conflicts" and s1["detail"].startswith(f"{up.SIZES_FILE}:13 (hunk @@ -13,4 +13,10 @@")
    assert by_patch(row)[f"sglang/{S2}"]["status"] == "will apply"
