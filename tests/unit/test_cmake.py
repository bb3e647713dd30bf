"""Reading sgl-kernel's CMakeLists: commands, FetchContent declarations, and the architectures each library gets.

The text below is the shape of upstream's sgl-kernel/CMakeLists.txt (sgl-project/sglang, 2026): the lines that decide
the gencode list and the libraries, copied with their conditions; the sources lists are cut."""

from __future__ import annotations

import pytest

from gpufleet.kernel import cmake
from gpufleet.kernel import sources

UPSTREAM_SHAPE = r'''cmake_minimum_required(VERSION 3.26 FATAL_ERROR)
project(sgl-kernel LANGUAGES CXX CUDA)
include(FetchContent)

# CMake
cmake_policy(SET CMP0169 OLD)
cmake_policy(SET CMP0177 NEW)

# cutlass
FetchContent_Declare(
    repo-cutlass
    GIT_REPOSITORY https://github.com/NVIDIA/cutlass
    GIT_TAG        57e3cfb47a2d9e0d46eb6335c3dc411498efa198
    GIT_SHALLOW    OFF
)
FetchContent_Populate(repo-cutlass)

# Triton kernel
FetchContent_Declare(
    repo-triton
    GIT_REPOSITORY "https://github.com/triton-lang/triton"
    GIT_TAG        8f9f695ea8fde23a0c7c88e4ab256634ca27789f
    GIT_SHALLOW    OFF
)
FetchContent_Populate(repo-triton)

# Enable gencode below SM90
option(ENABLE_BELOW_SM90 "Enable below SM90" ON)

if (CMAKE_SYSTEM_PROCESSOR MATCHES "aarch64")
    set(ENABLE_BELOW_SM90 OFF)
endif()

set(SGL_KERNEL_CUDA_FLAGS
    "-DNDEBUG"
    "-gencode=arch=compute_90,code=sm_90"
    "-std=c++17"
    # "--threads=32"
)

set(SGL_KERNEL_COMPILE_THREADS 32 CACHE STRING "Set compilation threads, default 32")

option(SGL_KERNEL_ENABLE_FP4              "Enable FP4"              OFF)
option(SGL_KERNEL_ENABLE_FA3              "Enable FA3"              OFF)
option(SGL_KERNEL_ENABLE_SM100A           "Enable SM100A"           OFF)

if (ENABLE_BELOW_SM90)
    list(APPEND SGL_KERNEL_CUDA_FLAGS
        "-gencode=arch=compute_80,code=sm_80"
        "-gencode=arch=compute_89,code=sm_89"
    )
endif()

if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.8" OR SGL_KERNEL_ENABLE_SM100A)
    list(APPEND SGL_KERNEL_CUDA_FLAGS
        "-gencode=arch=compute_100a,code=sm_100a"
        "-gencode=arch=compute_120a,code=sm_120a"
    )
    if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "13.0")
        list(APPEND SGL_KERNEL_CUDA_FLAGS
            "-gencode=arch=compute_103a,code=sm_103a"
            "--compress-mode=size"
        )
    endif()
endif()

if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4")
    set(SGL_KERNEL_ENABLE_FA3 ON)
    list(APPEND SGL_KERNEL_CUDA_FLAGS
        "-gencode=arch=compute_90a,code=sm_90a"
    )
endif()

Python_add_library(common_ops_sm90_build MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${SOURCES})
target_compile_options(common_ops_sm90_build PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${SGL_KERNEL_CUDA_FLAGS} -use_fast_math>
)
Python_add_library(common_ops_sm100_build MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${SOURCES})
target_compile_options(common_ops_sm100_build PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:${SGL_KERNEL_CUDA_FLAGS}>
)
if (SGL_KERNEL_ENABLE_FA3)
    set(SGL_FLASH_KERNEL_CUDA_FLAGS
        "-gencode=arch=compute_90a,code=sm_90a"
    )
    if (ENABLE_BELOW_SM90)
        list(APPEND SGL_FLASH_KERNEL_CUDA_FLAGS
            "-gencode=arch=compute_80,code=sm_80"
        )
    endif()
    Python_add_library(flash_ops MODULE USE_SABI ${SKBUILD_SABI_VERSION} WITH_SOABI ${FLASH_SOURCES})
    target_compile_options(flash_ops PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${SGL_FLASH_KERNEL_CUDA_FLAGS}>)
endif()
'''
# What the site's patch makes of the FA3 block: forcing only while SGL_KERNEL_FORCE_FA3 (default ON) says so.
PATCHED = UPSTREAM_SHAPE.replace('if ("${CUDA_VERSION}" VERSION_GREATER_EQUAL "12.4")\n    set(SGL_KERNEL_ENABLE_FA3',
                                 'option(SGL_KERNEL_FORCE_FA3 "x" ON)\nif ("${CUDA_VERSION}" VERSION_GREATER_EQUAL '
                                 '"12.4" AND SGL_KERNEL_FORCE_FA3)\n    set(SGL_KERNEL_ENABLE_FA3')


def test_upstream_defaults_on_cuda_13_build_every_arch_and_fa3():
    ev = cmake.evaluate(UPSTREAM_SHAPE, {}, cuda_version="13.0")
    every = ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"]
    assert ev.targets["common_ops_sm90_build"] == every and ev.targets["common_ops_sm100_build"] == every
    assert ev.targets["flash_ops"] == ["sm_80", "sm_90a"]
    assert ev.forced == {"SGL_KERNEL_ENABLE_FA3": "ON"} and "CUDA_VERSION" in ev.variables_read
    assert ev.options["ENABLE_BELOW_SM90"] == "ON"


