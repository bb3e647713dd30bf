"""End to end: facts cost one exec channel per host over real SSH, and the venv's packages read without pip are
exactly what the host's own `pip list` says (issue 13)."""

from __future__ import annotations

import json

import paramiko
import pytest

from gpufleet.config.inventory import load_inventory
from gpufleet.engine.runner import for_each_host
from gpufleet.facts.gather import gather_facts
from gpufleet.facts.packages import parse_pip_editables, parse_pip_list_json

pytestmark = pytest.mark.sim


def test_one_exec_channel_per_host_and_pips_answer(sim_fleet, monkeypatch):
    opened: list[str] = []
    real = paramiko.Transport.open_session

    def counting(self, *args, **kwargs):
        opened.append(self.getpeername()[0])
        return real(self, *args, **kwargs)

    monkeypatch.setattr(paramiko.Transport, "open_session", counting)
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
