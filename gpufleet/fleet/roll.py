"""A rolling run across hosts: canary first, then batches; each host proven healthy or rolled back; stop on failures."""

from __future__ import annotations

import json
import math
import os
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.engine.runner import for_each_host
from gpufleet.fleet import hoststate, runrecords
from gpufleet.fleet.hoststate import pid_alive

# Outcomes of one host in a roll.
DONE = ("ok", "unchanged")
# A host the roll started on and never finished (in flight when it was killed, or stopped by a second Ctrl-C): its
# state is unknown until a --resume re-checks it.
IN_FLIGHT = ("running", "interrupted")


@dataclass
class HostResult:
    """What the roll did on one host, step by step."""

    host: str
    # ok | unchanged | failed | rolled-back | rollback-failed | unreachable | not-reached | running (in flight) |
    # interrupted (the roll stopped while it ran: its state is unknown)
    outcome: str = "not-reached"
    steps: list[str] = field(default_factory=list)
    error: str | None = None
    snapshot: str | None = None
    batch: int | None = None
    server_was_active: bool = False  # before the roll stopped it: a rollback must bring it back
    started: str | None = None
    seconds: float = 0.0
    router: dict | None = None  # drain and rejoin through the router (fleet/drain.py): times, state, drain seconds
    speed: dict | None = None  # the speed gate's figures: before, after, slowdown_percent, passed


@dataclass
class RollSummary:
    """The machine-readable record of a roll (runs/<stamp>/summary.json)."""

    kind: str  # upgrade | deploy-model
    started: str
    command: str
    hosts: list[str]
    batches: list[list[str]]
    max_fail: int
    status: str = "running"  # running | completed | stopped | interrupted (Ctrl-C, or killed) | failed (an error)
    results: dict[str, HostResult] = field(default_factory=dict)
    resumed_from: str | None = None
    inventory: str = ""  # resolved path: --resume continues rolls of the same inventory only
    pid: int = 0  # of the process running it: a "running" roll whose process is gone was killed
    lock: str | None = None  # the fleet lock later hosts converge to (given, or recorded from the canary)
    note: str | None = None  # why it stopped when no host says (Ctrl-C, killed, an unexpected error)
    out_of_router: list[str] = field(default_factory=list)  # hosts this roll took out of the router and left out

    def to_json(self) -> dict:
        data = asdict(self)
        data["results"] = [asdict(self.results[h]) for h in self.hosts]
        return data

    @classmethod
    def from_json(cls, data: dict) -> "RollSummary":
        results = {r["host"]: HostResult(**r) for r in data.pop("results")}
        return cls(**data, results=results)


def batch_size(spec: str, remaining: int) -> int:
    """`--batch 3` or `--batch 25%` (of the hosts after the canary, rounded up), at least 1."""
    text = str(spec).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 < pct <= 100:
                raise ValueError
            return max(1, math.ceil(remaining * pct / 100))
        size = int(text)
        if size < 1:
            raise ValueError
        return size
    except ValueError:
        raise ConfigError("--batch", "must be a positive number of hosts or a percentage like 25%",
                          value=spec, has_value=True) from None


def max_failures(spec, hosts: int) -> int:
    """`--max-fail 2` (hosts) or `--max-fail 10%` (of the roll's hosts, rounded down: 10% of 25 is 2): how many
    hosts may fail before the roll stops; the roll stops once more than that have failed."""
    text = str(spec).strip()
    try:
        if text.endswith("%"):
            pct = float(text[:-1])
            if not 0 <= pct <= 100 or pct != pct:
                raise ValueError
            return math.floor(hosts * pct / 100 + 1e-9)
        count = int(text)
        if count < 0:
            raise ValueError
        return count
    except ValueError:
        raise ConfigError("--max-fail", "must be a number of hosts (0 or more) or a percentage of the roll's hosts "
                          "like 10%", value=spec, has_value=True) from None


def plan_batches(hosts: list[str], canary: str | None, spec: str) -> list[list[str]]:
    """The canary alone first (the first host unless named), then the rest in batches of the given size."""
    if not hosts:
        return []
    canary = canary or hosts[0]
    if canary not in hosts:
        raise ConfigError("--canary", f"is not one of the selected hosts ({', '.join(hosts)})",
                          value=canary, has_value=True)
    rest = [h for h in hosts if h != canary]
    size = batch_size(spec, len(rest)) if rest else 1
    return [[canary]] + [rest[i:i + size] for i in range(0, len(rest), size)]


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")


