"""Console output shared by all host threads: whole lines only, each prefixed with its host's name."""

from __future__ import annotations

import sys
import threading
from typing import Callable, TextIO

_LOCK = threading.Lock()


def emit(line: str, stream: TextIO | None = None) -> None:
    """Write one whole line under the console lock so hosts never interleave mid-line."""
    with _LOCK:
        out = stream or sys.stdout
        out.write(line if line.endswith("\n") else line + "\n")
        out.flush()


class HostLines:
    """Collects a host's output chunks and passes on complete lines, prefixed, to a sink."""

    def __init__(self, host: str, sink: Callable[[str], None] | None = None, width: int = 0):
        self.prefix = f"[{host}]".ljust(width + 2) + " "
        self.sink = sink or emit
        self._partial = ""

    def feed(self, text: str) -> None:
        text = self._partial + text
        *lines, self._partial = text.split("\n")
        for line in lines:
            self.sink(self.prefix + line.rstrip("\r"))

    def flush(self) -> None:
        if self._partial:
            self.sink(self.prefix + self._partial)
            self._partial = ""
