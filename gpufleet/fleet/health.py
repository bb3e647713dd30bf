"""Health gate: /health and a smoke generation, spoken over the SSH connection (direct-tcpip), journal on failure."""

from __future__ import annotations

import json
import logging
import socket
import time
from dataclasses import dataclass, field
from typing import Callable

import paramiko

from gpufleet import remote
from gpufleet.engine.command import Cmd
from gpufleet.engine.query import Query, ask
from gpufleet.errors import GpufleetError
from gpufleet.facts.script import unit_name

JOURNAL_LINES = 50
MIN_WAIT = 30.0  # even a server started long ago gets this long to answer
MAX_DELAY = 15.0
REQUEST_TIMEOUT = 10.0
SMOKE_TIMEOUT = 300.0  # the first generation may compile kernels
_MAX_BODY = 16 * 2 ** 20


class _QuietRefusals(logging.Filter):
    """Drop paramiko's error line for a refused direct-tcpip open: while the server loads, refusal is the answer."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "open FAILED" not in record.getMessage()


logging.getLogger("paramiko.transport").addFilter(_QuietRefusals())


class HttpError(GpufleetError):
    """A response that is not valid HTTP, or no response at all."""


class HealthError(GpufleetError):
    """The server did not prove healthy; carries the host, the problem and the tail of the unit's journal."""

    def __init__(self, host: str, problem: str, journal: str = ""):
        self.host, self.problem, self.journal = host, problem, journal
        msg = f"host {host}: model server not healthy: {problem}"
        if journal.strip():
            msg += f"\n--- last {JOURNAL_LINES} lines of its journal ---\n{journal.rstrip()}"
        super().__init__(msg)


@dataclass
class HttpResponse:
    status: int
    reason: str
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self):
        return json.loads(self.body or b"null")


def build_request(method: str, path: str, host: str, payload: dict | None = None) -> bytes:
    """An HTTP/1.1 request; Connection: close so the server ends the exchange."""
    body = b"" if payload is None else json.dumps(payload).encode()
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", "User-Agent: gpufleet", "Accept: application/json",
             "Connection: close"]
    if payload is not None:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _split_head(data: bytes) -> tuple[int, str, dict[str, str], bytes] | None:
    head, sep, rest = data.partition(b"\r\n\r\n")
    if not sep:
        return None
    lines = head.decode("iso-8859-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise HttpError(f"not an HTTP response: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        key, colon, value = line.partition(":")
        if colon:
            headers[key.strip().lower()] = value.strip()
    return int(parts[1]), parts[2] if len(parts) > 2 else "", headers, rest


def _dechunk(data: bytes) -> bytes | None:
    """The body of a chunked transfer, or None while incomplete."""
    out, pos = b"", 0
    while True:
        end = data.find(b"\r\n", pos)
        if end < 0:
            return None
        try:
            size = int(data[pos:end].split(b";")[0].strip(), 16)
        except ValueError:
            raise HttpError("bad chunk size in a chunked response") from None
        if size == 0:
            return out
        if len(data) < end + 2 + size + 2:
            return None
        out += data[end + 2:end + 2 + size]
        pos = end + 2 + size + 2


def parse_response(data: bytes, *, eof: bool = True) -> HttpResponse | None:
    """A whole response from the bytes read so far; None while more are needed (eof: the peer closed)."""
    split = _split_head(data)
    if split is None:
        if eof:
            raise HttpError("connection closed before a complete HTTP response" if data else "empty response")
        return None
    status, reason, headers, rest = split
    if "chunked" in headers.get("transfer-encoding", "").lower():
        body = _dechunk(rest)
        if body is None:
            if eof:
                raise HttpError("connection closed in the middle of a chunked body")
            return None
    elif "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError:
            raise HttpError(f"bad Content-Length {headers['content-length']!r}") from None
        if len(rest) < length:
            if eof:
                raise HttpError(f"connection closed after {len(rest)} of {length} body bytes")
            return None
        body = rest[:length]
    elif status in (204, 304) or 100 <= status < 200:
        body = b""
    else:
        if not eof:
            return None  # the body ends when the server closes
        body = rest
    return HttpResponse(status, reason, headers, body)


def request(session, port: int, method: str, path: str, payload: dict | None = None, *,
            address: str = "127.0.0.1", timeout: float = REQUEST_TIMEOUT) -> HttpResponse:
    """One HTTP exchange with address:port as seen from the host, through a direct-tcpip channel of the session."""
    chan = session.tunnel(port, address, timeout=timeout)
    try:
        chan.settimeout(timeout)
        chan.sendall(build_request(method, path, f"{address}:{port}", payload))
        data = b""
        while True:
            chunk = chan.recv(65536)
            if not chunk:
                return parse_response(data, eof=True)
            data += chunk
            if len(data) > _MAX_BODY:
                raise HttpError(f"response larger than {_MAX_BODY} bytes")
            done = parse_response(data, eof=False)
            if done is not None:
                return done
    finally:
        chan.close()


def _why(exc: BaseException) -> str:
    if isinstance(exc, paramiko.ChannelException):
        return f"nothing listens ({exc.text})"
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return "no answer in time"
    return str(exc) or type(exc).__name__


_REQUEST_ERRORS = (paramiko.ChannelException, paramiko.SSHException, HttpError, OSError, EOFError)


@dataclass
class UnitState:
    """A unit as systemctl shows it, and how long ago it last became active (None: unknown)."""

    active: str
    sub: str
    restarts: int
    pid: int
    age: float | None


def parse_unit_state(text: str) -> UnitState:
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)

    def num(key: str) -> int:
        try:
            return int(values.get(key, "0"))
        except ValueError:
            return 0
    age = values.get("Age")
    return UnitState(values.get("ActiveState", "unknown"), values.get("SubState", "unknown"), num("NRestarts"),
                     num("MainPID"), float(age) if age and age.lstrip("-").isdigit() else None)


