"""HostFacts: everything gathered about one host; a value is None where its section could not be read."""

from __future__ import annotations

from pydantic import BaseModel

from gpufleet.facts.checkout import CheckoutFacts
from gpufleet.facts.gpu import GpuFacts
from gpufleet.facts.system import DiskFree, OsFacts
from gpufleet.facts.unit import UnitFacts


class HostFacts(BaseModel):
    """The facts of one host; problems holds one sentence per section that could not be read."""

    host: str
    gpus: GpuFacts | None = None
    os: OsFacts | None = None
    cpu_count: int | None = None
    mem_total_bytes: int | None = None
    mem_available_bytes: int | None = None
    disks: list[DiskFree] | None = None
    nvcc_version: str | None = None
    python_version: str | None = None
    packages: dict[str, str] | None = None
    editables: dict[str, str] | None = None
    checkout: CheckoutFacts | None = None
    unit: UnitFacts | None = None
    problems: list[str] = []
