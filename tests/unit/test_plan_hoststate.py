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
