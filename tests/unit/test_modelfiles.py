"""The model-file check, run here on real directories, and the parsing of its report."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.facts import modelfiles
from gpufleet.errors import FactError

SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


def shard_bytes(n_floats: int = 256) -> bytes:
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "w": {"dtype": "F32", "shape": [n_floats], "data_offsets": [0, 4 * n_floats]}}).encode()
    return struct.pack("<Q", len(header)) + header + bytes(4 * n_floats)


def make_model(d: Path, shards=SHARDS) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    (d / modelfiles.INDEX).write_text(json.dumps({"metadata": {"total_size": 3072},
                                                  "weight_map": {f"t{i}": s for i, s in enumerate(shards)}}))
    for s in shards:
        (d / s).write_bytes(shard_bytes())
    return d


def check(d: Path, mode: str = "report") -> tuple[int, modelfiles.ModelReport]:
    cmd = modelfiles.check_cmd(str(d), sys.executable, mode)
    proc = subprocess.run(["bash", "-c", cmd.render()], capture_output=True, text=True)
    return proc.returncode, modelfiles.parse_report(proc.stdout, "gpu1")


def test_complete_model(tmp_path):
    code, report = check(make_model(tmp_path / "m"))
    assert code == 0 and report.ok and report.problems() == []
    assert report.shards == 3 and report.bytes == 3 * len(shard_bytes())
    assert report.summary().startswith("config.json, 3 shard(s), ")
    assert check(tmp_path / "m", "verify")[0] == 0 and check(tmp_path / "m", "needed")[0] == 1


def test_missing_empty_and_truncated_shards_are_named(tmp_path):
    d = make_model(tmp_path / "m")
    (d / SHARDS[1]).unlink()
    (d / SHARDS[2]).write_bytes(b"")
    code, report = check(d)
    assert code == 0 and not report.ok
    assert report.missing == [SHARDS[1]] and report.empty == [SHARDS[2]]
    assert report.problems() == [f"1 shard(s) missing: {SHARDS[1]}", f"1 shard(s) empty: {SHARDS[2]}"]
    (d / SHARDS[1]).write_bytes(shard_bytes()[:-100])  # a cut-off download
    (d / SHARDS[2]).write_bytes(b"garbage!garbage!")
    _, report = check(d)
    size = len(shard_bytes())
    assert report.bad == [(SHARDS[1], f"{size - 100} bytes, its header says {size}"),
                          (SHARDS[2], "unreadable safetensors header")]
    assert check(d, "verify")[0] == 1 and check(d, "needed")[0] == 0


def test_config_missing_index_broken_dir_absent(tmp_path):
    d = make_model(tmp_path / "m")
    (d / "config.json").unlink()
    assert check(d)[1].problems() == ["config.json missing"]
    (d / modelfiles.INDEX).write_text("{not json")
    assert "unreadable model.safetensors.index.json" in check(d)[1].problems()[1]
    _, report = check(tmp_path / "nowhere")
    assert report.problems() == [f"{tmp_path / 'nowhere'} does not exist"]


def test_single_file_model_and_no_weights(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text("{}")
    assert check(d)[1].problems() == ["neither model.safetensors.index.json nor model.safetensors is there"]
    (d / "model.safetensors").write_bytes(shard_bytes())
    assert check(d)[1].ok


def test_parse_report_needs_the_marker_line():
    line = modelfiles.MARKER + json.dumps({"dir": "/m", "exists": True, "config": True, "missing": ["a"],
                                           "bad": [["b", "why"]]})
    report = modelfiles.parse_report("noise\n" + line + "\n")
    assert report.missing == ["a"] and report.bad == [("b", "why")] and not report.ok
    with pytest.raises(FactError, match="no report"):
        modelfiles.parse_report("bash: /root/venv/bin/python: No such file or directory\n", "gpu1")
    with pytest.raises(FactError, match="bad report"):
        modelfiles.parse_report(modelfiles.MARKER + "{}", "gpu1")


def test_download_command_masks_the_token():
    from gpufleet.engine.command import Secret

    cmd = modelfiles.download_cmd("org/m", "/models/m", "/root/venv", {"HF_TOKEN": Secret("hf_zzz")})
    assert "hf_zzz" not in cmd.display() and "HF_TOKEN=hf_zzz" in cmd.render()
    assert cmd.argv[-3:] == ("org/m", "/models/m", "/root/venv")


# --- the report remembered on the host (model_memo.sh) -------------------------------------------------------------

def counting_python(tmp_path: Path) -> tuple[str, Path]:
    """This python behind a wrapper that counts its runs: a remembered report starts none."""
    runs = tmp_path / "python-runs"
    wrapper = tmp_path / "python"
    wrapper.write_text(f'#!/bin/sh\necho run >> {runs}\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper), runs


def remembered(d: Path, python: str, cache: Path) -> tuple[int, str]:
    cmd = modelfiles.report_cmd(str(d), python)
    proc = subprocess.run(["bash", "-c", cmd.render()], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "GPUFLEET_HOST_CACHE": str(cache)})
    return proc.returncode, proc.stdout


def runs_of(runs: Path) -> int:
    return len(runs.read_text().split()) if runs.exists() else 0


def test_a_report_is_remembered_until_the_directory_changes(tmp_path):
    d, (python, runs), cache = make_model(tmp_path / "m"), counting_python(tmp_path), tmp_path / "cache"
    first = remembered(d, python, cache)
    assert first[0] == 0 and modelfiles.parse_report(first[1], "gpu1").ok and runs_of(runs) == 1
    assert remembered(d, python, cache) == first and runs_of(runs) == 1
    (d / SHARDS[0]).write_bytes(shard_bytes()[:-8])  # a shard rewritten: checked afresh, and found cut off
    code, out = remembered(d, python, cache)
    assert code == 0 and runs_of(runs) == 2 and modelfiles.parse_report(out, "gpu1").bad
    (d / SHARDS[1]).unlink()
    assert modelfiles.parse_report(remembered(d, python, cache)[1], "gpu1").missing == [SHARDS[1]]
    assert runs_of(runs) == 3 and check(d)[1] == modelfiles.parse_report(remembered(d, python, cache)[1], "gpu1")


def test_another_check_never_reads_a_report_an_older_one_remembered(tmp_path, monkeypatch):
    d, (python, runs), cache = make_model(tmp_path / "m"), counting_python(tmp_path), tmp_path / "cache"
    remembered(d, python, cache)
    monkeypatch.setattr(modelfiles, "CHECK", modelfiles.CHECK + "\n# a check that reads one thing more\n")
    remembered(d, python, cache)
    assert runs_of(runs) == 2


def test_without_a_cache_every_report_is_fresh_and_the_same(tmp_path):
    d, (python, runs) = make_model(tmp_path / "m"), counting_python(tmp_path)
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    assert remembered(d, python, blocked) == remembered(d, python, blocked) and runs_of(runs) == 2
    assert remembered(tmp_path / "absent", python, tmp_path / "cache")[1] == remembered(
        tmp_path / "absent", python, tmp_path / "cache")[1]
    assert runs_of(runs) == 4  # no listing, no memo: a directory that is not there is asked every time


def test_a_linked_shard_is_judged_by_the_file_it_names(tmp_path):
    """A Hugging Face snapshot's shards are links into its blobs: a blob replaced in place is checked afresh."""
    d, (python, runs), cache = make_model(tmp_path / "m"), counting_python(tmp_path), tmp_path / "cache"
    blob = tmp_path / "blobs" / "b1"
    blob.parent.mkdir()
    (d / SHARDS[2]).rename(blob)
    (d / SHARDS[2]).symlink_to(blob)
    assert modelfiles.parse_report(remembered(d, python, cache)[1], "gpu1").ok
    blob.write_bytes(b"garbage!garbage!")  # the link itself is untouched
    assert modelfiles.parse_report(remembered(d, python, cache)[1], "gpu1").bad and runs_of(runs) == 2
