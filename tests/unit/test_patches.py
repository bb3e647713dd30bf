"""Patch series: loading, the shipped patches against the simulated upstream tree, and each status judged for real."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.engine.command import Cmd
from gpufleet.errors import ConfigError
from gpufleet.sim import upstream as up
from gpufleet.config.stack import Stack
from gpufleet.roles import patches as pm

REPO = Path(__file__).resolve().parents[2]
TREE = up.TREE
SIZES = (TREE / up.SIZES_FILE).read_text()
SYMM = (TREE / up.SYMM_MEM_FILE).read_text()
CMAKE = (TREE / "sgl-kernel/CMakeLists.txt").read_text()
S1, S2 = "0001-symm-mem-all-reduce-sizes-sm120.patch", "0002-symm-mem-multimem-world-sizes-sm120.patch"
K1 = "0001-fa3-can-be-turned-off.patch"
FA3_FORCED = 'if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4")\n    set(SGL_KERNEL_ENABLE_FA3 ON)\n'
FA3_OPTIONAL = ('option(SGL_KERNEL_FORCE_FA3 "Build FA3 and sm_90a kernels whenever CUDA >= 12.4" ON)\n'
                'if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4" AND SGL_KERNEL_FORCE_FA3)\n'
                '    set(SGL_KERNEL_ENABLE_FA3 ON)\n')


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"}
    proc = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, env=env)
    return proc.stdout.rstrip("\n")


def bash(cmd: Cmd) -> subprocess.CompletedProcess:
    """Run a built command locally, exactly as the host's shell would get it."""
    return subprocess.run(cmd.render(), shell=True, executable="/bin/bash", capture_output=True, text=True,
                          env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"})


@pytest.fixture(scope="module")
def shipped() -> list[pm.Series]:
    return pm.stack_series(Stack(), REPO)


@pytest.fixture
def fleet_repo(tmp_path):
    """A bare upstream (the simulated sglang tree) and a checkout with the hosts' two local SM120 edits."""
    bare, co = tmp_path / "up.git", tmp_path / "co"
    up.build_upstream(bare)
    up.clone_with_local_edits(bare, co)
    return bare, co


def judge(co: Path, series, fetch=True) -> pm.HostPatches:
    proc = bash(pm.status_command(str(co), "main", series, fetch))
    assert proc.returncode == 0, proc.stderr
    return pm.decide("h", proc.stdout, series)


def statuses(found: pm.HostPatches) -> dict[str, str]:
    return {f"{p.series}/{p.patch}": p.status for p in found.patches}


# ---- the series files ----------------------------------------------------------------------------------------------
def test_shipped_series_load_in_order_with_effects(shipped):
    sglang, kernel = shipped
    assert [p.name for p in sglang.patches] == [S1, S2]
    assert [p.name for p in kernel.patches] == [K1]
    assert sglang.roots == ("",) and kernel.roots == pm.KERNEL_ROOTS
    assert sglang.patches[0].effect == pm.Effect("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12)
    assert sglang.patches[1].effect == pm.Effect("_WORLD_SIZES_MULTIMEM", 12)
    assert sglang.patches[0].files[0].path == up.SIZES_FILE
    assert [f.path for f in kernel.patches[0].files] == ["CMakeLists.txt"]
    assert kernel.patches[0].probe_path == "CMakeLists.txt"


def test_shipped_sglang_patches_are_exactly_the_hosts_local_edits(tmp_path, shipped):
    work = tmp_path / "sglang"
    up.copy_tree(work)
    for patch in shipped[0].patches:
        (tmp_path / patch.name).write_text(patch.text)
        subprocess.run(["git", "apply", "--unsafe-paths", str(tmp_path / patch.name)], cwd=work, check=True)
    assert (work / up.SIZES_FILE).read_text() == up.add_sizes_entry(SIZES)
    assert (work / up.SYMM_MEM_FILE).read_text() == up.add_multimem_entry(SYMM)


def test_shipped_kernel_patches_apply_in_order_to_the_simulated_tree(tmp_path, shipped):
    work = tmp_path / "sglang"
    up.copy_tree(work)
    for patch in shipped[1].patches:
        (tmp_path / patch.name).write_text(patch.text)
        subprocess.run(["git", "apply", "--directory=sgl-kernel", str(tmp_path / patch.name)], cwd=work, check=True)
    cmake = (work / "sgl-kernel/CMakeLists.txt").read_text()
    assert FA3_OPTIONAL in cmake and FA3_FORCED not in cmake


def test_parse_diff_reads_headers_only_outside_hunks():
    text = ("Subject: x\n--- not a header\n\ndiff --git a/q.sql b/q.sql\n--- a/q.sql\n+++ b/q.sql\n"
            "@@ -1,2 +1,1 @@ top\n--- a comment line removed\n keep\n"
            "diff --git a/new.txt b/new.txt\nnew file mode 100644\n--- /dev/null\n+++ b/new.txt\n@@ -0,0 +1 @@\n+x\n")
    assert pm.parse_diff(text) == (pm.FileDiff("q.sql", "q.sql", ((1, "@@ -1,2 +1,1 @@ top"),)),
                                   pm.FileDiff(None, "new.txt", ((0, "@@ -0,0 +1 @@"),)))


def test_series_comments_options_and_errors(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "a.patch").write_text((REPO / "patches/sglang" / S1).read_text())
    (d / "series").write_text("# header\n\n a.patch   effect=has-key:T:12  # why\n")
    s = pm.load_series("x", d)
    assert [(p.name, p.effect) for p in s.patches] == [("a.patch", pm.Effect("T", 12))]
    assert pm.load_series("x", tmp_path / "absent").patches == ()
    for line, words in (("b.patch", "not found"), ("a.patch bogus=1", "unknown option"),
                        ("../a.patch", "plain file name"), ("a.patch effect=has:T", "has-key:NAME:KEY")):
        (d / "series").write_text(line + "\n")
        with pytest.raises(ConfigError, match=words) as exc:
            pm.load_series("x", d)
        assert f"{d / 'series'}:1" in str(exc.value)


def test_stack_series_paths_resolve_against_the_repo(tmp_path):
    stack = Stack.model_validate({"sglang": {"patches": "mine"}})
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "series").write_text("")
    sglang, kernel = pm.stack_series(stack, tmp_path)
    assert sglang.path == tmp_path / "mine" and kernel.path == tmp_path / "patches/sgl-kernel"


# ---- pure logic ----------------------------------------------------------------------------------------------------
def test_effect_holds_finds_every_definition_of_the_table():
    eff = pm.Effect("TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", 12)
    assert pm.effect_holds(eff, {"a.py": up.add_sizes_entry(SIZES)}) == (True, "")
    ok, why = pm.effect_holds(eff, {"a.py": SIZES})
    assert not ok and "a.py:3 has no key 12" in why
    # Upstream defines the table in a second file too: both must carry the key.
    moved = "X = 1\nTORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9: {}, 10: {}}\n"
    ok, why = pm.effect_holds(eff, {"a.py": up.add_sizes_entry(SIZES), "b.py": moved})
    assert not ok and "b.py:2" in why
    assert pm.effect_holds(eff, {"a.py": "<<<<<<< ours\n"}) == (False,
                                                                "no dict TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES found")
    assert pm.effect_holds(pm.Effect("_WORLD_SIZES_MULTIMEM", 12), {"t.py": up.add_multimem_entry(SYMM)})[0]


def test_failed_hunks_name_the_hunk_from_git_apply_output(shipped):
    patch = shipped[0].patches[0]
    j = pm.Judgement("wt", "sglang", patch.name, False, False, "",
                     errors=[f"error: patch failed: {up.SIZES_FILE}:13",
                             f"error: {up.SIZES_FILE}: patch does not apply"])
    assert pm.failed_hunks(patch, j) == (f"{up.SIZES_FILE}:13 (hunk @@ -13,4 +13,10 @@ "
                                         "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {)")
    kernel = shipped[1].patches[0]
    j = pm.Judgement("wt", "sgl-kernel", kernel.name, False, False, "sgl-kernel",
                     errors=["error: sgl-kernel/CMakeLists.txt: No such file or directory"])
    assert pm.failed_hunks(kernel, j) == "CMakeLists.txt: missing"


def test_status_script_quotes_patch_text_exactly(shipped):
    text = pm.status_script("/root/sglang main", "main", shipped)
    assert "co='/root/sglang main'" in text and "ref=refs/remotes/origin/main" in text
    assert pm.MAX_SCRIPT_BYTES > len(text.encode())
    big = pm.Series("x", Path("/p"), patches=(pm.Patch("a", "x" * pm.MAX_SCRIPT_BYTES, (pm.FileDiff("f", "f"),)),))
    with pytest.raises(ConfigError, match="too large"):
        pm.status_script("/c", "main", [big])


# ---- judged for real, on local repositories ------------------------------------------------------------------------
def test_host_edits_are_applied_kernel_patches_will_apply(fleet_repo, shipped):
    bare, co = fleet_repo
    found = judge(co, shipped)
    assert found.head == git(co, "rev-parse", "HEAD") and found.upstream == found.head and not found.fetch_error
    assert statuses(found) == {f"sglang/{S1}": "applied", f"sglang/{S2}": "applied", f"sgl-kernel/{K1}": "will apply"}
    assert git(co, "status", "--porcelain").splitlines() == [f" M {up.SIZES_FILE}", f" M {up.SYMM_MEM_FILE}"]


def test_upstream_commit_with_the_entry_makes_it_upstreamed(fleet_repo, shipped):
    bare, co = fleet_repo
    sha = up.add_upstream_commit(bare, {up.SIZES_FILE: up.add_sizes_entry(SIZES)}, "Add SM120 symm-mem sizes")
    found = judge(co, shipped)
    assert found.upstream == sha
    st = found.status("sglang", S1)
    assert (st.status, st.checkout, st.upstream) == ("upstreamed", "applied", "applied")
    assert "retire" in st.detail
    assert found.status("sglang", S2).status == "applied"


def test_upstream_entry_with_other_values_is_still_upstreamed(fleet_repo, shipped):
    bare, co = fleet_repo
    other = up.add_sizes_entry(SIZES).replace("    12: {\n        2: 64", "    12: {\n        2: 32")
    up.add_upstream_commit(bare, {up.SIZES_FILE: other}, "SM120 sizes, upstream's way")
    st = judge(co, shipped).status("sglang", S1)
    assert st.status == "upstreamed" and "differs from the patch text" in st.detail


def test_conflict_names_the_failing_hunk(fleet_repo, shipped):
    bare, co = fleet_repo
    git(co, "checkout", "-q", ".")
    (co / up.SIZES_FILE).write_text(SIZES.replace("    },\n}", "    },\n    11: {},\n}"))
    st = judge(co, shipped).status("sglang", S1)
    assert st.status == "conflicts"
    assert st.detail.startswith(f"{up.SIZES_FILE}:13 (hunk @@ -13,4 +13,10 @@")


def test_upstream_moving_the_table_is_no_effect_and_shown_before_the_pull(tmp_path, shipped):
    bare, co = tmp_path / "up.git", tmp_path / "co"
    up.build_upstream(bare)
    git(tmp_path, "clone", "-q", str(bare), str(co))
    moved = SYMM.replace("from sglang.srt.distributed.device_communicators.all_reduce_utils import (\n"
                         "    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES,\n)\n",
                         "MiB = 1024 * 1024\nTORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {\n    9: {2: 64 * MiB},\n}\n")
    up.add_upstream_commit(bare, {up.SYMM_MEM_FILE: moved}, "Move the size table")
    found = judge(co, shipped)
    st = found.status("sglang", S1)
    assert (st.status, st.upstream) == ("will apply", "no effect")
    assert "torch_symm_mem.py:13 has no key 12" in st.detail
    git(co, "merge", "-q", "--ff-only", "origin/main")
    st = judge(co, shipped).status("sglang", S1)
    assert st.status == "no effect" and "afterwards" in st.detail


def test_kernel_patches_follow_the_kernel_directory_upstream_moved(fleet_repo, shipped):
    bare, co = fleet_repo
    files = {f"sgl-kernel/{p.relative_to(TREE / 'sgl-kernel')}": None
             for p in (TREE / "sgl-kernel").rglob("*") if p.is_file()}
    files.update({k.replace("sgl-kernel/", "python/sglang/kernels/aot/", 1): (TREE / k).read_text() for k in files})
    up.add_upstream_commit(bare, files, "Move sgl-kernel")
    proc = bash(pm.status_command(str(co), "main", shipped))
    roots = set(re.findall(r"@@judge up sgl-kernel \S+ fwd=0 rev=1 root=(\S+)", proc.stdout))
    assert roots == {"python/sglang/kernels/aot"}
    git(co, "checkout", "-q", ".")
    (co / up.SIZES_FILE).write_text(SIZES)
    assert set(statuses(pm.decide("h", proc.stdout, shipped)).values()) >= {"will apply"}


def test_kernel_fix_upstreamed_verbatim(fleet_repo, shipped):
    bare, co = fleet_repo
    patched = CMAKE.replace(FA3_FORCED, "# FA3 (flash_ops) is sm_90a-only: a build for other GPUs can opt out of the "
                                        "forcing with -DSGL_KERNEL_FORCE_FA3=OFF.\n" + FA3_OPTIONAL)
    assert patched != CMAKE
    up.add_upstream_commit(bare, {"sgl-kernel/CMakeLists.txt": patched}, "FA3 can be turned off")
    found = judge(co, shipped)
    assert found.status("sgl-kernel", K1).status == "upstreamed"


def test_without_fetch_upstream_is_the_last_fetched_ref(fleet_repo, shipped):
    bare, co = fleet_repo
    before = git(co, "rev-parse", "origin/main")
    up.add_upstream_commit(bare, {up.SIZES_FILE: up.add_sizes_entry(SIZES)}, "upstream moves")
    found = judge(co, shipped, fetch=False)
    assert found.upstream == before and found.status("sglang", S1).status == "applied"


def test_fetch_failure_is_reported_and_judging_goes_on(fleet_repo, shipped):
    bare, co = fleet_repo
    git(co, "remote", "set-url", "origin", str(bare.parent / "gone.git"))
    found = judge(co, shipped)
    assert found.fetch_error and found.upstream and found.status("sglang", S1).status == "applied"


def test_not_a_checkout_is_an_error_not_a_crash(tmp_path, shipped):
    found = judge(tmp_path, shipped)
    assert found.error == f"{tmp_path} is not a git checkout" and found.patches == []


# ---- remembered on the host ----------------------------------------------------------------------------------------
def test_a_judgement_is_remembered_until_something_it_reads_changes(fleet_repo, shipped, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_HOST_CACHE", str(tmp_path / "host-cache"))
    bare, co = fleet_repo
    first = judge(co, shipped)
    again = judge(co, shipped)
    assert not first.remembered and again.remembered
    assert statuses(again) == statuses(first) and again.head == first.head and again.upstream == first.upstream
    # the same size, a different byte: the file's mtime and ctime tell, as they tell git
    text = (co / up.SIZES_FILE).read_text()
    (co / up.SIZES_FILE).write_text(text.replace("12: {", "13: {", 1))
    edited = judge(co, shipped)
    assert not edited.remembered and edited.status("sglang", S1).status != "applied"
    (co / up.SIZES_FILE).write_text(text)
    assert not judge(co, shipped).remembered  # put back: new times, judged again (and remembered from then on)
    assert judge(co, shipped).remembered
    up.add_upstream_commit(bare, {up.SIZES_FILE: up.add_sizes_entry(SIZES)}, "upstream moves")
    moved = judge(co, shipped)
    assert not moved.remembered and moved.status("sglang", S1).status == "upstreamed"
    other = [pm.Series(s.name, s.path, s.roots, s.patches[:1]) for s in shipped]  # another series: another script
    assert not judge(co, other).remembered
    memo = tmp_path / "host-cache" / "patch-judgements"
    assert memo.stat().st_mode & 0o777 == 0o700 and len(list(memo.iterdir())) == 5  # one per fresh judgement


def test_another_git_is_judged_afresh_without_asking_its_version(fleet_repo, shipped, tmp_path, monkeypatch):
    """The memo's key holds the git binary bash ran (a git upgrade replaces it); `git --version` is not run."""
    monkeypatch.setenv("GPUFLEET_HOST_CACHE", str(tmp_path / "host-cache"))
    bare, co = fleet_repo
    real = shutil.which("git")
    wrapper = tmp_path / "bin" / "git"
    wrapper.parent.mkdir()
    log = tmp_path / "git-calls"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    judge(co, shipped)
    assert judge(co, shipped).remembered
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{os.environ['PATH']}")
    assert not judge(co, shipped).remembered  # another binary: judged afresh
    log.write_text("")
    assert judge(co, shipped).remembered
    assert "--version" not in log.read_text() and log.read_text()  # the wrapper ran, never for its version
    wrapper.write_text(wrapper.read_text() + "# upgraded\n")
    assert not judge(co, shipped).remembered  # the same path, a new file


def test_a_cache_that_cannot_be_written_only_means_judging_afresh(fleet_repo, shipped, tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("GPUFLEET_HOST_CACHE", str(blocked))
    bare, co = fleet_repo
    first, again = judge(co, shipped), judge(co, shipped)
    assert not first.remembered and not again.remembered and statuses(again) == statuses(first)


def test_a_pinned_commit_the_checkout_has_is_judged_without_fetching(fleet_repo, shipped):
    bare, co = fleet_repo
    pin = git(co, "rev-parse", "HEAD")
    git(co, "remote", "set-url", "origin", str(bare.parent / "gone.git"))  # a fetch would fail and say so
    found = pm.decide("h", bash(pm.status_command(str(co), "main", shipped, target=pin[:9])).stdout, shipped)
    assert found.upstream == pin and not found.fetch_error
    unknown = "0" * 40
    found = pm.decide("h", bash(pm.status_command(str(co), "main", shipped, target=unknown)).stdout, shipped)
    assert found.fetch_error and not found.upstream  # not here: fetched (and here it fails)


# ---- applying for roles --------------------------------------------------------------------------------------------
def test_apply_skips_applied_applies_missing_and_is_idempotent(fleet_repo, shipped):
    bare, co = fleet_repo
    git(co, "checkout", "-q", "--", up.SYMM_MEM_FILE)
    assert bash(pm.missing_command(str(co), shipped[0])).returncode == 0
    assert bash(pm.applied_command(str(co), shipped[0])).returncode == 1
    proc = bash(pm.apply_command(str(co), shipped[0]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"gpufleet: {S1} already applied" in proc.stdout and f"gpufleet: applied {S2}" in proc.stdout
    assert (co / up.SYMM_MEM_FILE).read_text() == up.add_multimem_entry(SYMM)
    assert bash(pm.missing_command(str(co), shipped[0])).returncode == 1
    assert bash(pm.applied_command(str(co), shipped[0])).returncode == 0
    again = bash(pm.apply_command(str(co), shipped[0]))
    assert again.returncode == 0 and "applied 0" not in again.stdout and again.stdout.count("already applied") == 2


def test_apply_kernel_series_uses_the_kernel_directory(fleet_repo, shipped):
    bare, co = fleet_repo
    proc = bash(pm.apply_command(str(co), shipped[1]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert FA3_OPTIONAL in (co / "sgl-kernel/CMakeLists.txt").read_text()
    assert statuses(judge(co, shipped[1:])) == {f"sgl-kernel/{K1}": "applied"}


def test_apply_conflict_undoes_this_runs_patches(fleet_repo, shipped):
    bare, co = fleet_repo
    git(co, "checkout", "-q", ".")
    (co / up.SYMM_MEM_FILE).write_text(SYMM.replace("        10: [6, 8],\n", "        10: [8],\n"))
    before = {p: (co / p).read_text() for p in (up.SIZES_FILE, up.SYMM_MEM_FILE)}
    proc = bash(pm.apply_command(str(co), shipped[0]))
    assert proc.returncode == 2
    assert f"gpufleet: applied {S1}" in proc.stdout and f"patch {S2} does not apply" in proc.stdout
    assert {p: (co / p).read_text() for p in before} == before


def test_apply_on_a_missing_checkout_fails(tmp_path, shipped):
    proc = bash(pm.apply_command(str(tmp_path / "none"), shipped[0]))
    assert proc.returncode == 3 and "not a git checkout" in proc.stdout
