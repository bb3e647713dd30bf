"""The systemd unit of the model server: is systemd running, is the unit there, enabled, active, what it holds."""

from __future__ import annotations

import re

from pydantic import BaseModel

from gpufleet.errors import FactError
from gpufleet.facts.sections import first_line


class UnitFacts(BaseModel):
    """A systemd unit; enabled/active are systemctl's words (`enabled`, `active`, `not-found`, `unknown`...)."""

    systemd: bool
    present: bool
    enabled: str
    active: str
    sha256: str | None = None
    path: str | None = None


def unit_name(service: str) -> str:
    """The systemd unit name for a service name (`sglang` -> `sglang.service`)."""
    return service if "." in service else f"{service}.service"


def parse_unit(text: str, host: str | None) -> UnitFacts:
    """Parse the `unit` section (`systemd=`, `path=`, `enabled=`, `active=`, `sha256=` lines)."""
    values = dict(line.split("=", 1) for line in text.splitlines() if re.match(r"^[a-z0-9]+=", line))
    if values.get("systemd") not in ("present", "absent"):
        raise FactError("systemd unit", host, f"unexpected output {first_line(text)!r}")
    systemd = values["systemd"] == "present"
    sha = values.get("sha256") or None
    if sha is not None and not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise FactError("systemd unit", host, f"bad sha256 {sha!r}")
    path = values.get("path") or None
    return UnitFacts(systemd=systemd, present=path is not None,
                     enabled=values.get("enabled") or ("not-found" if systemd and not path else "unknown"),
                     active=values.get("active") or "unknown", sha256=sha, path=path)
