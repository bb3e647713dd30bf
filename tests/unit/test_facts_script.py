"""The facts script run for real with bash on this machine, parsed by parse_facts: script and parsers agree."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.facts import SECTIONS, facts_script, parse_facts, parse_sections

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", "-c",
       "protocol.file.allow=always"]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run([*GIT, "-C", str(cwd), *args], check=True, capture_output=True, text=True).stdout.strip()


def run_script(script: str) -> str:
    # fed on stdin as over SSH (`bash -s`): a section reading stdin would eat the rest of the script; without the
    # test run's PYTHONPATH, which never reaches a host (the checkout's gpufleet.egg-info would be a venv's package)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("venv") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    return path


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A clone of an upstream with: one local commit, two upstream commits, an edit, untracked files, a stash."""
    upstream, work = tmp_path / "upstream", tmp_path / "sglang-main"
    upstream.mkdir()
    git(upstream, "init", "-q")
    (upstream / "a.py").write_text("a = 1\n")
    (upstream / "b.py").write_text("b = 1\n")
    git(upstream, "add", ".")
    git(upstream, "commit", "-qm", "one")
    subprocess.run([*GIT, "clone", "-q", str(upstream), str(work)], check=True)
    for n in (2, 3):
        (upstream / "a.py").write_text(f"a = {n}\n")
        git(upstream, "commit", "-qam", f"up {n}")
    git(work, "fetch", "-q")
    (work / "c.py").write_text("c = 1\n")
    git(work, "add", "c.py")
    git(work, "commit", "-qm", "local")
    (work / "b.py").write_text("b = 2\n")
    git(work, "stash", "-q")
    (work / "b.py").write_text("b = 3\n")
    (work / "new file.txt").write_text("x\n")
    (work / "é.txt").write_text("x\n")
    git(work, "remote", "set-url", "origin", "https://deploy:s3cret@example.com/sglang.git")
    return work


def test_every_section_is_printed_once(tmp_path):
    script = facts_script(str(tmp_path / "no-venv"), str(tmp_path / "no-checkout"), "sglang", [str(tmp_path)])
    sections = parse_sections(run_script(script))
    assert tuple(sections) == SECTIONS


def test_healthy_parts_of_this_machine(tmp_path, venv, checkout):
    script = facts_script(str(venv), str(checkout), "gpufleet-test-none", [str(tmp_path), str(tmp_path / "x/y/z")])
    facts = parse_facts("local", run_script(script))

    assert facts.python_version == ".".join(map(str, sys.version_info[:3]))
    assert facts.packages is not None and "pip" in facts.packages
    assert facts.cpu_count == os.cpu_count()
    assert facts.mem_total_bytes > facts.mem_available_bytes > 0
    assert facts.os is not None and facts.os.kernel == os.uname().release and facts.os.arch == os.uname().machine
    assert [d.path for d in facts.disks] == [str(tmp_path), str(tmp_path / "x/y/z")]
    assert all(d.total_bytes >= d.free_bytes > 0 for d in facts.disks)

    co = facts.checkout
    assert co.present and co.path == str(checkout)
    assert co.head == git(checkout, "rev-parse", "HEAD") and co.branch == "main"
    assert (co.upstream, co.ahead, co.behind) == ("origin/main", 1, 2)
    assert co.modified == ["b.py"]
    assert sorted(co.untracked) == ["new file.txt", "é.txt"]
    assert len(co.stashes) == 1 and co.stashes[0].startswith("stash@{0}: WIP on main")
    assert co.remote_url == "https://example.com/sglang.git"

    assert facts.unit is not None and facts.unit.present is False
    assert facts.unit.systemd == Path("/run/systemd/system").is_dir()

    if shutil.which("nvidia-smi") is None:
        assert facts.gpus is None
        assert "could not read GPUs on host local: nvidia-smi not found" in facts.problems
    if shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists():
        assert facts.nvcc_version is None
    else:
        assert facts.nvcc_version and facts.nvcc_version[0].isdigit()
    unexpected = [p for p in facts.problems if "GPUs" not in p and "nvcc" not in p]
    assert unexpected == []


def test_missing_venv_and_checkout(tmp_path):
    venv = tmp_path / "it's a venv"
    script = facts_script(str(venv), str(tmp_path / "nope"), "sglang", [])
    facts = parse_facts("gpu9", run_script(script))
    assert facts.packages is None and facts.python_version is None
    assert f"could not read packages on host gpu9: venv missing: {venv}" in facts.problems
    assert f"could not read Python version on host gpu9: venv missing: {venv}" in facts.problems
    assert facts.checkout.present is False and facts.checkout.exists is False
    assert facts.disks == []


def test_plain_directory_is_not_a_checkout(tmp_path):
    facts = parse_facts("h", run_script(facts_script(str(tmp_path), str(tmp_path), "sglang", [])))
    assert facts.checkout.present is False and facts.checkout.exists is True


def test_subdirectory_of_a_repo_is_not_a_checkout(checkout):
    sub = checkout / "sub"
    sub.mkdir()
    facts = parse_facts("h", run_script(facts_script("/nonexistent", str(sub), "sglang", [])))
    assert facts.checkout.present is False


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the repo to another user")
def test_repo_owned_by_another_user_is_still_read(checkout):
    subprocess.run(["chown", "-R", "12345:12345", str(checkout)], check=True)
    facts = parse_facts("h", run_script(facts_script("/nonexistent", str(checkout), "sglang", [])))
    assert facts.checkout.present and facts.checkout.head and facts.checkout.modified == ["b.py"]


