"""A role added through the registry alone (a throwaway deep_ep package role): plan, status, lock and verify see it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from gpufleet.testing.context import plan_context
from gpufleet import roles as registry
from gpufleet.cli import render
from gpufleet.config.inventory import Host
from gpufleet.config.stack import Section, Stack
from gpufleet.engine.command import Cmd
from gpufleet.facts.model import HostFacts
from gpufleet.fleet.lockstate import locked_stack
from gpufleet.fleet.status import compare, stack_versions
from gpufleet.config.series import patches_digest
from gpufleet.plan import PlanContext, Step, Unchanged
from gpufleet.remote.versions import versions_match
from gpufleet.roleapi import Declares, Import, Package
from gpufleet.roles import sgl_kernel, verify
from gpufleet.roles.pip import installed_packages, needs_versions, normalized
from gpufleet.sim import wheels
from tests.unit.test_lock import made
from tests.unit.test_plan_verify import stack_site

TARGET = wheels.TARGET


class DeepEpStack(Section):
    version: str = "1.2.0"


class SiteStack(Stack):
    """stack.toml with the new role's section (the one edit outside the role besides its registry line)."""

    deep_ep: DeepEpStack = DeepEpStack()


def deep_ep_role() -> SimpleNamespace:
    """The role module a site would write: its declaration and its planner."""
    declares = Declares(section="deep_ep", packages=(Package.at("deep-ep", "deep_ep.version"),),
                        imports=(Import("deep_ep", ("deep-ep",)),))

    def plan(ctx: PlanContext):
        have, want = installed_packages(ctx, "deep-ep").get("deep-ep"), normalized(ctx.stack.deep_ep.version)
        if versions_match(have, want):
            return [Unchanged("deep-ep", f"deep-ep {have} already installed")]
        return [Step(role="deep-ep", title=f"install deep-ep {want}", reason=f"venv has deep-ep {have or '(absent)'}",
                     commands=(Cmd.of("true"),), needed=needs_versions(ctx, {"deep-ep": want}), changes=("venv",))]
    return SimpleNamespace(name="deep-ep", declares=declares, plan=plan)


@pytest.fixture(autouse=True)
def registered(monkeypatch):
    """One registry line: before verify, which checks what the others declare."""
    monkeypatch.setattr(registry, "ROLES", [*registry.ROLES[:-1], deep_ep_role(), registry.ROLES[-1]])


HOST = Host(name="gpu1", address="10.0.0.1")
AT_TARGET = {"torch": TARGET["torch"], "flashinfer-python": "0.6.5", "flashinfer-cubin": "0.6.5",
             "flashinfer-jit-cache": "0.6.5+cu130"}


def ctx(packages: dict[str, str]) -> PlanContext:
    return plan_context(host=HOST, stack=SiteStack(), packages=packages)


def test_plan_runs_it_before_verify_and_verify_imports_it():
    assert [r.name for r in registry.ROLES][-2:] == ["deep-ep", "verify"]
    items = [item for role in registry.ROLES[-2:] for item in role.plan(ctx({**AT_TARGET, "deep-ep": "1.1.0"}))]
    assert [i.title for i in items] == ["install deep-ep 1.2.0",
                                        "verify the whole stack (torch, flashinfer, sgl_kernel, deep_ep import together)"]
    assert registry.ROLES[-2].plan(ctx({"deep-ep": "1.2.0"})) == [Unchanged("deep-ep", "deep-ep 1.2.0 already installed")]


@pytest.mark.parametrize("installed, drift", [("1.1.0", True), ("1.2.0", False), (None, True)])
def test_status_has_its_column_and_marks_drift(installed, drift):
    packages = {**AT_TARGET, **({"deep-ep": installed} if installed else {})}
    row = compare(HOST, SiteStack(), HostFacts(host="gpu1", packages=packages))
    cell = row.cells["deep-ep"]
    assert (cell.current, cell.expected, cell.drift) == (installed or "absent", "1.2.0", drift)
    assert list(row.cells)[-2:] == ["deep-ep", "service"]
    assert "deep-ep" in [str(c.header) for c in render.status_table([row]).columns]
    assert stack_versions(packages)["deep-ep"] == installed


def test_a_fleet_lock_pins_it():
    stack = SiteStack()
    found = made({"deep-ep": "1.3.0"}, sg_patches=patches_digest(stack.sglang.patches),
                 sk_patches=patches_digest(stack.sgl_kernel.patches))
    assert locked_stack(stack, found).deep_ep.version == "1.3.0"


def test_verify_expects_its_version_and_its_import():
    want = verify.expectations(ctx({}))
    assert want["packages"]["deep-ep"] == "1.2.0"
    assert want["imports"][-1] == {"module": "deep_ep", "dists": ["deep-ep"], "ops": [], "ops_label": "",
                                   "hints": []}


def run_check(tmp_path: Path, deep_ep: str) -> subprocess.CompletedProcess:
    env = stack_site(tmp_path)
    site = Path(env["PYTHONPATH"])
    (site / f"deep_ep-{deep_ep}.dist-info").mkdir()
    (site / f"deep_ep-{deep_ep}.dist-info" / "METADATA").write_text(f"Metadata-Version: 2.1\nName: deep-ep\n"
                                                                    f"Version: {deep_ep}\n")
    (site / "deep_ep.py").write_text(f"__version__ = {deep_ep!r}\n")
    _, *flags, code, arg = verify.check_cmd(ctx({})).argv
    return subprocess.run([sys.executable, *flags, code, arg], env=env, cwd=tmp_path, capture_output=True, text=True)


def test_verify_on_the_host_names_its_version_and_imports_it(tmp_path):
    bad = run_check(tmp_path / "old", "1.1.0")
    assert bad.returncode == 1 and "stack problem: deep-ep is 1.1.0, stack.toml wants 1.2.0" in bad.stdout
    good = run_check(tmp_path / "new", "1.2.0")
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().endswith("sgl-kernel 0.3.16 with FP4 ops, deep-ep 1.2.0 import together")


def test_a_kernel_build_never_lets_pip_replace_it():
    assert "deep-ep" in sgl_kernel.protected() and "torch" in sgl_kernel.protected()


def test_every_declared_section_is_a_stack_section():
    sections = [r.declares.section for r in registry.ROLES if r.declares.section]
    assert sections == ["torch", "flashinfer", "sglang", "sgl_kernel", "deep_ep"]
    assert set(sections) <= set(SiteStack.model_fields)
