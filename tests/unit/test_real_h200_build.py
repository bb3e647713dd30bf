"""gpufleet's own parsers and planners on what the sgl-kernel role's detached build really did on an H200 server.

The fixtures in tests/fixtures/real-h200-build/ were captured on 2026-12-02 (18:48 UTC) by scripts/real-gpu-build.sh
on one NVIDIA H200 (driver 580.159.04, nvcc 13.0.88, Ubuntu 24.04.3, 16 CPUs, no systemd) over real SSH (OpenSSH
9.6p1 on 127.0.0.1:2222, gpufleet's paramiko client on the same machine). The source tree built was a stand-in for
sgl-kernel (scripts/real-gpu-kernel/: scikit-build-core, CMake with CXX and CUDA, FP8 kernels for arch 9.0a). See
the fixtures' README.md for what each file is.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import roles.sgl_kernel as sk
from gpufleet.testing.context import plan_context
from gpufleet.config import series
from gpufleet.engine import detached
from gpufleet.kernel.buildcache import BuildInputs, LocalCache, Record
from gpufleet.engine.command import Cmd
from gpufleet.facts import parse_facts, parse_nvcc
from gpufleet.config.inventory import load_inventory
from gpufleet.plan import PlanContext, Step
from gpufleet.config.stack import host_stacks, load_stack

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "real-h200-build"
REPO = Path(__file__).resolve().parents[2]

TREE = "963828444b15370e9d6dd1629f16921da2eda7e8"  # git rev-parse HEAD:sgl-kernel of the stand-in checkout
KEY_AS_IS = "5de4a1e44d83b8e1b22f05f215f8c541f08979a542faf85e7ed0c16256fd0b08"  # the role's stack as it was
KEY_FOLLOW = "be6f010a4ce955d69af20447fca683b2a81df9e7c20660e50a3d136eb608daa7"  # + -DCMAKE_CUDA_COMPILER=...
KEY_UPGRADE = "d69f9c799e933d05df53311123721489e735f5f2e75723b1bb08a5f8f8a7c377"  # + compile_threads = 2
NVCC_ARG = "-DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc"
WHEEL = "sgl_kernel-0.0.1-py3-none-linux_x86_64.whl"
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
LOGIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # OpenSSH's default for a session


def read(name: str) -> str:
    return (FIX / name).read_text()


def rows(tag: str) -> list[dict]:
    """Every HostSession.run (and connection attempt) of one pass, in order, as build.py recorded it."""
    return [json.loads(line) for line in read(f"results-{tag}.jsonl").splitlines()]


def step_rows(tag: str, step: str) -> list[dict]:
    return [r for r in rows(tag) if r["step"] == step]


def attempt(tag: str) -> dict:
    return next(a for a in json.loads(read("summary.json"))["attempts"] if a["tag"] == tag)


def notes(key: str) -> dict[str, str]:
    """gpufleet-env.txt: what the build's CMake saw ("env NAME=value", "cmake NAME=value", "archs ...")."""
    out = {}
    for line in (FIX / "builds" / key / "gpufleet-env.txt").read_text().splitlines():
        kind, rest = line.split(" ", 1)
        name, _, value = rest.partition("=") if kind in ("env", "cmake") else (kind, "", rest)
        out[name] = value
    return out


def followed_log(tag: str) -> tuple[str, list[tuple[int | None, str, int]]]:
    """Feed the real follow polls through detached._parse_poll the way follow does; the log text it saw."""
    offset, text, seen = 0, "", []
    for r in step_rows(tag, "detached follow"):
        if r["output"] is None or "@@rc " not in r["output"]:
            continue
        rc, st, size, data = detached._parse_poll(r["output"])
        if size > offset:
            text += data
        offset = max(offset, size)
        seen.append((rc, st, size))
    return text, seen


class _Probe:
    """The role's read-only probe, answered with the outputs the real host gave, in order."""

    def __init__(self, outputs: list[str]):
        self.outputs = list(outputs)
        self.sent: list[Cmd] = []

    def __call__(self, cmd: Cmd, step: str):
        self.sent.append(cmd)
        return type("R", (), {"output": self.outputs.pop(0), "exit_code": 0})()


