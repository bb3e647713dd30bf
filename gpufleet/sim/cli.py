"""The sim.* tasks: boot, inspect and tear down the simulated fleet."""

from __future__ import annotations

from pathlib import Path

from gpufleet.cli import render
from gpufleet.cli.common import DEFAULT_INVENTORY
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.sim.fleet import SimFleet


def up(count: int, inventory: str | None) -> None:
    fleet = SimFleet()
    target = Path(inventory) if inventory else fleet_dir() / DEFAULT_INVENTORY
    state = fleet.up(count=int(count), inventory=target, on_progress=lambda m: render.console.print(f"[dim]sim:[/] {m}"))
    for h in state.hosts:
        render.console.print(f"[green]up[/] {h.name} {h.address}")
    render.console.print(f"inventory written to {target}; try `inv status`")


def down() -> None:
    SimFleet().down()
    render.console.print("simulated fleet stopped and removed")


def status(as_json: bool) -> int:
    rows = SimFleet().status()
    if as_json:
        render.print_json(rows)
    elif not rows:
        render.console.print("no simulated fleet is running (`inv sim.up`)")
    else:
        for r in rows:
            state = "[green]running[/]" if r["container"] else "[red]stopped[/]"
            ssh = "[green]sshd answers[/]" if r["ssh"] else "[red]sshd silent[/]"
            render.console.print(f"{r['name']:<8} {r['address']:<14} {state} {ssh}")
    return 0 if rows and all(r["container"] and r["ssh"] for r in rows) else 1
