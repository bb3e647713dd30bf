"""The checkout section parser: states, porcelain quoting, renames, credentials in remote URLs."""

import pytest

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
