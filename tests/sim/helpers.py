"""Helpers for the end-to-end tests: run the real `inv` command and read its output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def inv(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """Run `inv ARGS` from the repo root exactly as a user would (env: variables added to this process's)."""
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **env} if env else None)


def inv_json(*args: str, timeout: float = 600, env: dict[str, str] | None = None):
    proc = inv(*args, "--json", timeout=timeout, env=env)
    try:
        return proc, json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"not JSON (rc={proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None


def write_inventory(fleet, path: Path, hosts: list[str] | None = None, *, extra: str = "",
                    known_hosts: str | None = None, connect_timeout: int = 10) -> Path:
    """An inventory for some of the simulated hosts, with optional extra TOML appended."""
    from gpufleet.sim.inventory_file import render_inventory

    import tomllib

    import tomlkit

    chosen = [h for h in fleet.state().hosts if hosts is None or h.name in hosts]
    base = render_inventory(fleet, chosen, known_hosts=known_hosts, connect_timeout=connect_timeout)
    try:
        tomllib.loads(base + "\n" + extra)
        path.write_text(base + "\n" + extra)  # as written (comments and all) when it stands beside the rendered text
        return path
    except tomllib.TOMLDecodeError:
        pass
    # else merged table by table: an extra may add keys to a table the rendered inventory has already
    merged = tomllib.loads(base)
    _merge(merged, tomllib.loads(extra))
    path.write_text(tomlkit.dumps(merged))
    return path


def _merge(into: dict, extra: dict) -> None:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value
