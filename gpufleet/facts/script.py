"""The one bash script that gathers every fact about a host in a single round trip: facts.sh plus one call a section."""

from __future__ import annotations

import shlex

from gpufleet import remote
from gpufleet.facts.checkout import KERNEL_DIRS
from gpufleet.facts.gpu import GPU_QUERY_FIELDS
from gpufleet.facts.registry import FACT_SECTIONS, FactInputs
from gpufleet.facts.unit import unit_name

SECTIONS = tuple(s.name for s in FACT_SECTIONS)

__all__ = ["GPU_QUERY_FIELDS", "KERNEL_DIRS", "SECTIONS", "facts_script", "unit_name"]


def facts_script(venv: str, checkout: str, service: str, paths: list[str]) -> str:
    """The bash script printing every facts section, for a venv, a source checkout, a service and disk paths.

    Paths should be absolute (the script runs from `/`). Feed it to `bash -s` or `bash -c`; it always exits 0.
    """
    inputs = FactInputs(venv, checkout, service, list(paths))
    calls = [shlex.join(["gf_section", s.name, *s.run, *s.args(inputs)]) for s in FACT_SECTIONS if s.run]
    library = remote.text("side_by_side.sh") + remote.text("facts.sh")
    return library + "\n".join(calls) + "\ngf_sections_end\nexit 0\n"
