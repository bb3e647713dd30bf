"""Compare a host's facts with its target stack: one cell per stack component, drift marked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from packaging.version import InvalidVersion, Version

from gpufleet.facts.checks import gpu_problems

COMPONENTS = ("gpus", "torch", "flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "sgl-kernel",
              "sglang", "service")


@dataclass
class Cell:
    """One component on one host: what it is, what it should be, and whether that differs."""

    current: str
    expected: str
    drift: bool
    note: str = ""


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


def versions_match(installed: str | None, expected: str) -> bool:
    """Equal as PEP 440 versions; an installed version without a local label matches on the public part,
    since pip reports some wheels (torch) without their +cuXXX label."""
    if not installed:
        return False
    try:
        have, want = Version(installed), Version(expected)
    except InvalidVersion:
        return installed == expected
    if have == want:
        return True
    return have.local is None and have.public == want.public


def _package_cell(packages: dict[str, str] | None, name: str, expected: str) -> Cell:
    if packages is None:
        return Cell("?", expected, True, "packages could not be read")
    current = packages.get(name)
    return Cell(current or "absent", expected, not versions_match(current, expected))


def _gpu_cell(facts, host) -> tuple[Cell, list[str]]:
    want = f"{host.gpus.count}x cc {host.gpus.compute_capability}"
    problems = gpu_problems(facts, host.gpus.count, host.gpus.compute_capability, host.gpus.name)
    gpus = facts.gpus.gpus if facts.gpus else []
    if not gpus:
        return Cell("none", want, True), problems
    caps = sorted({g.compute_capability for g in gpus})
    return Cell(f"{len(gpus)}x cc {'/'.join(caps)}", want, bool(problems)), problems


def _kernel_cell(facts) -> Cell:
    packages = facts.packages
    current = (packages or {}).get("sgl-kernel") or (packages or {}).get("sglang-kernel")
    source = getattr(facts.checkout, "kernel_version", None) if facts.checkout else None
    if source:
        return Cell(current or "absent", f"{source} (from checkout)", not versions_match(current, source))
    return Cell(current or "absent", "built from checkout", current is None)


def _sglang_cell(facts, stack) -> Cell:
    co = facts.checkout
    pinned = stack.sglang.commit != "latest"
    expected = stack.sglang.commit[:12] if pinned else f"{stack.sglang.branch} (latest)"
    if co is None or not co.present:
        return Cell("absent", expected, True, "no sglang checkout")
    head = (co.head or "?")[:12]
    edits = len(co.modified) + len(co.untracked)
    note = f"{edits} local edit(s)" if edits else ""
    if pinned:
        drift = not (co.head or "").startswith(stack.sglang.commit)
    else:
        drift = bool(co.behind) or co.branch != stack.sglang.branch
        if co.behind:
            note = ", ".join(filter(None, [f"{co.behind} behind", note]))
    return Cell(f"{co.branch or 'detached'}@{head}", expected, drift, note)


def _service_cell(facts, host) -> Cell:
    unit = facts.unit
    if unit is None:
        return Cell("?", "active", True, "unit state could not be read")
    if not unit.systemd:
        return Cell("no systemd", "active", True)
    if not unit.present:
        return Cell("absent", "active", True, f"{host.service}.service not installed")
    return Cell(f"{unit.active}/{unit.enabled}", "active/enabled",
                unit.active != "active" or unit.enabled != "enabled")


def compare(host, stack, facts) -> HostStatus:
    """The status row of one reachable host."""
    status = HostStatus(host.name, problems=list(facts.problems))
    gpu_cell, gpu_msgs = _gpu_cell(facts, host)
    status.cells["gpus"] = gpu_cell
    status.problems += gpu_msgs
    pk = facts.packages
    fi = stack.flashinfer
    status.cells["torch"] = _package_cell(pk, "torch", stack.torch.version)
    status.cells["flashinfer-python"] = _package_cell(pk, "flashinfer-python", fi.version)
    status.cells["flashinfer-cubin"] = _package_cell(pk, "flashinfer-cubin", fi.version)
    status.cells["flashinfer-jit-cache"] = _package_cell(pk, "flashinfer-jit-cache", fi.jit_cache_version)
    status.cells["sgl-kernel"] = _kernel_cell(facts)
    status.cells["sglang"] = _sglang_cell(facts, stack)
    status.cells["service"] = _service_cell(facts, host)
    return status


def unreachable(host_name: str, error: str, kind: str) -> HostStatus:
    return HostStatus(host_name, reachable=False, error=error, problems=[f"{kind}: {error}"])
