"""Run a long command on a host detached from the SSH connection (a transient systemd unit), and follow its log."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from gpufleet import remote
from gpufleet.engine.command import Cmd
from gpufleet.engine.query import Query, ask
from gpufleet.errors import GpufleetError, UnreachableError
from gpufleet.engine.output import HostLines

BUILDS_DIR = "/var/lib/gpufleet/builds"


@dataclass(frozen=True)
class Job:
    """A detached command's unit name and its files on the host: log, exit-code file, pid file (fallback)."""

    unit: str
    dir: str

    @classmethod
    def for_key(cls, key: str, base: str = BUILDS_DIR) -> "Job":
        return cls(f"gpufleet-build-{key[:12]}", f"{base}/{key}")

    @property
    def log(self) -> str:
        return f"{self.dir}/build.log"

    @property
    def rc_file(self) -> str:
        return f"{self.dir}/exit-code"

    @property
    def pid_file(self) -> str:
        return f"{self.dir}/pid"


@dataclass(frozen=True)
class State:
    """running, finished (rc set) or absent (never started, or died without an exit code)."""

    status: str
    rc: int | None = None


def _parse_state(text: str) -> State:
    words = (text.strip().splitlines() or ["absent"])[-1].split()
    if words and words[0] == "finished":
        try:
            return State("finished", int(words[1]))
        except (IndexError, ValueError):
            return State("finished", 1)
    return State("running" if words and words[0] == "running" else "absent")


def state_query(job: Job) -> Query[State]:
    text = remote.text("job_state.sh") + 'job_state "$@"\n'
    return Query(Cmd.of("bash", "-c", text, "job-state", job.rc_file, job.unit, job.pid_file),
                 lambda host, output: _parse_state(output), "detached state", check=True)


def state(session, job: Job) -> State:
    """Whether the job runs, has finished (with its exit code) or is absent."""
    return ask(session, state_query(job))


def start_cmd(job: Job, cmd: Cmd, properties: tuple[str, ...] = (), retry_failed: bool = False) -> Cmd:
    """Start cmd detached unless it runs or has finished (failed: only if retry_failed); prints what it found."""
    text = remote.text("job_state.sh") + remote.text("job_start.sh") + 'job_start "$@"\n'
    return Cmd.of("bash", "-c", text, "job-start", *_start_args(job, cmd, retry_failed), *properties)


def _start_args(job: Job, cmd: Cmd, retry_failed: bool) -> tuple[str, ...]:
    return (job.dir, job.log, job.rc_file, job.pid_file, job.unit, cmd.render(), "1" if retry_failed else "0")


def start(session, job: Job, cmd: Cmd, properties: tuple[str, ...] = (), retry_failed: bool = False) -> str:
    """Start cmd detached; returns 'started', 'running' or 'finished <rc>' (a re-run picks up the existing job)."""
    out = session.run(start_cmd(job, cmd, properties, retry_failed), "detached start").output
    return (out.strip().splitlines() or ["started"])[-1]


def poll_query(job: Job, offset: int) -> Query["tuple[int | None, str, int, str] | None"]:
    """One poll: (exit code or None while running, state word, log size, new log text); None without an answer."""
    text = remote.text("job_state.sh") + remote.text("job_poll.sh")
    return Query(Cmd.of("bash", "-c", text, "job-poll", job.rc_file, job.unit, job.pid_file, job.log, str(offset)),
                 lambda host, output: _parse_poll(output) if "@@rc " in output else None, "detached follow",
                 timeout=60)


def _parse_poll(text: str) -> tuple[int | None, str, int, str]:
    head, rest = text.split("@@rc ", 1)[1].split("\n", 1)
    st, rest = rest.split("\n", 1)
    size, data = (rest.split("\n", 1) + [""])[:2]
    rc = int(head) if head.strip().lstrip("-").isdigit() else None
    return rc, st.removeprefix("@@st ").split(" ")[0], int(size.removeprefix("@@size ").strip() or 0), data


class DetachedError(GpufleetError):
    """A detached job vanished without an exit code, or its host stayed unreachable."""


def follow(session, job: Job, *, offset: int = 0, echo: Callable[[str], None] | None = None, poll: float = 2.0,
           reconnect_for: float = 300.0, timeout: float | None = None) -> int:
    """Poll the job's log from offset, echo new lines, reconnect when the link drops; return the exit code."""
    lines = HostLines(session.name, sink=echo) if echo else None
    started = time.monotonic()
    lost_since: float | None = None
    while True:
        query = poll_query(job, offset)
        try:
            res = session.run(query.cmd, query.step, check=False, timeout=query.timeout)
        except UnreachableError:
            res = None
        answer = query.parse(session.name, res.output) if res is not None and res.exit_code is not None else None
        if answer is None:
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > reconnect_for:
                raise DetachedError(f"{session.name}: lost the connection to {job.unit} for {reconnect_for:.0f}s")
            time.sleep(poll)
            try:
                session.reconnect()
            except UnreachableError:
                pass
            continue
        lost_since = None
        rc, st, size, data = answer
        if lines and size > offset:
            lines.feed(data)
        offset = max(offset, size)
        if rc is not None:
            if lines:
                lines.flush()
            return rc
        if st == "absent":
            raise DetachedError(f"{session.name}: {job.unit} is gone without an exit code (see {job.log})")
        if timeout is not None and time.monotonic() - started > timeout:
            raise DetachedError(f"{session.name}: {job.unit} still running after {timeout:.0f}s")
        time.sleep(poll)


def wait_cmd(job: Job, cmd: Cmd, poll: float = 5.0) -> Cmd:
    """One plain command: start (or pick up) the job, stream its log, exit with its exit code. A dropped connection
    leaves the job running; running it again re-attaches (a picked-up job's log is streamed from its last lines)."""
    text = (remote.text("job_state.sh") + remote.text("job_start.sh") + remote.text("job_wait.sh")
            + 'job_start "${@:1:7}" || exit $?\njob_wait "$2" "$3" "$5" "$4" "$8"\n')
    return Cmd.of("bash", "-c", text, "job-wait", *_start_args(job, cmd, True), f"{poll:g}")


def attach_cmd(job: Job, poll: float = 5.0) -> Cmd:
    """Follow a job started earlier (by wait_cmd) to its end, never starting it again: one that is gone without an
    exit code (its host restarted, or it was killed) exits 1 saying so, so a half-done change is never run twice."""
    text = (remote.text("job_state.sh") + remote.text("job_wait.sh")
            + 'st=$(job_state "$2" "$3" "$4")\n'
            + 'if [ "$st" = absent ]; then\n'
            + '    echo "gpufleet: $3 ended with no exit code: the host restarted or the job was killed"; exit 1\n'
            + 'fi\njob_wait "$1" "$2" "$3" "$4" "$5"\n')
    return Cmd.of("bash", "-c", text, "job-attach", job.log, job.rc_file, job.unit, job.pid_file, f"{poll:g}")
