"""End to end: `inv deploy-model` installs the SGLang unit under real systemd and proves the stand-in server healthy."""

from __future__ import annotations

import pytest

from gpufleet.config.inventory import load_inventory
from gpufleet.config.stack import host_stacks, load_stack
from gpufleet.roles.model_server import exec_args
from tests.sim.helpers import REPO, inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

UNIT = "/etc/systemd/system/sglang.service"
SHARD = "model-00002-of-00003.safetensors"
MODEL = "/models/Qwen3.5-397B-A17B-NVFP4"
# Fast warm-up, a bounded wait, and an argument systemd must keep whole (space, %, $).
FAST = """
[defaults.stack.server]
health_timeout = 60
extra_args = ["--chat-template", "a b%c $HOME"]
[defaults.stack.server.env]
SGLANG_SIM_WARMUP = "1"
"""


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    """The session's fleet; hosts this module deploys to are put back to their first boot afterwards."""
    touched: set[str] = set()
    sim_fleet.touched = touched
    yield sim_fleet
    for name in sorted(touched):
        sim_fleet.reset_host(name)


def inventory(fleet, tmp_path, hosts, extra=""):
    fleet.touched.update(hosts)
    return str(write_inventory(fleet, tmp_path / "hosts.toml", hosts, extra=FAST + extra))


def show(fleet, host, prop):
    return fleet.run_on(host, f"systemctl show -p {prop} --value sglang.service").stdout.strip()


def deploy(path, host, *args):
    return inv_json("deploy-model", "--inventory", path, "--host", host, *args)


def test_deploy_installs_enables_starts_and_proves_health_then_changes_nothing(fleet, tmp_path):
    path = inventory(fleet, tmp_path, ["gpu1"])
    proc, [report] = deploy(path, "gpu1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["ok"] and report["changed"] == [
        f"model-server: install {UNIT}", "model-server: enable sglang.service at boot",
        "model-server: start sglang.service"]
    assert "Paris" in report["health"]["smoke_answer"]
    assert fleet.run_on("gpu1", "systemctl is-enabled sglang.service").stdout.strip() == "enabled"
    assert show(fleet, "gpu1", "ActiveState") == "active"
    # systemd started exactly the argv the role built: quoting survived (space, %, $)
    inv_ = load_inventory(path)
    want = exec_args(inv_.hosts["gpu1"], host_stacks(load_stack(REPO / "stack.toml"), inv_)["gpu1"])
    pid = show(fleet, "gpu1", "MainPID")
    argv = fleet.run_on("gpu1", f"cat /proc/{pid}/cmdline").stdout.split("\0")[:-1]
    assert argv == want and argv[-2:] == ["--chat-template", "a b%c $HOME"]
    started = show(fleet, "gpu1", "ActiveEnterTimestampMonotonic")

    proc, [again] = deploy(path, "gpu1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert again["changed"] == [] and {e["status"] for e in again["entries"]} == {"unchanged"}
    assert "Paris" in again["health"]["smoke_answer"]
    assert show(fleet, "gpu1", "MainPID") == pid
    assert show(fleet, "gpu1", "ActiveEnterTimestampMonotonic") == started


def test_dry_run_shows_the_unit_diff_and_changes_nothing(fleet, tmp_path):
    path = inventory(fleet, tmp_path, ["gpu1"], '[hosts.gpu1.stack.server]\nattention_backend = "flashinfer"\n')
    pid = show(fleet, "gpu1", "MainPID")
    before = fleet.run_on("gpu1", f"sha256sum {UNIT}").stdout
    proc = inv("deploy-model", "--inventory", path, "--host", "gpu1", "--dry-run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "-    --attention-backend triton \\" in out and "+    --attention-backend flashinfer \\" in out
    assert f"[will change] model-server: update {UNIT}" in out
    assert "[will change] model-server: restart sglang.service" in out and "the unit changed" in out
    assert fleet.run_on("gpu1", f"sha256sum {UNIT}").stdout == before and show(fleet, "gpu1", "MainPID") == pid


def test_token_from_a_file_stays_secret_and_its_env_file_is_0600(fleet, tmp_path):
    token = "hf_gpufleetTESTtoken0123456789"
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    path = inventory(fleet, tmp_path, ["gpu1"])
    proc = inv("deploy-model", "--inventory", path, "--host", "gpu1", "--hf-token-file", str(token_file))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert token not in proc.stdout + proc.stderr
    assert "write /etc/gpufleet/sglang.env (HF_TOKEN, mode 0600)" in proc.stdout
    assert "its environment file changed" in proc.stdout  # the env file notifies a restart
    mode = fleet.run_on("gpu1", "stat -c '%a %U' /etc/gpufleet/sglang.env").stdout.split()
    assert mode == ["600", "root"]
    assert fleet.run_on("gpu1", "cat /etc/gpufleet/sglang.env").stdout.splitlines()[-1] == f"HF_TOKEN='{token}'"
    pid = show(fleet, "gpu1", "MainPID")
    assert f"HF_TOKEN={token}" in fleet.run_on("gpu1", f"tr '\\0' '\\n' < /proc/{pid}/environ").stdout
    audit = fleet.run_on("gpu1", "cat /var/lib/gpufleet/audit.log; journalctl --no-pager -q | tail -n 500").stdout
    assert token not in audit
    proc, [again] = deploy(path, "gpu1", "--hf-token-file", str(token_file))
    assert again["changed"] == [] and token not in proc.stdout + proc.stderr


def test_a_stack_change_under_the_server_restarts_it_once(fleet, tmp_path):
    path = inventory(fleet, tmp_path, ["gpu1"])
    pid = show(fleet, "gpu1", "MainPID")
    fleet.run_on("gpu1", "git -C /root/sglang-main -c user.email=t@t -c user.name=t commit -q --allow-empty -m edit")
    proc, [report] = deploy(path, "gpu1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report["changed"] == ["model-server: restart sglang.service"]
    [restart] = [e for e in report["entries"] if e["kind"] == "step"]
    assert restart["reason"].startswith("the stack under it changed: sglang checkout ")
    assert show(fleet, "gpu1", "MainPID") != pid and "Paris" in report["health"]["smoke_answer"]
    proc, [again] = deploy(path, "gpu1")
    assert again["changed"] == []


def test_missing_shard_stops_deploy_and_changes_nothing(fleet, tmp_path):
    path = inventory(fleet, tmp_path, ["gpu2"])
    fleet.run_on("gpu2", f"mv {MODEL}/{SHARD} /root/{SHARD}")
    try:
        proc, [report] = deploy(path, "gpu2")
    finally:
        fleet.run_on("gpu2", f"mv /root/{SHARD} {MODEL}/{SHARD}")
    assert proc.returncode == 1
    assert not report["ok"] and SHARD in report["error"] and "missing" in report["error"]
    assert report["changed"] == [] and report["snapshot"] is None
    assert fleet.run_on("gpu2", f"test -e {UNIT}", check=False).returncode == 1


def test_server_that_exits_fails_the_gate_with_its_journal(fleet, tmp_path):
    path = inventory(fleet, tmp_path, ["gpu3"], "[hosts.gpu3.stack.server]\ntp = 16\n")
    proc, [report] = deploy(path, "gpu3")
    assert proc.returncode == 1
    assert not report["ok"] and report["outcome"] == "failed"
    error = report["error"]
    assert "model server not healthy" in error and "journal" in error
    assert "--tp 16 needs 16 GPUs" in error  # the stand-in's own message, from journalctl
