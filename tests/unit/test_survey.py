"""The roll's read-only survey: which hosts a roll leaves as they are (fleet/survey.py), and the plan-time reads
gathered side by side and remembered for the next run (engine/readahead.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from gpufleet.config import lock
from gpufleet.engine import readahead
from gpufleet.engine.command import Cmd, Secret
from gpufleet.fleet import survey
from gpufleet.fleet.executor import Entry, HostReport
from gpufleet.plan import Step, Unchanged
from gpufleet.testing.session import FakeSession
from tests.unit.test_lock import BUILD, COMMIT, VALID

PACKAGES = {"torch": "2.12.0.dev20260307+cu130", "flashinfer-python": "0.6.5", "sglang": "0.5.9",
            "sgl-kernel": "0.3.16"}


def facts(packages=PACKAGES, head=COMMIT):
    return SimpleNamespace(packages=dict(packages), checkout=SimpleNamespace(present=True, head=head))


def host(name, *, change=False, packages=PACKAGES, build=BUILD, ok=True, holder=None) -> survey.Surveyed:
    report = HostReport(name, True, outcome="ok" if ok else "unreachable", error=None if ok else "no route",
                        lock_holder=holder)
    report.entries = [Entry(Unchanged("torch", "installed"), "unchanged")]
    if change:
        report.entries.append(Entry(Step(role="torch", title="install", reason="venv has 2.9.1",
                                         commands=(Cmd.of("pip"),)), "planned"))
    report.facts = facts(packages)
    found = survey.judge(name, report)
    found.build_key = build
    return found


def locks(tmp_path: Path, *names: str) -> Path:
    for name in names:
        (tmp_path / name).write_text(VALID)
    return tmp_path


def test_a_host_is_on_target_only_when_nothing_is_planned_locked_or_failed():
    assert host("a").on_target
    assert not host("b", change=True).on_target and "torch: venv has 2.9.1" in host("b", change=True).why
    assert not host("c", holder="bob (pid 7)").on_target
    assert not host("d", ok=False).on_target and "unreachable" in host("d", ok=False).why


def test_a_converged_fleet_is_left_as_it_is_on_the_newest_lock_its_first_host_matches(tmp_path):
    found = {n: host(n) for n in ("gpu1", "gpu2")}
    left = survey.decide("upgrade", ["gpu1", "gpu2"], found, given=None, partial=False,
                         locks=locks(tmp_path, "20261201T000000Z-gpu1.toml", "20261202T000000Z-gpu1.toml"))
    assert left.held is not None and Path(left.held.path).name == "20261202T000000Z-gpu1.toml"
    assert left.hosts == {n: [survey.ON_TARGET, "matches lock 20261202T000000Z-gpu1.toml"] for n in found}


def test_a_host_on_target_that_differs_from_the_fleet_lock_is_rolled_to_it(tmp_path):
    found = {"gpu1": host("gpu1"), "gpu2": host("gpu2", packages={**PACKAGES, "extra-dist": "1.0"})}
    left = survey.decide("upgrade", ["gpu1", "gpu2"], found, given=None, partial=False,
                         locks=locks(tmp_path, "20261202T000000Z-gpu1.toml"))
    assert list(left.hosts) == ["gpu1"] and left.held is not None
    assert not found["gpu2"].on_target and "extra-dist: 1.0 is not in the lock" in found["gpu2"].why


def test_when_some_host_changes_and_no_lock_is_given_every_host_rolls(tmp_path):
    found = {"gpu1": host("gpu1", change=True), "gpu2": host("gpu2")}
    left = survey.decide("upgrade", ["gpu1", "gpu2"], found, given=None, partial=False, locks=tmp_path)
    assert left.hosts == {} and "every host is rolled" in left.note


def test_with_a_given_lock_hosts_matching_it_are_left_out_and_the_others_roll(tmp_path):
    given = lock.load(locks(tmp_path, "20261202T000000Z-gpu1.toml") / "20261202T000000Z-gpu1.toml")
    found = {"gpu1": host("gpu1"), "gpu2": host("gpu2", build="e" * 64), "gpu3": host("gpu3", change=True)}
    left = survey.decide("upgrade", list(found), found, given=given, partial=False, locks=tmp_path)
    assert list(left.hosts) == ["gpu1"]
    assert "sgl-kernel build eeeeeeeeeeee" in found["gpu2"].why


def test_no_matching_lock_leaves_a_converged_fleet_as_it_is_and_says_so(tmp_path):
    found = {"gpu1": host("gpu1", packages={"torch": "2.9.1"})}
    left = survey.decide("upgrade", ["gpu1"], found, given=None, partial=False,
                         locks=locks(tmp_path, "20261202T000000Z-gpu1.toml"))
    assert left.held is None and left.hosts == {"gpu1": [survey.ON_TARGET, "no recorded fleet lock matches gpu1"]}


def test_deploy_rolls_and_partial_upgrades_leave_out_every_host_on_target(tmp_path):
    found = {"gpu1": host("gpu1"), "gpu2": host("gpu2", change=True)}
    for kind, partial in (("deploy-model", False), ("upgrade", True)):
        left = survey.decide(kind, ["gpu1", "gpu2"], found, given=None, partial=partial, locks=tmp_path)
        assert left.hosts == {"gpu1": [survey.ON_TARGET]} and left.held is None


# ---- reads side by side --------------------------------------------------------------------------------------------
def planner(session_reads: readahead.Reads):
    """A two-read plan where the second read depends on the first one's answer (as the sglang checkout's does)."""
    def plan():
        first = session_reads.read(Cmd.of("probe", "upstream"), "probe")
        if first.exit_code != 0 or not first.output.startswith("sha="):
            raise ValueError("cannot read origin")
        return session_reads.read(Cmd.of("patches", first.output.strip()), "patches").output.strip()
    return plan


def test_dependent_reads_take_one_batch_each_then_the_plan_runs_on_real_answers_only():
    session = FakeSession({"probe": (0, "sha=abc\n"), "patches": (0, "all applied\n")})
    reads = readahead.Reads(session)
    assert reads.plan(planner(reads)) == "all applied"
    assert session.steps == ["probe", "patches"] and len(session.results) == 2
    assert [step for _, step in reads.used.values()] == ["probe", "patches"]


def test_remembered_reads_are_asked_with_the_first_ones_so_the_same_plan_needs_one_exec(tmp_path):
    memory = readahead.Memory(tmp_path / "reads")
    target = SimpleNamespace(name="gpu1", address="10.0.0.1", port=None, venv="/root/venv")
    first = FakeSession({"probe": (0, "sha=abc\n"), "patches": (0, "all applied\n")})
    reads = readahead.Reads(first)
    reads.plan(planner(reads))
    memory.keep(target, list(reads.used.values()))
    assert oct((tmp_path / "reads").stat().st_mode & 0o777) == "0o700"

    again = FakeSession({"probe": (0, "sha=abc\n"), "patches": (0, "all applied\n")})
    reads = readahead.Reads(again, remembered=memory.recall(target))
    assert reads.plan(planner(reads)) == "all applied"
    assert len(again.results) == 1 and sorted(again.steps) == ["patches", "probe"]


def test_a_remembered_read_no_longer_asked_costs_nothing_but_its_run_and_a_secret_is_never_remembered(tmp_path):
    memory = readahead.Memory(tmp_path)
    target = SimpleNamespace(name="gpu1", address="10.0.0.1", port=None, venv="/root/venv")
    memory.keep(target, [(Cmd.of("old", "read"), "old"), (Cmd.of("echo", Secret("tok-123")), "secret")])
    assert [step for _, step in memory.recall(target)] == ["old"]
    session = FakeSession({"probe": (0, "sha=new\n"), "patches": (0, "one to apply\n")})
    reads = readahead.Reads(session, remembered=memory.recall(target))
    assert reads.plan(planner(reads)) == "one to apply"
    assert "old" not in [step for _, step in reads.used.values()]


def test_a_read_after_the_plan_is_remembered_too():
    session = FakeSession({"probe": (0, "sha=abc\n"), "patches": (0, "all applied\n")})
    reads = readahead.Reads(session)
    reads.plan(planner(reads))
    reads.view().run(Cmd.of("cat", "record"), step="build record")
    assert [step for _, step in reads.used.values()] == ["probe", "patches", "build record"]


def test_a_read_asked_up_front_before_the_resolver_is_on_the_host_is_read_again_after_it(tmp_path, monkeypatch):
    # the CI found it: a remembered pip resolve ran with the facts, before the dry run put the resolver's wheel on
    # the freshly reset host, and its "can't open file" answer was used after the upload
    from gpufleet.config.stack import Stack
    from gpufleet.fleet import executor
    from gpufleet.fleet.executor import Executor
    from gpufleet.fleet.hoststate import RunInfo

    wheel = "/var/cache/gpufleet/tools/pip.whl"
    state = {"uploaded": False}

    def resolver(self):
        state["uploaded"] = True
        self._resolver = wheel
        return wheel
    monkeypatch.setattr(executor._HostRun, "resolver", resolver)

    def plan(ctx):
        found = ctx.read(Cmd.of("resolve", ctx.resolver()), "resolve")
        return [Unchanged("pipper", f"resolve exit {found.exit_code}: {found.output.strip()}")]
    role = SimpleNamespace(name="pipper", plan=plan)
    session = FakeSession({"resolve": lambda step, cmd: (0, "resolved") if state["uploaded"] else
                           (2, "can't open file")})
    memory = readahead.Memory(tmp_path)
    memory.keep(session.host, [(Cmd.of("resolve", wheel), "resolve")])
    up = Executor(roles=[role], run=RunInfo.current("t"), repo=Path("."), dry_run=True, say=lambda line: None,
                  read_facts=lambda on: SimpleNamespace(host="gpu1"), read_memory=memory)
    report = up.host(session, Stack())
    assert [e.item.reason for e in report.entries] == ["resolve exit 0: resolved"], report.error
    assert session.steps.count("resolve") == 2  # up front (too early), then after the upload
