"""A question to a host: one command, the parser of its output, the step it runs as."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, TypeVar

from gpufleet.engine.command import Cmd
from gpufleet.errors import UnreachableError

T = TypeVar("T")


@dataclass(frozen=True)
class Query(Generic[T]):
    """cmd runs on the host; parse(host, output) turns what it printed into a value (raising when it cannot).

    The answer is in the output (markers such as `@@push`), so a non-zero exit is the parser's business unless
    check is set.
    """

    cmd: Cmd
    parse: Callable[[str, str], T]
    step: str
    timeout: float | None = None
    check: bool = False


def ask(session, query: Query[T]) -> T:
    """Run a query over a HostSession; a connection lost under it raises UnreachableError, not a parse error."""
    return answer(session.name, query, session.run(query.cmd, step=query.step, check=query.check,
                                                   timeout=query.timeout))


def answer(host: str, query: Query[T], result) -> T:
    """The query's value from the engine Result of its command (run alone or side by side with others)."""
    if result.exit_code is None:
        raise UnreachableError(f"host {host}: connection lost during {query.step}: {result.tail(3)}")
    return query.parse(host, result.output)


def read(ctx, query: Query[T]) -> T:
    """Run a query at plan time through PlanContext.read (read-only commands)."""
    return query.parse(ctx.host.name, ctx.read(query.cmd, query.step).output)
