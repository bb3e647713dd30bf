"""Plan-time reads gathered and sent together: planners run in gathering passes whose reads are answered side by side
in one exec, until a pass asks nothing new; the real pass then reads only answers (or, past the limit, the host)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable

from gpufleet.cachedir import keep_memo
from gpufleet.engine import batch
from gpufleet.engine.command import Cmd

PASSES = 4  # gathering passes at most: each answers the reads the answers before it led to


class Pending(BaseException):
    """Raised into a planner in a gathering pass where it asked for something with a side effect (an upload):
    that waits for the real pass. A BaseException, so a planner's `except Exception` does not swallow it."""


class Reads:
    """A host's plan-time reads: answered from what was fetched side by side, else (in a gathering pass) noted and
    given a blank stand-in answer, else (in the real pass) run on the host and kept."""

    def __init__(self, session, timeout: float | None = None, remembered: list[tuple[Cmd, str]] = ()):
        self.session, self.timeout = session, timeout
        self.answers: dict[tuple[str, bool], object] = {}
        self.asked: dict[tuple[str, bool], tuple[Cmd, str]] = {}
        self.used: dict[tuple[str, bool], tuple[Cmd, str]] = {}  # what the real passes read: the next run's guess
        self.touched: dict[tuple[str, bool], tuple[Cmd, str]] = {}  # what the pass under way read
        # what this host's last plan read: asked with the first reads, so a plan like the last one needs no more
        self.remembered = list(remembered)
        self.gathering = False
        self.planning = False  # inside plan(): a pass's reads count only if the pass does
        self.passed_over = False  # this gathering pass let a failure go (its answer is not the real one)

    def read(self, cmd: Cmd, step: str):
        key = (cmd.render(), cmd.login)
        (self.touched if self.planning else self.used).setdefault(key, (cmd, step))
        if key in self.answers:
            return self.answers[key]
        if self.gathering:
            self.asked.setdefault(key, (cmd, step))
            from gpufleet.engine.ssh import Result

            return Result(self.session.name, step, cmd.display(), 0, "", 0.0)  # a stand-in: this pass is discarded
        self.answers[key] = result = self.session.run(cmd, step=step, check=False, timeout=self.timeout)
        return result

    def forget(self) -> None:
        """The host changed under the plan (an upload it needed): every answer from before is read again."""
        self.answers = {}

    def view(self) -> "Reading":
        """A session whose run() reads through these Reads (for read-only helpers written for sessions)."""
        return Reading(self.session, self)

    def fetch(self, reads: list[tuple[Cmd, str]] | None = None) -> None:
        """Answer the reads asked so far (or these), side by side in one exec."""
        todo = list(self.asked.values()) if reads is None else reads
        self.asked = {}
        if self.remembered:  # once, with the first reads
            keys = {(c.render(), c.login) for c, _ in todo} | set(self.answers)
            todo += [(c, step) for c, step in self.remembered if (c.render(), c.login) not in keys]
            self.remembered = []
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
        self.planning = True
        try:
            return self._plan(passes)
        finally:
            self.planning = False

    def _plan(self, passes: Callable[[], object]) -> object:
        for _ in range(PASSES):
            self.gathering, self.passed_over, self.touched = True, False, {}
            try:
                result = passes()
            except (Exception, Pending):  # noqa: BLE001 - a stand-in answer may make a planner fail: discarded
                result, self.passed_over = None, True
            finally:
                self.gathering = False
            if not self.asked:
                if not self.passed_over:
                    self.used.update(self.touched)
                    return result
                break
            self.fetch()
        self.touched = {}
        try:
            return passes()
        finally:
            self.used.update(self.touched)


class Reading:
    """A session whose run() goes through a host's plan-time Reads."""

    def __init__(self, session, reads: Reads):
        self._session, self._reads = session, reads

    def run(self, cmd: Cmd, step: str, *, check: bool = False, timeout: float | None = None, echo=None):
        return self._reads.read(cmd, step)

    def __getattr__(self, name):
        return getattr(self._session, name)


def to_json(reads: list[tuple[Cmd, str]]) -> list[dict]:
    """Reads as data (plain-text parts only: a read with a secret or raw shell syntax is never remembered)."""
    out = []
    for cmd, step in reads:
        if all(isinstance(p, str) for p in cmd.argv) and all(isinstance(v, str) for _, v in cmd.env):
            out.append({"argv": list(cmd.argv), "env": [list(e) for e in cmd.env], "cwd": cmd.cwd,
                        "login": cmd.login, "keep_owner": list(cmd.keep_owner), "step": step})
    return out


def from_json(data: list[dict]) -> list[tuple[Cmd, str]]:
    return [(Cmd(tuple(d["argv"]), tuple((k, v) for k, v in d["env"]), d["cwd"], bool(d["login"]),
                 tuple(d["keep_owner"])), d["step"]) for d in data]


class Memory:
    """Each host's last plan-time reads, kept on the control node (a directory only its user can read)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _path(self, host) -> Path:
        key = hashlib.sha256(f"{host.name}\0{host.address}\0{host.port}\0{host.venv}".encode()).hexdigest()
        return self.root / f"{key[:24]}.json"

    def recall(self, host) -> list[tuple[Cmd, str]]:
        try:
            return from_json(json.loads(self._path(host).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return []  # none yet, or unreadable: the plan gathers its reads as it goes

    def keep(self, host, reads: list[tuple[Cmd, str]]) -> None:
        keep_memo(self._path(host), json.dumps(to_json(reads)))
