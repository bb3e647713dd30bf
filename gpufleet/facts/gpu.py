"""GPU facts from nvidia-smi: the CSV query forms, the plain header, `-q` / `-q -x`, and `-L`."""

from __future__ import annotations

import csv
import re
import xml.etree.ElementTree as ET

from pydantic import BaseModel

from gpufleet.errors import FactError
from gpufleet.facts.sections import first_line

# the loaded kernel module's version text: the facts script remembers the driver's CUDA version under it
DRIVER_MODULE_FILE = "/proc/driver/nvidia/version"
# the facts script's `gpu-query` columns (noheader, nounits)
GPU_QUERY_FIELDS = ("index", "name", "uuid", "pci.bus_id", "compute_cap", "driver_version", "memory.total")
# the 6-column form `--query-gpu=index,name,compute_cap,driver_version,memory.total,memory.used` (no header)
SUMMARY_QUERY_FIELDS = ("index", "name", "compute_cap", "driver_version", "memory.total", "memory.used")

# header spellings nvidia-smi accepts for one field, mapped to the name used here
_ALIASES = {"gpu_name": "name", "gpu_uuid": "uuid", "gpu_bus_id": "pci.bus_id", "compute_capability": "compute_cap"}
_REQUIRED = ("index", "name", "compute_cap", "memory.total")

_SMI_FAILURES = (
    ("nvidia-smi not found", "nvidia-smi not found"),
    ("command not found", "nvidia-smi not found"),
    ("couldn't communicate with the nvidia driver",
     "driver not loaded (nvidia-smi couldn't communicate with the NVIDIA driver)"),
    ("driver/library version mismatch",
     "driver/library version mismatch: the loaded kernel module is not the installed driver (reboot to fix)"),
    ("no devices were found", "no GPUs found (nvidia-smi: No devices were found)"),
    ("failed to initialize nvml", None),
    ("unable to determine the device handle", None),
    ("gpu is lost", None),
)


class Gpu(BaseModel):
    """One GPU as nvidia-smi reports it; uuid and bus id are None when the query form did not include them."""

    index: int
    name: str
    uuid: str | None = None
    pci_bus_id: str | None = None
    compute_capability: str
    memory_total_mib: int
    driver_version: str | None = None


class GpuFacts(BaseModel):
    """Every GPU on a host, with the driver version and the highest CUDA version that driver supports."""

    gpus: list[Gpu]
    driver_version: str | None
    cuda_version: str | None


class GpuListing(BaseModel):
    """One line of `nvidia-smi -L`."""

    index: int
    name: str
    uuid: str


class SmiVersions(BaseModel):
    """Driver and CUDA versions from the nvidia-smi header, `-q` or `-q -x`."""

    driver_version: str
    cuda_version: str | None


def smi_failure(text: str) -> str | None:
    """Why nvidia-smi output is an error message rather than data, in a short sentence; None if it is not."""
    if not text.strip():
        return "nvidia-smi printed nothing"
    lower = text.lower()
    for needle, detail in _SMI_FAILURES:
        if needle in lower:
            return detail or _line_with(text, needle)
    return None


def _line_with(text: str, needle: str) -> str:
    for line in text.splitlines():
        if needle in line.lower():
            return "nvidia-smi: " + line.strip()
    return "nvidia-smi failed"


def _check_smi(text: str, what: str, host: str | None) -> None:
    detail = smi_failure(text)
    if detail:
        raise FactError(what, host, detail)


def _column(header: str) -> str:
    name = header.split("[", 1)[0].strip()
    return _ALIASES.get(name, name)


def _rows(text: str) -> list[list[str]]:
    lines = [line for line in text.splitlines() if line.strip()]
    return [[cell.strip() for cell in row] for row in csv.reader(lines, skipinitialspace=True)]


