"""End to end: the canary's proven stack recorded as a fleet lock; later hosts get exactly it while the index moves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpufleet.config import lock
from gpufleet.wheels.fetch import sha256_of
from gpufleet.sim import wheels
from gpufleet.sim.fleet import CHECKOUT
from gpufleet.wheels.wheelset import canonical
from tests.sim.helpers import inv, inv_json, write_inventory
from tests.sim.test_upgrade import assert_wheels_fetched_once_by_the_control_node, index_log_size

pytestmark = pytest.mark.sim

HOSTS = ["gpu1", "gpu2", "gpu3"]
TARGET = wheels.TARGET["torch"]
FAST = '[defaults.stack.server]\nhealth_timeout = 15\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'
NEWER = "1.14.0"  # published after the canary: what an unlocked host would get now
NEWER_WHEEL = f"nvidia_cudnn_frontend-{NEWER}-py3-none-any.whl"


def versions(fleet, host) -> dict[str, str]:
    out = fleet.run_on(host, "cd / && /root/venv/bin/python -m pip list --format=freeze").stdout
    return dict(line.split("==", 1) for line in out.split() if "==" in line)


@pytest.fixture
def fleet(sim_fleet, tmp_path, monkeypatch):
    # a control-node cache of its own: with an sgl-kernel wheel cached by an earlier module the canary would install
    # it instead of building, and its lock would lack the build tools this test expects on it
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path / "control-cache"))
    for h in HOSTS:
        sim_fleet.reset_host(h)
    yield sim_fleet
    sim_fleet.set_link("gpu2", True)
    sim_fleet.unpublish(NEWER_WHEEL)
    for h in HOSTS:
        sim_fleet.reset_host(h)


def test_canary_records_the_lock_and_later_hosts_get_exactly_it_while_the_index_moves(fleet, tmp_path):
    path = write_inventory(fleet, tmp_path / "hosts.toml", connect_timeout=3)
    path.write_text(path.read_text().replace("[defaults.stack.pip]", FAST + "[defaults.stack.pip]"))
    locks = Path(os.environ["GPUFLEET_LOCKS_DIR"])
    before = set(locks.glob("*.toml"))
    log_from = index_log_size(fleet)

    # gpu1 (canary) passes; gpu2 cannot be reached, so the roll stops there
    fleet.set_link("gpu2", False)
    proc, summary = inv_json("upgrade", "--hosts", "gpu1,gpu2", "--inventory", str(path))
    # exit 3: the only problem is a host that could not be reached
    assert proc.returncode == 3 and summary["status"] == "stopped", proc.stderr[-3000:]
    outcome = {r["host"]: r for r in summary["results"]}
    assert outcome["gpu1"]["outcome"] == "ok", outcome["gpu1"]
    [recorded] = set(locks.glob("*.toml")) - before
    assert summary["lock"] == str(recorded)
    assert f"lock recorded: {recorded.name}" in outcome["gpu1"]["steps"]

    found = lock.load(recorded)
    assert found.lock.canary == "gpu1"
    assert found.packages["torch"] == TARGET and found.packages["nvidia-cudnn-frontend"] == "1.13.0"
    assert found.packages == {canonical(n): v for n, v in versions(fleet, "gpu1").items()}
    head = fleet.run_on("gpu1", f"git -C {CHECKOUT} rev-parse HEAD").stdout.strip()
    assert found.sglang.commit == head
    record = fleet.run_on("gpu1", "cat /root/venv/gpufleet-sgl-kernel.json").stdout
    assert found.sgl_kernel.build_key and found.sgl_kernel.build_key in record
    index_files = fleet.index_root / "files"
    by_file = {w.filename: w for w in found.wheels}
    for name in (f"torch-{TARGET}-py3-none-any.whl", "nvidia_cudnn_frontend-1.13.0-py3-none-any.whl",
                 "flashinfer_jit_cache-0.6.5+cu130-py3-none-any.whl"):
        assert by_file[name].sha256 == sha256_of(index_files / name)

    # the index moves on: a newer cudnn-frontend, which flashinfer-python's range admits
    fleet.publish(wheels.nvidia_wheel(tmp_path / "new", "nvidia-cudnn-frontend", NEWER, "libcudnn_frontend.so"))
    fleet.set_link("gpu2", True)
    proc2, summary2 = inv_json("upgrade", "--resume", "--inventory", str(path))
    assert proc2.returncode == 0, proc2.stdout[-3000:] + proc2.stderr[-3000:]
    assert summary2["lock"] == str(recorded)
    gpu2 = {r["host"]: r for r in summary2["results"]}["gpu2"]
    assert gpu2["outcome"] == "ok" and f"matches lock {recorded.name}" in gpu2["steps"], gpu2
    assert versions(fleet, "gpu2")["nvidia-cudnn-frontend"] == "1.13.0"

    # without the lock a host takes what the index serves now...
    plain = inv("upgrade", "--host", "gpu3", "--inventory", str(path))
    assert plain.returncode == 0, plain.stdout[-3000:]
    assert versions(fleet, "gpu3")["nvidia-cudnn-frontend"] == NEWER

    # ...which `inv status --lock` names, package by package
    proc3, report = inv_json("status", "--hosts", "all", "--inventory", str(path), "--lock", str(recorded))
    assert proc3.returncode == 1
    rows = {r["host"]: r for r in report["hosts"]}
    assert rows["gpu1"]["matches"] and rows["gpu2"]["matches"], rows
    # gpu3 installed gpu1's cached sgl-kernel build: it never needed the build tools the canary has
    assert rows["gpu3"]["packages"] == [f"cmake: absent (lock: {found.packages['cmake']})",
                                        f"nvidia-cudnn-frontend: {NEWER} (lock: 1.13.0)",
                                        f"pathspec: absent (lock: {found.packages['pathspec']})",
                                        f"scikit-build-core: absent (lock: {found.packages['scikit-build-core']})"]
    text = inv("status", "--hosts", "all", "--inventory", str(path), "--lock", str(recorded))
    assert text.returncode == 1 and f"nvidia-cudnn-frontend: {NEWER} (lock: 1.13.0)" in text.stdout

    # `inv upgrade --lock` converges it (also how a new box joins the fleet)
    proc4, [converge] = inv_json("upgrade", "--host", "gpu3", "--inventory", str(path), "--lock", str(recorded))
    assert proc4.returncode == 0, proc4.stderr[-3000:]
    assert converge["changed"] == ["locked-packages: install 4 locked distribution(s)",
                                   "venv: switch /root/venv to the staged copy in one atomic swap"], converge
    assert versions(fleet, "gpu3")["nvidia-cudnn-frontend"] == "1.13.0"
    proc5, report5 = inv_json("status", "--hosts", "all", "--inventory", str(path), "--lock", str(recorded))
    assert proc5.returncode == 0 and all(r["matches"] for r in report5["hosts"]), report5

    # an idempotent roll records no lock without provenance: its canary changed nothing and holds it to `recorded`
    kept = sorted(locks.glob("*.toml"))
    proc6, summary6 = inv_json("upgrade", "--hosts", "gpu1,gpu2", "--inventory", str(path))
    assert proc6.returncode == 0, proc6.stdout[-3000:] + proc6.stderr[-3000:]
    assert sorted(locks.glob("*.toml")) == kept and summary6["lock"] == str(recorded), summary6
    steps6 = {r["host"]: r for r in summary6["results"]}
    assert f"matches lock {recorded.name}" in steps6["gpu1"]["steps"] and steps6["gpu1"]["outcome"] == "unchanged"

    # every wheel came from the control node's cache, each fetched from the index once at most (earlier tests may
    # have filled the session's cache): the one published meanwhile exactly once, for gpu3
    files = assert_wheels_fetched_once_by_the_control_node(fleet, log_from)
    assert NEWER_WHEEL in files, files


def test_a_lock_whose_patch_series_differs_changes_nothing(fleet, tmp_path):
    path = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu1"])
    bogus = tmp_path / "lock.toml"
    bogus.write_text(f'''[lock]
format = 1
created = "2026-12-01T00:00:00Z"
canary = "gpu9"

[sglang]
commit = "{'a' * 40}"
patches = "{'b' * 64}"

[sgl_kernel]
patches = "{'c' * 64}"

[packages]
torch = "{TARGET}"
''')
    before = versions(fleet, "gpu1")
    proc, [report] = inv_json("upgrade", "--host", "gpu1", "--inventory", str(path), "--lock", str(bogus))
    assert proc.returncode == 1 and report["outcome"] == "failed"
    assert f"{bogus}, host 'gpu1', field 'sglang.patches'" in report["error"]
    assert "not the one this lock was proven with" in report["error"]
    assert versions(fleet, "gpu1") == before
    bad = inv("status", "--host", "gpu1", "--inventory", str(path), "--lock", str(tmp_path / "nope.toml"))
    assert bad.returncode != 0 and "nope.toml: file does not exist" in bad.stderr + bad.stdout
