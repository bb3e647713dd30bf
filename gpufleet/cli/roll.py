"""Rolling `inv upgrade` / `inv deploy-model` over several hosts: the per-host procedures and the final table."""

from __future__ import annotations

import os
from pathlib import Path

from rich.live import Live
from rich.markup import escape
from rich.table import Table

from gpufleet.config import lock
from gpufleet.fleet import lockstate
from gpufleet.cli import render
from gpufleet.fleet import rollback
from gpufleet.fleet.executor import Executor
from gpufleet.cli.common import REPO, load, selection
from gpufleet.cli.deploy import deploy_one, read_hf_token
from gpufleet.engine.command import Cmd, mask
from gpufleet.errors import GpufleetError
from gpufleet.facts.script import unit_name
from gpufleet.wheels.fetch import WheelCache
from gpufleet.fleet.health import Gate
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.engine.output import emit
from gpufleet.cli.progress import RollProgress
from gpufleet.fleet.roll import HostResult, Roll, RollSummary, RunRecord, last_stopped, plan_batches, runs_dir, utc_stamp
from gpufleet.config.stack import host_stacks
from gpufleet.roles.model_server import ModelServer, served_name

STYLE = {"ok": "green", "unchanged": "green", "failed": "red", "rolled-back": "yellow", "rollback-failed": "bold red",
         "unreachable": "red", "hostkey": "red", "not-reached": "dim"}


class StepFailed(GpufleetError):
    """One stage of a host's procedure failed; the message names the stage and the cause."""


def should_roll(inventory, host, hosts, resume: bool, canary: str | None, dry_run: bool) -> bool:
    """Several hosts (or --resume / --canary) roll one host at a time; a dry run just shows every plan."""
    if dry_run:
        return False
    if resume or canary:
        return True
    inv, _ = load(inventory, None)
    return len(selection(inv, host, hosts, default=None)) > 1


def roll(kind: str, command: str, inventory=None, stack=None, host=None, hosts=None, canary=None, batch="1",
         max_fail=0, no_rollback=False, resume=False, hf_token_file=None, download=False,
         accept_new_host_keys=False, as_json=False, lock_file=None) -> int:
    """Roll `kind` (upgrade | deploy-model) over the hosts; 0 when every host ended ok or unchanged.
    An upgrade roll converges every host to a fleet lock: the one given, else the one recorded from the first host
    to pass its health gate (the canary)."""
    inv, base = load(inventory, stack, accept_new_host_keys)
    given = lock.load(lock_file) if lock_file else None
    token = read_hf_token(hf_token_file)
    secrets = {"HF_TOKEN": token} if token else {}
    hidden = tuple(secrets.values())
    # Every part of the roll writes through this one sink, so a live view can take over all output at once.
    say = _Sink((lambda line: None) if as_json else (lambda line: emit(mask(line, hidden))))
    record_root = runs_dir(REPO / "runs")
    inventory_file = str(inv.path.resolve())
    if resume:
        previous_dir, previous = last_stopped(record_root, kind, inventory_file)
        chosen = selection(inv, None, ",".join(previous.hosts))
        batches = previous.batches
        skip = {h for h, r in previous.results.items() if r.outcome in ("ok", "unchanged")}
        say(f"resuming the roll of {previous_dir.name}: {', '.join(sorted(skip)) or 'no host'} done already")
    else:
        chosen = selection(inv, host, hosts, default=None)
        batches = plan_batches([h.name for h in chosen], canary, batch)
        previous, skip = None, set()
    stacks = host_stacks(base, inv, chosen)  # bad overrides fail here, before any host is touched
    if given is None and previous is not None and previous.lock:
        given = lock.load(previous.lock)  # the resumed roll's hosts converge to the same lock
    summary = RollSummary(kind, utc_stamp(), command, [h.name for h in chosen], batches, int(max_fail),
                          resumed_from=previous.started if previous else None, inventory=inventory_file,
                          pid=os.getpid(), lock=given.path if given else None)
    summary.results = {h.name: (previous.results[h.name] if previous and h.name in skip else HostResult(h.name))
                       for h in chosen}
    record = RunRecord(record_root, summary)
    say(f"rolling {kind} over {len(chosen)} host(s): {' | '.join(', '.join(b) for b in batches)}; "
        f"record in {record.dir}")
    run = RunInfo.current(command)
    upgrader = Executor(roles=_upgrade_roles(), run=run, repo=REPO, say=say, wheels=WheelCache(),
                       command_timeout=inv.settings.command_timeout)
    deployer = Executor(roles=[ModelServer(secrets=secrets, download=download)], run=run, repo=REPO, say=say,
                       command_timeout=inv.settings.command_timeout)
    planner = Executor(roles=_upgrade_roles(), run=run, repo=REPO, say=lambda line: None, dry_run=True)
    upgrader.lock = planner.lock = given
    handed: dict[str, list[dict]] = {}  # host -> wheels the control node handed it (recorded in the lock)

    def procedure(session, result, log):
        st = stacks[session.name]
        changed = False
        if kind == "upgrade":
            changed |= _upgrade(session, st, result, log, upgrader, planner, handed)
        prefix = f"[{session.name}] "
        done = deploy_one(deployer, session, st, lambda line: log(line.removeprefix(prefix)))
        result.snapshot = result.snapshot or done.report.snapshot
        if not done.report.ok:
            raise StepFailed(f"deploy-model on {session.name}: {done.report.error}")
        restarted = bool(done.report.with_status("changed"))
        changed |= restarted
        result.steps.append("deploy: " + ("unit/server updated" if restarted else "nothing to change"))
        result.steps.append(f"health: ok after {done.health['health_seconds']} s, smoke answer ok")
        if kind == "upgrade":
            _hold_to_lock(session, st, result, log, handed.get(session.name, []))
        result.outcome = "ok" if changed else "unchanged"

    def _hold_to_lock(session, st, result, log, wheels):
        """The first healthy host records the fleet lock; every later one must match it (else it is rolled back)."""
        if upgrader.lock is None:
            found = lockstate.record(session, st, wheels, command)
            path = lock.save(found, lock.locks_dir(REPO / "locks"), summary.started)
            upgrader.lock = planner.lock = lock.load(path)
            summary.lock = str(path)
            record.save()
            log(f"fleet lock recorded from {session.name}: {path} ({len(found.packages)} distributions, "
                f"{len(found.wheels)} wheel files)")
            result.steps.append(f"lock recorded: {path.name}")
            return
        d = lockstate.drift(session, upgrader.lock)
        if not d.matches:
            raise StepFailed(f"{session.name} does not match the fleet lock {upgrader.lock.path}: "
                             + "; ".join(d.packages + d.other))
        result.steps.append(f"matches lock {Path(upgrader.lock.path).name}")

    def recover(session, result, log):
        if not result.snapshot:
            log("nothing was changed before the failure: nothing to roll back")
            result.steps.append("rollback: nothing to undo")
            return
        info = rollback.describe(session, result.snapshot)
        rollback.restore(session, info, say=log)
        result.steps.append(f"rolled back to {result.snapshot}")
        unit = unit_name(session.host.service)
        if result.server_was_active and info.details.get("unit_active") != "active":
            session.run(Cmd.of("systemctl", "start", unit), step="start server after rollback")
        if result.server_was_active or info.details.get("unit_active") == "active":
            st = stacks[session.name]
            health = Gate(session, st, say=log).run(served_name(session.host, st))
            result.steps.append(f"healthy again on the old stack after {health['health_seconds']} s")

    roller = Roll(inv, procedure, None if no_rollback else recover, max_fail=int(max_fail), say=say, secrets=hidden)
    if as_json or not render.console.is_terminal:
        roller.run(chosen, summary, record, skip=skip)
    else:
        _run_live(roller, chosen, summary, record, skip, hidden, say)
    if as_json:
        render.print_json(summary.to_json())
    else:
        render.console.print(outcome_table(summary))
        render.console.print(f"roll {summary.status}; record: {record.dir}")
    return 0 if summary.status == "completed" and all(r.outcome in ("ok", "unchanged")
                                                      for r in summary.results.values()) else 1


