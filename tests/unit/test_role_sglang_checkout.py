"""The sglang checkout role: what it plans from facts, and its update script run for real on local git repositories."""

from __future__ import annotations

import base64
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from gpufleet.testing.context import plan_context
from gpufleet.engine.command import Cmd
from gpufleet.facts.checkout import CheckoutFacts
from gpufleet.config.inventory import Host
from gpufleet.plan import PlanError, Step, Unchanged
from gpufleet.sim import upstream as up
from gpufleet.engine.ssh import Result
from gpufleet.config.stack import Stack
from gpufleet.roles import patches as pm
from gpufleet.roles import sglang_checkout as role

REPO = Path(__file__).resolve().parents[2]
S1, S2 = "0001-symm-mem-all-reduce-sizes-sm120.patch", "0002-symm-mem-multimem-world-sizes-sm120.patch"
SIZES = (up.TREE / up.SIZES_FILE).read_text()
HEAD = "a" * 40
UPSTREAM = "b" * 40
GITHUB = "https://github.com/sgl-project/sglang.git"
ENV = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=check,
                          env=ENV).stdout.rstrip("\n")


def bash(cmd: Cmd) -> subprocess.CompletedProcess:
    return subprocess.run(cmd.render(), shell=True, executable="/bin/bash", capture_output=True, text=True, env=ENV)


def result(cmd: Cmd, step: str, code: int, output: str) -> Result:
    return Result("gpu1", step, cmd.display(), code, output, 0.0)


def context(checkout: CheckoutFacts | None, probe=None, stack: Stack | None = None, path="/root/sglang-main"):
    host = Host(name="gpu1", address="10.0.0.1", sglang_checkout=path)
    return plan_context(host=host, stack=stack, checkout=checkout, read=probe, repo=REPO)


def facts(**kw) -> CheckoutFacts:
    base = dict(path="/root/sglang-main", present=True, head=HEAD, branch="main", upstream="origin/main",
                remote_url=GITHUB, modified=[up.SIZES_FILE, up.SYMM_MEM_FILE])
    return CheckoutFacts(**{**base, **kw})


def fake_probe(remote=UPSTREAM, contained=False, patches_output=None, code=0):
    """Answers the two plan-time probes: upstream's tip, and the patch status script."""
    calls = []

    def probe(cmd: Cmd, step: str) -> Result:
        calls.append(step)
        if step == "probe upstream sglang":
            return result(cmd, step, code, f"remote={remote}\n" + ("contained=yes\n" if contained else ""))
        return result(cmd, step, 0, patches_output if patches_output is not None else _all_applied())
    probe.calls = calls
    return probe


def _all_applied(missing: tuple[str, ...] = (), conflicts: bool = False) -> str:
    """What the status script prints on a sim host: the SM120 patches in the checkout (but `missing`), upstream
    without them (conflicting there too if `conflicts`)."""
    symm = (up.TREE / up.SYMM_MEM_FILE).read_text()
    files = {S1: (up.SIZES_FILE, SIZES, up.add_sizes_entry), S2: (up.SYMM_MEM_FILE, symm, up.add_multimem_entry)}
    lines = [f"@@head {HEAD}", f"@@upstream {UPSTREAM}"]
    for tree in ("wt", "up"):
        for patch, (path, text, edit) in files.items():
            applied = tree == "wt" and patch not in missing
            fwd = 1 if applied or (conflicts and patch in missing) else 0
            lines += [f"@@judge {tree} sglang {patch} fwd={fwd} rev={0 if applied else 1} root="]
            lines += ["|error: patch failed: x.py:3"] if fwd and not applied else []
            lines += [f"@@file pre {path}", base64.b64encode((edit(text) if applied else text).encode()).decode()]
    return "\n".join(lines) + "\n"


