"""The verify role: its plan with and without a probe, and its check run here against the stand-in stack."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from gpufleet import remote
from gpufleet.testing.context import plan_context
from gpufleet.plan import PlanContext, Step, Unchanged
from gpufleet.sim import wheels
from gpufleet.engine.ssh import Result
from gpufleet.roles import verify
from gpufleet.facts.gpu import GPU_QUERY_FIELDS, GpuFacts, parse_query_gpu_csv
from gpufleet.remote.stack_memo import GPU_FIELDS, GPUS, gpu_digest

REPO = Path(__file__).resolve().parents[2]

TARGET = wheels.TARGET


def ctx(probe=None) -> PlanContext:
    return plan_context(packages={}, read=probe)


def test_without_probe_a_check_step_is_planned():
    [item] = verify.plan(ctx())
    assert isinstance(item, Step) and item.commands == () and len(item.verify) == 1
    assert item.changes == ()


def test_passing_check_is_unchanged_with_its_summary():
    def probe(cmd, step):
        return Result("gpu1", step, "", 0, "torch 2.12 ... import together\n", 0.0)
    assert verify.plan(ctx(probe)) == [Unchanged("verify", "torch 2.12 ... import together")]


def test_failing_check_plans_a_step_saying_what_is_wrong_now():
    def probe(cmd, step):
        return Result("gpu1", step, "", 1, "noise\nstack problem: a is 1\nstack problem: b is 2\n", 0.0)
    [item] = verify.plan(ctx(probe))
    assert isinstance(item, Step) and item.reason == "now: a is 1; b is 2"


# --- the check itself, against stand-in packages -------------------------------------------------------------------

def _install(site: Path, name: str, version: str, package: str, subs: dict) -> None:
    for rel, text in wheels.package_files(package, subs).items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    info = site / f"{wheels.dist_name(name)}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def stack_site(tmp_path: Path, *, torch: str = TARGET["torch"], kernel_torch: str = TARGET["torch"],
               fp4: bool = True, cubin: str = "0.6.5") -> dict:
    site = tmp_path / "site"
    _install(site, "torch", torch, "torch", {"VERSION": torch, "CUDA": "13.0", "GIT_VERSION": "0",
                                             "ARCH_LIST": ",".join(wheels.ARCH_LIST)})
    _install(site, "flashinfer-python", "0.6.5", "flashinfer", {"VERSION": "0.6.5", "GIT_VERSION": "0"})
    _install(site, "flashinfer-cubin", cubin, "flashinfer_cubin", {"VERSION": cubin})
    _install(site, "flashinfer-jit-cache", "0.6.5+cu130", "flashinfer_jit_cache", {"VERSION": "0.6.5+cu130"})
    info = {**wheels.sgl_kernel_build_info("0.3.16", kernel_torch), "fp4": fp4}
    _install(site, "sgl-kernel", "0.3.16", "sgl_kernel", {"VERSION": "0.3.16", "BUILD_INFO": json.dumps(info)})
    gpus = tmp_path / "gpus.json"
    gpus.write_text(json.dumps({"count": 8, "compute_cap": "12.0", "fail": None}))
    return {"PYTHONPATH": str(site), "GPUFLEET_SIM_GPUS": str(gpus), "PATH": "/usr/bin:/bin"}


def run_check(env: dict, cwd: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    _, *flags, code, arg = verify.check_cmd(ctx()).argv
    return subprocess.run([python, *flags, code, arg], env=env, cwd=cwd, capture_output=True, text=True)


def test_target_stack_imports_together(tmp_path):
    proc = run_check(stack_site(tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == (
        f"torch {TARGET['torch']} (CUDA 13.0, cc 12.0, sm_120), flashinfer-python 0.6.5, flashinfer-cubin 0.6.5, "
        "flashinfer-jit-cache 0.6.5+cu130, sgl-kernel 0.3.16 with FP4 ops import together")


def test_sgl_kernel_built_for_another_torch_is_named_with_both_versions(tmp_path):
    proc = run_check(stack_site(tmp_path, kernel_torch="2.9.1+cu130"), tmp_path)
    assert proc.returncode == 1
    line = next(x for x in proc.stdout.splitlines() if "sgl_kernel" in x)
    assert line.startswith(f"stack problem: import sgl_kernel failed (sgl-kernel 0.3.16 with torch {TARGET['torch']})")
    assert "rebuild it for this torch" in line


def test_old_torch_and_mismatched_flashinfer_are_each_named(tmp_path):
    proc = run_check(stack_site(tmp_path, torch="2.9.1+cu130", kernel_torch="2.9.1+cu130", cubin="0.6.4"), tmp_path)
    problems = [x for x in proc.stdout.splitlines() if x.startswith("stack problem: ")]
    assert proc.returncode == 1
    assert any("flashinfer-cubin is 0.6.4, stack.toml wants 0.6.5" in p for p in problems)
    assert any(p.startswith("stack problem: import flashinfer failed (flashinfer-python 0.6.5, flashinfer-cubin 0.6.4")
               for p in problems)
    assert any(f"torch.__version__ is 2.9.1+cu130, stack.toml wants {TARGET['torch']}" in p for p in problems)


def test_missing_fp4_ops_are_listed(tmp_path):
    proc = run_check(stack_site(tmp_path, fp4=False), tmp_path)
    assert proc.returncode == 1
    assert ("stack problem: sgl-kernel 0.3.16 lacks FP4 ops: cutlass_scaled_fp4_mm, scaled_fp4_quant, "
            "scaled_fp4_experts_quant, cutlass_fp4_group_mm") in proc.stdout


def with_memo(env: dict, tmp_path: Path) -> dict:
    """env with a host cache and the stand-in nvidia-smi on PATH (answering from the same GPU file as the stand-in
    torch): a pass is kept only with the GPUs nvidia-smi lists."""
    sim_bin = tmp_path / "bin"
    sim_bin.mkdir()
    (sim_bin / "nvidia-smi").write_text(f"#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m "
                                        "gpufleet.sim.nvidia_smi \"$@\"\n")
    (sim_bin / "nvidia-smi").chmod(0o755)
    return {**env, "GPUFLEET_HOST_CACHE": str(tmp_path / "host-cache"), "PATH": f"{sim_bin}:{env['PATH']}"}


def test_a_pass_is_remembered_on_the_host_until_what_it_reads_changes(tmp_path):
    env = with_memo(stack_site(tmp_path), tmp_path)
    summary = run_check(env, tmp_path).stdout.strip()
    assert summary.endswith("import together")
    again = run_check(env, tmp_path)
    first, gpus = again.stdout.splitlines()
    assert again.returncode == 0 and first.startswith("as checked at ") and first.endswith(
        f"(nothing it reads has changed since): {summary}")
    assert gpus.startswith(GPUS) and len(gpus) == len(GPUS) + 64  # the GPUs it was checked on, for the planner
    assert run_check({**env, "GPUFLEET_FRESH": "1"}, tmp_path).stdout.strip() == summary  # the verify step's way
    site = Path(env["PYTHONPATH"].split(":")[0])
    for part in ("sgl_kernel", "sgl_kernel-0.3.16.dist-info"):  # what pip uninstall sgl-kernel does
        shutil.rmtree(site / part)
    gone = run_check(env, tmp_path)
    assert gone.returncode == 1 and "import sgl_kernel failed" in gone.stdout, gone.stdout
    assert run_check(env, tmp_path).returncode == 1  # a failure is never remembered
    fresh = stack_site(tmp_path / "again")  # the stack back, in another place: checked afresh, then remembered
    env["PYTHONPATH"] = fresh["PYTHONPATH"]
    env["GPUFLEET_SIM_GPUS"] = fresh["GPUFLEET_SIM_GPUS"]
    assert run_check(env, tmp_path).stdout.strip() == summary
    assert run_check(env, tmp_path).stdout.startswith("as checked at ")
    kept = run_check(env, tmp_path).stdout.splitlines()
    Path(env["GPUFLEET_SIM_GPUS"]).write_text(json.dumps({"fail": "driver"}))  # the driver lost the GPUs
    # the host's memo asks no nvidia-smi: it answers with the GPUs the pass was checked on, which the planner compares
    # with its facts (test_a_remembered_pass_from_other_gpus_is_checked_afresh) and then asks afresh, as here
    assert run_check(env, tmp_path).stdout.splitlines() == kept and kept[-1].startswith(GPUS)
    lost = run_check({**env, "GPUFLEET_FRESH": "1"}, tmp_path)
    assert lost.returncode == 1 and "torch sees no GPU" in lost.stdout, lost.stdout
    assert run_check(env, tmp_path).stdout.splitlines() == kept  # a failure never replaces the pass kept


def smi(env: dict, *args: str) -> str:
    """What the stand-in nvidia-smi answers (from the GPU file env names)."""
    proc = subprocess.run([sys.executable, "-m", "gpufleet.sim.nvidia_smi", *args], capture_output=True, text=True,
                          env={**env, "PYTHONPATH": str(REPO)}, check=True)
    return proc.stdout


def test_a_remembered_pass_from_other_gpus_is_checked_afresh(tmp_path):
    env = stack_site(tmp_path)
    fields = "--query-gpu=" + ",".join(GPU_QUERY_FIELDS)
    facts_gpus = lambda: GpuFacts(gpus=parse_query_gpu_csv(smi(env, fields, "--format=csv,noheader,nounits"),  # noqa
                                                           "gpu1", GPU_QUERY_FIELDS), driver_version=None,
                                  cuda_version=None)
    # what the host's memo keeps: the digest of the GPUs as its own nvidia-smi query lists them
    checked_on = smi(env, "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader")
    remembered = ("as checked at 2026-12-04 10:00 UTC (nothing it reads has changed since): torch ... import together\n"
                  f"{GPUS}{gpu_digest(line.split(',') for line in checked_on.splitlines())}\n")
    asked = []

    def probe(cmd, step):
        asked.append((step, dict(cmd.env or ()).get("GPUFLEET_FRESH")))
        return Result("gpu1", step, "", 0, remembered if step == "verify the stack" else "torch ... fresh\n", 0.0)

    same = verify.plan(plan_context(packages={}, read=probe, gpus=facts_gpus()))
    assert same == [Unchanged("verify", remembered.splitlines()[0])] and asked == [("verify the stack", None)]
    asked.clear()
    gpus = json.loads(Path(env["GPUFLEET_SIM_GPUS"]).read_text())
    Path(env["GPUFLEET_SIM_GPUS"]).write_text(json.dumps({**gpus, "count": 7}))  # one fell off the bus
    other = verify.plan(plan_context(packages={}, read=probe, gpus=facts_gpus()))
    assert other == [Unchanged("verify", "torch ... fresh")]
    assert asked == [("verify the stack", None), ("verify the stack afresh", "1")]


def test_a_pass_another_version_of_the_check_remembered_is_not_answered(tmp_path, monkeypatch):
    env = with_memo(stack_site(tmp_path), tmp_path)
    summary = run_check(env, tmp_path).stdout.strip()
    assert run_check(env, tmp_path).stdout.startswith("as checked at ")
    real = remote.text
    monkeypatch.setattr(remote, "text", lambda name: real(name) + ("\n# a gpufleet that checks one thing more\n"
                                                                   if name == "verify_check.py" else ""))
    assert run_check(env, tmp_path).stdout.strip() == summary  # checked afresh: no "as checked at"
    assert run_check(env, tmp_path).stdout.startswith("as checked at ")


def test_without_a_writable_cache_every_check_is_fresh(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("")
    env = {**stack_site(tmp_path), "GPUFLEET_HOST_CACHE": str(blocked)}
    first, again = run_check(env, tmp_path), run_check(env, tmp_path)
    assert first.returncode == again.returncode == 0 and first.stdout == again.stdout


def test_the_real_h200s_gpus_digest_the_same_on_the_host_and_from_the_facts():
    text = (REPO / "tests" / "fixtures" / "real-h200" / "query-gpu.csv").read_text()
    header, *rows = [[cell.strip() for cell in line.split(",")] for line in text.splitlines() if line.strip()]
    on_host = [[row[header.index(field)] for field in GPU_FIELDS] for row in rows]  # what the memo's query prints
    facts = GpuFacts(gpus=parse_query_gpu_csv(text, "h200"), driver_version="580.159.04", cuda_version="13.0")
    ctx = plan_context(packages={}, gpus=facts)
    assert not verify._other_gpus(f"as checked at ...: ok\n{GPUS}{gpu_digest(on_host)}\n", ctx)
    on_host[0][1] = "GPU-00000000-0000-0000-0000-000000000000"  # another card in its slot
    assert verify._other_gpus(f"as checked at ...: ok\n{GPUS}{gpu_digest(on_host)}\n", ctx)


def editable_venv(tmp_path: Path, env: dict) -> tuple[str, Path]:
    """A venv whose sgl_kernel is importable only through a .pth import line's finder (as setuptools' editable
    install makes one), and the file that line appends to each time it runs."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    source = tmp_path / "checkout"
    shutil.move(Path(env["PYTHONPATH"]) / "sgl_kernel", source / "sgl_kernel")  # its dist-info stays on the path
    runs = tmp_path / "pth-runs"
    (site / "_gf_editable_finder.py").write_text(f"""import sys
from importlib.machinery import PathFinder
class Finder:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return PathFinder.find_spec(name, [{str(source)!r}]) if name == "sgl_kernel" else None
def install():
    open({str(runs)!r}, "a").write("ran\\n")
    sys.meta_path.append(Finder)
    sys.path.append("__editable__.sgl_kernel.finder.__path_hook__")
""")
    (site / "__editable___sgl_kernel_finder.pth").write_text(
        "import _gf_editable_finder; _gf_editable_finder.install()\n")
    return str(venv / "bin" / "python"), runs


