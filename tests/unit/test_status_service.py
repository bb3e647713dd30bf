"""The service cell: a running unit that is not what deploy-model would write from stack.toml is drift."""

from __future__ import annotations

from gpufleet.config.inventory import Host
from gpufleet.config.stack import Stack
from gpufleet.facts.model import HostFacts
from gpufleet.facts.unit import UnitFacts
from gpufleet.fleet.status import compare
from gpufleet.roles import model_server

HOST = Host(name="gpu1", address="10.0.0.1")


def facts(unit_text: str | None, python="3.12.3") -> HostFacts:
    unit = UnitFacts(systemd=True, present=True, enabled="enabled", active="active",
                     sha256=model_server.sha256(unit_text) if unit_text is not None else None)
    return HostFacts(host="gpu1", packages={}, unit=unit, python_version=python)


def test_the_unit_deploy_model_writes_is_on_target():
    written = model_server.render_unit(HOST, Stack(), "3.12")
    cell = compare(HOST, Stack(), facts(written)).cells["service"]
    assert (cell.current, cell.drift) == ("active/enabled", False)


def test_other_server_flags_are_drift_though_the_unit_runs():
    other = Stack.model_validate({"server": {"mem_fraction_static": 0.5}})
    written = model_server.render_unit(HOST, other, "3.12")
    cell = compare(HOST, Stack(), facts(written)).cells["service"]
    assert cell.drift and "differs from what deploy-model writes" in cell.note


def test_without_the_venvs_python_the_unit_is_judged_by_its_state_alone():
    cell = compare(HOST, Stack(), facts("anything", python=None)).cells["service"]
    assert (cell.current, cell.drift) == ("active/enabled", False)
