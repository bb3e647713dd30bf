"""Gather a host's facts in one remote round trip."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpufleet.engine.command import Cmd
from gpufleet.engine.query import Query, ask

if TYPE_CHECKING:
    from gpufleet.facts.model import HostFacts


def fact_paths(host) -> list[str]:
    """The paths whose free disk space matters on a GPU box."""
    return [host.venv, host.sglang_checkout, host.model_path, "/tmp"]


def facts_query(host) -> Query[HostFacts]:
    """The batched facts script for an inventory host, and parse_facts for its output."""
    # here, not at the top: the parsers' pydantic models load while the other hosts' handshakes are under way
    from gpufleet.facts.parse import parse_facts
    from gpufleet.facts.script import facts_script

    script = facts_script(host.venv, host.sglang_checkout, host.service, fact_paths(host))
    return Query(Cmd.of("bash", "-c", script), parse_facts, "facts")


def gather_facts(session) -> HostFacts:
    """Run the batched facts script over the session's connection and parse every section."""
    return ask(session, facts_query(session.host))
