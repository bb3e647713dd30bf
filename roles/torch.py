"""torch role: the exact nightly from its index in the host's venv, then TORCH_REPORT on the host must agree."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from gpufleet import remote
from gpufleet.engine.command import Cmd
from gpufleet.facts.torch_report import TORCH_REPORT
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged
from gpufleet.remote.versions import versions_match
from gpufleet.roleapi import Declares, Import, Package
from gpufleet.roles.pip import (installed_packages, needs_versions, normalized, pushed_install,
                                venv_python, wanted_by)

name = "torch"
declares = Declares(
    section="torch",
    packages=(Package.at("torch", "torch.version", verified=False),  # verify reads torch.__version__ instead
              Package("triton")),  # comes with torch: listed with the stack, pinned by a fleet lock only
    imports=(Import("torch", ("torch",)),))


def cuda_of(stack) -> str | None:
    """CUDA version torch is built for: from the local label (cu130 -> 13.0), else the index URL's last segment."""
    label = normalized(stack.torch.version).partition("+")[2]
    for text in (label, urlsplit(stack.torch.index_url).path.rstrip("/").rsplit("/", 1)[-1]):
        match = re.fullmatch(r"cu(\d+)(\d)", text or "")
        if match:
            return f"{int(match[1])}.{match[2]}"
    return None


def gpu_capability(ctx: PlanContext) -> str:
    """The compute capability of the host's GPUs from facts ("12.0"); the inventory's expectation if unreadable."""
    gpus = ctx.facts.gpus.gpus if ctx.facts.gpus else []
    caps = sorted({g.compute_capability for g in gpus})
    if len(caps) > 1:
        raise PlanError(ctx.host.name, name, f"GPUs of mixed compute capability ({', '.join(caps)}): one torch build "
                                             f"cannot be checked against all of them")
    return caps[0] if caps else ctx.host.gpus.compute_capability


def expectations(ctx: PlanContext) -> dict:
    """What torch on the host must report: version, CUDA, device capability, arch in its arch list."""
    major, minor = (int(p) for p in gpu_capability(ctx).split("."))
    return {"version": normalized(ctx.stack.torch.version), "cuda": cuda_of(ctx.stack), "cap": [major, minor],
            "arch": f"sm_{major}{minor}"}


def check_cmd(ctx: PlanContext) -> Cmd:
    """TORCH_REPORT in the venv, then a comparison that names whatever differs (exit 1)."""
    code = remote.program("torch_check.py", "versions.py", "torch_problems.py")
    want = {**expectations(ctx), "probe": TORCH_REPORT}
    return Cmd.of(venv_python(ctx), "-c", code, json.dumps(want, sort_keys=True), cwd="/")


def plan(ctx: PlanContext) -> list[Step | Unchanged]:
    """Unchanged when the venv's torch is the pinned build; else one install from the stack's index."""
    want = ctx.stack.torch.version
    packages = installed_packages(ctx, name)
    have = packages.get("torch")
    if versions_match(have, normalized(want)):
        return [Unchanged(name, f"torch {have} already installed ({wanted_by(ctx)} {want})")]
    had = f"venv has torch {have}" if have else f"torch is not installed in {ctx.host.venv}"
    pins, uploads, cmd = pushed_install(ctx, name, [f"torch=={want}"], index_url=ctx.stack.torch.index_url,
                                        pre=ctx.stack.torch.pre)
    others = sorted(n for n in pins if n != "torch")
    brings = f"brings {len(others)} more: {', '.join(others)}" if others else "nothing else changes"
    return [Step(role=name, title=f"install torch {want}",
                 reason=f"{had}; {wanted_by(ctx)} {want} ({brings}); {len(pins)} wheel(s) handed over by the "
                        f"control node",
                 commands=(cmd,), needed=needs_versions(ctx, {"torch": want, **pins}), verify=(check_cmd(ctx),),
                 changes=("venv",), uploads=uploads)]
