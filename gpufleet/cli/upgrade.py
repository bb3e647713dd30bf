"""`inv upgrade`: select hosts, plan or apply the roles on each in parallel, print plans and outcomes."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet.cli import downloads, render
from gpufleet.fleet.executor import HostReport, Executor
from gpufleet.cli.common import exit_code
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.cli.target import Target
from gpufleet.facts.checkout import redact_url
from gpufleet.wheels.fetch import WheelCache
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.engine.output import emit
from gpufleet.plan import Step, brief
from gpufleet.engine.runner import for_each_host

STATUS_STYLE = {"planned": "[yellow]will change[/]", "unchanged": "[green]unchanged[/]",
                "done-already": "[green]already done[/]", "changed": "[cyan]changed[/]",
                "verified": "[green]verified[/]", "failed": "[bold red]FAILED[/]", "running": "[red]interrupted[/]",
                "skipped": "[dim]skipped[/]", "refused": "[bold red]refused[/]"}


def upgrade(target: Target) -> int:
    """Bring the selected hosts to their stack, or to a fleet lock (or show the plan); 1 when any host failed."""
    from gpufleet.roles import ROLES

    # With --json, stdout is the JSON document: live lines go to stderr.
    say = (lambda line: emit(line, sys.stderr)) if target.json else emit
    wheels = WheelCache(progress=downloads.reporter(Console(stderr=True, highlight=False)))
    run = Executor(roles=ROLES, run=RunInfo.current(target.command), repo=fleet_dir(), dry_run=target.dry_run,
                   wheels=wheels, say=say, command_timeout=target.inventory.settings.command_timeout,
                   lock=target.lock, selection=target.chosen_roles,
                   snapshots_keep=target.inventory.settings.snapshots_keep)
    stacks = target.stacks
    outcomes = for_each_host(list(target.hosts), target.inventory,
                             lambda session: run.host(session, stacks[session.name]))
    reports = [o.value if o.ok else HostReport(o.host, target.dry_run, outcome=o.kind, error=o.error)
               for o in outcomes]
    if target.json:
        render.print_json([r.to_json() for r in reports])
    else:
        print_reports(reports)
    return exit_code(r.outcome for r in reports)


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
