"""Each kind of plan keeps its own memory of the reads it made (issue 13): a one-host upgrade and a roll's survey plan
different roles, and one shared memory had each forget what the other reads."""

from __future__ import annotations

from types import SimpleNamespace

from gpufleet.cli.common import plan_memory
from gpufleet.engine.command import Cmd

HOST = SimpleNamespace(name="gpu1", address="10.0.0.1", port=None, venv="/root/venv")


def test_each_kind_of_plan_recalls_only_what_it_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path))
    plan_memory("upgrade").keep(HOST, [(Cmd.of("cat", "facts"), "facts")])
    plan_memory("survey-upgrade").keep(HOST, [(Cmd.of("cat", "facts"), "facts"), (Cmd.of("cat", "unit"), "unit")])
    plan_memory("upgrade").keep(HOST, [(Cmd.of("cat", "facts"), "facts"), (Cmd.of("cat", "kernel"), "kernel")])

    assert [step for _, step in plan_memory("upgrade").recall(HOST)] == ["facts", "kernel"]
    assert [step for _, step in plan_memory("survey-upgrade").recall(HOST)] == ["facts", "unit"]
    assert plan_memory("survey-deploy-model").recall(HOST) == []
    assert sorted(p.name for p in (tmp_path / "reads").iterdir()) == ["survey-upgrade", "upgrade"]
    assert all(oct(p.stat().st_mode & 0o777) == "0o700" for p in (tmp_path / "reads").iterdir())
