"""The one version rule: on the control node, and as the remote files run it on a host (python3, a sample venv)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import remote
from gpufleet.remote import versions
from gpufleet.remote.versions import covers, versions_match

REMOTE = Path(versions.__file__).parent
NIGHTLY = "2.12.0.dev20260307"


@pytest.mark.parametrize("installed, wanted, match", [
    (NIGHTLY, f"{NIGHTLY}+cu130", True),  # pip's report leaves out torch's label
    (f"{NIGHTLY}+cu130", f"{NIGHTLY}+cu130", True),
    (f"{NIGHTLY}+cu129", f"{NIGHTLY}+cu130", False),  # a label that is there must be the wanted one
    (f"{NIGHTLY}+cu130", NIGHTLY, False),  # an unlabelled pin is not met by a labelled wheel on this side
    ("2.12.0.dev20260306", f"{NIGHTLY}+cu130", False),
    (None, NIGHTLY, False),
    ("", NIGHTLY, False),
])
def test_the_rule_on_the_control_node(installed, wanted, match):
    assert versions_match(installed, wanted) is match


def test_a_pin_without_label_covers_what_torch_reports():
    assert covers(NIGHTLY, f"{NIGHTLY}+cu130") and not covers(f"{NIGHTLY}+cu129", f"{NIGHTLY}+cu130")


def site(tmp_path: Path, **dists: str) -> dict:
    """A sample venv's site-packages: just the metadata `importlib.metadata` reads."""
    root = tmp_path / "site"
    for name, version in dists.items():
        info = root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}


def run_file(file: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    """The file as it lies in gpufleet/remote/, beside the modules it imports."""
    return subprocess.run(["python3", str(REMOTE / file), *args], env=env, capture_output=True, text=True, cwd="/")


def run_shipped(file: str, modules: tuple[str, ...], env: dict, *args: str) -> subprocess.CompletedProcess:
    """The file as a host gets it: one `python -c` program with its modules inside."""
    return subprocess.run([sys.executable, "-c", remote.program(file, *modules), *args], env=env, capture_output=True,
                          text=True, cwd="/")


@pytest.mark.parametrize("run", [lambda env, *a: run_file("needs_versions.py", env, *a),
                                 lambda env, *a: run_shipped("needs_versions.py", ("versions.py",), env, *a)])
@pytest.mark.parametrize("installed, needed", [(NIGHTLY, False), (f"{NIGHTLY}+cu130", False),
                                               (f"{NIGHTLY}+cu129", True), ("2.9.1", True)])
def test_needed_check_on_a_host(tmp_path, run, installed, needed):
    env = site(tmp_path, torch=installed, triton="3.6.0")
    proc = run(env, json.dumps({"torch": f"{NIGHTLY}+cu130", "triton": "3.6.0"}))
    assert proc.returncode == (0 if needed else 1), proc.stderr


def test_needed_check_counts_an_absent_distribution_as_needed(tmp_path):
    proc = run_file("needs_versions.py", site(tmp_path, triton="3.6.0"), json.dumps({"torch": NIGHTLY}))
    assert proc.returncode == 0


def test_torch_problems_on_a_host_accept_the_label_the_pin_leaves_out(tmp_path):
    code = ("import json, sys\nsys.path.insert(0, sys.argv[1])\nfrom torch_problems import torch_problems\n"
            "print(json.dumps([torch_problems({'version': v}, {'version': sys.argv[2]}) for v in sys.argv[3:]]))")
    proc = subprocess.run(["python3", "-c", code, str(REMOTE), NIGHTLY, f"{NIGHTLY}+cu130", "2.9.1+cu130"],
                          capture_output=True, text=True, cwd="/")
    ok, old = json.loads(proc.stdout)
    assert ok == [] and old == [f"torch.__version__ is 2.9.1+cu130, stack.toml wants {NIGHTLY}"]


def test_flashinfer_rules_on_a_host_take_an_unlabelled_jit_cache_report(tmp_path):
    want = json.dumps({"flashinfer-python": "0.6.5", "flashinfer-cubin": "0.6.5", "flashinfer-jit-cache": "0.6.5+cu130"})
    fits = run_file("flashinfer_check.py", site(tmp_path, **{"flashinfer-python": "0.6.5", "flashinfer-cubin": "0.6.5",
                                                             "flashinfer-jit-cache": "0.6.5"}), want)
    # the versions fit; only the import is left to fail (the sample venv has metadata, no module)
    assert fits.returncode == 1 and fits.stdout.startswith("import flashinfer failed"), fits.stdout + fits.stderr
    other = run_file("flashinfer_check.py", site(tmp_path / "b", **{"flashinfer-python": "0.6.5",
                                                                    "flashinfer-cubin": "0.6.5",
                                                                    "flashinfer-jit-cache": "0.6.5+cu129"}), want)
    assert "flashinfer-jit-cache is 0.6.5+cu129, stack.toml wants 0.6.5+cu130" in other.stdout
