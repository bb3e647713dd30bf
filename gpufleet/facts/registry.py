"""The facts sections, declared once: what each runs, how it is parsed and which HostFacts fields it fills."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Sequence

from gpufleet import remote
from gpufleet.facts.checkout import KERNEL_DIRS, parse_checkout
from gpufleet.facts.gpu import DRIVER_MODULE_FILE, GPU_QUERY_FIELDS, gpu_facts, parse_gpu_query, parse_smi_header
from gpufleet.facts.packages import parse_pip_editables, parse_pip_list_json
from gpufleet.facts.system import parse_cpu_count, parse_disks, parse_mem, parse_nvcc, parse_os, parse_python_version
from gpufleet.facts.unit import parse_unit, unit_name


class FactInputs(NamedTuple):
    """The per-host values the sections are asked about."""

    venv: str
    checkout: str
    service: str
    paths: Sequence[str]


Fill = Callable[[Any, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class FactSection:
    """One section: the command it runs (a facts.sh function or a plain command), its parser, the fields it fills.

    The wire line is `gf_section NAME *run *args(inputs)`; fill gets the parsed value and the fields filled so far.
    A section with no `run` is printed by the command of the section before it (one process answers both).
    """

    name: str
    what: str  # how a problem names it: `could not read {what} on host ...`
    run: tuple[str, ...]
    parse: Callable[[str, str | None], Any]
    fill: Fill
    args: Callable[[FactInputs], Sequence[str]] = lambda inputs: ()
    after: str | None = None  # read only once this section was read: a failure there has the same cause


def into(field: str) -> Fill:
    """Fill one HostFacts field with the parsed value."""
    return lambda value, filled: {field: value}


def _packages(text: str, host: str | None) -> tuple[dict[str, str], dict[str, str]]:
    return parse_pip_list_json(text, host), parse_pip_editables(text, host)


FACT_SECTIONS: tuple[FactSection, ...] = (
    FactSection("gpu-query", "GPUs", ("gf_gpu_query", ",".join(GPU_QUERY_FIELDS)), parse_gpu_query,
                lambda rows, filled: {"gpus": gpu_facts(rows, None)}),
    # without the GPU rows the header fails for the same reason: say it once
    FactSection("gpu-header", "CUDA version", ("gf_gpu_header",), parse_smi_header,
                lambda versions, filled: {"gpus": gpu_facts(filled["gpus"].gpus, versions)}, after="gpu-query",
                args=lambda i: (DRIVER_MODULE_FILE,)),
    FactSection("os", "OS release", ("gf_os",), parse_os, into("os")),
    FactSection("cpu", "CPU count", ("nproc",), parse_cpu_count, into("cpu_count")),
    FactSection("mem", "memory", ("gf_mem",), parse_mem,
                lambda mem, filled: {"mem_total_bytes": mem.total_bytes, "mem_available_bytes": mem.available_bytes}),
    FactSection("disk", "disk space", ("gf_disk",), parse_disks, into("disks"), args=lambda i: i.paths),
    FactSection("nvcc", "nvcc version", ("gf_nvcc",), parse_nvcc, into("nvcc_version")),
    # one python process answers both: its version, then its distributions read as pip would (facts_dists.py)
    FactSection("python", "Python version", ("gf_venv",), parse_python_version, into("python_version"),
                args=lambda i: (i.venv, remote.text("facts_dists.py"))),
    FactSection("packages", "packages", (), _packages,
                lambda found, filled: {"packages": found[0], "editables": found[1]}),
    FactSection("checkout", "source checkout", ("gf_checkout",), parse_checkout, into("checkout"),
                args=lambda i: (i.checkout, *KERNEL_DIRS)),
    FactSection("unit", "systemd unit", ("gf_unit",), parse_unit, into("unit"), args=lambda i: (unit_name(i.service),)),
)
