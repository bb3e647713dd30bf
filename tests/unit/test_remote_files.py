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
