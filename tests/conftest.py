"""Shared fixtures: the simulated fleet (booted once per test session) and inventory helpers."""

from __future__ import annotations

import os
import signal
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"


def pytest_configure(config):
    """Tests never touch the developer's wheel cache (~/.cache/gpufleet), roll records (runs/) or fleet locks
    (locks/): each session gets its own."""
    import tempfile

    os.environ["GPUFLEET_CACHE_DIR"] = tempfile.mkdtemp(prefix="gpufleet-test-cache-")
    os.environ["GPUFLEET_RUNS_DIR"] = tempfile.mkdtemp(prefix="gpufleet-test-runs-")
    os.environ["GPUFLEET_LOCKS_DIR"] = tempfile.mkdtemp(prefix="gpufleet-test-locks-")
    # what a host remembers (patch judgements, stack checks), for the remote scripts the tests run locally
    os.environ["GPUFLEET_HOST_CACHE"] = tempfile.mkdtemp(prefix="gpufleet-test-host-cache-")
    # The Ctrl-C tests press Ctrl-C as a person at a terminal does. A suite started as a background job of a
    # non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, Python keeps it so, and every `inv` the tests
    # start would inherit it too: give the run a terminal's SIGINT (its exec'd children then get the default).
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def _sim_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the simulated fleet needs root"
    for tool in ("systemd-nspawn", "sshd", "ip"):
        if not (shutil.which(tool) or Path("/usr/sbin", tool).exists()):
            return f"{tool} is not installed (run scripts/bootstrap)"
    return None


@pytest.fixture(scope="session")
def sim_fleet(tmp_path_factory):
    """Three simulated Blackwell servers with the old stack, booted once for the whole session."""
    reason = _sim_unavailable()
    if reason:
        if os.environ.get("GPUFLEET_REQUIRE_SIM"):
            pytest.fail(f"GPUFLEET_REQUIRE_SIM is set but {reason}")
        pytest.skip(reason)
    from gpufleet.sim.fleet import SimFleet

    fleet = SimFleet()
    inventory = tmp_path_factory.mktemp("sim") / "hosts.toml"
    fleet.up(count=3, inventory=inventory, on_progress=lambda msg: None)
    fleet.inventory_path = inventory
    try:
        yield fleet
    finally:
        fleet.down()


@pytest.fixture(autouse=True)
def _no_user_ssh_config(monkeypatch):
    """Keep the developer's own ~/.ssh/config and agent out of every test."""
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
