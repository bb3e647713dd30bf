"""Host facts: one batched bash script per host, its output split into sections, one typed parser per section.

The names below load on first use (PEP 562): importing one facts module (`gpufleet.facts.unit` for
`unit_name`) must not build every pydantic model of the package before the first SSH packet (issue 13).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "CheckoutFacts": "gpufleet.facts.checkout",
    "DiskFree": "gpufleet.facts.system",
    "GPU_QUERY_FIELDS": "gpufleet.facts.script",
    "Gpu": "gpufleet.facts.gpu",
    "GpuFacts": "gpufleet.facts.gpu",
    "GpuListing": "gpufleet.facts.gpu",
    "HostFacts": "gpufleet.facts.model",
    "MARKER": "gpufleet.facts.sections",
    "Memory": "gpufleet.facts.system",
    "OsFacts": "gpufleet.facts.system",
    "SECTIONS": "gpufleet.facts.script",
    "SUMMARY_QUERY_FIELDS": "gpufleet.facts.gpu",
    "Section": "gpufleet.facts.sections",
    "SmiVersions": "gpufleet.facts.gpu",
    "TORCH_REPORT": "gpufleet.facts.torch_report",
    "TorchReport": "gpufleet.facts.torch_report",
    "UnitFacts": "gpufleet.facts.unit",
    "facts_script": "gpufleet.facts.script",
    "gpu_facts": "gpufleet.facts.gpu",
    "gpu_problems": "gpufleet.facts.checks",
    "normalize_name": "gpufleet.facts.packages",
    "parse_checkout": "gpufleet.facts.checkout",
    "parse_cpu_count": "gpufleet.facts.system",
    "parse_disks": "gpufleet.facts.system",
    "parse_facts": "gpufleet.facts.parse",
    "parse_gpu_query": "gpufleet.facts.gpu",
    "parse_mem": "gpufleet.facts.system",
    "parse_nvcc": "gpufleet.facts.system",
    "parse_os": "gpufleet.facts.system",
    "parse_pip_editables": "gpufleet.facts.packages",
    "parse_pip_freeze": "gpufleet.facts.packages",
    "parse_pip_list_json": "gpufleet.facts.packages",
    "parse_python_version": "gpufleet.facts.system",
    "parse_query_gpu_csv": "gpufleet.facts.gpu",
    "parse_sections": "gpufleet.facts.sections",
    "parse_smi_header": "gpufleet.facts.gpu",
    "parse_smi_list": "gpufleet.facts.gpu",
    "parse_smi_versions": "gpufleet.facts.gpu",
    "parse_smi_xml": "gpufleet.facts.gpu",
    "parse_torch_report": "gpufleet.facts.torch_report",
    "parse_unit": "gpufleet.facts.unit",
    "redact_url": "gpufleet.facts.checkout",
    "script_note": "gpufleet.facts.sections",
    "smi_failure": "gpufleet.facts.gpu",
    "unit_name": "gpufleet.facts.script",
    "unquote_path": "gpufleet.facts.checkout",
}

__all__ = sorted(_WHERE)

if TYPE_CHECKING:
    from gpufleet.facts.checkout import CheckoutFacts, parse_checkout, redact_url, unquote_path
    from gpufleet.facts.checks import gpu_problems
    from gpufleet.facts.gpu import (SUMMARY_QUERY_FIELDS, Gpu, GpuFacts, GpuListing, SmiVersions, gpu_facts,
                                    parse_gpu_query, parse_query_gpu_csv, parse_smi_header, parse_smi_list,
                                    parse_smi_versions, parse_smi_xml, smi_failure)
    from gpufleet.facts.model import HostFacts
    from gpufleet.facts.packages import normalize_name, parse_pip_editables, parse_pip_freeze, parse_pip_list_json
    from gpufleet.facts.parse import parse_facts
    from gpufleet.facts.torch_report import TORCH_REPORT, TorchReport, parse_torch_report
    from gpufleet.facts.script import GPU_QUERY_FIELDS, SECTIONS, facts_script, unit_name
    from gpufleet.facts.sections import MARKER, Section, parse_sections, script_note
    from gpufleet.facts.system import (DiskFree, Memory, OsFacts, parse_cpu_count, parse_disks, parse_mem, parse_nvcc,
                                       parse_os, parse_python_version)
    from gpufleet.facts.unit import UnitFacts, parse_unit


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value
