"""The probe's remote side without a host: commands, the candidate gate, one candidate over a fake session."""

from __future__ import annotations

import json

from gpufleet.fleet import health
from gpufleet.probe import on_host
from gpufleet.fleet.health import HttpResponse
from gpufleet.config.inventory import Host
from gpufleet.probe.candidates import Candidate
from gpufleet.probe.on_host import CandidateGate, HostProber, port_free_cmd, start_cmd, stop_cmd
from gpufleet.config.stack import Stack, stack_for_host
from gpufleet.testing.session import FakeSession

HOST = Host(name="gpu1", address="10.0.0.1")


def test_start_cmd_keeps_secrets_in_the_env_file_and_dollars_literal():
    cmd = start_cmd("gpufleet-probe-ab-1.service", ["/v/bin/python", "-m", "x", "a $HOME b", "$X"],
                    {"CUDA_HOME": "/usr/local/cuda"}, "/etc/gpufleet/sglang.env")
    argv = list(cmd.argv)
    assert argv[:4] == ["systemd-run", "--quiet", "--unit=gpufleet-probe-ab-1.service", "--collect"]
    assert "--property=EnvironmentFile=-/etc/gpufleet/sglang.env" in argv
    assert "--setenv=CUDA_HOME=/usr/local/cuda" in argv and not any("Restart" in a for a in argv)
    assert argv[argv.index("--") + 1:] == ["/v/bin/python", "-m", "x", "a $$HOME b", "$$X"]
    assert "HF_TOKEN" not in cmd.display()


def test_stop_and_port_commands_are_plain_argv():
    assert stop_cmd("u.service").argv[-1] == "u.service" and "MainPID" in stop_cmd("u").argv[2]
    assert list(port_free_cmd("127.0.0.1", 30000, 5).argv[-3:]) == ["127.0.0.1", "30000", "5"]


def test_candidate_gate_watches_the_transient_unit():
    session = FakeSession(host=HOST)
    gate = CandidateGate(session, Stack(), probe_unit="gpufleet-probe-ab-1.service")
    assert gate.unit == "gpufleet-probe-ab-1.service" and gate.address == "127.0.0.1"


def probe_session() -> FakeSession:
    """Answers the probe's commands: unit state active, journal on demand; records every command."""
    return FakeSession({"venv python": (0, "3.12\n"),
                        "unit state": (0, "ActiveState=active\nSubState=running\nNRestarts=0\nMainPID=7\nAge=0\n"),
                        "journal": (0, "Dec 03 01:51:53 gpu1 x[1]: RuntimeError: boom\n")}, host=HOST)


def chat(text: str, tokens: int) -> HttpResponse:
    body = {"choices": [{"message": {"content": text}}], "usage": {"completion_tokens": tokens}}
    return HttpResponse(200, "OK", {}, json.dumps(body).encode())


def test_one_candidate_is_started_gated_asked_timed_and_stopped(monkeypatch):
    host_stack = stack_for_host(Stack(), {"probe": {"throughput_max_tokens": 50}}, source="x", host="gpu1")
    replies = {"capital": chat("Paris", 1), "17 + 25": chat("42", 1), "apple": chat("elppa", 1)}
    asked = []

    def fake_request(session, port, method, path, payload=None, *, address, timeout):
        if path == "/health":
            return HttpResponse(200, "OK")
        prompt = payload["messages"][0]["content"]
        asked.append(payload)
        return next((r for k, r in replies.items() if k in prompt), chat("w " * 50, 50))

    monkeypatch.setattr(health, "request", fake_request)
    session = probe_session()
    out = HostProber(session, host_stack, Stack(), "abcdef123456").try_candidate(
        3, Candidate("triton", "flashinfer_cutlass", "flashinfer_cutlass", None))
    assert out.outcome == "correct" and out.unit == "gpufleet-probe-abcdef12-3.service"
    assert out.tokens_per_second and out.tokens_per_second > 0 and out.load_seconds is not None
    assert [a["answer"] for a in out.answers] == ["Paris", "42", "elppa"]
    assert asked[-1]["max_tokens"] == 50 and asked[-1]["ignore_eos"] is True
    steps = [s for s, _ in session.calls]
    assert steps[0] == "venv python" and steps[1] == "start gpufleet-probe-abcdef12-3.service"
    assert steps[-2:] == ["stop gpufleet-probe-abcdef12-3.service", "port free"]
    started = list(session.calls[1][1].argv)
    assert started[started.index("--fp4-gemm-backend") + 1] == "flashinfer_cutlass"


def test_a_candidate_that_dies_is_recorded_with_its_journal_and_stopped(monkeypatch):
    def refused(*args, **kwargs):
        raise health.HttpError("empty response")

    monkeypatch.setattr(health, "request", refused)
    session = probe_session().on("unit state", (0, "ActiveState=failed\nSubState=failed\n"))  # it dies
    out = HostProber(session, Stack(), Stack(), "tok").try_candidate(1, Candidate("a", "m", "f", None))
    assert out.outcome == "failed" and out.reason == "RuntimeError: boom"
    assert [s for s, _ in session.calls][-2:] == ["stop gpufleet-probe-tok-1.service", "port free"]
    assert on_host.probe_unit("tok", 1) == "gpufleet-probe-tok-1.service"
