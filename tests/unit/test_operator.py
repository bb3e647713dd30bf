"""Operator conveniences: --parallel, --max-fail, --only/--skip with role dependencies, exit codes, markup escaping,
the lock's holder judged live or stale, snapshot listing and retention (remote scripts run here on a temp dir)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from invoke import Exit
from rich.console import Console

from gpufleet import remote
from gpufleet.cli import common
from gpufleet.cli.roll import outcome_table, roll_exit_code
from gpufleet.cli.target import parse_parallel, role_selection
from gpufleet.cli.upgrade import print_reports
from gpufleet.config.stack import Stack
from gpufleet.engine.command import Cmd
from gpufleet.errors import ConfigError, GpufleetError, RemoteCommandError, UnreachableError
from gpufleet.facts.model import HostFacts
from gpufleet.fleet import hoststate
from gpufleet.fleet.executor import Executor, HostReport
from gpufleet.fleet.hoststate import Claim, RunInfo, liveness, parse_snapshot_list
from gpufleet.fleet.roll import HostResult, RollSummary, max_failures
from gpufleet.plan import Step, Unchanged
from gpufleet.roleapi import Declares, needs, select
from gpufleet.roles import ROLES
from gpufleet.testing.session import FakeSession

RUN = RunInfo("alice", "laptop", 42, "2026-12-02T10:00:00Z", "inv upgrade --host gpu1", token="t0k")


# --parallel, --max-fail

@pytest.mark.parametrize("given, expected", [(None, None), ("", None), ("1", 1), ("32", 32), (" 4 ", 4)])
def test_parallel_parses(given, expected):
    assert parse_parallel(given) == expected


@pytest.mark.parametrize("given", ["0", "-2", "x", "1.5", "4%"])
def test_parallel_bad_values_are_one_clear_error(given):
    with pytest.raises(ConfigError, match=r"^--parallel: must be a whole number of hosts, 1 or more \(got "):
        parse_parallel(given)


@pytest.mark.parametrize("spec, hosts, expected", [
    ("0", 10, 0), ("3", 10, 3), (2, 5, 2), ("10%", 25, 2), ("10%", 20, 2), ("10%", 5, 0), ("50%", 3, 1),
    ("100%", 4, 4), ("0%", 9, 0), ("33.4%", 3, 1), (" 25% ", 8, 2)])
def test_max_fail_is_a_count_or_a_share_of_the_roll_rounded_down(spec, hosts, expected):
    assert max_failures(spec, hosts) == expected


@pytest.mark.parametrize("spec", ["-1", "x", "10x", "101%", "-5%", "%", "nan%", "1.5"])
def test_max_fail_bad_values_are_one_clear_error(spec):
    with pytest.raises(ConfigError, match=r"^--max-fail: must be a number of hosts .* like 10%"):
        max_failures(spec, 10)


# --only / --skip

def names(sel):
    return {r.name for r in ROLES if sel.runs(r.name)}


def test_registry_declares_what_builds_on_what():
    by = {r.name: r for r in ROLES}
    assert needs(by["sgl-kernel"], ROLES) == ("torch", "sglang-checkout")
    assert needs(by["verify"], ROLES) == ("torch", "flashinfer", "locked-packages", "sglang-checkout", "sgl-kernel")
    assert needs(by["torch"], ROLES) == ()


def test_only_and_skip_select_roles_by_registry_name():
    assert select(ROLES) is None
    only = select(ROLES, only="flashinfer")
    assert names(only) == {"flashinfer"} and only.left_out["torch"] == "not in --only"
    skip = select(ROLES, skip="sgl-kernel, verify")
    assert names(skip) == {"torch", "flashinfer", "locked-packages", "sglang-checkout"}
    assert skip.left_out == {"sgl-kernel": "--skip", "verify": "--skip"}
    both = select(ROLES, only="torch,sgl-kernel", skip="torch")
    assert names(both) == {"sgl-kernel"}


def test_unknown_role_names_the_known_ones():
    with pytest.raises(ConfigError) as err:
        select(ROLES, only="flashinfr")
    assert str(err.value) == ("--only: unknown role 'flashinfr'; known roles: torch, flashinfer, locked-packages, "
                              "sglang-checkout, sgl-kernel, verify (got 'flashinfr')")
    with pytest.raises(ConfigError, match="^--skip: name at least one role"):
        select(ROLES, skip=" , ")
    with pytest.raises(ConfigError, match="leave no role to run"):
        select(ROLES, skip=",".join(r.name for r in ROLES))
    with pytest.raises(ConfigError, match="^--force: only means something with --only or --skip"):
        role_selection(None, None, True)


def test_skipping_a_dependency_is_named_for_each_role_that_needs_it():
    assert select(ROLES, skip="torch").broken(ROLES) == {"sgl-kernel": ("torch",), "verify": ("torch",)}
    assert select(ROLES, only="flashinfer").broken(ROLES) == {}
    assert select(ROLES, only="sgl-kernel").broken(ROLES) == {"sgl-kernel": ("torch", "sglang-checkout")}


def fake_role(name, items, needs_=()):
    return SimpleNamespace(name=name, plan=lambda ctx: list(items), declares=Declares(needs=needs_))


def step(role, title, **kw) -> Step:
    return Step(role=role, title=title, reason=f"because {title}", commands=(Cmd.of("do", title),),
                changes=("checkout",), **kw)


def run_host(roles, sel, dry_run=False):
    lines = []
    session = FakeSession({"snapshot": (0, "/var/lib/gpufleet/snapshots/20261202T100000Z\n"), "read lock": (1, "")})
    ex = Executor(roles=roles, run=RUN, repo=Path("."), dry_run=dry_run, say=lines.append, selection=sel,
                  read_facts=lambda s: HostFacts(host="gpu1"))
    return ex.host(session, Stack()), session, lines


def test_a_skipped_dependency_on_target_lets_the_dependant_run_and_shows_as_skipped():
    roles = [fake_role("base", [Unchanged("base", "base 1.0 installed")]),
             fake_role("top", [step("top", "build top")], ("base",))]
    report, session, _ = run_host(roles, select(roles, only="top"))
    assert report.ok, report.error
    assert [(e.item.role, e.status) for e in report.entries] == [("base", "skipped"), ("top", "changed")]
    assert report.entries[0].item.reason == "skipped (not in --only); on target"
    assert "do" in " ".join(c.render() for _, c in session.calls)


def test_a_skipped_dependency_not_on_target_refuses_the_dependant_before_any_change():
    roles = [fake_role("base", [step("base", "install base 2.0")]),
             fake_role("mid", [step("mid", "install mid")]),
             fake_role("top", [step("top", "build top")], ("base",))]
    report, session, _ = run_host(roles, select(roles, skip="base"))
    assert report.outcome == "failed"
    assert report.error == ("top needs base, which --only/--skip leaves out and which is not on target on gpu1 "
                            "(base: because install base 2.0); run it too, or pass --force")
    assert "snapshot" not in session.steps and not any(c.argv[:1] == ("do",) for _, c in session.calls)
    # the dry run shows the same: skipped, the plan of what runs, the refused role
    plan, _, _ = run_host(roles, select(roles, skip="base"), dry_run=True)
    assert [(e.item.role, e.status) for e in plan.entries] == [("base", "skipped"), ("mid", "planned"),
                                                                ("top", "refused")]
    assert plan.entries[0].item.reason == "skipped (--skip); not on target: because install base 2.0"
    assert plan.outcome == "failed" and "pass --force" in plan.next_step


def test_force_runs_the_dependant_against_the_host_as_it_is():
    roles = [fake_role("base", [step("base", "install base 2.0")]),
             fake_role("top", [step("top", "build top")], ("base",))]
    report, _, lines = run_host(roles, select(roles, skip="base", force=True))
    assert report.ok and [e.status for e in report.entries] == ["skipped", "changed"]
    assert any("top: runs although base is left out and not on target (--force)" in line for line in lines)


# exit codes

@pytest.mark.parametrize("kinds, code", [
    ([], 0), (["ok", "ok"], 0), (["ok", "drift"], 1), (["failed"], 1), (["unreachable"], 3),
    (["ok", "unreachable", "unreachable"], 3), (["unreachable", "failed"], 1), (["hostkey"], 1), (["locked"], 1)])
def test_exit_code_from_host_outcomes(kinds, code):
    assert common.exit_code(kinds) == code


def summary(status, **outcomes):
    s = RollSummary("upgrade", "20261202T100000Z", "inv upgrade", list(outcomes), [list(outcomes)], 0, status=status)
    s.results = {h: HostResult(h, outcome=o) for h, o in outcomes.items()}
    return s


def test_roll_exit_codes():
    assert roll_exit_code(summary("completed", gpu1="ok", gpu2="unchanged")) == 0
    assert roll_exit_code(summary("stopped", gpu1="ok", gpu2="unreachable", gpu3="not-reached")) == 3
    assert roll_exit_code(summary("stopped", gpu1="rolled-back", gpu2="not-reached")) == 1
    assert roll_exit_code(summary("stopped", gpu1="ok", gpu2="not-reached")) == 1


def wrapped(exc):
    @common.user_errors
    def task():
        raise exc
    with pytest.raises(Exit) as caught:
        task()
    return caught.value.code, caught.value.message


def test_user_errors_map_to_exit_codes_with_one_line():
    assert wrapped(ConfigError("inv.toml", "bad")) == (2, "error: inv.toml: bad")
    assert wrapped(UnreachableError("host gpu1 (10.0.0.1): cannot connect")) == (
        3, "error: host gpu1 (10.0.0.1): cannot connect")
    assert wrapped(GpufleetError("host gpu1: the lock changed hands"))[0] == 1
    assert wrapped(KeyboardInterrupt()) == (130, "interrupted")


# markup

def rendered(thing) -> str:
    console = Console(width=200, record=True, force_terminal=False)
    with console.capture() as cap:
        console.print(thing)
    return cap.get()


def test_markup_in_hosts_and_errors_is_printed_as_written(monkeypatch):
    console = Console(width=300, force_terminal=False)
    monkeypatch.setattr("gpufleet.cli.render.console", console)
    report = HostReport("[gpu1]", False, outcome="failed", error="cannot read /srv/[bold]x[/bold]/venv: [red]no[/]",
                        next_step="fix [this]")
    with console.capture() as cap:
        print_reports([report])
    out = cap.get()
    assert "[gpu1]: failed: cannot read /srv/[bold]x[/bold]/venv: [red]no[/]" in out
    assert "next ([gpu1]): fix [this]" in out and "failed: [gpu1]" in out
    s = summary("stopped", **{"[gpu1]": "failed"})
    s.results["[gpu1]"].steps, s.results["[gpu1]"].error = ["upgrade: [b]x[/b]"], "boom [red]"
    table = rendered(outcome_table(s))
    assert "[gpu1]" in table and "upgrade: [b]x[/b]" in table and "boom [red]" in table


def test_status_table_escapes_markup():
    from gpufleet.cli.render import status_table
    from gpufleet.fleet.status import unreachable

    out = rendered(status_table([unreachable("[gpu9]", "cannot connect to [::1]:22 [red]", "unreachable")]))
    assert "[gpu9]" in out and "cannot connect to [::1]:22 [red]" in out


# the lock's holder

def holder(pid, started="2026-12-02T10:00:00Z", node=None, token="abc"):
    node = node or socket.gethostname()
    return Claim(f"holder=alice@{node}\npid={pid}\nstarted={started}\ncommand=inv upgrade\ntoken={token}\n")


def test_liveness_of_a_holder():
    now = hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")
    assert liveness(holder(os.getpid(), now))[0] == "live"
    dead = subprocess.Popen(["true"])
    dead.wait()
    state, why = liveness(holder(dead.pid))
    assert state == "stale" and f"pid {dead.pid} no longer runs on" in why
    # a pid that runs but started after the lock was taken is another process (the pid was reused)
    state, why = liveness(holder(os.getpid(), "2001-01-01T00:00:00Z"))
    assert state == "stale" and "another process now" in why
    state, why = liveness(holder(os.getpid(), node="elsewhere"))
    assert state == "unknown" and "another control node (elsewhere)" in why
    assert liveness(Claim(""))[0] == "stale"


def sh(name, *args):
    return subprocess.run(["bash", "-c", remote.text(name), name, *map(str, args)], capture_output=True, text=True)


def test_unlock_script_removes_only_the_claim_that_was_shown(tmp_path):
    lock = tmp_path / "lock"
    assert sh("host_claim.sh", "holder=a\ntoken=one\n", lock, 3).returncode == 0
    assert sh("host_unlock.sh", lock, "two").returncode == 1 and lock.is_dir()
    assert sh("host_unlock.sh", lock, "").returncode == 1 and lock.is_dir()
    assert sh("host_unlock.sh", lock, "one").returncode == 0 and not lock.exists()
    lock.mkdir()  # a run died between mkdir and writing its holder file
    assert sh("host_unlock.sh", lock, "").returncode == 0 and not lock.exists()
    assert sh("host_unlock.sh", lock, "").returncode == 0  # free already


def test_unlock_refuses_a_live_holder_unless_forced():
    from gpufleet.cli.unlock import unlock_one

    now = hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")
    live = holder(os.getpid(), now).text
    session = FakeSession({"read lock": (0, live)})
    row = unlock_one(session, force=False)
    assert not row["ok"] and not row["removed"] and "refusing to remove the lock" in row["message"]
    assert "break lock" not in session.steps
    row = unlock_one(FakeSession({"read lock": (0, live)}), force=True)
    assert row["removed"] and row["message"].startswith("lock removed (forced: ")
    assert unlock_one(FakeSession({"read lock": (1, "")}), force=False)["message"] == "not locked"
    with pytest.raises(GpufleetError, match="changed hands"):
        unlock_one(FakeSession({"read lock": (0, holder(1 << 30).text), "break lock": (1, "")}), force=False)


# snapshots

def make_snapshots(base: Path, stamps: list[str]) -> None:
    for stamp in stamps:
        d = base / stamp
        d.mkdir(parents=True)
        (d / "manifest.json").write_text(json.dumps({"created": stamp, "by": "alice@laptop",
                                                      "command": "inv upgrade [x]"}) + "\n")
        (d / "pip-freeze.txt").write_text("torch==2.9.1\n" * 100)


def test_retention_keeps_the_newest_and_never_the_one_just_taken(tmp_path):
    base = tmp_path / "snapshots"
    stamps = [f"20261202T10000{i}Z" for i in range(7)]
    make_snapshots(base, stamps)
    (base / "not-a-snapshot").mkdir()
    removed = sh("snapshot_prune.sh", base, 3, base / stamps[-1]).stdout.split()
    assert removed == [str(base / s) for s in stamps[:4]]
    assert sorted(p.name for p in base.iterdir()) == [*stamps[4:], "not-a-snapshot"]
    # the one this run took is kept even when it does not sort among the newest
    make_snapshots(base, ["20200101T000000Z"])
    sh("snapshot_prune.sh", base, 1, base / "20200101T000000Z")
    assert sorted(p.name for p in base.iterdir()) == ["20200101T000000Z", stamps[-1], "not-a-snapshot"]
    assert sh("snapshot_prune.sh", tmp_path / "absent", 2, "").returncode == 0


def test_snapshot_list_reads_sizes_dates_and_commands(tmp_path):
    base = tmp_path / "snapshots"
    make_snapshots(base, ["20261202T100000Z", "20261202T110000Z"])
    found, total = parse_snapshot_list(sh("snapshot_list.sh", base).stdout)
    assert [s.path for s in found] == [str(base / "20261202T100000Z"), str(base / "20261202T110000Z")]
    assert all(s.kib > 0 for s in found) and total >= found[0].kib
    assert found[1].to_json()["command"] == "inv upgrade [x]" and found[1].created == "20261202T110000Z"
    assert parse_snapshot_list(sh("snapshot_list.sh", tmp_path / "absent").stdout) == ([], 0)


def test_a_successful_run_prunes_and_a_failed_one_does_not():
    roles = [fake_role("r", [step("r", "change")])]
    session = FakeSession({"snapshot": (0, "/var/lib/gpufleet/snapshots/20261202T100000Z\n"), "read lock": (1, ""),
                           "prune snapshots": (0, "/var/lib/gpufleet/snapshots/20261101T000000Z\n")})
    lines = []
    ex = Executor(roles=roles, run=RUN, repo=Path("."), say=lines.append, snapshots_keep=2,
                  read_facts=lambda s: HostFacts(host="gpu1"))
    assert ex.host(session, Stack()).ok
    [(_, prune)] = [(s, c) for s, c in session.calls if s == "prune snapshots"]
    assert prune.argv[-3:] == ("/var/lib/gpufleet/snapshots", "2", "/var/lib/gpufleet/snapshots/20261202T100000Z")
    assert any("removed 1 old snapshot(s), keeping the newest 2" in line for line in lines)
    failing = FakeSession({"snapshot": (0, "/var/lib/gpufleet/snapshots/20261202T100000Z\n"), "read lock": (1, ""),
                           "change": (1, "no")})
    assert not ex.host(failing, Stack()).ok and "prune snapshots" not in failing.steps


def test_remote_command_errors_stay_failures():
    result = SimpleNamespace(host="gpu1", step="x", exit_code=1, command="c", tail=lambda: "")
    assert wrapped(RemoteCommandError(result))[0] == 1


def test_a_lock_from_an_earlier_boot_of_the_host_is_stale_whoever_took_it():
    now = hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ")
    text = holder(os.getpid(), now, node="elsewhere").text + "boot_id=11111111-aaaa\n"
    state, why = liveness(Claim(text, boot_now="22222222-bbbb"))
    assert state == "stale" and "rebooted since the lock was taken" in why and "11111111" in why
    # same boot: the other rules decide (another control node: unknown; this one's live pid: live)
    assert liveness(Claim(text, boot_now="11111111-aaaa"))[0] == "unknown"
    mine = holder(os.getpid(), now).text + "boot_id=11111111-aaaa\n"
    assert liveness(Claim(mine, boot_now="11111111-aaaa"))[0] == "live"
    assert liveness(Claim(mine, boot_now="22222222-bbbb"))[0] == "stale"
    # a holder file from before boot ids were recorded, or a host that could not say: no boot rule
    assert liveness(Claim(holder(os.getpid(), now).text, boot_now="22222222-bbbb"))[0] == "live"
    assert liveness(Claim(mine, boot_now=""))[0] == "live"


def test_claim_parse_splits_the_holder_from_the_boot_id_now():
    claim = Claim.parse("holder=a@b\npid=3\nboot_id=x1\n\n@@boot_now=x2\n")
    assert claim.text == "holder=a@b\npid=3\nboot_id=x1\n" and claim.boot_now == "x2"
    assert claim.described == "a@b (pid 3)"
    empty = Claim.parse("\n@@boot_now=x2\n")  # no holder file: a run died while taking it
    assert empty.text == "" and "holder" not in empty.values


def test_a_run_takes_over_a_lock_left_by_an_earlier_boot(tmp_path):
    from gpufleet.fleet.hoststate import RunInfo, claim_host

    old = holder(os.getpid(), hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), token="old").text
    held = (3, old + "boot_id=before-reboot\n\n@@boot_now=after-reboot\n")
    answers = iter([held, (0, "")])
    session = FakeSession({"lock": lambda step, cmd: next(answers), "break lock": (0, "")})
    note = claim_host(session, RunInfo("bob", "ctl", 7, "2026-12-02T10:00:00Z", "inv upgrade", token="new"))
    assert note.startswith("took over a stale lock: alice@") and "rebooted since the lock was taken" in note
    broken = [cmd for step, cmd in session.calls if step == "break lock"]
    assert broken and broken[0].argv[-1] == "old"
