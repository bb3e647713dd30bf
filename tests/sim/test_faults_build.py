"""End to end: the sgl-kernel build leaves the sglang checkout exactly as it found it. It builds from its own tree
(HEAD's kernel directory exported and patched in the build job's directory), so a host that built and a host that
installed the cached wheel look the same to `inv patches` and git, and a build that fails (a patch that breaks
CMake's configure, a broken compiler) changes no byte of the checkout; a re-run after a failure makes the tree again."""

from __future__ import annotations

import re
import shutil

import pytest

from tests.sim.helpers import REPO, inv_json, write_inventory

pytestmark = pytest.mark.sim

CO = "/root/sglang-main"
# What the checkout looks like to git (comparable across hosts). Reads take no optional lock: they write nothing.
VIEW = (f"cd {CO} && export GIT_OPTIONAL_LOCKS=0 && git rev-parse HEAD && "
        "git status --porcelain=v1 --untracked-files=all --ignored && git stash list && git diff HEAD --binary")
# Every byte, name, mode, owner and mtime under the checkout (with or without its .git); no directory sizes: the
# overlay under the simulated hosts reports another size for a directory once it is copied up, its entries unchanged.
BYTES = ("cd {co} && find . {prune} -printf '%P %y %T@ %U:%G %m %l\\n' | sort && "
         "find . {prune} -type f -print0 | sort -z | xargs -0 -r sha256sum")
TREE_BYTES = BYTES.format(co=CO, prune="-path ./.git -prune -o")
ALL_BYTES = BYTES.format(co=CO, prune="")
KERNEL = ("0001-fa3-can-be-turned-off.patch",)
BREAK = """Subject: [PATCH] test: a site patch that applies but breaks CMake's configure

diff --git a/CMakeLists.txt b/CMakeLists.txt
--- a/CMakeLists.txt
+++ b/CMakeLists.txt
@@ -1,3 +1,4 @@
 cmake_minimum_required(VERSION 3.26 FATAL_ERROR)
 project(sgl-kernel LANGUAGES CXX CUDA)
+message(FATAL_ERROR "gpufleet test: injected build failure")
 
"""


def on(fleet, host: str, command: str) -> str:
    return fleet.run_on(host, command).stdout


def changed(before: str, after: str) -> list[str]:
    """The lines that differ (empty when byte-identical): what a failed comparison shows."""
    import difflib

    return [d for d in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if d[:1] in "+-" and not d.startswith(("+++", "---"))]


def checkout_bytes(fleet, host: str) -> str:
    """ALL_BYTES but for what the sglang-checkout role's survey writes even when left out (--only): its plan-time
    `git fetch` rewrites .git/FETCH_HEAD and makes (and removes) temporary files in .git/objects, so those two
    directories' mtimes move. The build writes nothing in the .git (tests/unit/test_remote_files.py compares every
    mtime there around the export)."""
    return "\n".join(line for line in on(fleet, host, ALL_BYTES).splitlines()
                     if not line.startswith((".git d ", ".git/objects d ", ".git/FETCH_HEAD "))
                     and not line.endswith("/.git/FETCH_HEAD"))


def patch_rows(fleet, inventory, hosts: str) -> dict[str, list]:
    proc, rows = inv_json("patches", "--inventory", str(inventory), "--hosts", hosts, "--no-fetch")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["host"]: [(p["series"], p["patch"], p["status"], p.get("checkout")) for p in r["patches"]]
            for r in rows}


def kernel_entry(report: dict) -> dict:
    [entry] = [e for e in report["entries"] if e["role"] == "sgl-kernel"]
    return entry


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)
    yield sim_fleet
    for name in ("gpu1", "gpu2", "gpu3"):  # later modules expect the old stack everywhere
        sim_fleet.reset_host(name)


@pytest.fixture
def site(fleet, tmp_path, monkeypatch):
    """This test's own control-node cache (empty: the first host builds) and a snapshot of the kernel patches."""
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def inventory_with(fleet, root, hosts: list[str], patches) -> str:
    extra = "".join(f'[hosts.{h}.stack.sgl_kernel]\npatches = "{patches}"\n' for h in hosts)
    return str(write_inventory(fleet, root / "hosts.toml", hosts, extra=extra))


