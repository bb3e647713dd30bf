"""host_cache.sh's gf_keep, run by bash: what the host remembers is whole, private, pruned, and never an error."""

from __future__ import annotations

import os
import subprocess
import time

from gpufleet import remote


def keep(directory, name, text: bytes) -> subprocess.CompletedProcess:
    script = remote.text("host_cache.sh") + 'gf_keep "$1" "$2"; echo "rc=$?"\n'
    return subprocess.run(["bash", "-c", script, "keep", str(directory), name], input=text, capture_output=True)


def test_kept_text_is_byte_exact_private_and_leaves_no_part_behind(tmp_path):
    memo = tmp_path / "cache" / "model-checks"
    text = b"@@gpufleet-model ok\n\xc3\xa9 two lines, no newline at the end"
    done = keep(memo, "k1", text)
    assert done.stdout == b"rc=0\n" and done.stderr == b""
    assert (memo / "k1").read_bytes() == text
    assert memo.stat().st_mode & 0o777 == 0o700 and sorted(os.listdir(memo)) == ["k1"]
    keep(memo, "k1", b"replaced\n")
    assert (memo / "k1").read_bytes() == b"replaced\n" and sorted(os.listdir(memo)) == ["k1"]


def test_entries_untouched_for_30_days_go_others_stay(tmp_path):
    memo = tmp_path / "m"
    keep(memo, "old", b"x")
    keep(memo, "recent", b"y")
    month_ago = time.time() - 31 * 86400
    os.utime(memo / "old", (month_ago, month_ago))
    keep(memo, "new", b"z")
    assert sorted(os.listdir(memo)) == ["new", "recent"]


def test_a_cache_that_cannot_be_written_is_no_error(tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    done = keep(blocked / "model-checks", "k1", b"x")
    assert done.stdout == b"rc=0\n" and done.stderr == b"" and blocked.read_text() == ""
