"""The control node's cache directory, and the small memos gpufleet keeps there (plan reads, logins, units)."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def cache_root() -> Path:
    """The control node's cache ($GPUFLEET_CACHE_DIR, else ~/.cache/gpufleet): wheels, sources, builds, memos."""
    return Path(os.environ.get("GPUFLEET_CACHE_DIR") or Path.home() / ".cache" / "gpufleet")


def keep_memo(path: Path, text: str) -> None:
    """Write a memo whole or not at all, readable by this user alone (it may name hosts, keys and reads), in a folder
    only this user can list; a cache that cannot be written is no error: a memo is a guess for next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        part = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        part.write_text(text)
        part.chmod(0o600)
        os.replace(part, path)
    except OSError:
        pass
