"""Run one piece of work per host, in parallel up to the inventory's limit, collecting per-host outcomes."""

from __future__ import annotations

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


def for_each_host(hosts: list, inventory, work: Callable[[HostSession], Any], *,
                  secrets: tuple[str, ...] = (), parallelism: int | None = None,
                  dialed: Dialed | None = None) -> list[HostOutcome]:
    """Open one connection per host, run work(session) on each, never let one host's failure stop the others.
    dialed: TCP connections opened before paramiko was imported (engine.dial.dial), taken by the first opens."""
    limit = max(1, min(parallelism or inventory.settings.parallelism, len(hosts) or 1))

    def one(host) -> HostOutcome:
        session = session_for(host, inventory, secrets, dialed)
        try:
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
