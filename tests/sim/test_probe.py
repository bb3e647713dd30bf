"""End to end: `inv probe-backends` tries backend sets on a simulated host whose stand-in server is told which sets
give wrong answers or fail to start, picks the fastest correct one, and leaves the host serving."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.config.inventory import load_inventory
from gpufleet.config.stack import host_stacks, load_stack
from gpufleet.roles.model_server import exec_args
from tests.sim.helpers import REPO, inv_json, write_inventory

pytestmark = pytest.mark.sim

UNIT = "/etc/systemd/system/sglang.service"
FAST = """
[defaults.stack.server]
health_timeout = 60
[defaults.stack.server.env]
SGLANG_SIM_WARMUP = "1"
[defaults.stack.probe]
health_timeout = 30
throughput_max_tokens = 150
"""
# The production set (triton/cudnn/NEXTN) is correct but slow; the fastest set of all (flashinfer attention) gives
# garbage; cudnn without speculative decoding dies at start; cutlass FP4 without it is the fastest correct one.
BEHAVIOUR = {
    "default": {"tokens_per_second": 100, "load_seconds": 1},
    "rules": [
        {"when": {"attention_backend": "flashinfer"}, "wrong_answers": True, "tokens_per_second": 800},
        {"when": {"attention_backend": "triton", "fp4_gemm_backend": "flashinfer_cudnn",
                  "speculative_algorithm": "none"},
         "fail_start": "CUDNN_STATUS_NOT_SUPPORTED: no engine for this FP4 GEMM on sm_120"},
        {"when": {"fp4_gemm_backend": "flashinfer_cutlass", "speculative_algorithm": "none"},
         "tokens_per_second": 400},
        {"when": {"fp4_gemm_backend": "flashinfer_cutlass", "speculative_algorithm": "NEXTN"},
         "tokens_per_second": 200},
    ],
}
BEST = "triton/flashinfer_cutlass/flashinfer_cutlass/spec off"


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    """The session's fleet; hosts this module probes are put back to their first boot afterwards."""
    touched: set[str] = set()
    sim_fleet.touched = touched
    yield sim_fleet
    for name in sorted(touched):
        sim_fleet.set_backends(name, None)
        sim_fleet.reset_host(name)


def deployed(fleet, tmp_path, host, extra=""):
    """An inventory for host with the fast settings, the model server deployed and healthy on it."""
    fleet.touched.add(host)
    path = write_inventory(fleet, tmp_path / "hosts.toml", [host], extra=FAST + extra)
    proc, [report] = inv_json("deploy-model", "--inventory", str(path), "--host", host)
    assert proc.returncode == 0 and report["ok"], proc.stdout + proc.stderr
    return path


def show(fleet, host, prop):
    return fleet.run_on(host, f"systemctl show -p {prop} --value sglang.service").stdout.strip()


def running_argv(fleet, host):
    pid = show(fleet, host, "MainPID")
    return fleet.run_on(host, f"cat /proc/{pid}/cmdline").stdout.split("\0")[:-1]


def probe_units(fleet, host):
    return fleet.run_on(host, "systemctl list-units --all --plain --no-legend 'gpufleet-probe-*'").stdout.strip()


def by_label(report):
    return {r["label"]: r for r in report["results"]}


