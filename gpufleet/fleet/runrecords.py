"""Where a run's record goes under runs/ (one directory a run, named by its start) and the order they are read in."""

from __future__ import annotations

import itertools
from pathlib import Path


def new_dir(parent: Path, stamp: str) -> Path:
    """parent/stamp, made here; when another run started in the same second (a no-op roll takes about one),
    parent/stamp-002, -003, ...: each run its own record, and the names still sort by start."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        path = parent / (stamp if n == 1 else f"{stamp}-{n:03d}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def newest_first(runs: Path) -> list[Path]:
    """Every runs/*/summary.json, the newest run first (by directory name: `Z-002/` sorts after `Z/` only so)."""
    return sorted(Path(runs).glob("*/summary.json"), key=lambda path: path.parent.name, reverse=True)