def replan(tag: str, tmp_path: Path) -> tuple[Step, PlanContext]:
    """Run today's sgl-kernel planner on the real facts and probe answers of one pass."""
    inv = load_inventory(FIX / f"inventory-{tag}.toml")
    host = inv.hosts["h200"]
    stack = host_stacks(load_stack(REPO / "stack.toml"), inv, [host])["h200"]
    # The real run had no -D options of the stack's (they came later): its build keys were made without them.
    stack = stack.model_copy(update={"sgl_kernel": stack.sgl_kernel.model_copy(update={"cmake_defines": {}})})
    facts = parse_facts("h200", step_rows(tag, "facts")[0]["output"])
    answers = [r["output"] for r in step_rows(tag, "sgl-kernel build state")][:2]
    # The probe of that run read the tree and the records only; today's also names the kernel directory, and its
    # second read (the record of the key) has the pyproject and CMakeLists at HEAD. Those are the stand-in kernel's
    # files the real run built (scripts/).
    kernel = REPO / "scripts/real-gpu-kernel"
    texts = (f"@@pyproject\n{(kernel / 'pyproject.toml').read_text()}\n"
             f"@@cmake\n{(kernel / 'CMakeLists.txt').read_text()}\n")
    for i, full in ((0, False), (1, True)):
        tree, rest = answers[i].split("\n", 1)
        answers[i] = f"@@dir sgl-kernel\n{tree}\n" + (texts if full else "") + rest
    probe = _Probe(answers)
    ctx = plan_context(host=host, stack=stack, facts=facts, read=probe, repo=REPO)
    items = sk.plan(ctx, cache=LocalCache(tmp_path / "cache"))
    assert len(items) == 1 and isinstance(items[0], Step)
    return items[0], ctx


# --- the machine and the SSH session the build ran in ---------------------------------------------------------


def test_machine_and_the_ssh_login_environment():
    machine = read("machine.txt")
    assert "nproc=16" in machine and "which nvcc: /usr/local/cuda/bin/nvcc" in machine
    assert "g++ --version: g++ (Ubuntu 13.3.0-6ubuntu2~24.04.1) 13.3.0" in machine
    assert "scikit_build_core 1.1.0" in machine and "cmake 4.4.3" in machine and "torch 2.11.0" in machine
    assert "systemd: ls: cannot access '/run/systemd/system'" in machine
    assert parse_nvcc(read("nvcc-version.txt"), "h200") == "13.0.88"
    # what a command started over SSH sees: the console's PATH is not there, nor nvcc; the C++ compiler is
    ssh = read("ssh-env.txt").splitlines()
    assert ssh[0] == f"PATH={LOGIN_PATH}"
    assert "which nvcc: -" in ssh and "which cmake: -" in ssh and "which c++: /usr/bin/c++" in ssh


def test_facts_over_ssh_sized_the_build():
    facts = parse_facts("h200", step_rows("cmake-args", "facts")[0]["output"])
    assert (facts.cpu_count, facts.mem_total_bytes, facts.nvcc_version) == (16, 131961788 * 1024, "13.0.88")
    assert facts.packages["torch"] == "2.11.0" and facts.packages["scikit-build-core"] == "1.1.0"
    jobs = sk.build_jobs(facts.cpu_count, facts.mem_total_bytes, "auto")
    assert jobs == 5  # min(16 CPUs, 31 by 4 GiB a job, 16 // 3)
    command = json.loads(read("build-command-cmake-args.json"))
    assert command["build_jobs"] == jobs and command["facts"]["cpu_count"] == 16
    assert notes(KEY_FOLLOW)["MAX_JOBS"] == notes(KEY_FOLLOW)["CMAKE_BUILD_PARALLEL_LEVEL"] == "5"


@pytest.mark.parametrize("threads, extra, key", [(1, (), KEY_AS_IS), (1, (NVCC_ARG,), KEY_FOLLOW),
                                                 (2, (NVCC_ARG,), KEY_UPGRADE)])
def test_build_keys_are_reproduced_from_the_real_inputs(threads, extra, key, tmp_path):
    inputs = BuildInputs(torch="2.11.0", cuda="13.0.88", arch="9.0a", source_tree=TREE,
                         patches=series.patches_digest(tmp_path), fp4=False, extra_cmake_args=extra,
                         compile_threads=threads)
    assert inputs.key() == key
    assert (FIX / "builds" / key).is_dir()


