"""End to end behind the real sglang-router on the control node: a steady stream of requests through it while a
3-host upgrade rolls (each host drained, upgraded, re-added) fails none and reaches no drained host; a new stack 30 %
slower fails the speed gate on the canary, which is rolled back and re-added, and the roll stops."""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from gpufleet.fleet.router import RouterClient, direct
from gpufleet.sim import router as sim_router
from gpufleet.sim.layout import CONTROL_ADDR
from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

HOSTS = ["gpu1", "gpu2", "gpu3"]
TARGET_TORCH = "2.12.0.dev20260307+cu130"
FAST = '[defaults.stack.server]\nhealth_timeout = 15\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'
REQUEST_LOG = "/var/log/gpufleet-sim/requests.jsonl"


@pytest.fixture
def bed(sim_fleet, tmp_path):
    """The three hosts on the old stack, serving, each a healthy worker of the fleet's real router."""
    router = sim_router.SimRouter(sim_fleet.run_dir)
    if not router.start():
        pytest.fail("sglang-router is not installed: scripts/bootstrap installs sglang-router=="
                    f"{sim_router.ROUTER_VERSION} into .venv-router")
    client = RouterClient(router.url, direct(router.url))
    for w in client.workers():  # a clean router: workers an earlier test left are removed
        client.remove(w)
        client.wait_gone(w.url, 30)
    for h in HOSTS:
        sim_fleet.reset_host(h)
    path = write_inventory(sim_fleet, tmp_path / "hosts.toml", None)
    text = path.read_text().replace("[defaults.stack.pip]", FAST + "[defaults.stack.pip]")
    path.write_text(text + f'\n[router]\nadmin_url = "{router.url}"\ndrain_timeout = 60\n')
    proc = inv("deploy-model", "--hosts", "all", "--inventory", str(path), "--no-speed-gate")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for h in HOSTS:
        url = f"http://{sim_fleet.host(h).address}:30000"
        client.wait_healthy(url, 60, client.add(url))
    yield sim_fleet, path, client, router
    for w in client.workers():
        client.remove(w)
    for h in HOSTS:
        sim_fleet.reset_host(h)


class Load:
    """A steady stream of generations through the router from a few clients, every failure kept."""

    def __init__(self, url: str, clients: int = 4):
        self.url, self.stop, self.ok, self.failed = url, threading.Event(), 0, []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.run, daemon=True) for _ in range(clients)]

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def run(self):
        body = json.dumps({"text": "Tell me about the history of printing.",
                           "sampling_params": {"max_new_tokens": 150}}).encode()
        while not self.stop.is_set():
            req = urllib.request.Request(f"{self.url}/generate", body, {"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    json.loads(resp.read())["text"]
                with self.lock:
                    self.ok += 1
            except (OSError, ValueError, KeyError) as exc:
                detail = exc.read()[:200] if isinstance(exc, urllib.error.HTTPError) else b""
                with self.lock:
                    self.failed.append(f"{time.time():.3f} {exc} {detail!r}")


def _served(fleet, host: str) -> list[dict]:
    out = fleet.run_on(host, f"cat {REQUEST_LOG} 2>/dev/null || true").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def _epoch(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()


def _torch(fleet, host) -> str:
    return fleet.run_on(host, "/root/venv/bin/python -c 'import torch; print(torch.__version__)'").stdout.strip()


def test_a_roll_behind_the_router_fails_no_request_and_sends_none_to_a_drained_host(bed):
    fleet, path, client, router = bed
    with Load(router.url) as load:
        while load.ok < 20:  # the stream flows through all three workers before the roll starts
            time.sleep(0.2)
        proc, summary = inv_json("upgrade", "--hosts", "all", "--inventory", str(path), timeout=1800)
        during = load.ok
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert load.failed == [], f"{len(load.failed)} of {load.ok + len(load.failed)} requests failed: {load.failed[:5]}"
    assert during > 20
    assert summary["status"] == "completed" and summary["out_of_router"] == []
    for result in summary["results"]:
        host, r = result["host"], result["router"]
        assert result["outcome"] == "ok" and _torch(fleet, host) == TARGET_TORCH
        assert r["taken_out"] and r["state"] == "in" and isinstance(r["drain_seconds"], (int, float))
        assert any(s.startswith("router: drained in") for s in result["steps"])
        assert result["speed"]["passed"] is True and result["speed"]["before"] and result["speed"]["after"]
        # drained: from the moment its server was idle after the removal until the roll asked the router to add it
        drained, back = _epoch(r["drained_at"]), _epoch(r["readded_at"])
        from_router = [e for e in _served(fleet, host) if e["client"] == CONTROL_ADDR]
        reached = [e for e in from_router if drained <= e["began"] <= back]
        assert reached == [], f"{host} got {len(reached)} request(s) from the router while drained: {r} {reached[:3]}"
        assert any(e["began"] > back for e in from_router), f"{host} got no traffic after it was re-added"
    assert all(w.healthy for w in client.workers()) and len(client.workers()) == 3
    record = json.loads((Path(os.environ["GPUFLEET_RUNS_DIR"]) / summary["started"] / "summary.json").read_text())
    assert [res["router"]["drain_seconds"] for res in record["results"]] == [
        res["router"]["drain_seconds"] for res in summary["results"]]
    status, rows = inv_json("status", "--inventory", str(path))
    assert all(row["cells"]["router"]["current"] == "in" for row in rows), rows


def test_a_stack_30_percent_slower_fails_the_canary_which_is_rolled_back_and_re_added(bed):
    fleet, path, client, router = bed
    # the new stack (its torch) decodes at 700 tokens/s where the old one does 1000
    fleet.set_backends("gpu1", {"default": {}, "rules": [{"when": {"torch": TARGET_TORCH}, "tokens_per_second": 700}]})
    # this time the router's admin API is reached through an SSH tunnel over gpu3 (the router as gpu3 sees it)
    tunnelled = path.with_name("via.toml")
    tunnelled.write_text(path.read_text().replace("drain_timeout = 60\n", 'drain_timeout = 60\nvia = "gpu3"\n'))
    assert 'via = "gpu3"' in tunnelled.read_text()
    with Load(router.url) as load:
        while load.ok < 10:
            time.sleep(0.2)
        proc, summary = inv_json("upgrade", "--hosts", "all", "--inventory", str(tunnelled), timeout=1800)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert load.failed == [], load.failed[:5]
    assert summary["status"] == "stopped"
    canary, second, third = summary["results"]
    assert canary["outcome"] == "rolled-back" and "speed gate on gpu1" in canary["error"]
    assert canary["speed"]["passed"] is False and canary["speed"]["slowdown_percent"] > 10
    assert canary["speed"]["before"]["tokens_per_second"] > canary["speed"]["after"]["tokens_per_second"]
    assert canary["router"]["state"] == "in" and summary["out_of_router"] == []
    assert client.find(f"http://{fleet.host('gpu1').address}:30000").healthy
    assert _torch(fleet, "gpu1") != TARGET_TORCH
    assert second["outcome"] == third["outcome"] == "not-reached"
    assert summary["lock"] is None
