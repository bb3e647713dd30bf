"""The site's patch series on the control node: the names its series file lists, one digest over all of it."""

from __future__ import annotations

import hashlib
from pathlib import Path


def patches_digest(patch_dir: Path | None) -> str:
    """sha256 over the series file and each patch it names, in order (empty when there is no series)."""
    h = hashlib.sha256()
    series = patch_dir / "series" if patch_dir else None
    if series is None or not series.exists():
        return h.hexdigest()
    h.update(b"series\0" + series.read_bytes())
    for name in series_names(patch_dir):
        h.update(name.encode() + b"\0" + (patch_dir / name).read_bytes())
    return h.hexdigest()


def series_names(patch_dir: Path) -> list[str]:
    """The patch file names listed in a quilt-style series file (comments and blank lines skipped)."""
    series = patch_dir / "series"
    if not series.exists():
        return []
    return [ln.split()[0] for ln in series.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