@pytest.mark.parametrize("tag, key", [("as-is", KEY_AS_IS), ("cmake-args", KEY_FOLLOW)])
def test_todays_planner_on_the_real_answers_plans_the_build_that_ran(tag, key, tmp_path):
    step, ctx = replan(tag, tmp_path)
    ran = json.loads(read(f"build-command-{tag}.json"))
    assert step.title == attempt(tag)["title"] == f"build sgl-kernel 0.0.1 for 9.0a (build {key[:12]}, 5 jobs)"
    job = detached.Job.for_key(key)
    assert {"unit": job.unit, "dir": job.dir, "log": job.log, "rc_file": job.rc_file,
            "pid_file": job.pid_file} == ran["job"]
    build = next(c for c in step.commands if "pip wheel" in c.render())
    text = build.render()
    # every setting the real build got is still given; the real run's key and command line match
    for setting in ("TORCH_CUDA_ARCH_LIST=9.0a", "CUDA_HOME=/usr/local/cuda", "MAX_JOBS=5",
                    "CPLUS_INCLUDE_PATH=/usr/local/cuda/include/cccl", "CMAKE_BUILD_PARALLEL_LEVEL=5",
                    f"--config-settings=build-dir={job.dir}/cmake-build",
                    "/opt/torch/.venv/bin/python -m pip wheel . --no-build-isolation --no-deps"):
        assert setting in text and setting in ran["inner"]
    # the real run built in the checkout; today the build has its own tree (HEAD's, patched) in the job's directory
    assert "cd /root/gpufleet-build/sglang/sgl-kernel" in ran["inner"]
    assert f"cd {job.dir}/src/sgl-kernel && " in text and "/root/gpufleet-build/sglang" not in text
    # the probe answers were read with the role's own section parser
    sections = sk._sections(step_rows(tag, "sgl-kernel build state")[0]["output"])
    assert sections["tree"] == TREE and sections["installed"].strip() == "" and sections["record"].strip() == ""


def test_the_role_now_names_nvcc_which_the_real_login_path_lacked(tmp_path):
    """The as-is build failed: CMake's project(... CUDA) does not look in CUDA_HOME and the SSH PATH has no nvcc.
    The role's build command now sets CUDACXX from cuda_home (the recorded command had no CUDACXX)."""
    assert "CUDACXX" not in json.loads(read("build-command-as-is.json"))["inner"]
    step, _ = replan("as-is", tmp_path)
    build = next(c for c in step.commands if "pip wheel" in c.render())
    assert "CUDACXX=/usr/local/cuda/bin/nvcc" in build.render()


# --- the as-is build: the failure, as follow read it ------------------------------------------------------------


def test_as_is_build_failed_for_want_of_nvcc_and_follow_returned_its_exit_code():
    log, seen = followed_log("as-is")
    assert "No CMAKE_CUDA_COMPILER could be found." in log
    assert "The CXX compiler identification is GNU 13.3.0" in log  # /usr/bin/c++ was on the login PATH
    assert "*** scikit-build-core 1.1.0 using CMake 4.4.3 (wheel)" in log
    assert seen[-1][:2] == (1, "finished") and all(rc is None for rc, _, _ in seen[:-1])
    a = attempt("as-is")
    assert (a["follow_rc"], a["built"], a["state_after_follow"]) == (1, False, {"status": "finished", "rc": 1})
    states = [detached._parse_state(r["output"]) for r in step_rows("as-is", "detached state")]
    assert states == [detached.State("running"), detached.State("finished", 1)]
    # start(retry_failed=True) on the failed job started it again: the files kept from its build folder are that
    # second run's (same failure; the compiler checks cached from the first)
    assert [r["output"].strip().splitlines()[-1] for r in step_rows("as-is", "detached start")] == ["started"] * 2
    second = (FIX / "builds" / KEY_AS_IS / "build.log").read_text()
    assert "No CMAKE_CUDA_COMPILER could be found." in second and read(f"builds/{KEY_AS_IS}/exit-code") == "1\n"


# --- the follow pass: start, state, follow through two lost connections, pick-up ----------------------------------


def test_follow_polls_rebuild_the_host_log_byte_for_byte():
    log, seen = followed_log("cmake-args")
    assert log == (FIX / "builds" / KEY_FOLLOW / "build.log").read_text()
    sizes = [size for _, _, size in seen]
    assert sizes == sorted(sizes) and sizes[-1] == len(log.encode())
    assert seen[-1][:2] == (0, "finished") and {st for _, st, _ in seen[:-1]} == {"running"}
    assert read(f"builds/{KEY_FOLLOW}/exit-code") == "0\n"


