"""Reads side by side in one exec (engine/batch.py): the real read_batch.sh run here with bash, each read's exit
code and output kept apart, secrets never put inside the batch's text."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from gpufleet.engine import batch
from gpufleet.engine.command import Cmd, Secret
from gpufleet.engine.ssh import Result


class LocalSession:
    """Runs commands with bash here, as HostSession.run does on a host; keeps every run like session.results."""

    name = "local"

    def __init__(self):
        self.results: list[Result] = []

    def run(self, cmd, step, check=True, timeout=None):
        proc = subprocess.run(["bash", "-c", cmd.render()], capture_output=True, text=True, timeout=60)
        result = Result(self.name, step, cmd.display(), proc.returncode, proc.stdout + proc.stderr, 0.0)
        self.results.append(result)
        return result


def test_each_read_keeps_its_exit_code_and_output_in_order():
    session = LocalSession()
    reads = [(Cmd.of("bash", "-c", "echo one; echo err >&2; exit 3"), "first"),
             (Cmd.of("printf", "%s", "no newline at the end"), "second"),
             (Cmd.of("bash", "-c", "printf '@@gpufleet-read 0 rc=9@@ is only text here\\n'; true"), "third"),
             (Cmd.of("true"), "quiet")]
    got = batch.run_side_by_side(session, reads)
    assert [(r.step, r.exit_code) for r in got] == [("first", 3), ("second", 0), ("third", 0), ("quiet", 0)]
    assert got[0].output == "one\nerr\n" and got[1].output == "no newline at the end\n"
    assert got[2].output.startswith("@@gpufleet-read 0 rc=9@@ is only text") and got[3].output == ""
    assert len(session.results) == 1, "four reads, one exec"


def test_reads_run_side_by_side_not_one_after_another(tmp_path):
    # each read waits for the other's file: one after another, the first would wait forever (the timeout says so)
    a, b = tmp_path / "a", tmp_path / "b"
    wait_for = "for i in $(seq 100); do [ -e {0} ] && exit 0; sleep 0.05; done; exit 1"
    reads = [(Cmd.of("bash", "-c", f"touch {a}; " + wait_for.format(b)), "a"),
             (Cmd.of("bash", "-c", f"touch {b}; " + wait_for.format(a)), "b")]
    assert [r.exit_code for r in batch.run_side_by_side(LocalSession(), reads)] == [0, 0]


def test_a_read_with_a_secret_runs_alone_and_login_reads_apart():
    session = LocalSession()
    reads = [(Cmd.of("echo", Secret("s3cr3t-value")), "secret"), (Cmd.of("echo", "a"), "a"),
             (Cmd.of("echo", "b", login=True), "login b"), (Cmd.of("echo", "c", login=True), "login c"),
             (Cmd.of("echo", "d"), "d")]
    got = batch.run_side_by_side(session, reads)
    assert [r.output.strip() for r in got] == ["s3cr3t-value", "a", "b", "c", "d"]
    ran = [r.step for r in session.results]
    assert ran[0] == "secret" and len(ran) == 3, ran  # the secret alone, then one batch per login kind
    assert all("s3cr3t-value" not in r.command for r in session.results[1:])


def test_a_batch_that_broke_off_reports_every_read_as_unanswered():
    parts = batch.split("@@gpufleet-read 0 rc=0@@\nfine\n", 2)
    assert parts[0] == (0, "fine\n") and parts[1][0] is None


def test_reads_too_long_for_one_command_line_go_in_several_batches():
    session = LocalSession()
    big = "x" * (batch.MAX_TEXT // 2 + 10)
    reads = [(Cmd.of("bash", "-c", f": {big}; echo {n}"), str(n)) for n in range(3)]
    got = batch.run_side_by_side(session, reads)
    assert [r.output.strip() for r in got] == ["0", "1", "2"] and len(session.results) == 3


def test_a_read_runs_as_its_own_command_would():
    """Each read runs in a subshell of the batch (no second bash): its `exit` ends only itself, it sees no arguments
    and no stdin of the batch's, and a read killed by a signal says so as a shell would (128 + 9)."""
    session = LocalSession()
    reads = [(Cmd.of("exit", "4"), "exits"),
             (Cmd.of("bash", "-c", 'echo "$# ${1:-none}"'), "arguments"),
             (Cmd.of("eval", 'echo "$# ${1:-none}"'), "the batch's arguments"),
             (Cmd.of("cat"), "stdin"),
             (Cmd.of("eval", "echo partial; kill -9 $BASHPID"), "killed"),
             (Cmd.of("echo", "after"), "after")]
    got = batch.run_side_by_side(session, reads)
    assert [(r.exit_code, r.output) for r in got] == [
        (4, ""), (0, "0 none\n"), (0, "0 none\n"), (0, ""), (137, "partial\n"), (0, "after\n")]
    assert len(session.results) == 1


