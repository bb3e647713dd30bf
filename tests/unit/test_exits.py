"""Every exit path of a roll writes true records: Ctrl-C (once: finish and stop; twice: stop now, state unknown),
an unexpected error, a killed roll found by --resume; a rollback waits for a host that dropped off."""

from __future__ import annotations

import json
import signal
import time

import pytest

from gpufleet.cli.interrupts import EXIT_INTERRUPTED, Interrupts
from gpufleet.cli.roll import roll_exit_code
from gpufleet.engine.runner import HostOutcome
from gpufleet.errors import ConnectionLost, GpufleetError, UnreachableError
from gpufleet.fleet import rollback
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.fleet.roll import (HostResult, Roll, RollSummary, RunRecord, in_flight, last_stopped, mark_killed,
                                 plan_batches)
from gpufleet.testing.session import FakeSession

HOSTS = ["gpu1", "gpu2", "gpu3"]
RUN = RunInfo("alice", "laptop", 42, "2026-12-02T10:00:00Z", "inv upgrade --hosts all", token="t0k")


class FakeHost:
    def __init__(self, name):
        self.name = name


def _summary(hosts=HOSTS) -> RollSummary:
    return RollSummary("upgrade", "20261202T100000Z", "inv upgrade --hosts all", list(hosts),
                       plan_batches(list(hosts), None, "1"), 0, results={h: HostResult(h) for h in hosts})


def _roll(monkeypatch, procedure, recover=None, **kw):
    import gpufleet.fleet.roll as roll_mod

    sessions = {}

    def fake_for_each(hosts, inventory, work, secrets=()):
        out = []
        for h in hosts:
            sessions[h.name] = FakeSession(name=h.name)
            out.append(HostOutcome(h.name, value=work(sessions[h.name])))
        return out

    monkeypatch.setattr(roll_mod, "for_each_host", fake_for_each)
    return Roll(None, procedure, recover, say=lambda line: None, **kw), sessions


# ---- Ctrl-C --------------------------------------------------------------------------------------------------------

def test_first_ctrl_c_says_at_once_what_it_does_second_writes_records_and_exits():
    told, aborted, exited = [], [], []
    guard = Interrupts(told.append, lambda: ["gpu2"], lambda: aborted.append(True), exit=exited.append)
    with guard:
        signal.raise_signal(signal.SIGINT)  # a real SIGINT to this (main) thread: no KeyboardInterrupt
        assert guard.interrupted and not aborted
        for _ in range(50):
            if told:
                break
            time.sleep(0.01)
        assert told == ["interrupt: finishing (or restoring, if it fails) gpu2, then stopping; hosts not reached "
                        "stay untouched; Ctrl-C again to stop now"]
        guard.handle()  # the second one
        assert aborted == [True] and exited == [EXIT_INTERRUPTED]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_second_ctrl_c_exits_even_when_writing_records_fails():
    exited = []
    guard = Interrupts(lambda line: None, lambda: [], lambda: 1 / 0, exit=exited.append)
    guard.handle()
    guard.handle()
    assert exited == [EXIT_INTERRUPTED]


def test_ctrl_c_lets_the_host_in_flight_finish_and_stops_before_the_next(monkeypatch, tmp_path):
    def procedure(session, result, say):
        say("upgrading")
        roll.stopping.set()  # Ctrl-C while gpu1 is being changed
        result.steps.append("upgrade")

    roll, _ = _roll(monkeypatch, procedure)
    summary = _summary()
    record = RunRecord(tmp_path, summary)
    roll.run([FakeHost(h) for h in HOSTS], summary, record)
    assert summary.status == "interrupted" and "Ctrl-C" in summary.note
    assert [summary.results[h].outcome for h in HOSTS] == ["ok", "not-reached", "not-reached"]
    saved = json.loads((record.dir / "summary.json").read_text())
    assert saved["status"] == "interrupted" and "running" not in {r["outcome"] for r in saved["results"]}
    assert roll_exit_code(summary) == EXIT_INTERRUPTED and not roll.doing


def test_a_host_is_recorded_running_while_in_flight(monkeypatch, tmp_path):
    seen = []

    def procedure(session, result, say):
        seen.append(json.loads((record.dir / "summary.json").read_text())["results"][0]["outcome"])

    roll, _ = _roll(monkeypatch, procedure)
    summary = _summary(["gpu1"])
    record = RunRecord(tmp_path, summary)
    roll.run([FakeHost("gpu1")], summary, record)
    assert seen == ["running"] and summary.results["gpu1"].outcome == "ok"


def test_abandon_marks_hosts_in_flight_unknown_and_says_what_to_run(tmp_path):
    summary = _summary()
    summary.results["gpu1"].outcome = "ok"
    summary.results["gpu2"].outcome = "running"
    record = RunRecord(tmp_path, summary)
    marked = record.abandon("interrupted", "second Ctrl-C", "state unknown; run `inv rollback --host {host}`")
    assert marked == ["gpu2"]
    saved = json.loads((record.dir / "summary.json").read_text())
    assert saved["status"] == "interrupted" and saved["note"] == "second Ctrl-C"
    gpu2 = saved["results"][1]
    assert gpu2["outcome"] == "interrupted" and gpu2["error"] == "state unknown; run `inv rollback --host gpu2`"
    assert "interrupted: state unknown" in (record.dir / "gpu2.log").read_text()


