"""Rolling runs: batch planning, records, resume lookup, and the stop rule (with fake hosts, no SSH)."""

from __future__ import annotations

import json

import pytest

from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.testing.session import FakeSession
from gpufleet.fleet.roll import HostResult, Roll, RollSummary, RunRecord, batch_size, last_stopped, plan_batches

HOSTS = ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]


@pytest.mark.parametrize("spec,remaining,size", [("1", 4, 1), ("3", 4, 3), ("25%", 4, 1), ("50%", 5, 3),
                                                 ("100%", 4, 4), ("10", 2, 10)])
def test_batch_size(spec, remaining, size):
    assert batch_size(spec, remaining) == size


@pytest.mark.parametrize("spec", ["0", "-1", "abc", "0%", "150%", ""])
def test_bad_batch_names_flag_and_value(spec):
    with pytest.raises(ConfigError) as err:
        batch_size(spec, 4)
    assert "--batch" in str(err.value) and repr(spec) in str(err.value)


def test_canary_first_then_batches():
    assert plan_batches(HOSTS, None, "1") == [["gpu1"], ["gpu2"], ["gpu3"], ["gpu4"], ["gpu5"]]
    assert plan_batches(HOSTS, "gpu3", "2") == [["gpu3"], ["gpu1", "gpu2"], ["gpu4", "gpu5"]]
    assert plan_batches(HOSTS, None, "50%") == [["gpu1"], ["gpu2", "gpu3"], ["gpu4", "gpu5"]]
    assert plan_batches(["gpu1"], None, "3") == [["gpu1"]]


def test_unknown_canary_is_an_error():
    with pytest.raises(ConfigError, match="gpu9"):
        plan_batches(HOSTS, "gpu9", "1")


class FakeHost:
    def __init__(self, name):
        self.name = name


def _roll(monkeypatch, fail: set[str], max_fail: int = 0, recover=True):
    import gpufleet.fleet.roll as roll_mod
    from gpufleet.engine.runner import HostOutcome

    def fake_for_each(hosts, inventory, work, secrets=()):
        return [HostOutcome(h.name, value=work(FakeSession(name=h.name))) for h in hosts]

    monkeypatch.setattr(roll_mod, "for_each_host", fake_for_each)
    order = []

    def procedure(session, result, say):
        order.append(session.name)
        result.steps.append("upgrade")
        if session.name in fail:
            raise GpufleetError(f"health check failed on {session.name}")

    def recover_fn(session, result, say):
        result.steps.append("rolled back")

    return Roll(None, procedure, recover_fn if recover else None, max_fail=max_fail, say=lambda line: None), order


def _summary(hosts, batches):
    return RollSummary("upgrade", "20261202T000000Z", "inv upgrade", hosts, batches, 0,
                       results={h: HostResult(h) for h in hosts})


def test_roll_stops_after_a_failure_and_leaves_the_rest_untouched(monkeypatch, tmp_path):
    roll, order = _roll(monkeypatch, fail={"gpu2"})
    hosts = [FakeHost(h) for h in HOSTS[:3]]
    summary = _summary(HOSTS[:3], plan_batches(HOSTS[:3], None, "1"))
    record = RunRecord(tmp_path, summary)
    roll.run(hosts, summary, record)
    assert order == ["gpu1", "gpu2"]
    assert summary.status == "stopped"
    assert [summary.results[h].outcome for h in HOSTS[:3]] == ["ok", "rolled-back", "not-reached"]
    saved = json.loads((record.dir / "summary.json").read_text())
    assert saved["status"] == "stopped" and saved["results"][1]["error"].startswith("health check failed")
    assert last_stopped(tmp_path, "upgrade")[1].results["gpu3"].outcome == "not-reached"


def test_max_fail_lets_the_roll_go_on(monkeypatch, tmp_path):
    roll, order = _roll(monkeypatch, fail={"gpu2"}, max_fail=1, recover=False)
    summary = _summary(HOSTS[:3], plan_batches(HOSTS[:3], None, "1"))
    roll.run([FakeHost(h) for h in HOSTS[:3]], summary, RunRecord(tmp_path, summary))
    assert order == ["gpu1", "gpu2", "gpu3"] and summary.status == "completed"
    assert summary.results["gpu2"].outcome == "failed"


def test_resume_skips_completed_hosts(monkeypatch, tmp_path):
    roll, order = _roll(monkeypatch, fail=set())
    summary = _summary(HOSTS[:3], plan_batches(HOSTS[:3], None, "1"))
    summary.results["gpu1"].outcome = "ok"
    roll.run([FakeHost(h) for h in HOSTS[:3]], summary, RunRecord(tmp_path, summary), skip={"gpu1"})
    assert order == ["gpu2", "gpu3"] and summary.status == "completed"


def test_nothing_to_resume_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match="no stopped `upgrade` roll"):
        last_stopped(tmp_path, "upgrade")


def test_runs_started_in_the_same_second_each_keep_a_record(tmp_path):
    from gpufleet.fleet.router_status import last_roll_results

    # a no-op roll takes about a second: a cron and a person, or two in a row, may start in the same one
    records = []
    for outcome in ("stopped", "completed", "stopped"):
        summary = _summary(HOSTS[:2], [[HOSTS[0]], [HOSTS[1]]])
        summary.status, summary.results["gpu1"].outcome = outcome, f"ok-{len(records)}"
        records.append(RunRecord(tmp_path, summary))
    assert [r.dir.name for r in records] == ["20261202T000000Z", "20261202T000000Z-002", "20261202T000000Z-003"]
    assert all(json.loads((r.dir / "summary.json").read_text())["results"][0]["outcome"] == f"ok-{i}"
               for i, r in enumerate(records))
    # the newest of them is the one read: what to resume, and each host's last result
    folder, found = last_stopped(tmp_path, "upgrade")
    assert folder == records[2].dir and found.results["gpu1"].outcome == "ok-2"
    assert last_roll_results(tmp_path)["gpu1"]["outcome"] == "ok-2"
    for _ in range(8):
        RunRecord(tmp_path, _summary(HOSTS[:2], [[HOSTS[0]], [HOSTS[1]]]))
    assert last_stopped(tmp_path, "upgrade")[0].name == "20261202T000000Z-011"  # -011 after -003 and -010
