"""Code that runs on the hosts, shipped as files and loaded with importlib.resources."""

from __future__ import annotations

from functools import cache
from importlib import resources


@cache
def text(name: str) -> str:
    """The text of one remote file (`facts.sh`, `model_check.py`): sent to hosts as an argument, never installed."""
    return resources.files(__name__).joinpath(name).read_text()


def names() -> list[str]:
    """Every remote file, for the tests that parse them all."""
    return sorted(p.name for p in resources.files(__name__).iterdir() if p.name.endswith((".sh", ".py"))
                  and p.name != "__init__.py")
