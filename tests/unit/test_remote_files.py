"""Every file under gpufleet/remote/ parses (bash -n, compile), and a few cheap ones run on sample input."""

import importlib.util
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import remote
from gpufleet.fleet.hoststate import Claim

NAMES = remote.names()


def test_the_loader_finds_the_files():
    assert {"facts.sh", "torch_report.py", "model_check.py", "push_check.sh", "snapshot.sh"} <= set(NAMES)


@pytest.mark.parametrize("name", [n for n in NAMES if n.endswith(".sh")])
def test_bash_parses(name):
    proc = subprocess.run(["bash", "-n", "-c", remote.text(name)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", [n for n in NAMES if n.endswith(".py")])
def test_python_compiles(name):
    compile(remote.text(name), name, "exec")


@pytest.mark.parametrize("name", NAMES)
def test_header_says_what_it_does(name):
    lines = remote.text(name).splitlines()
    comments = [line for line in lines[:4] if line.startswith(("# ", '"""')) and not line.startswith("#!")]
    assert comments, f"{name} has no header comment"


def run(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", remote.text(name), name, *args], capture_output=True, text=True, timeout=60)


def test_host_claim_refuses_a_second_holder(tmp_path):
    lock = str(tmp_path / "state" / "lock")
    assert run("host_claim.sh", "holder=a\ntoken=t1\n", lock, "3").returncode == 0
    second = run("host_claim.sh", "holder=b\n", lock, "3")
    assert second.returncode == 3 and "holder=a" in second.stdout
    held = Claim.parse(run("host_claim_read.sh", lock).stdout)
    assert held.text == f"holder=a\ntoken=t1\nboot_id={held.boot_now}\n"
    assert held.boot_now == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    run("host_release.sh", "t2", lock)  # not its token: the lock stays
    assert run("host_claim_read.sh", lock).returncode == 0
    run("host_release.sh", "t1", lock)
    assert run("host_claim_read.sh", lock).returncode == 1


def test_audit_append(tmp_path):
    log = tmp_path / "gpufleet" / "audit.log"
    run("audit_append.sh", str(log), '{"a": 1}')
    run("audit_append.sh", str(log), '{"b": 2}')
    assert log.read_text() == '{"a": 1}\n{"b": 2}\n'


def test_port_free_sees_a_listener(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = str(s.getsockname()[1])
        busy = run("port_free.sh", "127.0.0.1", port, "1")
        assert busy.returncode == 1 and "still listens" in busy.stdout
    assert run("port_free.sh", "127.0.0.1", port, "1").stdout.strip() == f"127.0.0.1:{port} is free"


def test_requirements_present(tmp_path):
    code = remote.text("requirements_present.py")
    if importlib.util.find_spec("pip") is None:  # the script reads requirements with pip's vendored packaging
        pytest.skip("no pip here")
    ok = subprocess.run([sys.executable, "-c", code, "pytest>=1"], capture_output=True)
    missing = subprocess.run([sys.executable, "-c", code, "pytest>=1", "no-such-dist-gpufleet"], capture_output=True)
    assert (ok.returncode, missing.returncode) == (0, 1)


def test_kernel_installed_says_needed_until_the_record_is_this_builds(tmp_path):
    import json
    import sys

    record = tmp_path / "sgl-kernel-build.json"

    def kernel_installed(*args):
        return subprocess.run([sys.executable, "-c", remote.text("kernel_installed.py"), *args],
                              capture_output=True, text=True, timeout=60)

    assert kernel_installed("needed", str(record), "k1").returncode == 0  # no record yet
    record.write_text(json.dumps({"key": "k1" * 10, "archs": ["sm_120a"], "fp4": True,
                                  "fp4_ops": {"scaled_fp4_quant": "torch.ops.sgl_kernel"}}))
    assert kernel_installed("needed", str(record), "k1" * 10).returncode == 1
    assert kernel_installed("needed", str(record), "k2").returncode == 0
    ok = kernel_installed("verify", str(record), "k1" * 10, "1")
    assert ok.returncode == 0 and ok.stdout == "sgl-kernel build k1k1k1k1k1k1 targets sm_120a fp4 ops in torch.ops.sgl_kernel\n"
    assert "another build" in kernel_installed("verify", str(record), "k2", "0").stderr
    record.write_text(json.dumps({"key": "k3", "fp4": False}))
    assert "no FP4 ops" in kernel_installed("verify", str(record), "k3", "1").stderr


def _kernel_tree(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    text = remote.text("job_state.sh") + remote.text("kernel_tree.sh") + 'kernel_tree "$@"\n'
    return subprocess.run(["bash", "-c", text, "kernel-tree", *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/local/bin:/usr/bin:/bin", **(env or {})})


def _every_file(root):
    """Each path under root (the .git too) with its type, mode, owner, mtime and bytes: byte-identical or not."""
    import os

    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            body = os.readlink(p) if os.path.islink(p) else (open(p, "rb").read() if os.path.isfile(p) else None)
            found[os.path.relpath(p, root)] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns, body)
    return found


def test_kernel_tree_builds_from_heads_tree_and_never_writes_the_checkout(tmp_path):
    """The sgl-kernel build's tree, made for real from a git checkout at a hostile path owned by another user:
    HEAD's kernel directory (not the working tree's edits), what its CMakeLists reads outside it and its in-repo
    symlink targets, the site patch applied there; the checkout and its .git stay byte-identical; a re-run keeps
    the tree of a running or finished job and makes a half-made or failed one again."""
    import os
    import shutil
    from pathlib import Path

    if os.geteuid() != 0:
        pytest.skip("needs root to hand the checkout to another user")
    repo_root = Path(__file__).resolve().parents[2]
    hostile = tmp_path / "co $(touch \"$CANARY\") ';`touch \"$CANARY\"` \"x"
    co, canary = hostile / "sglang", tmp_path / "canary"
    shutil.copytree(repo_root / "gpufleet/sim/payload/sglang/sgl-kernel", co / "sgl-kernel")
    (co / "LICENSE").write_text("Apache-2.0\n")
    os.symlink("../LICENSE", co / "sgl-kernel/LICENSE")
    (co / "jit/include").mkdir(parents=True)
    (co / "jit/include/h.h").write_text("#pragma once\n")
    (co / "python").mkdir()
    (co / "python/not_needed.py").write_text("x = 1\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "-C", str(co)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    tree_sha = subprocess.run([*git, "rev-parse", "HEAD:sgl-kernel"], capture_output=True, text=True).stdout.strip()
    head_cmake = (co / "sgl-kernel/CMakeLists.txt").read_text()
    with open(co / "sgl-kernel/CMakeLists.txt", "a") as f:  # a local edit: not in the key, so not in the build
        f.write("# local edit\n")
    (co / "sgl-kernel/untracked.txt").write_text("local\n")
    subprocess.run(["chown", "-R", "-h", "65534:65534", str(co)], check=True)
    before = _every_file(co)

    builds = hostile / "builds" / "k"
    tree, rc, pid = builds / "src", builds / "exit-code", builds / "pid"
    patch = repo_root / "patches/sgl-kernel/0001-fa3-can-be-turned-off.patch"
    args = [str(co), str(tree), tree_sha, str(rc), "gpufleet-build-test-none", str(pid), "sgl-kernel", "jit/include",
            "not/there", "--", patch.name, patch.read_text()]
    env = {"CANARY": str(canary)}
    made = _kernel_tree(*args, env=env)
    assert made.returncode == 0, made.stdout + made.stderr
    assert f"applied: {patch.name}" in made.stdout and "not at HEAD, not exported: not/there" in made.stdout
    built = (tree / "sgl-kernel/CMakeLists.txt").read_text()
    assert "SGL_KERNEL_FORCE_FA3" in built and "# local edit" not in built
    added = [line[1:] for line in patch.read_text().splitlines() if line.startswith("+") and not line.startswith("++")]
    assert [line for line in built.splitlines() if line not in head_cmake.splitlines()] == added
    assert (tree / "sgl-kernel/LICENSE").read_text() == "Apache-2.0\n"  # the symlink's in-repo target came along
    assert (tree / "jit/include/h.h").exists()
    assert sorted(p.name for p in tree.iterdir()) == ["LICENSE", "jit", "sgl-kernel"]  # nothing else, no .git
    assert not (tree / "sgl-kernel/untracked.txt").exists()
    assert _every_file(co) == before and not canary.exists()

    # re-runs: a half-made tree and an old one with no job behind them are made again
    (tree / "junk").write_text("half\n")
    (builds / "src.partial.1").mkdir()
    again = _kernel_tree(*args, env=env)
    assert again.returncode == 0 and not (tree / "junk").exists() and not (builds / "src.partial.1").exists()
    # ... the tree of a running job (its pid alive) or of one that finished with 0 is the job's: left alone
    (tree / "junk").write_text("the job's\n")
    pid.write_text(f"{os.getpid()}\n")
    kept = _kernel_tree(*args, env=env)
    assert kept.stdout.strip() == "build tree left as it is: the build job is running" and (tree / "junk").exists()
    pid.unlink()
    rc.write_text("0\n")
    assert "the build job is finished" in _kernel_tree(*args, env=env).stdout and (tree / "junk").exists()
    rc.write_text("2\n")  # a failed build: made again for the retry
    assert _kernel_tree(*args, env=env).returncode == 0 and not (tree / "junk").exists()
    rc.unlink()

    # a patch that does not apply: named, no tree left behind, the checkout untouched
    broken = _kernel_tree(*args[:-2], "0002-broken.patch", "--- a/CMakeLists.txt\n+++ b/CMakeLists.txt\n"
                          "@@ -1,1 +1,1 @@\n-no such line\n+x\n", env=env)
    assert broken.returncode == 1 and "patch 0002-broken.patch does not apply to sgl-kernel at HEAD" in broken.stdout
    assert not tree.exists() and not list(builds.glob("src.partial.*"))
    # a HEAD that moved since the plan (another tree than the key's) is refused
    moved = _kernel_tree(*args[:2], "0" * 40, *args[3:], env=env)
    assert moved.returncode == 1 and "moved since the plan" in moved.stdout
    assert _every_file(co) == before and not canary.exists()


def _run_remote(name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", remote.text(name), name, *args], capture_output=True, text=True, timeout=60)


def test_kernel_probe_gives_heads_texts_and_the_records_byte_for_byte(tmp_path):
    """kernel_probe.sh, for real on a git checkout: the first candidate whose pyproject names sgl-kernel, its tree,
    its pyproject and CMakeLists at HEAD exactly as git holds them (odd trailing newlines kept), both records."""
    co = tmp_path / "co"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "-C", str(co)]
    (co / "old").mkdir(parents=True)
    (co / "old/pyproject.toml").write_text('[project]\nname = "something-else"\n')
    kernel = co / "python/sglang/kernels/aot"
    kernel.mkdir(parents=True)
    pyproject = '[build-system]\nrequires = ["x"]\n\n[project]\nname = "sglang-kernel"\nversion = "0.4.0"\n\n\n'
    (kernel / "pyproject.toml").write_text(pyproject)
    (kernel / "CMakeLists.txt").write_text("project(x)")  # no newline at the end
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "base"], check=True)
    (kernel / "pyproject.toml").write_text("edited, not committed\n")
    tree = subprocess.run([*git, "rev-parse", "HEAD:python/sglang/kernels/aot"], capture_output=True,
                          text=True).stdout.strip()
    installed, record = tmp_path / "installed.json", tmp_path / "record.json"
    installed.write_text('{"key": "k1"}\n')
    record.write_text('{"key": "k1",\n "wheel": "w"}')
    proc = _run_remote("kernel_probe.sh", str(co), "1", str(installed), str(record), "old", "sgl-kernel",
                       "python/sglang/kernels/aot")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"@@dir python/sglang/kernels/aot\n@@tree {tree}\n@@pyproject\n{pyproject}\n"
                           f"@@cmake\nproject(x)\n@@installed\n{installed.read_text()}\n"
                           f"@@record\n{record.read_text()}\n@@end\n")
    brief = _run_remote("kernel_probe.sh", str(co), "", str(tmp_path / "none"), str(record), "old", "sgl-kernel")
    assert brief.stdout == f"@@installed\n\n@@record\n{record.read_text()}\n@@end\n"


def test_server_state_reads_the_files_as_they_are(tmp_path):
    import hashlib

    unit, env, record, kernel = (tmp_path / n for n in ("u.service", "sglang.env", "rec.json", "kernel.json"))
    unit.write_text("[Service]\nExecStart=/bin/true\n\n")
    env.write_text("A=1\n")
    env.chmod(0o640)
    record.write_text('{\n "stack": "x"\n}\n')
    kernel.write_text('{"key": "k"}')
    proc = _run_remote("server_state.sh", str(unit), str(env), str(record), str(kernel), "gpufleet-none.service")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.split("\n@@unit present\n")
    head = dict(line.split("=", 1) for line in lines[0].splitlines() if not line.startswith("need_reload="))
    assert head == {"env_sha": hashlib.sha256(b"A=1\n").hexdigest(), "env_mode": "640",
                    "kernel_sha": hashlib.sha256(b'{"key": "k"}').hexdigest(), "record": '{ "stack": "x"}'}
    assert lines[1] == unit.read_text()
    for p in (unit, env, record, kernel):
        p.unlink()
    gone = _run_remote("server_state.sh", str(unit), str(env), str(record), str(kernel), "gpufleet-none.service")
    assert [line for line in gone.stdout.splitlines() if not line.startswith("need_reload=")] == ["@@unit absent"]
