"""Live view of a roll for a terminal: each host's state, current step and time spent, redrawn as lines arrive."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Callable

from rich.markup import escape
from rich.table import Table

_HOST_LINE = re.compile(r"^\[(?P<host>[^\]]+)\] (?P<text>.*)$")


@dataclass
class _Row:
    state: str = "waiting"
    step: str = ""
    started: float | None = None
    ended: float | None = None


class RollProgress:
    """Tracks, from the roll's own output lines, which host does what and for how long."""

    def __init__(self, hosts: list[str], clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self.rows = {h: _Row() for h in hosts}

    def line(self, text: str) -> None:
        """Feed one output line; `[host] ...` lines move that host's current step."""
        match = _HOST_LINE.match(text)
        if not match or match["host"] not in self.rows:
            return
        row = self.rows[match["host"]]
        if row.started is None:
            row.started, row.state = self.clock(), "running"
        row.step = match["text"].strip()[:100]

    def finish(self, host: str, outcome: str) -> None:
        row = self.rows[host]
        row.state, row.ended = outcome, self.clock()

    def seconds(self, host: str) -> int | None:
        row = self.rows[host]
        if row.started is None:
            return None
        return int((row.ended if row.ended is not None else self.clock()) - row.started)

    def table(self) -> Table:
        table = Table(title="roll in progress", title_justify="left")
        for column in ("host", "state", "step", "s"):
            table.add_column(column)
        for host, row in self.rows.items():
            secs = self.seconds(host)
            table.add_row(host, row.state, escape(row.step), "" if secs is None else str(secs))
        return table