# ---- planning from facts ------------------------------------------------------------------------------------------
def test_behind_upstream_plans_one_update_step_with_exact_commands():
    probe = fake_probe()
    items = role.plan(context(facts(), probe))
    step = items[0]
    assert isinstance(step, Step) and step.role == "sglang-checkout"
    assert step.title == f"update sglang checkout {HEAD[:10]} -> {UPSTREAM[:10]}"
    assert step.reason == (f"checkout at {HEAD[:10]}, upstream is at {UPSTREAM[:10]}; "
                           "2 local edit(s) kept (backed up, stashed, restored)")
    assert step.commands == (role.update_command("/root/sglang-main", "main", UPSTREAM, False),)
    assert step.needed == role.needed_command("/root/sglang-main", UPSTREAM, False)
    assert step.verify == (role.done_command("/root/sglang-main", UPSTREAM, False),)
    assert step.changes == ("checkout",) and step.timeout == role.UPDATE_TIMEOUT
    assert items[1:] == [Unchanged("sglang-checkout", "sglang patches: all 2 applied")]
    assert probe.calls == ["probe upstream sglang", "probe sglang patches"]


def test_at_upstream_tip_is_unchanged():
    items = role.plan(context(facts(head=UPSTREAM), fake_probe()))
    assert items[0] == Unchanged("sglang-checkout", f"main@{UPSTREAM[:10]} is upstream's tip")


def test_head_containing_upstream_tip_is_unchanged():
    items = role.plan(context(facts(), fake_probe(contained=True)))
    assert isinstance(items[0], Unchanged) and "local commits on top" in items[0].reason


def test_without_a_probe_the_step_pulls_whatever_origin_has():
    items = role.plan(context(facts(modified=[]), None))
    assert len(items) == 1
    step = items[0]
    assert step.title == f"update sglang checkout {HEAD[:10]} -> origin/main"
    assert step.reason.endswith("no local edits")
    assert step.commands == (role.update_command("/root/sglang-main", "main", "", False),)
    assert step.needed is None and step.verify == ()


def test_pinned_commit():
    stack = Stack.model_validate({"sglang": {"commit": HEAD[:12]}})
    assert role.plan_update(context(facts(), None, stack)) == [
        Unchanged("sglang-checkout", f"main@{HEAD[:10]} is the pinned commit")]
    stack = Stack.model_validate({"sglang": {"commit": "c" * 12}})
    step = role.plan_update(context(facts(), None, stack))[0]
    assert step.commands == (role.update_command("/root/sglang-main", "main", "c" * 12, True),)
    assert "stack.toml pins cccccccccc" in step.reason


def test_unreadable_upstream_stops_planning():
    with pytest.raises(PlanError, match="cannot read origin's main"):
        role.plan(context(facts(), fake_probe(remote="", code=2)))


@pytest.mark.parametrize("bad, words", [
    (dict(branch="feature"), "is on feature, stack.toml wants branch main"),
    (dict(branch=None), "is on a detached HEAD"),
    (dict(remote_url="https://github.com/someone/fork.git"), "origin of /root/sglang-main is https://github.com/some"),
    (dict(present=False, exists=True), "exists but is not the top of a git checkout"),
])
def test_refusals(bad, words):
    with pytest.raises(PlanError, match=words):
        role.plan(context(facts(**bad), fake_probe()))


def test_remote_spellings_of_the_same_repository_match():
    same = ["git@github.com:sgl-project/sglang.git", "https://token@github.com/sgl-project/sglang",
            "ssh://git@github.com/sgl-project/sglang.git/", "https://GitHub.com/sgl-project/sglang.git"]
    assert {role.normalise_remote(u) for u in same} == {"github.com/sgl-project/sglang"}
    assert role.normalise_remote("/srv/git/sglang.git") == "srv/git/sglang"


def test_missing_checkout_is_cloned_then_patched():
    items = role.plan(context(CheckoutFacts(path="/root/sglang-main", present=False, exists=False), fake_probe()))
    clone, patch = items
    assert clone.commands[0].argv[2] == ("mkdir -p /root && git clone -q --branch main -- "
                                         f"{GITHUB} /root/sglang-main")
    assert patch.commands == (pm.apply_command("/root/sglang-main", pm.stack_series(Stack(), REPO)[0]),)