def unit_state_query(unit: str) -> Query[UnitState]:
    return Query(Cmd.of("bash", "-c", remote.text("unit_state.sh"), "state", unit),
                 lambda host, output: parse_unit_state(output), "unit state", timeout=30)


def unit_state(session, unit: str) -> UnitState:
    return ask(session, unit_state_query(unit))


def journal_tail(session, unit: str, lines: int = JOURNAL_LINES) -> str:
    result = session.run(Cmd.of("journalctl", "-u", unit, "-n", str(lines), "--no-pager"), step="journal",
                         check=False, timeout=60)
    return result.output


def next_delay(delay: float) -> float:
    """Backoff between polls: doubling from 1 s up to MAX_DELAY."""
    return min(MAX_DELAY, max(1.0, delay * 2))


@dataclass
class Gate:
    """Proves one host's server healthy; clock and sleep are replaceable for tests."""

    session: object
    stack: object
    say: Callable[[str], None] = lambda line: None
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    @property
    def unit(self) -> str:
        return unit_name(self.session.host.service)

    @property
    def address(self) -> str:
        bound = self.stack.server.host
        return "127.0.0.1" if bound in ("0.0.0.0", "::", "localhost", "127.0.0.1") else bound

    def fail(self, problem: str) -> HealthError:
        return HealthError(self.session.name, problem, journal_tail(self.session, self.unit))

    def run(self, served_model: str) -> dict:
        """Wait for /health = 200, then the smoke generation must contain smoke_expect; HealthError otherwise."""
        waited = self.wait_healthy()
        answer = self.smoke(served_model)
        return {"health_seconds": round(waited, 1), "smoke_answer": answer}

    def wait_healthy(self) -> float:
        """Poll /health with backoff until 200; fail early when the unit stops or systemd restarts it."""
        server = self.stack.server
        first = unit_state(self.session, self.unit)
        if first.active not in ("active", "activating", "reloading"):
            raise self.fail(f"{self.unit} is {first.active} ({first.sub})")
        if first.sub == "auto-restart":  # it exited and systemd waits RestartSec to start it again: a crash loop
            raise self.fail(f"the server exited and systemd is about to restart it ({first.active} "
                            f"({first.sub}), NRestarts {first.restarts})")
        # The server gets health_timeout from when it (re)started, not from when this run began watching.
        budget = max(MIN_WAIT, server.health_timeout - (first.age or 0.0))
        start = self.clock()
        deadline, delay, last, said = start + budget, 1.0, "no answer yet", 0.0
        while True:
            try:
                resp = request(self.session, server.port, "GET", "/health", address=self.address,
                               timeout=min(REQUEST_TIMEOUT, max(1.0, deadline - self.clock())))
                if resp.status == 200:
                    return self.clock() - start
                last = f"/health answered HTTP {resp.status}"
            except _REQUEST_ERRORS as exc:
                last = f"/health: {_why(exc)}"
            now_state = unit_state(self.session, self.unit)
            if now_state.active in ("failed", "inactive", "deactivating"):
                raise self.fail(f"{self.unit} is {now_state.active} ({now_state.sub}); {last}")
            if now_state.sub == "auto-restart":
                raise self.fail(f"the server exited and systemd is about to restart it (NRestarts "
                                f"{now_state.restarts}); {last}")
            if now_state.restarts > first.restarts or (first.pid and now_state.pid and now_state.pid != first.pid):
                raise self.fail(f"the server exited and systemd restarted it (NRestarts {now_state.restarts}); {last}")
            now = self.clock()
            if now + delay > deadline:
                raise self.fail(f"/health did not answer 200 within {budget:.0f}s (last: {last})")
            if now - said >= 60:
                self.say(f"waiting for {self.unit} to answer /health ({last}; {deadline - now:.0f}s left)")
                said = now
            self.sleep(delay)
            delay = next_delay(delay)

    def smoke(self, served_model: str) -> str:
        """One chat completion of smoke_prompt; the answer must contain smoke_expect (case-insensitive)."""
        server = self.stack.server
        payload = smoke_payload(served_model, server.smoke_prompt)
        last = ""
        for attempt in range(3):
            try:
                resp = request(self.session, server.port, "POST", "/v1/chat/completions", payload,
                               address=self.address, timeout=SMOKE_TIMEOUT)
            except _REQUEST_ERRORS as exc:
                last = _why(exc)
            else:
                if resp.status == 200:
                    try:
                        text = answer_text(resp)
                    except HttpError as exc:
                        raise self.fail(f"smoke generation: {exc}") from None
                    if server.smoke_expect.lower() not in text.lower():
                        raise self.fail(f"smoke generation answered {text[:200]!r}, expected it to contain "
                                        f"{server.smoke_expect!r} (wrong backend for this GPU?)")
                    return text
                last = f"HTTP {resp.status}: {resp.body[:200].decode(errors='replace')}"
                if resp.status != 503:
                    break
            self.sleep(2.0 * (attempt + 1))
        raise self.fail(f"smoke generation failed: {last}")


def smoke_payload(model: str, prompt: str) -> dict:
    """A short, deterministic chat completion; thinking off so the answer is in content."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": 64, "chat_template_kwargs": {"enable_thinking": False}}


def answer_text(resp: HttpResponse) -> str:
    """The assistant's text (content, else reasoning_content) of a chat completion response."""
    try:
        message = resp.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError):
        raise HttpError(f"not a chat completion: {resp.body[:200]!r}") from None
    return (message.get("content") or message.get("reasoning_content") or "").strip()
