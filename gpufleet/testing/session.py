"""FakeSession: a HostSession stand-in that records every command and answers by rules (like fabric.testing)."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any, Callable

import paramiko

from gpufleet.config.inventory import Host
from gpufleet.engine.batch import BatchCmd, joined
from gpufleet.engine.become import Become, wire
from gpufleet.engine.command import Cmd, mask
from gpufleet.engine.output import HostLines
from gpufleet.engine.ssh import Result
from gpufleet.errors import RemoteCommandError

# A rule's match: a step name (exact), a compiled regex (searched in the masked command line) or
# predicate(step, cmd). Its answer: (exit code, output), a Result, a list of those (one per call, the last
# repeats) or answer(step, cmd) returning one of them.
Match = Any
Answer = Any


def _matches(match: Match, step: str, cmd: Cmd) -> bool:
    if isinstance(match, str):
        return match == step
    if isinstance(match, re.Pattern):
        return match.search(cmd.display()) is not None
    return bool(match(step, cmd))


class FakeChannel:
    """What channel(cmd) returns: records what is sent, then gives the rule's output as stdout."""

    def __init__(self, stdout: str, exit_code: int | None):
        self.sent = bytearray()
        self.closed = self.write_shut = False
        self._stdout, self._stderr, self._exit = stdout.encode(), b"", exit_code

    def sendall(self, data: bytes) -> None:
        self.sent += data

    def shutdown_write(self) -> None:
        self.write_shut = True

    def recv(self, n: int) -> bytes:
        data, self._stdout = self._stdout[:n], self._stdout[n:]
        return data

    def recv_stderr(self, n: int) -> bytes:
        data, self._stderr = self._stderr[:n], self._stderr[n:]
        return data

    def recv_exit_status(self) -> int:
        return -1 if self._exit is None else self._exit

    def settimeout(self, timeout) -> None:
        pass

    def close(self) -> None:
        self.closed = True


class FakeSession:
    """Records (step, cmd) of every run and answers by the first matching rule; unmatched commands get `default`.

    put/put_text/get/get_text work on `files` (remote path -> bytes); channel(cmd) answers like run (step
    "channel"); tunnel(port, host) opens a plain TCP connection, refused as paramiko refuses a direct-tcpip open."""

    def __init__(self, rules: dict | None = None, *, name: str = "gpu1", host: Host | None = None,
                 default: Answer = (0, ""), secrets: tuple[str, ...] = ()):
        self.host = host or Host(name=name, address="10.0.0.1")
        self.name = self.host.name
        self.rules: list[tuple[Match, Answer]] = list((rules or {}).items())
        self.default = default
        self.secrets = tuple(secrets)
        self.calls: list[tuple[str, Cmd]] = []
        self.results: list[Result] = []
        self.files: dict[str, bytes] = {}
        self.puts: list[tuple[str, str]] = []  # (local, remote) of put()
        self.channels: list[FakeChannel] = []
        self.tunnels: list[tuple[str, int]] = []
        self.alive = True
        self.opened = 0

    def on(self, match: Match, answer: Answer) -> "FakeSession":
        """Add a rule that wins over the existing ones (a test overriding a shared script); returns the session."""
        self.rules.insert(0, (match, answer))
        return self

    @property
    def steps(self) -> list[str]:
        return [step for step, _ in self.calls]

    def open(self) -> "FakeSession":
        self.alive, self.opened = True, self.opened + 1
        return self

    def reconnect(self) -> None:
        self.open()

    def close(self) -> None:
        self.alive = False

    def __enter__(self) -> "FakeSession":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def answer(self, step: str, cmd: Cmd) -> Result:
        """The Result the rules give for cmd (recorded by run, not here)."""
        for match, ans in self.rules:
            if _matches(match, step, cmd):
                if isinstance(ans, list):  # one per call; the last one repeats
                    ans = ans.pop(0) if len(ans) > 1 else ans[0]
                break
        else:
            ans = self.default
        if callable(ans):
            ans = ans(step, cmd)
        if isinstance(ans, Result):
            return ans
        code, out = ans
        return Result(self.name, step, cmd.display(), code, mask(out, self.secrets + tuple(cmd.secrets())), 0.0)

    def run(self, cmd: Cmd, step: str, *, check: bool = True, timeout: float | None = None,
            echo: Callable[[str], None] | None = None, sent: Callable[[], None] | None = None) -> Result:
        """Record, answer, echo the output's lines host-prefixed, raise RemoteCommandError as HostSession does.
        Reads side by side (engine/batch.py) are answered and recorded one by one, joined as the host joins them."""
        if sent is not None:
            sent()
        if isinstance(cmd, BatchCmd):
            answers = []
            for inner, inner_step in cmd.reads:
                self.calls.append((inner_step, inner))
                got = self.answer(inner_step, inner)
                answers.append((got.exit_code, got.output))
            result = Result(self.name, step, cmd.display(), 0, joined(answers), 0.0)
            self.results.append(result)
            return result
        self.calls.append((step, cmd))
        result = self.answer(step, cmd)
        self.results.append(result)
        if echo and result.output:
            lines = HostLines(self.name, sink=echo)
            lines.feed(result.output)
            lines.flush()
        if check and result.exit_code != 0:
            raise RemoteCommandError(result, cmd)
        return result

    def put(self, local, remote: str) -> None:
        self.puts.append((str(local), remote))
        self.files[remote] = Path(local).read_bytes()

    def put_text(self, text: str, remote_path: str, mode: int = 0o644) -> None:
        self.files[remote_path] = text.encode()

    def get(self, remote: str, local) -> None:
        Path(local).write_bytes(self._file(remote))

    def get_text(self, remote: str) -> str:
        return self._file(remote).decode()

    def _file(self, remote: str) -> bytes:
        if remote not in self.files:
            raise FileNotFoundError(2, "No such file", remote)
        return self.files[remote]

    def wire(self, cmd: Cmd):
        """cmd as the host would run it (engine/become.py), with the host's become settings."""
        return wire(cmd, Become.of(self.host))

    def channel(self, cmd: Cmd) -> FakeChannel:
        self.calls.append(("channel", cmd))
        result = self.answer("channel", cmd)
        chan = FakeChannel(result.output, result.exit_code)
        chan.sendall(self.wire(cmd).stdin)  # as HostSession.channel: a become host's password line goes first
        self.channels.append(chan)
        return chan

    def tunnel(self, port: int, host: str = "127.0.0.1", *, timeout: float | None = None):
        self.tunnels.append((host, port))
        try:
            return socket.create_connection((host, port), timeout=timeout)
        except OSError:
            raise paramiko.ChannelException(2, "Connect failed") from None
