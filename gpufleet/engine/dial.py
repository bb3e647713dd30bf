"""TCP connections to the first hosts of a run, opened before paramiko is imported so that the TCP handshake and the
server's SSH banner overlap the imports (issue 13); HostSession.open hands each to paramiko (`sock=`).

Only what paramiko would dial itself is dialled here: a host without a jump host, on its inventory address and port
(22 when unset), with no ssh_config keyword that could send it elsewhere; HostSession still checks Fabric's own
answer (host, port, no gateway) and dials itself when they differ. Importing this module imports no paramiko.
"""

from __future__ import annotations

import math
import os
import socket
import threading
from errno import ECONNREFUSED, EHOSTUNREACH

from gpufleet.engine.sshconfig import REROUTING, expand_includes, keywords

DEFAULT_PORT = 22


class Early:
    """One host's connection being opened: the socket, or why not (set once `done` is set)."""

    def __init__(self, address: str, port: int, timeout: float):
        self.address, self.port, self.timeout = address, port, timeout
        self.sock: socket.socket | None = None
        self.timed_out = False
        self.done = threading.Event()
        self._lock = threading.Lock()
        self._abandoned = False  # the run ended (or was interrupted) first: a socket connected later is closed

    def dial(self) -> None:
        """Connect as paramiko's SSHClient.connect does: every stream address of the name in turn, the next one only
        after a refusal or an unreachable host; anything else (a timeout, a name that does not resolve) ends it."""
        connected = None
        try:
            for family, _, _, _, address in socket.getaddrinfo(_name(self.address), self.port, socket.AF_UNSPEC,
                                                               socket.SOCK_STREAM):
                sock = socket.socket(family, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                try:
                    sock.connect(address)
                except OSError as exc:
                    sock.close()
                    if exc.errno in (ECONNREFUSED, EHOSTUNREACH):
                        continue
                    self.timed_out = isinstance(exc, TimeoutError)
                    return
                no_delay(sock)
                connected = sock
                return
        except OSError:
            pass  # no socket: paramiko dials again and reports the failure in its own words
        finally:
            with self._lock:
                if self._abandoned:
                    _close(connected)
                else:
                    self.sock = connected
                self.done.set()

    def abandon(self) -> None:
        """Close the socket now, or once the dial ends: never waits (Ctrl-C must not wait for a connect timeout)."""
        with self._lock:
            self._abandoned = True
            _close(self.sock)


class Dialed:
    """The early connections of one run, by host name; each is taken once, the rest closed at exit."""

    def __init__(self, early: dict[str, Early]):
        self._early = early
        self._lock = threading.Lock()

    def take(self, name: str, address: str, port: int, *, direct: bool = True) -> socket.socket | None:
        """The connected socket for host `name` if it was dialled to exactly (address, port) and Fabric connects
        directly (`direct`: no gateway): waits for the dial to finish; None when it was not dialled or failed
        (paramiko then dials and reports); raises TimeoutError when the host did not answer within the connect
        timeout, as paramiko's own connect would."""
        with self._lock:
            early = self._early.pop(name, None)
        if early is None:
            return None
        early.done.wait()
        if not direct or (early.address, early.port) != (address, port):
            _close(early.sock)  # Fabric resolved the host elsewhere (or via a hop): paramiko dials that
            return None
        if early.timed_out:
            raise TimeoutError(f"timed out connecting to {address} port {port}")
        return early.sock

    def close(self) -> None:
        with self._lock:
            left, self._early = list(self._early.values()), {}
        for early in left:
            early.abandon()

    def __enter__(self) -> "Dialed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def dial(hosts: list, settings, parallelism: int | None = None) -> Dialed:
    """Start connecting, each in a thread of its own, to the hosts that the run's first wave asks (the first
    `parallelism` hosts, as engine.runner.for_each_host takes them; the rest connect when a worker is free)."""
    limit = max(1, parallelism or settings.parallelism)
    rerouting = _rerouting_keywords(settings)
    if rerouting & REROUTING:
        return Dialed({})
    timeout = max(1, math.ceil(settings.connect_timeout))  # as HostSession gives it to Fabric (whole seconds)
    early = {}
    for host in hosts[:limit]:
        if getattr(host, "jump", None) or (host.port is None and "port" in rerouting):
            continue  # a jump host carries it / ssh_config may set its port: paramiko dials
        early[host.name] = Early(host.address, host.port or DEFAULT_PORT, timeout)
    for name, one in early.items():
        threading.Thread(target=one.dial, name=f"gpufleet-dial-{name}", daemon=True).start()
    return Dialed(early)


def _rerouting_keywords(settings) -> set[str]:
    """The keywords of the ssh_config HostSession reads (with Includes); one it cannot read counts as rerouting
    everything (HostSession reports the problem when it reads it)."""
    path = getattr(settings, "ssh_config", None)
    if not path:
        return set()
    path = os.path.expanduser(str(path))
    if not os.path.exists(path):
        return set()
    try:
        return keywords(expand_includes(path))
    except Exception:  # noqa: BLE001 - any problem is reported by the regular path, in its own words
        return set(REROUTING)


def _name(address: str) -> str | bytes:
    """An ASCII host name or address as bytes: a str makes the socket module import the idna codec first (8 ms of the
    path to the first packet); the name resolves the same."""
    return address.encode("ascii") if address.isascii() else address


def no_delay(sock) -> None:
    """Send each SSH packet at once (TCP_NODELAY). SSH is small requests and answers; with Nagle's algorithm on, a
    packet written while the last one is unacknowledged waits for the peer's delayed ACK, and every command after
    a session's first took 44 ms instead of 2 ms on a local host (issue 13). Not a TCP socket: nothing to do."""
    if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _close(sock: socket.socket | None) -> None:
    if sock is not None:
        sock.close()