def test_missing_patch_plans_an_apply_step_and_conflicting_everywhere_refuses():
    items = role.plan(context(facts(head=UPSTREAM), fake_probe(patches_output=_all_applied(missing=(S2,)))))
    step = items[1]
    assert step.title == f"apply sglang patches {S2}" and step.reason == f"{S2} not in the checkout"
    series = pm.stack_series(Stack(), REPO)[0]
    only = pm.Series(series.name, series.path, series.roots, series.patches[1:])
    assert step.commands == (pm.apply_command("/root/sglang-main", only),)
    assert step.needed == pm.missing_command("/root/sglang-main", only)
    assert step.verify == (pm.applied_command("/root/sglang-main", only),)
    with pytest.raises(PlanError, match=f"{S2} conflicts on the checkout and on upstream: x.py:3"):
        role.plan(context(facts(head=UPSTREAM), fake_probe(patches_output=_all_applied((S2,), conflicts=True))))


def test_update_script_quotes_the_checkout_path():
    text = role.update_script("/root/my sglang", "main", UPSTREAM)
    assert text.startswith(f"co='/root/my sglang'\nbranch=main\ntarget={UPSTREAM}\npinned=0\n"
                           f"backups={role.BACKUPS}\n")


# ---- the update script, run for real -------------------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A bare upstream and a checkout (in a path with a space) with the two SM120 edits, a staged file, an untracked
    file and a stash of the operator's own."""
    monkeypatch.setattr(role, "BACKUPS", str(tmp_path / "backups"))
    bare, co = tmp_path / "up.git", tmp_path / "my checkout"
    up.build_upstream(bare)
    up.clone_with_local_edits(bare, co)
    (co / "README.md").write_text("operator's stashed experiment\n")
    git(co, "stash", "push", "-q", "-m", "operator's own stash", "--", "README.md")
    (co / "notes.txt").write_text("untracked notes\n")
    (co / "staged.txt").write_text("staged\n")
    git(co, "add", "staged.txt")
    return bare, co


def snapshot(co: Path) -> dict:
    files = {p: (co / p).read_bytes() for p in git(co, "ls-files", "-co", "--exclude-standard").splitlines()}
    return {"head": git(co, "rev-parse", "HEAD"), "status": git(co, "status", "--porcelain=v1"),
            "stashes": git(co, "stash", "list", "--format=%H %gs"), "files": files}


def local_facts(co: Path) -> CheckoutFacts:
    status = git(co, "status", "--porcelain=v1").splitlines()
    return CheckoutFacts(path=str(co), present=True, head=git(co, "rev-parse", "HEAD"),
                         branch=git(co, "symbolic-ref", "--short", "HEAD"),
                         remote_url=git(co, "remote", "get-url", "origin"),
                         modified=[s[3:] for s in status if not s.startswith("??")],
                         untracked=[s[3:] for s in status if s.startswith("??")])


def local_plan(bare: Path, co: Path, patches: Path | None = None) -> list:
    extra = {"patches": str(patches)} if patches else {}
    stack = Stack.model_validate({"sglang": {"remote": str(bare), **extra}, "sgl_kernel": extra})
    probe = lambda cmd, step: result(cmd, step, (p := bash(cmd)).returncode, p.stdout + p.stderr)  # noqa: E731
    return role.plan(context(local_facts(co), probe, stack, path=str(co)))


def apply_locally(items: list) -> list[subprocess.CompletedProcess]:
    """What the engine does with each step: needed?, commands, verify; stop at the first failure."""
    done = []
    for step in [i for i in items if isinstance(i, Step)]:
        if step.needed is not None and bash(step.needed).returncode == 1:
            continue
        for cmd in step.commands:
            done.append(bash(cmd))
            if done[-1].returncode != 0:
                return done
        for cmd in step.verify:
            assert bash(cmd).returncode == 0, f"verify of {step.title} failed"
    return done