def test_a_read_larger_than_a_pipe_holds():
    session = LocalSession()
    reads = [(Cmd.of("bash", "-c", "head -c 200000 /dev/zero | tr '\\0' y"), "big"), (Cmd.of("echo", "small"), "s")]
    got = batch.run_side_by_side(session, reads)
    assert got[0].output == "y" * 200000 + "\n" and got[1].output == "small\n"


@pytest.mark.skipif(shutil.which("strace") is None, reason="no strace here (scripts/bootstrap installs it)")
def test_a_reads_output_is_taken_in_blocks_not_one_byte_per_system_call(tmp_path):
    """`read -d ''` takes a pipe one byte per read(2): 200 KB of output would be 200,000 system calls."""
    cmd = batch.batch_cmd([(Cmd.of("bash", "-c", "head -c 200000 /dev/zero | tr '\\0' y"), "big"),
                           (Cmd.of("echo", "small"), "s")])
    trace = tmp_path / "trace"
    proc = subprocess.run(["strace", "-f", "-e", "trace=read", "-o", str(trace), "bash", "-c", cmd.render()],
                          capture_output=True, text=True, timeout=120)
    assert batch.split(proc.stdout, 2) == [(0, "y" * 200000 + "\n"), (0, "small\n")]
    calls = sum(1 for line in trace.read_text().splitlines() if " read(" in line)
    assert 0 < calls < 5000


@pytest.mark.parametrize("locale", ["C", "C.UTF-8"])
def test_outputs_come_back_byte_for_byte_in_any_locale(locale, monkeypatch):
    """Trailing newlines dropped (as $(...) drops them), everything else kept, whatever the host's locale."""
    monkeypatch.setenv("LC_ALL", locale)
    texts = ["\n\n\n", "a\n\n", "no newline", "\u00e9t\u00e9 \\n \\\\ x\n", "fake\n@@gpufleet-rc=9\nreal\n"]
    reads = [(Cmd.of("printf", "%s", text), f"r{i}") for i, text in enumerate(texts)] + [
        (Cmd.of("bash", "-c", "printf 'x\\n'; exit 4"), "four")]
    got = batch.run_side_by_side(LocalSession(), reads)
    assert [(r.exit_code, r.output) for r in got] == [
        (0, ""), (0, "a\n"), (0, "no newline\n"), (0, "\u00e9t\u00e9 \\n \\\\ x\n"),
        (0, "fake\n@@gpufleet-rc=9\nreal\n"), (4, "x\n")]


class TellingSession(LocalSession):
    """A LocalSession whose run() takes `sent` as HostSession.run does, noting when each is called."""

    def __init__(self):
        super().__init__()
        self.events: list[str] = []

    def run(self, cmd, step, check=True, timeout=None, sent=None):
        self.events.append(f"exec {step}")
        if sent is not None:
            sent()
        result = super().run(cmd, step, check=check, timeout=timeout)
        self.events.append(f"answered {step}")
        return result


def test_sent_is_told_once_with_the_last_exec_before_its_answer():
    session = TellingSession()
    reads = [(Cmd.of("echo", Secret("s3cr3t-value")), "secret"), (Cmd.of("echo", "a"), "a"),
             (Cmd.of("echo", "b"), "b")]
    got = batch.run_side_by_side(session, reads, sent=lambda: session.events.append("sent"))
    assert [r.output for r in got] == ["s3cr3t-value\n", "a\n", "b\n"]
    assert session.events == ["exec secret", "answered secret", "exec reads side by side: a, b", "sent",
                              "answered reads side by side: a, b"]


def test_without_sent_a_session_is_called_as_before():
    # sessions written before `sent` (the fakes above) take no such argument: it is passed only when given
    assert [r.output for r in batch.run_side_by_side(LocalSession(), [(Cmd.of("echo", "x"), "x")])] == ["x\n"]
