"""facts_dists.py (the venv's distributions read from their metadata directories) gives pip list's answer: on the
real H200 venv's names and versions, on the edge cases pip 24.0 was seen to answer, and against this machine's pip."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from packaging.version import InvalidVersion, Version

from gpufleet import remote
from gpufleet.facts import facts_script, parse_facts, parse_pip_editables, parse_pip_list_json

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
# as over SSH: the test run's PYTHONPATH (the checkout, with any egg-info a build left there) is no host's
CLEAN_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def make_venv(path: Path, pip: bool = False) -> Path:
    subprocess.run([sys.executable, "-m", "venv", *([] if pip else ["--without-pip"]), str(path)], check=True)
    return next((path / "lib").glob("python*/site-packages"))


def dist_info(site: Path, dirname: str, name: str | None, version: str, **files: str) -> Path:
    info = site / dirname
    info.mkdir()
    if name is not None:
        # headers end at the first blank line: a `Name:` in the description must not count
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nName: not-this\n")
    for file, text in files.items():
        (info / ("direct_url.json" if file == "direct_url_json" else file)).write_text(text)
    return info


def read(venv: Path, *flags: str) -> tuple[str, str]:
    """(python section text, packages section text) from the reader run as the facts script runs it (-S)."""
    proc = subprocess.run([str(venv / "bin" / "python"), *(flags or ("-S",)), "-c", remote.text("facts_dists.py")],
                          cwd="/", capture_output=True, text=True, check=True, env=CLEAN_ENV)
    version, header, listing = proc.stdout.split("\n", 2)
    assert header == "@@gpufleet-section packages rc=0@@"
    return version, listing


@pytest.fixture(scope="module")
def h200_venv(tmp_path_factory) -> Path:
    """A venv holding a dist-info directory for each distribution pip listed in the real H200's venv."""
    venv = tmp_path_factory.mktemp("h200") / "venv"
    site = make_venv(venv)
    for item in json.loads((FIXTURES / "real-h200" / "pip-list.json").read_text()):
        # wheel installers name the directory after the name with runs of -_. as `_`
        dist_info(site, f"{re.sub(r'[-_.]+', '_', item['name'])}-{item['version']}.dist-info", item["name"],
                  item["version"], INSTALLER="pip\n", RECORD="")
    return venv


def test_real_h200_listing_is_pips_exactly(h200_venv):
    version, listing = read(h200_venv)
    assert version == ".".join(map(str, sys.version_info[:3]))
    assert listing == (FIXTURES / "real-h200" / "pip-list.json").read_text()


def test_real_h200_listing_parses_the_same(h200_venv):
    script = facts_script(str(h200_venv), "/nonexistent", "sglang", [])
    text = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, check=True,
                          env=CLEAN_ENV).stdout
    facts = parse_facts("h200", text)
    pip_list = (FIXTURES / "real-h200" / "pip-list.json").read_text()
    assert facts.packages == parse_pip_list_json(pip_list, "h200") and len(facts.packages) == 197
    assert facts.editables == {}
    assert facts.python_version == ".".join(map(str, sys.version_info[:3]))