# ---- errors ---------------------------------------------------------------------------------------------------------

def test_an_unexpected_error_is_a_failed_host_restored_and_recorded(monkeypatch, tmp_path):
    restored = []

    def procedure(session, result, say):
        raise KeyError("oops")

    def recover(session, result, say):
        restored.append(session.name)

    roll, _ = _roll(monkeypatch, procedure, recover)
    summary = _summary()
    record = RunRecord(tmp_path, summary)
    roll.run([FakeHost(h) for h in HOSTS], summary, record)
    assert restored == ["gpu1"] and summary.status == "stopped"
    assert summary.results["gpu1"].outcome == "rolled-back"
    assert summary.results["gpu1"].error == "unexpected error: KeyError: 'oops'"
    assert "Traceback" in (record.dir / "gpu1.log").read_text()


def test_nothing_to_undo_is_not_rolled_back(monkeypatch, tmp_path):
    def procedure(session, result, say):
        raise GpufleetError("lost before any change")

    roll, _ = _roll(monkeypatch, procedure, lambda session, result, say: False)
    summary = _summary(["gpu1"])
    roll.run([FakeHost("gpu1")], summary, RunRecord(tmp_path, summary))
    assert summary.results["gpu1"].outcome == "failed"


def test_each_host_gets_the_rolls_line_in_its_audit_log(monkeypatch, tmp_path):
    roll, sessions = _roll(monkeypatch, lambda session, result, say: result.steps.append("upgrade"), run_info=RUN)
    summary = _summary(["gpu1"])
    roll.run([FakeHost("gpu1")], summary, RunRecord(tmp_path, summary))
    [audit] = [json.loads(cmd.argv[-1]) for step, cmd in sessions["gpu1"].calls if step == "audit log"]
    assert audit["outcome"] == "ok" and audit["roll"] == summary.started and audit["pid"] == 42
    assert audit["kind"] == "upgrade roll" and audit["steps"] == ["upgrade"]


# ---- a killed roll, found by --resume ---------------------------------------------------------------------------------

def test_a_killed_roll_is_reported_interrupted_and_its_host_in_flight_kept_for_a_recheck(tmp_path):
    summary = _summary()
    summary.pid = 2 ** 22 + 12345  # beyond pid_max: no such process
    summary.results["gpu1"].outcome = "ok"
    summary.results["gpu2"].outcome, summary.results["gpu2"].started = "running", "20261202T100100Z"
    RunRecord(tmp_path, summary)
    folder, found = last_stopped(tmp_path, "upgrade")
    assert found.status == "running" and in_flight(found) == ["gpu2"]
    note = mark_killed(folder, found)
    saved = json.loads((folder / "summary.json").read_text())
    assert saved["status"] == "interrupted" and saved["note"] == note and f"pid {summary.pid}" in note
    assert [r["outcome"] for r in saved["results"]] == ["ok", "interrupted", "not-reached"]
    assert in_flight(last_stopped(tmp_path, "upgrade")[1]) == ["gpu2"]


def _listing(*manifests) -> str:
    return "".join(f"@@snapshot /var/lib/gpufleet/snapshots/{m['created']} 10\n{json.dumps(m)}\n" for m in manifests)


def test_the_snapshot_of_an_interrupted_run_is_its_first_one_there():
    older = {"created": "2026-12-02T09:00:00Z", "command": "inv upgrade --hosts all", "pid": 42}
    other = {"created": "2026-12-02T10:00:05Z", "command": "inv deploy-model", "pid": 42}
    first = {"created": "2026-12-02T10:00:07Z", "command": "inv upgrade --hosts all", "pid": 42}
    later = {"created": "2026-12-02T10:00:30Z", "command": "inv upgrade --hosts all", "pid": 42}
    session = FakeSession({"list snapshots": (0, _listing(older, other, first, later) + "@@total 40\n")})
    found = rollback.snapshot_of_run(session, "20261202T100000Z", 42, "inv upgrade --hosts all")
    assert found == "/var/lib/gpufleet/snapshots/2026-12-02T10:00:07Z"
    assert rollback.snapshot_of_run(session, "20261202T100000Z", 43, "inv upgrade --hosts all") is None


def test_resume_rechecks_a_host_in_flight_against_that_runs_snapshot(tmp_path):
    from gpufleet.fleet.procedures import RollProcedures

    before = _summary()
    before.pid = 42
    before.results["gpu2"].outcome = "interrupted"
    first = {"created": "2026-12-02T10:00:07Z", "command": "inv upgrade --hosts all", "pid": 42}
    session = FakeSession({"list snapshots": (0, _listing(first))}, name="gpu2")
    summary = _summary()
    summary.started = "20261202T110000Z"
    steps = RollProcedures("upgrade", stacks={}, repo=tmp_path, run=RUN, say=lambda line: None, summary=summary,
                           record=RunRecord(tmp_path, summary), interrupted=before)
    result, said = HostResult("gpu2"), []
    steps._recheck(session, result, said.append)
    assert result.snapshot == "/var/lib/gpufleet/snapshots/2026-12-02T10:00:07Z"
    assert "left gpu2 in an unknown state (interrupted): re-checking it" in said[0]
    [audit] = [json.loads(cmd.argv[-1]) for step, cmd in session.calls if step == "audit log"]
    assert audit["outcome"] == "interrupted" and audit["roll"] == before.started and audit["pid"] == 42
    fresh = HostResult("gpu1")  # finished in that roll: nothing to re-check
    steps._recheck(FakeSession(name="gpu1"), fresh, said.append)
    assert fresh.snapshot is None and len(said) == 1


