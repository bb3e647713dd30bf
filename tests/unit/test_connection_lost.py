"""A broken SSH link under a command or a transfer is one ConnectionLost (host, step, exit_code None), never a
paramiko or socket exception: the executor's resumable steps and every caller's `except GpufleetError` rely on it."""

from __future__ import annotations

import socket

import paramiko
import pytest

from gpufleet.config.inventory import GpuExpectation, Host, Settings
from gpufleet.engine.command import Cmd
from gpufleet.engine.ssh import HostSession
from gpufleet.errors import ConnectionLost, GpufleetError, RemoteCommandError, UnreachableError


class _Transport:
    """A paramiko transport stand-in: open_session raises `fails`, or returns a channel that raises on recv."""

    def __init__(self, fails=None, channel=None, active=True):
        self.fails, self.chan, self.active = fails, channel, active

    def is_active(self):
        return self.active

    def open_session(self):
        if self.fails is not None:
            self.active = False
            raise self.fails
        return self.chan


class _Channel:
    def __init__(self, transport_box, recv_error):
        self.box, self.recv_error, self.closed = transport_box, recv_error, False

    def set_combine_stderr(self, on):
        pass

    def settimeout(self, t):
        pass

    def exec_command(self, text):
        pass

    def recv(self, n):
        self.box["transport"].active = False  # the link dies under the command
        raise self.recv_error

    def close(self):
        self.closed = True
        raise EOFError()  # closing over a dead link fails too: must not hide the result


class _Conn:
    def __init__(self, transport, sftp_error=None):
        self.transport, self.sftp_error = transport, sftp_error

    def sftp(self):
        def fail(*args, **kwargs):
            self.transport.active = self.transport.active and not isinstance(self.sftp_error, EOFError)
            raise self.sftp_error
        return type("Sftp", (), {name: staticmethod(fail) for name in ("put", "get", "open", "file")})()

    def close(self):
        pass


def _session(transport, **kw) -> HostSession:
    session = HostSession(Host(name="gpu2", gpus=GpuExpectation(), address="10.0.0.2"), Settings())
    session.conn = _Conn(transport, **kw)
    return session


@pytest.mark.parametrize("error", [EOFError(), paramiko.SSHException("SSH session not active"),
                                   ConnectionResetError(104, "Connection reset by peer"), socket.error("broken")])
def test_open_session_failure_is_connection_lost_naming_host_and_step(error):
    session = _session(_Transport(fails=error))
    with pytest.raises(ConnectionLost) as caught:
        session.run(Cmd.of("true"), step="facts")
    exc = caught.value
    assert isinstance(exc, RemoteCommandError) and isinstance(exc, UnreachableError)
    assert isinstance(exc, GpufleetError) and exc.exit_code is None
    assert exc.host == "gpu2" and exc.step == "facts"
    assert "connection lost before the command started" in str(exc)
    assert "host gpu2: step 'facts' failed" in str(exc)


def test_unchecked_run_returns_a_result_without_exit_code():
    session = _session(_Transport(fails=EOFError()))
    result = session.run(Cmd.of("true"), step="facts", check=False)
    assert result.exit_code is None and "connection lost" in result.output
    assert session.results[-1] is result


@pytest.mark.parametrize("error", [EOFError(), paramiko.SSHException("Server connection dropped: "),
                                   ConnectionResetError(104, "reset")])
def test_link_dying_during_the_read_is_connection_lost(error):
    box = {}
    chan = _Channel(box, error)
    box["transport"] = transport = _Transport(channel=chan)
    session = _session(transport)
    with pytest.raises(ConnectionLost) as caught:
        session.run(Cmd.of("pip", "install", "torch"), step="install torch")
    assert caught.value.exit_code is None and caught.value.step == "install torch"
    assert chan.closed


def test_a_timeout_on_a_live_link_stays_a_plain_failure_without_exit_code():
    box = {}
    chan = _Channel(box, socket.timeout("timed out"))
    box["transport"] = transport = _Transport(channel=chan)
    chan.recv = lambda n: (_ for _ in ()).throw(socket.timeout("timed out"))
    session = _session(transport)
    with pytest.raises(RemoteCommandError) as caught:
        session.run(Cmd.of("sleep", "9"), step="slow", timeout=1)
    assert not isinstance(caught.value, ConnectionLost) and caught.value.exit_code is None


@pytest.mark.parametrize("call", [lambda s: s.put("/etc/hostname", "/tmp/x"), lambda s: s.get("/tmp/x", "/tmp/y"),
                                  lambda s: s.get_text("/tmp/x"), lambda s: s.put_text("x", "/tmp/x")])
def test_sftp_transfer_on_a_broken_link_is_connection_lost(call):
    session = _session(_Transport(), sftp_error=EOFError())
    with pytest.raises(ConnectionLost) as caught:
        call(session)
    assert caught.value.host == "gpu2" and caught.value.step.startswith("sftp") and caught.value.exit_code is None


def test_sftp_answer_on_a_live_link_passes_through():
    session = _session(_Transport(), sftp_error=FileNotFoundError(2, "No such file"))
    with pytest.raises(FileNotFoundError):
        session.get_text("/tmp/none")


def test_channel_open_on_a_dead_link_is_connection_lost():
    session = _session(_Transport(fails=paramiko.SSHException("SSH session not active")))
    with pytest.raises(ConnectionLost) as caught:
        session.channel(Cmd.of("cat"))
    assert caught.value.step == "channel" and caught.value.exit_code is None
