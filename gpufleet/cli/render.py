"""Rich renderings of facts and status for people; JSON for scripts."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from gpufleet.cli.jsonout import print_json  # noqa: F401  (render.print_json, as before)
from gpufleet.fleet.status import HostStatus, headings, stack_versions

# Piped output (logs, CI) gets a wide console instead of rich's 80 columns, so tables are not folded.
console = Console(highlight=False, width=None if sys.stdout.isatty() else 200)


def status_table(rows: list[HostStatus]) -> Table:
    """One row per host, one column per stack component; drift in red as current -> expected."""
    table = Table(title="gpufleet status", show_lines=False)
    table.add_column("host", style="bold")
    columns = headings()
    for key in dict.fromkeys(k for r in rows for k in r.cells if k not in columns):  # router, speed: when there
        columns[key] = key
    for heading in columns.values():
        table.add_column(heading)
    for row in rows:
        if not row.reachable:
            table.add_row(escape(row.host), f"[red]UNREACHABLE[/] {escape(row.error.splitlines()[0]) if row.error else ''}",
                          *[""] * (len(columns) - 1))
            continue
        cells = []
        for comp in columns:
            cell = row.cells.get(comp)
            if cell is None:
                cells.append("")
            elif cell.drift:
                text = f"[red]{escape(cell.current)}[/] -> {escape(cell.expected)}"
                cells.append(text + (f" [dim]({escape(cell.note)})[/]" if cell.note else ""))
            else:
                cells.append(f"[green]{escape(cell.current)}[/]" + (f" [dim]({escape(cell.note)})[/]" if cell.note else ""))
        table.add_row(escape(row.host), *cells)
    return table


def print_status(rows: list[HostStatus]) -> None:
    console.print(status_table(rows))
    for row in rows:
        for problem in row.problems:
            console.print(f"[yellow]{escape(row.host)}[/]: {escape(problem)}")
    drifting = [r.host for r in rows if r.reachable and r.drift]
    down = [r.host for r in rows if not r.reachable]
    summary = f"{len(rows)} host(s): {len(rows) - len(drifting) - len(down)} on target"
    if drifting:
        summary += f", drift on {', '.join(drifting)}"
    if down:
        summary += f", unreachable: {', '.join(down)}"
    console.print(escape(summary))


def print_facts(facts) -> None:
    """A readable dump of one host's facts."""
    table = Table(title=f"facts of {escape(facts.host)}", show_header=False)
    table.add_column("fact", style="bold")
    table.add_column("value")
    g = facts.gpus
    if g and g.gpus:
        table.add_row("GPUs", f"{len(g.gpus)} x {g.gpus[0].name} (cc {g.gpus[0].compute_capability}, "
                              f"{g.gpus[0].memory_total_mib} MiB)")
        table.add_row("driver / CUDA", f"{g.driver_version} / {g.cuda_version}")
    else:
        table.add_row("GPUs", "[red]none readable[/]")
    if facts.os:
        table.add_row("OS", f"{facts.os.pretty_name} ({facts.os.kernel}, {facts.os.arch})")
    table.add_row("CPUs / RAM", f"{facts.cpu_count} / {_gib(facts.mem_total_bytes)} "
                                f"({_gib(facts.mem_available_bytes)} available)")
    for d in facts.disks or []:
        table.add_row(f"disk {d.path}", f"{_gib(d.free_bytes)} free of {_gib(d.total_bytes)} on {d.mount}")
    table.add_row("nvcc", facts.nvcc_version or "-")
    table.add_row("python", facts.python_version or "-")
    for name, version in stack_versions(facts.packages or {}).items():
        table.add_row(name, version or "-")
    co = facts.checkout
    if co and co.present:
        table.add_row("sglang checkout", f"{co.path} {co.branch}@{(co.head or '')[:12]} -> {co.upstream} "
                                         f"(+{co.ahead}/-{co.behind})")
        table.add_row("local edits", ", ".join(co.modified + co.untracked) or "-")
        table.add_row("stashes", "; ".join(co.stashes) or "-")
    elif co:
        table.add_row("sglang checkout", f"[red]absent[/]: {co.path} "
                                         + ("is not a git checkout" if co.exists else "does not exist"))
    u = facts.unit
    if u:
        table.add_row("service", "no systemd" if not u.systemd else
                      (f"{u.path} {u.active}/{u.enabled} sha256:{(u.sha256 or '')[:12]}" if u.present else "absent"))
    console.print(table)
    for problem in facts.problems:
        console.print(f"[yellow]{escape(facts.host)}[/]: {escape(problem)}")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / 2**30:.1f} GiB"


