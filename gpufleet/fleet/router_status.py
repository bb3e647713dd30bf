"""`inv status` with a [router]: each host's worker as the router sees it, and its last measured decode speed."""

from __future__ import annotations

import json
from pathlib import Path

from gpufleet.fleet import runrecords
from gpufleet.fleet.router import RouterClient, RouterError, worker_url
from gpufleet.roleapi import Cell

IN, DRAINED, ABSENT, UNHEALTHY = "in", "drained", "absent", "unhealthy"


def last_roll_results(runs: Path) -> dict[str, dict]:
    """Each host's result in the newest roll record that names it (runs/<stamp>/summary.json)."""
    found: dict[str, dict] = {}
    for path in runrecords.newest_first(runs):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        for result in data.get("results") or []:
            if isinstance(result, dict) and result.get("host") and result["host"] not in found:
                found[result["host"]] = result
    return found


def router_state(url: str, listed: dict, last: dict | None) -> str:
    """in | unhealthy (listed) | drained (not listed: a roll took it out and left it out) | absent."""
    worker = listed.get(url)
    if worker is not None:
        return IN if worker.healthy else UNHEALTHY
    router = (last or {}).get("router") or {}
    return DRAINED if router.get("taken_out") and router.get("state") != IN else ABSENT


def router_cells(client: RouterClient, hosts, stacks: dict, runs: Path) -> dict[str, Cell]:
    """The router column of each host; every cell says the router could not be read when it could not."""
    try:
        listed = {w.url: w for w in client.workers()}
    except RouterError as exc:
        return {h.name: Cell("?", IN, True, str(exc)[:200]) for h in hosts}
    last = last_roll_results(runs)
    cells = {}
    for h in hosts:
        state = router_state(worker_url(h, stacks[h.name]), listed, last.get(h.name))
        note = "taken out by a roll and not put back" if state == DRAINED else ""
        cells[h.name] = Cell(state, IN, state != IN, note)
    return cells


def speed_cells(hosts, runs: Path) -> dict[str, Cell]:
    """The last decode speed a roll's speed gate measured on each host (tokens/s), never drift."""
    last = last_roll_results(runs)
    cells = {}
    for h in hosts:
        figures = (last.get(h.name) or {}).get("speed") or {}
        latest = figures.get("after") or figures.get("before")
        if latest:
            which = "after" if figures.get("after") else "before"
            cells[h.name] = Cell(f"{latest['tokens_per_second']} tok/s", "", False, which)
    return cells
