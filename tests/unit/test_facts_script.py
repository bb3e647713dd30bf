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


def _stashes(checkout: Path) -> list[str]:
    return parse_facts("h", run_script(facts_script("/nonexistent", str(checkout), "sglang", []))).checkout.stashes


def test_stashes_after_a_pop_and_in_a_worktree(checkout):
    """The stash list is skipped only where it would be empty (no stash reflog in a .git directory); a worktree
    (.git is a file) and a second stash are still listed as git lists them."""
    git(checkout, "stash", "push", "-q", "-m", "second")
    assert [s.split(":", 1)[0] for s in _stashes(checkout)] == ["stash@{0}", "stash@{1}"]
    assert _stashes(checkout)[0] == "stash@{0}: On main: second"
    tree = checkout.parent / "tree"
    git(checkout, "worktree", "add", "-q", str(tree))
    assert (tree / ".git").is_file() and len(_stashes(tree)) == 2  # one stash list for all worktrees
    git(checkout, "stash", "drop", "-q")
    git(checkout, "stash", "pop", "-q")
    assert not (checkout / ".git" / "logs" / "refs" / "stash").exists()
    assert _stashes(checkout) == [] and _stashes(tree) == []
    (tree / "a.py").write_text("edited in the worktree\n")
    git(tree, "stash", "push", "-q", "-m", "from the worktree")
    assert _stashes(checkout) == _stashes(tree) == ["stash@{0}: On tree: from the worktree"]


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
# stand-in systemctl: knows one unit, whose file is $UNIT_FILE; `show` answers as systemd 252 does (every property
# asked, in systemd's own order; a unit it does not know has an empty file and state, and is inactive)
case "$1" in
  show)
    [ "${@: -1}" = demo.service ] && known=1 || known=
    for p in ActiveState FragmentPath UnitFileState; do
      case " $* " in *" -p $p "*) ;; *) continue ;; esac
      case "$p,$known" in
        ActiveState,1) echo ActiveState=active ;; ActiveState,) echo ActiveState=inactive ;;
        FragmentPath,1) echo "FragmentPath=$UNIT_FILE" ;; FragmentPath,) echo FragmentPath= ;;
        UnitFileState,1) echo UnitFileState=enabled ;; UnitFileState,) echo UnitFileState= ;;
      esac
    done ;;
  *) echo "stand-in systemctl: only show" >&2; exit 1 ;;
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


def test_side_by_side_where_nothing_can_be_written(tmp_path, venv, checkout):
    """Pipes, not files: a missing TMPDIR changes nothing, and two reads give the same sections."""
    env = _rendezvous(tmp_path)
    script = facts_script(str(venv), str(checkout), "sglang", [str(tmp_path)])
    first = parse_sections(run_with(script, {**env, "TMPDIR": str(tmp_path / "missing")}))
    second = parse_sections(run_with(script, env))
    assert first["gpu-query"].rc == second["gpu-query"].rc == 0
    assert tuple(first) == tuple(second) == SECTIONS
    steady = [name for name in SECTIONS if name not in ("mem", "disk")]  # free memory and disk move
    assert {n: first[n] for n in steady} == {n: second[n] for n in steady}


def _sections(calls: str) -> dict:
    from gpufleet import remote

    library = remote.text("side_by_side.sh") + remote.text("facts.sh")
    return parse_sections(run_script(library + calls + "\ngf_sections_end\n"))


def test_a_section_larger_than_a_pipe_holds_waits_its_turn():
    out = _sections("gf_section big bash -c 'head -c 300000 /dev/zero | tr \"\\0\" x; echo; exit 3'\n"
                    "gf_section small echo hi\n"
                    "gf_section empty true\n")
    assert list(out) == ["big", "small", "empty"]
    assert (out["big"].rc, out["big"].text.strip()) == (3, "x" * 300000)
    assert (out["small"].rc, out["small"].text.strip()) == (0, "hi")
    assert (out["empty"].rc, out["empty"].text.strip()) == (0, "")


def test_a_section_killed_before_its_exit_code_is_255():
    out = _sections("gf_section dead eval 'echo partial; kill -9 $BASHPID'\ngf_section after echo fine\n")
    assert (out["dead"].rc, out["dead"].text.strip()) == (255, "partial")
    assert (out["after"].rc, out["after"].text.strip()) == (0, "fine")


