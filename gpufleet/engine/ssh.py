"""One SSH connection per host, reused for every command of a run, with strict host-key checking."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import paramiko
from fabric import Config, Connection

from gpufleet.engine import become as become_mod
from gpufleet.engine import openssh
from gpufleet.engine.command import Cmd, mask
from gpufleet.engine.dial import Dialed, no_delay
from gpufleet.errors import ConnectionLost, GpufleetError, HostKeyError, RemoteCommandError, UnreachableError
from gpufleet.engine.output import HostLines

TAIL_LINES = 30
KEEPALIVES_UNANSWERED = 3  # like OpenSSH's ServerAliveCountMax: the link counts as dead after this many
# On a slow link the waits that follow a connect are scaled by its measured round trip (LinkTimes). A lost segment
# costs TCP an RTO (>= 200 ms + a round trip) and each loss of the same segment doubles it: a link counts as dead only
# after this many round trips without an acknowledgement, and a reconnect gets this many for its SSH handshake (a
# handshake takes ~4 round trips, a lost segment several more).
DEAD_LINK_ROUND_TRIPS = 20
HANDSHAKE_ROUND_TRIPS = 20
MAX_ROUND_TRIP = 5.0  # a host slow to answer (not a link) must not stretch the waits without end
# How long paramiko's reader thread waits on an idle socket before it looks again (paramiko's own is 0.1 s): it only
# checks keepalives and its own closing then, and data wakes it at once. Ten wake-ups a second per connection cost the
# control node 0.38 ms of CPU per idle session-second; 256 light hosts with 64 in flight took 4.6 s of its CPU, 3.5 s
# with this (bench/bench_scale.py).
IDLE_POLL = 1.0
# What paramiko and the socket raise when the link breaks under a channel (EOF, reset, "SSH session not active").
TRANSPORT_ERRORS = (OSError, EOFError, paramiko.SSHException)

# paramiko logs connection failures with tracebacks; gpufleet reports them itself, once, as one clear line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())
logging.getLogger("paramiko").propagate = False


@dataclass
class Result:
    """What one remote command did."""

    host: str
    step: str
    command: str  # masked
    exit_code: int | None
    output: str  # stdout and stderr, in order, secrets masked
    seconds: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = TAIL_LINES) -> str:
        return "\n".join(self.output.rstrip("\n").splitlines()[-lines:])


@dataclass(frozen=True)
class LinkTimes:
    """A connection's measured round trip and the waits scaled by it (never below the inventory's own values)."""

    round_trip: float  # seconds: one request and its answer over the open connection
    handshake: float  # seconds a reconnect's TCP connect + SSH handshake may take
    dead_after: float  # seconds of unacknowledged data before the link counts as dead (0: keepalive off)

    @classmethod
    def scaled(cls, settings, round_trip: float) -> "LinkTimes":
        keepalive = int(settings.keepalive)  # as paramiko's set_keepalive takes it: 0.5 is off
        round_trip = min(round_trip, MAX_ROUND_TRIP)
        dead = max(keepalive * KEEPALIVES_UNANSWERED, DEAD_LINK_ROUND_TRIPS * round_trip) if keepalive > 0 else 0.0
        return cls(round_trip, max(float(settings.connect_timeout), HANDSHAKE_ROUND_TRIPS * round_trip), dead)


def measure_round_trip(transport: paramiko.Transport) -> float:
    """One round trip over an open connection: a `keepalive@openssh.com` global request, which sshd answers at once
    (OpenSSH's own ServerAliveInterval probe; no channel is opened, so a host's facts stay one exec channel). A host
    slower than MAX_ROUND_TRIP to answer counts as that slow. Raises only when the connection itself broke."""
    started = time.monotonic()
    answered = threading.Event()

    def ask() -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:  # noqa: BLE001 - a broken link shows below as an inactive transport
            pass
        finally:
            answered.set()
    # paramiko's wait has no limit of its own: the thread ends when the answer comes or the transport closes
    threading.Thread(target=ask, name="gpufleet-rtt", daemon=True).start()
    answered.wait(MAX_ROUND_TRIP)
    if not transport.is_active():
        raise EOFError("the connection closed")
    return min(time.monotonic() - started, MAX_ROUND_TRIP)


def _transport_offering_certificates(sock, **kwargs) -> paramiko.Transport:
    """A transport that asks for the host's certificate first (an @cert-authority vouches for the host)."""
    transport = paramiko.Transport(sock, **kwargs)
    transport.get_security_options().key_types = openssh.preferred_key_types(certified=True)
    return transport


