"""`inv rollback`: put hosts back on their snapshot from before the last upgrade, and prove it."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from rich.markup import escape

from gpufleet.cli import render
from gpufleet.cli.common import exit_code
from gpufleet.fleet import rollback
from gpufleet.cli.target import Target
from gpufleet.engine.runner import for_each_host, session_for
from gpufleet.errors import GpufleetError


def rollback_hosts(target: Target, *, snapshot: str | None = None, after=None) -> int:
    """Restore each selected host's newest snapshot (or --snapshot PATH); 1 when any host failed."""
    dry_run, as_json = target.dry_run, target.json
    say = (lambda line: None) if as_json else (lambda line: render.console.print(escape(line)))

    def one(session) -> dict:
        info = rollback.describe(session, snapshot or rollback.latest_snapshot(session))
        host_say = lambda line: say(f"[{session.name}] {line}")  # noqa: E731
        for line in info.lines():
            host_say(line)
        if dry_run:
            return {"host": session.name, "snapshot": info.path, "restored": False, "plan": info.lines()}
        proof = rollback.restore(session, info, say=host_say)
        result = {"host": session.name, "snapshot": info.path, "restored": True, "proof": proof}
        if after is not None:  # e.g. the health gate, when the unit was running before
            result["after"] = after(session, info)
        return result

    outcomes = for_each_host(list(target.hosts), target.inventory, one)
    if not dry_run:
        outcomes = _after_waiting(target, outcomes, one, say)
    rows = [o.value if o.ok else {"host": o.host, "restored": False, "error": o.error, "kind": o.kind}
            for o in outcomes]
    if as_json:
        render.print_json(rows)
    else:
        for row in rows:
            if row.get("error"):
                render.console.print(f"[red]{escape(row['host'])}: rollback failed[/]: {escape(row['error'])}")
            elif row["restored"]:
                render.console.print(f"[green]{escape(row['host'])}: rolled back[/] to {escape(row['snapshot'])}")
            else:
                render.console.print(escape(f"{row['host']}: dry run, would roll back to {row['snapshot']}"))
    return exit_code(o.kind for o in outcomes)


def _after_waiting(target: Target, outcomes, work, say):
    """Hosts that did not answer (rebooting?) are waited for, up to settings.reconnect_for, then rolled back."""
    waiting = [h for h, o in zip(target.hosts, outcomes) if o.kind == "unreachable" and "authentication" not in
               (o.error or "")]
    if not waiting:
        return outcomes

    def back(host) -> bool:
        session = session_for(host, target.inventory, target.hidden)
        try:
            rollback.reach(session, target.inventory.settings.reconnect_for, lambda line: say(f"[{host.name}] {line}"))
            return True
        except GpufleetError as exc:
            say(f"[{host.name}] {exc}")
            return False
        finally:
            session.close()

    with ThreadPoolExecutor(max_workers=min(len(waiting), target.inventory.settings.parallelism)) as pool:
        answered = [h for h, ok in zip(waiting, pool.map(back, waiting)) if ok]
    again = {o.host: o for o in for_each_host(answered, target.inventory, work)} if answered else {}
    return [again.get(o.host, o) for o in outcomes]