def _gone(pid: int, within: float = 10.0) -> bool:
    """The process has ended and been reaped (a killed orphan is reaped by whoever adopts it)."""
    import time

    end = time.monotonic() + within
    while time.monotonic() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_a_section_still_running_at_the_deadline_is_stopped_with_all_under_it(tmp_path):
    """One deadline for the script (no `timeout` around each command): the hung section reads as 124 with what it
    printed, the sleep it started is killed too, and the others are read as they are."""
    import time

    started = time.monotonic()
    out = _sections("gf_limit 2\n"
                    f"gf_section hung bash -c 'echo started; sleep 300 & echo $! > {tmp_path}/hung.pid; wait'\n"
                    "gf_section fine echo fine\n"
                    f"gf_section quiet bash -c 'sleep 300 & echo $! > {tmp_path}/quiet.pid; wait'\n")
    assert time.monotonic() - started < 60
    assert list(out) == ["hung", "fine", "quiet"]
    assert (out["hung"].rc, out["hung"].text.strip()) == (124, "started\ngpufleet: still running after 2s: stopped")
    assert (out["fine"].rc, out["fine"].text.strip()) == (0, "fine")
    assert (out["quiet"].rc, out["quiet"].text.strip()) == (124, "gpufleet: still running after 2s: stopped")
    sleeps = [int((tmp_path / f"{name}.pid").read_text()) for name in ("hung", "quiet")]
    assert all(_gone(pid) for pid in sleeps)


def test_sections_within_the_deadline_are_read_whole():
    out = _sections("gf_limit 30\ngf_section slowish bash -c 'sleep 1; echo done; exit 4'\ngf_section quick true\n")
    assert (out["slowish"].rc, out["slowish"].text.strip()) == (4, "done")
    assert (out["quick"].rc, out["quick"].text.strip()) == (0, "")


def test_output_ending_like_an_exit_code_is_kept():
    out = _sections("gf_section tricky printf 'a\\n@@gpufleet-rc=7\\nb'\n")
    assert (out["tricky"].rc, out["tricky"].text.rstrip("\n")) == (0, "a\n@@gpufleet-rc=7\nb")


# a stand-in nvidia-smi that counts its --version calls in $SMI_CALLS and answers as driver 580 does
COUNTING_SMI = """#!/bin/bash
case "$1" in
  --version) echo version >> "$SMI_CALLS"; [ -n "$SMI_FAIL" ] && { echo "NVIDIA-SMI has failed"; exit 9; }
             printf 'NVIDIA-SMI version  : 580.95.05\\nDRIVER version      : 580.95.05\\nCUDA Version        : %s\\n' "$CUDA" ;;
  --query-gpu=*) echo "0, NVIDIA RTX PRO 6000, GPU-1, 00000000:01:00.0, 12.0, 580.95.05, 97887" ;;
esac
"""


@pytest.fixture
def counting_smi(tmp_path) -> dict:
    system = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    if shutil.which("nvidia-smi", path=system):
        pytest.skip("a real nvidia-smi would answer before the stand-in")
    fake = tmp_path / "smi" / "nvidia-smi"
    fake.parent.mkdir()
    fake.write_text(COUNTING_SMI)
    fake.chmod(0o755)
    module = tmp_path / "nvidia-version"
    module.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build\n"
                      "GCC version:  gcc version 12.3.0\n")
    return {"PATH": f"{os.environ['PATH']}:{fake.parent}", "SMI_CALLS": str(tmp_path / "calls"), "CUDA": "13.0",
            "GPUFLEET_HOST_CACHE": str(tmp_path / "cache"), "module": str(module)}


def _header(env: dict) -> tuple[str, int]:
    """The parsed CUDA version, and how many times nvidia-smi --version has been asked so far."""
    script = facts_script("/nonexistent", "/nonexistent", "sglang", []).replace(
        "gf_gpu_header /proc/driver/nvidia/version", f"gf_gpu_header {env['module']}")
    out = run_with(script, {k: v for k, v in env.items() if k != "module"})
    calls = Path(env["SMI_CALLS"])
    return parse_facts("h", out).gpus.cuda_version, len(calls.read_text().splitlines()) if calls.exists() else 0