def test_a_remembered_pass_runs_no_pth_import_line_and_a_fresh_check_runs_them(tmp_path):
    env = with_memo(stack_site(tmp_path), tmp_path)
    python, runs = editable_venv(tmp_path, env)
    first = run_check(env, tmp_path, python)
    assert first.returncode == 0 and first.stdout.strip().endswith("import together"), first.stdout + first.stderr
    fresh = runs.read_text().count("ran")  # the check, and the torch report it starts, ran the line
    assert fresh >= 1
    again = run_check(env, tmp_path, python)
    assert again.stdout.startswith("as checked at ") and runs.read_text().count("ran") == fresh
    (tmp_path / "host-cache").rename(tmp_path / "forgotten")
    assert run_check(env, tmp_path, python).returncode == 0 and runs.read_text().count("ran") == 2 * fresh


def test_without_the_pth_import_line_sgl_kernel_is_missing(tmp_path):
    """The oracle for the test above: the finder is what makes sgl_kernel importable there."""
    env = with_memo(stack_site(tmp_path), tmp_path)
    python, _ = editable_venv(tmp_path, env)
    next(Path(python).parents[1].glob("lib/python*/site-packages/*.pth")).unlink()
    proc = run_check(env, tmp_path, python)
    assert proc.returncode == 1 and "sgl_kernel" in proc.stdout, proc.stdout + proc.stderr
