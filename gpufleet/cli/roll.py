"""Rolling `inv upgrade` / `inv deploy-model` over several hosts: the record, the live view and the final table."""

from __future__ import annotations

import os
import sys

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from gpufleet.wheels.fetch import WheelCache
from gpufleet.cli import downloads
from gpufleet.cli import render
from gpufleet.cli.common import EXIT_INTERRUPTED, exit_code, plan_memory
from gpufleet.cli.fleetdir import fleet_dir, prog
from gpufleet.cli.interrupts import Interrupts, raw
from gpufleet.cli import router_roll
from gpufleet.cli.progress import RollProgress
from gpufleet.cli.target import Target
from gpufleet.engine.command import mask
from gpufleet.engine.output import emit
from gpufleet.fleet import hoststate
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.fleet import survey
from gpufleet.fleet.procedures import RollProcedures
from gpufleet.fleet.survey import LeftOut
from gpufleet.fleet.roll import (HostResult, Roll, RollSummary, RunRecord, in_flight, mark_killed, note_doing,
                                 plan_batches, runs_dir, utc_stamp)
from gpufleet.engine.runner import Opened, session_for

STYLE = {"ok": "green", "unchanged": "green", "failed": "red", "rolled-back": "yellow", "rollback-failed": "bold red",
         "unreachable": "red", "hostkey": "red", "not-reached": "dim", "interrupted": "bold red", "running": "red"}


