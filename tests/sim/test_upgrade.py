"""End to end: `inv upgrade` over real SSH on the simulated fleet: plan, apply, converge, refuse, keep old stacks."""

from __future__ import annotations

import getpass
import json
import socket
import subprocess
from pathlib import Path

import pytest

from gpufleet.sim import wheels
from tests.sim.helpers import inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

TORCH = wheels.TARGET["torch"]
MISSING = "2.12.0.dev20990101+cu130"
JIT_WHEEL = "flashinfer_jit_cache-0.6.5+cu130-py3-none-any.whl"
# What "changed nothing" means: packages, every venv file with size and mtime, the checkout's state.
STATE = r"""
cd / && /root/venv/bin/python -m pip freeze --all
find /root/venv -name __pycache__ -prune -o -type f -printf '%p %s %T@\n' | sort
find /root/venv -name __pycache__ -prune -o -type d -print | sort
git -C /root/sglang-main status --porcelain=v1 --untracked-files=all; git -C /root/sglang-main rev-parse HEAD
git -C /root/sglang-main stash list
"""


def on(fleet, host: str, command: str, check: bool = True) -> str:
    return fleet.run_on(host, command, check=check).stdout


def state(fleet, host: str) -> str:
    return on(fleet, host, STATE)


def versions(fleet, host: str) -> dict[str, str]:
    lines = on(fleet, host, "cd / && /root/venv/bin/python -m pip list --format=freeze").splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


def upgrade(fleet, *args: str, inventory: Path | None = None):
    return inv_json("upgrade", "--inventory", str(inventory or fleet.inventory_path), *args)


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    """The session's fleet with gpu1-gpu3 on the old stack; put back to it afterwards for later test modules."""
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)
    yield sim_fleet
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)