@pytest.fixture(scope="module")
def edge_venv(tmp_path_factory) -> tuple[Path, Path]:
    """A venv with what real hosts carry besides clean wheels: each case as pip 24.0 answered it (see below)."""
    root = tmp_path_factory.mktemp("edge")
    venv = root / "venv"
    site = make_venv(venv)
    dist_info(site, "Demo_Pkg-1.0.0rc1.dist-info", "Demo_Pkg", "1.0.0-RC1")  # pip prints the PEP 440 normal form
    dist_info(site, "certi-2026.7.1.dist-info", "certi", "2026.07.01")
    dist_info(site, "loc-1.0+cu130.1.dist-info", "loc", "1.0+CU130.001")
    dist_info(site, "weird-0.dist-info", "weird", "not-a-version")  # pip 24.0 (LegacyVersion): as written
    dist_info(site, "broken-2.0.dist-info", None, "")  # an interrupted install: no METADATA, pip 24.0 skips it
    dist_info(site, "~orch-1.0.dist-info", "torch", "1.0")  # pip's leftover of an interrupted upgrade: ignored
    dist_info(site, "ed_pkg-0.1.dist-info", "ed-pkg", "0.1",
              direct_url_json='{"url": "file:///srv/my%20proj", "dir_info": {"editable": true}}')
    dist_info(site, "plain_dir-0.2.dist-info", "plain-dir", "0.2",  # installed from a directory, not editable
              direct_url_json='{"url": "file:///srv/plain", "dir_info": {}}')
    egg = site / "Old.Pkg-0.1-py3.12.egg-info"
    egg.mkdir()
    (egg / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: Old.Pkg\nVersion: 0.1\n")
    (site / "filepkg-3.0.egg-info").write_text("Metadata-Version: 1.1\nName: filepkg\nVersion: 3.0\n")
    # `setup.py develop`: the project's egg-info, an egg-link and the project directory on sys.path through a .pth
    legacy = root / "legacy"
    (legacy / "legacy.egg-info").mkdir(parents=True)
    (legacy / "legacy.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: legacy\nVersion: 0.3\n")
    (site / "legacy.egg-link").write_text(f"{legacy}\n.\n")
    (site / "easy-install.pth").write_text(f"{legacy}\n")
    # only an egg-link (no .pth): pip still finds it through the link
    linked = root / "linked"
    (linked / "linkonly.egg-info").mkdir(parents=True)
    (linked / "linkonly.egg-info" / "PKG-INFO").write_text("Metadata-Version: 1.1\nName: LinkOnly\nVersion: 0.4\n")
    (site / "LinkOnly.egg-link").write_text(f"{linked}\n")
    return venv, root


def test_edge_cases_as_pip_24_answers(edge_venv):
    venv, root = edge_venv
    _, listing = read(venv)
    assert json.loads(listing) == [
        {"name": "certi", "version": "2026.7.1"},
        {"name": "Demo_Pkg", "version": "1.0.0rc1"},
        {"name": "ed-pkg", "version": "0.1", "editable_project_location": "/srv/my proj"},
        {"name": "filepkg", "version": "3.0"},
        {"name": "legacy", "version": "0.3", "editable_project_location": str(root / "legacy")},
        {"name": "LinkOnly", "version": "0.4", "editable_project_location": str(root / "linked")},
        {"name": "loc", "version": "1.0+cu130.1"},
        {"name": "Old.Pkg", "version": "0.1"},
        {"name": "plain-dir", "version": "0.2"},
        {"name": "weird", "version": "not-a-version"},
    ]
    assert parse_pip_editables(listing, "h") == {"ed-pkg": "/srv/my proj", "legacy": str(root / "legacy"),
                                                 "linkonly": str(root / "linked")}


def test_first_on_sys_path_wins(tmp_path):
    venv = tmp_path / "venv"
    site = make_venv(venv)
    extra = tmp_path / "extra"
    extra.mkdir()
    dist_info(extra, "dup-9.0.dist-info", "dup", "9.0")
    dist_info(site, "dup-1.0.dist-info", "dup", "1.0")
    (site / "zz.pth").write_text(f"{extra}\n")  # appended after site-packages
    assert json.loads(read(venv)[1]) == [{"name": "dup", "version": "1.0"}]


def editable_finder(site: Path, runs: Path) -> None:
    """A .pth import line as setuptools' editable install writes one: it installs a finder and appends a placeholder
    path entry (naming no directory); each run appends to `runs`."""
    (site / "_gf_finder.py").write_text(f"import sys\ndef install():\n    open({str(runs)!r}, 'a').write('ran\\n')\n"
                                        "    sys.path.append('__editable__.ed_pkg-0.1.finder.__path_hook__')\n")
    (site / "__editable___ed_pkg_0_1_finder.pth").write_text("import _gf_finder; _gf_finder.install()\n")


def test_same_answer_as_this_machines_pip(tmp_path):
    """The oracle: pip itself, run in a venv holding the edge cases (pip's own dist-info listed too)."""
    venv = tmp_path / "venv"
    try:
        site = make_venv(venv, pip=True)
    except subprocess.CalledProcessError:
        pytest.skip("this python cannot make a venv with pip (no ensurepip)")
    dist_info(site, "Demo_Pkg-1.0.0rc1.dist-info", "Demo_Pkg", "1.0.0-RC1")
    dist_info(site, "ed_pkg-0.1.dist-info", "ed-pkg", "0.1",
              direct_url_json='{"url": "file:///srv/my%20proj", "dir_info": {"editable": true}}')
    dist_info(site, "~orch-1.0.dist-info", "torch", "1.0")
    (site / "filepkg-3.0.egg-info").write_text("Metadata-Version: 1.1\nName: filepkg\nVersion: 3.0\n")
    for n in range(6):  # an upgrade's leftovers: of one name in one directory, the first in listdir's order wins
        dist_info(site, f"dup-{n}.0.dist-info", "dup", f"{n}.0")
    editable_finder(site, tmp_path / "pth-runs")
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json",
                          "--disable-pip-version-check"], cwd="/", capture_output=True, text=True, check=True,
                         env=CLEAN_ENV)
    assert json.loads(read(venv)[1]) == json.loads(pip.stdout)