def test_cuda_version_is_asked_once_per_driver(counting_smi):
    env = counting_smi
    assert _header(env) == ("13.0", 1)
    env["CUDA"] = "99.9"  # what a fresh ask would say: the remembered answer is given instead
    assert _header(env) == ("13.0", 1)
    assert _header(env) == ("13.0", 1)
    Path(env["module"]).write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  590.10  Release Build\n")
    assert _header(env) == ("99.9", 2)  # another driver loaded: asked afresh
    assert _header(env) == ("99.9", 2)
    assert oct(Path(env["GPUFLEET_HOST_CACHE"]).stat().st_mode & 0o777) == "0o700"
    assert [p.name for p in Path(env["GPUFLEET_HOST_CACHE"]).iterdir()] == ["driver-cuda"]


def test_cuda_version_is_asked_each_time_without_the_module_file(counting_smi):
    env = {**counting_smi, "module": "/nonexistent/nvidia/version"}
    assert _header(env) == ("13.0", 1)
    assert _header(env) == ("13.0", 2)
    assert not Path(env["GPUFLEET_HOST_CACHE"]).exists()


def test_a_failed_or_unkept_answer_is_not_remembered(counting_smi, tmp_path):
    env = {**counting_smi, "SMI_FAIL": "1"}
    script = facts_script("/nonexistent", "/nonexistent", "sglang", []).replace(
        "/proc/driver/nvidia/version", env["module"])
    failed = parse_sections(run_with(script, {k: v for k, v in env.items() if k != "module"}))["gpu-header"]
    assert (failed.rc, failed.text.strip()) == (9, "NVIDIA-SMI has failed")
    assert not Path(env["GPUFLEET_HOST_CACHE"]).exists()
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    env = {**counting_smi, "GPUFLEET_HOST_CACHE": str(blocked / "cache")}  # cannot be made: asked every time
    assert _header(env)[0] == "13.0"
    assert _header(env)[0] == "13.0"
    assert len(Path(env["SMI_CALLS"]).read_text().splitlines()) == 3


def _disk(paths: list[str], prelude: str = "", env: dict | None = None) -> str:
    """The disk section's function run by bash (stderr into stdout, as a section runs), then its exit code."""
    from gpufleet import remote

    script = remote.text("facts.sh") + prelude + '\ngf_disk "$@" 2>&1\necho "rc=$?"\n'
    return subprocess.run(["bash", "-c", script, "disk", *paths], capture_output=True, text=True, check=True,
                          env={**os.environ, **(env or {})}).stdout


def test_one_df_for_every_disk_path_reads_as_one_each(tmp_path):
    """The disk section asks df once for all paths; parsed, it is what a df a path gave (the walk up included)."""
    from gpufleet.facts.system import parse_disks

    paths = [str(tmp_path), "/", str(tmp_path / "not" / "there"), "/dev/shm", "relative/one"]
    one_each = '\ndf() { if [ $# -gt 3 ]; then return 1; fi; command df "$@"; }'  # a batch fails: the old way
    together, apart = _disk(paths), _disk(paths, one_each)
    assert together.endswith("rc=0\n") and apart.endswith("rc=0\n")
    assert parse_disks(together, "h") == parse_disks(apart, "h")
    assert [d.path for d in parse_disks(together, "h")] == paths
    short = '\ndf() { command df "$@" | head -n 2; }'  # a batch answered with a row missing: each path asked again
    assert parse_disks(_disk(paths, short), "h") == parse_disks(apart, "h")
    calls = tmp_path / "calls"
    _disk(paths, '\ndf() { echo call >> "$DF_CALLS"; command df "$@"; }', {"DF_CALLS": str(calls)})
    assert calls.read_text() == "call\n"


def test_a_df_that_fails_for_one_path_still_answers_the_others(tmp_path):
    failing = '\ndf() { case " $* " in *" /dev/shm "*) echo "df: /dev/shm: boom" >&2; return 1 ;; esac; ' \
              'command df "$@"; }'
    out = _disk([str(tmp_path), "/dev/shm", "/"], failing)
    assert out.endswith("rc=1\n")
    assert out.count("Filesystem") == 2
    assert out.index("path=/dev/shm") < out.index("df: /dev/shm: boom") < out.index("path=/\n")
