"""The checkout section parser: states, porcelain quoting, renames, credentials in remote URLs."""

import os
import subprocess

import pytest

from gpufleet import remote
from gpufleet.errors import FactError
from gpufleet.facts import parse_checkout, redact_url, unquote_path

HEAD = ("path=/root/sglang-main\nexists=yes\npresent=yes\nhead=abc123\nbranch=\nupstream=\nahead_behind=\n"
        "remote_url=git@github.com:sgl-project/sglang.git\n")


def test_detached_head_without_upstream():
    co = parse_checkout(HEAD + "@@status\n@@stash\n", "h")
    assert co.present and co.head == "abc123"
    assert (co.branch, co.upstream, co.ahead, co.behind) == (None, None, None, None)
    assert (co.modified, co.untracked, co.stashes) == ([], [], [])
    assert co.remote_url == "git@github.com:sgl-project/sglang.git"


def test_porcelain_forms():
    status = ('@@status\n M a.py\nM  b.py\nR  old.py -> new.py\nUU conflict.py\n?? "with space.txt"\n'
              '?? "tab\\there.txt"\n?? "\\303\\251.txt"\n D gone.py\n@@stash\nstash@{0}: On main: edits\n')
    co = parse_checkout(HEAD + status, "h")
    assert co.modified == ["a.py", "b.py", "new.py", "conflict.py", "gone.py"]
    assert co.untracked == ["with space.txt", "tab\there.txt", "é.txt"]
    assert co.stashes == ["stash@{0}: On main: edits"]


def test_missing_and_not_a_repo():
    missing = parse_checkout("path=/root/sglang-main\nexists=no\npresent=no\n", "h")
    assert (missing.present, missing.exists) == (False, False)
    plain = parse_checkout("path=/root/sglang-main\nexists=yes\npresent=no\ntoplevel=\n", "h")
    assert (plain.present, plain.exists) == (False, True)


def test_git_status_failure_is_named():
    text = HEAD + "@@status\nfatal: index file corrupt\n"
    with pytest.raises(FactError, match="could not read source checkout on host h: git failed in /root/sglang-main: "
                                        "'fatal: index file corrupt'"):
        parse_checkout(text, "h")


def test_git_missing():
    with pytest.raises(FactError, match="git not found"):
        parse_checkout("path=/x\nexists=yes\ngpufleet: git not found\n", "h")


def test_garbage():
    with pytest.raises(FactError, match="unexpected output 'what'"):
        parse_checkout("what\n", "h")
    with pytest.raises(FactError, match="unexpected git status line"):
        parse_checkout(HEAD + "@@status\nX\n@@stash\n", "h")


@pytest.mark.parametrize("url, safe", [
    ("https://ghp_token@github.com/sgl-project/sglang.git", "https://github.com/sgl-project/sglang.git"),
    ("https://user:pw@example.com:8443/r.git", "https://example.com:8443/r.git"),
    ("ssh://git:pw@example.com/r.git", "ssh://git@example.com/r.git"),
    ("ssh://git@example.com/r.git", "ssh://git@example.com/r.git"),
    ("git@github.com:sgl-project/sglang.git", "git@github.com:sgl-project/sglang.git"),
    ("git://10.213.0.1/sglang", "git://10.213.0.1/sglang"),
])
def test_redact_url(url, safe):
    assert redact_url(url) == safe


def test_unquote_plain_path_unchanged():
    assert unquote_path("plain.py") == "plain.py"
    assert unquote_path('"a\\"b"') == 'a"b'


# ---- the section's script, run on real repositories ----------------------------------------------------------------
def _git(repo, *args, check=True):
    env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check, env=env)


