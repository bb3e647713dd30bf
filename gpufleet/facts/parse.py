"""parse_facts: the facts script's whole output -> HostFacts, recording unreadable sections as problems."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from gpufleet.errors import FactError
from gpufleet.facts.checkout import parse_checkout
from gpufleet.facts.gpu import gpu_facts, parse_gpu_query, parse_smi_header
from gpufleet.facts.model import HostFacts
from gpufleet.facts.packages import parse_pip_editables, parse_pip_list_json
from gpufleet.facts.sections import Section, parse_sections, script_note
from gpufleet.facts.system import parse_cpu_count, parse_disks, parse_mem, parse_nvcc, parse_os, parse_python_version
from gpufleet.facts.unit import parse_unit

T = TypeVar("T")


class _Reader:
    """Runs one parser per section and turns its FactError into a problem sentence."""

    def __init__(self, host: str, sections: dict[str, Section]):
        self.host, self.sections, self.problems = host, sections, []

    def read(self, name: str, what: str, parser: Callable[[str, str], T]) -> T | None:
        section = self.sections.get(name)
        try:
            if section is None:
                raise FactError(what, self.host, f"section {name!r} missing from the facts output")
            if section.rc == 124:
                raise FactError(what, self.host, f"section {name!r} timed out")
            return parser(section.text, self.host)
        except FactError as exc:
            self._problem(exc, section)
        except Exception as exc:  # a parser bug must not cost the other sections
            self._problem(FactError(what, self.host, f"unexpected output ({type(exc).__name__}: {exc})"), section)
        return None

    def _problem(self, exc: FactError, section: Section | None) -> None:
        text = str(exc)
        # the script's own `gpufleet: ...` note already says why; an exit code adds nothing to it
        if section is not None and section.rc not in (0, 124) and script_note(section.text) is None:
            text += f" (exit code {section.rc})"
        if text not in self.problems:
            self.problems.append(text)


def parse_facts(host: str, text: str) -> HostFacts:
    """Parse the facts script's output for one host; never raises for a broken section."""
    r = _Reader(host, parse_sections(text))
    gpus = r.read("gpu-query", "GPUs", parse_gpu_query)
    # without the GPU rows the header fails for the same reason: say it once
    versions = r.read("gpu-header", "CUDA version", parse_smi_header) if gpus is not None else None
    mem = r.read("mem", "memory", parse_mem)
    return HostFacts(
        host=host,
        gpus=gpu_facts(gpus, versions) if gpus is not None else None,
        os=r.read("os", "OS release", parse_os),
        cpu_count=r.read("cpu", "CPU count", parse_cpu_count),
        mem_total_bytes=mem.total_bytes if mem else None,
        mem_available_bytes=mem.available_bytes if mem else None,
        disks=r.read("disk", "disk space", parse_disks),
        nvcc_version=r.read("nvcc", "nvcc version", parse_nvcc),
        python_version=r.read("python", "Python version", parse_python_version),
        packages=r.read("packages", "packages", parse_pip_list_json),
        editables=r.read("packages", "packages", parse_pip_editables),
        checkout=r.read("checkout", "source checkout", parse_checkout),
        unit=r.read("unit", "systemd unit", parse_unit),
        problems=r.problems,
    )