def test_clean_upgrade_keeps_edits_and_stashes_and_converges(repo):
    bare, co = repo
    before = snapshot(co)
    new = up.add_upstream_commit(bare, {"README.md": "upstream moved on\n"}, "Unrelated upstream change")
    items = local_plan(bare, co)
    assert [type(i) for i in items] == [Step, Unchanged]
    [proc] = apply_locally(items)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = snapshot(co)
    assert after["head"] == new
    assert after["stashes"] == before["stashes"]
    assert after["files"][up.SIZES_FILE] == before["files"][up.SIZES_FILE]
    assert after["files"]["notes.txt"] == b"untracked notes\n" and after["files"]["README.md"] == b"upstream moved on\n"
    assert set(after["status"].splitlines()) == {f" M {up.SIZES_FILE}", f" M {up.SYMM_MEM_FILE}", "?? notes.txt",
                                                 "A  staged.txt"}
    backups = sorted(Path(role.BACKUPS).iterdir())
    assert [b.suffix for b in backups] == [".info", ".patch", ".tar"]
    assert "12: {" in backups[1].read_text() and "staged.txt" in backups[1].read_text()
    assert tarfile.open(backups[2]).getnames() == ["notes.txt"]
    assert all(isinstance(i, Unchanged) for i in local_plan(bare, co))
    again = bash(role.update_command(str(co), "main", new))
    assert again.returncode == 0 and "already at" in again.stdout and snapshot(co) == after


def test_pop_conflict_puts_the_checkout_back_exactly(repo):
    bare, co = repo
    before = snapshot(co)
    new = up.add_upstream_commit(bare, {up.SIZES_FILE: SIZES.replace("    },\n}", "    },  # Blackwell (SM100)\n}")},
                                 "Touch the line next to the SM120 edit")
    # With the site's series, moving there is refused before anything runs: the size patch conflicts on upstream.
    with pytest.raises(PlanError, match=f"sglang patch {S1} conflicts on {new[:10]}"):
        local_plan(bare, co)
    assert snapshot(co) == before
    # Without a series (local edits of the operator's own), the update runs and the pop conflict puts it all back.
    none = Path(role.BACKUPS).parent / "no-patches"
    none.mkdir(parents=True, exist_ok=True)
    items = local_plan(bare, co, patches=none)
    [proc] = apply_locally(items)
    assert proc.returncode == role.EXIT_RESTORED, proc.stdout + proc.stderr
    assert "redo the edit on top of upstream" in proc.stdout
    assert f"conflict with upstream {new} in {up.SIZES_FILE}" in proc.stdout
    assert "back exactly as it was" in proc.stdout
    assert snapshot(co) == before
    assert "staged.txt" in git(co, "diff", "--cached", "--name-only")  # the index came back too
    assert not (Path(git(co, "rev-parse", "--absolute-git-dir")) / role.MARKER).exists()
    patch = next(Path(role.BACKUPS).glob("*.patch"))
    assert "+    12: {" in patch.read_text()
    # The backup alone brings the edits back onto a clean tree.
    git(co, "stash", "push", "-q", "--include-untracked")
    git(co, "apply", str(patch))
    assert (co / up.SIZES_FILE).read_text() == up.add_sizes_entry(SIZES)


def test_diverged_local_commit_refuses_before_touching_anything(repo):
    bare, co = repo
    git(co, "-c", "user.name=x", "-c", "user.email=x@x", "commit", "-q", "-m", "local commit")
    up.add_upstream_commit(bare, {"README.md": "upstream\n"}, "Upstream change")
    before = snapshot(co)
    [proc] = apply_locally(local_plan(bare, co))
    assert proc.returncode == role.EXIT_REFUSED
    assert "cannot fast-forward" in proc.stdout and "1 commit(s) upstream does not have" in proc.stdout
    assert snapshot(co) == before and not Path(role.BACKUPS).exists()


def test_a_cut_short_run_is_undone_before_updating(repo):
    bare, co = repo
    before = snapshot(co)
    old = before["head"]
    new = up.add_upstream_commit(bare, {"README.md": "upstream\n"}, "Upstream change")
    # What a run killed between the stash and the pop leaves: a gpufleet stash, a clean tree, HEAD moved, the marker.
    git(co, "-c", "user.name=x", "-c", "user.email=x@x", "stash", "push", "-q", "--include-untracked",
        "-m", "gpufleet T")
    git(co, "fetch", "-q", "origin")
    git(co, "merge", "-q", "--ff-only", new)
    stash = git(co, "rev-parse", "refs/stash")
    marker = Path(git(co, "rev-parse", "--absolute-git-dir")) / role.MARKER
    marker.write_text(f"head={old}\nstash={stash}\nts=T\n")
    proc = bash(role.update_command(str(co), "main", new))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cut short after stashing" in proc.stdout
    after = snapshot(co)
    assert after["head"] == new and after["stashes"] == before["stashes"] and not marker.exists()
    assert after["files"][up.SIZES_FILE] == before["files"][up.SIZES_FILE]


