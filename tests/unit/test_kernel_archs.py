"""gpufleet/remote/kernel_archs.py: which GPU architectures a built CUDA library contains.

The fixtures (tests/fixtures/kernel-archs) are tiny nvcc 13.0 libraries with cuobjdump's own listings recorded beside
them; both methods (cuobjdump, here a stand-in that replays the recorded listing, and the fatbin reader) must give
exactly cuobjdump's answer. tests/fixtures/real-h200-cuobjdump holds what ran on a real H200 machine.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import json
import os
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "gpufleet" / "remote" / "kernel_archs.py"
FIXTURES = REPO / "tests" / "fixtures" / "kernel-archs"
REAL = REPO / "tests" / "fixtures" / "real-h200-cuobjdump"


def _load():
    spec = importlib.util.spec_from_file_location("kernel_archs_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ka = _load()

LIBS = sorted(FIXTURES.glob("*.so"))

# What cuobjdump 13.5 listed (the recorded .list-elf/.list-ptx files), spelled out so a parser regression shows.
EXPECTED = {
    "plain.so": (["sm_80", "sm_89", "sm_90a", "sm_100a", "sm_120a"], []),
    "ptx.so": (["sm_80", "sm_90a", "sm_120"], ["compute_89", "compute_90a", "compute_100a", "compute_120f"]),
    "compressed.so": (["sm_80", "sm_90a", "sm_120"], ["compute_89", "compute_90a", "compute_100a", "compute_120f"]),
    "family.so": (["sm_90", "sm_90a", "sm_100", "sm_103", "sm_120", "sm_121a"], ["compute_121a"]),
}


def recorded(lib: Path) -> str:
    return (lib.parent / f"{lib.name}.list-elf.txt").read_text() + (lib.parent / f"{lib.name}.list-ptx.txt").read_text()


def run_script(*args: str, stdin_script: bool = True) -> dict:
    """Runs the script as gpufleet ships it: `python - ARGS` with the script on stdin."""
    cmd = [sys.executable, "-", *args] if stdin_script else [sys.executable, str(SCRIPT), *args]
    proc = subprocess.run(
        cmd, input=SCRIPT.read_bytes() if stdin_script else None, capture_output=True, timeout=60, cwd="/"
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b"", proc.stderr.decode()
    return json.loads(proc.stdout)


@pytest.fixture
def fake_cuobjdump(tmp_path):
    """A cuobjdump that replays the recorded listing of a fixture (exit 255 'no device code' for anything else)."""
    fake = tmp_path / "bin" / "cuobjdump"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\n"
        '[ "$1 $2" = "--list-elf --list-ptx" ] || exit 9\n'
        f"fixtures={str(FIXTURES)!r}\n"
        'name=$(basename "$3")\n'
        'if [ "$(cd "$(dirname "$3")" && pwd)" != "$fixtures" ] || [ ! -f "$fixtures/$name.list-elf.txt" ]; then\n'
        "  echo \"cuobjdump info    : File '$3' does not contain device code\" >&2; exit 255\n"
        "fi\n"
        'cat "$fixtures/$name.list-elf.txt" "$fixtures/$name.list-ptx.txt"\n'
    )
    fake.chmod(0o755)
    return str(fake)


# --- the fixtures: both methods give cuobjdump's recorded answer ---


def test_fixtures_are_small_and_recorded():
    assert sorted(p.name for p in LIBS) == sorted(EXPECTED)
    for lib in LIBS:
        assert lib.stat().st_size < 100_000, lib
        assert ka.parse_cuobjdump_listing(recorded(lib)) == EXPECTED[lib.name], lib.name
    assert "release 13.5, V13.5.37" in (FIXTURES / "cuobjdump-version.txt").read_text()
    assert "release 13.0, V13.0.88" in (FIXTURES / "nvcc-version.txt").read_text()


@pytest.mark.parametrize("lib", LIBS, ids=lambda p: p.name)
def test_fatbin_reader_matches_cuobjdump(lib):
    assert ka.read_fatbin(str(lib)) == ka.parse_cuobjdump_listing(recorded(lib))
    report = ka.library_report(str(lib), cuobjdump=None)
    assert report == {
        "path": str(lib),
        "archs": EXPECTED[lib.name][0],
        "ptx": EXPECTED[lib.name][1],
        "method": "fatbin",
        "error": None,
    }


def test_both_methods_through_the_shipped_script(fake_cuobjdump):
    paths = [str(p) for p in LIBS]
    with_cuobjdump = run_script("--cuobjdump", fake_cuobjdump, *paths)["libraries"]
    fallback = run_script("--cuobjdump", "/nonexistent", *paths)["libraries"]
    for lib, a, b in zip(LIBS, with_cuobjdump, fallback):
        want = list(EXPECTED[lib.name][0]), list(EXPECTED[lib.name][1])
        assert (a["path"], a["method"], a["error"]) == (str(lib), "cuobjdump", None)
        assert (b["path"], b["method"], b["error"]) == (str(lib), "fatbin", None)
        assert (a["archs"], a["ptx"]) == want == (b["archs"], b["ptx"]), lib.name


def test_directory_every_so_sorted_and_cuobjdump_failure_falls_back(tmp_path, fake_cuobjdump):
    sub = tmp_path / "lib" / "sub"
    sub.mkdir(parents=True)
    (sub / "b.so").write_bytes((FIXTURES / "ptx.so").read_bytes())  # the fake says "no device code": fallback
    (tmp_path / "lib" / "a.so").write_bytes(b"not an ELF at all")
    (tmp_path / "lib" / "notes.txt").write_text("ignored")
    doc = run_script("--cuobjdump", fake_cuobjdump, str(tmp_path / "lib"), str(FIXTURES / "plain.so"))
    got = [(Path(r["path"]).name, r["method"], r["archs"], r["error"] is None) for r in doc["libraries"]]
    assert got == [
        ("a.so", "fatbin", [], False),
        ("b.so", "fatbin", EXPECTED["ptx.so"][0], True),
        ("plain.so", "cuobjdump", EXPECTED["plain.so"][0], True),
    ]
    # the directory itself, run as a file path (not through stdin) with the fatbin reader
    doc = run_script("--cuobjdump", "/nonexistent", str(FIXTURES), stdin_script=False)
    assert [r["path"] for r in doc["libraries"]] == [str(p) for p in LIBS]


def test_shipped_with_the_package_and_stdlib_only():
    text = importlib.resources.files("gpufleet.remote").joinpath("kernel_archs.py").read_text()
    assert text == SCRIPT.read_text()
    assert "gpufleet" not in "".join(line for line in text.splitlines() if line.startswith(("import", "from")))
    doc = importlib.resources.files("gpufleet.remote").joinpath("__init__.py").read_text()
    assert "importlib.resources" in doc


# --- cuobjdump: listing parser and lookup ---


def test_parse_cuobjdump_listing():
    text = (
        "ELF file    1: common_ops.abi3.1.sm_120a.cubin\n"
        "ELF file    2: common_ops.abi3.2.sm_90a.cubin\n"
        "ELF file   10: common_ops.abi3.10.sm_90a.cubin\n"
        "ELF file   11: x.11.sm_100.cubin\n"
        "PTX file    1: x.1.sm_90a.ptx\n"
        "PTX file    2: x.2.sm_120f.ptx\n"
        "cuobjdump info    : No PTX file found to extract from 'x.so'. You may try with -all option.\n"
    )
    assert ka.parse_cuobjdump_listing(text) == (["sm_90a", "sm_100", "sm_120a"], ["compute_90a", "compute_120f"])
    assert ka.parse_cuobjdump_listing("") == ([], [])
    assert sorted(["sm_100a", "sm_90", "sm_90a", "sm_80"], key=ka.arch_key) == ["sm_80", "sm_90", "sm_90a", "sm_100a"]


def _exe(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_find_cuobjdump_order(tmp_path):
    cuda_home = _exe(tmp_path / "cuda" / "bin" / "cuobjdump")
    on_path = _exe(tmp_path / "path" / "cuobjdump")
    explicit = _exe(tmp_path / "x" / "my-cuobjdump")
    env = {"CUDA_HOME": str(tmp_path / "cuda"), "PATH": str(tmp_path / "path")}
    assert ka.find_cuobjdump(explicit, env) == explicit
    assert ka.find_cuobjdump("/nonexistent", env) is None  # --cuobjdump is the only candidate: forces the fallback
    assert ka.find_cuobjdump(None, env) == cuda_home
    if not os.path.exists("/usr/local/cuda/bin/cuobjdump"):
        assert ka.find_cuobjdump(None, {"PATH": str(tmp_path / "path")}) == on_path
        assert ka.find_cuobjdump(None, {"CUDA_HOME": str(tmp_path / "none"), "PATH": str(tmp_path / "x")}) is None


# --- bad input: a clear per-library error, never a traceback ---


def _elf(sections: dict[str, bytes], ei_class: int = 2) -> bytes:
    """A minimal little-endian ELF64 with the given sections (plus the null section and .shstrtab)."""
    names = [".shstrtab", *sections]
    strtab = b"\0" + b"".join(n.encode() + b"\0" for n in names)
    blobs = [strtab, *sections.values()]
    body, offsets = b"", []
    for blob in blobs:
        offsets.append(64 + len(body))
        body += blob + b"\0" * (-len(blob) % 8)
    shoff = 64 + len(body)
    header = bytearray(64)
    header[:4] = b"\x7fELF"
    header[4], header[5], header[6] = ei_class, 1, 1
    struct.pack_into("<HHI", header, 16, 3, 0xBE, 1)
    struct.pack_into("<Q", header, 0x28, shoff)
    struct.pack_into("<HHHHHH", header, 0x34, 64, 0, 0, 64, len(blobs) + 1, 1)
    table = bytes(64)
    name_off = 1
    for name, blob, off in zip(names, blobs, offsets):
        table += struct.pack("<IIQQQQIIQQ", name_off, 1, 0, 0, off, len(blob), 0, 0, 8, 0)
        name_off += len(name) + 1
    return bytes(header) + body + table


def _entry(kind: int, sm: int, flags: int, payload: bytes = b"\0" * 16, header_size: int = 64) -> bytes:
    head = struct.pack("<HHIQIIHHIIIQ", kind, 0x101, header_size, len(payload), 0, 0, 8, 1, sm, 0, 0, flags)
    return head + b"\0" * (header_size - len(head)) + payload


def _container(*entries: bytes, claimed: int | None = None) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body) if claimed is None else claimed) + body


def test_synthetic_fatbin_layout(tmp_path):
    fatbin = (
        _container(_entry(2, 90, 0x100011), _entry(1, 90, 0x108011), _entry(8, 90, 0x18011))
        + b"\0" * 8  # alignment padding between containers
        + _container(_entry(2, 100, 0x1200011), _entry(2, 120, 0x1100011, header_size=0x70), _entry(1, 100, 0x208011))
    )
    lib = tmp_path / "syn.so"
    lib.write_bytes(_elf({".text": b"\x90" * 8, ".nv_fatbin": fatbin}))
    assert ka.library_report(str(lib)) == {
        "path": str(lib),
        "archs": ["sm_90a", "sm_100", "sm_120a"],  # family cubin: no "f", like cuobjdump --list-elf
        "ptx": ["compute_90a", "compute_100f"],
        "method": "fatbin",
        "error": None,
    }


def _patched(src: Path, offset: int, fmt: str, value: int) -> bytes:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    return bytes(data)


def _fatbin_offset(lib: Path) -> tuple[int, int]:
    with open(lib, "rb") as f:
        return ka.fatbin_sections(f)[0]


def test_bad_input_gives_a_per_library_error(tmp_path):
    plain = FIXTURES / "plain.so"
    fat_off, fat_size = _fatbin_offset(plain)
    shoff = struct.unpack_from("<Q", plain.read_bytes(), 0x28)[0]
    cases = {
        "text.so": (b"hello, not a library\n" * 4, "not an ELF file"),
        "short.so": (b"\x7fELF", "not an ELF file"),
        "elf32.so": (_elf({".nv_fatbin": _container(_entry(2, 90, 0))}, ei_class=1), "not a 64-bit ELF file"),
        "nofatbin.so": (_elf({".text": b"\x90" * 16}), "no .nv_fatbin section"),
        "container-overrun.so": (_patched(plain, fat_off + 8, "<Q", fat_size * 4), "truncated fatbin: container"),
        "entry-overrun.so": (_patched(plain, fat_off + 16 + 8, "<Q", 1 << 40), "truncated fatbin: entry"),
        "bad-magic.so": (_patched(plain, fat_off, "<I", 0x12345678), "bad fatbin magic 0x12345678"),
        "cut.so": (plain.read_bytes()[: fat_off + 100], "truncated file"),
        "stray.so": (_elf({".nv_fatbin": _container(_entry(2, 90, 0)) + b"\x01\x02\x03"}), "truncated fatbin: 3 stray"),
    }
    # a section that claims to run past the end of the file (the section header table is kept intact)
    data = bytearray(plain.read_bytes())
    for i in range(struct.unpack_from("<H", data, 0x3C)[0]):
        if struct.unpack_from("<Q", data, shoff + i * 64 + 0x18)[0] == fat_off:
            struct.pack_into("<Q", data, shoff + i * 64 + 0x20, len(data))
    cases["section-past-eof.so"] = (bytes(data), ".nv_fatbin section (offset")
    for name, (content, _) in cases.items():
        (tmp_path / name).write_bytes(content)
    paths = [str(tmp_path / name) for name in cases] + [str(tmp_path / "missing.so")]
    doc = run_script("--cuobjdump", "/nonexistent", *paths)
    errors = {Path(r["path"]).name: r["error"] for r in doc["libraries"]}
    for name, (_, want) in cases.items():
        assert errors[name] and want in errors[name], (name, errors[name])
    assert errors["missing.so"] == "no such file"
    for r in doc["libraries"]:
        assert (r["archs"], r["ptx"], r["method"]) == ([], [], "fatbin")
        assert "Traceback" not in r["error"]


def test_usage_error_exits_2():
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, timeout=30)
    assert proc.returncode == 2 and b"usage: kernel_archs.py" in proc.stderr


# --- the real H200 machine ---


def _real_listings() -> dict[str, str]:
    """NAME.list-elf.out etc. from the cuobjdump.tar.gz that came back from the H200 machine."""
    out = {}
    with tarfile.open(REAL / "cuobjdump.tar.gz") as tar:
        for member in tar.getmembers():
            if member.isfile():
                out[Path(member.name).name] = tar.extractfile(member).read().decode()
    return out


# What cuobjdump 13.0.85 listed on the H200 machine (torch 2.11.0+cu130); both kernel_archs methods agreed there.
REAL_EXPECTED = {
    "h200_k.so": (["sm_90a", "sm_100", "sm_100a", "sm_120a"], ["compute_120a"]),  # sm_100f lists as sm_100
    "h200_kc.so": (["sm_90", "sm_120"], ["compute_90", "compute_120f"]),
    "libtorch_cuda.so": (
        ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "sm_90a", "sm_100", "sm_100a", "sm_103a", "sm_120", "sm_120a",
         "sm_121a"],
        [],
    ),
    "libtorchaudio.abi3.so": (["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"], ["compute_120"]),
}


def _real_json(name: str) -> dict[str, dict]:
    return {Path(r["path"]).name: r for r in json.loads((REAL / name).read_text())["libraries"]}


def test_real_h200_cuobjdump_listings_and_both_methods_agree():
    listings = _real_listings()
    normal, fallback = _real_json("kernel_archs.json"), _real_json("kernel_archs-fallback.json")
    assert sorted(normal) == sorted(fallback) == sorted(REAL_EXPECTED)
    for name, (archs, ptx) in REAL_EXPECTED.items():
        assert listings[f"{name}.list-elf.rc"].strip() == "0", name
        parsed = ka.parse_cuobjdump_listing(listings[f"{name}.list-elf.out"] + listings[f"{name}.list-ptx.out"])
        assert parsed == (archs, ptx), name
        assert (normal[name]["method"], normal[name]["error"]) == ("cuobjdump", None), name
        assert (fallback[name]["method"], fallback[name]["error"]) == ("fatbin", None), name
        assert (normal[name]["archs"], normal[name]["ptx"]) == parsed == (fallback[name]["archs"], fallback[name]["ptx"])


@pytest.mark.parametrize("name", ["h200_k.so", "h200_kc.so"])
def test_real_h200_libraries_read_here(name):
    """The tiny libraries built on the H200 machine came back: the fatbin reader agrees with its cuobjdump here too."""
    lib = REAL / name
    assert lib.stat().st_size < 100_000
    listings = _real_listings()
    want = ka.parse_cuobjdump_listing(listings[f"{name}.list-elf.out"] + listings[f"{name}.list-ptx.out"])
    assert ka.read_fatbin(str(lib)) == want == REAL_EXPECTED[name]


def test_real_h200_torch_lib_directory():
    """The fatbin reader over torch's whole lib directory: CUDA libraries read, the others a clear error."""
    got = _real_json("kernel_archs-torchlib.json")
    assert got["libtorch_cuda.so"]["archs"] == REAL_EXPECTED["libtorch_cuda.so"][0]
    assert got["libtorch_cuda_linalg.so"]["archs"] == ["sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]
    assert got["libtorch_nvshmem.so"]["ptx"] == ["compute_120"]
    assert got["libc10.so"]["error"] == "ELF file has no .nv_fatbin section (no CUDA device code)"
    assert all(r["method"] == "fatbin" for r in got.values())
    log = (REAL / "log.txt").read_text()
    assert "release 13.0, V13.0.85" in log and "NVIDIA H200" in log and "DIFFER" not in log