def test_dry_run_prints_the_plan_and_changes_nothing(fleet):
    before = state(fleet, "gpu1")
    proc, [report] = upgrade(fleet, "--host", "gpu1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert report["dry_run"] and report["outcome"] == "ok"
    steps = [(e["role"], e["status"], e["title"]) for e in report["entries"]]
    assert steps == [("torch", "planned", f"install torch {TORCH}"),
                     ("flashinfer", "planned", "install flashinfer 0.6.5 (python, cubin, jit-cache 0.6.5+cu130)"),
                     ("flashinfer", "planned", "clear flashinfer's JIT cache (~/.cache/flashinfer)"),
                     ("verify", "planned", "verify the whole stack (torch, flashinfer, sgl_kernel import together)")]
    assert report["entries"][0]["reason"].startswith(f"venv has torch 2.9.1+cu130; stack.toml wants {TORCH}")

    people = inv("upgrade", "--inventory", str(fleet.inventory_path), "--host", "gpu1", "--dry-run")
    assert people.returncode == 0
    assert "will change" in people.stdout and "venv has torch 2.9.1+cu130" in people.stdout
    assert "dry run, nothing was changed" in people.stdout
    assert state(fleet, "gpu1") == before
    assert fleet.run_on("gpu1", "test -e /var/lib/gpufleet", check=False).returncode == 1


@pytest.fixture(scope="module")
def first_run(fleet):
    """gpu1 upgraded from the old stack, with a unit file, an untracked file and a stale JIT cache beforehand."""
    on(fleet, "gpu1", "printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/sglang.service; "
                      "echo mine > /root/sglang-main/notes.txt; mkdir -p ~/.cache/flashinfer/0.6.4/120; "
                      "touch ~/.cache/flashinfer/0.6.4/120/old.so")
    head = on(fleet, "gpu1", "git -C /root/sglang-main rev-parse HEAD").strip()
    proc, [report] = upgrade(fleet, "--host", "gpu1")
    return proc, report, head


def test_upgrade_installs_the_target_and_stops_at_the_stale_sgl_kernel(fleet, first_run):
    proc, report, _ = first_run
    # sgl-kernel 0.3.16 was built against torch 2.9: until the sgl-kernel role rebuilds it, verify must say so.
    assert proc.returncode == 1
    assert [(e["role"], e["status"]) for e in report["entries"]] == [
        ("torch", "changed"), ("flashinfer", "changed"), ("flashinfer", "changed"), ("verify", "failed")]
    assert f"import sgl_kernel failed (sgl-kernel 0.3.16 with torch {TORCH})" in report["error"]
    assert "rebuild it for this torch" in report["error"] and "exit code 1" in report["error"]
    assert "again" in report["next"] and report["snapshot"] in report["next"]
    assert f"[gpu1] Successfully installed nvidia-cublas-13.2.0.1 torch-{TORCH} triton-3.6.0" in proc.stderr
    found = versions(fleet, "gpu1")
    assert (found["torch"], found["flashinfer-python"], found["flashinfer-cubin"], found["flashinfer-jit-cache"]) == (
        TORCH, "0.6.5", "0.6.5", "0.6.5+cu130")
    assert fleet.run_on("gpu1", "test -e ~/.cache/flashinfer", check=False).returncode == 1
    assert fleet.run_on("gpu1", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1


def test_snapshot_and_audit_log_record_the_run(fleet, first_run):
    _, report, head = first_run
    snap = report["snapshot"]
    assert snap.startswith("/var/lib/gpufleet/snapshots/20")
    assert "torch==2.9.1+cu130" in on(fleet, "gpu1", f"cat {snap}/pip-freeze.txt").splitlines()
    assert on(fleet, "gpu1", f"cat {snap}/git-head").strip() == head
    diff = on(fleet, "gpu1", f"cat {snap}/git.diff")
    assert "all_reduce_utils.py" in diff and "torch_symm_mem.py" in diff
    assert on(fleet, "gpu1", f"cat {snap}/untracked.txt").split() == ["notes.txt"]
    assert on(fleet, "gpu1", f"tar -xOzf {snap}/untracked.tar.gz notes.txt") == "mine\n"
    assert "ExecStart=/bin/true" in on(fleet, "gpu1", f"cat {snap}/sglang.service")
    [record] = [json.loads(x) for x in on(fleet, "gpu1", "cat /var/lib/gpufleet/audit.log").splitlines()]
    assert record["who"] == f"{getpass.getuser()}@{socket.gethostname()}"
    assert record["host"] == "gpu1" and record["outcome"] == "failed" and record["snapshot"] == snap
    assert record["changed"][0] == f"torch: install torch {TORCH}" and len(record["changed"]) == 3
    assert record["failed"]["step"].startswith("verify: ") and record["when"].endswith("Z")


def test_second_run_reports_everything_unchanged_and_modifies_nothing(fleet, first_run, tmp_path):
    # What the sgl-kernel role will do: an sgl-kernel built against the new torch.
    kernel = wheels.sgl_kernel_wheel(tmp_path, "0.3.16", TORCH)
    subprocess.run(fleet.ssh_argv("gpu1") + [f"cat > /tmp/{kernel.name}"], input=kernel.read_bytes(), check=True)
    on(fleet, "gpu1", f"cd / && PIP_CONFIG_FILE=/dev/null /root/venv/bin/python -m pip install -q --no-deps "
                      f"--force-reinstall /tmp/{kernel.name} && rm /tmp/{kernel.name}")
    before, snapshots = state(fleet, "gpu1"), on(fleet, "gpu1", "ls /var/lib/gpufleet/snapshots")

    proc, [report] = upgrade(fleet, "--host", "gpu1")
    assert proc.returncode == 0, report
    assert {e["status"] for e in report["entries"]} == {"unchanged"}
    assert [e["role"] for e in report["entries"]] == ["torch", "flashinfer", "flashinfer", "verify"]
    assert "sgl-kernel 0.3.16 with FP4 ops import together" in report["entries"][-1]["reason"]
    assert report["changed"] == [] and report["snapshot"] is None
    assert state(fleet, "gpu1") == before
    assert on(fleet, "gpu1", "ls /var/lib/gpufleet/snapshots") == snapshots
    last = json.loads(on(fleet, "gpu1", "tail -n 1 /var/lib/gpufleet/audit.log"))
    assert last["outcome"] == "ok" and last["changed"] == []

    people = inv("upgrade", "--inventory", str(fleet.inventory_path), "--host", "gpu1")
    assert people.returncode == 0 and "nothing changed" in people.stdout and "1 unchanged" in people.stdout


def test_missing_version_is_a_clear_error_and_the_old_stack_stays(fleet, tmp_path):
    extra = f'[hosts.gpu2.stack.torch]\nversion = "{MISSING}"\n'
    path = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu2"], extra=extra)
    proc, [report] = upgrade(fleet, "--host", "gpu2", inventory=path)
    assert proc.returncode == 1
    assert report["outcome"] == "failed"
    assert f"step 'install torch {MISSING}' failed" in report["error"]
    assert f"No matching distribution found for torch=={MISSING}" in report["error"]
    assert [(e["role"], e["status"]) for e in report["entries"]] == [("torch", "failed")]
    assert on(fleet, "gpu2", "cd / && /root/venv/bin/python -c 'import torch; print(torch.__version__)'") == \
        "2.9.1+cu130\n"
    assert versions(fleet, "gpu2")["flashinfer-python"] == "0.6.4"
    assert fleet.run_on("gpu2", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1


def test_second_concurrent_run_is_refused_naming_the_holder(fleet):
    holder = "holder=alice@laptop\npid=4242\nstarted=2026-12-02T10:00:00Z\ncommand=inv upgrade --hosts all\n"
    on(fleet, "gpu2", f"mkdir -p /var/lib/gpufleet/lock && printf '{holder}' > /var/lib/gpufleet/lock/holder")
    try:
        proc = inv("upgrade", "--inventory", str(fleet.inventory_path), "--host", "gpu2")
        assert proc.returncode == 1
        text = " ".join(proc.stdout.split())
        assert ("host gpu2 is locked by alice@laptop (pid 4242, since 2026-12-02T10:00:00Z, running "
                "`inv upgrade --hosts all`)") in text
        assert on(fleet, "gpu2", "cat /var/lib/gpufleet/lock/holder") == holder  # someone else's lock stays
        assert versions(fleet, "gpu2")["torch"] == "2.9.1+cu130"
    finally:
        on(fleet, "gpu2", "rm -rf /var/lib/gpufleet/lock")


def test_jit_cache_wheel_by_url_is_fetched_once_for_all_hosts(fleet, tmp_path, monkeypatch):
    wheel = fleet.index_root / "files" / JIT_WHEEL
    url = fleet.index_url.rsplit("/simple", 1)[0] + "/files/" + JIT_WHEEL.replace("+", "%2B")
    path = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu2", "gpu3"])
    text = path.read_text()
    by_index = f'[defaults.stack.flashinfer.jit_cache]\nindex_url = "{fleet.index_url}"'
    assert by_index in text
    from gpufleet.fetch import sha256_of
    path.write_text(text.replace(by_index, f'[defaults.stack.flashinfer.jit_cache]\nurl = "{url}"\n'
                                           f'sha256 = "{sha256_of(wheel)}"'))
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "cache"))
    log = fleet.logs / "index.log"
    fetches = log.read_text().count("GET /files/" + JIT_WHEEL.replace("+", "%2B"))

    proc, reports = upgrade(fleet, "--hosts", "gpu2,gpu3", inventory=path)
    for report in reports:
        install = report["entries"][1]
        assert install["title"].startswith("install flashinfer") and install["status"] == "changed", report
        assert install["uploads"][0]["remote"] == f"/var/cache/gpufleet/wheels/{JIT_WHEEL}"
        assert versions(fleet, report["host"])["flashinfer-jit-cache"] == "0.6.5+cu130"
    assert log.read_text().count("GET /files/" + JIT_WHEEL.replace("+", "%2B")) == fetches + 1
    assert (tmp_path / "cache" / "wheels" / sha256_of(wheel) / JIT_WHEEL).read_bytes() == wheel.read_bytes()
