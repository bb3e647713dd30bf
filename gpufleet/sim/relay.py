"""A TCP relay that makes a path to a simulated host look like a slow, lossy WAN link (this kernel has no netem)."""

from __future__ import annotations

import argparse
import collections
import ipaddress
import random
import signal
import socket
import threading
import time

from gpufleet.engine.dial import no_delay
from gpufleet.sim.layout import CONTROL_ADDR, SUBNET

# One read is one "segment": about an Ethernet MSS, so loss hits a bulk transfer about as often as it would on a wire.
CHUNK = 1448
THREAD_PREFIX = "gpufleet-relay"


def _allowed_target(host: str) -> bool:
    """Test traffic only: loopback, or the simulated hosts' own subnet."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address in ipaddress.ip_network(f"{SUBNET}.0/24")


def _allowed_listen(host: str) -> bool:
    """Listen only where nothing but this machine reaches it: loopback, or the control node's side of the bridge."""
    try:
        return ipaddress.ip_address(host).is_loopback or host == CONTROL_ADDR
    except ValueError:
        return False


class Relay:
    """Forwards every connection made to `address` to `target`, each chunk in each direction `delay` seconds late
    (order kept); with probability `loss` a chunk is "lost" as TCP sees it: it and everything behind it wait `rto`
    more (the retransmission timeout). Start with start() (or `with`), stop with stop(): no thread or port stays."""

    def __init__(self, target: tuple[str, int], *, delay: float = 0.1, loss: float = 0.0, rto: float = 0.2,
                 listen: tuple[str, int] = ("127.0.0.1", 0), chunk: int = CHUNK, seed: int | None = None):
        if not _allowed_target(target[0]):
            raise ValueError(f"relay target {target[0]} is neither loopback nor in the simulated subnet {SUBNET}.0/24")
        if not _allowed_listen(listen[0]):
            raise ValueError(f"relay listen address {listen[0]} is neither loopback nor {CONTROL_ADDR}")
        if delay < 0 or rto < 0 or not 0.0 <= loss <= 1.0 or chunk < 1:
            raise ValueError(f"relay: delay {delay}, rto {rto} must be >= 0, loss {loss} in [0, 1], chunk {chunk} >= 1")
        self.target, self.delay, self.loss, self.rto, self.chunk = target, delay, loss, rto, chunk
        self._listen = listen
        self._random = random.Random(seed)
        self._random_guard = threading.Lock()
        self._stop = threading.Event()
        self._guard = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._sockets: list[socket.socket] = []
        self._listener: socket.socket | None = None
        self.connections = 0  # accepted so far
        self.losses = 0  # chunks held for an RTO so far

    @property
    def address(self) -> tuple[str, int]:
        """Where clients connect (the port the kernel chose when listen's port was 0)."""
        if self._listener is None:
            raise RuntimeError("the relay is not started")
        return self._listener.getsockname()[:2]

    def start(self) -> "Relay":
        listener = socket.create_server(self._listen, reuse_port=False)
        listener.settimeout(0.1)  # accept() wakes this often to see stop(): closing a socket does not wake it
        self._listener = listener
        self._spawn(self._accept_loop, "accept")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every relayed connection, and wait for every thread of the relay to end."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        with self._guard:
            accept = self._threads[:1]
        for thread in accept:  # first: once it is gone, no connection or thread is added
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._guard:
            sockets, threads = list(self._sockets), list(self._threads)
        for sock in sockets:
            _shutdown(sock)  # wakes a recv() blocked in another thread
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        for sock in sockets:
            sock.close()
        if self._listener is not None:
            self._listener.close()
        alive = [t.name for t in threads if t.is_alive()]
        if alive:
            raise RuntimeError(f"relay threads still running after {timeout}s: {', '.join(alive)}")

    def __enter__(self) -> "Relay":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- inside ----------------------------------------------------------------------------------------------------
    def _spawn(self, target, name: str, *args) -> None:
        thread = threading.Thread(target=target, args=args, name=f"{THREAD_PREFIX}-{name}", daemon=True)
        with self._guard:
            self._threads.append(thread)
        thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._guard:
            self._sockets.append(sock)

    def _lost(self) -> bool:
        with self._random_guard:
            lost = self.loss > 0 and self._random.random() < self.loss
            self.losses += lost
            return lost

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except (TimeoutError, socket.timeout):
                continue
            except OSError:
                return
            client.settimeout(None)
            # forward each chunk as it comes, as a router would: Nagle here would add stalls no WAN link has
            no_delay(client)
            self._track(client)
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                _shutdown(client)
                continue
            upstream.settimeout(None)
            no_delay(upstream)
            self._track(upstream)
            self.connections += 1
            link = _Link(client, upstream)
            number = self.connections
            for src, dst, way in ((client, upstream, "up"), (upstream, client, "down")):
                pipe = _Pipe(self, src, dst, link)
                self._spawn(pipe.read_loop, f"{number}-{way}-read")
                self._spawn(pipe.write_loop, f"{number}-{way}-write")