def test_a_host_that_built_and_one_that_installed_the_wheel_look_the_same(fleet, site):
    patches = shutil.copytree(REPO / "patches/sgl-kernel", site / "patches")
    inventory = inventory_with(fleet, site, ["gpu1", "gpu2"], patches)
    before_view = {h: on(fleet, h, VIEW) for h in ("gpu1", "gpu2")}
    before_bytes = {h: on(fleet, h, TREE_BYTES) for h in ("gpu1", "gpu2")}
    before_patches = patch_rows(fleet, inventory, "gpu1,gpu2")
    assert before_view["gpu1"] == before_view["gpu2"]
    assert {s for rows in before_patches.values() for (series, _, s, _) in rows if series == "sgl-kernel"} == {
        "will apply"}

    for host, how in (("gpu1", "build sgl-kernel"), ("gpu2", "install sgl-kernel wheel")):
        proc, [report] = inv_json("upgrade", "--inventory", inventory, "--host", host)
        assert proc.returncode == 0 and report["outcome"] == "ok", (report, proc.stderr[-3000:])
        entry = kernel_entry(report)
        assert entry["status"] == "changed" and entry["title"].startswith(how), entry
    assert "applied:" not in proc.stderr  # gpu2 patched nothing: it installed gpu1's wheel

    after_patches = patch_rows(fleet, inventory, "gpu1,gpu2")
    assert after_patches == before_patches and after_patches["gpu1"] == after_patches["gpu2"]
    for host in ("gpu1", "gpu2"):
        assert on(fleet, host, VIEW) == before_view[host] == before_view["gpu1"], host
        assert on(fleet, host, TREE_BYTES) == before_bytes[host], host  # not one byte of the work tree changed
        assert on(fleet, host, f"git -C {CO} stash list") == ""


def test_a_failed_build_leaves_the_checkout_byte_identical_and_a_rerun_makes_the_tree_again(fleet, site):
    patches = shutil.copytree(REPO / "patches/sgl-kernel", site / "patches")
    (patches / "0002-break-configure.patch").write_text(BREAK)
    (patches / "series").write_text((patches / "series").read_text() + "0002-break-configure.patch\n")
    inventory = inventory_with(fleet, site, ["gpu3"], patches)
    before = checkout_bytes(fleet, "gpu3")  # the .git too: the build only reads the checkout
    before_view = on(fleet, "gpu3", VIEW)

    # The sgl-kernel role alone (the rest of the stack stays old), so nothing else has a reason to touch the checkout.
    only = ("upgrade", "--inventory", inventory, "--host", "gpu3", "--only", "sgl-kernel", "--force")
    proc, [report] = inv_json(*only)
    assert proc.returncode == 1 and report["outcome"] == "failed", (report, proc.stderr[-3000:])
    assert kernel_entry(report)["status"] == "failed"
    assert "gpufleet test: injected build failure" in proc.stderr
    assert "[gpu3] applied: 0002-break-configure.patch" in proc.stderr
    assert changed(before, checkout_bytes(fleet, "gpu3")) == [] and on(fleet, "gpu3", VIEW) == before_view
    # the patched tree is the build's own, in its job directory, kept until a re-run
    [tree] = on(fleet, "gpu3", "ls -d /var/lib/gpufleet/builds/*/src").split()
    assert "injected build failure" in on(fleet, "gpu3", f"cat {tree}/sgl-kernel/CMakeLists.txt")
    assert "injected" not in on(fleet, "gpu3", f"cat {CO}/sgl-kernel/CMakeLists.txt")

    # A fault outside the key (the host's C++ compiler broken; nvcc would not do: the key names its version) fails
    # the good series' build; after the repair the same build key runs again from a tree made again (the half-made
    # one, damaged here, is discarded, not reused).
    (patches / "0002-break-configure.patch").unlink()
    (patches / "series").write_text("".join(f"{p}\n" for p in KERNEL))
    cxx = on(fleet, "gpu3", "readlink -f \"$(command -v c++)\"").strip()
    on(fleet, "gpu3", f"chmod a-x {cxx}")
    try:
        proc, [report] = inv_json(*only)
        assert proc.returncode == 1 and kernel_entry(report)["status"] == "failed", (report, proc.stderr[-3000:])
    finally:
        on(fleet, "gpu3", f"chmod a+x {cxx}")
    key12 = re.search(r"\(build ([0-9a-f]{12}),", kernel_entry(report)["title"])[1]
    [tree] = on(fleet, "gpu3", f"ls -d /var/lib/gpufleet/builds/{key12}*/src").split()
    on(fleet, "gpu3", f"echo 'message(FATAL_ERROR \"stale tree reused\")' >> {tree}/sgl-kernel/CMakeLists.txt")
    assert changed(before, checkout_bytes(fleet, "gpu3")) == []

    proc, [report] = inv_json(*only)
    assert proc.returncode == 0 and report["outcome"] == "ok", (report, proc.stderr[-3000:])
    entry = kernel_entry(report)
    assert entry["status"] == "changed" and f"(build {key12}," in entry["title"], entry
    assert "stale tree reused" not in proc.stderr and f"[gpu3] applied: {KERNEL[0]}" in proc.stderr
    assert on(fleet, "gpu3", f"test -e {tree} || echo gone").strip() == "gone"  # installed: its sources removed
    assert changed(before, checkout_bytes(fleet, "gpu3")) == [] and on(fleet, "gpu3", VIEW) == before_view
    rows = patch_rows(fleet, inventory, "gpu3")["gpu3"]
    assert [(s, p, st) for s, p, st, _ in rows if s == "sgl-kernel"] == [("sgl-kernel", KERNEL[0], "will apply")]
