"""The health gate: HTTP parsing, one exchange over a channel-like socket, polling with backoff, failing with the journal."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import paramiko
import pytest

from gpufleet.fleet import health
from gpufleet.fleet.health import Gate, HealthError, HttpError, HttpResponse, parse_response
from gpufleet.config.stack import Stack, stack_for_host
from gpufleet.testing.session import FakeSession


# ---- HTTP ---------------------------------------------------------------------------------------------------------

def test_request_bytes():
    raw = health.build_request("POST", "/v1/chat/completions", "127.0.0.1:30000", {"a": 1})
    head, body = raw.split(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"POST /v1/chat/completions HTTP/1.1"
    assert b"Host: 127.0.0.1:30000" in head and b"Connection: close" in head and b"Content-Length: 8" in head
    assert body == b'{"a": 1}'
    assert b"Content-Length" not in health.build_request("GET", "/health", "h", None)


def test_parse_content_length_and_partial_reads():
    data = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 12\r\n\r\n{\"ok\": true}"
    assert parse_response(data[:20], eof=False) is None
    assert parse_response(data[:-3], eof=False) is None
    resp = parse_response(data, eof=False)
    assert resp.status == 200 and resp.headers["content-type"] == "application/json" and resp.json() == {"ok": True}
    with pytest.raises(HttpError, match="after 5 of 12"):
        parse_response(data[:data.index(b"\r\n\r\n") + 9], eof=True)


def test_parse_chunked_and_close_delimited_and_empty():
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nPari\r\n1;x=y\r\ns\r\n0\r\n\r\n"
    assert parse_response(chunked[:-7], eof=False) is None
    assert parse_response(chunked, eof=False).body == b"Paris"
    close = b"HTTP/1.0 503 Service Unavailable\r\nServer: x\r\n\r\nwarming up"
    assert parse_response(close, eof=False) is None
    resp = parse_response(close, eof=True)
    assert (resp.status, resp.reason, resp.body) == (503, "Service Unavailable", b"warming up")
    assert parse_response(b"HTTP/1.1 204 No Content\r\n\r\n", eof=False).body == b""
    for bad in (b"", b"SSH-2.0-OpenSSH\r\n\r\n", b"HTTP/1.1 200 OK\r\nContent-Length: 3"):
        with pytest.raises(HttpError):
            parse_response(bad, eof=True)


def test_answer_text():
    body = {"choices": [{"message": {"content": " Paris. ", "reasoning_content": None}}]}
    assert health.answer_text(HttpResponse(200, "OK", {}, json.dumps(body).encode())) == "Paris."
    think = {"choices": [{"message": {"content": None, "reasoning_content": "It is Paris"}}]}
    assert health.answer_text(HttpResponse(200, "OK", {}, json.dumps(think).encode())) == "It is Paris"
    with pytest.raises(HttpError):
        health.answer_text(HttpResponse(200, "OK", {}, b"{}"))


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        body = b'{"status": "ok"}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        got = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        # chunked, as uvicorn streams
        text = json.dumps({"echo": got}).encode()
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in (text[:5], text[5:]):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.write(b"0\r\n\r\n")


def test_request_over_a_channel_like_socket():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        session = FakeSession()  # its tunnel() is a plain socket to the address
        port = server.server_address[1]
        assert health.request(session, port, "GET", "/health").json() == {"status": "ok"}
        assert health.request(session, port, "POST", "/x", {"q": "é"}).json() == {"echo": {"q": "é"}}
        assert session.tunnels == [("127.0.0.1", port)] * 2
    finally:
        server.shutdown()
        server.server_close()


# ---- the gate -----------------------------------------------------------------------------------------------------

def unit_session(states) -> FakeSession:
    """Answers `unit state` from a list of states (the last repeats) and `journal` with a fixed tail."""
    return FakeSession({"unit state": [(0, text) for text in states]},
                       default=(0, "Dec 02 gpu1 sglang[42]: RuntimeError: --tp 8 needs 8 GPUs\n"))


def state(active="active", restarts=0, pid=42, age=5, sub="running"):
    return f"ActiveState={active}\nSubState={sub}\nNRestarts={restarts}\nMainPID={pid}\nAge={age}\n"


class Clock:
    def __init__(self):
        self.now, self.sleeps = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def gate(session, monkeypatch, answers, **server):
    """A Gate whose HTTP requests answer from `answers` (a status, a response or an exception each)."""
    queue = list(answers)
    asked = []

    def fake_request(sess, port, method, path, payload=None, *, address, timeout):
        asked.append((method, path, address, port, payload))
        a = queue.pop(0) if len(queue) > 1 else queue[0]
        if isinstance(a, BaseException):
            raise a
        return a if isinstance(a, HttpResponse) else HttpResponse(a, "", {}, b"")
    monkeypatch.setattr(health, "request", fake_request)
    clock = Clock()
    stack = stack_for_host(Stack(), {"server": {"health_timeout": 60.0, **server}}, source="h", host="gpu1")
    g = Gate(session, stack, clock=clock, sleep=clock.sleep)
    g.asked = asked
    return g, clock


def chat(text: str) -> HttpResponse:
    return HttpResponse(200, "OK", {}, json.dumps({"choices": [{"message": {"content": text}}]}).encode())


def test_waits_with_backoff_then_smoke_passes(monkeypatch):
    refused = paramiko.ChannelException(2, "Connect failed")
    g, clock = gate(unit_session([state()]), monkeypatch, [refused, 503, 503, 503, 200])
    assert g.wait_healthy() == 15.0
    assert clock.sleeps == [1.0, 2.0, 4.0, 8.0]
    monkeypatch.setattr(health, "request", lambda *a, **k: chat("The capital of France is Paris."))
    assert g.run("qwen") == {"health_seconds": 0.0, "smoke_answer": "The capital of France is Paris."}


def test_smoke_payload_and_address(monkeypatch):
    g, _ = gate(unit_session([state()]), monkeypatch, [200, chat("paris")], host="10.0.0.5", port=31000)
    assert g.run("qwen")["smoke_answer"] == "paris"
    (_, _, addr, port, _), (method, path, _, _, payload) = g.asked
    assert (addr, port, method, path) == ("10.0.0.5", 31000, "POST", "/v1/chat/completions")
    assert payload["model"] == "qwen" and payload["messages"][0]["content"].startswith("What is the capital")


def test_deadline_counts_from_the_service_start_and_shows_the_journal(monkeypatch):
    session = unit_session([state(age=50)])
    g, clock = gate(session, monkeypatch, [503])
    with pytest.raises(HealthError) as err:
        g.wait_healthy()
    msg = str(err.value)
    assert "within 30s" in msg and "HTTP 503" in msg  # 60 s budget, 50 s gone: at least MIN_WAIT is left
    assert "--tp 8 needs 8 GPUs" in msg and session.steps[-1] == "journal"
    assert clock.now <= 30


def test_restart_by_systemd_fails_early(monkeypatch):
    session = unit_session([state(), state(restarts=1, pid=77)])
    g, clock = gate(session, monkeypatch, [paramiko.ChannelException(2, "Connect failed")])
    with pytest.raises(HealthError, match="systemd restarted it"):
        g.wait_healthy()
    assert clock.sleeps == []


def test_stopped_unit_fails_at_once(monkeypatch):
    g, _ = gate(unit_session([state(active="failed")]), monkeypatch, [200])
    with pytest.raises(HealthError, match="is failed"):
        g.wait_healthy()


def test_wrong_smoke_answer_fails_with_the_answer(monkeypatch):
    g, _ = gate(unit_session([state()]), monkeypatch, [200, chat("!!!!!!")])
    with pytest.raises(HealthError) as err:
        g.run("qwen")
    assert "'!!!!!!'" in str(err.value) and "'Paris'" in str(err.value)


def test_smoke_retries_503_then_gives_up(monkeypatch):
    g, clock = gate(unit_session([state()]), monkeypatch, [503])
    with pytest.raises(HealthError, match="smoke generation failed: HTTP 503"):
        g.smoke("qwen")
    assert clock.sleeps == [2.0, 4.0, 6.0]


def test_unit_state_parsing_and_backoff():
    s = health.parse_unit_state(state(restarts=3, pid=9, age=12))
    assert (s.active, s.restarts, s.pid, s.age) == ("active", 3, 9, 12.0)
    assert health.parse_unit_state("garbage").active == "unknown"
    delays, d = [], 1.0
    for _ in range(6):
        delays.append(d)
        d = health.next_delay(d)
    assert delays == [1.0, 2.0, 4.0, 8.0, 15.0, 15.0]


def test_a_server_waiting_to_be_restarted_fails_at_once_not_after_restart_sec(monkeypatch):
    # Restart=on-failure with RestartSec: between exit and restart systemd says activating (auto-restart)
    g, clock = gate(unit_session([state(active="activating", sub="auto-restart", restarts=2)]), monkeypatch, [200])
    with pytest.raises(HealthError, match="exited and systemd is about to restart it"):
        g.wait_healthy()
    assert clock.sleeps == []


def test_a_crash_seen_while_waiting_fails_on_the_next_look(monkeypatch):
    session = unit_session([state(active="activating", sub="start"), state(active="activating", sub="auto-restart")])
    g, clock = gate(session, monkeypatch, [paramiko.ChannelException(2, "Connect failed")])
    with pytest.raises(HealthError, match="about to restart it"):
        g.wait_healthy()
    assert clock.sleeps == []
