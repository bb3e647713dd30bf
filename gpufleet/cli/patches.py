"""`inv patches`: each patch of the sglang and sgl-kernel series judged on each host; a table or JSON."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpufleet.cli import render
from gpufleet.cli.common import exit_code
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.cli.target import Target
from gpufleet.engine.query import ask
from gpufleet.engine.runner import for_each_host
from gpufleet.roles.patches import (APPLIED, CONFLICTS, NO_EFFECT, UPSTREAMED, WILL_APPLY, HostPatches,
                                    stack_series, status_query)

STYLE = {APPLIED: "green", WILL_APPLY: "yellow", UPSTREAMED: "cyan", CONFLICTS: "red", NO_EFFECT: "red"}
BAD = (CONFLICTS, NO_EFFECT)


def gather(session, stack, fetch: bool = True) -> HostPatches:
    """Judge every patch on one host: one remote command (it carries the patches into a temp dir there)."""
    host = session.host
    series = stack_series(stack, fleet_dir())
    return ask(session, status_query(host.sglang_checkout, stack.sglang.branch, series, fetch))


def patches(target: Target, *, fetch: bool = True) -> int:
    """Exit 0 when every host answered and no patch conflicts or lost its effect, else 1."""
    stacks = target.stacks  # bad overrides failed in resolve(); bad series files fail here, before any connection
    for h in target.hosts:
        stack_series(stacks[h.name], fleet_dir())
    outcomes = for_each_host(list(target.hosts), target.inventory, lambda s: gather(s, stacks[s.host.name], fetch))
    rows = []
    for out in outcomes:
        if out.ok:
            rows.append(out.value.to_json())
        else:
            rows.append({"host": out.host, "reachable": False, "error": out.error, "kind": out.kind, "patches": []})
    if target.json:
        render.print_json(rows)
    else:
        print_patches(rows)
    return exit_code(r.get("kind", "unreachable") if not r["reachable"] else
                     "failed" if r.get("error") or any(p["status"] in BAD for p in r["patches"]) else "ok"
                     for r in rows)


def _cell(p: dict) -> str:
    text = f"[{STYLE.get(p['status'], 'white')}]{p['status']}[/]"
    if p["status"] in BAD and p["detail"]:
        text += f" [dim]{escape(p['detail'].split(' (hunk')[0].rsplit('/', 1)[-1])}[/]"
    return text


def patch_table(rows: list[dict]) -> Table:
    """Rows: series/patch; columns: hosts."""
    table = Table(title="gpufleet patches")
    table.add_column("patch", style="bold")
    for r in rows:
        table.add_column(escape(r["host"]))
    names = list(dict.fromkeys(f"{p['series']}/{p['patch']}" for r in rows for p in r["patches"]))
    for name in names:
        cells = []
        for r in rows:
            if not r["reachable"] or r.get("error"):
                cells.append("[red]UNREACHABLE[/]" if not r["reachable"] else "[red]error[/]")
                continue
            found = next((p for p in r["patches"] if f"{p['series']}/{p['patch']}" == name), None)
            cells.append(_cell(found) if found else "-")
        table.add_row(escape(name), *cells)
    return table


def print_patches(rows: list[dict]) -> None:
    render.console.print(patch_table(rows))
    retire = {}
    for r in rows:
        if not r["reachable"] or r.get("error"):
            render.console.print(f"[red]{escape(r['host'])}[/]: "
                                 f"{escape(r['error'].splitlines()[0]) if r['error'] else ''}")
            continue
        if r.get("fetch_error"):
            render.console.print(f"[yellow]{escape(r['host'])}[/]: could not fetch upstream "
                                 f"({escape(r['fetch_error'])}); "
                                 "judged against origin as last fetched")
        for p in r["patches"]:
            if p["status"] == UPSTREAMED:
                retire.setdefault(f"{p['series']}/{p['patch']}", []).append(r["host"])
            elif p["detail"]:
                render.console.print(f"[yellow]{escape(r['host'])}[/] "
                                     + escape(f"{p['series']}/{p['patch']}: {p['status']}: {p['detail']}"))
    for name, hosts_ in retire.items():
        render.console.print("[cyan]ready to retire[/]: " + escape(f"{name} (upstream has it; seen on "
                                                                   f"{', '.join(hosts_)})"))
