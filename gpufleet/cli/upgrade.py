"""`inv upgrade`: select hosts, plan or apply the roles on each in parallel, print plans and outcomes."""

from __future__ import annotations

import contextlib
import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet.cli import downloads, render
from gpufleet.fleet.executor import HostReport, Executor
from gpufleet.cli.common import EXIT_INTERRUPTED, exit_code, plan_memory
from gpufleet.cli.fleetdir import fleet_dir, prog
from gpufleet.cli.interrupts import Interrupts, raw
from gpufleet.cli.target import Target
from gpufleet.facts.checkout import redact_url
from gpufleet.wheels.fetch import WheelCache
from gpufleet.fleet import hoststate
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.engine.output import emit
from gpufleet.plan import Step, brief
from gpufleet.engine.runner import Opened, for_each_host, session_for

STATUS_STYLE = {"planned": "[yellow]will change[/]", "unchanged": "[green]unchanged[/]",
                "done-already": "[green]already done[/]", "changed": "[cyan]changed[/]",
                "verified": "[green]verified[/]", "failed": "[bold red]FAILED[/]", "running": "[red]interrupted[/]",
                "skipped": "[dim]skipped[/]", "refused": "[bold red]refused[/]"}


def upgrade(target: Target, opened: Opened | None = None) -> int:
    """Bring the selected hosts to their stack, or to a fleet lock (or show the plan); 1 when any host failed.
    opened: the hosts' sessions opened ahead (engine.runner.open_ahead)."""
    from gpufleet.roles import ROLES

    # With --json, stdout is the JSON document: live lines go to stderr.
    say = (lambda line: emit(line, sys.stderr)) if target.json else emit
    wheels = WheelCache(progress=downloads.reporter(Console(stderr=True, highlight=False)))
    run = Executor(roles=ROLES, run=RunInfo.current(target.command), repo=fleet_dir(), dry_run=target.dry_run,
                   wheels=wheels, say=say, command_timeout=target.inventory.settings.command_timeout,
                   lock=target.lock, selection=target.chosen_roles,
                   snapshots_keep=target.inventory.settings.snapshots_keep,
                   reconnect_for=target.inventory.settings.reconnect_for,
                   read_memory=plan_memory("upgrade"))
    stacks = target.stacks
    busy: dict[str, str] = {}  # host being changed -> the last line it said

    def one(session) -> HostReport:
        busy[session.name] = ""
        try:
            return run.host(session, stacks[session.name])
        finally:
            busy.pop(session.name, None)

    def host_say(line: str) -> None:
        if line.startswith("[") and "] " in line:
            name = line[1:line.index("] ")]
            if name in busy:
                busy[name] = line[line.index("] ") + 2:]
        say(line)
    run.say = host_say
    tell = (lambda line: emit(line, sys.stderr)) if target.json else emit
    interrupts = Interrupts(tell, lambda: sorted(busy), lambda: _abandon(target, run.run, dict(busy)),
                            doing="finishing")
    with interrupts if not target.dry_run else contextlib.nullcontext():  # a dry run changes nothing: Ctrl-C stops
        outcomes = for_each_host(list(target.hosts), target.inventory, one, opened=opened)
    reports = [o.value if o.ok else HostReport(o.host, target.dry_run, outcome=o.kind, error=o.error)
               for o in outcomes]
    if target.json:
        render.print_json([r.to_json() for r in reports])
    else:
        print_reports(reports)
        if interrupts.interrupted:
            render.console.print("interrupted (Ctrl-C): the hosts in flight finished; nothing else was started")
    return EXIT_INTERRUPTED if interrupts.interrupted else exit_code(r.outcome for r in reports)


