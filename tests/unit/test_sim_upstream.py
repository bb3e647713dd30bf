"""The simulated upstream sglang repo, the hosts' edited checkout, the stand-in server and the sgl-kernel CMake tree."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

import pytest

from gpufleet.sim.upstream import (CUTLASS_REPO, NEW_KERNEL_DIR, SIZES_FILE, SYMM_MEM_FILE, TREE,
                                   add_multimem_entry, add_new_layout_commit, add_sizes_entry, add_upstream_commit,
                                   build_github, build_upstream, clone_with_local_edits)
from gpufleet.sim.wheels import OLD, TARGET, stack_wheels, torch_wheel

MIB = 1024 * 1024
SIZES = {2: 64 * MIB, 4: 64 * MIB, 6: 128 * MIB, 8: 128 * MIB}


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.rstrip("\n")


@pytest.fixture(scope="module")
def upstream(tmp_path_factory) -> tuple[Path, str]:
    bare = tmp_path_factory.mktemp("upstream") / "sglang.git"
    return bare, build_upstream(bare)


@pytest.fixture(scope="module")
def checkout(upstream, tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("host") / "sglang-main"
    clone_with_local_edits(upstream[0], dest)
    return dest


def _assigned(path: Path, name: str):
    """The value of the first `name = <literal>` in a file (module or class level), MiB resolved."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return eval(compile(ast.Expression(node.value), str(path), "eval"), {"MiB": MIB})
    raise AssertionError(f"no {name} in {path}")


def tables(tree: Path) -> tuple[dict, dict]:
    """The two tables the SM120 edits touch, as the tree's files define them."""
    device = tree / "python/sglang/srt/distributed/device_communicators"
    return (_assigned(device / "all_reduce_utils.py", "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"),
            _assigned(device / "torch_symm_mem.py", "_WORLD_SIZES_MULTIMEM"))


def test_upstream_is_deterministic_and_shaped_like_sglang(upstream, tmp_path):
    bare, sha = upstream
    assert build_upstream(tmp_path / "again.git") == sha
    assert git(bare, "rev-parse", "main") == sha and git(bare, "symbolic-ref", "HEAD") == "refs/heads/main"
    assert (bare / "git-daemon-export-ok").exists()
    files = set(git(bare, "ls-tree", "-r", "--name-only", "main").splitlines())
    assert {"python/pyproject.toml", "python/sglang/__init__.py", "python/sglang/launch_server.py", SIZES_FILE,
            SYMM_MEM_FILE, "sgl-kernel/CMakeLists.txt", "sgl-kernel/pyproject.toml",
            "sgl-kernel/python/sgl_kernel/__init__.py"} <= files
    project = tomllib.loads(git(bare, "show", "main:python/pyproject.toml"))
    assert project["project"]["name"] == "sglang"
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    assert tomllib.loads(git(bare, "show", "main:sgl-kernel/pyproject.toml"))["project"]["version"] == "0.3.21"
    cmake = git(bare, "show", "main:sgl-kernel/CMakeLists.txt")
    assert cmake.startswith("cmake_minimum_required(VERSION 3.26 FATAL_ERROR)\nproject(sgl-kernel LANGUAGES CXX CUDA)")
    assert re.search(r"^cmake_policy\(SET CMP0177 NEW\)$", cmake, re.M)
    assert 'option(SGL_KERNEL_ENABLE_FP4              "Enable FP4"              OFF)' in cmake


def test_clone_with_local_edits_leaves_exactly_the_two_sm120_edits(upstream, checkout):
    assert git(checkout, "status", "--porcelain").splitlines() == [f" M {SIZES_FILE}", f" M {SYMM_MEM_FILE}"]
    assert git(checkout, "rev-parse", "--abbrev-ref", "main@{upstream}") == "origin/main"
    assert tables(checkout) == ({9: SIZES, 10: SIZES, 12: SIZES}, {9: [4, 6, 8], 10: [6, 8], 12: [6, 8]})
    git(checkout, "stash")
    assert tables(checkout) == ({9: SIZES, 10: SIZES}, {9: [4, 6, 8], 10: [6, 8]})
    git(checkout, "stash", "pop")
    assert len(git(checkout, "status", "--porcelain").splitlines()) == 2


