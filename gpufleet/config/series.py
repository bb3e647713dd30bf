"""The site's patch series on the control node: the names its series file lists, one digest over all of it.

A patch directory stack.toml names must exist and hold a `series` file (`series_file`, checked when stack.toml is
loaded): a missing directory or series file is a ConfigError naming the path, never silently "no patches"; an empty
series file (or comments only) is the explicit "no patches"."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from gpufleet.errors import ConfigError


# A patch is named on hosts' command lines and in paths there: a plain file name, nothing a shell reads.
PATCH_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def series_file(patch_dir: Path) -> Path:
    """patch_dir/series; a missing directory or series file is a ConfigError naming it."""
    directory = Path(patch_dir)
    if not directory.is_dir():
        raise ConfigError(str(directory), "patch directory not found (for no patches, make it and put an empty "
                                          "`series` file in it)")
    series = directory / "series"
    if not series.is_file():
        raise ConfigError(str(series), "series file not found: it lists the directory's patches in order, one a "
                                       "line (an empty series file means no patches)")
    for number, line in enumerate(series.read_text(errors="replace").splitlines(), 1):
        words = re.sub(r"(^|\s)#.*$", "", line).split()
        if words and not PATCH_NAME.match(words[0]):
            raise ConfigError(f"{series}:{number}", "a patch must be a plain file name in the series directory "
                                                    "(letters, digits, '.', '_', '+', '-')",
                              value=words[0], has_value=True)
    return series


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
