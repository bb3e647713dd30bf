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
         pyproject=PYPROJECT, cmakelists=None, host=None):
    from tests.unit.test_cmake import UPSTREAM_SHAPE

    seen = []

    def probe(cmd, step):
        seen.append(cmd.render())
        text = f"@@dir {directory}\n@@tree {TREE}\n"
        if cmd.argv[5] == "1":  # kernel_probe.sh's $2: the texts are asked for
            text += (f"@@pyproject\n{pyproject}\n@@cmake\n"
                     f"{UPSTREAM_SHAPE if cmakelists is None else cmakelists}\n")
        text += f"@@installed\n{installed.to_json() if installed else ''}\n@@record\n"
        if on_host and on_host.key in cmd.render():
            text += on_host.to_json()
        return _Res(text + "\n@@end\n")

    facts = HostFacts(host="gpu1", cpu_count=32, mem_total_bytes=128 * GIB, nvcc_version="13.0",
                      packages=packages or {"torch": "2.12.0.dev20260307+cu130", "sgl-kernel": "0.3.16"})
    host = host or Host(name="gpu1", address="10.0.0.1", gpus=GpuExpectation())
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
    # First the build's own tree: HEAD's sgl-kernel/ exported into the job's directory, the site patches applied there
    key = _key(ctx)
    tree = f"/var/lib/gpufleet/builds/{key}/src"
    export = step.commands[0]
    assert export.argv[3:12] == ("kernel-tree", "/root/sglang-main", tree, TREE, f"/var/lib/gpufleet/builds/{key}/exit-code",
                                 f"gpufleet-build-{key[:12]}", f"/var/lib/gpufleet/builds/{key}/pid", "sgl-kernel", "--")
    assert export.argv[12] == "0001-fa3-can-be-turned-off.patch" and "SGL_KERNEL_FORCE_FA3" in export.argv[13]
    assert len(export.argv) == 14 and export.cwd == "/"
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
    # The checkout is only ever read (by the export): no command runs in it, writes to it or keeps its owner.
    assert all(c.cwd is None or not c.cwd.startswith("/root/sglang-main") for c in step.commands)
    assert not any("/root/sglang-main" in c.keep_owner for c in step.commands)
    assert not any("/root/sglang-main" in c.render() for c in step.commands[1:])
    wheel = next(c for c in step.commands if "pip wheel" in c.render()).render()
    assert f"cd {tree}/sgl-kernel && env " in wheel
    assert step.commands[-1].argv == ("rm", "-rf", "--", tree)  # the wheel is installed: its sources can go
    assert step.changes == ("venv", "cache") and step.resumable
    record = step.commands[-2].render()
    assert "cutlass_scaled_fp4_mm" in record and "sglang.jit_kernel.nvfp4" in record and ".nv_fatbin" in record


def test_unchanged_when_installed_record_has_the_key(tmp_path):
    ctx, _ = _ctx(tmp_path, packages={"torch": "2.12.0.dev20260307+cu130", "sgl_kernel": "0.3.21"})
    rec = Record(key=_key(ctx), inputs={}, wheel="/x/sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl",
                 archs=["sm_120a"], fp4=True)
    ctx, seen = _ctx(tmp_path / "b", installed=rec, packages={"torch": "2.12.0.dev20260307+cu130",
                                                              "sgl_kernel": "0.3.21"})
    [item] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert isinstance(item, Unchanged) and "sm_120a" in item.reason
    # one probe, without the pyproject and CMakeLists texts: a converged host sends neither
    assert len(seen) == 1 and "kernel-probe /root/sglang-main '' " in seen[0]


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
    assert step.commands[0].argv[10:12] == ("python/sglang/kernels/aot", "--")  # exported, the patches' --directory
    wheel = next(c for c in step.commands if "pip wheel" in c.render()).render()
    assert f"cd /var/lib/gpufleet/builds/{_key(ctx)}/src/python/sglang/kernels/aot && env " in wheel


