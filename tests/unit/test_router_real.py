"""The router client, drain/rejoin and the speed gate against the REAL sglang-router binary and the stand-in server,
both on loopback (started by the test): what the router reads from a worker, the worker API, the API key."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.config.inventory import Host
from gpufleet.config.stack import Stack
from gpufleet.fleet import inflight, speed
from gpufleet.fleet.drain import DrainRefused, RollHooks, SpeedGateFailed
from gpufleet.fleet.roll import HostResult
from gpufleet.fleet.router import RouterClient, RouterError, direct, tunnelled, worker_url
from gpufleet.sim import router as sim_router

PAYLOAD = Path(__file__).resolve().parents[2] / "gpufleet/sim/payload/sglang/python"
MODEL = "/models/Qwen3.5-397B-A17B-NVFP4"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stand_in():
    sys.path.insert(0, str(PAYLOAD))
    try:
        from sglang import launch_server
    finally:
        sys.path.remove(str(PAYLOAD))
    return launch_server


class Worker:
    """One stand-in server (gpufleet/sim/payload's launch_server) on a loopback port, in a thread."""

    def __init__(self, ls, tmp_path: Path):
        os.environ.setdefault("SGLANG_SIM_REQUEST_LOG", str(tmp_path / "requests.jsonl"))
        self.port = free_port()
        args, _ = ls.parse_args(["--model-path", MODEL, "--port", str(self.port)])
        os.environ["SGLANG_SIM_WARMUP"] = "0"
        self.state = ls.State(args, {"sglang": "0.5.8"}, {})
        handler = type("Handler", (ls.Handler,), {"state": self.state})
        self.server = ls._Server(("127.0.0.1", self.port), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def router_argv():
    argv = sim_router.find_router()
    if argv is None:
        reason = ("sglang-router is not installed (scripts/bootstrap installs sglang-router==%s into .venv-router)"
                  % sim_router.ROUTER_VERSION)
        if os.environ.get("GPUFLEET_REQUIRE_ROUTER") or os.environ.get("GPUFLEET_REQUIRE_SIM"):
            pytest.fail(reason)
        pytest.skip(reason)
    assert sim_router.installed_version(argv) in (None, sim_router.ROUTER_VERSION)
    return argv


def start_router(argv, tmp_path, *extra):
    port = free_port()
    log = open(tmp_path / f"router-{port}.log", "wb")
    proc = subprocess.Popen(sim_router.launch_argv(argv, "127.0.0.1", port, free_port()) + list(extra),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        sim_router.wait_ready(f"http://127.0.0.1:{port}", proc.pid)
    except RuntimeError:
        proc.kill()
        raise AssertionError((tmp_path / f"router-{port}.log").read_text()[-2000:]) from None
    return proc, f"http://127.0.0.1:{port}"


@pytest.fixture
def ls():
    module = stand_in()
    module.BEHAVIOUR = module.Behaviour({"tokens_per_second": 1000})
    yield module
    module.BEHAVIOUR = module.Behaviour()


@pytest.fixture
def bed(router_argv, ls, tmp_path):
    """A real router with no workers, two stand-in workers beside it."""
    proc, url = start_router(router_argv, tmp_path)
    workers = [Worker(ls, tmp_path), Worker(ls, tmp_path)]
    yield SimpleNamespace(url=url, client=RouterClient(url, direct(url)), workers=workers, ls=ls)
    for w in workers:
        w.close()
    proc.terminate()
    proc.wait(timeout=20)


def generate(url: str, tokens: int = 20) -> dict:
    body = json.dumps({"text": "tell me a story", "sampling_params": {"max_new_tokens": tokens}}).encode()
    req = urllib.request.Request(f"{url}/generate", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


class LoopbackSession:
    """What drain and the speed gate use of a HostSession: its name, host and direct-tcpip tunnel (a plain socket
    to the loopback port stands in for the SSH channel; both have settimeout/sendall/recv/close)."""

    def __init__(self, name: str, port: int):
        self.name = name
        self.host = Host(name=name, address="127.0.0.1", worker_url=f"http://127.0.0.1:{port}")

    def tunnel(self, port, host="127.0.0.1", *, timeout=None):
        return socket.create_connection((host, port), timeout=timeout)


def stack_for(port: int, **gate) -> Stack:
    stack = Stack()
    return stack.model_copy(update={
        "server": stack.server.model_copy(update={"port": port}),
        "probe": stack.probe.model_copy(update={"throughput_max_tokens": 200}),
        "speed_gate": stack.speed_gate.model_copy(update={"rounds": 1, **gate})})


def test_router_reads_the_stand_in_as_a_real_sglang_worker_list_add_remove(bed):
    client, (w1, w2) = bed.client, bed.workers
    assert client.alive() and client.workers() == []
    job = client.add(w1.url)
    assert job and client.wait_healthy(w1.url, 30, job) >= 0
    client.wait_healthy(w2.url, 30, client.add(w2.url))
    listed = {w.url: w for w in client.workers()}
    assert set(listed) == {w1.url, w2.url} and all(w.healthy for w in listed.values())
    # the router took the model id from the stand-in's /server_info (model_path), as from a real server
    assert {w.model_id for w in listed.values()} == {MODEL}
    assert generate(bed.url)["text"]
    client.remove(listed[w1.url])
    client.wait_gone(w1.url, 30)
    served_before = w1.state.in_flight.served
    for _ in range(4):
        assert generate(bed.url)["text"]
    assert w1.state.in_flight.served == served_before, "a removed worker got requests"
    assert client.find(w1.url) is None and client.find(w2.url).healthy


def test_adding_a_worker_that_never_answers_times_out_naming_it(bed):
    dead = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(RouterError, match="not healthy in the router after 2s"):
        bed.client.wait_healthy(dead, 2, bed.client.add(dead))


def test_api_key_is_sent_as_a_bearer_token_and_its_absence_is_named(router_argv, tmp_path):
    proc, url = start_router(router_argv, tmp_path, "--api-key", "router-secret-123")
    try:
        with pytest.raises(RouterError, match="HTTP 401.*api_key_file or api_key_env"):
            RouterClient(url, direct(url)).workers()
        assert RouterClient(url, direct(url), "router-secret-123").workers() == []
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_the_tunnelled_transport_speaks_to_the_real_router(bed):
    session = LoopbackSession("jump", 0)
    client = RouterClient(bed.url, tunnelled(session, bed.url))
    client.wait_healthy(bed.workers[0].url, 30, client.add(bed.workers[0].url))
    assert [w.url for w in client.workers()] == [bed.workers[0].url]


def test_in_flight_reads_get_load_and_metrics_of_the_stand_in(bed):
    w1 = bed.workers[0]
    session = LoopbackSession("gpu1", w1.port)
    assert inflight.in_flight(session, w1.port) == 0
    thread = threading.Thread(target=generate, args=(w1.url, 3000))
    thread.start()
    while w1.state.in_flight.count == 0:
        time.sleep(0.01)
    assert inflight.in_flight(session, w1.port) == 1
    assert inflight.parse_metrics(bed.ls.metrics_text(w1.state)) == 1
    thread.join()
    assert inflight.in_flight(session, w1.port) == 0


def _hooks(bed, stacks, **kw) -> RollHooks:
    return RollHooks(stacks=stacks, client=bed.client, speed_gate=False, drain_timeout=kw.pop("drain_timeout", 60),
                     on_drain_timeout=kw.pop("on_drain_timeout", "cut"), say=lambda line: None, **kw)


def test_drain_waits_for_requests_in_flight_then_rejoin_waits_for_healthy(bed):
    w1, w2 = bed.workers
    for w in (w1, w2):
        bed.client.wait_healthy(w.url, 30, bed.client.add(w.url))
    session = LoopbackSession("gpu1", w1.port)
    hooks = _hooks(bed, {"gpu1": stack_for(w1.port)})
    hooks.rejoin_timeout = 30
    done = []
    thread = threading.Thread(target=lambda: done.append(generate(w1.url, 1500)))
    thread.start()
    while w1.state.in_flight.count == 0:
        time.sleep(0.01)
    result = HostResult("gpu1")
    hooks.drain(session, result, lambda line: None)
    assert done, "drain returned while a request was still being generated"
    assert result.router["in_flight_at_removal"] == 1 and result.router["cut_requests"] == 0
    assert result.router["state"] == "drained" and result.router["drain_seconds"] > 0
    assert bed.client.find(w1.url) is None
    hooks.rejoin(session, result, lambda line: None)
    assert result.router["state"] == "in" and bed.client.find(w1.url).healthy
    thread.join()


def test_drain_timeout_cuts_with_a_count_of_requests_cut(bed):
    w1, w2 = bed.workers
    for w in (w1, w2):
        bed.client.wait_healthy(w.url, 30, bed.client.add(w.url))
    session = LoopbackSession("gpu1", w1.port)
    hooks = _hooks(bed, {"gpu1": stack_for(w1.port)}, drain_timeout=0.5, on_drain_timeout="cut")
    thread = threading.Thread(target=generate, args=(w1.url, 4000))
    thread.start()
    while w1.state.in_flight.count == 0:
        time.sleep(0.01)
    result = HostResult("gpu1")
    hooks.drain(session, result, lambda line: None)
    assert result.router["cut_requests"] == 1 and "1 cut at the drain timeout" in result.steps[-1]
    thread.join()


def test_the_last_healthy_worker_of_a_model_is_never_drained(bed):
    w1 = bed.workers[0]
    bed.client.wait_healthy(w1.url, 30, bed.client.add(w1.url))
    hooks = _hooks(bed, {"gpu1": stack_for(w1.port)})
    result = HostResult("gpu1")
    with pytest.raises(DrainRefused, match="last healthy worker of model"):
        hooks.drain(LoopbackSession("gpu1", w1.port), result, lambda line: None)
    assert bed.client.find(w1.url).healthy, "the refused drain must leave the worker in"


def test_two_hosts_of_one_batch_cannot_both_drain_the_last_two_workers(bed):
    w1, w2 = bed.workers
    for w in (w1, w2):
        bed.client.wait_healthy(w.url, 30, bed.client.add(w.url))
    stacks = {"gpu1": stack_for(w1.port), "gpu2": stack_for(w2.port)}
    hooks = _hooks(bed, stacks)
    hooks.drain(LoopbackSession("gpu1", w1.port), HostResult("gpu1"), lambda line: None)
    with pytest.raises(DrainRefused):
        hooks.drain(LoopbackSession("gpu2", w2.port), HostResult("gpu2"), lambda line: None)


def test_a_failed_host_stays_out_and_is_named_until_its_rollback_proves_it_healthy(bed):
    w1, w2 = bed.workers
    for w in (w1, w2):
        bed.client.wait_healthy(w.url, 30, bed.client.add(w.url))
    summary = SimpleNamespace(out_of_router=[], lock=None)
    hooks = _hooks(bed, {"gpu1": stack_for(w1.port)}, summary=summary)
    hooks.rejoin_timeout = 30

    def failing(session, result, log):
        hooks.before_stop(session, result, log)
        raise SpeedGateFailed("speed gate on gpu1: slower")

    recovered = []
    procedure, recover = hooks.wrap(failing, lambda s, r, log: recovered.append(s.name))
    session, result = LoopbackSession("gpu1", w1.port), HostResult("gpu1")
    with pytest.raises(SpeedGateFailed):
        procedure(session, result, lambda line: None)
    assert summary.out_of_router == ["gpu1"] and bed.client.find(w1.url) is None
    recover(session, result, lambda line: None)
    assert recovered == ["gpu1"] and summary.out_of_router == [] and bed.client.find(w1.url).healthy


def test_speed_gate_fails_a_stack_much_slower_and_passes_an_equal_one(bed):
    # 1000 -> 400 tokens/s (0.2 s -> 0.5 s a round), best of 3 rounds each side, as the product defends itself:
    # one busy moment on a loaded CI machine once slowed the single "before" round enough to hide a 700 tokens/s
    # stack inside the 10% gate
    w1 = bed.workers[0]
    session, stack = LoopbackSession("gpu1", w1.port), stack_for(w1.port, rounds=3)
    hooks = RollHooks(stacks={"gpu1": stack}, speed_gate=True, say=lambda line: None)
    result = HostResult("gpu1")
    bed.ls.BEHAVIOUR = bed.ls.Behaviour({"tokens_per_second": 1000})
    hooks.before_stop(session, result, lambda line: None)
    assert result.speed["before"]["concurrency"] == 1 and result.speed["before"]["max_tokens"] == 200
    bed.ls.BEHAVIOUR = bed.ls.Behaviour({"tokens_per_second": 400})
    with pytest.raises(SpeedGateFailed, match=r"decode speed fell from .* tokens/s \(\d+\.\d% slower; the gate"):
        hooks.after_health(session, result, lambda line: None)
    assert result.speed["passed"] is False and result.speed["slowdown_percent"] > 10
    bed.ls.BEHAVIOUR = bed.ls.Behaviour({"tokens_per_second": 1000})
    again = HostResult("gpu1")
    hooks.before_stop(session, again, lambda line: None)
    hooks.after_health(session, again, lambda line: None)
    assert again.speed["passed"] is True


def test_speed_measure_runs_the_configured_concurrency_at_once(bed):
    w1 = bed.workers[0]
    found = speed.measure(LoopbackSession("gpu1", w1.port), stack_for(w1.port, concurrency=4), MODEL)
    assert found.concurrency == 4 and found.completion_tokens == 4 * 200


def test_worker_url_is_derived_from_address_and_server_port_unless_given():
    stack = Stack()
    assert worker_url(Host(name="a", address="10.0.0.1"), stack) == "http://10.0.0.1:30000"
    assert worker_url(Host(name="a", address="fd00::1"), stack) == "http://[fd00::1]:30000"
    assert worker_url(Host(name="a", address="10.0.0.1", worker_url="http://w.example:8000/"), stack) == \
        "http://w.example:8000"


def test_the_bootstrap_installs_the_router_version_the_sim_pins():
    text = (Path(__file__).resolve().parents[2] / "scripts/bootstrap").read_text()
    assert f'"sglang-router=={sim_router.ROUTER_VERSION}"' in text


def test_a_host_a_resumed_roll_left_out_is_put_back_once_healthy(bed):
    w1, w2 = bed.workers
    bed.client.wait_healthy(w2.url, 30, bed.client.add(w2.url))
    summary = SimpleNamespace(out_of_router=["gpu1"], lock=None)
    hooks = _hooks(bed, {"gpu1": stack_for(w1.port)}, summary=summary, previous_out=["gpu1"])
    hooks.rejoin_timeout = 30
    procedure, _ = hooks.wrap(lambda session, result, log: hooks.before_stop(session, result, log), None)
    result = HostResult("gpu1")
    procedure(LoopbackSession("gpu1", w1.port), result, lambda line: None)
    assert result.router["state"] == "in" and summary.out_of_router == [] and bed.client.find(w1.url).healthy
