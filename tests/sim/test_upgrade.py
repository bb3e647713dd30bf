"""End to end: `inv upgrade` over real SSH on the simulated fleet: old stack to target in one run, converge, refuse,
keep old stacks."""

from __future__ import annotations

import getpass
import json
import re
import shutil
import socket
from pathlib import Path

import pytest

from gpufleet.kernel.buildcache import installed_record
from gpufleet.sim import upstream, wheels
from tests.sim.helpers import REPO, inv, inv_json, write_inventory

pytestmark = pytest.mark.sim

TORCH = wheels.TARGET["torch"]
KERNEL = re.search(r'^version = "(.+)"', (upstream.TREE / "sgl-kernel/pyproject.toml").read_text(), re.M)[1]
MISSING = "2.12.0.dev20990101+cu130"
JIT_WHEEL = "flashinfer_jit_cache-0.6.5+cu130-py3-none-any.whl"
BUILD_TITLE = re.compile(rf"build sgl-kernel {re.escape(KERNEL)} for 12\.0a \(build ([0-9a-f]{{12}}), \d+ jobs\)")
# What "changed nothing" means: packages, every venv file with size and mtime, the checkout's state, the builds.
STATE = r"""
cd / && /root/venv/bin/python -m pip freeze --all
find /root/venv -name __pycache__ -prune -o -type f -printf '%p %s %T@\n' | sort
find /root/venv -name __pycache__ -prune -o -type d -print | sort
git -C /root/sglang-main status --porcelain=v1 --untracked-files=all; git -C /root/sglang-main rev-parse HEAD
git -C /root/sglang-main stash list
find /var/lib/gpufleet/builds -printf '%p %s %T@\n' | sort
"""


def on(fleet, host: str, command: str, check: bool = True) -> str:
    return fleet.run_on(host, command, check=check).stdout


def state(fleet, host: str) -> str:
    return on(fleet, host, STATE)


def versions(fleet, host: str) -> dict[str, str]:
    lines = on(fleet, host, "cd / && /root/venv/bin/python -m pip list --format=freeze").splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


def upgrade(site, *args: str, inventory: Path | None = None):
    return inv_json("upgrade", "--inventory", str(inventory or site.inventory), *args)


def kernel_entry(report: dict) -> dict:
    [entry] = [e for e in report["entries"] if e["role"] == "sgl-kernel"]
    return entry


def record(fleet, host: str, key12: str) -> dict:
    [key] = [k for k in on(fleet, host, "ls /var/lib/gpufleet/builds").split() if k.startswith(key12)]
    return json.loads(on(fleet, host, f"cat /var/lib/gpufleet/builds/{key}/record.json"))


class Site:
    """This module's inventory and control-node cache."""

    def __init__(self, fleet, root: Path):
        self.cache = root / "cache"
        # A snapshot of the sgl-kernel patches: the build key covers them, so an edit to the repo's copy during the
        # module would ask the later hosts for a new build instead of gpu1's.
        patches = shutil.copytree(REPO / "patches/sgl-kernel", root / "sgl-kernel-patches")
        self.extra = f'[defaults.stack.sgl_kernel]\npatches = "{patches}"\n'
        self.inventory = write_inventory(fleet, root / "hosts.toml", extra=self.extra)


@pytest.fixture(scope="module")
def fleet(sim_fleet):
    """The session's fleet with gpu1-gpu3 on the old stack; put back to it afterwards for later test modules."""
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)
    yield sim_fleet
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)


@pytest.fixture(scope="module")
def site(fleet, tmp_path_factory):
    """A control-node cache of this module's own, empty at first: the first run builds sgl-kernel (once), the later
    runs of the module install that build."""
    with pytest.MonkeyPatch.context() as mp:
        root = tmp_path_factory.mktemp("upgrade")
        s = Site(fleet, root)
        s.index_log_from = index_log_size(fleet)  # the index's log from here on: this module's cache at work
        mp.setenv("GPUFLEET_CACHE_DIR", str(s.cache))
        yield s