def test_detached_start_and_state_outputs():
    starts = [r["output"].strip().splitlines()[-1] for r in step_rows("cmake-args", "detached start")]
    assert starts == ["started", "finished 0"]  # a second start picks up the finished job, no rebuild
    states = [detached._parse_state(r["output"]) for r in step_rows("cmake-args", "detached state")]
    assert states == [detached.State("running"), detached.State("finished", 0)]
    a = attempt("cmake-args")
    assert a["start"] == "started" and a["start_again"] == "finished 0" and a["follow_rc"] == 0
    # no systemd on the host: the setsid fallback wrote the pid file the state check reads
    assert "pid" in read(f"builds/{KEY_FOLLOW}/ls.txt").split()


def test_follow_reconnected_after_a_closed_transport_and_an_unreachable_host():
    a = attempt("cmake-args")
    drop, outage = a["drop"], a["outage"]
    assert drop["closed"] and drop["rc_file"] is None and drop["log_bytes"] == 273  # mid-build
    assert outage["port_closed"] and outage["port_open_again"] and outage["rc_file_when_up"] is None
    assert outage["t_up"] - outage["t_kill"] >= 2.0
    all_rows = rows("cmake-args")
    after_drop = [r for r in all_rows if r["t0"] >= drop["t"]]
    # the closed transport: the next command opened a new connection by itself
    assert after_drop[0]["step"] == "(connect)" and after_drop[0]["error"] is None
    down = [r for r in all_rows if outage["t_kill"] <= r["t0"] <= outage["t_up"]]
    assert down and all(r["error"] and r["error"].startswith("UnreachableError") for r in down)
    assert {r["step"] for r in down} == {"(connect)", "detached follow"}
    back = [r for r in all_rows if r["t0"] > outage["t_up"]]
    assert back[0]["step"] == "(connect)" and back[0]["error"] is None
    # reattached while the build still ran, then read it to the end
    polls = [detached._parse_poll(r["output"]) for r in back if r["step"] == "detached follow"]
    assert polls[0][:2] == (None, "running") and polls[-1][:2] == (0, "finished")
    assert a["follow_s"] < 20


def test_wait_cmd_of_the_role_picks_up_the_finished_job():
    a = attempt("cmake-args")
    assert a["wait_cmd_pickup"]["exit_code"] == 0 and a["wait_cmd_pickup"]["seconds"] < 5
    title = a["title"]
    run = [r for r in step_rows("cmake-args", title) if r["output"] and r["output"].startswith("finished 0")]
    assert len(run) == 1 and "Successfully built sgl-kernel" in run[0]["output"]
    assert a["verify"] == ["sgl_kernel 0.0.1 torch 2.11.0+cu130 ok"]


# --- the executor: Executor with the sgl-kernel role, sshd killed mid-build ----------------------------------------


def test_upgrade_reattached_to_the_running_build_after_sshd_was_killed():
    a = attempt("upgrade")
    outage = a["outage"]
    assert outage["rc_file_at_kill"] is None and outage["rc_file_when_up"] is None and outage["connection_pids"]
    build = [r for r in step_rows("upgrade", a["title"]) if r["command"].startswith("bash -c '\nset -e")]
    lost, again = build
    assert lost["exit_code"] is None
    assert lost["output"].endswith("[gpufleet] connection lost: the host stopped answering\n")
    assert lost["output"].startswith("started\n")
    assert again["exit_code"] == 0 and again["output"].startswith("running\n")  # reattached, the build still ran
    assert again["t0"] > outage["t_up"] and "Successfully built sgl-kernel" in again["output"]
    connects = [r for r in rows("upgrade") if r["step"] == "(connect)" and lost["t1"] <= r["t0"] <= again["t0"]]
    assert [bool(r["error"]) for r in connects] == [True, False]
    assert "Unable to connect to port 2222" in connects[0]["error"]