def test_a_cut_short_run_with_changes_in_the_tree_is_left_to_people(repo):
    bare, co = repo
    git(co, "-c", "user.name=x", "-c", "user.email=x@x", "stash", "push", "-q", "-m", "gpufleet T")
    (co / "README.md").write_text("someone edited since\n")
    marker = Path(git(co, "rev-parse", "--absolute-git-dir")) / role.MARKER
    marker.write_text(f"head={git(co, 'rev-parse', 'HEAD')}\nstash={git(co, 'rev-parse', 'refs/stash')}\nts=T\n")
    before = snapshot(co)
    proc = bash(role.update_command(str(co), "main"))
    assert proc.returncode == role.EXIT_REFUSED and "git stash show -p" in proc.stdout
    assert snapshot(co) == before and marker.exists()


def test_works_without_a_git_identity_and_pins_forward_only(repo):
    bare, co = repo
    git(co, "config", "--unset", "user.name")
    git(co, "config", "--unset", "user.email")
    first = up.add_upstream_commit(bare, {"README.md": "one\n"}, "one")
    second = up.add_upstream_commit(bare, {"README.md": "two\n"}, "two")
    proc = bash(role.update_command(str(co), "main", first[:12], pinned=True))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert git(co, "rev-parse", "HEAD") == first
    assert bash(role.done_command(str(co), first[:12], True)).returncode == 0
    assert bash(role.done_command(str(co), second[:12], True)).returncode == 1
    assert bash(role.needed_command(str(co), second, False)).returncode == 0
    bash(role.update_command(str(co), "main", second, pinned=True))
    back = bash(role.update_command(str(co), "main", first, pinned=True))
    assert back.returncode == role.EXIT_REFUSED and "newer than the pinned commit" in back.stdout
    assert bash(role.needed_command(str(co), second, False)).returncode == 1


def test_wrong_branch_and_unfinished_merge_are_refused(repo):
    bare, co = repo
    assert "on main, not other" in bash(role.update_command(str(co), "other")).stdout
    (Path(git(co, "rev-parse", "--absolute-git-dir")) / "MERGE_HEAD").write_text(git(co, "rev-parse", "HEAD") + "\n")
    proc = bash(role.update_command(str(co), "main"))
    assert proc.returncode == role.EXIT_REFUSED and "MERGE_HEAD" in proc.stdout


def test_the_patch_probe_fetches_only_a_tip_the_checkout_lacks(repo, tmp_path):
    """The plan judges the patches on upstream's tip as the upstream probe read it: a checkout that has that commit
    is judged with no trip to the remote (a converged host's nightly no-op), one that lacks it fetches it."""
    bare, co = repo
    said = {}

    def probe(cmd, step):
        proc = bash(cmd)
        said[step] = proc.stdout
        return result(cmd, step, proc.returncode, proc.stdout + proc.stderr)
    stack = Stack.model_validate({"sglang": {"remote": str(bare)}})
    role.plan(context(local_facts(co), probe, stack, path=str(co)))
    tip = git(bare, "rev-parse", "main")
    assert f"@@upstream {tip}" in said["probe sglang patches"] and "@@fetch" not in said["probe sglang patches"]
    other = tmp_path / "other"
    git(tmp_path, "clone", "-q", str(bare), str(other))
    (other / "NEWS").write_text("upstream moved\n")
    git(other, "add", "NEWS")
    git(other, "-c", "user.name=u", "-c", "user.email=u@example.com", "commit", "-q", "-m", "moved")
    git(other, "push", "-q", "origin", "HEAD:main")
    role.plan(context(local_facts(co), probe, stack, path=str(co)))
    moved = git(bare, "rev-parse", "main")
    assert moved != tip and f"@@upstream {moved}" in said["probe sglang patches"]
    assert "@@fetch rc=0" in said["probe sglang patches"]
