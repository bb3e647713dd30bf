"""`inv unlock`: show who holds a host's lock; remove it when its holder is gone (or with --force)."""

from __future__ import annotations

from rich.markup import escape

from gpufleet.cli import render
from gpufleet.cli.common import exit_code
from gpufleet.cli.target import Target
from gpufleet.engine.runner import for_each_host
from gpufleet.fleet import hoststate


def unlock_one(session, force: bool, here: str | None = None) -> dict:
    """Read the host's lock; remove it when stale, or live/unknown with force; never raises for a refusal."""
    claim = hoststate.read_holder(session)
    if claim is None:
        return {"host": session.name, "locked": False, "removed": False, "ok": True, "message": "not locked"}
    state, why = hoststate.liveness(claim, here)
    row = {"host": session.name, "locked": True, "holder": claim.described, "state": state, "why": why,
           "removed": False, "ok": True}
    if state != "stale" and not force:
        row["ok"] = False
        row["message"] = (f"refusing to remove the lock: {why}; wait for that run, or check it is gone and pass "
                          f"--force")
        return row
    hoststate.break_claim(session, claim)
    row["removed"] = True
    row["message"] = f"lock removed ({'forced: ' if state != 'stale' else ''}{why})"
    return row


def unlock(target: Target, *, force: bool = False) -> int:
    """0 when every selected host is unlocked now; 1 when a live (or unknown) holder was left in place."""
    outcomes = for_each_host(list(target.hosts), target.inventory, lambda session: unlock_one(session, force))
    rows = [o.value if o.ok else {"host": o.host, "ok": False, "error": o.error, "kind": o.kind} for o in outcomes]
    if target.json:
        render.print_json(rows)
    else:
        for row in rows:
            host = escape(row["host"])
            if row.get("error"):
                render.console.print(f"[red]{host}[/]: {escape(row['error'])}")
                continue
            if row["locked"]:
                render.console.print(f"{host}: locked by {escape(row['holder'])}")
            style = "green" if row["ok"] else "red"
            render.console.print(f"[{style}]{host}[/]: {escape(row['message'])}")
    return exit_code(o.kind if not o.ok else ("ok" if o.value["ok"] else "failed") for o in outcomes)
