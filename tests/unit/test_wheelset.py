"""pip's installation report: a real one from pip against a local stand-in index, and hand-made edge cases."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.sim.index import build_index
from gpufleet.sim.wheels import build_wheel
from gpufleet.wheels.wheelset import REPORT_MARK, ReportError, WheelRef, canonical, parse_report

PIP_ENV = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
           "PIP_NO_CACHE_DIR": "1"}
SHA = "ab" * 32


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """A local index with a project needing a dependency that carries a local version label."""
    out = tmp_path_factory.mktemp("wheels")
    wheels = [build_wheel(out, "Gf_Report_Top", "1.0", {"gf_report_top/__init__.py": ""},
                          requires=["gf-report-dep>=2"]),
              build_wheel(out, "gf-report-dep", "2.1+cu130", {"gf_report_dep/__init__.py": ""}),
              build_wheel(out, "gf-report-dep", "1.0", {"gf_report_dep/__init__.py": ""})]
    root = out.parent / "index"
    build_index(wheels, root)
    return root


def pip_report(req: str, *source: str) -> str:
    """What the resolve script prints on a host: pip's lines, the mark, then pip's report."""
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--report", "-",
                           *source, req], capture_output=True, text=True, env=PIP_ENV, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return "WARNING: a line pip printed\n" + REPORT_MARK + "\n" + proc.stdout


def test_a_real_report_from_find_links(index: Path) -> None:
    files = index / "files"
    refs = parse_report(pip_report("gf-report-top", "--no-index", "--find-links", str(files)))
    top, dep = files / "gf_report_top-1.0-py3-none-any.whl", files / "gf_report_dep-2.1+cu130-py3-none-any.whl"
    assert sorted(refs, key=lambda r: r.filename) == [
        WheelRef("gf-report-dep", "2.1+cu130", dep.name, dep.as_uri().replace("+", "%2B"), sha256(dep)),
        WheelRef("Gf_Report_Top", "1.0", top.name, top.as_uri(), sha256(top)),
    ]


def test_a_real_report_from_a_simple_index(index: Path) -> None:
    refs = parse_report(pip_report("gf-report-top==1.0", "--index-url", (index / "simple").as_uri()))
    by_name = {canonical(r.name): r for r in refs}
    assert set(by_name) == {"gf-report-top", "gf-report-dep"}
    dep = by_name["gf-report-dep"]
    assert dep.version == "2.1+cu130" and dep.filename == "gf_report_dep-2.1+cu130-py3-none-any.whl"
    assert dep.sha256 == sha256(index / "files" / dep.filename)
    assert dep.url.endswith("/files/gf_report_dep-2.1%2Bcu130-py3-none-any.whl")


def test_a_real_report_for_an_old_pin(index: Path) -> None:
    refs = parse_report(pip_report("gf-report-dep==1.0", "--no-index", "--find-links", str(index / "files")))
    assert [(r.name, r.version, r.filename) for r in refs] == [
        ("gf-report-dep", "1.0", "gf_report_dep-1.0-py3-none-any.whl")]


# --- hand-made reports -----------------------------------------------------------------------------------------

def item(name: str = "torch", version: str = "2.12.0", *, url: str | None = None, **info) -> dict:
    url = url or f"https://files.example/{name}-{version}-py3-none-any.whl"
    return {"metadata": {"name": name, "version": version}, "download_info": {"url": url, **info}}


def text(*items: dict, mark: bool = True) -> str:
    body = json.dumps({"version": "1", "install": list(items)})
    return ("pip says something\n" + REPORT_MARK + "\n" + body) if mark else body


def test_hashes_come_from_archive_info_hashes_or_hash() -> None:
    refs = parse_report(text(item("a", "1", archive_info={"hashes": {"sha256": SHA.upper()}}),
                             item("b", "2", archive_info={"hash": f"sha256={SHA}"}),
                             item("c", "3", archive_info={"hash": f"md5={'0' * 32}"}),
                             item("d", "4", archive_info={}),
                             item("e", "5")))
    assert [r.sha256 for r in refs] == [SHA, SHA, None, None, None]


def test_hashes_win_over_hash() -> None:
    [ref] = parse_report(text(item(archive_info={"hashes": {"sha256": SHA}, "hash": f"sha256={'cd' * 32}"})))
    assert ref.sha256 == SHA


def test_a_report_without_the_mark_is_read_whole() -> None:
    [ref] = parse_report(text(item("x", "1"), mark=False))
    assert (ref.name, ref.version, ref.filename) == ("x", "1", "x-1-py3-none-any.whl")


def test_the_filename_is_unquoted_and_the_url_kept() -> None:
    url = "https://files.example/a/b/torch-2.12.0%2Bcu130-cp311-cp311-linux_x86_64.whl#sha256=" + SHA
    [ref] = parse_report(text(item("torch", "2.12.0+cu130", url=url)))
    assert ref.filename == "torch-2.12.0+cu130-cp311-cp311-linux_x86_64.whl" and ref.url == url


def test_nothing_to_install_is_an_empty_list() -> None:
    assert parse_report(text()) == []


@pytest.mark.parametrize("url, info", [
    ("https://files.example/triton-3.6.0.tar.gz", {"archive_info": {}}),
    ("file:///root/src/triton", {"dir_info": {"editable": True}}),
    ("file:///root/src/triton-3.6.0-py3-none-any.whl", {"dir_info": {}}),  # a directory, whatever its name
])
def test_sdists_and_directories_are_refused(url: str, info: dict) -> None:
    with pytest.raises(ReportError, match=r"triton 3\.6\.0 resolves to .*not a wheel: the control node hands "
                                          r"hosts wheels only"):
        parse_report(text(item("torch", "2.12.0"), item("triton", "3.6.0", url=url, **info)))


@pytest.mark.parametrize("body", [
    "{not json",
    "",
    json.dumps({"version": "1"}),  # no install list
    json.dumps([1, 2]),
])
def test_an_unreadable_report_is_a_report_error(body: str) -> None:
    with pytest.raises(ReportError, match="pip's installation report is not readable"):
        parse_report("ERROR: pip failed\n" + REPORT_MARK + "\n" + body)


@pytest.mark.parametrize("broken", [
    {"metadata": {"name": "x", "version": "1"}},
    {"download_info": {"url": "https://x/x-1-py3-none-any.whl"}},
    {"metadata": {"name": "x", "version": "1"}, "download_info": {}},
    "x",
])
def test_an_entry_without_metadata_or_download_info_is_a_report_error(broken) -> None:
    with pytest.raises(ReportError, match="entry without metadata or download_info"):
        parse_report(text(item("a", "1"), broken))


def test_wheel_ref_json_round_trip() -> None:
    ref = WheelRef("torch", "2.12.0+cu130", "torch-2.12.0+cu130-py3-none-any.whl", "https://x/t.whl", None)
    assert WheelRef.from_json(json.loads(json.dumps(ref.to_json()))) == ref
    assert WheelRef.from_json({**ref.to_json(), "sha256": SHA}).sha256 == SHA


@pytest.mark.parametrize("name, normal", [("Flashinfer_Python", "flashinfer-python"), ("zope.interface",
                                          "zope-interface"), ("sgl-kernel", "sgl-kernel")])
def test_canonical(name: str, normal: str) -> None:
    assert canonical(name) == normal
