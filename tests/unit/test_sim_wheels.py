"""Stand-in wheels install with real pip, import with the right versions, and serve from a PEP 503 index."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

from gpufleet.sim.index import build_index, serve_index_command
from gpufleet.sim.wheels import OLD, TARGET, build_stack_wheels, build_wheel

# Keep the developer's pip configuration (index URLs, caches) out of these installs.
PIP_ENV = {**os.environ, "PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1",
           "PIP_NO_CACHE_DIR": "1"}
REPORT = """
import json, flashinfer, sgl_kernel, torch, triton
print(json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "git": torch.version.git_version,
    "avail": torch.cuda.is_available(), "count": torch.cuda.device_count(),
    "cap": torch.cuda.get_device_capability(0), "name": torch.cuda.get_device_name(0),
    "arch_list": torch.cuda.get_arch_list(), "cxx11abi": torch._C._GLIBCXX_USE_CXX11_ABI,
    "triton": triton.__version__, "flashinfer": flashinfer.__version__, "sgl_kernel": sgl_kernel.__version__,
    "archs": sgl_kernel.build_info["archs"], "fp4": callable(sgl_kernel.cutlass_scaled_fp4_mm)
        and callable(torch.ops.sgl_kernel.cutlass_fp4_group_mm)}))
"""
OLD_PINS = [f"{name}=={version}" for name, version in OLD.items() if name in (
    "torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "sgl-kernel")]


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheelhouse")
    build_stack_wheels(out)
    return out


@pytest.fixture
def gpus_json(tmp_path) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"count": 7, "name": "NVIDIA H200", "compute_cap": "9.0", "fail": None}))
    return path


def wheel(wheelhouse: Path, name: str, version: str) -> Path:
    return wheelhouse / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"


def new_venv(path: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    return path / "bin" / "python"


def pip(python: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pip", "--python", str(python), *args], env=PIP_ENV,
                          capture_output=True, text=True)


def run_python(python: Path | str, code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), "-c", code], env={**os.environ, **env}, capture_output=True, text=True)


def unpack(wheels: list[Path], dest: Path) -> str:
    """A site directory holding the wheels' files: importable with PYTHONPATH, no pip needed."""
    for path in wheels:
        with zipfile.ZipFile(path) as archive:
            archive.extractall(dest)
    return str(dest)


def test_build_wheel_writes_a_valid_record(tmp_path):
    path = build_wheel(tmp_path, "Demo.Pkg", "1.0+local", {"demo_pkg/__init__.py": "X = 1\n"}, ["torch"],
                       scripts={"demo": "demo_pkg:main"})
    assert path.name == "demo_pkg-1.0+local-py3-none-any.whl"
    with zipfile.ZipFile(path) as archive:
        info = "demo_pkg-1.0+local.dist-info"
        assert "Root-Is-Purelib: true\n" in archive.read(f"{info}/WHEEL").decode()
        assert "Tag: py3-none-any\n" in archive.read(f"{info}/WHEEL").decode()
        assert "Requires-Dist: torch\n" in archive.read(f"{info}/METADATA").decode()
        assert "demo = demo_pkg:main" in archive.read(f"{info}/entry_points.txt").decode()
        rows = [line.split(",") for line in archive.read(f"{info}/RECORD").decode().splitlines()]
        assert sorted(row[0] for row in rows) == sorted(archive.namelist())
        for name, digest, size in rows:
            if name.endswith("RECORD"):
                assert digest == size == ""
                continue
            data = archive.read(name)
            expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={expected}", len(data))


def test_stack_wheels_cover_both_stacks_reproducibly(wheelhouse, tmp_path):
    names = sorted(path.name for path in wheelhouse.glob("*.whl"))
    assert len(names) == 15
    for stack in (OLD, TARGET):
        for name, version in stack.items():
            assert wheel(wheelhouse, name, version).name in names
    again = build_stack_wheels(tmp_path)
    assert all(path.read_bytes() == (wheelhouse / path.name).read_bytes() for path in again)


