"""The waits after a connect scale with the link's measured round trip; a jump host is named as the jump host."""

from __future__ import annotations

import pytest

from gpufleet.config.inventory import GpuExpectation, Host, Settings
from gpufleet.engine.ssh import (DEAD_LINK_ROUND_TRIPS, HANDSHAKE_ROUND_TRIPS, KEEPALIVES_UNANSWERED,
                                 MAX_ROUND_TRIP, HostSession, LinkTimes)


def test_a_fast_link_keeps_the_inventory_values():
    times = LinkTimes.scaled(Settings(connect_timeout=10, keepalive=15), 0.001)
    assert (times.handshake, times.dead_after) == (10.0, 15 * KEEPALIVES_UNANSWERED)


def test_a_slow_link_stretches_what_a_round_trip_bounds():
    """200 ms round trips, tight settings: the dead-link limit and a reconnect's handshake get room for losses."""
    times = LinkTimes.scaled(Settings(connect_timeout=1, keepalive=1), 0.2)
    assert times.handshake == pytest.approx(HANDSHAKE_ROUND_TRIPS * 0.2) and times.handshake > 1
    assert times.dead_after == pytest.approx(DEAD_LINK_ROUND_TRIPS * 0.2) and times.dead_after > KEEPALIVES_UNANSWERED


def test_keepalive_off_stays_off_and_a_slow_host_does_not_stretch_without_end():
    assert LinkTimes.scaled(Settings(keepalive=0), 0.2).dead_after == 0
    assert LinkTimes.scaled(Settings(keepalive=0.5), 0.2).dead_after == 0  # paramiko's keepalive is whole seconds
    times = LinkTimes.scaled(Settings(connect_timeout=1, keepalive=1), 600.0)
    assert times.handshake == HANDSHAKE_ROUND_TRIPS * MAX_ROUND_TRIP


def test_a_jump_host_is_judged_and_named_as_the_jump_host(tmp_path):
    settings = Settings(ssh_config=None, known_hosts=tmp_path / "known_hosts")
    jump = HostSession(Host(name="gpu2", gpus=GpuExpectation(), address="192.0.2.12"), settings)
    target = HostSession(Host(name="gpu3", gpus=GpuExpectation(), address="192.0.2.13"), settings, gateway=jump)
    conn = target.connection()
    assert conn.client._policy.host == "gpu3" and conn.client._policy.names == ["192.0.2.13"]
    assert conn.gateway.client._policy.host == "gpu3's jump host gpu2"
    assert conn.gateway.client._policy.names == ["192.0.2.12"]


@pytest.mark.parametrize("connect_timeout, whole", [(0.5, 1), (2, 2), (6.6, 7)])
def test_the_connect_timeout_reaches_fabric_rounded_up(tmp_path, connect_timeout, whole):
    """Fabric keeps whole seconds: 0.5 must not become 0 (no limit), 6.6 not 6."""
    settings = Settings(ssh_config=None, known_hosts=tmp_path / "known_hosts", connect_timeout=connect_timeout)
    session = HostSession(Host(name="gpu1", gpus=GpuExpectation(), address="192.0.2.11"), settings)
    assert session.connection().connect_timeout == whole
    session.link = LinkTimes.scaled(settings, 0.33)
    assert session.connection().connect_timeout == max(whole, 7)  # 20 round trips of 0.33 s: 6.6 s, rounded up


class _Transport:
    """Just enough of paramiko's Transport: a keepalive request is answered, or the connection is gone."""

    def __init__(self, refuse: bool = False, active: bool = True):
        self.refuse, self.active = refuse, active

    def open_session(self, timeout=None):
        raise AssertionError("measuring the round trip must not open a channel (facts are one exec channel)")

    def global_request(self, kind, data=None, wait=True):
        import time

        assert kind == "keepalive@openssh.com" and wait
        time.sleep(0.05)  # sshd answers keepalive@openssh.com with a failure reply: one round trip
        return None

    def is_active(self):
        return self.active


def test_the_round_trip_is_one_keepalive_request_and_no_channel():
    from gpufleet.engine.ssh import measure_round_trip

    assert measure_round_trip(_Transport()) >= 0.05
    assert measure_round_trip(_Transport(refuse=True)) >= 0.05  # the refusal comes back after one round trip too
    with pytest.raises(EOFError):
        measure_round_trip(_Transport(refuse=True, active=False))  # the connection broke: that is an error
