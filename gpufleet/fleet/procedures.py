"""What a roll does on one host: stop, upgrade, deploy, health gate, hold to the fleet lock; or roll it back."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from gpufleet.config import lock
from gpufleet.config.stack import Stack
from gpufleet.engine.command import Cmd
from gpufleet.errors import ConnectionLost, GpufleetError
from gpufleet.facts.script import unit_name
from gpufleet.fleet import hoststate, lockstate, rollback
from gpufleet.fleet.executor import Executor, HostReport
from gpufleet.fleet.health import Gate
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.fleet.roll import HostResult, RollSummary, RunRecord
from gpufleet.roleapi import Selection
from gpufleet.roles.model_server import ModelServer, served_name
from gpufleet.wheels.fetch import WheelCache


class StepFailed(GpufleetError):
    """One stage of a host's procedure failed; the message names the stage and the cause."""


@dataclass
class Deployed:
    """One host's deploy: the executor's report and what the health gate saw."""

    report: HostReport
    health: dict | None = None

    def to_json(self) -> dict:
        return {**self.report.to_json(), "health": self.health}


def deploy_one(run: Executor, session, host_stack, say) -> Deployed:
    """Apply the model-server role on one host, then (unless a dry run) prove it healthy; never raises."""
    done = Deployed(run.host(session, host_stack))
    if done.report.ok and not run.dry_run:
        say(f"[{session.name}] health: waiting for /health, then a smoke generation")
        try:
            done.health = Gate(session, host_stack, say=lambda line: say(f"[{session.name}] {line}")).run(
                served_name(session.host, host_stack))
            say(f"[{session.name}] health: ok, smoke answer {done.health['smoke_answer'][:80]!r}")
        except GpufleetError as exc:
            done.report.outcome, done.report.error = "failed", str(exc)
            done.report.next_step = f"read the journal: journalctl -u {session.host.service} on {session.name}"
    return done


def _logged(say, record: RunRecord):
    """An executor's say: each line (`[host] text`) to the roll's output and into that host's log in the record
    (with --json the output shows nothing: the log keeps what happened, a stale lock taken over included)."""
    def both(line: str) -> None:
        say(line)
        if line.startswith("[") and "] " in line:
            record.log(line[1:line.index("] ")], line[line.index("] ") + 2:])
    return both


def _upgrade_roles():
    from gpufleet.roles import ROLES

    return ROLES


