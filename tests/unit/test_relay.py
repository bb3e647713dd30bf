"""The sim's WAN relay on loopback: it delays each direction, keeps order through losses, and stops cleanly."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import pytest

from gpufleet.sim.relay import THREAD_PREFIX, Relay


class Echo:
    """A loopback echo server (one thread per connection), the relay's far end."""

    def __init__(self):
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.1)
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    @property
    def address(self):
        return self.server.getsockname()[:2]

    def _accept(self):
        while not self.stopped.is_set():
            try:
                conn, _ = self.server.accept()
            except (TimeoutError, socket.timeout):
                continue
            thread = threading.Thread(target=self._echo, args=(conn,), daemon=True)
            self.threads.append(thread)
            thread.start()

    @staticmethod
    def _echo(conn):
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data)

    def close(self):
        self.stopped.set()
        for thread in self.threads:
            thread.join(5)
        self.server.close()


@pytest.fixture
def echo():
    server = Echo()
    yield server
    server.close()


def round_trip(address, payload: bytes = b"ping") -> tuple[float, bytes]:
    with socket.create_connection(address, timeout=10) as sock:
        started = time.monotonic()
        sock.sendall(payload)
        got = b""
        while len(got) < len(payload):
            got += sock.recv(65536)
        return time.monotonic() - started, got


def relay_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(THREAD_PREFIX)]


def test_each_direction_is_delayed(echo):
    direct, _ = round_trip(echo.address)
    with Relay(echo.address, delay=0.15) as relay:
        relayed, got = round_trip(relay.address)
    assert got == b"ping"
    assert relayed >= 0.3 > direct  # one delay each way: a round trip of at least two


def test_a_lost_chunk_waits_for_the_rto(echo):
    with Relay(echo.address, delay=0.05, loss=1.0, rto=0.2, seed=1) as relay:
        relayed, got = round_trip(relay.address)
        assert relay.losses == 2  # the ping lost on the way there and its echo on the way back
    assert got == b"ping" and relayed >= 2 * (0.05 + 0.2)


def test_order_is_kept_through_losses(echo):
    """Many small chunks, a third of them held for an RTO: the stream arrives whole and in order."""
    payload = b"".join(b"%06d|" % i for i in range(4000))
    with Relay(echo.address, delay=0.01, loss=0.3, rto=0.05, chunk=512, seed=7) as relay:
        with socket.create_connection(relay.address, timeout=30) as sock:
            sender = threading.Thread(target=sock.sendall, args=(payload,))
            sender.start()
            got = b""
            while len(got) < len(payload):
                data = sock.recv(65536)
                assert data, "the relay closed the connection early"
                got += data
            sender.join()
        assert relay.losses > 0
    assert got == payload


def test_a_half_close_is_passed_on_in_order(echo):
    """The client's FIN reaches the far end after its data; the echo's answer and FIN come back."""
    with Relay(echo.address, delay=0.02) as relay:
        with socket.create_connection(relay.address, timeout=10) as sock:
            sock.sendall(b"last words")
            sock.shutdown(socket.SHUT_WR)
            got = b""
            while data := sock.recv(65536):
                got += data
    assert got == b"last words"


def test_stop_closes_the_port_the_connections_and_every_thread(echo):
    relay = Relay(echo.address, delay=0.05).start()
    address = relay.address
    client = socket.create_connection(address, timeout=10)
    client.sendall(b"x")
    assert client.recv(10) == b"x"
    assert relay_threads()
    relay.stop()
    assert relay_threads() == []
    assert client.recv(10) == b""  # the relayed connection was closed
    client.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(address, timeout=2)


def test_stop_while_chunks_wait_in_the_queue(echo):
    """Data still held back (a long delay) does not keep the relay's threads alive."""
    relay = Relay(echo.address, delay=30).start()
    client = socket.create_connection(relay.address, timeout=10)
    client.sendall(b"held")
    relay.stop(timeout=5)
    assert relay_threads() == []
    client.close()


@pytest.mark.parametrize("target, listen", [(("192.0.2.1", 22), ("127.0.0.1", 0)),
                                            (("localhost", 22), ("127.0.0.1", 0)),
                                            (("127.0.0.1", 22), ("0.0.0.0", 0))])
def test_it_carries_only_test_traffic(target, listen):
    with pytest.raises(ValueError, match="relay"):
        Relay(target, listen=listen)


def test_the_command_prints_its_port_and_stops_on_sigterm(echo):
    host, port = echo.address
    proc = subprocess.Popen([sys.executable, "-m", "gpufleet.sim.relay", f"{host}:{port}", "--delay", "0.01"],
                            stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line[0] == "listening"
        relay_host, relay_port = line[1].rsplit(":", 1)
        _, got = round_trip((relay_host, int(relay_port)))
        assert got == b"ping"
        proc.terminate()
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
