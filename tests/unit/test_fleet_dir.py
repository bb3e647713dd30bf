"""The fleet directory (--fleet, $GPUFLEET_DIR, the default), `init`'s starting set, and stack.toml's patch rule."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from gpufleet.cli import common, fleetdir
from gpufleet.cli.init import init, starter_files
from gpufleet.config.inventory import HOST_KEYS, Settings, load_inventory
from gpufleet.config.stack import load_stack
from gpufleet.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean(monkeypatch):
    monkeypatch.setattr(fleetdir, "_explicit", None)
    monkeypatch.setattr(fleetdir, "_default", None)
    monkeypatch.setattr(fleetdir, "_prog", "inv")
    for name in ("GPUFLEET_DIR", "GPUFLEET_INVENTORY", "GPUFLEET_STACK"):
        monkeypatch.delenv(name, raising=False)


def test_the_current_directory_without_flag_env_or_default(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert fleetdir.fleet_dir() == tmp_path.resolve()


def test_flag_beats_env_beats_default(tmp_path, monkeypatch):
    a, b, c = (tmp_path / n for n in "abc")
    for d in (a, b, c):
        d.mkdir()
    fleetdir.use_default(c)
    assert fleetdir.fleet_dir() == c
    monkeypatch.setenv("GPUFLEET_DIR", str(b))
    assert fleetdir.fleet_dir() == b
    fleetdir.set_explicit(a, prog="gpufleet")
    assert fleetdir.fleet_dir() == a and fleetdir.prog() == "gpufleet"


def test_a_missing_fleet_directory_is_named(tmp_path):
    fleetdir.set_explicit(tmp_path / "nope", prog="gpufleet")
    with pytest.raises(ConfigError, match=r"nope: --fleet: not a directory.*gpufleet init DIR"):
        fleetdir.fleet_dir()


def test_the_checkouts_tasks_py_makes_the_repo_the_fleet(tmp_path, monkeypatch):
    import importlib.util

    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("repo_tasks", REPO / "tasks.py")
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert fleetdir.fleet_dir() == REPO


def test_inventory_and_stack_are_read_from_the_fleet_directory(tmp_path):
    init(tmp_path / "fleet")
    fleetdir.set_explicit(tmp_path / "fleet")
    assert common.stack_path(None) == tmp_path / "fleet" / "stack.toml"
    with pytest.raises(ConfigError, match=r"fleet/hosts/sim.toml: no inventory.*hosts/example.toml"):
        common.inventory_path(None)
    stack = load_stack(common.stack_path(None))
    assert stack.sglang.patches == tmp_path / "fleet" / "patches" / "sglang"


def test_no_stack_in_the_fleet_directory_says_how_to_make_one(tmp_path):
    fleetdir.set_explicit(tmp_path, prog="gpufleet")
    with pytest.raises(ConfigError, match=r"no stack.toml in the fleet directory.*gpufleet init"):
        common.stack_path(None)


def test_init_writes_the_starting_set_and_it_loads(tmp_path):
    written = init(tmp_path / "new")
    rel = sorted(p.relative_to(tmp_path / "new").as_posix() for p in written)
    assert {"hosts/example.toml", "stack.toml", "patches/sglang/series", "patches/sgl-kernel/series"} <= set(rel)
    assert filecmp.cmp(tmp_path / "new" / "stack.toml", REPO / "stack.toml", shallow=False)
    for part in ("sglang", "sgl-kernel"):
        for f in (REPO / "patches" / part).iterdir():
            assert filecmp.cmp(tmp_path / "new" / "patches" / part / f.name, f, shallow=False)
    stack = load_stack(tmp_path / "new" / "stack.toml")
    inv = load_inventory(tmp_path / "new" / "hosts" / "example.toml")
    assert list(inv.hosts) == ["gpu1"] and stack.sglang.commit == "5297b02c8"


def test_the_example_inventory_describes_every_field():
    text = (REPO / "gpufleet/cli/starter/hosts/example.toml").read_text()
    for key in [*Settings.model_fields, *HOST_KEYS]:
        if key != "stack":
            assert f"{key} = " in text, f"hosts/example.toml of `init` does not describe {key}"


def test_init_refuses_to_overwrite_and_names_the_files(tmp_path):
    (tmp_path / "patches" / "sglang").mkdir(parents=True)
    (tmp_path / "stack.toml").write_text("# mine\n")
    (tmp_path / "patches" / "sglang" / "series").write_text("# mine\n")
    with pytest.raises(ConfigError) as info:
        init(tmp_path)
    assert str(tmp_path / "stack.toml") in str(info.value)
    assert str(tmp_path / "patches" / "sglang" / "series") in str(info.value)
    assert not (tmp_path / "hosts").exists()  # nothing written
    assert (tmp_path / "stack.toml").read_text() == "# mine\n"


def test_starter_files_are_the_repos_own():
    assert {f.as_posix() for f in starter_files()} >= {"stack.toml", "patches/sglang/series"}


@pytest.mark.parametrize("remove", ["patches/sgl-kernel", "patches/sglang/series"])
def test_a_missing_patch_directory_or_series_file_is_an_error(tmp_path, remove):
    init(tmp_path)
    import shutil

    target = tmp_path / remove
    shutil.rmtree(target) if target.is_dir() else target.unlink()
    with pytest.raises(ConfigError) as info:
        load_stack(tmp_path / "stack.toml")
    assert str(tmp_path / "stack.toml") in str(info.value) and str(target) in str(info.value)


def test_an_empty_series_file_is_no_patches(tmp_path):
    from gpufleet.roles.patches import stack_series

    init(tmp_path)
    (tmp_path / "patches" / "sglang" / "series").write_text("# no site patches\n")
    stack = load_stack(tmp_path / "stack.toml")
    sglang = stack_series(stack, tmp_path)[0]
    assert sglang.name == "sglang" and sglang.patches == ()
