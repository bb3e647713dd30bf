"""The wheel installs a `gpufleet` command that works outside the checkout: --version, init, --list, task help."""

from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv (this Python's packages visible, no network) with gpufleet's wheel installed: its bin/."""
    base = tmp_path_factory.mktemp("installed")
    wheels = base / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(REPO)], check=True, capture_output=True, text=True, timeout=300)
    subprocess.run([sys.executable, "-m", "venv", str(base / "venv")], check=True, timeout=300)
    # The test run's own packages (invoke, fabric, ...: where it runs, a venv or the system's) after the venv's: a
    # path a .pth adds never runs the .pth files in it, so the checkout's editable gpufleet stays out of sight.
    # (--system-site-packages would show the base interpreter's packages, not those of a venv the tests run in.)
    [own] = (base / "venv" / "lib").glob("python3*/site-packages")
    (own / "gpufleet-test-outer.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    # --ignore-installed: this machine's Python may have a (checkout's editable) gpufleet the venv would see
    pip = [str(base / "venv/bin/python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--ignore-installed",
           "--find-links", str(wheels), "gpufleet"]
    subprocess.run(pip, check=True, capture_output=True, text=True, timeout=300)
    return base / "venv" / "bin"


def clean_env() -> dict[str, str]:
    """The environment without the test run's own PYTHONPATH (the checkout) and GPUFLEET_ settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUFLEET_") and k != "PYTHONPATH"}


def run(bin_dir: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = clean_env()
    return subprocess.run([str(bin_dir / "gpufleet"), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_command_is_the_installed_package(installed, tmp_path):
    where = subprocess.run([str(installed / "python"), "-c", "import gpufleet; print(gpufleet.__file__)"],
                           cwd=tmp_path, env=clean_env(), capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(installed.parent)), where  # the venv's copy, not the checkout
    out = run(installed, tmp_path, "--version")
    assert out.returncode == 0 and out.stdout.strip() == "gpufleet 0.1.0", out


def test_init_list_and_help_outside_the_checkout(installed, tmp_path):
    out = run(installed, tmp_path, "init", "fleet")
    assert out.returncode == 0, out.stderr
    fleet = tmp_path / "fleet"
    for f in ("hosts/example.toml", "stack.toml", "patches/sglang/series", "patches/sgl-kernel/series"):
        assert (fleet / f).is_file(), f
    assert (fleet / "stack.toml").read_text() == (REPO / "stack.toml").read_text()
    again = run(installed, tmp_path, "init", "fleet")
    assert again.returncode == 2 and "would overwrite" in again.stderr and "Traceback" not in again.stderr

    listed = run(installed, fleet, "--list")
    assert listed.returncode == 0
    for name in ("facts", "status", "upgrade", "deploy-model", "rollback", "patches", "probe-backends", "init",
                 "sim.up", "sim.down", "sim.status"):
        assert f"  {name} " in listed.stdout or f"  {name}\n" in listed.stdout, name
    helped = run(installed, fleet, "status", "--help")
    assert helped.returncode == 0 and "--inventory" in helped.stdout and "--lock" in helped.stdout


def test_the_fleet_directory_is_where_it_runs(installed, tmp_path):
    run(installed, tmp_path, "init", "fleet")
    # no inventory there yet: the error names the fleet directory's hosts/, not site-packages
    here = run(installed, tmp_path / "fleet", "status")
    assert here.returncode == 2 and f"{tmp_path}/fleet/hosts/sim.toml: no inventory" in here.stderr
    flag = run(installed, tmp_path, "--fleet", "fleet", "status")
    assert flag.returncode == 2 and f"{tmp_path}/fleet/hosts/sim.toml" in flag.stderr
    missing = run(installed, tmp_path, "--fleet", "nope", "status")
    assert missing.returncode == 2 and "--fleet: not a directory" in missing.stderr
    (tmp_path / "fleet" / "patches" / "sglang" / "series").unlink()
    (tmp_path / "fleet" / "hosts" / "sim.toml").write_text((tmp_path / "fleet" / "hosts" / "example.toml").read_text())
    broken = run(installed, tmp_path / "fleet", "status")
    assert broken.returncode == 2 and f"{tmp_path}/fleet/patches/sglang/series: series file not found" in broken.stderr
