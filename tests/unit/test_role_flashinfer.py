"""The flashinfer planner with fake facts (no SSH), and its version rules run here against stand-in packages."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.testing.context import plan_context
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged, Upload
from gpufleet.sim import wheels
from gpufleet.engine.ssh import Result
from gpufleet.config.stack import FLASHINFER_CU130, PYPI, Stack, stack_for_host
from gpufleet.roles import flashinfer
from tests.unit.pipfakes import RESOLVER, report, resolving_probe

OLD = {"flashinfer-python": "0.6.4", "flashinfer-cubin": "0.6.4", "flashinfer-jit-cache": "0.6.4+cu130",
       "pip": "24.0", "torch": "2.12.0.dev20260307+cu130"}
NEW = {**OLD, "flashinfer-python": "0.6.5", "flashinfer-cubin": "0.6.5", "flashinfer-jit-cache": "0.6.5+cu130"}
SHA = "ab" * 32
JIT_URL = ("https://github.com/flashinfer-ai/flashinfer/releases/download/v0.6.5/"
           "flashinfer_jit_cache-0.6.5%2Bcu130-cp39-abi3-manylinux_2_28_x86_64.whl")


def ctx(packages=OLD, *, stack=None, probe=None) -> PlanContext:
    return plan_context(stack=stack, packages=packages, read=probe, resolver=lambda: RESOLVER)


def with_overrides(over: dict) -> Stack:
    return stack_for_host(Stack(), over, source="hosts.toml", host="gpu1")


def probe_answering(code: int):
    def probe(cmd, step):
        return Result("gpu1", step, cmd.display(), code, "", 0.0)
    return probe


def test_all_three_at_target_is_unchanged_and_cache_left_alone():
    items = flashinfer.plan(ctx(NEW, probe=probe_answering(1)))
    assert items == [
        Unchanged("flashinfer", "flashinfer-python and flashinfer-cubin 0.6.5, flashinfer-jit-cache 0.6.5+cu130 "
                                "already installed"),
        Unchanged("flashinfer", "the JIT cache holds nothing older than the installed flashinfer")]


def test_stale_jit_cache_is_cleared_even_when_versions_match():
    install_ok, clear = flashinfer.plan(ctx(NEW, probe=probe_answering(0)))
    assert isinstance(install_ok, Unchanged) and isinstance(clear, Step)
    assert "older than the installed flashinfer" in clear.reason


THREE = (("flashinfer-python", "0.6.5"), ("flashinfer-cubin", "0.6.5"), ("flashinfer-jit-cache", "0.6.5+cu130"))


def planned(packages=OLD, *, stack=None, answer=None):
    probe = resolving_probe({"flashinfer": answer if answer is not None else report(*THREE, ("ninja", "1.13.0"))})
    items = flashinfer.plan(ctx(packages, stack=stack, probe=probe))
    return items, probe


def resolve_argv(probe) -> list:
    [(step, cmd)] = [a for a in probe.asked if ": resolve " in a[0]]
    return list(cmd.argv)


def test_old_versions_give_install_then_cache_clear():
    (install, clear), probe = planned()
    assert install.title == "install flashinfer 0.6.5 (python, cubin, jit-cache 0.6.5+cu130)"
    assert install.reason == ("venv has flashinfer-python 0.6.4, flashinfer-cubin 0.6.4, flashinfer-jit-cache "
                              "0.6.4+cu130; stack.toml wants flashinfer-python 0.6.5, flashinfer-cubin 0.6.5, "
                              "flashinfer-jit-cache 0.6.5+cu130 (the three move together; brings ninja); 4 wheel(s) "
                              "handed over by the control node")
    argv = resolve_argv(probe)
    assert argv[-3:] == ["flashinfer-python==0.6.5", "flashinfer-cubin==0.6.5", "flashinfer-jit-cache==0.6.5+cu130"]
    assert argv[argv.index("--index-url") + 1] == PYPI
    assert argv[argv.index("--extra-index-url") + 1] == FLASHINFER_CU130
    install_argv = list(install.commands[0].argv)
    assert install_argv[install_argv.index("--no-index"):] == [
        "--no-index", "--find-links", "/var/cache/gpufleet/wheels", "flashinfer-python==0.6.5",
        "flashinfer-cubin==0.6.5", "flashinfer-jit-cache==0.6.5+cu130", "ninja==1.13.0"]
    assert install.changes == ("venv",)
    assert [u.name for u in install.uploads] == ["pip", "flashinfer-python", "flashinfer-cubin",
                                                 "flashinfer-jit-cache", "ninja"]
    assert clear.title.startswith("clear flashinfer's JIT cache")
    assert clear.reason == "kernels JIT-compiled by flashinfer 0.6.4 must not be reused by 0.6.5"
    assert clear.commands[0].render() == "bash -c 'rm -rf -- \"$HOME/.cache/flashinfer\"'"
    assert clear.needed is not None


def test_one_package_off_is_enough_to_install_all_three():
    [install, _], probe = planned({**NEW, "flashinfer-cubin": "0.6.4"})
    reqs = [a for a in resolve_argv(probe) if isinstance(a, str) and "==" in a]
    assert reqs == ["flashinfer-python==0.6.5", "flashinfer-cubin==0.6.5", "flashinfer-jit-cache==0.6.5+cu130"]


def test_absent_packages_are_installed():
    (install, _), _ = planned({"pip": "24.0"})
    assert "flashinfer-python (absent)" in install.reason


def test_same_index_for_all_gives_no_extra_index():
    idx = "http://10.0.0.1:8765/simple"
    stack = with_overrides({"flashinfer": {p: {"index_url": idx} for p in ("python", "cubin", "jit_cache")},
                            "pip": {"trusted_hosts": ["10.0.0.1"]}})
    _, probe = planned(stack=stack)
    argv = resolve_argv(probe)
    assert "--extra-index-url" not in argv
    assert argv[argv.index("--index-url") + 1] == idx and argv[argv.index("--trusted-host") + 1] == "10.0.0.1"


def test_jit_cache_from_url_is_uploaded_and_installed_as_a_file():
    stack = with_overrides({"flashinfer": {"jit_cache": {"url": JIT_URL, "sha256": SHA}}})
    (install, _), probe = planned(stack=stack, answer=report(*THREE[:2]))
    remote = "/var/cache/gpufleet/wheels/flashinfer_jit_cache-0.6.5+cu130-cp39-abi3-manylinux_2_28_x86_64.whl"
    assert install.uploads[-1] == Upload(JIT_URL, SHA, remote, "flashinfer-jit-cache", "0.6.5+cu130")
    argv = resolve_argv(probe)
    assert "flashinfer-jit-cache==0.6.5+cu130" not in argv  # not resolved from an index: its pinned file is used
    assert argv[argv.index("--index-url") + 1] == PYPI and "--extra-index-url" not in argv
    assert install.commands[0].argv[-1] == remote


def test_unreadable_packages_is_a_plan_error():
    with pytest.raises(PlanError, match="flashinfer"):
        flashinfer.plan(ctx(None))


# --- the version rules, run here against stand-in packages --------------------------------------------------------

def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{wheels.dist_name(name)}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def _stand_ins(site: Path, python: str, cubin: str, jit: str) -> dict:
    files = {**wheels.package_files("flashinfer", {"VERSION": python, "GIT_VERSION": "0"}),
             **wheels.package_files("flashinfer_cubin", {"VERSION": cubin}),
             **wheels.package_files("flashinfer_jit_cache", {"VERSION": jit})}
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)
    for name, version in (("flashinfer-python", python), ("flashinfer-cubin", cubin), ("flashinfer-jit-cache", jit)):
        _dist(site, name, version)
    return {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}


def _rules(tmp_path, python, cubin, jit) -> subprocess.CompletedProcess:
    env = _stand_ins(tmp_path, python, cubin, jit)
    _, dash_c, code, arg = flashinfer.rules_cmd(ctx()).argv
    return subprocess.run([sys.executable, dash_c, code, arg], env=env, cwd=tmp_path, capture_output=True, text=True)


def test_rules_pass_for_matching_versions(tmp_path):
    proc = _rules(tmp_path, "0.6.5", "0.6.5", "0.6.5+cu130")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "flashinfer 0.6.5 imports" in proc.stdout


def test_rules_name_the_three_versions_on_mismatch(tmp_path):
    proc = _rules(tmp_path, "0.6.5", "0.6.4", "0.6.5+cu130")
    assert proc.returncode == 1
    assert ("flashinfer-python 0.6.5, flashinfer-cubin 0.6.4, flashinfer-jit-cache 0.6.5+cu130" in proc.stdout)
    assert "flashinfer-cubin must equal flashinfer-python" in proc.stdout


def test_rules_catch_a_stale_jit_cache(tmp_path):
    proc = _rules(tmp_path, "0.6.5", "0.6.5", "0.6.4+cu130")
    assert proc.returncode == 1
    assert "flashinfer-jit-cache's public version must equal flashinfer-python" in proc.stdout
    assert "flashinfer-jit-cache is 0.6.4+cu130, stack.toml wants 0.6.5+cu130" in proc.stdout


def test_stale_cache_check_compares_with_the_install_time(tmp_path):
    home, venv = tmp_path / "home", tmp_path / "venv"
    info = venv / "lib/python3.11/site-packages/flashinfer_python-0.6.5.dist-info"
    info.mkdir(parents=True)
    cache = home / ".cache/flashinfer/0.6.4"
    cmd = flashinfer.stale_cache_cmd(ctx())
    argv = [str(a) for a in cmd.argv[:-1]] + [str(venv)]

    def check() -> int:
        return subprocess.run(argv, env={"HOME": str(home), "PATH": "/usr/bin:/bin"}).returncode

    assert check() == 1  # no cache dir
    cache.mkdir(parents=True)
    (cache / "old.so").write_text("x")
    os.utime(cache / "old.so", (1, 1))
    os.utime(cache, (1, 1))
    os.utime(cache.parent, (1, 1))
    assert check() == 0  # entries older than the install
    subprocess.run(["rm", "-rf", str(home / ".cache/flashinfer")], check=True)
    (home / ".cache/flashinfer").mkdir()
    (home / ".cache/flashinfer/new.so").write_text("y")
    os.utime(info, (1, 1))
    assert check() == 1  # only entries made after the install