def test_setuptools_pth_import_lines_are_held_back_and_the_listing_is_pips(tmp_path):
    """The .pth files whose import lines only install import hooks (setuptools' distutils-precedence, virtualenv's,
    numba-cuda's redirector, an editable install's finder): those lines are not run under -S (each would leave a
    mark), their path lines are read; any other .pth's import line runs as site runs it, here one that puts a
    directory holding a distribution on sys.path. pip lists the same."""
    venv = tmp_path / "venv"
    try:
        site = make_venv(venv, pip=True)
    except subprocess.CalledProcessError:
        pytest.skip("this python cannot make a venv with pip (no ensurepip)")
    marks, project, extra = tmp_path / "marks", tmp_path / "project", tmp_path / "extra"
    for directory in (marks, project, extra):
        directory.mkdir()
    dist_info(project, "ed_pkg-0.1.dist-info", "ed-pkg", "0.1")
    dist_info(extra, "extra_pkg-2.0.dist-info", "extra-pkg", "2.0")
    (site / "_finder_mod.py").write_text(f"import sys\ndef install():\n    open({str(marks / 'finder')!r}, 'w')\n"
                                         "    sys.path.append('__editable__.ed_pkg-0.1.finder.__path_hook__')\n")
    (site / "__editable__.ed_pkg-0.1.pth").write_text(f"{project}\nimport _finder_mod; _finder_mod.install()\n")
    for hook in ("distutils-precedence.pth", "_virtualenv.pth", "_numba_cuda_redirector.pth"):
        (site / hook).write_text(f"# {hook}\n\nimport os; open({str(marks / hook)!r}, 'w')\n")
    (site / "zz_other.pth").write_text(f"import sys; open({str(marks / 'other')!r}, 'w'); "
                                       f"sys.path.append({str(extra)!r})\n")
    listing = json.loads(read(venv)[1])
    assert sorted(p.name for p in marks.iterdir()) == ["other"]
    assert {"name": "ed-pkg", "version": "0.1"} in listing and {"name": "extra-pkg", "version": "2.0"} in listing
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format=json",
                          "--disable-pip-version-check"], cwd="/", capture_output=True, text=True, check=True,
                         env=CLEAN_ENV)
    assert listing == json.loads(pip.stdout) == json.loads(read(venv, "-X", "utf8")[1])  # a normal start: the same


def test_a_reader_that_dies_still_gives_a_packages_section(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("#!/bin/sh\necho 'Traceback: boom' >&2\nexit 3\n")
    (venv / "bin" / "python").chmod(0o755)
    script = facts_script(str(venv), "/nonexistent", "sglang", [])
    facts = parse_facts("h", subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True,
                                            env=CLEAN_ENV).stdout)
    assert facts.packages is None and facts.python_version is None
    assert "could not read packages on host h: no pip list JSON in output: 'Traceback: boom' (exit code 3)" \
        in facts.problems


# The reader's plain-string helpers against the library answers they stand in for (packaging, re, json).
def reader_functions() -> dict:
    """facts_dists.py's functions, loaded without running it (it runs only as __main__)."""
    namespace = {"__name__": "facts_dists"}
    exec(compile(remote.text("facts_dists.py"), "facts_dists.py", "exec"), namespace)
    return namespace


READER = reader_functions()
NAMEISH = st.text(alphabet=st.sampled_from("aZ09._-~ é+"), max_size=12)


@given(NAMEISH)
def test_names_as_the_regular_expressions_answer(name):
    assert READER["canonical"](name) == re.sub(r"[-_.]+", "-", name).lower()
    assert READER["valid"](name) == bool(re.match(r"^([A-Z0-9]|[A-Z0-9][A-Z0-9._-]*[A-Z0-9])$", name, re.I))
    assert READER["safe_name"](name) == re.sub(r"[^A-Za-z0-9.]+", "-", name)


@given(st.text(max_size=12) | st.text(alphabet=st.sampled_from('a"\\\x01\x7fé\u2028 /'), max_size=8))
def test_quoting_is_json_dumps(text):
    assert READER["quoted"](text) == json.dumps(text)
    row = {"name": text, "version": "1.0"}
    assert READER["as_json"]([row, row]) == json.dumps([row, row])
    assert READER["as_json"]([]) == json.dumps([])


VERSIONISH = st.lists(st.sampled_from(["0", "1", "01", "12", ".", "a", "b", "rc", "c", "alpha", "post", "dev", "+",
                                       "cu130", "CU", "!", "-", "_", "v", "r", " "]), max_size=9).map("".join)
RELEASE = st.lists(st.integers(0, 3000), min_size=1, max_size=4).map(lambda parts: ".".join(map(str, parts)))
NORMAL = st.tuples(RELEASE, st.sampled_from(["", "a", "b", "rc"]), st.integers(0, 20),
                   st.sampled_from(["", ".post3", ".post0"]), st.sampled_from(["", ".dev20260307", ".dev0"]),
                   st.sampled_from(["", "+cu130", "+cu130.g1a2b", "+local"])).map(
    lambda t: t[0] + (t[1] + str(t[2]) if t[1] else "") + t[3] + t[4] + t[5])


