"""The sgl-kernel planner: jobs from cores and RAM, and its decisions (unchanged / install a wheel / build)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("gpufleet.plan")

from gpufleet.testing.context import plan_context
from gpufleet.kernel.buildcache import LocalCache, Record  # noqa: E402
from gpufleet.facts.model import HostFacts  # noqa: E402
from gpufleet.config.inventory import GpuExpectation, Host  # noqa: E402
from gpufleet.plan import PlanError, Step, Unchanged  # noqa: E402
from gpufleet.config.stack import Stack  # noqa: E402
from gpufleet.roles import sgl_kernel  # noqa: E402

GIB = 1024 ** 3
TREE = "c0ffee" + "0" * 34
# The pyproject of upstream's sgl-kernel in early 2026 (build-system and name as real), and a CMakeLists of its shape.
PYPROJECT = """[build-system]
requires = [
  "scikit-build-core>=0.10",
  "torch>=2.8.0",
  "wheel",
]
build-backend = "scikit_build_core.build"

[project]
name = "sgl-kernel"
version = "0.3.21"
"""


@pytest.mark.parametrize("cpus, mem_gib, override, jobs", [
    (96, 512, "auto", 32),   # upstream's nproc/3
    (96, 64, "auto", 16),    # RAM: 4 GiB a job
    (8, 8, "auto", 2),
    (1, 1, "auto", 1),       # never below 1
    (None, None, "auto", 1),
    (256, 2048, "auto", 48),  # upstream's cap
    (8, 8, 6, 6),            # the stack's number wins
])
def test_build_jobs(cpus, mem_gib, override, jobs):
    mem = mem_gib * GIB if mem_gib is not None else None
    assert sgl_kernel.build_jobs(cpus, mem, override) == jobs


class _Res:
    def __init__(self, output):
        self.output, self.exit_code = output, 0


def _ctx(tmp_path, *, installed=None, on_host=None, packages=None, stack=None, directory="sgl-kernel",
         pyproject=PYPROJECT, cmakelists=None):
    from tests.unit.test_cmake import UPSTREAM_SHAPE

    seen = []

    def probe(cmd, step):
        seen.append(cmd.render())
        text = (f"@@dir {directory}\n@@tree {TREE}\n@@pyproject\n{pyproject}\n@@cmake\n"
                f"{UPSTREAM_SHAPE if cmakelists is None else cmakelists}\n"
                f"@@installed\n{installed.to_json() if installed else ''}\n@@record\n")
        if on_host and on_host.key in cmd.render():
            text += on_host.to_json()
        return _Res(text + "\n@@end\n")

    facts = HostFacts(host="gpu1", cpu_count=32, mem_total_bytes=128 * GIB, nvcc_version="13.0",
                      packages=packages or {"torch": "2.12.0.dev20260307+cu130", "sgl-kernel": "0.3.16"})
    host = Host(name="gpu1", address="10.0.0.1", gpus=GpuExpectation())
    repo = tmp_path / "repo"
    (repo / "patches/sgl-kernel").mkdir(parents=True)
    import shutil

    shutil.copytree(Path(__file__).resolve().parents[2] / "patches/sgl-kernel", repo / "patches/sgl-kernel",
                    dirs_exist_ok=True)
    stack = stack or Stack.model_validate({}, context={"base_dir": repo})
    ctx = plan_context(host=host, stack=stack, facts=facts, read=probe, repo=repo)
    return ctx, seen


def _key(ctx):
    return sgl_kernel.inputs(ctx, TREE).key()


def test_build_when_nothing_matches(tmp_path):
    ctx, _ = _ctx(tmp_path)
    [step] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert isinstance(step, Step) and step.title.startswith("build sgl-kernel")
    text = "\n".join(c.render() for c in step.commands)
    assert "git apply" in text and "--directory=\"$3\"" in text and " sgl-kernel" in step.commands[0].render()
    assert "TORCH_CUDA_ARCH_LIST=12.0a" in text and "CUDA_HOME=/usr/local/cuda" in text
    assert "CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl" in text
    assert "MAX_JOBS=10" in text and "CMAKE_BUILD_PARALLEL_LEVEL=10" in text
    assert "cmake.define.SGL_KERNEL_COMPILE_THREADS=1" in text and "cmake.define.SGL_KERNEL_ENABLE_FP4=1" in text
    # narrowed by the options upstream's CMakeLists reads; the plan says what each library will target
    assert "cmake.define.ENABLE_BELOW_SM90=OFF" in text and "cmake.define.SGL_KERNEL_FORCE_FA3=OFF" in text
    # the site patch (applied here to the CMakeLists the probe read) lets FA3 and sm_90a go
    assert "common_ops_sm90_build, common_ops_sm100_build: sm_90,sm_100a,sm_103a,sm_120a;" in step.reason
    assert "flash_ops" not in step.reason and "not read by" not in step.reason
    # FetchContent: the control node hands every declared source over; CMake is told never to download
    assert [(u.url, u.remote) for u in step.uploads] == [
        ("git+https://github.com/NVIDIA/cutlass@57e3cfb47a2d9e0d46eb6335c3dc411498efa198",
         "/var/cache/gpufleet/sources/repo-cutlass-57e3cfb47a2d.tar"),
        ("git+https://github.com/triton-lang/triton@8f9f695ea8fde23a0c7c88e4ab256634ca27789f",
         "/var/cache/gpufleet/sources/repo-triton-8f9f695ea8fd.tar")]
    assert "cmake.define.FETCHCONTENT_FULLY_DISCONNECTED=ON" in text
    assert ("cmake.define.FETCHCONTENT_SOURCE_DIR_REPO-CUTLASS=/var/cache/gpufleet/sources/repo-cutlass-57e3cfb47a2d"
            in text)
    assert "2 FetchContent source(s) handed over" in step.reason
    # without the patch the plan says what the CMakeLists will do anyway
    bare = Stack.model_validate({"sgl_kernel": {"patches": str(tmp_path / "none")}}, context={"base_dir": ctx.repo})
    [plain] = sgl_kernel.plan(_ctx(tmp_path / "bare", stack=bare)[0], LocalCache(tmp_path / "cache"))
    assert "sm_90,sm_90a,sm_100a,sm_103a,sm_120a" in plain.reason and "flash_ops: sm_90a" in plain.reason
    assert "not read by the CMakeLists: SGL_KERNEL_FORCE_FA3" in plain.reason
    # build tools: a CMake that knows CMP0177, the pyproject's requirements, torch held at the installed version
    tools = next(c for c in step.commands if "pip install" in c.render() and "cmake" in c.render()).render()
    assert "'cmake>=3.31'" in tools and "'scikit-build-core>=0.10'" in tools and "torch==2.12.0.dev20260307+cu130" in tools
    assert "torch>=2.8.0" not in tools
    assert "systemd-run" in text and f"gpufleet-build-{_key(ctx)[:12]}" in text
    assert "--no-build-isolation" in text and "--force-reinstall --no-deps" in text
    assert "reverted: $2" in step.commands[-1].render()  # the checkout is left as it was found
    record = step.commands[-2].render()
    assert "cutlass_scaled_fp4_mm" in record and "sglang.jit_kernel.nvfp4" in record and ".nv_fatbin" in record


def test_unchanged_when_installed_record_has_the_key(tmp_path):
    ctx, _ = _ctx(tmp_path, packages={"torch": "2.12.0.dev20260307+cu130", "sgl_kernel": "0.3.21"})
    rec = Record(key=_key(ctx), inputs={}, wheel="/x/sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl",
                 archs=["sm_120a"], fp4=True)
    ctx, _ = _ctx(tmp_path / "b", installed=rec, packages={"torch": "2.12.0.dev20260307+cu130",
                                                           "sgl_kernel": "0.3.21"})
    [item] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert isinstance(item, Unchanged) and "sm_120a" in item.reason


def test_new_torch_means_a_new_build(tmp_path):
    ctx, _ = _ctx(tmp_path)
    rec = Record(key=_key(ctx), inputs={}, wheel="/x/sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl")
    ctx, _ = _ctx(tmp_path / "b", installed=rec,
                  packages={"torch": "2.13.0.dev20260401+cu130", "sgl-kernel": "0.3.21"})
    [item] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert isinstance(item, Step) and item.title.startswith("build")


def test_cached_wheel_is_uploaded_and_installed(tmp_path):
    ctx, _ = _ctx(tmp_path)
    key = _key(ctx)
    cache = LocalCache(tmp_path / "cache")
    whl = tmp_path / "sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl"
    whl.write_bytes(b"wheel")
    cache.store(Record(key=key, inputs={"host": "gpu2"}, wheel=str(whl)), whl)
    [step] = sgl_kernel.plan(ctx, cache)
    assert step.title.startswith("install sgl-kernel wheel") and len(step.uploads) == 1
    up = step.uploads[0]
    assert up.url.startswith("file://") and up.remote.endswith(f"{key}/cached/{whl.name}")
    assert "copied-from gpu2" in step.commands[0].render() and "pip install" not in "".join(
        c.render() for c in step.commands if "pip wheel" in c.render())


def test_wheel_already_on_host_is_installed(tmp_path):
    ctx, _ = _ctx(tmp_path)
    rec = Record(key=_key(ctx), inputs={}, wheel="/var/lib/gpufleet/builds/k/dist/sgl_kernel-0.3.21-x.whl")
    ctx, _ = _ctx(tmp_path / "b", on_host=rec)
    [step] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert step.title.startswith("install") and not step.uploads


def test_fp4_off_and_extra_args(tmp_path):
    ctx, _ = _ctx(tmp_path)
    stack = Stack.model_validate({"sgl_kernel": {"enable_fp4": False, "max_jobs": 3,
                                                 "extra_cmake_args": ["-DENABLE_CCACHE=ON"]}},
                                 context={"base_dir": ctx.repo})
    ctx2, _ = _ctx(tmp_path / "b", stack=stack)
    assert _key(ctx2) != _key(ctx)
    [step] = sgl_kernel.plan(ctx2, LocalCache(tmp_path / "cache"))
    text = "\n".join(c.render() for c in step.commands)
    assert "cmake.define.SGL_KERNEL_ENABLE_FP4" not in text and "MAX_JOBS=3" in text and "-DENABLE_CCACHE=ON" in text


def test_missing_torch_is_a_plan_error(tmp_path):
    ctx, _ = _ctx(tmp_path, packages={"sgl-kernel": "0.3.16"})
    with pytest.raises(PlanError, match="torch"):
        sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))


def test_needed_reads_the_installed_record(tmp_path, monkeypatch):
    import subprocess

    ctx, _ = _ctx(tmp_path)
    [step] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    record = tmp_path / "installed.json"
    monkeypatch.setattr(sgl_kernel.buildcache, "installed_record", lambda venv: str(record))
    needed = sgl_kernel._needed(ctx, _key(ctx))
    run = lambda: subprocess.run(list(map(str, needed.argv)), capture_output=True).returncode  # noqa: E731
    assert step.needed is not None and run() == 0
    record.write_text(json.dumps({"key": _key(ctx)}))
    assert run() == 1
    record.write_text(json.dumps({"key": "other"}))
    assert run() == 0


def test_mid_2026_layout_builds_in_python_sglang_kernels_aot(tmp_path):
    ctx, _ = _ctx(tmp_path, directory="python/sglang/kernels/aot",
                  pyproject=PYPROJECT.replace('"sgl-kernel"', '"sglang-kernel"').replace("0.3.21", "0.4.1"))
    [step] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert step.title.startswith("build sglang-kernel")
    assert "python/sglang/kernels/aot/ tree" in step.reason
    assert step.commands[0].argv[-1] == "python/sglang/kernels/aot"  # the patches' --directory
    wheel = next(c for c in step.commands if "pip wheel" in c.render()).render()
    assert "cd /root/sglang-main/python/sglang/kernels/aot" in wheel


def test_no_kernel_directory_is_a_plan_error(tmp_path):
    ctx, _ = _ctx(tmp_path, directory="")
    with pytest.raises(PlanError, match="no sgl-kernel in /root/sglang-main at HEAD"):
        sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))


def test_a_url_fetchcontent_is_refused_before_the_build(tmp_path):
    ctx, _ = _ctx(tmp_path, cmakelists="FetchContent_Declare(x URL https://example.invalid/x.tgz)\n")
    with pytest.raises(PlanError, match="URL download"):
        sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))


def test_bad_build_requirement_names_the_pyproject(tmp_path):
    ctx, _ = _ctx(tmp_path, pyproject=PYPROJECT.replace('"wheel",', '"whe el >",'))
    with pytest.raises(PlanError, match="pyproject.toml build requirement"):
        sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
