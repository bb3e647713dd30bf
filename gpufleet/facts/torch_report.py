"""The torch probe: a Python snippet run in the venv that reports what torch sees, and its parser."""

from __future__ import annotations

import json
import re

from pydantic import BaseModel

from gpufleet import remote
from gpufleet.errors import FactError
from gpufleet.facts.sections import first_line

TORCH_REPORT = remote.text("torch_report.py")


class TorchReport(BaseModel):
    """What torch in the venv reports about itself and the GPUs it sees."""

    version: str
    cuda: str | None
    available: bool
    device_count: int
    capability: tuple[int, int] | None
    device_name: str | None
    arch_list: list[str]
    cxx11abi: bool | None
    git_version: str | None = None


def parse_torch_report(text: str, host: str | None) -> TorchReport:
    """Parse the JSON line TORCH_REPORT prints (warnings around it are ignored)."""
    data = next((d for d in map(_json_object, reversed(text.splitlines())) if d is not None), None)
    if data is None:
        raise FactError("torch", host, f"no probe JSON in output: {first_line(text)!r}")
    if "error" in data:
        raise FactError("torch", host, str(data["error"]))
    try:
        cap = data.get("cap")
        return TorchReport(version=data["version"], cuda=data.get("cuda"), available=bool(data.get("avail")),
                           device_count=int(data.get("count") or 0), capability=tuple(cap) if cap else None,
                           device_name=data.get("name"), arch_list=list(data.get("arch_list") or []),
                           cxx11abi=data.get("cxx11abi"), git_version=data.get("git"))
    except (KeyError, TypeError, ValueError) as exc:
        raise FactError("torch", host, f"unexpected probe JSON ({exc}): {first_line(text)!r}") from None


def _json_object(line: str) -> dict | None:
    if not re.match(r"^\s*\{", line):
        return None
    try:
        data = json.loads(line)
    except json.JSONDecodeError:
        return None
    return data if isinstance(data, dict) else None