def _one_command_each(co) -> str:
    """The section as it was made before: one git command per answer (symbolic-ref, rev-parse @{u}, rev-list)."""
    def out(*args):
        proc = _git(co, *args, check=False)
        return proc.stdout.strip("\n") if proc.returncode == 0 else ""
    return (f"path={co}\nexists=yes\npresent=yes\nhead={out('rev-parse', '--verify', '-q', 'HEAD')}\n"
            f"branch={out('symbolic-ref', '--short', '-q', 'HEAD')}\n"
            f"upstream={out('rev-parse', '--abbrev-ref', '--symbolic-full-name', '@{u}')}\n"
            f"ahead_behind={out('rev-list', '--left-right', '--count', 'HEAD...@{u}')}\n"
            f"remote_url={out('remote', 'get-url', 'origin')}\n@@status\n"
            f"{out('-c', 'core.quotepath=false', 'status', '--porcelain=v1')}\n@@stash\n{out('stash', 'list')}\n")


def _section(co) -> str:
    script = remote.text("facts.sh") + '\ngf_checkout "$1" sgl-kernel python/sglang/kernels/aot\n'
    proc = subprocess.run(["bash", "-c", script, "facts", str(co)], capture_output=True, text=True,
                          env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _states(tmp_path):
    """A checkout of a bare upstream, walked through the states a host's checkout can be in."""
    up, co = tmp_path / "up.git", tmp_path / "co"
    _git(tmp_path, "init", "-q", "--bare", "-b", "main", str(up))
    _git(tmp_path, "clone", "-q", str(up), str(co))
    yield "unborn, upstream configured but empty"
    _git(co, "commit", "-q", "--allow-empty", "-m", "one")
    yield "unborn upstream: no remote branch yet"
    _git(co, "push", "-q", "-u", "origin", "main")
    yield "in step with upstream"
    (co / "a file.py").write_text("x\n")
    (co / "tab\there.txt").write_text("x\n")
    yield "untracked files with awkward names"
    _git(co, "add", "a file.py")
    _git(co, "commit", "-q", "-m", "two")
    yield "ahead 1"
    other = tmp_path / "other"
    _git(tmp_path, "clone", "-q", str(up), str(other))
    for n in range(3):
        _git(other, "commit", "-q", "--allow-empty", "-m", f"up {n}")
    _git(other, "push", "-q", "origin", "main")
    _git(co, "fetch", "-q")
    yield "ahead 1, behind 3"
    _git(co, "config", "status.aheadBehind", "false")
    yield "ahead and behind, with the host's git told not to count"
    _git(co, "reset", "-q", "--hard", "origin/main")
    (co / "a file.py").write_text("x\n")
    _git(co, "add", "a file.py")
    _git(co, "mv", "a file.py", "renamed.py")
    (co / "renamed.py").write_text("y\n")
    _git(co, "stash", "-q")
    (co / "renamed.py").write_text("z\n")
    yield "a stash, an untracked file"
    _git(co, "checkout", "-q", "--detach", "HEAD~1")
    yield "detached"
    _git(co, "checkout", "-q", "-b", "local")
    yield "a branch without upstream"
    _git(co, "branch", "-q", "--set-upstream-to", "origin/main")
    _git(co, "push", "-q", "origin", "local:gone")
    _git(co, "fetch", "-q")
    _git(co, "branch", "-q", "--set-upstream-to", "origin/gone")
    _git(co, "push", "-q", "origin", ":gone")
    _git(co, "fetch", "-q", "--prune")
    yield "upstream gone"
    _git(co, "stash", "drop", "-q")
    _git(co, "checkout", "-q", "-f", "-B", "main", "origin/main")
    (co / "old name.py").write_text("a\n" * 50)
    (co / "del.py").write_text("d\n")
    (co / "both.py").write_text("base\n")
    _git(co, "add", "-A")
    _git(co, "commit", "-q", "-m", "files")
    _git(co, "mv", "old name.py", "new\tname.py")
    (co / "del.py").unlink()
    (co / "ignored.log").write_text("x\n")
    (co / ".gitignore").write_text("*.log\n")
    yield "a rename to a quoted name, a deletion, an ignored file"
    _git(co, "reset", "-q", "--hard")
    _git(co, "checkout", "-q", "-b", "side")
    (co / "both.py").write_text("side\n")
    _git(co, "commit", "-q", "-am", "side")
    _git(co, "checkout", "-q", "main")
    (co / "both.py").write_text("main\n")
    _git(co, "commit", "-q", "-am", "main")
    _git(co, "merge", "-q", "side", check=False)
    yield "a merge conflict"
    _git(co, "merge", "--abort")
    _git(co, "checkout", "-q", "--orphan", "fresh")
    _git(co, "config", "branch.fresh.remote", "origin")
    _git(co, "config", "branch.fresh.merge", "refs/heads/main")
    yield "no commit yet on a branch whose upstream exists"


def _entries(section: str) -> list[tuple[str, str]]:
    lines = section.split("@@status\n")[1].split("@@stash")[0].splitlines()
    return [(line[:2], " -> ".join(unquote_path(p) for p in line[3:].split(" -> "))) for line in lines if line]


def test_one_status_answers_what_a_command_each_did(tmp_path):
    seen = {}
    for state in _states(tmp_path):
        co = tmp_path / "co"
        section, oracle = _section(co), _one_command_each(co)
        new, old = parse_checkout(section, "h"), parse_checkout(oracle, "h")
        # the file lines' codes and paths as porcelain v1 gives them (the section reads v2 where it can; v1 also
        # quotes a path with a space, v2 does not: the parser reads both)
        assert _entries(section) == _entries(oracle), state
        assert new.model_dump(exclude={"kernel_dir", "kernel_name", "kernel_version"}) == old.model_dump(
            exclude={"kernel_dir", "kernel_name", "kernel_version"}), state
        seen[state] = (new.branch, new.upstream, new.ahead, new.behind, len(new.modified), len(new.untracked),
                       len(new.stashes))
    assert seen["unborn, upstream configured but empty"] == ("main", None, None, None, 0, 0, 0)
    assert seen["in step with upstream"] == ("main", "origin/main", 0, 0, 0, 0, 0)
    assert seen["untracked files with awkward names"] == ("main", "origin/main", 0, 0, 0, 2, 0)
    assert seen["ahead 1, behind 3"] == seen["ahead and behind, with the host's git told not to count"] \
        == ("main", "origin/main", 1, 3, 0, 1, 0)
    assert seen["a stash, an untracked file"] == ("main", "origin/main", 0, 0, 0, 2, 1)
    assert seen["detached"][:4] == (None, None, None, None)
    assert seen["a branch without upstream"][:4] == ("local", None, None, None)
    assert seen["upstream gone"][:4] == ("local", None, None, None)
    assert seen["a rename to a quoted name, a deletion, an ignored file"][4:6] == (2, 1)
    assert seen["a merge conflict"][4] == 1
    assert seen["no commit yet on a branch whose upstream exists"][:4] == ("fresh", "origin/main", None, None)
    assert len(seen) == 14


def test_a_converged_checkout_costs_two_git_commands(tmp_path):
    """One status (porcelain v2: HEAD, branch, upstream, distance, files) and the origin: no rev-parse, and no stash
    list without a stash reflog; a subdirectory still goes the old way (rev-parse tells it is not the top)."""
    states = _states(tmp_path)
    for state in states:
        if state == "in step with upstream":
            break
    co, trace = tmp_path / "co", tmp_path / "trace"

    def commands(path) -> list[str]:
        trace.write_text("")
        script = remote.text("facts.sh") + '\ngf_checkout "$1" sgl-kernel\n'
        subprocess.run(["bash", "-c", script, "facts", str(path)], check=True, capture_output=True,
                       env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_TRACE": str(trace)})
        return [line.split("built-in: git ", 1)[1].split()[0]
                for line in trace.read_text().splitlines() if "built-in: git " in line]

    assert commands(co) == ["status", "remote"]
    _git(co, "stash", "push", "-q", "--include-untracked", "-m", "x", check=False)
    (co / "f").write_text("x\n")
    _git(co, "stash", "push", "-q", "--include-untracked", "-m", "kept")
    assert commands(co)[:3] == ["status", "remote", "stash"]  # (stash list may run a `git log` of its own)
    (co / "sub").mkdir()
    assert commands(co / "sub")[0] == "rev-parse"
