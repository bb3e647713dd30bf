"""End to end, a fault injected for real: a model server that crash-loops under systemd after a deploy roll."""

from __future__ import annotations

import pytest

from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

UNIT = "/etc/systemd/system/sglang.service"
# health_timeout far longer than the test may take: a gate that waited for its deadline would time the test out
SERVER = '[defaults.stack.server]\nhealth_timeout = {timeout}\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'


@pytest.fixture
def fleet(sim_fleet):
    yield sim_fleet
    for name in ("gpu1", "gpu2"):
        sim_fleet.reset_host(name)


def health(fleet, host) -> str:
    code = "import urllib.request as u; print(u.urlopen('http://127.0.0.1:30000/health', timeout=5).status)"
    return fleet.run_on(host, f"cd / && /root/venv/bin/python -c \"{code}\"", check=False).stdout.strip()


def test_a_server_that_crash_loops_fails_the_gate_on_systemds_state_and_the_host_is_rolled_back(fleet, tmp_path):
    good = write_inventory(fleet, tmp_path / "good.toml", ["gpu1", "gpu2"], extra=SERVER.format(timeout=60))
    proc = inv("deploy-model", "--host", "gpu1", "--inventory", str(good))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    unit_before = fleet.run_on("gpu1", f"cat {UNIT}").stdout
    gpu2_before = fleet.run_on("gpu2", f"cat {UNIT}; systemctl is-active sglang", check=False).stdout

    # --tp 16 on 8 GPUs: the stand-in exits at once, as sglang does; Restart=on-failure starts it again and again
    bad = write_inventory(fleet, tmp_path / "bad.toml", ["gpu1", "gpu2"],
                          extra=SERVER.format(timeout=3000) + "[hosts.gpu1.stack.server]\ntp = 16\n")
    proc, summary = inv_json("deploy-model", "--hosts", "gpu1,gpu2", "--inventory", str(bad), timeout=600)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert summary["status"] == "stopped"
    result = {r["host"]: r for r in summary["results"]}
    gpu1 = result["gpu1"]
    assert gpu1["outcome"] == "rolled-back", gpu1
    error = gpu1["error"]
    # failed on systemd's state (exited, restarting), not on the 3000 s deadline, with the server's own words
    assert "systemd" in error and "did not answer 200 within" not in error, error
    assert "--tp 16 needs 16 GPUs" in error, error
    assert "healthy again on the old stack" in " ".join(gpu1["steps"]), gpu1["steps"]
    assert result["gpu2"]["outcome"] == "not-reached"
    assert fleet.run_on("gpu1", f"cat {UNIT}").stdout == unit_before and health(fleet, "gpu1") == "200"
    assert fleet.run_on("gpu2", f"cat {UNIT}; systemctl is-active sglang", check=False).stdout == gpu2_before
    assert fleet.run_on("gpu1", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1
