"""Run one piece of work per host, in parallel up to the inventory's limit, collecting per-host outcomes."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

from gpufleet.engine.dial import Dialed
from gpufleet.errors import GpufleetError, HostKeyError, UnreachableError
from gpufleet.engine.ssh import HostSession


@dataclass
class HostOutcome:
    """How the work went on one host: a value, or the error that stopped it (its text, kind and the exception)."""

    host: str
    value: Any = None
    error: str | None = None
    kind: str = "ok"  # ok | unreachable | hostkey | failed
    exception: GpufleetError | None = field(default=None, repr=False)  # e.g. a RemoteCommandError's .result

    @property
    def ok(self) -> bool:
        return self.kind == "ok"


def gateway_for(host, inventory) -> HostSession | None:
    """The ProxyJump session of a host: another inventory host by name, or a user@host:port spec."""
    jump = getattr(host, "jump", None)
    if not jump:
        return None
    if jump in inventory.hosts:
        target = inventory.hosts[jump]
    else:
        target = inventory.jump_host(jump)
    return HostSession(target, inventory.settings, gateway=gateway_for(target, inventory))


def session_for(host, inventory, secrets: tuple[str, ...] = (), dialed: Dialed | None = None) -> HostSession:
    return HostSession(host, inventory.settings, secrets=secrets, gateway=gateway_for(host, inventory), dialed=dialed)


class _Opening:
    """One host's session being opened in a thread of its own: the session, and once `done`, why it failed if so."""

    def __init__(self, session: HostSession):
        self.session = session
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.abandoned = False  # nobody will take it: the thread closes it once its open ends
        self.lock = threading.Lock()

    def open(self) -> None:
        try:
            self.session.open()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever takes it, as its own open would raise it
            self.error = exc
        finally:
            with self.lock:
                self.done.set()
                if self.abandoned:
                    self.session.close()


class Opened:
    """Sessions opened ahead of the work that runs on them (while the control node still imports and plans what that
    work is), each taken once by for_each_host; the ones never taken are closed when the run leaves them."""

    def __init__(self, openings: dict[str, _Opening], secrets: tuple[str, ...], *, adopted: bool = False):
        self._openings = openings
        self.secrets = secrets
        # opened from views of the hosts (cli/early.py): whoever takes one gives it the run's host, settings and
        # secrets, which the login did not need
        self.adopted = adopted
        self._lock = threading.Lock()

    def names(self) -> set[str]:
        """The hosts still waiting to be taken."""
        with self._lock:
            return set(self._openings)

    def take(self, name: str, secrets: tuple[str, ...]) -> _Opening | None:
        """This host's opening (wait on its `done`), or None when it was not opened ahead with these secrets."""
        with self._lock:
            opening = self._openings.pop(name, None) if secrets == self.secrets or self.adopted else None
        return opening

    def close(self) -> None:
        """Close what was never taken; one still connecting is closed by its own thread (never waited for)."""
        with self._lock:
            left, self._openings = list(self._openings.values()), {}
        for opening in left:
            with opening.lock:
                opening.abandoned = True
                if opening.done.is_set():
                    opening.session.close()

    def __enter__(self) -> "Opened":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_ahead(hosts: list, inventory, secrets: tuple[str, ...] = (), parallelism: int | None = None,
               dialed: Dialed | None = None, adopted: bool = False) -> Opened:
    """Start opening the sessions of the hosts a for_each_host's first wave takes (as many as its parallelism), each
    in a daemon thread: the SSH handshakes and logins wait on the hosts while this process goes on. dialed: their
    TCP connections, opened before paramiko was imported (engine.dial.dial)."""
    limit = max(1, parallelism or inventory.settings.parallelism)
    openings = {host.name: _Opening(session_for(host, inventory, secrets, dialed)) for host in hosts[:limit]}
    for name, opening in openings.items():
        threading.Thread(target=opening.open, name=f"gpufleet-open-{name}", daemon=True).start()
    return Opened(openings, tuple(secrets), adopted=adopted)


def for_each_host(hosts: list, inventory, work: Callable[[HostSession], Any], *,
                  secrets: tuple[str, ...] = (), parallelism: int | None = None,
                  dialed: Dialed | None = None, opened: Opened | None = None) -> list[HostOutcome]:
    """Open one connection per host, run work(session) on each, never let one host's failure stop the others.
    dialed: TCP connections opened before paramiko was imported (engine.dial.dial), taken by the first opens;
    opened: sessions opened ahead (open_ahead), taken instead of opening them here."""
    limit = max(1, min(parallelism or inventory.settings.parallelism, len(hosts) or 1))

    def one(host) -> HostOutcome:
        ahead = opened.take(host.name, tuple(secrets)) if opened is not None else None
        session = ahead.session if ahead is not None else session_for(host, inventory, secrets, dialed)
        try:
            if ahead is not None:
                ahead.done.wait()
                if ahead.error is not None:
                    raise ahead.error
                if opened.adopted:
                    session.adopt(host, inventory.settings, tuple(secrets))
            with session:
                return HostOutcome(host.name, value=work(session))
        except HostKeyError as exc:
            return HostOutcome(host.name, error=str(exc), kind="hostkey", exception=exc)
        except UnreachableError as exc:
            return HostOutcome(host.name, error=str(exc), kind="unreachable", exception=exc)
        except GpufleetError as exc:
            return HostOutcome(host.name, error=str(exc), kind="failed", exception=exc)

    with ThreadPoolExecutor(max_workers=limit, thread_name_prefix="gpufleet-host") as pool:
        return list(pool.map(one, hosts))