class RollProcedures:
    """The per-host procedure of an `upgrade` or `deploy-model` roll (Roll.procedure) and its undo (Roll.recover).

    An upgrade roll converges every host to a fleet lock: the one given, else the one recorded from the first host
    to pass its health gate (the canary), saved under repo/locks and named in the roll's summary."""

    def __init__(self, kind: str, *, stacks: dict[str, Stack], repo: Path, run: RunInfo, say: Callable[[str], None],
                 summary: RollSummary, record: RunRecord, given: lock.FleetLock | None = None,
                 secrets: dict[str, str] | None = None, download: bool = False,
                 command_timeout: float | None = None, selection: Selection | None = None,
                 snapshots_keep: int | None = None, wheels: WheelCache | None = None,
                 reconnect_for: float = rollback.RECONNECT_FOR, interrupted: RollSummary | None = None):
        self.kind, self.stacks, self.repo, self.summary, self.record = kind, stacks, repo, summary, record
        self.command, self.run = run.command, run
        self.reconnect_for = reconnect_for  # how long a rollback waits for a host that dropped off (a reboot)
        self.interrupted = interrupted  # the stopped roll a --resume continues: its hosts in flight are re-checked
        self.selection = selection
        say = _logged(say, record)  # what the executors say lands in each host's log of the record too
        self.upgrader = Executor(roles=_upgrade_roles(), run=run, repo=repo, say=say, wheels=wheels or WheelCache(),
                                 command_timeout=command_timeout, selection=selection, snapshots_keep=snapshots_keep,
                                 reconnect_for=reconnect_for)
        self.deployer = Executor(roles=[ModelServer(secrets=secrets or {}, download=download)], run=run, repo=repo,
                                 say=say, command_timeout=command_timeout, snapshots_keep=snapshots_keep)
        self.planner = Executor(roles=_upgrade_roles(), run=run, repo=repo, say=lambda line: None, dry_run=True,
                                selection=selection)
        self.upgrader.lock = self.planner.lock = given
        self.handed: dict[str, list[dict]] = {}  # host -> wheels the control node handed it (recorded in the lock)
        self.hooks = None  # fleet.drain.RollHooks: router drain and speed gate, called before the stop and after health

    def procedure(self, session, result, log) -> None:
        st = self.stacks[session.name]
        changed = False
        self._recheck(session, result, log)
        if self.hooks is not None:
            self.hooks.before_stop(session, result, log)
        if self.kind == "upgrade":
            changed |= self._upgrade(session, st, result, log)
        prefix = f"[{session.name}] "
        done = deploy_one(self.deployer, session, st, lambda line: log(line.removeprefix(prefix)))
        result.snapshot = result.snapshot or done.report.snapshot
        if not done.report.ok:
            raise StepFailed(f"deploy-model on {session.name}: {done.report.error}")
        restarted = bool(done.report.with_status("changed"))
        changed |= restarted
        result.steps.append("deploy: " + ("unit/server updated" if restarted else "nothing to change"))
        result.steps.append(f"health: ok after {done.health['health_seconds']} s, smoke answer ok")
        if self.hooks is not None:
            self.hooks.after_health(session, result, log)
        if self.kind == "upgrade":
            self._hold_to_lock(session, st, result, log, self.handed.get(session.name, []))
        result.outcome = "ok" if changed else "unchanged"

    def _upgrade(self, session, st, result, log) -> bool:
        """Stop the server only when the upgrade will change something, then upgrade; True when it changed the host."""
        plan = self.planner.host(session, st)
        if not plan.ok:
            raise StepFailed(f"planning the upgrade of {session.name}: {plan.error}")
        if not any(e.status == "planned" and (e.item.commands or e.item.uploads) for e in plan.entries):
            result.steps.append("upgrade: nothing to change")
            return False
        unit = unit_name(session.host.service)
        active = session.run(Cmd.of("systemctl", "is-active", "--quiet", unit), step="server running?", check=False)
        if active.exit_code == 0:
            result.server_was_active = True
            log(f"stopping {unit} for the upgrade")
            session.run(Cmd.of("systemctl", "stop", unit), step="stop server", timeout=600)
            result.steps.append("server stopped")
        report = self.upgrader.host(session, st)
        self.handed[session.name] = report.wheels
        result.snapshot = result.snapshot or report.snapshot  # a re-checked host keeps the interrupted run's one
        if not report.ok:
            raise StepFailed(f"upgrade of {session.name}: {report.error}")
        result.steps.append(f"upgrade: {len(report.with_status('changed'))} step(s) changed")
        return True

    def _hold_to_lock(self, session, st, result, log, wheels) -> None:
        """The first healthy host records the fleet lock; every later one must match it (else it is rolled back)."""
        if self.upgrader.lock is None and self.selection is not None:
            # a partial upgrade is no proven whole stack: record no lock from it (a given --lock is still held to)
            result.steps.append("no fleet lock recorded (--only/--skip ran part of the stack)")
            return
        if self.upgrader.lock is None and session.name not in self.handed:
            # the canary's upgrade changed nothing: no wheel was handed over, so a lock recorded now would lose where
            # its files came from; hold the roll to the newest lock this host matches, else record none
            held = self._matching_lock(session)
            if held is None:
                result.steps.append("no fleet lock recorded (nothing changed on this host: no wheel provenance)")
                return
            self.upgrader.lock = self.planner.lock = held
            self.summary.lock = str(held.path)
            self.record.save()
            log(f"{session.name} changed nothing and matches the fleet lock {held.path}: the roll is held to it")
            result.steps.append(f"matches lock {Path(held.path).name}")
            return
        if self.upgrader.lock is None:
            found = lockstate.record(session, st, wheels, self.command)
            path = lock.save(found, lock.locks_dir(self.repo / "locks"), self.summary.started)
            self.upgrader.lock = self.planner.lock = lock.load(path)
            self.summary.lock = str(path)
            self.record.save()
            log(f"fleet lock recorded from {session.name}: {path} ({len(found.packages)} distributions, "
                f"{len(found.wheels)} wheel files)")
            result.steps.append(f"lock recorded: {path.name}")
            return
        d = lockstate.drift(session, self.upgrader.lock)
        if not d.matches:
            raise StepFailed(f"{session.name} does not match the fleet lock {self.upgrader.lock.path}: "
                             + "; ".join(d.packages + d.other))
        result.steps.append(f"matches lock {Path(self.upgrader.lock.path).name}")

    def _matching_lock(self, session) -> lock.FleetLock | None:
        """The newest recorded fleet lock this host matches exactly, if any."""
        directory = lock.locks_dir(self.repo / "locks")
        for path in sorted(directory.glob("*.toml"), reverse=True) if directory.is_dir() else []:
            try:
                found = lock.load(path)
            except GpufleetError:
                continue  # an unreadable lock file is not one to hold a roll to
            if lockstate.drift(session, found).matches:
                return found
        return None

    def _recheck(self, session, result: HostResult, log) -> None:
        """A host the resumed roll left in flight (killed, or stopped by a second Ctrl-C) is in an unknown state:
        find the snapshot that run took before changing it, so a failure now restores the host as it was before
        that run (not a snapshot of whatever that run left); the plan then shows whether it is on the old stack,
        the new one, or between."""
        before = self.interrupted
        if before is None or before.results.get(session.name) is None:
            return
        previous = before.results[session.name]
        if previous.outcome not in ("running", "interrupted") and not (previous.outcome == "not-reached"
                                                                       and previous.started):
            return
        snap = previous.snapshot or rollback.snapshot_of_run(session, before.started, before.pid, before.command)
        where = f"roll {before.started} left {session.name} in an unknown state ({previous.outcome})"
        try:  # the audit log learns what became of that run here (a killed run wrote no line of its own)
            hoststate.append_audit(session, {
                "when": hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "who": self.run.who, "pid": before.pid,
                "command": before.command, "host": session.name, "roll": before.started,
                "kind": f"{before.kind} roll", "outcome": "interrupted", "snapshot": snap,
                "error": f"found by the --resume of pid {self.run.pid}: {before.note or 'the roll stopped'}"})
        except GpufleetError as exc:
            log(f"could not append to {hoststate.AUDIT_LOG}: {exc}")
        if snap:
            result.snapshot = snap
            log(f"{where}: re-checking it; that run saved the host before changing it in {snap}: a failure now "
                f"rolls back to that")
            result.steps.append(f"re-checked after the interrupted roll {before.started}: its snapshot {snap}")
        else:
            log(f"{where}: re-checking it; that run took no snapshot here, so it changed nothing on it")
            result.steps.append(f"re-checked after the interrupted roll {before.started}: it changed nothing here")

    def recover(self, session, result, log) -> bool:
        """Restore the snapshot taken before the host's upgrade; bring its server back healthy if it was running.
        Waits (bounded) for a host that dropped off, e.g. rebooting; False when there was nothing to undo."""
        def unlocked_snapshot():
            try:  # a lock this roll took and could not release when the link broke (token-checked: only ours)
                hoststate.release_claim(session, self.run)
            except ConnectionLost:
                raise
            except GpufleetError as exc:
                log(f"could not release this roll's lock on {session.name}: {exc}")
            return rollback.describe(session, result.snapshot) if result.snapshot else None

        info = rollback.reach_then(session, self.reconnect_for, unlocked_snapshot, log)
        if info is None:
            log("nothing was changed before the failure: nothing to roll back")
            result.steps.append("rollback: nothing to undo (this run changed nothing)")
            return False
        rollback.restore(session, info, say=log)
        result.steps.append(f"rolled back to {result.snapshot}")
        unit = unit_name(session.host.service)
        if result.server_was_active and info.details.get("unit_active") != "active":
            session.run(Cmd.of("systemctl", "start", unit), step="start server after rollback")
        if result.server_was_active or info.details.get("unit_active") == "active":
            st = self.stacks[session.name]
            health = Gate(session, st, say=log).run(served_name(session.host, st))
            result.steps.append(f"healthy again on the old stack after {health['health_seconds']} s")
        return True
