"""Host facts: one batched bash script per host, its output split into sections, one typed parser per section."""

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

__all__ = [
    "CheckoutFacts", "DiskFree", "GPU_QUERY_FIELDS", "Gpu", "GpuFacts", "GpuListing", "HostFacts", "MARKER", "Memory",
    "OsFacts", "SECTIONS", "SUMMARY_QUERY_FIELDS", "Section", "SmiVersions", "TORCH_REPORT",
    "TorchReport", "UnitFacts", "facts_script", "gpu_facts", "gpu_problems", "normalize_name", "parse_checkout",
    "parse_cpu_count", "parse_disks", "parse_facts", "parse_gpu_query", "parse_mem", "parse_nvcc", "parse_os",
    "parse_pip_editables", "parse_pip_freeze", "parse_pip_list_json", "parse_python_version", "parse_query_gpu_csv",
    "parse_sections", "parse_smi_header", "parse_smi_list", "parse_smi_versions", "parse_smi_xml",
    "parse_torch_report", "parse_unit", "redact_url", "script_note", "smi_failure", "unit_name",
    "unquote_path",
]
