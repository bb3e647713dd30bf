"""TCP connections opened before paramiko is imported (engine/dial.py): only the first wave of hosts, only where
paramiko would dial the same address and port itself, each used once by HostSession, and the same errors as
paramiko's own connect."""

from __future__ import annotations

import re

import socket
import threading

import pytest

from gpufleet.config.inventory import GpuExpectation, Host, Settings
from gpufleet.engine.dial import Early, dial, no_delay
from gpufleet.engine.ssh import HostSession
from gpufleet.errors import UnreachableError


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts and answers each with `banner`."""

    def __init__(self, banner: bytes = b"HTTP/1.0 400 not ssh\r\n"):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.banner = banner
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.sendall(self.banner)
            conn.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def listener():
    server = Listener()
    yield server
    server.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def _host(name: str, port: int | None, **kw) -> Host:
    return Host(name=name, gpus=GpuExpectation(), address="127.0.0.1", port=port, **kw)


def _settings(tmp_path, ssh_config: str | None = None, **kw) -> Settings:
    config = tmp_path / "ssh_config"
    if ssh_config is not None:
        config.write_text(ssh_config)
    return Settings(known_hosts=tmp_path / "known_hosts", ssh_config=config, **kw)


def test_only_the_first_wave_is_dialled_and_each_socket_is_taken_once(tmp_path, listener):
    hosts = [_host(f"h{i}", listener.port) for i in range(5)]
    with dial(hosts, _settings(tmp_path, parallelism=2)) as dialed:
        first = dialed.take("h0", "127.0.0.1", listener.port)
        assert first is not None and first.getpeername()[1] == listener.port
        assert dialed.take("h0", "127.0.0.1", listener.port) is None  # a reconnect dials anew
        assert dialed.take("h2", "127.0.0.1", listener.port) is None  # past the cap: its worker dials
        left = dialed._early["h1"]
        left.done.wait()
    assert left.sock.fileno() == -1  # never taken: closed at the end of the run
    first.close()


def test_a_dial_still_under_way_when_the_run_ends_is_closed_when_it_connects(tmp_path, listener):
    early = Early("127.0.0.1", listener.port, 5)
    early.abandon()  # the run ended (Ctrl-C) before the connect returned: nothing waits for it
    early.dial()
    assert early.done.is_set() and early.sock is None


def test_a_socket_dialled_elsewhere_or_for_a_hop_is_closed_not_handed_over(tmp_path, listener):
    hosts = [_host("a", listener.port), _host("b", listener.port)]
    with dial(hosts, _settings(tmp_path)) as dialed:
        early_a, early_b = dialed._early["a"], dialed._early["b"]
        assert dialed.take("a", "127.0.0.2", listener.port) is None  # Fabric resolved another address
        assert dialed.take("b", "127.0.0.1", listener.port, direct=False) is None  # Fabric goes through a gateway
    assert early_a.sock.fileno() == -1 and early_b.sock.fileno() == -1


@pytest.mark.parametrize("config", ["Host *\n  HostName 10.9.9.9\n", "Host gpu*\n  ProxyJump bastion\n",
                                    "Match host a\n  User x\n", "Host *\n  ProxyCommand=nc %h %p\n"])
def test_an_ssh_config_that_may_send_hosts_elsewhere_dials_nothing(tmp_path, listener, config):
    with dial([_host("a", listener.port)], _settings(tmp_path, config)) as dialed:
        assert dialed._early == {}


def test_a_jump_host_or_a_port_that_ssh_config_may_set_is_left_to_paramiko(tmp_path, listener):
    hosts = [_host("a", listener.port, jump="ops@bastion:2222"), _host("b", None), _host("c", listener.port)]
    with dial(hosts, _settings(tmp_path, "Host *\n  Port 2200\n  User root\n")) as dialed:
        assert sorted(dialed._early) == ["c"]


def test_an_include_is_followed(tmp_path, listener):
    (tmp_path / "more").write_text("Host a\n  HostName 10.9.9.9\n")
    with dial([_host("a", listener.port)], _settings(tmp_path, f"Include {tmp_path / 'more'}\n")) as dialed:
        assert dialed._early == {}


def _open_error(session: HostSession) -> str:
    with pytest.raises(UnreachableError) as caught:
        session.open()
    return str(caught.value)


def test_paramiko_speaks_on_the_dialled_socket_and_fails_in_the_same_words(tmp_path, listener):
    settings = _settings(tmp_path)
    host = _host("gpu1", listener.port)
    plain = _open_error(HostSession(host, settings))
    assert listener.accepted == 1
    with dial([host], settings) as dialed:
        early = _open_error(HostSession(host, settings, dialed=dialed))
    assert listener.accepted == 2  # one connection: the dialled one, not a second of paramiko's
    # paramiko adds the socket's own words when the close arrives as a reset rather than an EOF: a race of timing
    same = [re.sub(r"protocol banner.*", "protocol banner", e) for e in (early, plain)]
    assert same[0] == same[1] and "gpu1" in early and "cannot connect" in early


def test_a_refused_host_gets_paramikos_own_error_naming_host_and_port(tmp_path):
    settings = _settings(tmp_path)
    host = _host("gpu1", _free_port())
    plain = _open_error(HostSession(host, settings))
    with dial([host], settings) as dialed:
        early = _open_error(HostSession(host, settings, dialed=dialed))
    assert early == plain and f"port {host.port}" in early and "gpu1" in early


def test_a_dialled_socket_sends_each_packet_at_once(listener):
    """TCP_NODELAY: with Nagle on, each SSH command after a session's first waited for the host's delayed ACK."""
    early = Early("127.0.0.1", listener.port, 5)
    early.dial()
    try:
        assert early.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
    finally:
        early.sock.close()


def test_no_delay_leaves_what_is_no_tcp_socket_alone():
    a, b = socket.socketpair()
    with a, b:
        no_delay(a)  # a unix socket (as a ProxyCommand's pipe would be) has no such option: no error
    no_delay(None)  # a jump host's channel: paramiko's transport has no socket at all


def test_paramikos_reader_waits_idle_a_second_not_a_tenth():
    """paramiko's transport thread wakes whenever its socket's timeout ends (paramiko sets 0.1 s); an idle session
    woke ten times a second. A jump host's channel (no socket) is left as paramiko made it."""
    from types import SimpleNamespace

    from gpufleet.engine import ssh

    a, b = socket.socketpair()
    with a, b:
        a.settimeout(0.1)
        closed = []
        transport = SimpleNamespace(sock=a, close=lambda: closed.append(a.fileno()))
        ssh._poll_less(transport)
        assert a.gettimeout() == ssh.IDLE_POLL == 1.0
        transport.close()
        # shut down before paramiko's own close: the host sees the end at once, not when the reader's wait ends
        assert b.recv(1) == b"" and closed == [a.fileno()]
    ssh._poll_less(SimpleNamespace(sock=object()))
