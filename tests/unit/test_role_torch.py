"""The torch planner with fake facts (no SSH), and its on-host check run here against the stand-in torch."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.testing.context import plan_context
from gpufleet.errors import GpufleetError
from gpufleet.facts.gpu import Gpu, GpuFacts
from gpufleet.facts.model import HostFacts
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged
from gpufleet.sim import wheels
from gpufleet.engine.ssh import Result
from gpufleet.config.stack import Stack, stack_for_host
from gpufleet.roles import torch
from tests.unit.pipfakes import PIP_WHEEL, RESOLVER, report, resolving_probe

TARGET = "2.12.0.dev20260307+cu130"
IDX = "http://10.0.0.1:8765/simple"
OLD_PACKAGES = {"torch": "2.9.1+cu130", "pip": "24.0", "flashinfer-python": "0.6.4"}


def gpus(cap: str = "12.0", count: int = 8) -> GpuFacts:
    return GpuFacts(gpus=[Gpu(index=i, name="NVIDIA RTX PRO 6000 Blackwell Server Edition", compute_capability=cap,
                              memory_total_mib=97887) for i in range(count)], driver_version="580.95.05",
                    cuda_version="13.0")


def ctx(packages=OLD_PACKAGES, *, facts_gpus=None, stack=None, probe=None, resolver=lambda: RESOLVER) -> PlanContext:
    facts = HostFacts(host="gpu1", gpus=facts_gpus if facts_gpus is not None else gpus(), packages=packages)
    return plan_context(stack=stack, facts=facts, read=probe, resolver=resolver)


def overridden(**torch_fields) -> Stack:
    over = {"torch": torch_fields, "pip": {"trusted_hosts": ["10.0.0.1"], "extra_index_urls": [IDX + "/extra"]}}
    return stack_for_host(Stack(), over, source="hosts.toml", host="gpu1")


def fake_probe(answers: dict[str, tuple[int, str]]):
    """A probe answering by step name; records what was asked."""
    asked = []

    def probe(cmd, step):
        asked.append(step)
        code, out = answers.get(step, (1, ""))
        return Result("gpu1", step, cmd.display(), code, out, 0.0)

    probe.asked = asked
    return probe


def test_installed_target_is_unchanged_with_reason():
    [item] = torch.plan(ctx({**OLD_PACKAGES, "torch": TARGET}))
    assert item == Unchanged("torch", f"torch {TARGET} already installed (stack.toml wants {TARGET})")


def test_pip_freeze_form_without_local_label_counts_as_installed():
    stack = overridden(version="2.11.0+cu130")
    [item] = torch.plan(ctx({**OLD_PACKAGES, "torch": "2.11.0"}, stack=stack))
    assert isinstance(item, Unchanged)


CASCADE = (("torch", TARGET), ("triton", "3.6.0"), ("nvidia-cublas", "13.2.0.1"))


def planned(packages=OLD_PACKAGES, *, stack=None, answer=None, code=0, **kw) -> tuple[Step, object]:
    probe = resolving_probe({"torch": answer if answer is not None else report(*CASCADE)}, code=code)
    [step] = torch.plan(ctx(packages, stack=stack, probe=probe, **kw))
    return step, probe


def test_old_torch_gives_one_install_step_with_reason():
    step, _ = planned()
    assert isinstance(step, Step)
    assert step.role == "torch" and step.title == f"install torch {TARGET}"
    assert step.reason.startswith(f"venv has torch 2.9.1+cu130; stack.toml wants {TARGET} (brings 2 more: "
                                  f"nvidia-cublas, triton); 3 wheel(s) handed over by the control node")
    assert step.changes == ("venv",)


def test_the_host_resolves_with_the_pinned_pip_and_installs_offline_from_the_pushed_wheels():
    step, probe = planned()
    [(asked, resolve)] = probe.asked
    assert asked == f"torch: resolve torch=={TARGET}"
    argv = list(resolve.argv)
    assert argv[:4] == ["bash", "-c", argv[2], "resolve"] and argv[4] == ""  # no lock: no constraints
    assert argv[5:11] == ["/root/venv/bin/python", f"{PIP_WHEEL}/pip", "install", "--dry-run", "--quiet", "--pre"]
    assert argv[argv.index("--index-url") + 1] == "https://download.pytorch.org/whl/nightly/cu130"
    assert argv[-1] == f"torch=={TARGET}"
    assert step.commands[0].keep_owner == ("/root/venv",)  # pip's new files keep the venv's owner
    assert dataclasses.replace(step.commands[0], keep_owner=()).render() == (
        "cd / && env CONSTRAINTS='' PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 "
        "bash -c '\"$@\" -c <(printf \"%s\\n\" \"$CONSTRAINTS\")' install /root/venv/bin/python "
        f"{PIP_WHEEL}/pip install --progress-bar off --no-index --find-links /var/cache/gpufleet/wheels "
        f"torch=={TARGET} triton==3.6.0 nvidia-cublas==13.2.0.1")


def test_every_resolved_wheel_is_an_upload_with_its_sha256_and_the_resolver_goes_along():
    step, _ = planned()
    assert step.uploads[0] == RESOLVER
    assert [(u.name, u.version, u.sha256, u.remote) for u in step.uploads[1:]] == [
        ("torch", TARGET, f"{0:064x}", f"/var/cache/gpufleet/wheels/torch-{TARGET}-py3-none-any.whl"),
        ("triton", "3.6.0", f"{1:064x}", "/var/cache/gpufleet/wheels/triton-3.6.0-py3-none-any.whl"),
        ("nvidia-cublas", "13.2.0.1", f"{2:064x}", "/var/cache/gpufleet/wheels/nvidia_cublas-13.2.0.1-py3-none-any.whl")]
    assert step.uploads[1].url == f"http://10.0.0.1:8765/files/torch-{TARGET.replace('+', '%2B')}-py3-none-any.whl"


def test_an_index_without_hashes_leaves_the_hash_to_the_control_node():
    step, _ = planned(answer=report(*CASCADE, hashed=False))
    assert [u.sha256 for u in step.uploads[1:]] == [None, None, None]


def test_pip_command_has_trusted_hosts_and_extra_indexes():
    _, probe = planned(stack=overridden(index_url=IDX))
    argv = probe.asked[0][1].argv
    assert argv[argv.index("--index-url") + 1] == IDX
    assert argv[argv.index("--trusted-host") + 1] == "10.0.0.1"
    assert argv[argv.index("--extra-index-url") + 1] == IDX + "/extra"


def test_no_pre_flag_when_stack_says_so():
    _, probe = planned(stack=overridden(pre=False))
    assert "--pre" not in probe.asked[0][1].argv


def test_a_failed_resolution_is_a_plan_error_with_pips_words():
    with pytest.raises(PlanError, match=r"(?s)cannot resolve torch==.*exit 1.*No matching distribution"):
        planned(answer="ERROR: No matching distribution found for torch==2.12.0.dev20260307+cu130", code=1)


def test_an_unreadable_report_is_a_plan_error():
    with pytest.raises(PlanError, match="report is not readable"):
        planned(answer="@@gpufleet-pip-report@@\n{not json")


def test_an_sdist_in_the_resolution_is_refused():
    answer = report(*CASCADE).replace("triton-3.6.0-py3-none-any.whl", "triton-3.6.0.tar.gz")
    with pytest.raises(PlanError, match="triton 3.6.0 resolves to .*tar.gz, not a wheel"):
        planned(answer=answer)


def test_missing_torch_is_installed():
    step, _ = planned({"pip": "24.0"})
    assert step.reason.startswith("torch is not installed in /root/venv")


def test_without_a_resolver_there_is_no_plan():
    probe = resolving_probe({"torch": report(*CASCADE)})
    with pytest.raises(PlanError, match="no resolver"):
        torch.plan(ctx(probe=probe, resolver=None))


def test_unreadable_packages_is_a_plan_error():
    with pytest.raises(PlanError, match="gpu1.*torch.*packages could not be read"):
        torch.plan(ctx(None))


def test_credentials_in_index_url_are_masked():
    _, probe = planned(stack=overridden(index_url="https://bob:s3cret@mirror.example/simple"))
    resolve = probe.asked[0][1]
    assert "s3cret" not in resolve.display()
    assert "s3cret" in resolve.render()


@pytest.mark.parametrize("version, index, cuda", [
    (TARGET, "https://download.pytorch.org/whl/nightly/cu130", "13.0"),
    ("2.8.0+cu128", "https://x.example/whl/cu126", "12.8"),
    ("2.8.0", "https://download.pytorch.org/whl/nightly/cu126", "12.6"),
    ("2.8.0", "https://pypi.org/simple", None),
])
def test_cuda_from_local_label_then_index(version, index, cuda):
    assert torch.cuda_of(overridden(version=version, index_url=index)) == cuda


def test_expectations_follow_the_hosts_gpus():
    assert torch.expectations(ctx()) == {"version": TARGET, "cuda": "13.0", "cap": [12, 0], "arch": "sm_120"}
    assert torch.expectations(ctx(facts_gpus=gpus("9.0")))["arch"] == "sm_90"
    # unreadable GPUs: the inventory's expectation (12.0 by default)
    no_gpus = ctx()
    no_gpus.facts = HostFacts(host="gpu1", packages=OLD_PACKAGES)
    assert torch.expectations(no_gpus)["cap"] == [12, 0]


def test_mixed_gpus_is_a_plan_error():
    mixed = gpus()
    mixed.gpus[3] = mixed.gpus[3].model_copy(update={"compute_capability": "9.0"})
    with pytest.raises(PlanError, match="mixed compute capability"):
        planned(facts_gpus=mixed)


def test_plan_error_is_a_gpufleet_error():
    assert issubclass(PlanError, GpufleetError)


# --- the on-host check, run here against the simulated stand-in torch ---------------------------------------------

def _stand_in_torch(tmp_path: Path, version: str, cap: str = "12.0", archs=None) -> dict[str, str]:
    subs = {"VERSION": version, "CUDA": "13.0", "GIT_VERSION": "0" * 40,
            "ARCH_LIST": ",".join(archs or wheels.ARCH_LIST)}
    for rel, text in wheels.package_files("torch", subs).items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    gpus_json = tmp_path / "gpus.json"
    gpus_json.write_text(json.dumps({"count": 8, "compute_cap": cap, "name": "sim", "fail": None}))
    return {"PYTHONPATH": str(tmp_path), "GPUFLEET_SIM_GPUS": str(gpus_json), "PATH": "/usr/bin:/bin"}


def _run_check(cmd, env, cwd) -> subprocess.CompletedProcess:
    _, dash_c, code, arg = cmd.argv  # venv python here is this interpreter
    return subprocess.run([sys.executable, dash_c, code, arg], env=env, cwd=cwd, capture_output=True, text=True)


def test_check_passes_for_the_target_build(tmp_path):
    proc = _run_check(torch.check_cmd(ctx()), _stand_in_torch(tmp_path, TARGET), tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"torch {TARGET}: CUDA 13.0, capability 12.0, arch list has sm_120"


def test_check_names_every_difference(tmp_path):
    env = _stand_in_torch(tmp_path, "2.9.1+cu130", cap="9.0", archs=["sm_80", "sm_90"])
    proc = _run_check(torch.check_cmd(ctx()), env, tmp_path)
    assert proc.returncode == 1
    out = proc.stdout
    assert f"torch.__version__ is 2.9.1+cu130, stack.toml wants {TARGET}" in out
    assert "torch reports device capability 9.0, the host's GPUs are 12.0" in out
    assert "torch's arch list sm_80 sm_90 lacks sm_120" in out


def test_check_says_when_torch_sees_no_gpu(tmp_path):
    env = _stand_in_torch(tmp_path, TARGET)
    Path(env["GPUFLEET_SIM_GPUS"]).write_text(json.dumps({"fail": "driver"}))
    proc = _run_check(torch.check_cmd(ctx()), env, tmp_path)
    assert proc.returncode == 1 and "torch sees no GPU" in proc.stdout and "12.0" in proc.stdout


def test_needed_check_exit_codes(tmp_path):
    step, _ = planned(answer=report(("torch", TARGET)))
    _, dash_c, code, pins = step.needed.argv
    site = tmp_path / "site"
    (site / f"torch-{TARGET}.dist-info").mkdir(parents=True)
    (site / f"torch-{TARGET}.dist-info/METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {TARGET}\n")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-I", "-c", code, pins], env=env, capture_output=True)
    # -I ignores PYTHONPATH, so this interpreter has no torch at all: still needed
    assert done.returncode == 0
    done = subprocess.run([sys.executable, "-c", code, pins], env=env, capture_output=True, cwd=tmp_path)
    assert done.returncode == 1
    other = json.dumps({"torch": "2.13.0"})
    assert subprocess.run([sys.executable, "-c", code, other], env=env, capture_output=True).returncode == 0


def test_with_a_fleet_lock_the_reason_names_the_lock_and_pip_resolves_with_its_pins():
    from gpufleet.config.lock import FleetLock, LockKernel, LockMeta, LockSglang

    found = FleetLock(lock=LockMeta(format=1, created="2026-03-08T10:00:00Z", canary="gpu1"),
                      sglang=LockSglang(commit="0123abc", patches="a" * 64), sgl_kernel=LockKernel(patches="b" * 64),
                      packages={"torch": TARGET, "triton": "3.6.0", "sglang": "0.5.9"}, path="/locks/l.toml")
    probe = resolving_probe({"torch": report(*CASCADE)})
    c = ctx(probe=probe)
    c.lock = found
    [step] = torch.plan(c)
    assert step.reason.startswith(f"venv has torch 2.9.1+cu130; the lock /locks/l.toml wants {TARGET} ")
    resolve = probe.asked[0][1]
    assert resolve.argv[4] == f"torch=={TARGET}\ntriton==3.6.0"  # constraints: every locked pin but sglang
