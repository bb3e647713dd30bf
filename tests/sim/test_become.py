"""End to end on non-root logins with sudo: upgrade, deploy, rollback and the probe on a host reached as `ops`
(sudo without a password; its venv and checkout belong to ops) and one reached as `opspw` (sudo with a password
from a file); a wrong password and a refusing sudoers rule are one clear error before anything changed."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gpufleet.sim import wheels
from gpufleet.sim.layout import CHECKOUT, SUDO_NOPASSWD_USER, SUDO_PASSWORD_USER, SUDO_REFUSED_USER, VENV
from tests.sim.helpers import REPO, inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

TORCH = wheels.TARGET["torch"]
# What "changed nothing" means here: packages, venv files, the checkout, gpufleet's state directory, the unit.
STATE = r"""
cd / && /root/venv/bin/python -m pip freeze --all
find /root/venv /root/sglang-main -path '*/.git' -prune -o -name __pycache__ -prune -o -type f -printf '%p %u %s %T@\n' | sort
git -C /root/sglang-main status --porcelain=v1; git -C /root/sglang-main rev-parse HEAD
find /var/lib/gpufleet /etc/systemd/system -type f -printf '%p %s %T@\n' 2>/dev/null | sort
"""
OWNED_BY_OTHERS = (f"{{ find {VENV} ! -user {SUDO_NOPASSWD_USER}; "
                   f"find {CHECKOUT} -name __pycache__ -prune -o ! -user {SUDO_NOPASSWD_USER} -print; }} | head -n 5")


def on(fleet, host: str, command: str) -> str:
    return fleet.run_on(host, command).stdout


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    """gpu1 (as ops; venv and checkout belong to ops) and gpu2 (as opspw) fresh; put back afterwards."""
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)
    sim_fleet.run_on("gpu1", f"chown -R {SUDO_NOPASSWD_USER}: {VENV} {CHECKOUT}")
    yield sim_fleet
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)


def become_inventory(fleet, path: Path, *, password: str | None = None, hosts=("gpu1", "gpu2"),
                     gpu3_user: str = SUDO_REFUSED_USER) -> Path:
    pw = (f'become_password_file = "{fleet.sudo_password_file}"' if password is None
          else 'become_password_env = "GPUFLEET_TEST_SUDO"')
    patches = shutil.copytree(REPO / "patches/sgl-kernel", path.parent / "sgl-kernel-patches", dirs_exist_ok=True)
    extra = (f'[defaults.stack.sgl_kernel]\npatches = "{patches}"\n'
             f'[hosts.gpu1]\nuser = "{SUDO_NOPASSWD_USER}"\nbecome = true\n'
             f'[hosts.gpu2]\nuser = "{SUDO_PASSWORD_USER}"\nbecome = true\n{pw}\n'
             f'[hosts.gpu3]\nuser = "{gpu3_user}"\nbecome = true\n')
    return write_inventory(fleet, path, list(hosts), extra=extra_for(extra, hosts))


def extra_for(extra: str, hosts) -> str:
    """The extra TOML with only the [hosts.X] tables of the chosen hosts."""
    blocks = ("\n" + extra).split("\n[")[1:]
    kept = [b for b in blocks if not b.startswith("hosts.") or b.split("]")[0][len("hosts."):] in hosts]
    return "\n".join("[" + b for b in kept)


def test_a_wrong_password_is_one_clear_error_before_anything_changed(fleet, tmp_path, monkeypatch):
    path = become_inventory(fleet, tmp_path / "hosts.toml", password="wrong", hosts=("gpu2",))
    monkeypatch.setenv("GPUFLEET_TEST_SUDO", "not-the-password")
    before = on(fleet, "gpu2", STATE)
    proc = inv("upgrade", "--inventory", str(path), "--host", "gpu2", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out
    assert "host gpu2: sudo refused" in out and "/bin/bash -c true" in out, out
    assert "not-the-password" not in out and "Traceback" not in out
    assert on(fleet, "gpu2", STATE) == before


def test_an_unset_password_variable_is_a_config_error_naming_the_field(fleet, tmp_path, monkeypatch):
    path = become_inventory(fleet, tmp_path / "hosts.toml", password="env", hosts=("gpu2",))
    monkeypatch.delenv("GPUFLEET_TEST_SUDO", raising=False)
    proc = inv("status", "--inventory", str(path), "--host", "gpu2", timeout=60)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "become_password_env" in out and "GPUFLEET_TEST_SUDO" in out, out
    assert "Traceback" not in out


def test_a_refusing_sudoers_rule_or_a_missing_password_is_one_clear_error(fleet, tmp_path):
    path = become_inventory(fleet, tmp_path / "hosts.toml", hosts=("gpu3",))
    before = on(fleet, "gpu3", STATE)
    proc = inv("upgrade", "--inventory", str(path), "--host", "gpu3", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "host gpu3: sudo refused" in out and "not allowed" in out, out
    # opspw needs a password; without one sudo -n says so at once (never a prompt, never a hang)
    path = become_inventory(fleet, tmp_path / "hosts2.toml", hosts=("gpu3",), gpu3_user=SUDO_PASSWORD_USER)
    proc = inv("upgrade", "--inventory", str(path), "--host", "gpu3", timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "host gpu3: sudo refused" in out and "password is required" in out, out
    assert on(fleet, "gpu3", STATE) == before


def test_upgrade_deploy_rollback_and_probe_as_non_root_users(fleet, tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))
    path = become_inventory(fleet, tmp_path / "hosts.toml")

    # A roll over both: upgrade (pip installs, checkout, patches, sgl-kernel built on gpu1 and handed to gpu2
    # through the build cache's SFTP), deploy, health gate, fleet lock.
    proc, report = inv_json("upgrade", "--inventory", str(path), "--hosts", "gpu1,gpu2", timeout=1500)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for host in ("gpu1", "gpu2"):
        have = on(fleet, host, "/root/venv/bin/python -c 'import torch; print(torch.__version__)'").strip()
        assert have == TORCH, host
    assert fleet.sudo_password_file.read_text().strip() not in proc.stdout + proc.stderr

    # gpu1's venv and checkout belong to ops and still do: nothing root-owned was left in them by gpufleet (the
    # model server runs as root, as its unit says, and writes its own bytecode caches: those are not gpufleet's).
    left = on(fleet, "gpu1", OWNED_BY_OTHERS)
    assert left == "", left
    assert on(fleet, "gpu1", "stat -c %U /var/lib/gpufleet /etc/systemd/system/sglang.service").split() == \
        ["root", "root"]
    # gpu2's stayed root's
    assert on(fleet, "gpu2", f"find {VENV} {CHECKOUT} ! -user root | head -n 5") == ""
    assert on(fleet, "gpu1", "systemctl is-active sglang.service").strip() == "active"

    # A second deploy changes nothing, through sudo on both.
    proc, reports = inv_json("deploy-model", "--inventory", str(path), "--hosts", "gpu1,gpu2", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    # The probe lists its candidates on a non-root host (reads through sudo, under the host lock's rules).
    proc, [listed] = inv_json("probe-backends", "--inventory", str(path), "--host", "gpu2", "--dry-run")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert listed["candidates"]

    # Rollback on the password host: restored to its newest snapshot (the roll's deploy took it) and proved equal.
    proc, rows = inv_json("rollback", "--inventory", str(path), "--host", "gpu2", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert rows[0]["restored"] is True and "match the snapshot" in rows[0]["proof"]
    audit = on(fleet, "gpu2", "tail -n 1 /var/lib/gpufleet/audit.log")
    assert '"outcome": "rolled back"' in audit
    # and on the ops host, ownership survives a rollback too
    proc, rows = inv_json("rollback", "--inventory", str(path), "--host", "gpu1", timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert on(fleet, "gpu1", OWNED_BY_OTHERS) == ""