def test_old_stack_installs_with_pip_and_reports_the_simulated_gpus(wheelhouse, tmp_path, gpus_json):
    python = new_venv(tmp_path / "venv")
    proc = pip(python, "install", "--no-index", "--find-links", str(wheelhouse), *OLD_PINS)
    assert proc.returncode == 0, proc.stderr
    report = run_python(python, REPORT, GPUFLEET_SIM_GPUS=str(gpus_json))
    assert report.returncode == 0, report.stderr
    facts = json.loads(report.stdout)
    assert re.fullmatch(r"[0-9a-f]{40}", facts.pop("git"))
    assert facts == {
        "torch": "2.9.1+cu130", "cuda": "13.0", "avail": True, "count": 7,
        "cap": [9, 0], "name": "NVIDIA H200", "arch_list": ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"],
        "cxx11abi": True, "triton": "3.5.1", "flashinfer": "0.6.4", "sgl_kernel": "0.3.16",
        "archs": ["sm_90a", "sm_100a", "sm_120a"], "fp4": True}
    freeze = set(pip(python, "freeze").stdout.split())
    assert {"nvidia-cublas==13.1.0.3", "nvidia-cuda-runtime==13.0.96", "flashinfer-jit-cache==0.6.4+cu130"} <= freeze
    show = subprocess.run([str(python.parent / "flashinfer"), "show-config"], capture_output=True, text=True)
    assert "FlashInfer version: 0.6.4" in show.stdout and "flashinfer-cubin version: 0.6.4" in show.stdout


def test_target_torch_pulls_its_cascade(wheelhouse, tmp_path):
    python = new_venv(tmp_path / "venv")
    assert pip(python, "install", "--no-index", "--find-links", str(wheelhouse), "torch==2.9.1+cu130").returncode == 0
    proc = pip(python, "install", "--no-index", "--find-links", str(wheelhouse), "torch==2.12.0.dev20260307+cu130")
    assert proc.returncode == 0, proc.stderr
    installed = re.search(r"Successfully installed (.*)", proc.stdout).group(1).split()
    assert sorted(installed) == ["nvidia-cublas-13.2.0.1", "torch-2.12.0.dev20260307+cu130", "triton-3.6.0"]
    assert run_python(python, "import torch; print(torch.__version__)").stdout.strip() == "2.12.0.dev20260307+cu130"


def test_no_gpus_when_the_driver_fails(wheelhouse, tmp_path):
    site = unpack([wheel(wheelhouse, "torch", OLD["torch"])], tmp_path / "site")
    config = tmp_path / "gpus.json"
    config.write_text(json.dumps({"count": 8, "fail": "driver not loaded"}))
    code = "import torch; print(torch.cuda.is_available(), torch.cuda.device_count(), torch.cuda.get_arch_list())"
    assert run_python(sys.executable, code, PYTHONPATH=site, GPUFLEET_SIM_GPUS=str(config)).stdout == "False 0 []\n"
    code = "import torch; torch.cuda.get_device_capability(0)"
    failed = run_python(sys.executable, code, PYTHONPATH=site, GPUFLEET_SIM_GPUS=str(config))
    assert "RuntimeError: Found no NVIDIA driver on your system" in failed.stderr


def test_flashinfer_cubin_mismatch_raises_the_real_message(wheelhouse, tmp_path):
    site = unpack([wheel(wheelhouse, "flashinfer-python", "0.6.5"), wheel(wheelhouse, "flashinfer-cubin", "0.6.4")],
                  tmp_path / "site")
    proc = run_python(sys.executable, "import flashinfer", PYTHONPATH=site)
    message = ("RuntimeError: flashinfer-cubin version (0.6.4) does not match flashinfer version (0.6.5). "
               "Please install the same version of both packages. "
               "Set FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check.")
    assert message in proc.stderr
    bypass = run_python(sys.executable, "import flashinfer", PYTHONPATH=site, FLASHINFER_DISABLE_VERSION_CHECK="1")
    assert bypass.returncode == 0


