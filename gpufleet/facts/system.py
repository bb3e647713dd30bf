"""System facts: OS release, CPU count, memory, free disk space, nvcc and the venv's Python version."""

from __future__ import annotations

import re
import shlex

from pydantic import BaseModel

from gpufleet.errors import FactError
from gpufleet.facts.sections import first_line, script_note

_DF_ROW = re.compile(
    r"^(?P<fs>.*?)\s+(?P<total>\d+)\s+(?P<used>\d+)\s+(?P<free>\d+)\s+(?P<pct>\d+%|-)\s+(?P<mount>/.*)$")


class OsFacts(BaseModel):
    """The distribution (from os-release) and the running kernel."""

    pretty_name: str
    id: str | None = None
    version_id: str | None = None
    kernel: str | None = None
    arch: str | None = None


class Memory(BaseModel):
    """Total and available memory in bytes."""

    total_bytes: int
    available_bytes: int | None


class DiskFree(BaseModel):
    """Free space for a path that was asked about, on the filesystem mounted at mount."""

    path: str
    mount: str
    free_bytes: int
    total_bytes: int


def _assignments(text: str) -> dict[str, str]:
    found = {}
    for line in text.splitlines():
        match = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", line.strip())
        if match:
            try:
                words = shlex.split(match[2])
            except ValueError:
                words = [match[2]]
            found[match[1]] = " ".join(words)
    return found


def parse_os(text: str, host: str | None) -> OsFacts:
    """Parse /etc/os-release content plus `KERNEL=`/`ARCH=` lines or a `uname -a` line."""
    values = _assignments(text)
    name = values.get("PRETTY_NAME") or values.get("NAME")
    if not name:
        raise FactError("OS release", host, script_note(text) or f"no PRETTY_NAME in {first_line(text)!r}")
    kernel, arch = values.get("KERNEL"), values.get("ARCH")
    uname = next((line.split() for line in text.splitlines() if line.startswith("Linux ")), None)
    if uname and len(uname) >= 5:
        # `uname -a`: kernel name, node, release, version (has spaces), machine..., OS; hardware platform is second last
        kernel, arch = kernel or uname[2], arch or uname[-2]
    return OsFacts(pretty_name=name, id=values.get("ID"), version_id=values.get("VERSION_ID"), kernel=kernel, arch=arch)


def parse_cpu_count(text: str, host: str | None) -> int:
    """Parse `nproc`."""
    value = text.strip()
    if not value.isdigit() or int(value) < 1:
        raise FactError("CPU count", host, f"unexpected nproc output {first_line(text)!r}")
    return int(value)


def parse_mem(text: str, host: str | None) -> Memory:
    """Parse MemTotal/MemAvailable lines of /proc/meminfo, or `free -b`."""
    info = dict(re.findall(r"^(MemTotal|MemAvailable):\s+(\d+)\s*kB", text, re.M))
    if "MemTotal" in info:
        available = info.get("MemAvailable")
        return Memory(total_bytes=int(info["MemTotal"]) * 1024,
                      available_bytes=int(available) * 1024 if available else None)
    return _parse_free(text, host)


def _parse_free(text: str, host: str | None) -> Memory:
    lines = text.splitlines()
    header = next((line.split() for line in lines if "total" in line.split()), None)
    row = next((line.split() for line in lines if line.startswith("Mem:")), None)
    if not header or not row or not all(cell.isdigit() for cell in row[1:]):
        raise FactError("memory", host, f"no MemTotal (meminfo) or Mem: row (free -b) in {first_line(text)!r}")
    cells = dict(zip(header, (int(cell) for cell in row[1:]), strict=False))
    return Memory(total_bytes=cells["total"], available_bytes=cells.get("available"))


def parse_disks(text: str, host: str | None) -> list[DiskFree]:
    """Parse the `disk` section (`path=`/`checked=` lines, each followed by `df -PB1`) or plain `df -B1` output."""
    disks, asked, pending = [], None, []
    for line in _unwrapped(text.splitlines()):
        if line.startswith("path="):
            _require_row(asked, pending, host)
            asked, pending = line[len("path="):], [line]
            continue
        match = _DF_ROW.match(line)
        if match:
            disks.append(DiskFree(path=asked or match["mount"], mount=match["mount"],
                                  free_bytes=int(match["free"]), total_bytes=int(match["total"])))
            asked, pending = None, []
        elif asked is not None:
            pending.append(line)
    _require_row(asked, pending, host)
    if not disks and text.strip():
        raise FactError("disk space", host, f"no df rows in {first_line(text)!r}")
    return disks


def _require_row(asked: str | None, pending: list[str], host: str | None) -> None:
    if asked is not None:
        errors = [line for line in pending if not line.startswith(("path=", "checked=", "Filesystem"))]
        raise FactError("disk space", host, f"df gave no row for {asked}" + (f": {errors[0]}" if errors else ""))


def _unwrapped(lines: list[str]) -> list[str]:
    # plain df wraps a long filesystem name onto its own line
    out: list[str] = []
    for line in lines:
        if out and re.match(r"^\s+\d+\s", line) and len(out[-1].split()) == 1:
            out[-1] += line
        else:
            out.append(line)
    return out


def parse_nvcc(text: str, host: str | None) -> str:
    """The full nvcc version (`13.0.88`) from `nvcc --version`."""
    match = re.search(r"release (\d+\.\d+), V(\d+(?:\.\d+)*)", text)
    if not match:
        raise FactError("nvcc version", host, script_note(text) or f"unexpected output {first_line(text)!r}")
    return match[2]


def parse_python_version(text: str, host: str | None) -> str:
    """The venv's Python version (`3.12.3`)."""
    note = script_note(text)
    if note:
        raise FactError("Python version", host, note)
    versions = re.findall(r"^(\d+\.\d+\.\d+\S*)\s*$", text, re.M)
    if not versions:
        raise FactError("Python version", host, f"unexpected output {first_line(text)!r}")
    return versions[-1]