def test_upgrade_report_record_and_the_unchanged_rerun():
    report = json.loads(read("report-upgrade.json"))
    assert report["outcome"] == "ok" and report["snapshot"].startswith("/var/lib/gpufleet/snapshots/")
    assert [e["status"] for e in report["entries"]] == ["changed"]
    assert f"from build {KEY_FOLLOW[:12]}" in report["entries"][0]["reason"]
    again = json.loads(read("report-upgrade-again.json"))
    assert [(e["status"], e["reason"]) for e in again["entries"]] == [
        ("unchanged", f"sgl-kernel 0.0.1 installed from build {KEY_UPGRADE[:12]} (targets sm_90a)")]
    record_row = next(r for r in step_rows("upgrade", attempt("upgrade")["title"])
                      if r["output"] and "recorded [" in r["output"])
    assert record_row["output"].rstrip().endswith("recorded ['sm_90a'] fp4 False")
    # the probe of the rerun read the installed record with the role's own parsers
    state = sk._sections(step_rows("upgrade", "sgl-kernel build state")[-1]["output"])
    installed = Record.from_json(state["installed"].strip())
    assert installed.key == KEY_UPGRADE and installed.archs == ["sm_90a"]
    audit = [json.loads(line) for line in read("audit-tail.jsonl").splitlines()]
    assert [x["outcome"] for x in audit] == ["ok", "ok"] and audit[0]["changed"] and not audit[1]["changed"]


@pytest.mark.parametrize("key, threads", [(KEY_FOLLOW, 1), (KEY_UPGRADE, 2)])
def test_records_say_what_the_build_targeted(key, threads):
    rec = Record.from_json(read(f"builds/{key}/record.json"))
    assert (rec.key, rec.archs, rec.fp4, rec.origin) == (key, ["sm_90a"], False, "built-here")
    assert rec.wheel == f"{detached.BUILDS_DIR}/{key}/dist/{WHEEL}" and sk._wheel_version(rec.wheel) == "0.0.1"
    assert rec.inputs["compile_threads"] == threads and rec.inputs["jobs"] == 5 and rec.inputs["host"] == "h200"
    assert (rec.inputs["torch"], rec.inputs["cuda"], rec.inputs["source_tree"]) == ("2.11.0", "13.0.88", TREE)
    assert 5 < rec.seconds < 60


def test_installed_record_and_the_wheel_fetched_over_sftp():
    installed = Record.from_json(read("installed-record.json"))
    assert installed == Record.from_json(read(f"builds/{KEY_UPGRADE}/record.json"))
    cached = dict(line.rsplit(" ", 1) for line in read("control-cache.txt").splitlines())
    size = re.search(rf"(\d+) \w+ +\d+ [\d:]+ {re.escape(WHEEL)}", read(f"builds/{KEY_UPGRADE}/ls.txt"))[1]
    assert cached[f"sgl-kernel/{KEY_UPGRADE}/{WHEEL}"] == size == "207744"
    assert Record.from_json(Path(FIX / f"builds/{KEY_UPGRADE}/record.json").read_text()).key == KEY_UPGRADE


# --- what was compiled, and how it ran on the GPU -------------------------------------------------------------------


@pytest.mark.parametrize("key, threads", [(KEY_FOLLOW, 1), (KEY_UPGRADE, 2)])
def test_the_build_environment_reached_cmake(key, threads):
    n = notes(key)
    assert n["TORCH_CUDA_ARCH_LIST"] == "9.0a" and n["CUDA_HOME"] == "/usr/local/cuda"
    assert n["CPLUS_INCLUDE_PATH"] == "/usr/local/cuda/include/cccl"
    assert n["CMAKE_ARGS"] == f"-DSGL_KERNEL_COMPILE_THREADS={threads} {NVCC_ARG}"
    assert n["PATH"] == LOGIN_PATH and n["CUDACXX"] == ""
    assert n["CMAKE_CUDA_COMPILER"] == "/usr/local/cuda/bin/nvcc"
    assert n["CMAKE_CUDA_COMPILER_VERSION"] == parse_nvcc(read("nvcc-version.txt"), "h200")
    assert n["CMAKE_CXX_COMPILER"] == "/usr/bin/x86_64-linux-gnu-g++" and n["CMAKE_GENERATOR"] == "Ninja"
    assert n["archs"] == "sm_90a" and n["gencode"] == GENCODE and n["SGL_KERNEL_COMPILE_THREADS"] == str(threads)
    cuda_flags = [ln for ln in read(f"builds/{key}/build-ninja-lines.txt").splitlines() if GENCODE in ln]
    assert len(cuda_flags) == 2 and all(f"--threads={threads}" in ln for ln in cuda_flags)
    assert "CMAKE_BUILD_TYPE:STRING=Release" in read(f"builds/{key}/cmake-cache.txt")
    compiled = [ln.split("\t")[3] for ln in read(f"builds/{key}/ninja_log.txt").splitlines()[1:]]
    assert sorted(compiled) == ["CMakeFiles/common_ops.dir/csrc/arch_probe.cu.o",
                                "CMakeFiles/common_ops.dir/csrc/build_info.cc.o",
                                "CMakeFiles/common_ops.dir/csrc/fp8_quant.cu.o", "common_ops.abi3.so"]


