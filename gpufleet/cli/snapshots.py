"""`inv snapshots`: each host's snapshots (/var/lib/gpufleet/snapshots) with their dates, sizes and commands."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpufleet.cli import render
from gpufleet.cli.common import exit_code
from gpufleet.cli.target import Target
from gpufleet.engine.runner import for_each_host
from gpufleet.fleet import hoststate


def size(kib: int) -> str:
    """A size for people: 512 KiB, 3.4 MiB, 12.0 GiB."""
    if kib < 1024:
        return f"{kib} KiB"
    if kib < 1024 ** 2:
        return f"{kib / 1024:.1f} MiB"
    return f"{kib / 1024 ** 2:.1f} GiB"


def snapshots(target: Target) -> int:
    """List the snapshots of the selected hosts, newest first; 0 when every host answered."""
    keep = target.inventory.settings.snapshots_keep
    outcomes = for_each_host(list(target.hosts), target.inventory, hoststate.list_snapshots)
    if target.json:
        render.print_json([{"host": o.host, "keep": keep, "snapshots": [s.to_json() for s in o.value[0]],
                            "total_kib": o.value[1]} if o.ok else {"host": o.host, "error": o.error, "kind": o.kind}
                           for o in outcomes])
    else:
        for o in outcomes:
            if not o.ok:
                render.console.print(f"[red]{escape(o.host)}[/]: {escape(o.error or '')}")
                continue
            found, total = o.value
            render.console.print(table(o.host, found, total, keep))
    return exit_code(o.kind for o in outcomes)


def table(host: str, found: list, total: int, keep: int) -> Table:
    out = Table(title=f"{escape(host)}: {len(found)} snapshot(s), {size(total)} together (venv files they share "
                      f"counted once); kept after a successful run: the newest {keep}",
                title_justify="left")
    for column in ("snapshot", "created", "size", "by", "command"):
        out.add_column(column)
    for snap in reversed(found):
        out.add_row(escape(snap.path), escape(snap.created or "?"), size(snap.kib),
                    escape(snap.manifest.get("by") or ""), escape(snap.manifest.get("command") or ""))
    return out
