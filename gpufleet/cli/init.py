"""`gpufleet init [DIR]`: write a commented starting fleet (hosts/example.toml, stack.toml, patches/), never over
an existing file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rich.markup import escape

from gpufleet.cli import render
from gpufleet.cli.fleetdir import prog
from gpufleet.errors import ConfigError

# Shipped with the package (package data): the site's stack.toml and patch series, and a commented inventory.
STARTER = Path(__file__).resolve().parent / "starter"


def starter_files() -> list[Path]:
    """The starting set, relative to the fleet directory (symlinks in a checkout are read as the files they name)."""
    found = []
    for top, _dirs, names in os.walk(STARTER, followlinks=True):
        found += [Path(top, n).relative_to(STARTER) for n in names]
    return sorted(found)


def init(directory: str | Path) -> list[Path]:
    """Copy the starting set into directory (made if missing); refuse, naming them, when any of its files exist."""
    root = Path(directory).expanduser().resolve()
    if root.exists() and not root.is_dir():
        raise ConfigError(str(root), "not a directory")
    files = starter_files()
    existing = [str(root / f) for f in files if (root / f).exists() or (root / f).is_symlink()]
    if existing:
        raise ConfigError(str(root), f"would overwrite {', '.join(existing)}: nothing written (move them away, or "
                                     "init another directory)")
    for rel in files:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(STARTER / rel, root / rel)
    render.console.print(f"wrote a starting fleet in {escape(str(root))}:")
    for rel in files:
        render.console.print(f"  {escape(str(rel))}")
    render.console.print(f"next: edit hosts/example.toml (one \\[hosts.NAME] per server) and stack.toml, then\n"
                         f"  cd {escape(str(root))} && {prog()} status --inventory hosts/example.toml")
    return [root / f for f in files]
