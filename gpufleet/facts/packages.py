"""Installed Python packages from `pip list --format=json` or `pip freeze`, keyed by PEP 503 normalised name."""

from __future__ import annotations

import json
import re

from packaging.utils import canonicalize_name

from gpufleet.errors import FactError
from gpufleet.facts.sections import first_line, script_note


def normalize_name(name: str) -> str:
    """PEP 503 normalised distribution name (`Flashinfer_Python` -> `flashinfer-python`)."""
    return canonicalize_name(name)


def _pip_list(text: str, host: str | None) -> list[dict]:
    note = script_note(text)
    if note and note.startswith("venv missing"):
        raise FactError("packages", host, note)
    # pip may print warnings (stderr is merged) before or after the JSON line
    for index in [m.start() for m in re.finditer(r"^\[", text, re.M)]:
        try:
            data, _ = json.JSONDecoder().raw_decode(text, index)
        except json.JSONDecodeError:
            continue
        if isinstance(data, list) and all(isinstance(item, dict) and "name" in item for item in data):
            return data
    raise FactError("packages", host, f"no pip list JSON in output: {first_line(text)!r}")


def parse_pip_list_json(text: str, host: str | None) -> dict[str, str]:
    """Parse `pip list --format=json` into {normalised name: version as given}."""
    return {normalize_name(item["name"]): str(item.get("version", "")) for item in _pip_list(text, host)}


def parse_pip_editables(text: str, host: str | None) -> dict[str, str]:
    """Editable installs in `pip list --format=json` output: {normalised name: project location}."""
    return {normalize_name(item["name"]): item["editable_project_location"]
            for item in _pip_list(text, host) if item.get("editable_project_location")}


def parse_pip_freeze(text: str, host: str | None) -> dict[str, str]:
    """Parse `pip freeze`: `name==version` pins and editables annotated `# Editable ... (name==version)`.

    Lines without a version (direct URL references, bare `-e` lines) are left out.
    """
    found = {}
    for line in text.splitlines():
        match = re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*===?\s*(\S+)\s*$", line)
        match = match or re.match(r"^#.*\(([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)\)\s*$", line)
        if match:
            found[normalize_name(match[1])] = match[2]
    if not found:
        raise FactError("packages", host, script_note(text) or f"no `name==version` lines in {first_line(text)!r}")
    return found