def test_the_library_holds_sm_90a_machine_code_only():
    assert read("cuobjdump-list-elf.txt").splitlines() == ["ELF file    1: common_ops.abi3.1.sm_90a.cubin",
                                                            "ELF file    2: common_ops.abi3.2.sm_90a.cubin"]
    assert "No PTX file found" in read("cuobjdump-list-ptx.txt")
    sass = read("cuobjdump-sass.txt")
    assert set(re.findall(r"arch = (\w+)", sass)) == {"sm_90a"}
    kernels = {re.sub(r"^\d+", "", name) for name in re.findall(r"Function : \S*?_cu_[0-9a-f]{8}(\w+?_kernel)E", sass)}
    assert kernels == {"amax_kernel", "quant_kernel", "arch_probe_kernel"}
    assert "libcudart" not in read("ldd.txt")  # the CUDA runtime is linked in statically


def test_the_kernels_ran_on_the_h200_and_matched_torch():
    out = json.loads(read("kernel-check.json"))
    assert out["ok"] and (out["device"], out["capability"]) == ("NVIDIA H200", [9, 0])
    assert (out["torch"], out["torch_cuda"]) == ("2.11.0+cu130", "13.0")
    assert out["arch_probe"] == {"cuda_arch": 900, "sm90a_features": True}
    info = out["build_info"]
    assert (info["archs"], info["fp4"], info["cuda"], info["cxx"]) == (["sm_90a"], False, "13.0.88", "GNU 13.3.0")
    assert info["cccl"] == "3000001"  # <cuda/std/version>, reached by g++ only through CPLUS_INCLUDE_PATH
    assert info["library"] == "/opt/torch/.venv/lib/python3.12/site-packages/sgl_kernel/common_ops.abi3.so"
    assert [c["n"] for c in out["checks"]] == [1, 1000, (1 << 20) + 3, 64 << 20]
    for c in out["checks"]:
        assert c["amax_equal"] and c["scale_equal"] and c["within_one_step"]
        assert (c["bytes_mismatched"], c["nan_left"]) == (0, 0)
        assert c["scale"] == pytest.approx(c["amax"] / 448.0, rel=1e-7)
    assert out["timing"]["n"] == 256 << 20 and out["timing"]["median_ms"] > 0
    ran = step_rows("kernel-check", "kernel check")
    assert ran[0]["exit_code"] == 0 and ran[0]["command"].startswith("cd /tmp && /opt/torch/.venv/bin/python ")


def test_the_whole_run():
    summary = json.loads(read("summary.json"))
    assert summary["ok"] and summary["kernel_check"]["exit_code"] == 0
    assert [(a["tag"], a.get("ok", False)) for a in summary["attempts"]] == [
        ("as-is", False), ("cmake-args", True), ("upgrade", True)]
    timings = dict((line.split("\t")[0], line.split("\t")[2]) for line in read("timings.tsv").splitlines())
    assert float(timings["total"]) < 120
    assert "done: build.py exit 0" in read("run.log")


# --- after the CUDACXX fix: the role as it is, on another H200 of the kind (19:05 UTC) ------------------------------

AFTER = "after-fix"
KEY_UPGRADE_AFTER = "bf68ddcad063c4659f61efec05489eaedb5a896a0d1500ff74e6250d913f7aac"  # compile_threads = 2