def test_below_sm90_off_narrows_but_fa3_stays_forced_without_the_patch():
    ev = cmake.evaluate(UPSTREAM_SHAPE, {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_ENABLE_FA3": "OFF"}, cuda_version="13.0")
    assert ev.targets["common_ops_sm100_build"] == ["sm_90", "sm_90a", "sm_100a", "sm_103a", "sm_120a"]
    assert ev.targets["flash_ops"] == ["sm_90a"]


def test_the_site_patch_lets_fa3_and_sm90a_go():
    ev = cmake.evaluate(PATCHED, {"ENABLE_BELOW_SM90": "OFF", "SGL_KERNEL_FORCE_FA3": "OFF"}, cuda_version="13.0")
    assert ev.targets["common_ops_sm100_build"] == ["sm_90", "sm_100a", "sm_103a", "sm_120a"]
    assert "flash_ops" not in ev.targets


def test_cuda_12_6_has_no_blackwell_archs_and_aarch64_drops_below_sm90():
    assert cmake.evaluate(UPSTREAM_SHAPE, {}, cuda_version="12.6").archs() == ["sm_80", "sm_89", "sm_90", "sm_90a"]
    ev = cmake.evaluate(UPSTREAM_SHAPE, {}, cuda_version="12.8", processor="aarch64")
    assert ev.targets["common_ops_sm90_build"] == ["sm_90", "sm_90a", "sm_100a", "sm_120a"]


def test_commands_keep_quoted_arguments_and_skip_comments():
    cmds = cmake.commands('set(X "a b" c) # set(Y 1)\nif (NOT X MATCHES "^[0-9]+$")\nendif()\n')
    assert [(c.name, c.args) for c in cmds] == [("set", ("X", "a b", "c")), ("if", ("NOT", "X", "MATCHES", "^[0-9]+$")),
                                               ("endif", ())]
    with pytest.raises(cmake.CMakeError):
        cmake.commands("set(X (")


def test_fetchcontent_declarations_as_written():
    deps = sources.parse_declarations(UPSTREAM_SHAPE)
    assert [(d.name, d.repository, d.tag, d.submodules) for d in deps] == [
        ("repo-cutlass", "https://github.com/NVIDIA/cutlass", "57e3cfb47a2d9e0d46eb6335c3dc411498efa198", True),
        ("repo-triton", "https://github.com/triton-lang/triton", "8f9f695ea8fde23a0c7c88e4ab256634ca27789f", True)]
    cutlass = deps[0]
    assert cutlass.cmake_var == "FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS"
    assert cutlass.source_dir == "/var/cache/gpufleet/sources/repo-cutlass-57e3cfb47a2d"
    assert cutlass.fetch_url({"https://github.com/": "git://127.0.0.1:9419/"}) == (
        "git://127.0.0.1:9419/NVIDIA/cutlass".join(["git+", "@57e3cfb47a2d9e0d46eb6335c3dc411498efa198"]))
    assert sources.cmake_defines(deps)["FETCHCONTENT_FULLY_DISCONNECTED"] == "ON"
    assert sources.cmake_defines([]) == {}


@pytest.mark.parametrize("text, message", [
    ("FetchContent_Declare(x URL https://example.invalid/x.tar.gz)", "URL download"),
    ("FetchContent_Declare(x GIT_REPOSITORY ${REPO} GIT_TAG main)", "variable"),
    ("FetchContent_Declare(x GIT_REPOSITORY https://github.com/a/b)", "missing tag"),
    ("FetchContent_Declare()", "without a name"),
])
def test_declarations_gpufleet_cannot_hand_over_are_named(text, message):
    with pytest.raises(sources.SourceError, match=message):
        sources.parse_declarations(text, "CMakeLists.txt")


def test_no_submodules_when_declared_empty():
    [dep] = sources.parse_declarations('FetchContent_Declare(x GIT_REPOSITORY https://h/a GIT_TAG v1 GIT_SUBMODULES "")')
    assert dep.submodules is False and dep.fetch_url().endswith("#no-submodules")
    assert sources.split_git_url(dep.fetch_url()) == ("https://h/a", "v1")


def test_fetch_archive_is_the_same_bytes_each_time(tmp_path):
    import subprocess

    repo = tmp_path / "dep"
    env = {"GIT_AUTHOR_DATE": "@1700000000 +0000", "GIT_COMMITTER_DATE": "@1700000000 +0000", "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    subprocess.run(["git", "init", "-q", "-b", "main", str(repo)], check=True, env=env)
    (repo / "include").mkdir()
    (repo / "include" / "dep.h").write_text("#define DEP 1\n")
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True, env=env)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "x"],
                   check=True, env=env)
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    url = f"git+file://{repo}@{sha}"
    first = sources.fetch_archive(url, tmp_path / "cache")
    data = first.read_bytes()
    first.unlink()
    again = sources.fetch_archive(url, tmp_path / "cache")
    assert again.read_bytes() == data
    listing = subprocess.run(["tar", "-tf", str(again)], capture_output=True, text=True).stdout.split()
    assert "./include/dep.h" in listing and not any(".git/" in n for n in listing)
    with pytest.raises(sources.SourceError, match="cannot fetch"):
        sources.fetch_archive(f"git+file://{tmp_path}/nope@{sha}", tmp_path / "cache")