class RunRecord:
    """runs/<stamp>/: one log per host and summary.json, written as the roll goes (a killed roll leaves a record)."""

    def __init__(self, runs_dir: Path, summary: RollSummary):
        self.dir = runrecords.new_dir(Path(runs_dir), summary.started)
        self.summary = summary
        self._lock = threading.Lock()  # hosts of one batch finish in parallel threads
        self.save()

    def save(self) -> None:
        with self._lock:
            tmp = self.dir / "summary.json.tmp"
            tmp.write_text(json.dumps(self.summary.to_json(), indent=2))
            tmp.replace(self.dir / "summary.json")

    def log(self, host: str, text: str) -> None:
        with open(self.dir / f"{host}.log", "a") as f:
            f.write(text if text.endswith("\n") else text + "\n")

    def log_session(self, session) -> None:
        """Every command the host's session ran, masked, with exit code and output."""
        for r in session.results:
            self.log(session.name, f"$ {r.command}  # step {r.step!r}, exit {r.exit_code}, {r.seconds:.1f}s\n"
                                   f"{r.output.rstrip()}\n")

    def abandon(self, status: str, note: str, unknown: str) -> list[str]:
        """The roll ends without finishing its hosts (Ctrl-C twice, an unexpected error): the status and why, and
        every host still in flight marked interrupted with `unknown` (what its state is and what to run). Returns
        those hosts."""
        marked = []
        for name in self.summary.hosts:
            result = self.summary.results[name]
            if result.outcome == "running":
                result.outcome, result.error = "interrupted", unknown.format(host=name)
                marked.append(name)
                self.log(name, f"interrupted: {result.error}")
        self.summary.status, self.summary.note = status, note
        self.save()
        return marked


def note_doing(doing: dict[str, str], line: str) -> None:
    """A `[host] text` line of a host in flight becomes what that host is doing (for a second Ctrl-C to say)."""
    if line.startswith("[") and "] " in line:
        host = line[1:line.index("] ")]
        if host in doing:
            doing[host] = line[line.index("] ") + 2:]


def in_flight(summary: RollSummary) -> list[str]:
    """The hosts a roll started and did not finish (a killed roll leaves them "running")."""
    return [h for h in summary.hosts if summary.results[h].outcome in IN_FLIGHT
            or (summary.results[h].outcome == "not-reached" and summary.results[h].started)]


def mark_killed(folder: Path, summary: RollSummary) -> str:
    """A roll record left "running" whose process is gone (SIGKILL, a crash, a reboot of the control node): rewrite
    it as interrupted, its hosts in flight as state unknown. Returns the note."""
    note = (f"interrupted: its process (pid {summary.pid}) was gone when `--resume` read this record "
            f"({utc_stamp()}); hosts in flight were left in an unknown state and are re-checked by the resume")
    for name in in_flight(summary):
        result = summary.results[name]
        result.outcome = "interrupted"
        result.error = (result.error + "\n" if result.error else "") + "the roll was killed while this host ran"
    summary.status, summary.note = "interrupted", note
    tmp = Path(folder) / "summary.json.tmp"
    tmp.write_text(json.dumps(summary.to_json(), indent=2))
    tmp.replace(Path(folder) / "summary.json")
    return note


def last_stopped(runs_dir: Path, kind: str, inventory: str = "") -> tuple[Path, RollSummary]:
    """The newest roll of this kind over this inventory that stopped (or was killed) before its end."""
    for path in runrecords.newest_first(runs_dir):
        data = json.loads(path.read_text())
        if data.get("kind") != kind or (inventory and data.get("inventory", "") != inventory):
            continue
        summary = RollSummary.from_json(data)
        if summary.status == "running" and pid_alive(summary.pid):
            raise ConfigError(str(path), f"that `{kind}` roll is still running (pid {summary.pid})")
        if summary.status == "completed":
            break
        return path.parent, summary
    raise ConfigError(str(runs_dir), f"no stopped `{kind}` roll to resume (the newest one completed, or none ran)")


def runs_dir(default: Path) -> Path:
    """Where roll records go: $GPUFLEET_RUNS_DIR, else runs/ in the project."""
    return Path(os.environ.get("GPUFLEET_RUNS_DIR") or default)