def test_after_the_fix_the_role_as_it_is_built_on_the_h200():
    summary = json.loads(read(f"{AFTER}/summary.json"))
    assert summary["ok"] and summary["ssh_env"][:2] == [f"PATH={LOGIN_PATH}", "which nvcc: -"]
    first = json.loads(read("summary.json"))["sources"]
    assert summary["sources"]["roles/sgl_kernel.py"] != first["roles/sgl_kernel.py"]
    a, up = summary["attempts"]
    assert (a["tag"], a["ok"], a["follow_rc"], a["extra_cmake_args"], a["key"]) == ("as-is", True, 0, [], KEY_AS_IS)
    assert a["start_again"] == "finished 0" and a["wait_cmd_pickup"]["exit_code"] == 0
    assert a["outage"]["rc_file_when_up"] is None and a["drop"]["closed"]  # both drops again, mid-build
    assert (up["tag"], up["outcome"], up["again"], up["key"]) == ("upgrade", "ok", ["unchanged"], KEY_UPGRADE_AFTER)
    assert "CUDACXX=/usr/local/cuda/bin/nvcc" in json.loads(read(f"{AFTER}/build-command-as-is.json"))["inner"]
    for key in (KEY_AS_IS, KEY_UPGRADE_AFTER):
        env = dict(line.split(" ", 1)[1].split("=", 1) for line in read(f"{AFTER}/builds/{key}/gpufleet-env.txt")
                   .splitlines() if line.startswith(("env ", "cmake ")))
        assert env["CUDACXX"] == env["CMAKE_CUDA_COMPILER"] == "/usr/local/cuda/bin/nvcc"
        assert env["PATH"] == LOGIN_PATH and not env["CMAKE_ARGS"].count("CMAKE_CUDA_COMPILER")
        assert Record.from_json(read(f"{AFTER}/builds/{key}/record.json")).archs == ["sm_90a"]
        assert read(f"{AFTER}/builds/{key}/exit-code") == "0\n"
    log, seen = followed_log_of(f"{AFTER}/results-as-is.jsonl")
    assert log == read(f"{AFTER}/builds/{KEY_AS_IS}/build.log") and seen[-1][:2] == (0, "finished")
    out = json.loads(read(f"{AFTER}/kernel-check.json"))
    assert out["ok"] and out["arch_probe"] == {"cuda_arch": 900, "sm90a_features": True}
    assert all(c["bytes_mismatched"] == 0 for c in out["checks"])
    assert Record.from_json(read(f"{AFTER}/installed-record.json")).key == KEY_UPGRADE_AFTER


def followed_log_of(name: str) -> tuple[str, list[tuple[int | None, str, int]]]:
    offset, text, seen = 0, "", []
    for line in read(name).splitlines():
        r = json.loads(line)
        if r["step"] != "detached follow" or r["output"] is None or "@@rc " not in r["output"]:
            continue
        rc, st, size, data = detached._parse_poll(r["output"])
        text += data if size > offset else ""
        offset = max(offset, size)
        seen.append((rc, st, size))
    return text, seen


def _deps_script(tmp_path: Path) -> str:
    step, _ = replan("as-is", tmp_path)
    deps = next(c for c in step.commands if "pip._vendor.packaging" in c.render())
    return deps.render()  # the whole command line: the install's argv travels as the script's arguments


@pytest.mark.parametrize("import_rc, installs", [(0, False), (1, True)])
def test_build_tools_are_installed_only_when_scikit_build_core_is_missing(import_rc, installs, tmp_path):
    """On the H200 at 19:05 the check ran pip although `import scikit_build_core` worked: `a || cd / && pip ...` runs
    pip whatever a says. The role's command now groups the install (its check now covers every build tool)."""
    ran = [json.loads(line) for line in read(f"{AFTER}/results-as-is.jsonl").splitlines()]
    real = next(r for r in ran if "import scikit_build_core" in r.get("command", ""))
    assert "|| cd / && env" in real["command"]
    assert "Requirement already satisfied: scikit-build-core>=0.10" in real["output"]
    python = tmp_path / "python"
    marker = tmp_path / "pip-ran"
    python.write_text(f"#!/bin/sh\n[ \"$1\" = -c ] && exit {import_rc}\necho \"$@\" > {marker}\n")
    python.chmod(0o755)
    text = _deps_script(tmp_path).replace("/opt/torch/.venv/bin/python", str(python))
    subprocess.run(["bash", "-c", text], check=True, cwd=tmp_path)
    assert marker.exists() == installs
    if installs:
        assert "-m pip install" in marker.read_text() and "scikit-build-core>=0.10" in marker.read_text()