def _key_with_certificate(host: str, identity: str, certificate: str) -> paramiko.PKey:
    """The identity's private key carrying the CertificateFile's certificate (OpenSSH's CertificateFile)."""
    try:
        key = paramiko.PKey.from_path(os.path.expanduser(identity))
        key.load_certificate(os.path.expanduser(certificate))
    except (OSError, ValueError, paramiko.SSHException) as exc:
        raise UnreachableError(f"host {host}: ssh_config's IdentityFile {identity} with CertificateFile "
                               f"{certificate} cannot be used: {exc}") from None
    return key


class HostSession:
    """An open SSH connection to one inventory host; every command of a run goes through it."""

    def __init__(self, host, settings, *, secrets: tuple[str, ...] = (), gateway: "HostSession | None" = None,
                 dialed: Dialed | None = None):
        self.host = host
        self.settings = settings
        self.become = become_mod.Become.of(host)
        password = self.become.password if self.become else None
        self.secrets = tuple(secrets) + ((password,) if password else ())
        self.gateway = gateway
        self.conn: Connection | None = None
        self.results: list[Result] = []
        self.link: LinkTimes | None = None  # measured at the first open; reconnects are given its handshake time
        self.dialed = dialed  # TCP connections opened early (engine/dial.py): the first open may take this host's

    @property
    def name(self) -> str:
        return self.host.name

    def adopt(self, host, settings, secrets: tuple[str, ...]) -> None:
        """Take the run's own host, settings and secrets after logging in with a view of them (cli/early.py: the
        same login values, validated since, for a host without sudo, whose login needs nothing else)."""
        if getattr(host, "become", False) or self.become is not None:
            raise ValueError(f"host {host.name}: a session logged in from a view cannot take sudo")
        self.host, self.settings, self.secrets = host, settings, tuple(secrets)

    def _config(self) -> Config:
        ssh_config = getattr(self.settings, "ssh_config", None)
        if ssh_config:
            path = os.path.expanduser(str(ssh_config))
            if os.path.exists(path):
                return Config(ssh_config=paramiko.SSHConfig.from_text(openssh.expand_includes(path)),
                              overrides={"load_ssh_configs": False})
        return Config(overrides={"load_ssh_configs": False})

    def connection(self, label: str | None = None) -> Connection:
        """Build (not open) the Fabric connection with the inventory's values over ~/.ssh/config's; `label` names the
        host in host-key errors (a jump host is named as the jump host of the target it carries)."""
        kwargs: dict = {"allow_agent": True}  # as OpenSSH: an IdentityFile is tried first, the agent still after it
        if self.host.identity_file:
            kwargs["key_filename"] = os.path.expanduser(self.host.identity_file)
        kwargs["look_for_keys"] = not self.host.identity_file
        conn = Connection(
            self.host.address, user=self.host.user, port=self.host.port, config=self._config(),
            connect_timeout=_whole_seconds(self.link.handshake if self.link else self.settings.connect_timeout),
            connect_kwargs=kwargs,
            gateway=self.gateway.connection(label=f"{self.name}'s jump host {self.gateway.name}")
            if self.gateway else None,
        )
        certificate = conn.ssh_config.get("certificatefile")  # paramiko gives a string, identityfile a list
        if certificate and not self.host.identity_file and conn.ssh_config.get("identityfile"):
            certificate = certificate if isinstance(certificate, str) else certificate[0]
            conn.connect_kwargs["pkey"] = _key_with_certificate(self.name, conn.ssh_config["identityfile"][0],
                                                                certificate)
        self._guard(conn, label or self.name)
        if isinstance(conn.gateway, Connection) and self.gateway is None:
            # a ProxyJump from ssh_config: Fabric builds it with a trust-anything policy; it gets ours
            self._guard(conn.gateway, f"{self.name}'s jump host {conn.gateway.host}")
        return conn

    def _guard(self, conn: Connection, label: str) -> None:
        """Judge conn's host key with OpenSSH's files and rules (known_hosts, ssh_known_hosts, @revoked,
        @cert-authority, StrictHostKeyChecking), never with Fabric's default of trusting any key."""
        config = conn.ssh_config
        settings_set = getattr(self.settings, "model_fields_set", set())
        if "known_hosts" in settings_set or not config.get("userknownhostsfile"):
            user_files = [Path(os.path.expanduser(str(self.settings.known_hosts)))]
        else:
            user_files = [Path(os.path.expanduser(f)) for f in config["userknownhostsfile"].split()]
        system_files = [Path(os.path.expanduser(f)) for f in config.get("globalknownhostsfile", "").split()] \
            or [openssh.GLOBAL_KNOWN_HOSTS]
        known = openssh.KnownHosts.load(user_files + system_files)
        names = [openssh.host_name(conn.host, conn.port)]
        strict = str(config.get("stricthostkeychecking", "yes")).lower()
        strict = {"off": "no", "false": "no", "ask": "yes", "true": "yes", "on": "yes"}.get(strict, strict)
        if self.settings.accept_new_host_keys:
            strict = "accept-new" if strict != "no" else strict
        conn.client.get_host_keys().clear()
        conn.client.set_missing_host_key_policy(
            openssh.HostKeyPolicy(known, names, strict=strict, record=user_files[0], host=label))
        if known.authorities(names):
            conn.connect_kwargs["transport_factory"] = _transport_offering_certificates

    def open(self) -> "HostSession":
        conn = self.connection()
        dialed, self.dialed = self.dialed, None  # a reconnect dials anew
        try:
            if dialed is not None:
                sock = dialed.take(self.name, conn.host, conn.port, direct=conn.gateway is None)
                if sock is not None:
                    conn.connect_kwargs["sock"] = sock  # paramiko skips its own connect; timeouts stay as given
            conn.open()
        except HostKeyError:
            raise
        except paramiko.AuthenticationException as exc:
            raise UnreachableError(f"host {self.name} ({self.host.address}): authentication failed: {exc}") from None
        except (socket.timeout, TimeoutError):
            raise UnreachableError(f"host {self.name} ({self.host.address}): no answer within "
                                   f"{self.settings.connect_timeout}s") from None
        except (OSError, paramiko.SSHException, EOFError) as exc:
            raise UnreachableError(f"host {self.name} ({self.host.address}): cannot connect: "
                                   f"{exc or type(exc).__name__}") from None
        self.conn = conn
        no_delay(getattr(conn.transport, "sock", None))  # a socket paramiko dialled itself (dial.py sets its own)
        if self.link is None:
            try:
                self.link = LinkTimes.scaled(self.settings, measure_round_trip(conn.transport))
            except (OSError, EOFError, paramiko.SSHException) as exc:
                self.close()
                raise UnreachableError(f"host {self.name} ({self.host.address}): the connection broke just after "
                                       f"login: {exc or type(exc).__name__}") from None
        conn.transport.set_keepalive(int(self.settings.keepalive))
        _poll_less(conn.transport)
        _give_up_on_dead_link(conn.transport, self.link.dead_after)
        if self.become is not None:
            try:
                become_mod.prove(self, self.become)  # before anything else runs: one clear error, never a hang
            except BaseException:
                self.close()
                raise
        return self

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def __enter__(self) -> "HostSession":
        return self.open() if self.conn is None else self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self.conn and self.conn.transport and self.conn.transport.is_active())

    def reconnect(self) -> None:
        self.close()
        self.open()

    def run(self, cmd: Cmd, step: str, *, check: bool = True, timeout: float | None = None,
            echo: Callable[[str], None] | None = None, sent: Callable[[], None] | None = None) -> Result:
        """Run cmd on the host; output is masked, optionally echoed line by line; failures raise with context.
        sent: called once the command (and its stdin) is on its way, before its answer is awaited."""
        if not self.alive:
            self.open()
        secrets = self.secrets + tuple(cmd.secrets())
        wired = self.wire(cmd)
        shown = cmd.display()
        # Mask whole lines, not chunks: a secret may straddle two reads.
        lines = HostLines(self.name, sink=lambda line: echo(mask(line, secrets))) if echo else None
        started = time.monotonic()
        chunks: list[str] = []
        exit_code: int | None = None
        lost = False  # the link broke (not a timeout): ConnectionLost when checked
        try:
            chan = self.conn.transport.open_session()
        except (*TRANSPORT_ERRORS, AttributeError) as exc:  # AttributeError: the connection closed meanwhile
            chan, lost = None, True
            chunks.append(f"[gpufleet] connection lost before the command started: {_why(exc)}\n")
        try:
            if chan is None:
                raise _NotStarted
            chan.set_combine_stderr(True)
            chan.settimeout(timeout if timeout else None)
            chan.exec_command(wired.text)
            if wired.stdin:
                chan.sendall(wired.stdin)
                chan.shutdown_write()  # sudo -S reads one line; EOF after it, so a wrong password cannot hang
            if sent is not None:
                sent()
            decoder = _Utf8Decoder()
            while True:
                data = chan.recv(32768)
                if not data:
                    break
                text = decoder.feed(data)
                chunks.append(text)
                if lines:
                    lines.feed(text)
            exit_code = chan.recv_exit_status()
            if exit_code == -1 and not (self.conn.transport and self.conn.transport.is_active()):
                exit_code, lost = None, True  # the connection closed under the command: no exit status came
                chunks.append("\n[gpufleet] connection lost: the host stopped answering\n")
        except (socket.timeout, TimeoutError):
            exit_code = None
            chunks.append(f"\n[gpufleet] no output for {timeout}s: command abandoned\n")
        except _NotStarted:
            pass
        except TRANSPORT_ERRORS as exc:
            exit_code, lost = None, True
            chunks.append(f"\n[gpufleet] connection lost: {_why(exc)}\n")
        finally:
            if chan is not None:
                with contextlib.suppress(*TRANSPORT_ERRORS):  # closing over a dead link must not hide the result
                    chan.close()
            if lines:
                lines.flush()
        result = Result(self.name, step, shown, exit_code, mask("".join(chunks), secrets), time.monotonic() - started)
        self.results.append(result)
        if check and lost:
            raise ConnectionLost(result, cmd)
        if check and exit_code != 0:
            raise RemoteCommandError(result, cmd)
        return result

    @contextlib.contextmanager
    def _transport_guard(self, step: str, what: str):
        """A transfer or channel open whose link breaks raises ConnectionLost (exit_code None) naming host and step;
        an SFTP answer such as FileNotFoundError, or a refused channel on a live link, passes through as it is."""
        started = time.monotonic()
        try:
            yield
        except TRANSPORT_ERRORS + (AttributeError,) as exc:
            if not isinstance(exc, EOFError) and self.alive:
                raise
            result = Result(self.name, step, what, None, f"[gpufleet] connection lost: {_why(exc)}\n",
                            time.monotonic() - started)
            self.results.append(result)
            raise ConnectionLost(result, None) from None

    def _open_transport(self) -> paramiko.Transport:
        if not self.alive:
            self.open()
        return self.conn.transport

    def wire(self, cmd: Cmd) -> become_mod.Wire:
        """cmd as this host runs it: through sudo on a become host (see engine/become.py), else as rendered."""
        return become_mod.wire(cmd, self.become)

    def channel(self, cmd: Cmd) -> paramiko.Channel:
        """A new exec channel running cmd, for callers that stream its stdin and stdout themselves; close it after.
        On a become host with a sudo password, the password line is already sent: the caller's stdin follows it."""
        with self._transport_guard("channel", cmd.display()):
            chan = self._open_transport().open_session()
            try:
                wired = self.wire(cmd)
                chan.exec_command(wired.text)
                if wired.stdin:
                    chan.sendall(wired.stdin)
            except BaseException:
                with contextlib.suppress(*TRANSPORT_ERRORS):
                    chan.close()
                raise
        return chan

    def tunnel(self, port: int, host: str = "127.0.0.1", *, timeout: float | None = None) -> paramiko.Channel:
        """A direct-tcpip channel to host:port as seen from the host; paramiko.ChannelException when refused."""
        return self._open_transport().open_channel("direct-tcpip", (host, port), ("127.0.0.1", 0), timeout=timeout)

    def _sftp(self):
        self._open_transport()
        return self.conn.sftp()

    def put(self, local, remote: str) -> None:
        """Copy a local file to remote over SFTP, atomically (written as remote.part, then renamed). On a become
        host SFTP runs as the login user: the file goes to a private temp path, then a privileged move puts it."""
        with self._transport_guard("sftp put", f"put {local} -> {remote}"):
            self._put(local, remote)

    def _put(self, local, remote: str) -> None:
        sftp = self._sftp()
        if self.become is not None:
            tmp = self._login_temp()
            try:
                sftp.put(str(local), tmp)
                self._place(tmp, remote, 0o644)
            finally:
                self._drop(tmp)
            return
        sftp.put(str(local), remote + ".part")
        sftp.posix_rename(remote + ".part", remote)

    def get(self, remote: str, local) -> None:
        """Copy remote to a local file over SFTP; OSError (FileNotFoundError) when the host has no such file."""
        with self._transport_guard("sftp get", f"get {remote} -> {local}"):
            self._get(remote, local)

    def _get(self, remote: str, local) -> None:
        if self.become is not None:
            with self._readable_copy(remote) as tmp:
                self._sftp().get(tmp, str(local))
            return
        self._sftp().get(remote, str(local))

    def get_text(self, remote: str) -> str:
        """The text of a remote file, read over SFTP; OSError (FileNotFoundError) when there is none."""
        with self._transport_guard("sftp read", f"read {remote}"):
            return self._get_text(remote)

    def _get_text(self, remote: str) -> str:
        if self.become is not None:
            with self._readable_copy(remote) as tmp, self._sftp().open(tmp) as f:
                return f.read().decode()
        with self._sftp().open(remote) as f:
            return f.read().decode()

    def put_text(self, text: str, remote_path: str, mode: int = 0o644) -> None:
        """Write a file on the host atomically (temp file + rename), with the given mode, over SFTP."""
        with self._transport_guard("sftp write", f"write {remote_path}"):
            self._put_text(text, remote_path, mode)

    def _put_text(self, text: str, remote_path: str, mode: int) -> None:
        sftp = self._sftp()
        if self.become is not None:
            tmp = self._login_temp()
            try:
                with sftp.file(tmp, "w") as f:
                    f.write(text.encode())
                self._place(tmp, remote_path, mode)
            finally:
                self._drop(tmp)
            return
        tmp = f"{remote_path}.gpufleet-tmp"
        with sftp.file(tmp, "w") as f:
            f.write(text.encode())
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, remote_path)

    # ---- SFTP on a become host: the login user's temp file, a privileged move or copy -------------------------------
    def _login_temp(self) -> str:
        """A new empty file only the login user can read (mktemp: 0600)."""
        return self.run(Cmd.of("mktemp", "/tmp/.gpufleet-sftp.XXXXXXXX", login=True), step="sftp").output.strip()

    def _drop(self, tmp: str) -> None:
        try:
            self.run(Cmd.of("rm", "-f", "--", tmp, login=True), step="sftp", check=False)
        except GpufleetError:
            pass

    def _place(self, tmp: str, remote: str, mode: int) -> None:
        """Privileged: tmp's content at remote, atomically, with mode; owned by root, or by the owner of remote's
        directory when that is someone else (a file in the login user's own directory stays theirs)."""
        self.run(Cmd.of("bash", "-c", _PLACE, "place", tmp, remote, f"{mode:o}"), step="sftp")

    @contextlib.contextmanager
    def _readable_copy(self, remote: str):
        """Privileged: a copy of remote that the login user can read; FileNotFoundError when there is none."""
        login = self.host.user or ""
        result = self.run(Cmd.of("bash", "-c", _READABLE, "readable", remote, login), step="sftp", check=False)
        if result.exit_code == 3:
            raise FileNotFoundError(2, "No such file", remote)
        if result.exit_code != 0:
            raise RemoteCommandError(result, None)
        tmp = result.output.strip().splitlines()[-1]
        try:
            yield tmp
        finally:
            self._drop(tmp)