def test_add_upstream_commit_moves_main(upstream, tmp_path):
    bare = tmp_path / "moving.git"
    first = build_upstream(bare)
    dest = tmp_path / "host"
    clone_with_local_edits(bare, dest)
    sizes_text = (dest / SIZES_FILE).read_text()
    second = add_upstream_commit(bare, {SIZES_FILE: sizes_text, "python/sglang/version.py": None}, "Absorb SM120")
    assert second != first and git(bare, "rev-parse", "main") == second
    assert git(bare, "rev-list", "--count", "main") == "2"
    assert git(bare, "log", "-1", "--format=%s", "main") == "Absorb SM120"
    assert "python/sglang/version.py" not in git(bare, "ls-tree", "-r", "--name-only", "main")
    assert "12: {" in git(bare, "show", f"main:{SIZES_FILE}")


@pytest.fixture(scope="module")
def old_site(tmp_path_factory) -> Path:
    """The old stack's stand-ins unpacked into one importable directory (what the host venv holds)."""
    wheels, site = tmp_path_factory.mktemp("wheels"), tmp_path_factory.mktemp("site")
    for path in stack_wheels(wheels, OLD):
        with zipfile.ZipFile(path) as archive:
            archive.extractall(site)
    return site


@pytest.fixture
def model(tmp_path) -> Path:
    path = tmp_path / "models" / "Qwen3.5-397B-A17B-NVFP4"
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(tree: Path, site: Path, gpus: Path, *args: str, **env: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    environ = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{tree / 'python'}", "GPUFLEET_SIM_GPUS": str(gpus),
               **env}
    argv = [sys.executable, "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", str(port), *args]
    proc = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def get(url: str, body: dict | None = None) -> tuple[int, dict | None]:
    data = None if body is None else json.dumps(body).encode()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=2) as resp:
            raw = resp.read()
            return resp.status, json.loads(raw) if raw else None
    except urllib.error.HTTPError as err:
        return err.code, None


def statuses_until_ready(url: str, proc: subprocess.Popen, timeout: float = 10.0) -> list[int]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            seen.append(get(url + "/health")[0])
        except OSError:
            pass
        if seen and seen[-1] in (200, 500):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"server never answered /health: {seen}, exit {proc.poll()}")


@pytest.fixture
def gpus(tmp_path) -> Path:
    path = tmp_path / "gpus.json"
    path.write_text(json.dumps({"count": 8, "compute_cap": "12.0", "fail": None}))
    return path


def test_server_warms_up_then_answers_like_sglang(checkout, old_site, model, gpus):
    proc, url = start_server(checkout, old_site, gpus, "--model-path", str(model), "--tp", "8",
                             "--quantization", "modelopt_fp4", "--enable-torch-symm-mem", SGLANG_SIM_WARMUP="1")
    try:
        seen = statuses_until_ready(url, proc)
        assert seen[0] == 503 and seen[-1] == 200
        assert get(url + "/v1/models")[1]["data"][0]["id"] == "Qwen3.5-397B-A17B-NVFP4"
        question = {"model": "Qwen3.5-397B-A17B-NVFP4", "messages": [
            {"role": "user", "content": "What is the capital of France? Answer in one word."}]}
        status, reply = get(url + "/v1/chat/completions", question)
        assert status == 200 and reply["object"] == "chat.completion"
        assert "Paris" in reply["choices"][0]["message"]["content"]
        assert "Paris" in get(url + "/generate", {"text": "What is the capital of France?"})[1]["text"]
        info = get(url + "/server_info")[1]
        assert info["versions"]["sgl_kernel"] == "0.3.16" and info["torch_symm_mem"]["kernel"] == "multimem"
    finally:
        proc.kill()
        log = proc.communicate(timeout=10)[0]
    assert "torch version: 2.9.1+cu130" in log and "flashinfer version: 0.6.4" in log


