"""Several read-only commands in one exec round trip, run side by side on the host; each keeps its own result."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from gpufleet import remote
from gpufleet.engine.command import Cmd

MARK = re.compile(r"^@@gpufleet-read (\d+) rc=(\d+)@@$", re.M)
# sshd hands the whole command line to the login shell as one argument, which Linux caps at 128 KiB
MAX_TEXT = 96 * 1024


def batchable(cmd: Cmd) -> bool:
    """A command whose text may travel inside another: no secret (those go on stdin, one command at a time)."""
    return not cmd.secrets()


@dataclass(frozen=True)
class BatchCmd(Cmd):
    """The command running reads side by side; it keeps the reads it carries (a test session answers each)."""

    reads: tuple[tuple[Cmd, str], ...] = ()


def batch_cmd(reads: Sequence[tuple[Cmd, str]]) -> BatchCmd:
    """One command running all of the (cmd, step) reads side by side (all of one `login` kind: one wire form)."""
    cmds = [c for c, _ in reads]
    script = remote.text("side_by_side.sh") + remote.text("read_batch.sh")
    return BatchCmd(("bash", "-c", script, "read-batch", *(c.render() for c in cmds)),
                    login=cmds[0].login, reads=tuple(reads))


def joined(answers: Sequence[tuple[int, str]]) -> str:
    """What read_batch.sh prints for these (exit code, output) answers, in order (for stand-in sessions)."""
    out = []
    for i, (code, text) in enumerate(answers):
        text = text.rstrip("\n")
        out.append(f"@@gpufleet-read {i} rc={code}@@\n" + (text + "\n" if text else ""))
    return "".join(out)


def split(output: str, count: int) -> list[tuple[int | None, str]]:
    """The batch's output as (exit code, output) per command, in order; (None, why) for one it did not report."""
    found: dict[int, tuple[int, str]] = {}
    marks = list(MARK.finditer(output))
    for n, m in enumerate(marks):
        end = marks[n + 1].start() if n + 1 < len(marks) else len(output)
        found[int(m.group(1))] = (int(m.group(2)), output[m.end() + 1:end])
    return [found.get(i, (None, "[gpufleet] the batched read reported nothing for this command\n"))
            for i in range(count)]


def run_side_by_side(session, reads: Sequence[tuple[Cmd, str]], *, timeout: float | None = None,
                     sent: Callable[[], None] | None = None) -> list:
    """Run (cmd, step) reads: batchable ones of one `login` kind in one exec each, the others alone; returns one
    engine Result per read, in order, as session.run would have (the batch's own run is in session.results).
    sent: called once the last of these execs is on its way (session.run's `sent`)."""
    from gpufleet.engine.ssh import Result

    # each exec: the indexes of the reads it answers (one read alone, or a batch)
    execs = [[i] for i, (cmd, _) in enumerate(reads) if not batchable(cmd)]
    execs += [chunk for group in _groups(reads).values() for chunk in _chunks(group, reads)]
    results: list = [None] * len(reads)
    for n, indexes in enumerate(execs):
        options = {"sent": sent} if sent is not None and n == len(execs) - 1 else {}
        if len(indexes) == 1:
            i = indexes[0]
            results[i] = session.run(reads[i][0], step=reads[i][1], check=False, timeout=timeout, **options)
            continue
        steps = ", ".join(dict.fromkeys(reads[i][1] for i in indexes))
        whole = session.run(batch_cmd([reads[i] for i in indexes]), step=f"reads side by side: {steps}",
                            check=False, timeout=timeout, **options)
        parts = split(whole.output, len(indexes)) if whole.exit_code is not None else []
        for k, i in enumerate(indexes):
            code, text = parts[k] if parts else (None, whole.output)
            results[i] = Result(session.name, reads[i][1], reads[i][0].display(), code, text, whole.seconds)
    return results


def _groups(reads) -> dict[bool, list[int]]:
    """The indexes of the batchable reads, by their `login` kind."""
    groups: dict[bool, list[int]] = {}
    for i, (cmd, _) in enumerate(reads):
        if batchable(cmd):
            groups.setdefault(cmd.login, []).append(i)
    return groups


def _chunks(indexes: list[int], reads) -> list[list[int]]:
    """Consecutive runs of indexes whose commands' texts together stay under MAX_TEXT."""
    out: list[list[int]] = []
    size = 0
    for i in indexes:
        length = len(reads[i][0].render())
        if not out or size + length > MAX_TEXT:
            out.append([])
            size = 0
        out[-1].append(i)
        size += length
    return out
