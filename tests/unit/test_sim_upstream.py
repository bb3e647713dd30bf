"""The simulated upstream sglang repo, the hosts' edited checkout, the stand-in server and the sgl-kernel CMake tree."""

from __future__ import annotations

import ctypes
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

from gpufleet.sim.upstream import (SIZES_FILE, SYMM_MEM_FILE, add_upstream_commit, build_upstream,
                                   clone_with_local_edits, install_fake_cuda)
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


def tables(tree: Path) -> tuple[dict, dict]:
    """The two tables the SM120 edits touch, read by running the tree's own modules."""
    code = ("import json; from sglang.srt.distributed.device_communicators import all_reduce_utils as a, "
            "torch_symm_mem as t; print(json.dumps([a.TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, "
            "t.TorchSymmMemCommunicator._WORLD_SIZES_MULTIMEM]))")
    proc = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(tree / "python")},
                          capture_output=True, text=True, check=True)
    sizes, multimem = json.loads(proc.stdout)
    return ({int(k): {int(w): b for w, b in v.items()} for k, v in sizes.items()},
            {int(k): v for k, v in multimem.items()})


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
    assert "cmake_minimum_required(VERSION 3.18)" in cmake and "project(sgl-kernel LANGUAGES CXX)" in cmake
    assert re.search(r"^cmake_policy\(SET CMP0177 NEW\)$", cmake, re.M)
    assert 'option(SGL_KERNEL_ENABLE_FP4 "Enable FP4 (NVFP4) kernels" OFF)' in cmake


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


@pytest.fixture
def torch_site(tmp_path) -> Path:
    site = tmp_path / "torch-site"
    with zipfile.ZipFile(torch_wheel(tmp_path / "wheels", TARGET)) as archive:
        archive.extractall(site)
    return site


def cmake(source: Path, build: Path, torch_site: Path, *defines: str, cuda: Path | None = None):
    env = {**os.environ, "PYTHONPATH": str(torch_site)}
    env.pop("CUDA_HOME", None)
    if cuda:
        env["CUDA_HOME"] = str(cuda)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    argv = ["cmake", "-S", str(source), "-B", str(build), *generator, f"-DPython_EXECUTABLE={sys.executable}", *defines]
    configure = subprocess.run(argv, env=env, capture_output=True, text=True)
    if configure.returncode != 0:
        return configure
    return subprocess.run(["cmake", "--build", str(build)], env=env, capture_output=True, text=True)


def build_info(build: Path) -> dict:
    lib = ctypes.CDLL(str(build / "common_ops.abi3.so"))
    lib.sgl_kernel_build_info.restype = ctypes.c_char_p
    return dict(line.split("=", 1) for line in lib.sgl_kernel_build_info().decode().splitlines())


def cmake_version() -> tuple[int, ...]:
    out = subprocess.run(["cmake", "--version"], capture_output=True, text=True).stdout
    return tuple(int(part) for part in re.search(r"version (\d+)\.(\d+)", out).groups())


@pytest.mark.skipif(not (shutil.which("cmake") and shutil.which("c++")), reason="needs cmake and a C++ compiler")
def test_sgl_kernel_tree_needs_the_site_patches(checkout, torch_site, tmp_path):
    source = tmp_path / "sgl-kernel"
    shutil.copytree(checkout / "sgl-kernel", source)
    cuda = install_fake_cuda(tmp_path / "cuda")
    # One build directory throughout, so the compiler is probed once.
    build = tmp_path / "build"
    if cmake_version() < (3, 31):
        unpatched = cmake(source, build, torch_site)
        assert 'Policy "CMP0177" is not known to this version of CMake' in unpatched.stderr
    lists = source / "CMakeLists.txt"
    lists.write_text(lists.read_text().replace("cmake_policy(SET CMP0177 NEW)",
                                               "if(POLICY CMP0177)\n  cmake_policy(SET CMP0177 NEW)\nendif()"))
    no_cccl = cmake(source, build, torch_site, "-DSGL_KERNEL_ENABLE_FP4=ON", cuda=cuda)
    assert "fatal error: cuda/atomic: No such file or directory" in no_cccl.stdout + no_cccl.stderr
    cccl = "  ${CUDA_TOOLKIT_ROOT_DIR}/include\n  ${CUDA_TOOLKIT_ROOT_DIR}/include/cccl\n"
    lists.write_text(lists.read_text().replace("  ${CUDA_TOOLKIT_ROOT_DIR}/include\n", cccl))
    built = cmake(source, build, torch_site, "-DSGL_KERNEL_ENABLE_FP4=ON", cuda=cuda)
    assert built.returncode == 0, built.stdout + built.stderr
    info = build_info(build)
    assert info["fp4"] == "1" and "sm_120a" in info["archs"].split(",")
    assert (info["version"], info["torch"], info["cuda"]) == ("0.3.21", TARGET["torch"], "13.0")
