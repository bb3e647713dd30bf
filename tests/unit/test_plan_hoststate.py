"""Host state helpers: who holds the lock, in words; what the holder file says."""

from __future__ import annotations

import pytest

from gpufleet.fleet.hoststate import HostClaimedError, RunInfo, claim_host, describe_holder
from gpufleet.testing.session import FakeSession


def test_holder_text_round_trips_into_a_description():
    run = RunInfo("alice", "laptop", 42, "2026-12-02T10:00:00Z", "inv upgrade --host gpu1", token="abc")
    assert run.who == "alice@laptop"
    assert run.holder_text().splitlines()[-1] == "token=abc"
    assert describe_holder(run.holder_text()) == ("alice@laptop (pid 42, since 2026-12-02T10:00:00Z, running "
                                                  "`inv upgrade --host gpu1`)")


@pytest.mark.parametrize("text, described", [
    ("holder=bob@ws\n", "bob@ws"),
    ("someone by hand\n", "someone by hand"),
    ("", "an unknown holder (the lock has no holder file)"),
])
def test_describe_holder_copes_with_hand_made_files(text, described):
    assert describe_holder(text) == described


def test_current_run_has_a_fresh_token():
    assert RunInfo.current("inv x").token != RunInfo.current("inv x").token


def test_lock_held_names_the_holder():
    with pytest.raises(HostClaimedError, match=r"host gpu1 is locked by bob@ws \(pid 7\)"):
        claim_host(FakeSession(default=(3, "holder=bob@ws\npid=7\n")), RunInfo.current("inv upgrade"))


def _dead_pid() -> int:
    import subprocess

    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def test_a_lock_whose_holder_died_on_this_control_node_is_taken_over_by_token():
    import socket

    pid = _dead_pid()
    holder = f"holder=alice@{socket.gethostname()}\npid={pid}\nstarted=2026-12-02T10:00:00Z\ntoken=t1\n"
    session = FakeSession({"lock": [(3, holder), (0, "")], "break lock": (0, "")})
    note = claim_host(session, RunInfo.current("inv upgrade"))
    assert note.startswith(f"took over a stale lock: alice@{socket.gethostname()} (pid {pid}")
    assert f"pid {pid} no longer runs on" in note
    assert session.steps == ["lock", "break lock", "lock"]
    assert session.calls[1][1].argv[-1] == "t1"  # only the lock that was read is removed


@pytest.mark.parametrize("holder, why", [
    ("holder=bob@ops-laptop\npid=7\ntoken=t2\n", r"another control node \(ops-laptop\)"),
    ("", "no holder file"),
])
def test_a_lock_that_may_still_be_held_is_never_taken_over(holder, why):
    session = FakeSession({"lock": (3, holder)})
    with pytest.raises(HostClaimedError, match=why):
        claim_host(session, RunInfo.current("inv upgrade"))
    assert session.steps == ["lock"]


def test_a_lock_that_changed_hands_meanwhile_is_left_and_named():
    import socket

    holder = f"holder=alice@{socket.gethostname()}\npid={_dead_pid()}\ntoken=t1\n"
    session = FakeSession({"lock": (3, holder), "break lock": (1, ""),
                           "read lock": (0, "holder=carol@ws\npid=9\ntoken=t3\n")})
    with pytest.raises(HostClaimedError, match=r"locked by carol@ws \(pid 9\)"):
        claim_host(session, RunInfo.current("inv upgrade"))