@dataclass
class Roll:
    """Runs the per-host procedure over batches; the procedure itself is given (upgrade+deploy, or deploy)."""

    inventory: object
    procedure: Callable  # (session, result: HostResult, say) -> None; raises GpufleetError on failure
    recover: Callable | None  # (session, result, say) -> None: roll the host back; None = --no-rollback
    max_fail: int = 0
    say: Callable[[str], None] = print
    secrets: tuple[str, ...] = ()
    on_host_done: Callable[[HostResult], None] | None = None  # e.g. the live view
    run_info: object = None  # hoststate.RunInfo: who runs the roll, for each host's audit record (None: no record)
    stopping: threading.Event = field(default_factory=threading.Event)  # Ctrl-C: finish the hosts in flight, stop
    doing: dict[str, str] = field(default_factory=dict)  # host in flight -> the last thing it said (see note_doing)

    def run(self, hosts: list, summary: RollSummary, record: RunRecord, skip: set[str] = frozenset()) -> RollSummary:
        by_name = {h.name: h for h in hosts}
        failures = 0
        for number, batch in enumerate(summary.batches, 1):
            todo = [by_name[n] for n in batch if n not in skip]
            if not todo:
                continue
            if self.stopping.is_set():
                break
            self.say(f"batch {number}/{len(summary.batches)}: {', '.join(h.name for h in todo)}")
            outcomes = for_each_host(todo, self.inventory, lambda s: self._one(s, number, summary, record),
                                     secrets=self.secrets)
            for out in outcomes:
                result = summary.results[out.host]
                if not out.ok:  # could not even connect
                    result.outcome, result.error = out.kind, out.error
                    record.log(out.host, f"error: {out.error}")
                if result.outcome not in DONE:
                    failures += 1
            record.save()
            if failures > self.max_fail:
                summary.status = "stopped"
                self.say(f"stopping the roll: {failures} host(s) failed, --max-fail is {self.max_fail}; "
                         f"hosts not reached are untouched; fix the cause, then run again with --resume")
                break
            if self.stopping.is_set():
                break
        else:
            summary.status = "completed"
        if self.stopping.is_set() and summary.status == "running":
            summary.status = "interrupted"
            summary.note = "interrupted (Ctrl-C): the hosts in flight finished or were restored; run again with --resume"
            self.say(f"roll interrupted: hosts not reached are untouched; `--resume` continues it")
        record.save()
        return summary

    def _one(self, session, number: int, summary: RollSummary, record: RunRecord) -> HostResult:
        result = summary.results[session.name]
        if self.stopping.is_set():  # Ctrl-C came while this host waited for a free slot: it stays untouched
            return result
        result.batch, result.started, result.error = number, utc_stamp(), None
        result.steps, result.outcome = [], "running"
        self.doing[session.name] = "starting"
        record.save()  # a roll killed now leaves this host "running": --resume re-checks it
        started = time.monotonic()

        def say(line: str) -> None:
            self.doing[session.name] = line
            self.say(f"[{session.name}] {line}")
            record.log(session.name, line)

        try:
            self.procedure(session, result, say)
            if result.outcome not in DONE:
                result.outcome = "ok"
        except Exception as exc:  # noqa: BLE001 - an unexpected error is a failure of this host, recorded as one
            result.outcome, result.error = "failed", str(exc)
            if not isinstance(exc, GpufleetError):
                result.error = f"unexpected error: {type(exc).__name__}: {exc}"
                record.log(session.name, traceback.format_exc())
            say(f"FAILED: {result.error}")
            self._recover(session, result, say)
        finally:
            result.seconds = round(time.monotonic() - started, 1)
            self.doing.pop(session.name, None)
            record.log_session(session)
            record.save()
            self._audit(session, result, summary, record)
            if self.on_host_done:
                self.on_host_done(result)
        return result

    def _recover(self, session, result: HostResult, say) -> None:
        """Roll the failed host back; "rolled-back" only when something was restored (recover returns False when
        there was nothing to undo: the host stays "failed", as it is)."""
        if self.recover is None:
            return
        try:
            if self.recover(session, result, say) is not False:
                result.outcome = "rolled-back"
        except Exception as again:  # noqa: BLE001 - recorded, like the failure it follows
            result.outcome = "rollback-failed"
            why = again if isinstance(again, GpufleetError) else f"unexpected error: {type(again).__name__}: {again}"
            result.error += f"\nrollback failed too: {why}"
            say(f"ROLLBACK FAILED: {why}")

    def _audit(self, session, result: HostResult, summary: RollSummary, record: RunRecord) -> None:
        """The roll's own line in the host's audit log: what became of the host in this roll (the executor's
        lines say what each run changed)."""
        run = self.run_info
        if run is None:
            return
        line = {"when": hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "who": run.who, "pid": run.pid,
                "command": run.command, "host": result.host, "roll": summary.started, "kind": f"{summary.kind} roll",
                "outcome": result.outcome, "steps": result.steps, "error": result.error, "snapshot": result.snapshot}
        try:
            hoststate.append_audit(session, line)
        except GpufleetError as exc:
            record.log(result.host, f"could not append the roll's record to {hoststate.AUDIT_LOG}: {exc}")