def test_broken_box_fails_health_forever(checkout, old_site, model, gpus):
    proc, url = start_server(checkout, old_site, gpus, "--model-path", str(model), "--served-model-name", "qwen",
                             SGLANG_SIM_WARMUP="0", SGLANG_SIM_FAIL_HEALTH="1")
    try:
        assert statuses_until_ready(url, proc)[-1] == 500
        assert get(url + "/v1/models")[1]["data"][0]["id"] == "qwen"
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def test_server_refuses_to_start_without_what_it_needs(upstream, checkout, old_site, model, gpus, tmp_path):
    no_config = tmp_path / "empty-model"
    no_config.mkdir()
    proc, _ = start_server(checkout, old_site, gpus, "--model-path", str(no_config))
    assert proc.wait(timeout=10) != 0 and "config.json" in proc.communicate()[0]
    proc, _ = start_server(checkout, old_site, gpus, "--model-path", str(model), "--tp", "9")
    assert proc.wait(timeout=10) != 0 and "only 8 are visible" in proc.communicate()[0]
    pristine = tmp_path / "pristine"
    git(tmp_path, "clone", "-q", str(upstream[0]), str(pristine))
    proc, _ = start_server(pristine, old_site, gpus, "--model-path", str(model), "--tp", "8", "--enable-torch-symm-mem")
    assert proc.wait(timeout=10) != 0 and "KeyError: 12" in proc.communicate()[0]


