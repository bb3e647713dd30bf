"""Plan-time reads gathered and sent together: planners run in gathering passes whose reads are answered side by side
in one exec, until a pass asks nothing new; the real pass then reads only answers (or, past the limit, the host)."""

from __future__ import annotations

from typing import Callable

from gpufleet.engine import batch
from gpufleet.engine.command import Cmd

PASSES = 4  # gathering passes at most: each answers the reads the answers before it led to


class Pending(BaseException):
    """Raised into a planner in a gathering pass where it asked for something with a side effect (an upload):
    that waits for the real pass. A BaseException, so a planner's `except Exception` does not swallow it."""


class Reads:
    """A host's plan-time reads: answered from what was fetched side by side, else (in a gathering pass) noted and
    given a blank stand-in answer, else (in the real pass) run on the host and kept."""

    def __init__(self, session, timeout: float | None = None):
        self.session, self.timeout = session, timeout
        self.answers: dict[tuple[str, bool], object] = {}
        self.asked: dict[tuple[str, bool], tuple[Cmd, str]] = {}
        self.gathering = False
        self.passed_over = False  # this gathering pass let a failure go (its answer is not the real one)

    def read(self, cmd: Cmd, step: str):
        key = (cmd.render(), cmd.login)
        if key in self.answers:
            return self.answers[key]
        if self.gathering:
            self.asked.setdefault(key, (cmd, step))
            from gpufleet.engine.ssh import Result

            return Result(self.session.name, step, cmd.display(), 0, "", 0.0)  # a stand-in: this pass is discarded
        self.answers[key] = result = self.session.run(cmd, step=step, check=False, timeout=self.timeout)
        return result

    def fetch(self, reads: list[tuple[Cmd, str]] | None = None) -> None:
        """Answer the reads asked so far (or these), side by side in one exec."""
        todo = list(self.asked.values()) if reads is None else reads
        self.asked = {}
        for (cmd, _), result in zip(todo, batch.run_side_by_side(self.session, todo, timeout=self.timeout)):
            if result.exit_code is not None:  # a read the link lost is asked again, alone, by the real pass
                self.answers[(cmd.render(), cmd.login)] = result

    def tolerant(self, call: Callable[[], object]) -> object:
        """call(), or None when it fails in a gathering pass (a stand-in answer it could not parse)."""
        try:
            return call()
        except Exception:  # noqa: BLE001 - only while gathering: the real pass raises it
            if self.gathering:
                self.passed_over = True
                return None
            raise

    def plan(self, passes: Callable[[], object]) -> object:
        """Run passes() gathering until it asks nothing new (at most PASSES times), then for real: its result. A
        gathering pass that asked nothing and let no failure go was answered entirely by real answers: it is the
        real pass (planners without reads plan once)."""
        for _ in range(PASSES):
            self.gathering, self.passed_over = True, False
            try:
                result = passes()
            except (Exception, Pending):  # noqa: BLE001 - a stand-in answer may make a planner fail: discarded
                result, self.passed_over = None, True
            finally:
                self.gathering = False
            if not self.asked:
                if not self.passed_over:
                    return result
                break
            self.fetch()
        return passes()