def roll(target: Target, opened: Opened | None = None) -> int:
    """Roll target.task (upgrade | deploy-model) over target.hosts in target.batches; 0 when every host ended ok or
    unchanged. The per-host procedure is gpufleet.fleet.procedures.RollProcedures. opened: sessions opened ahead
    for the survey (engine.runner.open_ahead)."""
    kind, chosen, hidden = target.task, list(target.hosts), target.hidden
    # Every part of the roll writes through this one sink, so a live view can take over all output at once.
    say = _Sink((lambda line: None) if target.json else (lambda line: emit(mask(line, hidden))))
    previous = target.resumed.summary if target.resumed else None
    if target.resumed:
        if previous.status == "running":  # last_stopped found its process gone: killed
            say(f"the roll of {target.resumed.dir.name} was killed (pid {previous.pid} is gone): "
                + mark_killed(target.resumed.dir, previous))
        unknown = in_flight(previous)
        if unknown:
            say(f"{', '.join(unknown)}: in flight when that roll stopped, state unknown: re-checked before anything "
                f"else (the snapshot that roll took is the rollback target)")
        skip = {h for h, r in previous.results.items() if r.outcome in ("ok", "unchanged")}
        say(f"resuming the roll of {target.resumed.dir.name}: {', '.join(sorted(skip)) or 'no host'} done already")
    else:
        skip = set()
    run = RunInfo.current(target.command)
    left = _survey(target, chosen, skip, set(in_flight(previous)) if previous else set(), run, say, opened)
    batches = [list(b) for b in target.batches]
    if left.hosts:
        rest = [h.name for h in chosen if h.name not in left.hosts]
        canary = target.roll.canary if target.roll.canary in rest else None
        if target.roll.canary and canary is None:
            say(f"the canary {target.roll.canary} is on target: {rest[0] if rest else 'no host'} goes first")
        batches = plan_batches(rest, canary, target.roll.batch)
    summary = RollSummary(kind, utc_stamp(), target.command, [h.name for h in chosen],
                          batches, int(target.roll.max_fail),
                          resumed_from=previous.started if previous else None,
                          inventory=str(target.inventory.path.resolve()), pid=os.getpid(),
                          lock=target.lock.path if target.lock else None)
    summary.results = {h.name: (previous.results[h.name] if previous and h.name in skip else HostResult(h.name))
                       for h in chosen}
    for name, steps_taken in left.hosts.items():
        summary.results[name] = HostResult(name, outcome="unchanged", steps=steps_taken)
    if left.held is not None:
        summary.lock = left.held.path
    record = RunRecord(runs_dir(fleet_dir() / "runs"), summary)
    try:  # from here on, whatever ends the roll leaves a record that says so
        say(f"rolling {kind} over {len(chosen) - len(left.hosts)} host(s): "
            f"{' | '.join(', '.join(b) for b in summary.batches) or 'none'}; record in {record.dir}")
        settings = target.inventory.settings
        doing: dict[str, str] = {}  # host in flight -> its last line, whoever said it

        def said(line: str) -> None:
            note_doing(doing, line)
            say(line)
        steps = RollProcedures(kind, stacks=target.stacks, repo=fleet_dir(), run=run, say=said,
                               summary=summary, record=record, given=target.lock, secrets=target.secrets,
                               download=target.download, command_timeout=settings.command_timeout,
                               selection=target.chosen_roles, snapshots_keep=settings.snapshots_keep,
                               wheels=WheelCache(progress=_download_progress(target)),
                               reconnect_for=settings.reconnect_for, interrupted=previous)
        if left.held is not None:  # the fleet is on a recorded lock: the hosts that differ converge to it
            steps.upgrader.lock = steps.planner.lock = left.held
        steps.hooks = router_roll.hooks_for(target, summary, record, said)  # router drain/rejoin, speed gate
        procedure, recover = steps.hooks.wrap(steps.procedure, None if target.roll.no_rollback else steps.recover)
        roller = Roll(target.inventory, procedure, recover, max_fail=int(target.roll.max_fail), say=said,
                      secrets=hidden, run_info=run, doing=doing)
        tell = (lambda line: emit(mask(line, hidden), sys.stderr)) if target.json else say
        interrupts = Interrupts(tell, lambda: sorted(roller.doing) or in_flight(summary),
                                lambda: _abandon(target, summary, record, roller, run),
                                doing="finishing (or restoring, if it fails)")
        roller.stopping = interrupts.requested
        with interrupts:
            if target.json or not render.console.is_terminal:
                roller.run(chosen, summary, record, skip=skip)
            else:
                _run_live(roller, chosen, summary, record, skip, hidden, say)
    except BaseException as exc:
        if summary.status == "running":  # an unexpected error (a bug), or Ctrl-C outside the guard: still recorded
            if isinstance(exc, KeyboardInterrupt):
                record.abandon("interrupted", "interrupted (Ctrl-C)", _unknown(kind))
            else:
                record.abandon("failed", f"stopped by an unexpected error: {type(exc).__name__}: {exc}",
                               _unknown(kind))
        raise
    if target.json:
        render.print_json(summary.to_json())
    else:
        render.console.print(outcome_table(summary))
        if summary.out_of_router:
            render.console.print(escape(f"out of the router (re-add them once healthy): "
                                        f"{', '.join(summary.out_of_router)}"), style="bold red")
        render.console.print(escape(f"roll {summary.status}; record: {record.dir}"
                                    + ("; run again with --resume to continue" if summary.status != "completed"
                                       else "")))
    return roll_exit_code(summary)


def _survey(target: Target, chosen, skip: set[str], unknown: set[str], run: RunInfo, say,
            opened: Opened | None = None) -> LeftOut:
    """Plan every host still to do read-only, side by side, and decide which are left out as they are (those a
    stopped roll left in flight are re-checked by the roll itself, never left out here)."""
    from gpufleet.config import lock
    from gpufleet.fleet.executor import Executor
    from gpufleet.roles import ROLES
    from gpufleet.roles.model_server import ModelServer

    todo = [h for h in chosen if h.name not in skip and h.name not in unknown]
    if not todo:
        return LeftOut({})
    server = ModelServer(secrets=target.secrets, download=target.download)
    roles = [*ROLES, server] if target.task == "upgrade" else [server]
    planner = Executor(roles=roles, run=run, repo=fleet_dir(), dry_run=True, say=lambda line: None,
                       lock=target.lock, selection=target.chosen_roles if target.task == "upgrade" else None,
                       read_memory=plan_memory(f"survey-{target.task}"))
    found = survey.survey(todo, target.inventory, planner, target.stacks, secrets=target.hidden,
                          build_keys=target.task == "upgrade", opened=opened)
    left = survey.decide(target.task, [h.name for h in todo], found, given=target.lock,
                         partial=target.chosen_roles is not None, locks=lock.locks_dir(fleet_dir() / "locks"))
    if left.hosts:
        say(f"on target, left as they are: {', '.join(left.hosts)}"
            + (f" (on the fleet lock {left.held.path})" if left.held else ""))
    for name in (n for n in found if n not in left.hosts):
        say(f"[{name}] to roll: {found[name].why}")
    if left.note:
        say(left.note)
    return left