def parse_query_gpu_csv(text: str, host: str | None, columns: tuple[str, ...] | list[str] | None = None) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=... --format=csv[,noheader][,nounits]`; columns name a header-less form."""
    _check_smi(text, "GPUs", host)
    rows = _rows(text)
    if rows and {"index", "name"} & {_column(c) for c in rows[0]}:
        columns, rows = [_column(c) for c in rows[0]], rows[1:]
    columns = list(columns or GPU_QUERY_FIELDS)
    missing = [c for c in _REQUIRED if c not in columns]
    if missing:
        raise FactError("GPUs", host, f"nvidia-smi query lacks column(s) {', '.join(missing)}")
    if not rows:
        raise FactError("GPUs", host, "nvidia-smi listed no GPUs")
    return [_gpu(columns, row, host) for row in rows]


def _gpu(columns: list[str], row: list[str], host: str | None) -> Gpu:
    if len(row) != len(columns):
        raise FactError("GPUs", host, f"expected {len(columns)} columns, got {len(row)}: {', '.join(row)!r}")
    cells = dict(zip(columns, row, strict=True))
    try:
        return Gpu(index=int(cells["index"]), name=cells["name"], uuid=cells.get("uuid"),
                   pci_bus_id=cells.get("pci.bus_id"), compute_capability=_capability(cells["compute_cap"]),
                   memory_total_mib=_mib(cells["memory.total"]), driver_version=cells.get("driver_version"))
    except ValueError as exc:
        raise FactError("GPUs", host, f"unreadable GPU row {', '.join(row)!r}: {exc}") from None


def _capability(value: str) -> str:
    if not re.fullmatch(r"\d+\.\d+", value):
        raise ValueError(f"compute capability {value!r}")
    return value


def _mib(value: str) -> int:
    match = re.fullmatch(r"(\d+)(?:\s*MiB)?", value)
    if not match:
        raise ValueError(f"memory {value!r}")
    return int(match[1])


def parse_gpu_query(text: str, host: str | None) -> list[Gpu]:
    """Parse the facts script's `gpu-query` section (noheader, nounits, GPU_QUERY_FIELDS)."""
    return parse_query_gpu_csv(text, host, GPU_QUERY_FIELDS)


def parse_smi_header(text: str, host: str | None) -> SmiVersions:
    """Driver and CUDA versions from plain `nvidia-smi` (its header), `nvidia-smi -q` or `nvidia-smi --version`."""
    _check_smi(text, "driver version", host)
    driver = re.search(r"Driver Version\s*:\s*(\S+)", text) or re.search(r"^DRIVER version\s*:\s*(\S+)", text, re.M)
    if not driver:
        raise FactError("driver version", host, f"no 'Driver Version' in nvidia-smi output: {first_line(text)!r}")
    cuda = re.search(r"CUDA Version\s*:\s*([0-9][0-9.]*)", text)
    return SmiVersions(driver_version=driver[1], cuda_version=cuda[1] if cuda else None)


def parse_smi_xml(text: str, host: str | None) -> SmiVersions:
    """Driver and CUDA versions from `nvidia-smi -q -x`."""
    _check_smi(text, "driver version", host)
    try:
        root = ET.fromstring(text.strip())
    except ET.ParseError as exc:
        raise FactError("driver version", host, f"nvidia-smi -q -x is not XML: {exc}") from None
    driver = (root.findtext("driver_version") or "").strip()
    if not driver:
        raise FactError("driver version", host, "no <driver_version> in nvidia-smi -q -x output")
    cuda = (root.findtext("cuda_version") or "").strip()
    return SmiVersions(driver_version=driver, cuda_version=cuda if re.fullmatch(r"[0-9][0-9.]*", cuda) else None)


def parse_smi_versions(text: str, host: str | None) -> SmiVersions:
    """Driver and CUDA versions from any of the header, `-q` or `-q -x` forms."""
    if "<nvidia_smi_log" in text:
        return parse_smi_xml(text, host)
    return parse_smi_header(text, host)


def parse_smi_list(text: str, host: str | None) -> list[GpuListing]:
    """Parse `nvidia-smi -L` (MIG device lines are skipped)."""
    _check_smi(text, "GPU list", host)
    found = []
    for line in text.splitlines():
        match = re.match(r"GPU (\d+): (.+) \(UUID: (\S+)\)\s*$", line)
        if match:
            found.append(GpuListing(index=int(match[1]), name=match[2].strip(), uuid=match[3]))
        elif line.strip() and not line[0].isspace():
            raise FactError("GPU list", host, f"unexpected nvidia-smi -L line {line.strip()!r}")
    if not found:
        raise FactError("GPU list", host, "nvidia-smi -L listed no GPUs")
    return found


def gpu_facts(gpus: list[Gpu], versions: SmiVersions | None) -> GpuFacts:
    """Combine the GPU rows with the header versions (the rows' own driver version wins when present)."""
    drivers = {g.driver_version for g in gpus if g.driver_version}
    driver = drivers.pop() if len(drivers) == 1 else (versions.driver_version if versions else None)
    return GpuFacts(gpus=gpus, driver_version=driver, cuda_version=versions.cuda_version if versions else None)


__all__ = ["Gpu", "GpuFacts", "GpuListing", "SmiVersions", "SUMMARY_QUERY_FIELDS", "gpu_facts", "parse_gpu_query",
           "parse_query_gpu_csv", "parse_smi_header", "parse_smi_list", "parse_smi_versions", "parse_smi_xml",
           "smi_failure"]