# ---- a host that dropped off -----------------------------------------------------------------------------------------

class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def _flaky(down_for: int) -> FakeSession:
    calls = {"n": 0}

    def answer(step, cmd):
        calls["n"] += 1
        if calls["n"] <= down_for:
            raise UnreachableError("host gpu2 (10.0.0.2): cannot connect: [Errno 111] Connection refused")
        return (0, "")
    return FakeSession({"still answering?": answer, "back?": answer}, name="gpu2")


def test_reach_waits_for_a_rebooting_host_and_says_so_once():
    clock, said = _Clock(), []
    session = _flaky(down_for=4)
    rollback.reach(session, 120, said.append, clock=clock, sleep=clock.sleep)
    assert said[0] == "gpu2 is not answering (rebooting?); waiting up to 120 s for it to come back"
    assert said[-1].startswith("gpu2 answers again after") and len(said) == 2
    assert "boot finished?" in session.steps


def test_reach_gives_up_after_the_bound_naming_it():
    clock = _Clock()
    with pytest.raises(UnreachableError, match=r"not answering after waiting \d+ s .*reconnect_for is 30 s"):
        rollback.reach(_flaky(down_for=10 ** 6), 30, lambda line: None, clock=clock, sleep=clock.sleep)
    assert 30 <= clock.now <= 45


def test_reach_returns_at_once_for_a_host_that_answers():
    said = []
    session = FakeSession(name="gpu2")
    rollback.reach(session, 120, said.append)
    assert said == [] and session.steps == ["still answering?"]


def test_a_snapshot_read_cut_by_the_host_going_down_is_unreachable_not_a_bad_manifest():
    session = FakeSession({"read snapshot": (None, "\n[gpufleet] connection lost: the host stopped answering\n")})
    with pytest.raises(ConnectionLost):
        rollback.describe(session, "/var/lib/gpufleet/snapshots/x")


def test_a_host_that_drops_off_again_after_answering_is_waited_for_again():
    # a rebooting host's sshd still took the first login; the snapshot read then lost its connection
    clock, said = _Clock(), []
    manifest = '{"created": "2026-12-05T23:25:20Z", "by": "root"}\nvenv=yes\n'
    session = FakeSession({"still answering?": [(0, ""), (None, "")], "back?": (0, ""),
                           "read snapshot": [(None, "\n[gpufleet] connection lost\n"), (0, manifest)]}, name="gpu2")
    info = rollback.reach_then(session, 120, lambda: rollback.describe(session, "/s"), said.append,
                               clock=clock, sleep=clock.sleep)
    assert info.manifest["by"] == "root" and info.details == {"venv": "yes"}
    assert said[0].startswith("gpu2 dropped off again: host gpu2: step 'read snapshot'")
    assert said[1] == "gpu2 is not answering (rebooting?); waiting up to 120 s for it to come back"
    assert session.steps.count("read snapshot") == 2


def test_a_host_that_keeps_dropping_off_is_given_up_within_the_bound():
    clock = _Clock()

    def lost():
        clock.sleep(50)
        return rollback.describe(session, "/s")
    session = FakeSession({"read snapshot": (None, "")}, name="gpu2")
    with pytest.raises(ConnectionLost):
        rollback.reach_then(session, 120, lost, lambda line: None, clock=clock, sleep=clock.sleep)
    assert 120 <= clock.now <= 180


def test_reconnect_for_is_validated_at_load(tmp_path):
    from gpufleet.config.inventory import load_inventory
    from gpufleet.errors import ConfigError

    path = tmp_path / "hosts.toml"
    path.write_text('[settings]\nreconnect_for = 1e400\n[hosts.gpu1]\naddress = "10.0.0.1"\n')
    with pytest.raises(ConfigError, match="reconnect_for"):
        load_inventory(path)
    path.write_text('[settings]\nreconnect_for = 90\n[hosts.gpu1]\naddress = "10.0.0.1"\n')
    assert load_inventory(path).settings.reconnect_for == 90


def test_what_a_host_in_flight_is_doing_is_its_last_line_whoever_said_it():
    from gpufleet.fleet.roll import note_doing

    doing = {"gpu1": "starting"}
    note_doing(doing, "[gpu1] torch: install torch 2.12")
    note_doing(doing, "[gpu2] flashinfer: install")  # not in flight: not recorded
    note_doing(doing, "batch 2/3: gpu2")
    assert doing == {"gpu1": "torch: install torch 2.12"}
