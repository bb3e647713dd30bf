"""Compare a host's facts with its target stack: one cell per stack component, drift marked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gpufleet import roles as registry
from gpufleet.errors import GpufleetError
from gpufleet.facts.checks import gpu_problems
from gpufleet.facts.packages import normalize_name
from gpufleet.roleapi import Cell, columns, packages
from gpufleet.roles import model_server


def headings() -> dict[str, str]:
    """Every column's key and heading: the host's GPUs, each role's columns in registry order, the service."""
    return {"gpus": "gpus", **{c.key: c.heading or c.key for c in columns(registry.ROLES)}, "service": "service"}


def stack_versions(pkgs: dict[str, str]) -> dict[str, str | None]:
    """The registry's packages picked out of a package dict: {name: version or None when not installed}."""
    normal = {normalize_name(name): version for name, version in pkgs.items()}
    return {p.name: next((normal[n] for n in p.names() if n in normal), None) for p in packages(registry.ROLES)}


@dataclass
class HostStatus:
    """A row of `inv status`: reachability, the cells, and problems worth a sentence."""

    host: str
    reachable: bool = True
    error: str | None = None
    cells: dict[str, Cell] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def drift(self) -> bool:
        return any(c.drift for c in self.cells.values())

    @property
    def ok(self) -> bool:
        return self.reachable and not self.error and not self.drift

    def to_json(self) -> dict:
        data = asdict(self)
        data["drift"] = self.drift
        data["ok"] = self.ok
        return data


def _gpu_cell(facts, host) -> tuple[Cell, list[str]]:
    want = f"{host.gpus.count}x cc {host.gpus.compute_capability}"
    problems = gpu_problems(facts, host.gpus.count, host.gpus.compute_capability, host.gpus.name)
    gpus = facts.gpus.gpus if facts.gpus else []
    if not gpus:
        return Cell("none", want, True), problems
    caps = sorted({g.compute_capability for g in gpus})
    return Cell(f"{len(gpus)}x cc {'/'.join(caps)}", want, bool(problems)), problems


def _service_cell(facts, host, stack) -> Cell:
    unit = facts.unit
    if unit is None:
        return Cell("?", "active", True, "unit state could not be read")
    if not unit.systemd:
        return Cell("no systemd", "active", True)
    if not unit.present:
        return Cell("absent", "active", True, f"{host.service}.service not installed")
    state = f"{unit.active}/{unit.enabled}"
    if unit.sha256 and (wanted := _wanted_unit_sha256(facts, host, stack)) and unit.sha256 != wanted:
        # running, but not what deploy-model would write: other server flags, model or environment
        return Cell(state, "active/enabled", True, "the unit differs from what deploy-model writes from stack.toml")
    return Cell(state, "active/enabled", unit.active != "active" or unit.enabled != "enabled")


def _wanted_unit_sha256(facts, host, stack) -> str | None:
    """The sha256 of the unit deploy-model would write for this host and stack (None when the venv's Python is
    unknown: the unit names its site-packages)."""
    try:
        version = model_server.python_minor(facts.python_version, host.name)
    except GpufleetError:
        return None
    return model_server.unit_sha256(host, stack, version)


def compare(host, stack, facts) -> HostStatus:
    """The status row of one reachable host."""
    status = HostStatus(host.name, problems=list(facts.problems))
    gpu_cell, gpu_msgs = _gpu_cell(facts, host)
    status.cells["gpus"] = gpu_cell
    status.problems += gpu_msgs
    for column in columns(registry.ROLES):
        status.cells[column.key] = column.cell(facts, stack)
    status.cells["service"] = _service_cell(facts, host, stack)
    return status


def unreachable(host_name: str, error: str, kind: str) -> HostStatus:
    return HostStatus(host_name, reachable=False, error=error, problems=[f"{kind}: {error}"])
