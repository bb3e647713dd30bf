"""What a role returns: steps (each with a reason) and Unchanged entries; the context a role plans in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Protocol, Union

from gpufleet.engine.command import Cmd, Raw
from gpufleet.errors import GpufleetError
from gpufleet.facts.checkout import redact_url

if TYPE_CHECKING:
    from gpufleet.facts.model import HostFacts
    from gpufleet.config.inventory import Host
    from gpufleet.config.lock import FleetLock
    from gpufleet.engine.ssh import Result
    from gpufleet.config.stack import Stack
    from gpufleet.roleapi import Declares


@dataclass(frozen=True)
class Upload:
    """A file the engine puts on the host before a step's commands: fetched from url once per run, sha256-checked."""

    url: str
    sha256: str | None  # None: the index published no hash; the control node hashes what it fetched
    remote: str  # absolute path on the host; the wheel keeps its file name so pip accepts it
    name: str = ""  # the distribution and version it holds (recorded in locks), when known
    version: str = ""


@dataclass(frozen=True)
class Step:
    """One change a role wants on a host, why, how to tell it is still needed, and how to check it worked."""

    role: str
    title: str
    reason: str
    commands: tuple[Cmd, ...]
    needed: Cmd | None = None  # re-run just before applying: exit 0 = still needed, exit 1 = already done
    verify: tuple[Cmd, ...] = ()  # must exit 0 afterwards
    timeout: float | None = None
    changes: tuple[str, ...] = ()  # what it touches: "venv", "checkout", "kernel", "unit", "cache"
    uploads: tuple[Upload, ...] = ()
    resumable: bool = False  # its commands pick up where they were after a lost connection: re-run, don't fail
    artifacts: tuple[str, ...] = ()  # build keys whose built wheel the control node caches afterwards

    def to_json(self) -> dict:
        return {"kind": "step", "role": self.role, "title": self.title, "reason": self.reason,
                "commands": [c.display() for c in self.commands],
                "needed": self.needed.display() if self.needed else None,
                "verify": [c.display() for c in self.verify], "changes": list(self.changes),
                "uploads": [{"url": redact_url(u.url), "sha256": u.sha256, "remote": u.remote} for u in self.uploads]}


@dataclass(frozen=True)
class Unchanged:
    """A part a role looked at and left alone, with the reason nothing must change."""

    role: str
    reason: str

    def to_json(self) -> dict:
        return {"kind": "unchanged", "role": self.role, "reason": self.reason}


PlanItem = Union[Step, Unchanged]
RemoteRead = Callable[[Cmd, str], "Result"]


@dataclass
class PlanContext:
    """What a role plans from: the host, its effective stack, its facts, a read-only remote read, the local repo."""

    host: Host
    stack: Stack
    facts: HostFacts
    read: RemoteRead | None  # read-only remote command at plan time (None in unit tests)
    repo: Path
    resolver: Callable[[], str] | None = None  # puts gpufleet's pinned pip wheel on the host; returns its path
    lock: "FleetLock | None" = None  # a recorded fleet lock the host must converge to


class Role(Protocol):
    """A planner for one part of the stack; a module with `name`, `declares` and `plan(ctx)` satisfies it."""

    name: str
    declares: Declares

    def plan(self, ctx: PlanContext) -> list[Step | Unchanged]: ...


def brief(cmd: Cmd) -> str:
    """A command as people read it in plans and errors: inline scripts and long arguments abbreviated."""
    def short(part):
        if isinstance(part, str) and ("\n" in part or len(part) > 100):
            lines = part.strip().count("\n") + 1
            return Raw(f"<script, {lines} lines>" if lines > 1 else f"<{len(part)}-character argument>")
        return part
    return Cmd(tuple(short(p) for p in cmd.argv), cmd.env, cmd.cwd).display()


class PlanError(GpufleetError):
    """A role cannot plan for a host (a fact it needs is missing or contradicts the stack)."""

    def __init__(self, host: str, role: str, problem: str):
        self.host, self.role, self.problem = host, role, problem
        super().__init__(f"host {host}: role {role} cannot plan: {problem}")