def test_flashinfer_jit_cache_must_match_up_to_its_cuda_suffix(wheelhouse, tmp_path):
    core = [wheel(wheelhouse, "flashinfer-python", "0.6.5"), wheel(wheelhouse, "flashinfer-cubin", "0.6.5")]
    matched = unpack([*core, wheel(wheelhouse, "flashinfer-jit-cache", "0.6.5+cu130")], tmp_path / "matched")
    code = "import flashinfer, flashinfer_jit_cache as j; print(flashinfer.__version__, j.__version__)"
    assert run_python(sys.executable, code, PYTHONPATH=matched).stdout == "0.6.5 0.6.5+cu130\n"
    stale = unpack([*core, wheel(wheelhouse, "flashinfer-jit-cache", "0.6.4+cu130")], tmp_path / "stale")
    proc = run_python(sys.executable, "import flashinfer", PYTHONPATH=stale)
    assert "flashinfer-jit-cache version (0.6.4+cu130) does not match flashinfer version (0.6.5)" in proc.stderr


def test_prebuilt_sgl_kernel_breaks_on_a_newer_torch(wheelhouse, tmp_path):
    kernel = wheel(wheelhouse, "sgl-kernel", "0.3.16")
    site = unpack([kernel, wheel(wheelhouse, "torch", TARGET["torch"])], tmp_path / "site")
    proc = run_python(sys.executable, "import sgl_kernel", PYTHONPATH=site)
    assert "ImportError: [sgl_kernel] CRITICAL: Could not load any common_ops library!" in proc.stderr
    assert "undefined symbol: _ZN3c10" in proc.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_http(url: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def test_index_pages_follow_pep_503(wheelhouse, tmp_path):
    simple = build_index(sorted(wheelhouse.glob("*.whl")), tmp_path / "index")
    assert simple == tmp_path / "index" / "simple"
    root = (simple / "index.html").read_text()
    for name in ("torch", "triton", "nvidia-cublas", "nvidia-cuda-runtime", "flashinfer-python", "flashinfer-cubin",
                 "flashinfer-jit-cache", "sgl-kernel"):
        assert f'<a href="{name}/">{name}</a>' in root
    page = (simple / "torch" / "index.html").read_text()
    links = re.findall(r'<a href="\.\./\.\./files/([^"#]+)#sha256=([0-9a-f]{64})" data-dist-info-metadata="sha256='
                       r'([0-9a-f]{64})" data-core-metadata="sha256=\3">([^<]+)</a>', page)
    assert [text for *_, text in links] == ["torch-2.12.0.dev20260307+cu130-py3-none-any.whl",
                                             "torch-2.9.1+cu130-py3-none-any.whl"]
    for href, digest, meta_digest, text in links:
        assert href == text.replace("+", "%2B")
        assert hashlib.sha256((tmp_path / "index" / "files" / text).read_bytes()).hexdigest() == digest
        # PEP 658: the wheel's METADATA beside it, so resolvers on the hosts never download the wheel itself
        meta = (tmp_path / "index" / "files" / (text + ".metadata")).read_bytes()
        assert hashlib.sha256(meta).hexdigest() == meta_digest
        assert meta.startswith(b"Metadata-Version:") and b"\nName: torch\n" in meta
    extra = build_wheel(tmp_path / "extra", "setuptools", "80.0.0", {"setuptools/__init__.py": ""})
    build_index([extra], tmp_path / "index")
    assert '<a href="torch/">torch</a>' in (simple / "index.html").read_text()
    assert (simple / "setuptools" / "index.html").exists()


def test_pip_installs_target_torch_from_the_served_index(wheelhouse, tmp_path):
    root = tmp_path / "index"
    build_index(sorted(wheelhouse.glob("*.whl")), root)
    port = free_port()
    server = subprocess.Popen(serve_index_command(root, "127.0.0.1", port), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}/simple"
        wait_http(url + "/")
        python = new_venv(tmp_path / "venv")
        source = ["--index-url", url, "--trusted-host", "127.0.0.1"]
        proc = pip(python, "install", *source, "torch==2.12.0.dev20260307+cu130")
        assert proc.returncode == 0, proc.stderr
        assert set(pip(python, "freeze").stdout.split()) == {
            "torch==2.12.0.dev20260307+cu130", "triton==3.6.0", "nvidia-cublas==13.2.0.1",
            "nvidia-cuda-runtime==13.0.96"}
        missing = pip(python, "install", *source, "torch==9.9.9")
        assert missing.returncode != 0
        assert "No matching distribution found for torch==9.9.9" in missing.stderr
    finally:
        server.terminate()
        server.wait(timeout=10)