def test_probe_picks_the_fastest_correct_set_and_puts_the_original_server_back(fleet, tmp_path):
    path = deployed(fleet, tmp_path, "gpu1")
    before = {"argv": running_argv(fleet, "gpu1"), "pid": show(fleet, "gpu1", "MainPID"),
              "unit": fleet.run_on("gpu1", f"sha256sum {UNIT}").stdout, "inventory": path.read_text()}
    fleet.set_backends("gpu1", BEHAVIOUR)

    proc, [report] = inv_json("probe-backends", "--inventory", str(path), "--host", "gpu1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 candidate backend set(s)" in proc.stderr
    results = by_label(report)
    assert len(results) == 8 and report["ok"] and report["status"] == "completed"
    assert report["chosen"]["label"] == BEST == results[BEST]["label"]
    # Measured, not configured: the wrong sets really were the fastest, the chosen one beat the other correct ones.
    wrong = [r for r in results.values() if r["outcome"] == "wrong"]
    assert len(wrong) == 4 and all(r["candidate"]["attention_backend"] == "flashinfer" for r in wrong)
    assert max(r["tokens_per_second"] for r in wrong) > results[BEST]["tokens_per_second"]
    correct = [r for r in results.values() if r["outcome"] == "correct"]
    assert len(correct) == 3 and max(correct, key=lambda r: r["tokens_per_second"])["label"] == BEST
    assert results[BEST]["tokens_per_second"] > 1.3 * results[
        "triton/flashinfer_cutlass/flashinfer_cutlass/spec NEXTN"]["tokens_per_second"]
    assert all(r["load_seconds"] >= 1.0 for r in correct)
    failed = results["triton/flashinfer_cutlass/flashinfer_cudnn/spec off"]
    assert failed["outcome"] == "failed" and "CUDNN_STATUS_NOT_SUPPORTED" in failed["reason"]
    assert "'Paris' not in" in wrong[0]["reason"]

    # The original unit is back: same file, same argv, a new process, healthy; no probe unit left; nothing written.
    assert report["applied"] is None and "Paris" in report["health"]["smoke_answer"]
    assert show(fleet, "gpu1", "ActiveState") == "active" and show(fleet, "gpu1", "MainPID") != before["pid"]
    assert running_argv(fleet, "gpu1") == before["argv"]
    assert fleet.run_on("gpu1", f"sha256sum {UNIT}").stdout == before["unit"]
    assert probe_units(fleet, "gpu1") == "" and path.read_text() == before["inventory"]
    assert fleet.run_on("gpu1", "test -d /var/lib/gpufleet/lock", check=False).returncode == 1
    record = json.loads(Path(report["record"]).read_text())
    assert record["chosen"]["label"] == BEST and len(record["results"]) == 8


def test_apply_writes_the_choice_into_the_inventory_and_redeploys(fleet, tmp_path):
    comment = "# gpu2: the box in rack 7 (keep this comment)"
    path = deployed(fleet, tmp_path, "gpu2")
    text = path.read_text().replace('[hosts.gpu2]\n', f'[hosts.gpu2]\n{comment}\n')
    path.write_text(text)
    fleet.set_backends("gpu2", BEHAVIOUR)

    proc, [report] = inv_json("probe-backends", "--inventory", str(path), "--host", "gpu2", "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["ok"] and report["chosen"]["label"] == BEST
    assert report["applied"] == {"fp4_gemm_backend": "flashinfer_cutlass", "speculative.algorithm": "none"}
    new_text = path.read_text()
    assert comment in new_text
    assert set(text.splitlines()) <= set(new_text.splitlines())  # only added lines: every old one is still there
    inventory = load_inventory(path)
    server = inventory.hosts["gpu2"].stack_overrides["server"]
    assert server["fp4_gemm_backend"] == "flashinfer_cutlass" and server["speculative"] == {"algorithm": "none"}

    # Redeployed through deploy-model: the unit on the host runs exactly the argv of the new inventory.
    want = exec_args(inventory.hosts["gpu2"], host_stacks(load_stack(REPO / "stack.toml"), inventory)["gpu2"])
    argv = running_argv(fleet, "gpu2")
    assert argv == want and argv[argv.index("--fp4-gemm-backend") + 1] == "flashinfer_cutlass"
    assert argv[argv.index("--attention-backend") + 1] == "triton" and "--speculative-algorithm" not in argv
    assert show(fleet, "gpu2", "ActiveState") == "active" and "Paris" in report["health"]["smoke_answer"]
    assert probe_units(fleet, "gpu2") == ""

    # The host is now on the chosen set: a dry run marks it as production.
    proc, [listed] = inv_json("probe-backends", "--inventory", str(path), "--host", "gpu2", "--dry-run")
    [now] = [c for c in listed["candidates"] if c["production"]]
    assert now["label"] == BEST


def test_apply_with_no_correct_set_changes_nothing_and_fails(fleet, tmp_path):
    extra = ('[hosts.gpu3.stack.probe]\nattention_backends = ["flashinfer"]\nfp4_gemm_backends = ["flashinfer_cudnn"]\n')
    path = deployed(fleet, tmp_path, "gpu3")
    path.write_text(path.read_text() + extra)
    before, argv = path.read_text(), running_argv(fleet, "gpu3")
    fleet.set_backends("gpu3", BEHAVIOUR)

    proc, [report] = inv_json("probe-backends", "--inventory", str(path), "--host", "gpu3", "--apply")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert not report["ok"] and report["chosen"] is None and report["applied"] is None
    assert [r["outcome"] for r in report["results"]] == ["wrong", "wrong"]
    assert "no candidate gave every known answer" in proc.stderr
    assert path.read_text() == before
    assert show(fleet, "gpu3", "ActiveState") == "active" and running_argv(fleet, "gpu3") == argv


def test_ctrl_c_mid_probe_stops_the_candidate_and_puts_the_original_server_back(fleet, tmp_path):
    path = deployed(fleet, tmp_path, "gpu1")
    argv = running_argv(fleet, "gpu1")
    fleet.set_backends("gpu1", {"default": {"tokens_per_second": 100, "load_seconds": 3}})
    proc = subprocess.Popen([sys.executable, "-m", "invoke", "probe-backends", "--inventory", str(path), "--host",
                             "gpu1"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        for line in proc.stdout:  # interrupt while candidate 2 loads: its unit is running, production is down
            seen.append(line)
            if "candidate 2/8: triton" in line:
                time.sleep(1.0)
                proc.send_signal(signal.SIGINT)
                break
        rest, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    out = "".join(seen) + rest
    assert proc.returncode == 130, out
    assert "starting sglang.service again" in out and "interrupted" in out
    assert show(fleet, "gpu1", "ActiveState") == "active" and running_argv(fleet, "gpu1") == argv
    assert probe_units(fleet, "gpu1") == ""
    assert fleet.run_on("gpu1", "test -d /var/lib/gpufleet/lock", check=False).returncode == 1
    record = sorted(Path(os.environ["GPUFLEET_RUNS_DIR"]).glob("*-probe-gpu1/probe.json"))[-1]
    assert json.loads(record.read_text())["status"] == "interrupted"
