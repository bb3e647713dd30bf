"""Downloads shown while they run: a bar per file on a terminal, a line every tenth in logs and under a live view."""

from __future__ import annotations

import threading
import time
from pathlib import PurePosixPath
from urllib.parse import unquote, urlsplit

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from gpufleet.wheels.download import Progress as ProgressCallback

QUIET_BELOW = 8 << 20  # small files come and go too fast to be worth a line


def _name(url: str) -> str:
    return unquote(PurePosixPath(urlsplit(url).path).name) or url


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


class DownloadLines:
    """One line when a download starts, at each further tenth, and when it ends (or every 30 s without a size)."""

    def __init__(self, console: Console, every: float = 30.0):
        self.console, self.every = console, every
        self._seen: dict[str, tuple[int, float]] = {}
        self._guard = threading.Lock()

    def __call__(self, url: str, done: int, total: int | None) -> None:
        if total is not None and total < QUIET_BELOW:
            return
        now = time.monotonic()
        with self._guard:
            tenth = done * 10 // total if total else -1
            last = self._seen.get(url)
            if last is not None and last[0] == tenth and (total or now - last[1] < self.every):
                return
            self._seen[url] = (tenth, now)
        where = f"{tenth * 10}% of {_size(total)}" if total else f"{_size(done)} so far"
        self.console.print(f"fetching {escape(_name(url))}: {where}", highlight=False)


class DownloadBars:
    """A rich progress bar per file, shown while it downloads and removed when it is done."""

    def __init__(self, console: Console):
        self.console = console
        self._progress: Progress | None = None
        self._tasks: dict[str, int] = {}
        self._guard = threading.Lock()

    def __call__(self, url: str, done: int, total: int | None) -> None:
        if total is not None and total < QUIET_BELOW:
            return
        with self._guard:
            if self._progress is None:
                self._progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                          TransferSpeedColumn(), TimeRemainingColumn(), console=self.console,
                                          transient=True)
                self._progress.start()
            if url not in self._tasks:
                self._tasks[url] = self._progress.add_task(f"fetching {escape(_name(url))}", total=total)
            task = self._tasks[url]
            self._progress.update(task, completed=done, total=total)
            if total is not None and done >= total:
                self._progress.remove_task(task)
                del self._tasks[url]
                if not self._tasks:
                    self._progress.stop()
                    self._progress = None


def reporter(console: Console, *, live_view: bool = False) -> ProgressCallback:
    """Bars on a terminal with nothing else live on it; lines otherwise (logs, CI, a roll's live table)."""
    return DownloadBars(console) if console.is_terminal and not live_view else DownloadLines(console)