# $1 temp file (the login user's), $2 target, $3 octal mode
_PLACE = r"""d=$(dirname -- "$2"); o=$(stat -c %u:%g -- "$d") || exit 1
part="$2.gpufleet-tmp"; cp -- "$1" "$part" && chown "$o" -- "$part" && chmod "$3" -- "$part" && mv -f -- "$part" "$2"
"""
# $1 the file, $2 the login user: prints a temp copy only the login user can read; exit 3 when there is no file
_READABLE = r"""[ -f "$1" ] || exit 3
t=$(mktemp /tmp/.gpufleet-sftp.XXXXXXXX) && cp -- "$1" "$t" && chown -- "${2:-$SUDO_USER}" "$t" && echo "$t"
"""


def _whole_seconds(timeout: float) -> int:
    """Fabric keeps int(connect_timeout): 0.5 would be 0, no limit at all, and 6.6 would be 6; round up instead."""
    return max(1, math.ceil(timeout))


def _poll_less(transport) -> None:
    """The reader thread's idle wait at IDLE_POLL instead of paramiko's 0.1 s (a socket of a direct connection; a
    ProxyJump channel keeps its own). Closing the transport shuts the socket down first: the reader thread, waiting
    on it for up to IDLE_POLL, would otherwise hold the connection open (no FIN to the host) until its wait ended."""
    sock = getattr(transport, "sock", None)
    if not isinstance(sock, socket.socket):
        return
    sock.settimeout(IDLE_POLL)
    close = transport.close

    def close_at_once() -> None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # closed already, or the link is gone
        close()
    transport.close = close_at_once


def _give_up_on_dead_link(transport, dead_after: float) -> None:
    """With keepalive on, a link that acknowledges nothing for `dead_after` seconds (KEEPALIVES_UNANSWERED keepalives,
    more on a slow link: LinkTimes) is dead: the kernel closes the socket (TCP_USER_TIMEOUT), so a command waiting for
    output fails as a lost connection instead of blocking until TCP gives up (~15 min). Direct TCP connections only
    (a ProxyJump channel has no socket)."""
    sock = getattr(transport, "sock", None)
    if dead_after > 0 and hasattr(socket, "TCP_USER_TIMEOUT") and isinstance(sock, socket.socket):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(dead_after * 1000))


class _NotStarted(Exception):
    """The command's channel could not be opened: the link broke before it started."""


def _why(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


class _Utf8Decoder:
    """Decode a byte stream whose chunks may split a UTF-8 character."""

    def __init__(self):
        import codecs

        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, data: bytes) -> str:
        return self._dec.decode(data)