class _Sink:
    """A say() whose destination can change while the roll runs."""

    def __init__(self, target):
        self.target = target

    def __call__(self, line: str) -> None:
        self.target(line)


def _run_live(roller: Roll, chosen, summary, record, skip, hidden, sink: _Sink) -> None:
    """On a terminal: the output lines scroll above a live table of each host's state, step and time."""
    progress = RollProgress([h.name for h in chosen])
    with Live(get_renderable=progress.table, console=render.console, refresh_per_second=2, transient=True) as live:
        def show(line: str) -> None:
            line = mask(line, hidden)
            progress.line(line)
            live.console.print(escape(line))
        sink.target = show
        roller.on_host_done = lambda result: progress.finish(result.host, result.outcome)
        roller.run(chosen, summary, record, skip=skip)


def _upgrade_roles():
    from gpufleet.roles import ROLES

    return ROLES


def _upgrade(session, st, result, log, upgrader: Executor, planner: Executor, handed: dict) -> bool:
    """Stop the server only when the upgrade will change something, then upgrade; True when it changed the host."""
    plan = planner.host(session, st)
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
    report = upgrader.host(session, st)
    handed[session.name] = report.wheels
    result.snapshot = report.snapshot
    if not report.ok:
        raise StepFailed(f"upgrade of {session.name}: {report.error}")
    result.steps.append(f"upgrade: {len(report.with_status('changed'))} step(s) changed")
    return True


def outcome_table(summary: RollSummary) -> Table:
    """One row per host in roll order: batch, outcome, what happened, how long."""
    table = Table(title=f"{summary.kind} roll: {summary.status}", title_justify="left")
    for column in ("host", "batch", "outcome", "what happened", "seconds"):
        table.add_column(column)
    for name in summary.hosts:
        r = summary.results[name]
        style = STYLE.get(r.outcome, "")
        detail = "; ".join(r.steps) + (f"\n[red]{escape(r.error.splitlines()[0])}[/]" if r.error else "")
        table.add_row(name, str(r.batch or "-"), f"[{style}]{r.outcome}[/]" if style else r.outcome,
                      escape(detail) if not r.error else detail, f"{r.seconds:.0f}" if r.seconds else "")
    return table
