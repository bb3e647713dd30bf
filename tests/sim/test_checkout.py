"""End to end: the sglang checkout role through the real engine over SSH, while the simulated upstream moves."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.fleet.executor import Executor
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.config.inventory import load_inventory
from gpufleet.plan import Step, Unchanged
from gpufleet.engine.runner import for_each_host
from gpufleet.sim import upstream as up
from gpufleet.config.stack import host_stacks, load_stack
from gpufleet.roles import sglang_checkout
from tests.sim.helpers import REPO

pytestmark = pytest.mark.sim

HOST = "gpu2"
CO = "/root/sglang-main"
SIZES = (up.TREE / up.SIZES_FILE).read_text()
STATE = (f"cd {CO} && git rev-parse HEAD && echo @@ && git status --porcelain=v1 --untracked-files=all && echo @@ "
         "&& git stash list --format='%H %gs'")


@pytest.fixture
def host(sim_fleet):
    """gpu2 with an operator's own stash and an untracked file; upstream and gpu2 are put back afterwards."""
    sim_fleet.run_on(HOST, f"cd {CO} && echo experiment > README.md && git stash push -q -m 'my experiment' -- "
                           "README.md && echo 'notes' > notes.txt")
    try:
        yield sim_fleet
    finally:
        up.build_upstream(sim_fleet.upstream_bare)  # main back to the initial tree (same sha every time)
        sim_fleet.reset_host(HOST)


def snapshot(fleet) -> dict:
    head, status, stashes = fleet.run_on(HOST, STATE).stdout.split("@@\n")
    root = fleet.host_root(HOST) / CO.lstrip("/")
    files = {rel: (root / rel).read_bytes() for rel in (up.SIZES_FILE, up.SYMM_MEM_FILE, "notes.txt", "README.md")}
    return {"head": head.strip(), "status": status, "stashes": stashes, "files": files}


def run_role(fleet, dry_run: bool = False, patches: Path | None = None):
    """The checkout role alone, planned and applied by the real engine over one SSH connection."""
    inv = load_inventory(fleet.inventory_path)
    chosen = [inv.hosts[HOST]]
    stack = host_stacks(load_stack(REPO / "stack.toml"), inv, chosen)[HOST]
    if patches is not None:  # another patch series (an empty one: local edits of the operator's own)
        stack = stack.model_copy(update={"sglang": stack.sglang.model_copy(update={"patches": patches}),
                                         "sgl_kernel": stack.sgl_kernel.model_copy(update={"patches": patches})})
    upgrade = Executor(roles=[sglang_checkout], run=RunInfo.current("pytest test_checkout"), repo=REPO,
                      dry_run=dry_run, say=lambda line: None)
    [outcome] = for_each_host(chosen, inv, lambda session: upgrade.host(session, stack))
    assert outcome.ok, outcome.error
    return outcome.value


def test_pop_conflict_puts_the_checkout_back_exactly(host, tmp_path):
    before = snapshot(host)
    new = up.add_upstream_commit(host.upstream_bare, {up.SIZES_FILE: SIZES.replace("    },\n}", "    },  # SM100\n}")},
                                 "Comment the capability-10 row (the line next to the SM120 edit)")
    # with the site's series the move is refused at plan time: the size patch conflicts there
    refused = run_role(host)
    assert refused.outcome == "failed" and f"patch 0001-symm-mem-all-reduce-sizes-sm120.patch conflicts on {new[:10]}" \
        in refused.error and "the checkout was not touched" in refused.error
    assert snapshot(host) == before
    # with no series (the edits are the operator's own) the update runs, the pop conflicts, all is put back
    (tmp_path / "none").mkdir()
    report = run_role(host, patches=tmp_path / "none")
    assert report.outcome == "failed"
    assert f"conflict with upstream {new} in {up.SIZES_FILE}" in report.error
    assert "back exactly as it was" in report.error
    assert snapshot(host) == before
    assert b"    12: {" in before["files"][up.SIZES_FILE]  # the local edit is still there
    backup = host.run_on(HOST, f"cat {sglang_checkout.BACKUPS}/sglang-*.patch").stdout
    assert "+    12: {" in backup and "+        12: [6, 8]," in backup
    tar = host.run_on(HOST, f"tar -tf {sglang_checkout.BACKUPS}/sglang-*.untracked.tar").stdout.split()
    assert tar == ["notes.txt"]


def test_clean_upgrade_keeps_the_edits_and_converges(host):
    before = snapshot(host)
    new = up.add_upstream_commit(host.upstream_bare, {"README.md": "# sglang\nupstream moved on\n"},
                                 "Unrelated upstream change")
    plan = run_role(host, dry_run=True)
    assert [type(e.item) for e in plan.entries] == [Step, Unchanged]
    assert plan.entries[0].item.title.endswith(f"-> {new[:10]}")
    report = run_role(host)
    assert report.outcome == "ok", report.error
    assert [e.status for e in report.entries] == ["changed", "unchanged"]
    after = snapshot(host)
    assert after["head"] == new
    assert after["stashes"] == before["stashes"] and "my experiment" in after["stashes"]
    assert after["status"] == before["status"]
    assert {k: after["files"][k] for k in (up.SIZES_FILE, up.SYMM_MEM_FILE, "notes.txt")} == \
           {k: before["files"][k] for k in (up.SIZES_FILE, up.SYMM_MEM_FILE, "notes.txt")}
    assert after["files"]["README.md"] == b"# sglang\nupstream moved on\n"
    again = run_role(host, dry_run=True)
    assert all(isinstance(e.item, Unchanged) for e in again.entries), [e.item for e in again.entries]
    assert again.entries[0].item.reason == f"main@{new[:10]} is upstream's tip"
