"""The executor against a scripted fake session: order, re-checks, snapshot, lock, audit, failures, dry runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from types import SimpleNamespace

from gpufleet.fleet.executor import Executor
from gpufleet.engine.command import Cmd
from gpufleet.facts.model import HostFacts
from gpufleet.wheels.fetch import WheelCache
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.plan import PlanError, Step, Unchanged, Upload
from gpufleet.config.stack import Stack
from gpufleet.testing.session import FakeSession

RUN = RunInfo("alice", "laptop", 42, "2026-12-02T10:00:00Z", "inv upgrade --host gpu1", token="t0k")


def scripted(answers=None) -> FakeSession:
    """Answers by step name: `answers[step] = (exit code, output)`; anything else exits 0 silently."""
    return FakeSession({"snapshot": (0, "/var/lib/gpufleet/snapshots/20261202T100000Z\n"), "read lock": (1, ""),
                        **(answers or {})})


def audit_records(session) -> list[dict]:
    return [json.loads(cmd.argv[-1]) for s, cmd in session.calls if s == "audit log"]


def role(name, *items_per_call):
    """A fake role: each plan() call returns the next list of items; records the facts it saw."""
    calls = iter(items_per_call)
    seen = []

    def plan(ctx):
        seen.append(ctx.facts.host)
        return next(calls)
    return SimpleNamespace(name=name, plan=plan, seen=seen)


def step(title, **kw) -> Step:
    defaults = dict(role="r", title=title, reason=f"because {title}", commands=(Cmd.of("do", title),),
                    changes=("checkout",))  # a venv change is staged first: test_staged_venv.py
    return Step(**{**defaults, **kw})


def upgrade(roles, dry_run=False, **kw) -> tuple[Executor, list[str], list[int]]:
    lines: list[str] = []
    reads = [0]

    def read_facts(session):
        reads[0] += 1
        return HostFacts(host=f"facts#{reads[0]}")
    return Executor(roles=roles, run=RUN, repo=Path("."), dry_run=dry_run, say=lines.append, read_facts=read_facts,
                   **kw), lines, reads


def test_dry_run_plans_every_role_against_todays_facts_and_touches_nothing():
    a = role("a", [step("one"), Unchanged("a", "fine")])
    b = role("b", [step("two")])
    up, _, _ = upgrade([a, b], dry_run=True)
    session = scripted({"facts": (0, "facts#1")})

    def read_facts(on):  # as gather_facts does: one command on the host, its answer parsed
        return HostFacts(host=on.run(Cmd.of("facts"), step="facts", check=False).output.strip())
    up.read_facts = read_facts
    report = up.host(session, Stack())
    assert [e.status for e in report.entries] == ["planned", "unchanged", "planned"]
    assert a.seen == b.seen == ["facts#1"]
    # the lock and the facts read side by side, once; no needed check, snapshot, command or audit
    assert session.steps == ["read lock", "facts"] and len(session.results) == 1
    assert report.ok and report.lock_holder is None


def test_dry_run_reports_who_holds_the_lock():
    session = scripted({"read lock": (0, "holder=bob@ws\npid=7\n")})
    up, _, _ = upgrade([role("a", [])], dry_run=True)
    assert up.host(session, Stack()).lock_holder == "bob@ws (pid 7)"


def test_apply_order_lock_check_snapshot_run_verify_reread_audit_unlock():
    s1 = step("one", needed=Cmd.of("need", "one"), verify=(Cmd.of("check", "one"),))
    a = role("a", [s1])
    b = role("b", [Unchanged("b", "fine")])
    up, lines, reads = upgrade([a, b])
    session = scripted()
    report = up.host(session, Stack())
    assert session.steps == ["lock", "one: still needed?", "snapshot", "one", "one: verify", "audit log", "unlock"]
    assert a.seen == ["facts#1"] and b.seen == ["facts#2"]  # b plans against the host as a left it
    assert [e.status for e in report.entries] == ["changed", "unchanged"]
    assert report.snapshot == "/var/lib/gpufleet/snapshots/20261202T100000Z"
    assert "[gpu1] r: one" in lines
    [record] = audit_records(session)
    assert record["who"] == "alice@laptop" and record["outcome"] == "ok" and record["changed"] == ["r: one"]
    assert record["unchanged"] == ["b: fine"] and record["snapshot"] == report.snapshot


def test_needed_saying_done_skips_the_step_without_snapshot_or_reread():
    a = role("a", [step("one", needed=Cmd.of("need"))])
    b = role("b", [])
    up, _, reads = upgrade([a, b])
    session = scripted({"one: still needed?": (1, "")})
    report = up.host(session, Stack())
    assert report.entries[0].status == "done-already" and report.snapshot is None
    assert "one" not in session.steps and "snapshot" not in session.steps
    assert reads == [1]


def test_snapshot_is_taken_once_before_the_first_change():
    up, _, _ = upgrade([role("a", [step("one"), step("two")])])
    session = scripted()
    up.host(session, Stack())
    assert session.steps.count("snapshot") == 1
    assert session.steps.index("snapshot") < session.steps.index("one")


def test_check_only_step_needs_no_snapshot_and_changes_nothing():
    check = Step(role="verify", title="verify it", reason="r", commands=(), verify=(Cmd.of("check"),))
    up, _, reads = upgrade([role("verify", [check])])
    session = scripted()
    report = up.host(session, Stack())
    assert report.entries[0].status == "verified" and "snapshot" not in session.steps
    assert session.steps == ["lock", "verify it", "audit log", "unlock"]


def test_failed_step_stops_the_host_releases_the_lock_and_says_what_next():
    a = role("a", [step("one"), step("two")])
    b = role("b", [step("three")])
    up, _, _ = upgrade([a, b])
    session = scripted({"one": (1, "ERROR: No matching distribution found for torch==9")})
    report = up.host(session, Stack())
    assert report.outcome == "failed" and not report.ok
    assert "host gpu1: step 'one' failed: `do one` returned exit code 1" in report.error
    assert "No matching distribution" in report.error
    assert "run `inv upgrade --host gpu1` again" in report.next_step and "continues at 'one'" in report.next_step
    assert report.snapshot in report.next_step
    assert [e.status for e in report.entries] == ["failed"]
    assert b.seen == [] and "two" not in session.steps
    assert session.steps[-2:] == ["audit log", "unlock"]
    [record] = audit_records(session)
    assert record["outcome"] == "failed" and record["failed"] == {"step": "r: one"}


def test_a_needed_check_that_breaks_is_a_failure():
    up, _, _ = upgrade([role("a", [step("one", needed=Cmd.of("need"))])])
    report = up.host(scripted({"one: still needed?": (127, "python: not found")}), Stack())
    assert report.outcome == "failed" and "exit code 127" in report.error


def test_failure_shows_inline_scripts_abbreviated():
    long = step("one", commands=(Cmd.of("python", "-c", "import x\nx.y()\n", '{"a": 1}'),))
    up, _, _ = upgrade([role("a", [long])])
    report = up.host(scripted({"one": (1, "boom")}), Stack())
    assert "`python -c <script, 2 lines> '{\"a\": 1}'` returned exit code 1" in report.error


def test_locked_host_is_refused_naming_the_holder():
    a = role("a", [step("one")])
    up, _, reads = upgrade([a])
    holder = "holder=bob@ws\npid=7\nstarted=2026-12-02T09:00:00Z\ncommand=inv upgrade --hosts all\ntoken=x\n"
    session = scripted({"lock": (3, holder)})
    report = up.host(session, Stack())
    assert report.outcome == "locked"
    assert ("host gpu1 is locked by bob@ws (pid 7, since 2026-12-02T09:00:00Z, running `inv upgrade --hosts all`)"
            in report.error)
    assert "`inv unlock --host gpu1`" in report.next_step  # how to clear a lock whose run is gone
    assert reads == [0] and a.seen == [] and "unlock" not in session.steps
    assert audit_records(session)[0]["outcome"] == "locked"


def test_plan_error_fails_the_host_and_releases_the_lock():
    def plan(ctx):
        raise PlanError("gpu1", "a", "no package list")
    up, _, _ = upgrade([SimpleNamespace(name="a", plan=plan)])
    session = scripted()
    report = up.host(session, Stack())
    assert report.outcome == "failed" and "role a cannot plan: no package list" in report.error
    assert session.steps[-1] == "unlock"


def test_upload_skips_a_wheel_already_on_the_host_and_pushes_a_missing_one(tmp_path, mocker):
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    sha = hashlib.sha256(b"wheel").hexdigest()
    up_item = Upload(wheel.as_uri(), sha, "/var/cache/gpufleet/wheels/w-1.0-py3-none-any.whl", "w", "1.0")
    s = step("one", uploads=(up_item,))
    pushed = mocker.patch("gpufleet.wheels.push.push_files")
    upgrade_run, _, _ = upgrade([role("a", [s])], wheels=WheelCache(tmp_path / "cache"))
    session = scripted({"one: which wheels are on the host?": (0, "@@push 0 present\n")})
    report = upgrade_run.host(session, Stack())
    assert report.ok, report.error
    assert pushed.call_count == 0
    assert report.wheels == [{"name": "w", "version": "1.0", "filename": wheel.name, "url": wheel.as_uri(),
                              "sha256": sha}]

    upgrade_run, _, _ = upgrade([role("a", [s])], wheels=WheelCache(tmp_path / "cache"))
    session = scripted({"one: which wheels are on the host?": (0, "@@push 0 absent\n")})
    report = upgrade_run.host(session, Stack())
    assert report.ok, report.error
    [call] = pushed.call_args_list
    [item] = call.args[1]
    assert (item.local, item.remote, item.sha256) == (wheel, up_item.remote, sha)


def test_a_wheel_without_a_published_hash_is_hashed_by_the_control_node(tmp_path, mocker):
    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    up_item = Upload(wheel.as_uri(), None, "/var/cache/gpufleet/wheels/w-1.0-py3-none-any.whl", "w", "1.0")
    pushed = mocker.patch("gpufleet.wheels.push.push_files")
    upgrade_run, _, _ = upgrade([role("a", [step("one", uploads=(up_item,))])],
                                wheels=WheelCache(tmp_path / "cache"))
    session = scripted({"one: which wheels are on the host?": (0, "@@push 0 absent\n")})
    report = upgrade_run.host(session, Stack())
    assert report.ok, report.error
    [item] = pushed.call_args_list[0].args[1]
    assert item.sha256 == hashlib.sha256(b"wheel").hexdigest() == report.wheels[0]["sha256"]


def test_report_json_shape():
    up, _, _ = upgrade([role("a", [step("one"), Unchanged("a", "fine")])])
    data = up.host(scripted(), Stack()).to_json()
    assert data["host"] == "gpu1" and data["outcome"] == "ok" and data["changed"] == ["r: one"]
    assert data["entries"][0]["kind"] == "step" and data["entries"][0]["status"] == "changed"
    assert data["entries"][0]["commands"] == ["do one"]
    assert data["entries"][1] == {"kind": "unchanged", "role": "a", "reason": "fine", "status": "unchanged",
                                  "seconds": 0.0}


def reader(name, word, items=None):
    """A fake role that reads `cat WORD` on the host, then plans `items` (Unchanged by default); records answers."""
    seen = []

    def plan(ctx):
        seen.append(ctx.read(Cmd.of("cat", word), f"read {word}").output.strip())
        return items if items is not None else [Unchanged(name, "fine")]
    return SimpleNamespace(name=name, plan=plan, seen=seen)


def test_a_run_asks_what_the_hosts_last_plan_read_side_by_side_up_front(tmp_path):
    from gpufleet.engine import readahead

    memory = readahead.Memory(tmp_path / "reads")
    answers = {"read x": (0, "ex"), "read y": (0, "why")}
    a, b = reader("a", "x"), reader("b", "y")
    up, _, _ = upgrade([a, b], read_memory=memory)
    first = scripted(answers)
    assert up.host(first, Stack()).ok
    assert first.steps == ["lock", "read x", "read y", "audit log", "unlock"] and len(first.results) == 5
    again = scripted(answers)
    assert up.host(again, Stack()).ok
    # the two reads in one exec, asked before any role planned; the roles read its answers
    assert again.steps == ["lock", "read x", "read y", "audit log", "unlock"] and len(again.results) == 4
    assert a.seen == ["ex", "ex"] and b.seen == ["why", "why"]


def test_once_a_role_has_something_to_do_the_reads_after_it_go_to_the_host(tmp_path):
    from gpufleet.engine import readahead

    memory = readahead.Memory(tmp_path / "reads")
    answers = {"read x": (0, "ex"), "read y": (0, "why")}
    up, _, _ = upgrade([reader("a", "x"), reader("b", "y")], read_memory=memory)
    assert up.host(scripted(answers), Stack()).ok  # a no-op run: both reads remembered
    b = reader("b", "y")
    up, _, _ = upgrade([reader("a", "x", [step("one")]), b], read_memory=memory)
    session = scripted(answers)
    assert up.host(session, Stack()).ok
    steps = session.steps
    # lock, the remembered reads in one exec, snapshot, one, read y, audit log, unlock
    assert steps[:3] == ["lock", "read x", "read y"] and len(session.results) == 7
    # b planned after a's step: its read was made again, on the host as a left it
    assert steps[steps.index("one") + 1:] == ["read y", "audit log", "unlock"] and b.seen == ["why"]
