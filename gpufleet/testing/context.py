"""Plan contexts for role tests: one builder, with the defaults a test does not care about filled in."""

from __future__ import annotations

from pathlib import Path

from gpufleet.config.inventory import Host
from gpufleet.config.stack import Stack
from gpufleet.facts.model import HostFacts
from gpufleet.plan import PlanContext, RemoteRead


def plan_context(*, host: Host | None = None, stack: Stack | None = None, facts: HostFacts | None = None,
                 read: RemoteRead | None = None, session=None, repo: str | Path = ".", resolver=None, lock=None,
                 **fact_fields) -> PlanContext:
    """A PlanContext for host gpu1 (10.0.0.1) on the default stack; `fact_fields` (packages=, checkout=, gpus=,
    ...) build its HostFacts when `facts` is not given; a FakeSession given as `session` answers plan-time reads."""
    host = host or Host(name="gpu1", address="10.0.0.1")
    if facts is None:
        facts = HostFacts(host=host.name, **fact_fields)
    if session is not None:
        read = lambda cmd, step: session.run(cmd, step, check=False)  # noqa: E731 (a plan-time read never raises)
    return PlanContext(host=host, stack=stack if stack is not None else Stack(), facts=facts, read=read,
                       repo=Path(repo), resolver=resolver, lock=lock)