def test_dry_run_prints_the_plan_and_changes_nothing(fleet, site):
    before = state(fleet, "gpu1")
    proc, [report] = upgrade(site, "--host", "gpu1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert report["dry_run"] and report["outcome"] == "ok"
    entries = report["entries"]
    assert [(e["role"], e["status"]) for e in entries] == [
        ("torch", "planned"), ("flashinfer", "planned"), ("flashinfer", "planned"),
        ("sglang-checkout", "unchanged"), ("sglang-checkout", "unchanged"), ("sgl-kernel", "planned"),
        ("verify", "planned"), ("venv", "planned")]
    planned = [e["title"] for e in entries if e["status"] == "planned"]
    assert planned[:3] == [f"install torch {TORCH}", "install flashinfer 0.6.5 (python, cubin, jit-cache 0.6.5+cu130)",
                           "clear flashinfer's JIT cache (~/.cache/flashinfer)"]
    assert BUILD_TITLE.fullmatch(planned[3]), planned[3]
    assert planned[4] == "verify the whole stack (torch, flashinfer, sgl_kernel import together)"
    assert entries[0]["reason"].startswith(f"venv has torch 2.9.1+cu130; stack.toml wants {TORCH}")
    assert "is upstream's tip" in entries[3]["reason"] and entries[4]["reason"] == "sglang patches: all 2 applied"
    assert entries[5]["reason"].startswith("venv has sgl-kernel 0.3.16 not built by gpufleet; torch 2.9.1+cu130")
    assert "no wheel with that key on the host or in the cache" in entries[5]["reason"]
    assert "title" not in entries[3] and "commands" not in entries[3]
    staged = entries[-1]
    assert staged["title"] == "switch /root/venv to the staged copy in one atomic swap"
    assert staged["reason"].startswith("the venv is changed as a hard-linked copy beside /root/venv (") and \
        "the live venv is untouched until one atomic swap" in staged["reason"]

    people = inv("upgrade", "--inventory", str(site.inventory), "--host", "gpu1", "--dry-run")
    assert people.returncode == 0
    assert "will change" in people.stdout and "venv has torch 2.9.1+cu130" in people.stdout
    assert "dry run, nothing was changed" in people.stdout
    assert state(fleet, "gpu1") == before
    assert fleet.run_on("gpu1", "test -e /var/lib/gpufleet", check=False).returncode == 1
    assert fleet.run_on("gpu1", "systemctl list-units --all --no-legend 'gpufleet-build-*'").stdout == ""
    assert not site.cache.joinpath("sgl-kernel").exists()


@pytest.fixture(scope="module")
def first_run(fleet, site):
    """gpu1 upgraded from the old stack, with a unit file, an untracked file and a stale JIT cache beforehand."""
    on(fleet, "gpu1", "printf '[Service]\\nExecStart=/bin/true\\n' > /etc/systemd/system/sglang.service; "
                      "echo mine > /root/sglang-main/notes.txt; mkdir -p ~/.cache/flashinfer/0.6.4/120; "
                      "touch ~/.cache/flashinfer/0.6.4/120/old.so")
    head = on(fleet, "gpu1", "git -C /root/sglang-main rev-parse HEAD").strip()
    proc, [report] = upgrade(site, "--host", "gpu1")
    return proc, report, head


def test_one_run_takes_the_old_stack_to_the_target(fleet, site, first_run):
    proc, report, head = first_run
    assert proc.returncode == 0, (report, proc.stderr[-3000:])
    assert report["outcome"] == "ok" and report["error"] is None
    assert [(e["role"], e["status"]) for e in report["entries"]] == [
        ("torch", "changed"), ("flashinfer", "changed"), ("flashinfer", "changed"),
        ("sglang-checkout", "unchanged"), ("sglang-checkout", "unchanged"), ("sgl-kernel", "changed"),
        ("verify", "unchanged"), ("venv", "changed")]
    build = kernel_entry(report)
    key12 = BUILD_TITLE.fullmatch(build["title"])[1]
    assert build["reason"].startswith(f"venv has sgl-kernel 0.3.16 not built by gpufleet; torch {TORCH}")
    verify = report["entries"][-2]["reason"]
    assert verify.startswith(f"torch {TORCH} (CUDA 13.0, cc 12.0, sm_120), flashinfer-python 0.6.5"), verify
    assert verify.endswith(f"sgl-kernel {KERNEL} with FP4 ops import together"), verify
    assert report["changed"] == [f"torch: install torch {TORCH}",
                                 "flashinfer: install flashinfer 0.6.5 (python, cubin, jit-cache 0.6.5+cu130)",
                                 "flashinfer: clear flashinfer's JIT cache (~/.cache/flashinfer)",
                                 f"sgl-kernel: {build['title']}",
                                 "venv: switch /root/venv to the staged copy in one atomic swap"]
    assert report["staged_venv"] == "/root/venv.gpufleet-next"
    assert "[gpu1] switched to the new venv by one atomic exchange (renameat2)" in proc.stderr
    assert fleet.run_on("gpu1", "ls -d /root/venv.gpufleet-next*", check=False).returncode != 0

    assert f"[gpu1] Successfully installed nvidia-cublas-13.2.0.1 torch-{TORCH} triton-3.6.0" in proc.stderr
    assert "[gpu1] applied: 0001-fa3-can-be-turned-off.patch" in proc.stderr
    assert f"[gpu1] sgl-kernel: build {key12} cached on the control node for the other hosts" in proc.stderr
    assert "reattaching" not in proc.stderr
    found = versions(fleet, "gpu1")
    assert (found["torch"], found["flashinfer-python"], found["flashinfer-cubin"], found["flashinfer-jit-cache"],
            found["sgl-kernel"]) == (TORCH, "0.6.5", "0.6.5", "0.6.5+cu130", KERNEL)
    rec = record(fleet, "gpu1", key12)
    assert rec["origin"] == "built-here" and rec["fp4"] is True and "sm_120a" in rec["archs"]
    assert rec["inputs"]["torch"] == TORCH and rec["inputs"]["host"] == "gpu1"
    installed = json.loads(on(fleet, "gpu1", f"cat {installed_record('/root/venv')}"))
    assert installed["key"] == rec["key"]
    wheel = Path(rec["wheel"]).name
    assert sorted(p.name for p in (site.cache / "sgl-kernel" / rec["key"]).iterdir()) == ["record.json", wheel]
    # Built once, by a transient unit that is gone; the checkout stays on the same commit.
    assert on(fleet, "gpu1", "journalctl --no-pager -o cat | grep -c '^Started gpufleet-build-'").strip() == "1"
    assert on(fleet, "gpu1", "git -C /root/sglang-main rev-parse HEAD").strip() == head
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
    assert record["host"] == "gpu1" and record["outcome"] == "ok" and record["snapshot"] == snap
    assert record["changed"] == report["changed"] and record["failed"] is None and record["error"] is None
    assert [u.split(":")[0] for u in record["unchanged"]] == ["sglang-checkout", "sglang-checkout", "verify"]
    assert record["when"].endswith("Z")


def test_second_run_reports_everything_unchanged_and_modifies_nothing(fleet, site, first_run):
    before, snapshots = state(fleet, "gpu1"), on(fleet, "gpu1", "ls /var/lib/gpufleet/snapshots")
    key12 = BUILD_TITLE.fullmatch(kernel_entry(first_run[1])["title"])[1]

    proc, [report] = upgrade(site, "--host", "gpu1")
    assert proc.returncode == 0, report
    assert [(e["role"], e["status"]) for e in report["entries"]] == [
        ("torch", "unchanged"), ("flashinfer", "unchanged"), ("flashinfer", "unchanged"),
        ("sglang-checkout", "unchanged"), ("sglang-checkout", "unchanged"), ("sgl-kernel", "unchanged"),
        ("verify", "unchanged")]
    assert kernel_entry(report)["reason"].startswith(f"sgl-kernel {KERNEL} installed from build {key12} (targets ")
    assert report["entries"][-1]["reason"].endswith(f"sgl-kernel {KERNEL} with FP4 ops import together")
    assert report["changed"] == [] and report["snapshot"] is None
    assert state(fleet, "gpu1") == before
    assert on(fleet, "gpu1", "ls /var/lib/gpufleet/snapshots") == snapshots
    assert on(fleet, "gpu1", "journalctl --no-pager -o cat | grep -c '^Started gpufleet-build-'").strip() == "1"
    last = json.loads(on(fleet, "gpu1", "tail -n 1 /var/lib/gpufleet/audit.log"))
    assert last["outcome"] == "ok" and last["changed"] == [] and last["snapshot"] is None

    people = inv("upgrade", "--inventory", str(site.inventory), "--host", "gpu1")
    assert people.returncode == 0 and "nothing changed" in people.stdout and "1 unchanged" in people.stdout
    assert state(fleet, "gpu1") == before


def test_missing_version_is_a_clear_error_and_the_old_stack_stays(fleet, site, tmp_path):
    extra = f'{site.extra}[hosts.gpu2.stack.torch]\nversion = "{MISSING}"\n'
    path = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu2"], extra=extra)
    proc, [report] = upgrade(site, "--host", "gpu2", inventory=path)
    assert proc.returncode == 1
    assert report["outcome"] == "failed"
    # pip on the host resolves before anything is handed over or installed: the plan itself fails
    assert f"role torch cannot plan: pip on the host cannot resolve torch=={MISSING}" in report["error"]
    assert f"No matching distribution found for torch=={MISSING}" in report["error"]
    assert report["entries"] == [] and report["snapshot"] is None
    assert on(fleet, "gpu2", "cd / && /root/venv/bin/python -c 'import torch; print(torch.__version__)'") == \
        "2.9.1+cu130\n"
    found = versions(fleet, "gpu2")
    assert (found["flashinfer-python"], found["sgl-kernel"]) == ("0.6.4", "0.3.16")
    assert fleet.run_on("gpu2", "test -e /var/lib/gpufleet/builds", check=False).returncode == 1
    assert fleet.run_on("gpu2", "test -e /var/lib/gpufleet/lock", check=False).returncode == 1


def test_second_concurrent_run_is_refused_naming_the_holder(fleet, site):
    holder = "holder=alice@laptop\npid=4242\nstarted=2026-12-02T10:00:00Z\ncommand=inv upgrade --hosts all\n"
    on(fleet, "gpu2", f"mkdir -p /var/lib/gpufleet/lock && printf '{holder}' > /var/lib/gpufleet/lock/holder")
    try:
        proc = inv("upgrade", "--inventory", str(site.inventory), "--host", "gpu2")
        assert proc.returncode == 1
        text = " ".join(proc.stdout.split())
        assert ("host gpu2 is locked by alice@laptop (pid 4242, since 2026-12-02T10:00:00Z, running "
                "`inv upgrade --hosts all`)") in text
        assert on(fleet, "gpu2", "cat /var/lib/gpufleet/lock/holder") == holder  # someone else's lock stays
        assert versions(fleet, "gpu2")["torch"] == "2.9.1+cu130"
    finally:
        on(fleet, "gpu2", "rm -rf /var/lib/gpufleet/lock")


def index_log_size(fleet) -> int:
    log = fleet.logs / "index.log"
    return log.stat().st_size if log.exists() else 0


def stack_wheel_downloads(fleet, since: int) -> list[tuple[str, str]]:
    """(client address, file) of every stack wheel downloaded from the index since byte `since` of its log."""
    import re

    with open(fleet.logs / "index.log", "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    gets = re.findall(r'^(\S+) - - \[[^]]+\] "GET /files/(\S+\.whl) HTTP', text, re.M)
    return [(who, name) for who, name in gets if name.split("-")[0] in
            ("torch", "triton", "nvidia_cublas", "nvidia_cuda_runtime", "nvidia_cudnn_frontend", "flashinfer_python",
             "flashinfer_cubin", "flashinfer_jit_cache")]


def assert_wheels_fetched_once_by_the_control_node(fleet, since: int) -> list[str]:
    """Since `since` (with one control-node cache): every stack wheel was downloaded at most once, and only by the
    control node; hosts read pages and PEP 658 metadata only. Returns the files downloaded."""
    from gpufleet.sim.fleet import CONTROL_ADDR

    downloads = stack_wheel_downloads(fleet, since)
    assert {who for who, _ in downloads} <= {CONTROL_ADDR}, downloads
    files = [name for _, name in downloads]
    assert len(files) == len(set(files)), files
    return files


def test_jit_cache_by_url_fetched_once_and_gpu1_build_installed_elsewhere(fleet, site, first_run, tmp_path):
    """gpu2, then gpu3: the jit-cache wheel by URL is fetched once for both (the control node keeps it); neither
    compiles sgl-kernel, both install the wheel gpu1 built (same build key), as their own records say."""
    wheel = fleet.index_root / "files" / JIT_WHEEL
    url = fleet.index_url.rsplit("/simple", 1)[0] + "/files/" + JIT_WHEEL.replace("+", "%2B")
    path = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu2", "gpu3"], extra=site.extra)
    text = path.read_text()
    by_index = f'[defaults.stack.flashinfer.jit_cache]\nindex_url = "{fleet.index_url}"'
    assert by_index in text
    from gpufleet.wheels.fetch import sha256_of
    path.write_text(text.replace(by_index, f'[defaults.stack.flashinfer.jit_cache]\nurl = "{url}"\n'
                                           f'sha256 = "{sha256_of(wheel)}"'))
    log = fleet.logs / "index.log"
    fetches = log.read_text().count("GET /files/" + JIT_WHEEL.replace("+", "%2B"))
    key12 = BUILD_TITLE.fullmatch(kernel_entry(first_run[1])["title"])[1]
    gpu1 = record(fleet, "gpu1", key12)

    for host in ("gpu2", "gpu3"):
        proc, [report] = upgrade(site, "--host", host, inventory=path)
        assert proc.returncode == 0 and report["outcome"] == "ok", (report, proc.stderr[-3000:])
        install = report["entries"][1]
        assert install["title"].startswith("install flashinfer") and install["status"] == "changed", report
        assert install["uploads"][-1]["remote"] == f"/var/cache/gpufleet/wheels/{JIT_WHEEL}"
        assert versions(fleet, host)["flashinfer-jit-cache"] == "0.6.5+cu130"
        kernel = kernel_entry(report)
        assert kernel["status"] == "changed", kernel
        assert kernel["title"] == f"install sgl-kernel wheel {Path(gpu1['wheel']).name} (build {key12})"
        assert "the control node caches a wheel with that key" in kernel["reason"]
        assert next(e for e in report["entries"] if e["role"] == "verify")["reason"].endswith(
            f"sgl-kernel {KERNEL} with FP4 ops import together")
        rec = record(fleet, host, key12)
        assert rec["key"] == gpu1["key"] and rec["origin"] == "copied-from gpu1" and rec["archs"] == gpu1["archs"]
        # No compile on this host: no build log, no CMake build dir, no build unit ever started, no patch applied.
        build_dir = f"/var/lib/gpufleet/builds/{gpu1['key']}"
        assert fleet.run_on(host, f"test -e {build_dir}/build.log || test -e {build_dir}/cmake-build",
                            check=False).returncode == 1
        assert on(fleet, host, "journalctl --no-pager -o cat | grep -c '^Started gpufleet-build-'",
                  check=False).strip() == "0"
        assert "sgl-kernel: build " not in proc.stderr and "applied: 0002" not in proc.stderr
        assert versions(fleet, host)["sgl-kernel"] == KERNEL
    # gpu1's run already cached the same file (same sha256, taken from the index then): no second download
    assert log.read_text().count("GET /files/" + JIT_WHEEL.replace("+", "%2B")) <= max(fetches, 1)
    # over the module (its own cache, 5 upgrades of 3 hosts): the whole target stack, each file once
    files = assert_wheels_fetched_once_by_the_control_node(fleet, site.index_log_from)
    assert {f.split("-")[0] for f in files} >= {"torch", "triton", "nvidia_cublas", "flashinfer_python",
                                                "flashinfer_cubin", "flashinfer_jit_cache"}, files
    assert (site.cache / "wheels" / sha256_of(wheel) / JIT_WHEEL).read_bytes() == wheel.read_bytes()