def test_venv_without_pip_lists_distributions(tmp_path):
    venv = tmp_path / "uvlike"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python*/site-packages"))
    dist = site / "Demo_Pkg-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: Demo_Pkg\nVersion: 1.2.3\n")
    facts = parse_facts("h", run_script(facts_script(str(venv), "/nonexistent", "sglang", [])))
    assert facts.packages == {"demo-pkg": "1.2.3"}


FAKE_SYSTEMCTL = """#!/bin/bash
# stand-in systemctl: knows one unit, whose file is $UNIT_FILE
case "$1" in
  show) [ "${@: -1}" = demo.service ] && echo "$UNIT_FILE" ;;
  is-enabled) [ "${@: -1}" = demo.service ] && echo enabled || { echo "Failed to get unit file state" >&2; exit 1; } ;;
  is-active) [ "${@: -1}" = demo.service ] && echo active || { echo inactive; exit 3; } ;;
esac
"""


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_unit_with_systemd(tmp_path):
    import hashlib

    unit = tmp_path / "demo.service"
    unit.write_text("[Service]\nExecStart=/bin/true\n")
    fake = tmp_path / "systemctl"
    fake.write_text(FAKE_SYSTEMCTL)
    fake.chmod(0o755)
    script = tmp_path / "facts.sh"
    script.write_text(facts_script("/nonexistent", "/nonexistent", "demo", []))
    # a private mount namespace: /run and systemctl are replaced for this one run only
    inner = (f"mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && "
             f"mount --bind {fake} $(command -v systemctl || echo /usr/bin/systemctl) && bash {script}")
    if shutil.which("systemctl") is None:
        pytest.skip("no systemctl binary to stand in for")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c", inner], capture_output=True,
                          text=True, env={**os.environ, "UNIT_FILE": str(unit)}, timeout=120)
    if proc.returncode != 0 and "Operation not permitted" in proc.stderr:
        pytest.skip("mount namespaces are not allowed here")
    facts = parse_facts("h", proc.stdout)
    assert facts.unit.model_dump() == {"systemd": True, "present": True, "enabled": "enabled", "active": "active",
                                       "sha256": hashlib.sha256(unit.read_bytes()).hexdigest(), "path": str(unit)}
    other = tmp_path / "other.sh"
    other.write_text(facts_script("/nonexistent", "/nonexistent", "missing", []))
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "bash", "-c",
                           inner.replace(str(script), str(other))],
                          capture_output=True, text=True, env={**os.environ, "UNIT_FILE": str(unit)}, timeout=120)
    missing = parse_facts("h", proc.stdout).unit
    assert (missing.systemd, missing.present, missing.enabled, missing.active) == (True, False, "not-found", "inactive")


# answers --query-gpu only once the --version call (a later section) has run: sections one after another never see it
RENDEZVOUS_SMI = """#!/bin/bash
case "$1" in
  --version) touch "$RENDEZVOUS"; echo "DRIVER version                     : 580.95.05"; echo "CUDA Version : 13.0" ;;
  --query-gpu=*)
    for _ in $(seq 100); do
      [ -e "$RENDEZVOUS" ] && { echo "0, NVIDIA RTX PRO 6000, 12.0, 580.95.05, 97887"; exit 0; }
      sleep 0.05
    done
    echo "alone: the --version section had not started"; exit 1 ;;
esac
"""


def _rendezvous(tmp_path: Path) -> dict[str, str]:
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # the facts script puts these first
    if shutil.which("nvidia-smi", path=system):
        pytest.skip("a real nvidia-smi would answer before the stand-in")
    fake = tmp_path / "bin" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(RENDEZVOUS_SMI)
    fake.chmod(0o755)
    return {"PATH": f"{os.environ['PATH']}:{fake.parent}", "RENDEZVOUS": str(tmp_path / "met")}


def run_with(script: str, env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True, timeout=300,
                          env={**base, **env})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout + proc.stderr


def test_sections_run_side_by_side(tmp_path):
    env = _rendezvous(tmp_path)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    out = run_with(facts_script("/nonexistent", "/nonexistent", "sglang", []), {**env, "TMPDIR": str(tmp)})
    sections = parse_sections(out)
    query = sections["gpu-query"]
    assert (query.rc, query.text.strip()) == (0, "0, NVIDIA RTX PRO 6000, 12.0, 580.95.05, 97887")
    assert tuple(sections) == SECTIONS
    assert list(tmp.iterdir()) == []  # the sections' files are gone with the script


def test_one_after_another_without_a_temporary_directory(tmp_path, venv, checkout):
    env = _rendezvous(tmp_path)
    script = facts_script(str(venv), str(checkout), "sglang", [str(tmp_path)])
    alone = parse_sections(run_with(script, {**env, "TMPDIR": str(tmp_path / "missing")}))
    (tmp_path / "met").unlink()
    side = parse_sections(run_with(script, env))
    assert alone["gpu-query"].rc == 1 and alone["gpu-query"].text.startswith("alone")
    assert side["gpu-query"].rc == 0
    assert tuple(alone) == tuple(side) == SECTIONS
    steady = [name for name in SECTIONS if name not in ("gpu-query", "mem", "disk")]  # free memory and disk move
    assert {n: alone[n] for n in steady} == {n: side[n] for n in steady}
