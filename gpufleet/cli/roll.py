"""Rolling `inv upgrade` / `inv deploy-model` over several hosts: the record, the live view and the final table."""

from __future__ import annotations

import os

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from gpufleet.wheels.fetch import WheelCache
from gpufleet.cli import downloads
from gpufleet.cli import render
from gpufleet.cli import router_roll
from gpufleet.cli.common import exit_code
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.cli.progress import RollProgress
from gpufleet.cli.target import Target
from gpufleet.engine.command import mask
from gpufleet.engine.output import emit
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.fleet.procedures import RollProcedures
from gpufleet.fleet.roll import HostResult, Roll, RollSummary, RunRecord, runs_dir, utc_stamp

STYLE = {"ok": "green", "unchanged": "green", "failed": "red", "rolled-back": "yellow", "rollback-failed": "bold red",
         "unreachable": "red", "hostkey": "red", "not-reached": "dim"}


def roll(target: Target) -> int:
    """Roll target.task (upgrade | deploy-model) over target.hosts in target.batches; 0 when every host ended ok or
    unchanged. The per-host procedure is gpufleet.fleet.procedures.RollProcedures."""
    kind, chosen, hidden = target.task, list(target.hosts), target.hidden
    # Every part of the roll writes through this one sink, so a live view can take over all output at once.
    say = _Sink((lambda line: None) if target.json else (lambda line: emit(mask(line, hidden))))
    previous = target.resumed.summary if target.resumed else None
    if target.resumed:
        skip = {h for h, r in previous.results.items() if r.outcome in ("ok", "unchanged")}
        say(f"resuming the roll of {target.resumed.dir.name}: {', '.join(sorted(skip)) or 'no host'} done already")
    else:
        skip = set()
    summary = RollSummary(kind, utc_stamp(), target.command, [h.name for h in chosen],
                          [list(b) for b in target.batches], int(target.roll.max_fail),
                          resumed_from=previous.started if previous else None,
                          inventory=str(target.inventory.path.resolve()), pid=os.getpid(),
                          lock=target.lock.path if target.lock else None)
    summary.results = {h.name: (previous.results[h.name] if previous and h.name in skip else HostResult(h.name))
                       for h in chosen}
    record = RunRecord(runs_dir(fleet_dir() / "runs"), summary)
    say(f"rolling {kind} over {len(chosen)} host(s): {' | '.join(', '.join(b) for b in summary.batches)}; "
        f"record in {record.dir}")
    steps = RollProcedures(kind, stacks=target.stacks, repo=fleet_dir(), run=RunInfo.current(target.command), say=say,
                           summary=summary, record=record, given=target.lock, secrets=target.secrets,
                           download=target.download, command_timeout=target.inventory.settings.command_timeout,
                           selection=target.chosen_roles, snapshots_keep=target.inventory.settings.snapshots_keep,
                           wheels=WheelCache(progress=_download_progress(target)))
    steps.hooks = router_roll.hooks_for(target, summary, record, say)  # router drain/rejoin, speed gate
    procedure, recover = steps.hooks.wrap(steps.procedure, None if target.roll.no_rollback else steps.recover)
    roller = Roll(target.inventory, procedure, recover, max_fail=int(target.roll.max_fail), say=say, secrets=hidden)
    if target.json or not render.console.is_terminal:
        roller.run(chosen, summary, record, skip=skip)
    else:
        _run_live(roller, chosen, summary, record, skip, hidden, say)
    if target.json:
        render.print_json(summary.to_json())
    else:
        render.console.print(outcome_table(summary))
        if summary.out_of_router:
            render.console.print(escape(f"out of the router (re-add them once healthy): "
                                        f"{', '.join(summary.out_of_router)}"), style="bold red")
        render.console.print(escape(f"roll {summary.status}; record: {record.dir}"))
    return roll_exit_code(summary)


def roll_exit_code(summary: RollSummary) -> int:
    """0 when the roll completed with every host ok or unchanged; 3 when the only problem was hosts that could not
    be reached (hosts left untouched because the roll stopped there do not count); else 1."""
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