# ---- the payload mirrors real upstream sgl-project/sglang ---------------------------------------------------------
# Lines copied from upstream's files (the commit each was read at is named); the payload must contain them verbatim.
REAL_ALL_REDUCE_UTILS_25B38CC2 = """MiB = 1024 * 1024

TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
    9: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
    10: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
}
"""
REAL_SYMM_MEM_IMPORT_5A7255C6 = """from sglang.srt.distributed.device_communicators.all_reduce_utils import (
    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES,
)
"""
REAL_SYMM_MEM_CLASS_5A7255C6 = "\nclass TorchSymmMemCommunicator:\n"
REAL_SYMM_MEM_CLASS_0CD72BA4 = "\nclass TorchSymmMemCommunicator(BaseCommunicator):\n"
REAL_MULTIMEM = """    # Mapping: compute capability major -> supported world sizes for multimem
    # If the current (cc_major, world_size) is not listed, we fall back
    # to the two-shot path.
    _WORLD_SIZES_MULTIMEM = {
        9: [4, 6, 8],
        10: [6, 8],
    }

    def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):
"""
REAL_SIZE_LOOKUP = """        if (
            self.world_size
            not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]
        ):
"""
# sgl-kernel/CMakeLists.txt at 00390b8633f913f53d98d3acdbc1ab8f0d62da1b
REAL_CMAKE_00390B86 = [
    "cmake_minimum_required(VERSION 3.26 FATAL_ERROR)\nproject(sgl-kernel LANGUAGES CXX CUDA)\n",
    "include(FetchContent)\n\n# CMake\ncmake_policy(SET CMP0169 OLD)\ncmake_policy(SET CMP0177 NEW)\n",
    "find_package(Python COMPONENTS Interpreter Development.Module ${SKBUILD_SABI_COMPONENT} REQUIRED)\n",
    "enable_language(CUDA)\nfind_package(CUDAToolkit REQUIRED)\n",
    'message(STATUS "Detected CUDA_VERSION=${CUDA_VERSION}")\n',
    "# Torch\nfind_package(Torch REQUIRED)\nclear_cuda_arches(CMAKE_FLAG)\n",
    '# Enable gencode below SM90\noption(ENABLE_BELOW_SM90 "Enable below SM90" ON)\n',
    '    "-fPIC"\n    "-gencode=arch=compute_90,code=sm_90"\n    "-std=c++17"\n',
    'set(SGL_KERNEL_COMPILE_THREADS 32 CACHE STRING "Set compilation threads, default 32")\n',
    'list(APPEND SGL_KERNEL_CUDA_FLAGS\n    "--threads=${SGL_KERNEL_COMPILE_THREADS}"\n)\n',
    'option(SGL_KERNEL_ENABLE_BF16             "Enable BF16"             ON)\n'
    'option(SGL_KERNEL_ENABLE_FP8              "Enable FP8"              ON)\n'
    'option(SGL_KERNEL_ENABLE_FP4              "Enable FP4"              OFF)\n'
    'option(SGL_KERNEL_ENABLE_FA3              "Enable FA3"              OFF)\n'
    'option(SGL_KERNEL_ENABLE_SM90A            "Enable SM90A"            OFF)\n'
    'option(SGL_KERNEL_ENABLE_SM100A           "Enable SM100A"           OFF)\n',
    'if (ENABLE_BELOW_SM90)\n    list(APPEND SGL_KERNEL_CUDA_FLAGS\n        "-gencode=arch=compute_80,code=sm_80"\n'
    '        "-gencode=arch=compute_89,code=sm_89"\n    )\n',
    'if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.8" OR SGL_KERNEL_ENABLE_SM100A)\n'
    '    list(APPEND SGL_KERNEL_CUDA_FLAGS\n        "-gencode=arch=compute_100a,code=sm_100a"\n'
    '        "-gencode=arch=compute_120a,code=sm_120a"\n    )\n',
    '    if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "13.0")\n        list(APPEND SGL_KERNEL_CUDA_FLAGS\n'
    '            "-gencode=arch=compute_103a,code=sm_103a"\n            "--compress-mode=size"\n        )\n',
    'endif()\n\nif ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4")\n    set(SGL_KERNEL_ENABLE_FA3 ON)\n'
    '    list(APPEND SGL_KERNEL_CUDA_FLAGS\n        "-gencode=arch=compute_90a,code=sm_90a"\n    )\nendif()\n',
    'if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.8" OR SGL_KERNEL_ENABLE_FP4)\n'
    '    list(APPEND SGL_KERNEL_CUDA_FLAGS\n        "-DENABLE_NVFP4=1"\n    )\nendif()\n',
    "Python_add_library(common_ops_sm90_build MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${SOURCES})\n",
    "    $<$<COMPILE_LANGUAGE:CUDA>:${SGL_KERNEL_CUDA_FLAGS} -use_fast_math>\n",
    'set_target_properties(common_ops_sm90_build PROPERTIES\n    OUTPUT_NAME "common_ops"\n'
    '    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/sm90"\n)\n',
    "Python_add_library(common_ops_sm100_build MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${SOURCES})\n",
    'set_target_properties(common_ops_sm100_build PROPERTIES\n    OUTPUT_NAME "common_ops"\n'
    '    LIBRARY_OUTPUT_DIRECTORY "${CMAKE_CURRENT_BINARY_DIR}/sm100"\n)\n',
    "install(TARGETS common_ops_sm90_build LIBRARY DESTINATION sgl_kernel/sm90)\n"
    "install(TARGETS common_ops_sm100_build LIBRARY DESTINATION sgl_kernel/sm100)\n",
    "if (SGL_KERNEL_ENABLE_FA3)\n    set(SGL_FLASH_KERNEL_CUDA_FLAGS\n",
    "    Python_add_library(flash_ops MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${FLASH_SOURCES})\n",
    '    install(TARGETS flash_ops LIBRARY DESTINATION "sgl_kernel")\n',
]
REAL_CUTLASS_DECLARE = """FetchContent_Declare(
    repo-cutlass
    GIT_REPOSITORY https://github.com/NVIDIA/cutlass
    GIT_TAG        {sha}
    GIT_SHALLOW    OFF
)
FetchContent_Populate(repo-cutlass)
"""
REAL_CRITICAL = "[sgl_kernel] CRITICAL: Could not load any common_ops library!"
NVCC = Path("/usr/local/cuda/bin/nvcc")


def test_payload_symm_mem_files_carry_upstreams_lines():
    assert (TREE / SIZES_FILE).read_text() == REAL_ALL_REDUCE_UTILS_25B38CC2
    symm = (TREE / SYMM_MEM_FILE).read_text()
    for line in (REAL_SYMM_MEM_IMPORT_5A7255C6, REAL_SYMM_MEM_CLASS_5A7255C6, REAL_MULTIMEM, REAL_SIZE_LOOKUP):
        assert line in symm
    # the hosts' edits apply to upstream's own lines
    assert "        10: [6, 8],\n        12: [6, 8],\n    }\n" in add_multimem_entry(symm)
    assert add_sizes_entry(REAL_ALL_REDUCE_UTILS_25B38CC2).endswith("    12: {\n" + "\n".join(
        REAL_ALL_REDUCE_UTILS_25B38CC2.splitlines()[4:8]) + "\n    },\n}\n")


