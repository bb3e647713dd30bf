"""Helpers for the end-to-end tests: run the real `inv` command and read its output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def inv(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `inv ARGS` from the repo root exactly as a user would."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def inv_json(*args: str, timeout: float = 600):
    proc = inv(*args, "--json", timeout=timeout)
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def write_inventory(fleet, path: Path, hosts: list[str] | None = None, *, extra: str = "",
                    known_hosts: str | None = None, connect_timeout: int = 10) -> Path:
    """An inventory for some of the simulated hosts, with optional extra TOML appended."""
    from gpufleet.sim.inventory_file import render_inventory

    chosen = [h for h in fleet.state().hosts if hosts is None or h.name in hosts]
    path.write_text(render_inventory(fleet, chosen, known_hosts=known_hosts, connect_timeout=connect_timeout)
                    + "\n" + extra)
    return path
