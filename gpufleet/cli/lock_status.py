"""`inv status --lock FILE`: each host against a fleet lock, every difference named."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpufleet.config import lock
from gpufleet.fleet import lockstate
from gpufleet.cli import render
from gpufleet.cli.common import exit_code
from gpufleet.cli.target import Target
from gpufleet.engine.runner import for_each_host


def lock_status(target: Target) -> int:
    """0 when every selected host matches target.lock (extras are shown, not counted), 1 otherwise."""
    found = target.lock  # a bad lock failed in resolve(), before any connection
    outcomes = for_each_host(list(target.hosts), target.inventory, lambda session: lockstate.drift(session, found))
    rows = [(o.host, o.value if o.ok else None, o.error) for o in outcomes]
    if target.json:
        render.print_json({"lock": found.path, "canary": found.lock.canary, "created": found.lock.created,
                           "hosts": [d.to_json() if d else {"host": h, "matches": False, "error": err}
                                     for h, d, err in rows]})
    else:
        render.console.print(f"hosts against {found.path} (recorded from {found.lock.canary} at {found.lock.created}; "
                             f"{len(found.packages)} distributions)", highlight=False)
        render.console.print(table(found, rows))
    return exit_code(o.kind if not o.ok else ("ok" if o.value.matches else "drift") for o in outcomes)


def table(found: lock.FleetLock, rows) -> Table:
    out = Table(show_lines=True)
    for column in ("host", "matches", "differences"):
        out.add_column(column)
    for name, d, err in rows:
        if d is None:
            out.add_row(escape(name), "[red]unreachable[/]", escape(err or ""))
            continue
        lines = [escape(x) for x in d.packages + d.other] + [f"[dim]{escape(x)}[/]" for x in d.extra]
        out.add_row(escape(name), "[green]yes[/]" if d.matches else "[bold red]no[/]", "\n".join(lines) or "none")
    return out