def test_payload_cmakelists_carries_upstreams_lines_and_the_sim_github_cutlass(tmp_path):
    cmake = (TREE / "sgl-kernel/CMakeLists.txt").read_text()
    for line in REAL_CMAKE_00390B86:
        assert line in cmake, line
    sha = build_github(tmp_path / "github")[CUTLASS_REPO]
    assert build_github(tmp_path / "again")[CUTLASS_REPO] == sha  # fixed date and identity: a stable sha
    assert REAL_CUTLASS_DECLARE.format(sha=sha) in cmake
    assert cmake.count("FetchContent_Declare(") == 1 and "${repo-cutlass_SOURCE_DIR}/include" in cmake
    assert "#include <cutlass/cutlass.h>" in (TREE / "sgl-kernel/csrc/gemm/nvfp4_quant_kernels.cu").read_text()
    assert (tmp_path / "github/NVIDIA/cutlass.git/git-daemon-export-ok").exists()
    project = tomllib.loads((TREE / "sgl-kernel/pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "scikit_build_core.build"
    assert project["build-system"]["requires"][0].startswith("scikit-build-core")
    assert (project["project"]["name"], project["project"]["version"]) == ("sgl-kernel", "0.3.21")
    assert project["tool"]["scikit-build"]["wheel"] == {"py-api": "cp310", "license-files": [],
                                                        "packages": ["python/sgl_kernel"]}
    assert project["tool"]["scikit-build"]["minimum-version"] == "build-system.requires"


def test_communicator_behaves_like_upstreams(upstream, checkout, tmp_path):
    """Capability < 9: disabled with a warning; 12 without the SM120 row: KeyError, as upstream; with it: enabled."""
    pristine = tmp_path / "pristine"
    git(tmp_path, "clone", "-q", str(upstream[0]), str(pristine))
    code = ("import json, sys, logging; logging.basicConfig(); "
            "from sglang.srt.distributed.device_communicators.torch_symm_mem import TorchSymmMemCommunicator as C\n"
            "class G:\n    def size(self): return int(sys.argv[1])\n"
            "c = C(G(), 0); print(json.dumps([c.disabled, c.kernel, getattr(c, 'max_size', None)]))")

    def run(tree: Path, cap: str, world: int) -> subprocess.CompletedProcess:
        gpus = tmp_path / f"gpus-{cap}.json"
        gpus.write_text(json.dumps({"count": 8, "compute_cap": cap}))
        site = tmp_path / "torch-site"
        if not site.exists():
            with zipfile.ZipFile(torch_wheel(tmp_path / "wheels", OLD)) as archive:
                archive.extractall(site)
        env = {**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{tree / 'python'}", "GPUFLEET_SIM_GPUS": str(gpus)}
        return subprocess.run([sys.executable, "-c", code, str(world)], env=env, capture_output=True, text=True)

    old = run(pristine, "8.0", 8)
    assert json.loads(old.stdout) == [True, None, None] and "Device capability 8 not supported" in old.stderr
    assert "KeyError: 12" in run(pristine, "12.0", 8).stderr
    assert json.loads(run(pristine, "10.0", 8).stdout) == [False, "multimem", 128 * MIB]
    assert json.loads(run(pristine, "9.0", 2).stdout) == [False, "two_shot", 64 * MIB]
    assert json.loads(run(checkout, "12.0", 8).stdout) == [False, "multimem", 128 * MIB]
    assert "World size 3 not supported" in run(checkout, "12.0", 3).stderr


def test_new_layout_moves_the_kernel_and_the_table(tmp_path):
    bare = tmp_path / "upstream.git"
    first = build_upstream(bare)
    sha = add_new_layout_commit(bare)
    assert sha != first and git(bare, "rev-parse", "main") == sha
    files = set(git(bare, "ls-tree", "-r", "--name-only", "main").splitlines())
    assert not any(f.startswith("sgl-kernel/") for f in files)
    assert {f"{NEW_KERNEL_DIR}/CMakeLists.txt", f"{NEW_KERNEL_DIR}/pyproject.toml",
            f"{NEW_KERNEL_DIR}/python/sgl_kernel/__init__.py"} <= files
    project = tomllib.loads(git(bare, "show", f"main:{NEW_KERNEL_DIR}/pyproject.toml"))
    assert project["project"]["name"] == "sglang-kernel" and project["project"]["version"].startswith("0.4.")
    assert git(bare, "show", f"main:{NEW_KERNEL_DIR}/CMakeLists.txt") == git(bare, "show",
                                                                             f"{first}:sgl-kernel/CMakeLists.txt")
    assert git(bare, "show", f"main:{SIZES_FILE}") + "\n" == REAL_ALL_REDUCE_UTILS_25B38CC2  # stale, unchanged
    symm = git(bare, "show", f"main:{SYMM_MEM_FILE}") + "\n"
    assert "all_reduce_utils" not in symm and REAL_SYMM_MEM_CLASS_0CD72BA4 in symm and REAL_MULTIMEM in symm
    assert symm.endswith(REAL_ALL_REDUCE_UTILS_25B38CC2)
    # the hosts' checkout of the new layout: the two edits still apply; only the multimem one has an effect
    dest = tmp_path / "host"
    clone_with_local_edits(bare, dest)
    assert git(dest, "status", "--porcelain").splitlines() == [f" M {SIZES_FILE}", f" M {SYMM_MEM_FILE}"]
    sizes, multimem = tables(dest)
    assert 12 in sizes and multimem[12] == [6, 8]  # all_reduce_utils' stale copy has the row; nothing reads it
    assert sorted(_assigned(dest / SYMM_MEM_FILE, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")) == [9, 10]


def test_kernel_wheel_loads_sm100_and_fails_on_another_torch(tmp_path):
    """The package's loader without a build: no library is the upstream CRITICAL error."""
    pkg = tmp_path / "site" / "sgl_kernel"
    shutil.copytree(TREE / "sgl-kernel/python/sgl_kernel", pkg)
    with zipfile.ZipFile(torch_wheel(tmp_path / "wheels", OLD)) as archive:
        archive.extractall(tmp_path / "site")
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"count": 8, "compute_cap": "12.0"}))
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "GPUFLEET_SIM_GPUS": str(gpus)}
    proc = subprocess.run([sys.executable, "-c", "import sgl_kernel"], env=env, capture_output=True, text=True)
    assert proc.returncode != 0 and REAL_CRITICAL in proc.stderr and "/sm100/common_ops.*" in proc.stderr


@pytest.fixture(scope="module")
def build_venv(tmp_path_factory) -> Path:
    """A venv with CMake >= 3.31 and scikit-build-core (from the configured package index)."""
    venv = tmp_path_factory.mktemp("kernel-build") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = subprocess.run([str(venv / "bin/pip"), "install", "-q", "cmake>=3.31", "scikit-build-core", "ninja"],
                         capture_output=True, text=True)
    if pip.returncode != 0:
        pytest.skip(f"cannot install cmake>=3.31 and scikit-build-core: {pip.stderr.strip()[-300:]}")
    return venv


@pytest.mark.skipif(not NVCC.exists(), reason="needs the CUDA toolkit's nvcc at /usr/local/cuda/bin/nvcc")
@pytest.mark.timeout(120)
def test_sgl_kernel_builds_with_real_nvcc_as_upstreams_does(build_venv, tmp_path):
    """pip wheel, as gpufleet builds it: FetchContent handed the sim GitHub's cutlass, gencodes as upstream's
    CMakeLists lists them for CUDA 13 (FA3 forced on: sm_90a and flash_ops), the library chosen by capability,
    the FP4 ops exported, and a torch of another release refused with upstream's error."""
    source = tmp_path / "sgl-kernel"
    shutil.copytree(TREE / "sgl-kernel", source)
    cutlass = tmp_path / "cutlass"
    build_github(tmp_path / "github")
    git(tmp_path, "clone", "-q", str(tmp_path / "github/NVIDIA/cutlass.git"), str(cutlass))
    site = tmp_path / "site"
    with zipfile.ZipFile(torch_wheel(tmp_path / "wheels", OLD)) as archive:
        archive.extractall(site)
    env = {**os.environ, "PYTHONPATH": str(site), "CUDACXX": str(NVCC),
           "PATH": f"{build_venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    def wheel(*defines: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(build_venv / "bin/python"), "-m", "pip", "wheel", ".", "--no-build-isolation",
                               "--no-deps", "-w", str(tmp_path / "dist"), "-Cbuild-dir=" + str(tmp_path / "build"),
                               "-Ccmake.define.ENABLE_BELOW_SM90=OFF", *defines, "-v"],
                              cwd=source, env=env, capture_output=True, text=True)

    missing = wheel("-Ccmake.define.FETCHCONTENT_FULLY_DISCONNECTED=ON")
    assert missing.returncode != 0  # no cutlass source: the build cannot find it
    built = wheel(f"-Ccmake.define.FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS={cutlass}",
                  "-Ccmake.define.FETCHCONTENT_FULLY_DISCONNECTED=ON")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (whl,) = (tmp_path / "dist").glob("sgl_kernel-0.3.21-cp310-abi3-*.whl")
    with zipfile.ZipFile(whl) as archive:
        names = set(archive.namelist())
        archive.extractall(site)
    assert {"sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
            "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/__init__.py"} <= names
    archs = subprocess.run([sys.executable, str(Path(__file__).parents[2] / "gpufleet/remote/kernel_archs.py"),
                            str(site / "sgl_kernel")], capture_output=True, text=True, check=True)
    found = {Path(lib["path"]).relative_to(site).as_posix(): lib["archs"]
             for lib in json.loads(archs.stdout)["libraries"]}
    every = ["sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"]
    assert found == {"sgl_kernel/flash_ops.abi3.so": ["sm_90a"], "sgl_kernel/sm90/common_ops.abi3.so": every,
                     "sgl_kernel/sm100/common_ops.abi3.so": every}

    def load(cap: str, torch_site: Path) -> subprocess.CompletedProcess:
        gpus = tmp_path / f"gpus-{cap}.json"
        gpus.write_text(json.dumps({"count": 8, "compute_cap": cap}))
        code = ("import sgl_kernel, torch; print(sgl_kernel.__version__, sgl_kernel.common_ops.__file__, "
                "callable(sgl_kernel.scaled_fp4_quant), callable(torch.ops.sgl_kernel.cutlass_fp4_group_mm), "
                "hasattr(sgl_kernel, 'build_info'))")
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": f"{site}{os.pathsep}{torch_site}",
                                   "GPUFLEET_SIM_GPUS": str(gpus)})

    assert load("12.0", site).stdout.split() == ["0.3.21", str(site / "sgl_kernel/sm100/common_ops.abi3.so"),
                                                 "True", "True", "False"]
    assert load("9.0", site).stdout.split()[1] == str(site / "sgl_kernel/sm90/common_ops.abi3.so")
    other = tmp_path / "other-torch"
    with zipfile.ZipFile(torch_wheel(tmp_path / "wheels", TARGET)) as archive:
        archive.extractall(other)
    (site / "torch").rename(tmp_path / "old-torch")  # the site's torch is now TARGET's
    mismatch = load("12.0", other)
    assert REAL_CRITICAL in mismatch.stderr and "undefined symbol: _ZN3c1013MessageLogger" in mismatch.stderr


def test_sgl_kernel_configure_needs_cmake_3_31(tmp_path):
    """CMake < 3.31 stops where upstream's CMakeLists stops: its minimum version or a policy it does not know."""
    if not shutil.which("cmake"):
        pytest.skip("no cmake on PATH")
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    if tuple(int(p) for p in re.search(r"version (\d+)\.(\d+)", out).groups()) >= (3, 31):
        pytest.skip("the cmake on PATH knows CMP0177")
    proc = subprocess.run(["cmake", "-S", str(TREE / "sgl-kernel"), "-B", str(tmp_path / "build")],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert re.search(r"CMake 3\.26 or higher is required|Policy \"CMP01(69|77)\" is not known", proc.stderr)