@given(VERSIONISH | NORMAL)
@example("dev1")
@example("post1.dev2")
@example("1.0.dev1.post1")
@example("1.0a")
@example("01.0")
@example("1.0+01")
@example("1.0+cu130.01")
@example("1!1.0")
@example("1.0rc1.post2.dev3")
@example("v1.0")
@example(" 1.0 ")
@example("")
def test_versions_as_packaging_prints_them(text):
    """is_normal never says yes to a text packaging would rewrite; normal_version answers as packaging does."""
    try:
        expected = str(Version(text))
    except InvalidVersion:
        expected = text.strip()  # pip 24.0's LegacyVersion: as written
    if READER["is_normal"](text):
        assert expected == text
    assert READER["normal_version"](text) == expected


@given(NORMAL)
def test_the_shapes_installed_versions_take_need_no_full_parse(text):
    assert READER["is_normal"](text)


def test_the_real_listing_imports_neither_json_nor_re(h200_venv):
    """Each costs a host ~4 ms of CPU on every status; the real H200 venv's 197 distributions need neither."""
    code = remote.text("facts_dists.py") + "\nprint(sorted({'json', 're'} & set(sys.modules)))\n"
    proc = subprocess.run([str(h200_venv / "bin" / "python"), "-c", code], cwd="/", capture_output=True, text=True,
                          check=True, env=CLEAN_ENV)
    assert proc.stdout.splitlines()[-1] == "[]"


def reference_location(text: str | None, egg_link: str | None) -> str | None:
    """What the reader answered before its plain-string forms: every direct_url.json through json and urllib."""
    from urllib.parse import unquote, urlsplit

    try:
        direct = json.loads(text) if text is not None else None
    except ValueError:
        direct = None
    if isinstance(direct, dict) and isinstance(direct.get("url"), str):
        dir_info = direct.get("dir_info")
        if isinstance(dir_info, dict) and dir_info.get("editable") is True and direct["url"].startswith("file:"):
            parts = urlsplit(direct["url"])
            return unquote(parts.path) if parts.netloc in ("", "localhost") else None
        return None
    return egg_link


URLISH = st.lists(st.sampled_from(["file://", "file:///", "file://localhost/", "FILE:///", "https://h/", "root",
                                   "/", "a b", "%20", "%e2%82%ac", "?q", "#f", '"', "\\", "\t", "\n", "é", "\x7f",
                                   "\u2028", ".."]), max_size=6).map("".join)
DIRECT_URL = st.one_of(
    URLISH.map(lambda u: json.dumps({"dir_info": {"editable": True}, "url": u}, sort_keys=True)),
    URLISH.map(lambda u: json.dumps({"url": u, "dir_info": {"editable": True}}, separators=(",", ":"))),
    URLISH.map(lambda u: '{"dir_info": {"editable": true}, "url": "' + u + '"}'),  # written without escaping
    URLISH.map(lambda u: json.dumps({"archive_info": {"hashes": {"sha256": "ab"}}, "url": u}, sort_keys=True)),
    st.builds(lambda u, e: json.dumps({"url": u, "dir_info": {"editable": e}}), URLISH,
              st.sampled_from([True, False, 1, "true", None])),
    st.text(alphabet=st.sampled_from('{}[]":, \t\x0b\ufefftruefalsdiuelbe'), max_size=40),
)


@given(DIRECT_URL, st.booleans(), st.sampled_from(["", " ", "\n", "\x0b", "\ufeff"]))
@example('{"dir_info": {"editable": true}, "url": "file:///srv/my proj"}', False, "")
@example('{"dir_info": {"editable": true}, "url": "file:///srv/my%20proj"}', False, "\n")
@example('{"url":"file://localhost/srv/p","dir_info":{"editable":true}}', True, "")
@example('{"dir_info": {"editable": true}, "url": "file:///srv/p"}', False, "\x0b")  # no JSON whitespace
@example(json.dumps({"dir_info": {"editable": True}, "url": "file:///a\tb"}, sort_keys=True), False, "")
@example("not json", True, "")
@example('{"url": "file:///x", "dir_info": {}}', True, "")
def test_editable_location_as_json_and_urllib_answer(tmp_path_factory, text, egg_link, pad):
    info = tmp_path_factory.mktemp("d") / "proj" / "pkg.egg-info"
    info.mkdir(parents=True)
    (info / "direct_url.json").write_text(pad + text + pad, encoding="utf-8")
    entry = info.parent.parent
    if egg_link:
        (entry / "pkg.egg-link").write_text(str(info.parent))
    listings = [(str(entry), set(os.listdir(entry)))]
    expected = reference_location(pad + text + pad, str(info.parent) if egg_link else None)
    assert READER["editable_location"](str(info), "pkg", listings) == expected
