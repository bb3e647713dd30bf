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


def test_the_units_sha256_is_remembered_and_status_then_renders_nothing(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path))
    written = model_server.render_unit(HOST, Stack(), "3.12")
    assert model_server.unit_sha256(HOST, Stack(), "3.12") == model_server.sha256(written)
    assert len(list((tmp_path / "units").iterdir())) == 1

    def no_render():
        raise AssertionError("rendered although remembered")

    monkeypatch.setattr(model_server, "unit_template", no_render)
    cell = compare(HOST, Stack(), facts(written)).cells["service"]
    assert (cell.current, cell.drift) == ("active/enabled", False)
    with __import__("pytest").raises(AssertionError, match="rendered"):  # other values: rendered, not guessed
        model_server.unit_sha256(HOST, Stack.model_validate({"server": {"tp": 4}}), "3.12")


def test_an_edited_template_is_rendered_afresh(monkeypatch, tmp_path):
    import shutil

    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))
    before = model_server.unit_sha256(HOST, Stack(), "3.12")
    templates = tmp_path / "templates"
    shutil.copytree(model_server.TEMPLATES, templates)
    unit = templates / model_server.UNIT_TEMPLATE
    unit.write_text(unit.read_text().replace("TimeoutStopSec=120", "TimeoutStopSec=300"))
    monkeypatch.setattr(model_server, "TEMPLATES", templates)
    model_server._templates.cache_clear()
    try:
        after = model_server.unit_sha256(HOST, Stack(), "3.12")
        assert after != before and after == model_server.sha256(model_server.render_unit(HOST, Stack(), "3.12"))
        assert "TimeoutStopSec=300" in model_server.render_unit(HOST, Stack(), "3.12")
    finally:
        model_server._templates.cache_clear()


def test_a_remembered_answer_that_is_not_a_sha256_is_rendered_again(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path))
    right = model_server.unit_sha256(HOST, Stack(), "3.12")
    memo = next((tmp_path / "units").iterdir())
    memo.write_text("0" * 63)
    assert model_server.unit_sha256(HOST, Stack(), "3.12") == right and memo.read_text() == right


def test_status_on_a_remembered_unit_imports_no_jinja2(tmp_path):
    import subprocess
    import sys

    script = ("import sys\n"
              "from gpufleet.config.inventory import Host\nfrom gpufleet.config.stack import Stack\n"
              "from gpufleet.roles import model_server\n"
              "h = Host(name='gpu1', address='10.0.0.1')\n"
              "print(model_server.unit_sha256(h, Stack(), '3.12'), 'jinja2' in sys.modules)\n")
    env = {**__import__("os").environ, "GPUFLEET_CACHE_DIR": str(tmp_path)}
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
            for _ in range(2)]
    (first, loaded_first), (second, loaded_second) = (r.stdout.split() for r in runs)
    assert first == second and loaded_first == "True" and loaded_second == "False"