def _unknown(kind: str) -> str:
    """What a host left in flight is, and what to run ({host} filled in per host)."""
    return (f"its state is unknown (it was being changed when the roll stopped); `{prog()} {kind} --resume` "
            f"re-checks it and continues, `{prog()} rollback --host {{host}}` restores its snapshot")


def _abandon(target: Target, summary: RollSummary, record: RunRecord, roller: Roll, run: RunInfo) -> None:
    """A second Ctrl-C: the hosts in flight are left as they are; the roll record and each one's audit log say
    their state is unknown and what to run. The lock stays on them: the next run takes it over (this pid is gone)."""
    doing = dict(roller.doing)
    marked = record.abandon("interrupted", "interrupted by a second Ctrl-C: hosts in flight were left as they were",
                            _unknown(summary.kind))
    for name in marked:
        result = summary.results[name]
        last = doing.get(name, "")
        raw(f"[{name}] stopped now{f' during: {last}' if last else ''}: {result.error}\n")
        _audit_interrupted(target, name, run, summary, result, last)
    raw(f"roll interrupted; record: {record.dir}\n")


def _audit_interrupted(target: Target, name: str, run: RunInfo, summary: RollSummary, result: HostResult,
                       last: str) -> None:
    """One audit line on the host over a fresh connection (its own one is busy in the thread left behind)."""
    host = next((h for h in target.hosts if h.name == name), None)
    if host is None:
        return
    line = {"when": hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "who": run.who, "pid": run.pid,
            "command": run.command, "host": name, "roll": summary.started, "kind": f"{summary.kind} roll",
            "outcome": "interrupted", "doing": last, "error": result.error, "snapshot": result.snapshot}
    try:
        with session_for(host, target.inventory, target.hidden) as session:
            hoststate.append_audit(session, line)
    except Exception as exc:  # noqa: BLE001 - the exit goes on: the roll record says it already
        raw(f"[{name}] could not write the audit record: {exc}\n")


def roll_exit_code(summary: RollSummary) -> int:
    """130 when the roll was interrupted (Ctrl-C); 0 when it completed with every host ok or unchanged; 3 when the
    only problem was hosts that could not be reached (hosts left untouched because the roll stopped there do not
    count); else 1."""
    if summary.status == "interrupted":
        return EXIT_INTERRUPTED
    kinds = ["ok" if r.outcome in ("ok", "unchanged") else r.outcome
             for r in summary.results.values() if r.outcome != "not-reached"]
    if summary.status != "completed" and all(k == "ok" for k in kinds):
        kinds.append("failed")  # stopped (or killed) without a host to blame
    return exit_code(kinds)


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


def outcome_table(summary: RollSummary) -> Table:
    """One row per host in roll order: batch, outcome, what happened, how long."""
    table = Table(title=f"{summary.kind} roll: {summary.status}", title_justify="left")
    for column in ("host", "batch", "outcome", "what happened", "seconds"):
        table.add_column(column)
    for name in summary.hosts:
        r = summary.results[name]
        style = STYLE.get(r.outcome, "")
        detail = escape("; ".join(r.steps)) + (f"\n[red]{escape(r.error.splitlines()[0])}[/]" if r.error else "")
        table.add_row(escape(name), str(r.batch or "-"), f"[{style}]{r.outcome}[/]" if style else escape(r.outcome),
                      detail, f"{r.seconds:.0f}" if r.seconds else "")
    return table


def _download_progress(target: Target):
    """Lines above the live table on a terminal (rich prints them there); lines on stderr in logs and with --json."""
    if target.json or not render.console.is_terminal:
        return downloads.reporter(Console(stderr=True, highlight=False), live_view=True)
    return downloads.reporter(render.console, live_view=True)