def _abandon(target: Target, run: RunInfo, busy: dict[str, str]) -> None:
    """A second Ctrl-C: the hosts being changed are left as they are; each one's audit log says its state is
    unknown and what to run. Its lock stays: the next run takes it over (this pid is gone) and says so."""
    for name, last in sorted(busy.items()):
        why = (f"its state is unknown (stopped by a second Ctrl-C{f' during: {last}' if last else ''}); "
               f"`{prog()} upgrade --host {name}` re-checks it and finishes, `{prog()} rollback --host {name}` "
               f"restores the snapshot this run took")
        raw(f"[{name}] stopped now: {why}\n")
        host = next(h for h in target.hosts if h.name == name)
        line = {"when": hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "who": run.who, "pid": run.pid,
                "command": run.command, "host": name, "outcome": "interrupted", "doing": last, "error": why}
        try:
            with session_for(host, target.inventory, target.hidden) as session:
                hoststate.append_audit(session, line)
        except Exception as exc:  # noqa: BLE001 - the exit goes on
            raw(f"[{name}] could not write the audit record: {exc}\n")


def report_table(report: HostReport) -> Table:
    """One row per planned item: role, status, the step (with its commands in a dry run), and why."""
    table = Table(title=f"{escape(report.host)}: {_headline(report)}", title_justify="left", show_lines=report.dry_run)
    for column in ("role", "status", "step", "why"):
        table.add_column(column)
    for entry in report.entries:
        item = entry.item
        status = STATUS_STYLE.get(entry.status, entry.status)
        if entry.status == "planned" and isinstance(item, Step) and not (item.commands or item.uploads):
            status = "[yellow]will check[/]"
        if isinstance(item, Step):
            what = escape(item.title)
            if report.dry_run:
                shown = [brief(c) for c in item.commands] + [f"check: {brief(c)}" for c in item.verify]
                shown += [f"upload: {redact_url(u.url)} -> {u.remote}" for u in item.uploads]
                what += "".join(f"\n[dim]$ {escape(text)}[/]" for text in shown)
            table.add_row(escape(item.role), status, what, escape(item.reason))
        else:
            table.add_row(escape(item.role), status, "", f"[dim]{escape(item.reason)}[/]")
    return table


def _headline(report: HostReport) -> str:
    if report.outcome != "ok":
        return f"[bold red]{report.outcome.upper()}[/]"
    if report.dry_run:
        n = len(report.with_status("planned"))
        return f"{n} step(s) to run" if n else "nothing to change"
    n = len(report.with_status("changed"))
    return f"{n} step(s) changed ({report.seconds:.1f} s)" if n else f"nothing changed ({report.seconds:.1f} s)"


def print_reports(reports: list[HostReport]) -> None:
    for report in reports:
        if report.entries:
            render.console.print(report_table(report))
        elif report.ok:
            render.console.print(f"{escape(report.host)}: {_headline(report)}")
        if report.lock_holder:
            render.console.print(f"[yellow]{escape(report.host)}[/]: locked by {escape(report.lock_holder)}: "
                                 f"a run is changing it now; this plan may be out of date")
        if report.error:
            render.console.print(f"[red]{escape(report.host)}: {report.outcome}[/]: {escape(report.error)}")
        if report.next_step:
            render.console.print(f"[bold]next[/] ({escape(report.host)}): {escape(report.next_step)}")
    render.console.print(_summary(reports))


def _summary(reports: list[HostReport]) -> str:
    failed = [r.host for r in reports if not r.ok]
    if reports and reports[0].dry_run:
        changing = [r.host for r in reports if r.ok and r.with_status("planned")]
        text = f"dry run, nothing was changed: {len(reports)} host(s)"
        text += f", would change {', '.join(changing)}" if changing else ", all on target"
    else:
        changed = [r.host for r in reports if r.ok and r.with_status("changed")]
        text = f"{len(reports)} host(s): {len(reports) - len(failed) - len(changed)} unchanged"
        text += f", changed {', '.join(changed)}" if changed else ""
    return escape(text) + (f", [red]failed: {escape(', '.join(failed))}[/]" if failed else "")