class _Link:
    """Both sockets of one relayed connection: closed together once both directions ended or one broke."""

    def __init__(self, client: socket.socket, upstream: socket.socket):
        self.client, self.upstream = client, upstream
        self.open_ways = 2
        self.guard = threading.Lock()

    def way_done(self) -> None:
        with self.guard:
            self.open_ways -= 1
            done = self.open_ways == 0
        if done:
            self.broken()

    def broken(self) -> None:
        _shutdown(self.client)
        _shutdown(self.upstream)


class _Pipe:
    """One direction of a connection: the reader stamps each chunk with when it may leave, the writer sends it then."""

    def __init__(self, relay: Relay, src: socket.socket, dst: socket.socket, link: _Link):
        self.relay, self.src, self.dst, self.link = relay, src, dst, link
        self.queue: collections.deque[tuple[float, bytes]] = collections.deque()
        self.ready = threading.Condition()
        self.last_due = 0.0

    def read_loop(self) -> None:
        relay = self.relay
        while True:
            try:
                data = self.src.recv(relay.chunk)
            except OSError:
                data = b""
            due = time.monotonic() + relay.delay
            if data and relay._lost():
                due += relay.rto  # retransmitted after the RTO; nothing behind it is delivered before it
            self.last_due = due = max(due, self.last_due)
            with self.ready:
                self.queue.append((due, data))
                self.ready.notify()
            if not data:
                return

    def write_loop(self) -> None:
        stop = self.relay._stop
        while True:
            with self.ready:
                while not self.queue and not stop.is_set():
                    self.ready.wait(0.1)
                if stop.is_set():
                    return
                due, data = self.queue.popleft()
            if stop.wait(max(0.0, due - time.monotonic())):
                return
            if not data:  # the sender closed its side: pass the FIN on, in order
                try:
                    self.dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self.link.way_done()
                return
            try:
                self.dst.sendall(data)
            except OSError:
                self.link.broken()
                return


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def main(argv: list[str] | None = None) -> None:
    """`python -m gpufleet.sim.relay HOST:PORT`: relay until SIGTERM or Ctrl-C; prints where it listens."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("target", type=_address, help="HOST:PORT to forward to (loopback or a simulated host)")
    parser.add_argument("--listen", type=_address, default=("127.0.0.1", 0), help="HOST:PORT (default 127.0.0.1:0)")
    parser.add_argument("--delay", type=float, default=0.1, help="one-way delay in seconds (default 0.1)")
    parser.add_argument("--loss", type=float, default=0.0, help="share of chunks lost (default 0)")
    parser.add_argument("--rto", type=float, default=0.2, help="how long a lost chunk waits (default 0.2 s)")
    args = parser.parse_args(argv)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with Relay(args.target, delay=args.delay, loss=args.loss, rto=args.rto, listen=args.listen) as relay:
        host, port = relay.address
        print(f"listening {host}:{port}", flush=True)
        try:
            done.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
