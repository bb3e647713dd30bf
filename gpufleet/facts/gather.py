"""Gather a host's facts in one remote round trip."""

from __future__ import annotations

from gpufleet.engine.command import Cmd
from gpufleet.errors import UnreachableError
from gpufleet.facts import facts_script, parse_facts
from gpufleet.facts.model import HostFacts


def fact_paths(host) -> list[str]:
    """The paths whose free disk space matters on a GPU box."""
    return [host.venv, host.sglang_checkout, host.model_path, "/tmp"]


def gather_facts(session) -> HostFacts:
    """Run the batched facts script over the session's connection and parse every section."""
    host = session.host
    script = facts_script(host.venv, host.sglang_checkout, host.service, fact_paths(host))
    result = session.run(Cmd.of("bash", "-c", script), step="facts", check=False)
    if result.exit_code is None:
        raise UnreachableError(f"host {host.name}: connection lost while reading facts: {result.tail(3)}")
    return parse_facts(host.name, result.output)
