"""End to end: facts cost one exec channel per host over real SSH (with the host's lock, all `inv status` reads), and
the venv's packages read without pip are exactly what the host's own `pip list` says (issue 13)."""

from __future__ import annotations

import json
import socket

import paramiko
import pytest

from gpufleet.cli.common import facts_and_lock
from gpufleet.config.inventory import load_inventory
from gpufleet.engine.command import Cmd
from gpufleet.engine.dial import dial
from gpufleet.engine.runner import for_each_host, session_for
from gpufleet.engine.ssh import IDLE_POLL
from gpufleet.facts.gather import gather_facts
from gpufleet.facts.packages import parse_pip_editables, parse_pip_list_json

pytestmark = pytest.mark.sim


LOCK = "/var/lib/gpufleet/lock"


def count_channels(monkeypatch) -> list[str]:
    """The peer address of every exec channel opened from now on."""
    opened: list[str] = []
    real = paramiko.Transport.open_session

    def counting(self, *args, **kwargs):
        opened.append(self.getpeername()[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(paramiko.Transport, "open_session", counting)
    return opened


def test_one_exec_channel_per_host_and_pips_answer(sim_fleet, monkeypatch):
    opened = count_channels(monkeypatch)
    inventory = load_inventory(sim_fleet.inventory_path)
    hosts = list(inventory.hosts.values())
    outcomes = for_each_host(hosts, inventory, gather_facts)
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert sorted(opened) == sorted(h.address for h in hosts)  # one channel per host, nothing else
    for host, out in zip(hosts, outcomes):
        pip = sim_fleet.run_on(host.name, "cd / && /root/venv/bin/python -m pip list --format=json "
                                          "--disable-pip-version-check").stdout
        assert out.value.packages == parse_pip_list_json(pip, host.name)
        assert out.value.editables == parse_pip_editables(pip, host.name) == {"sglang": "/root/sglang-main/python"}
        assert json.loads(pip)  # pip really answered
        assert not out.value.problems


def test_status_reads_facts_and_the_lock_in_one_exec_channel_per_host(sim_fleet, monkeypatch):
    inventory = load_inventory(sim_fleet.inventory_path)
    hosts = list(inventory.hosts.values())
    held = hosts[-1].name
    sim_fleet.run_on(held, f"mkdir -p {LOCK} && printf 'holder=alice@ops-laptop\\npid=4242\\n"
                           f"started=2026-12-02T10:00:00Z\\ntoken=t4242\\n' > {LOCK}/holder")
    try:
        opened = count_channels(monkeypatch)
        outcomes = for_each_host(hosts, inventory, facts_and_lock)
    finally:
        sim_fleet.run_on(held, f"rm -rf {LOCK}")
    assert all(o.ok for o in outcomes), [o.error for o in outcomes]
    assert sorted(opened) == sorted(h.address for h in hosts)  # one channel per host, nothing else
    for host, out in zip(hosts, outcomes):
        facts, claim = out.value
        assert facts.gpus and facts.packages and not facts.problems, facts.problems
        if host.name == held:
            assert claim.values["holder"] == "alice@ops-laptop" and claim.values["pid"] == "4242"
            assert claim.boot_now  # the host's boot id, read with it
        else:
            assert claim is None


def test_every_session_sends_each_packet_at_once(sim_fleet):
    """TCP_NODELAY on the SSH socket, dialled early or by paramiko itself: with Nagle on, each command after a
    session's first waited for the host's delayed ACK (44 ms against 2 ms a command here)."""
    inventory = load_inventory(sim_fleet.inventory_path)
    host = next(iter(inventory.hosts.values()))
    with dial([host], inventory.settings) as dialed:
        taken, take = [], dialed.take
        dialed.take = lambda *args, **kwargs: taken.append(take(*args, **kwargs)) or taken[-1]
        for early in (dialed, None):
            with session_for(host, inventory, dialed=early) as session:
                for _ in range(2):
                    assert session.run(Cmd.of("true"), step="nothing").exit_code == 0
                sock = session.conn.transport.sock
                assert isinstance(sock, socket.socket)
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert sock.gettimeout() == IDLE_POLL  # paramiko's reader thread wakes once a second when idle
        assert len(taken) == 1 and taken[0] is not None  # the first session spoke on the early socket


def test_sent_is_called_once_the_command_runs_before_its_answer_is_awaited(sim_fleet):
    """HostSession.run's `sent` (what lets `inv status` start its comparison imports while the hosts run their facts):
    the command waits for a file that only sent() creates, over a second connection, so a call made after the
    answer was awaited would leave it waiting out its 10 s and failing."""
    inventory = load_inventory(sim_fleet.inventory_path)
    host = next(iter(inventory.hosts.values()))
    flag = "/tmp/gpufleet-test-sent"
    sim_fleet.run_on(host.name, f"rm -f {flag}")
    calls = []

    def sent():
        calls.append("sent")
        sim_fleet.run_on(host.name, f"touch {flag}")

    wait = f"for i in $(seq 200); do [ -e {flag} ] && echo seen && exit 0; sleep 0.05; done; exit 1"
    try:
        with session_for(host, inventory) as session:
            result = session.run(Cmd.of("bash", "-c", wait), step="wait for sent", check=False, timeout=60,
                                 sent=sent)
    finally:
        sim_fleet.run_on(host.name, f"rm -f {flag}")
    assert (result.exit_code, result.output, calls) == (0, "seen\n", ["sent"])
