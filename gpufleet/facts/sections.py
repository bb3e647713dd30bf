"""The facts wire format: `@@gpufleet-section NAME rc=N@@` headers, each followed by that section's raw output."""

from __future__ import annotations

import re

from pydantic import BaseModel

MARKER = "@@gpufleet-section"
_HEADER = re.compile(r"^@@gpufleet-section (?P<name>[A-Za-z0-9_.-]+) rc=(?P<rc>-?\d+)@@$")


class Section(BaseModel):
    """One section of the facts output: its name, the exit status of its commands and their output."""

    name: str
    rc: int
    text: str


def parse_sections(text: str) -> dict[str, Section]:
    """Split facts output into sections by name; text before the first header (login banners) is dropped."""
    found: dict[str, Section] = {}
    name, rc, lines = None, 0, []
    for line in text.splitlines():
        match = _HEADER.match(line.rstrip("\r"))
        if match:
            if name is not None:
                found[name] = Section(name=name, rc=rc, text=_joined(lines))
            name, rc, lines = match["name"], int(match["rc"]), []
        elif name is not None:
            lines.append(line)
    if name is not None:
        found[name] = Section(name=name, rc=rc, text=_joined(lines))
    return found


def _joined(lines: list[str]) -> str:
    return "\n".join(lines) + "\n" if lines else ""


def script_note(text: str) -> str | None:
    """The facts script's own explanation (a `gpufleet: ...` line, e.g. `venv missing: /opt/venv`), if any."""
    for line in text.splitlines():
        if line.startswith("gpufleet: "):
            return line[len("gpufleet: "):].strip()
    return None


def first_line(text: str, limit: int = 200) -> str:
    """The first non-blank line of some output, shortened, for quoting in an error."""
    for line in text.splitlines():
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""
