"""End to end: rolling upgrades over three simulated hosts, canary first, with a health gate and rollback."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

HOSTS = ["gpu1", "gpu2", "gpu3"]
TOKEN = "hf_rollSECRETtoken1234567890"
FAST = '[defaults.stack.server]\nhealth_timeout = 15\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'
BROKEN_GPU2 = '[hosts.gpu2.stack.server.env]\nSGLANG_SIM_FAIL_HEALTH = "1"\n'


def _torch(fleet, host) -> str:
    return fleet.run_on(host, "/root/venv/bin/python -c 'import torch; print(torch.__version__)'").stdout.strip()


def _health(fleet, host) -> str:
    code = ("import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health', timeout=5).status)")
    return fleet.run_on(host, f"/root/venv/bin/python -c \"{code}\"", check=False).stdout.strip()


def _untouched_state(fleet, host) -> str:
    return fleet.run_on(host, "/root/venv/bin/pip freeze --all; ls /var/lib/gpufleet/snapshots; "
                              "wc -l < /var/lib/gpufleet/audit.log; systemctl show -p MainPID sglang").stdout


def _inventory(fleet, tmp_path: Path, name: str, broken: bool) -> Path:
    """All three hosts, quick health deadlines; optionally gpu2's new unit carries a fault."""
    path = write_inventory(fleet, tmp_path / name, None)
    text = path.read_text().replace("[defaults.stack.pip]", FAST + "[defaults.stack.pip]")
    if broken:
        text = text.replace('[hosts.gpu2]\naddress = "%s"\n' % fleet.host("gpu2").address,
                            '[hosts.gpu2]\naddress = "%s"\n' % fleet.host("gpu2").address + BROKEN_GPU2)
    path.write_text(text)
    return path


@pytest.fixture
def fleet(sim_fleet, tmp_path):
    for h in HOSTS:
        sim_fleet.reset_host(h)
    good = _inventory(sim_fleet, tmp_path, "good.toml", broken=False)
    proc = inv("deploy-model", "--hosts", "all", "--inventory", str(good))  # the old stack, serving
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    yield sim_fleet
    for h in HOSTS:
        sim_fleet.reset_host(h)


def test_roll_over_three_hosts_canary_first_in_order(fleet, tmp_path):
    good = tmp_path / "good.toml"
    proc, summary = inv_json("upgrade", "--hosts", "all", "--inventory", str(good))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert summary["status"] == "completed"
    assert summary["batches"] == [["gpu1"], ["gpu2"], ["gpu3"]]
    results = summary["results"]
    assert [r["host"] for r in results] == HOSTS and [r["outcome"] for r in results] == ["ok"] * 3
    starts = [r["started"] for r in results]
    assert starts == sorted(starts), "hosts must be rolled canary first, then in order"
    for r in results:
        assert "server stopped" in r["steps"] and any(s.startswith("health: ok") for s in r["steps"])
    for h in HOSTS:
        assert _torch(fleet, h) == "2.12.0.dev20260307+cu130" and _health(fleet, h) == "200"
    record = Path(os.environ["GPUFLEET_RUNS_DIR"]) / summary["started"]
    assert json.loads((record / "summary.json").read_text())["status"] == "completed"
    assert all((record / f"{h}.log").read_text() for h in HOSTS)

    # Run again on the converged fleet (a nightly cron): every host is planned read-only, side by side, found on
    # target and on the lock just recorded, and left as it is: no stop, no restart, no snapshot, no audit line.
    before = {h: _untouched_state(fleet, h) for h in HOSTS}
    proc2, again = inv_json("upgrade", "--hosts", "all", "--inventory", str(good))
    assert proc2.returncode == 0, proc2.stderr[-3000:]
    assert again["status"] == "completed" and again["batches"] == [], again
    assert again["lock"] == summary["lock"], again
    lock_name = Path(summary["lock"]).name
    for r in again["results"]:
        assert r["outcome"] == "unchanged" and f"matches lock {lock_name}" in r["steps"], r
    assert {h: _untouched_state(fleet, h) for h in HOSTS} == before

    # gpu2's server stopped by hand: with the fleet lock given, only gpu2 is rolled (started and proven healthy)
    fleet.run_on("gpu2", "systemctl stop sglang")
    proc3, fixed = inv_json("upgrade", "--hosts", "all", "--inventory", str(good), "--lock", summary["lock"])
    assert proc3.returncode == 0, proc3.stderr[-3000:]
    assert fixed["batches"] == [["gpu2"]], fixed
    outcomes = {r["host"]: r for r in fixed["results"]}
    assert outcomes["gpu2"]["outcome"] == "ok" and any(s.startswith("health: ok") for s in outcomes["gpu2"]["steps"])
    assert outcomes["gpu1"]["outcome"] == outcomes["gpu3"]["outcome"] == "unchanged"
    assert _health(fleet, "gpu2") == "200"
    assert _untouched_state(fleet, "gpu1") == before["gpu1"] and _untouched_state(fleet, "gpu3") == before["gpu3"]


def test_failing_host_is_rolled_back_roll_stops_then_resume_completes(fleet, tmp_path):
    broken = _inventory(fleet, tmp_path, "broken.toml", broken=True)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    gpu3_before = _untouched_state(fleet, "gpu3")
    proc, summary = inv_json("upgrade", "--hosts", "all", "--inventory", str(broken), "--hf-token-file", str(token))
    assert proc.returncode == 1
    assert summary["status"] == "stopped"
    outcome = {r["host"]: r for r in summary["results"]}
    assert outcome["gpu1"]["outcome"] == "ok"
    assert outcome["gpu2"]["outcome"] == "rolled-back", outcome["gpu2"]
    assert "healthy again on the old stack" in " ".join(outcome["gpu2"]["steps"])
    assert outcome["gpu3"]["outcome"] == "not-reached"
    assert _torch(fleet, "gpu2") == "2.9.1+cu130" and _health(fleet, "gpu2") == "200"
    assert _untouched_state(fleet, "gpu3") == gpu3_before

    fixed = _inventory(fleet, tmp_path, "fixed.toml", broken=False)
    fixed.replace(broken)  # the cause is fixed in the same inventory file
    proc2, summary2 = inv_json("upgrade", "--resume", "--inventory", str(broken), "--hf-token-file", str(token))
    assert proc2.returncode == 0, proc2.stdout[-4000:]
    assert summary2["status"] == "completed" and summary2["resumed_from"] == summary["started"]
    outcome2 = {r["host"]: r["outcome"] for r in summary2["results"]}
    assert outcome2 == {"gpu1": "ok", "gpu2": "ok", "gpu3": "ok"}
    for h in HOSTS:
        assert _torch(fleet, h) == "2.12.0.dev20260307+cu130" and _health(fleet, h) == "200"

    # The token reached the hosts (mode 0600 env file) but no output, log or record.
    assert fleet.run_on("gpu3", "stat -c %a /etc/gpufleet/sglang.env").stdout.strip() == "600"
    texts = [proc.stdout, proc.stderr, proc2.stdout, proc2.stderr]
    texts += [p.read_text(errors="replace") for p in Path(os.environ["GPUFLEET_RUNS_DIR"]).rglob("*") if p.is_file()]
    for h in HOSTS:
        texts.append(fleet.run_on(h, "cat /var/lib/gpufleet/audit.log; journalctl --no-pager -o cat").stdout)
    assert not [t for t in texts if TOKEN in t]
