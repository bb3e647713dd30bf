"""The fleet directory: where hosts/, stack.toml, patches/, runs/ and locks/ are read and written.

`--fleet DIR` (the installed command), else `$GPUFLEET_DIR`, else the default: the checkout itself when `inv` runs
its tasks.py, the current directory for the installed `gpufleet` command. Never the installed package's directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from gpufleet.errors import ConfigError

_explicit: Path | None = None  # --fleet DIR
_default: Path | None = None  # the checkout's directory when `inv` loads its tasks.py
_prog = "inv"  # how the user called the tasks, for messages and records


def use_default(directory: str | Path, prog: str = "inv") -> None:
    """The fleet directory when neither --fleet nor $GPUFLEET_DIR names one (the checkout's tasks.py calls this)."""
    global _default, _prog
    _default, _prog = Path(directory).resolve(), prog


def set_explicit(directory: str | Path | None, prog: str | None = None) -> None:
    """--fleet DIR (None clears it); prog names the command in messages ("gpufleet")."""
    global _explicit, _prog
    _explicit = Path(directory).expanduser().resolve() if directory else None
    if prog:
        _prog = prog


def prog() -> str:
    """The command the user typed: `inv` in a checkout, `gpufleet` installed."""
    return _prog


def fleet_dir() -> Path:
    """The fleet directory, checked to exist; relative paths in it are never read from site-packages."""
    env = os.environ.get("GPUFLEET_DIR")
    found = _explicit or (Path(env).expanduser().resolve() if env else None) or _default or Path.cwd().resolve()
    if not found.is_dir():
        source = "--fleet" if _explicit else "$GPUFLEET_DIR" if env else "the fleet directory"
        raise ConfigError(str(found), f"{source}: not a directory (it should hold hosts/, stack.toml and patches/; "
                                      f"`{_prog} init DIR` writes a starting set)")
    return found