def test_the_export_takes_what_the_cmakelists_reads_outside_the_kernel_directory(tmp_path):
    # upstream's mid-2026 python/sglang/kernels/aot/CMakeLists.txt: include_directories(... ${PROJECT_SOURCE_DIR}/../jit/include)
    line = "include_directories(\n    ${PROJECT_SOURCE_DIR}/include\n    ${PROJECT_SOURCE_DIR}/../jit/include\n)\n"
    assert sgl_kernel.outside_paths("python/sglang/kernels/aot", line) == ["python/sglang/kernels/jit/include"]
    assert sgl_kernel.outside_paths("sgl-kernel", '"${CMAKE_CURRENT_LIST_DIR}/../3rdparty/x/"') == ["3rdparty/x"]
    # the pinned era's CMakeLists reads nothing outside sgl-kernel/; a path leaving the repository is not exported
    from tests.unit.test_cmake import UPSTREAM_SHAPE

    assert sgl_kernel.outside_paths("sgl-kernel", UPSTREAM_SHAPE) == []
    assert sgl_kernel.outside_paths("sgl-kernel", "${PROJECT_SOURCE_DIR}/../../etc") == []
    ctx, _ = _ctx(tmp_path, directory="python/sglang/kernels/aot", cmakelists=UPSTREAM_SHAPE + line,
                  pyproject=PYPROJECT.replace('"sgl-kernel"', '"sglang-kernel"'))
    [step] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    assert step.commands[0].argv[10:13] == ("python/sglang/kernels/aot", "python/sglang/kernels/jit/include", "--")


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


# Shell metacharacters, quotes and a space (a newline is refused when the inventory is read): a path pasted into
# shell text unquoted would run the touch.
HOSTILE = "v $(touch \"$CANARY\") ';`touch \"$CANARY\"` \"x"


def test_venv_and_checkout_paths_reach_the_commands_as_values(tmp_path):
    """The build's commands run for real against a venv at a hostile path (a stand-in python that logs its argv):
    every path arrives whole as one argument, and nothing extra runs."""
    import shlex
    import subprocess

    venv, checkout = tmp_path / HOSTILE / "venv", tmp_path / HOSTILE / "checkout"
    (venv / "bin").mkdir(parents=True)
    log, canary = tmp_path / "argv.log", tmp_path / "canary"
    (venv / "bin/python").write_text(f"#!/bin/bash\nprintf '%s\\0' \"$0\" \"$@\" >> {shlex.quote(str(log))}\n")
    (venv / "bin/python").chmod(0o755)
    host = Host(name="gpu1", address="10.0.0.1", gpus=GpuExpectation(), venv=str(venv), sglang_checkout=str(checkout))
    ctx, seen = _ctx(tmp_path, host=host)
    [step] = sgl_kernel.plan(ctx, LocalCache(tmp_path / "cache"))
    key = _key(ctx)
    # the plan-time probe and the export get the checkout as one argument
    assert any(str(checkout) in shlex.split(cmd) for cmd in seen)
    assert step.commands[0].argv[4] == str(checkout)

    def run(cmd):
        proc = subprocess.run(["bash", "-c", cmd.render()], capture_output=True, text=True, timeout=60,
                              env={"PATH": "/usr/bin:/bin", "CANARY": str(canary)})
        return proc

    tools = step.commands[1]
    assert run(tools).returncode == 0, "the build tools check (the stand-in says all present)"
    wheel = tmp_path / HOSTILE / "sgl_kernel-0.3.21-cp310-abi3-linux_x86_64.whl"
    wheel.write_bytes(b"wheel")
    record = sgl_kernel._record_cmd(ctx, key, shlex.quote(str(wheel)), "built-here", "{}")
    proc = run(record)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    calls = [c.split("\0") for c in log.read_text().split(f"{venv}/bin/python\0")[1:]]
    assert calls[0][:2] == ["-c", sgl_kernel._TOOLS_PRESENT]  # the tools check
    assert str(wheel) in calls[1] and calls[1][:3] == ["-m", "pip", "install"]  # the install, the wheel whole
    # the record imports sglang.jit_kernel.nvfp4 from the (editable) checkout: -B, so it leaves no __pycache__ there
    assert str(wheel) in calls[2] and calls[2][:2] == ["-B", "-c"]
    assert not canary.exists()
