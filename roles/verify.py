"""verify role: every role's modules import together in the venv (torch, flashinfer, sgl_kernel), as pinned."""

from __future__ import annotations

import hashlib
import json

from gpufleet import remote
from gpufleet.engine.command import Cmd
from gpufleet.facts.torch_report import TORCH_REPORT
from gpufleet import roles as registry
from gpufleet.plan import PlanContext, Step, Unchanged
from gpufleet.remote.stack_memo import GPUS, gpu_digest
from gpufleet.roleapi import Declares, packages
from gpufleet.roles import torch
from gpufleet.roles.pip import venv_python

name = "verify"
declares = Declares(needs=("*",))  # it checks what the others declare: all of them
PROBLEM = "stack problem: "


def expectations(ctx: PlanContext) -> dict:
    """What the registry's roles declare: pinned versions (metadata), imports in order, and torch's own report."""
    declared = packages(registry.ROLES)
    return {"packages": {p.name: p.wanted(ctx.stack) for p in declared if p.want and p.verified},
            "names": {p.name: list(p.names()) for p in declared if p.aliases},
            "imports": [{"module": i.module, "dists": list(i.dists), "ops": list(i.ops), "ops_label": i.ops_label,
                         "hints": [list(h) for h in i.hints]}
                        for role in registry.ROLES for i in role.declares.imports],
            "torch": torch.expectations(ctx), "probe": TORCH_REPORT}


def check_cmd(ctx: PlanContext, *, fresh: bool = False) -> Cmd:
    """The whole-stack check: exit 0 with a one-line summary, or exit 1 with one `stack problem:` line each. A plan's
    read may be answered by the host's memo of an earlier pass (nothing it reads changed since); `fresh` never is."""
    code = remote.program("verify_check.py", "versions.py", "torch_problems.py", "stack_memo.py", "light_site.py")
    # the check's own code is part of what the host's memo keys on: a gpufleet that checks more never reads a pass
    # an older check remembered
    want = {**expectations(ctx), "check": hashlib.sha256(code.encode()).hexdigest()}
    # -S: a remembered pass is read without the .pth files' import lines (light_site.py), a fresh check runs them
    return Cmd.of(venv_python(ctx), "-S", "-c", code, json.dumps(want), cwd="/",
                  env={"GPUFLEET_FRESH": "1"} if fresh else None)


def _summary(output: str) -> str:
    return next((line for line in reversed(output.strip().splitlines()) if not line.startswith(GPUS)), "")


def _other_gpus(output: str, ctx: PlanContext) -> bool:
    """Whether the check's answer was remembered with other GPUs than the facts list (a fresh answer has no digest)."""
    seen = next((line[len(GPUS):].strip() for line in output.splitlines() if line.startswith(GPUS)), None)
    if seen is None:
        return False
    gpus = ctx.facts.gpus.gpus if ctx.facts.gpus else []
    now = [(g.index, g.uuid, g.pci_bus_id, g.compute_capability, g.driver_version) for g in gpus]
    return not now or seen != gpu_digest(now)


def problems_in(output: str) -> list[str]:
    found = [line[len(PROBLEM):] for line in output.splitlines() if line.startswith(PROBLEM)]
    return found or [line for line in output.strip().splitlines()[-1:]]


def plan(ctx: PlanContext) -> list[Step | Unchanged]:
    """Unchanged when the check passes now; else a check-only step (after the changes above, in a real run)."""
    cmd = check_cmd(ctx)
    if ctx.read is None:
        reason = "check the whole stack once the roles above are done"
    else:
        result = ctx.read(cmd, "verify the stack")
        if result.exit_code == 0 and _other_gpus(result.output, ctx):
            # a pass the host remembered from other GPUs than the facts list now (its memo asks no nvidia-smi)
            result = ctx.read(check_cmd(ctx, fresh=True), "verify the stack afresh")
        if result.exit_code == 0:
            return [Unchanged(name, _summary(result.output))]
        reason = "now: " + "; ".join(problems_in(result.output))
    modules = ", ".join(i.module for role in registry.ROLES for i in role.declares.imports)
    return [Step(role=name, title=f"verify the whole stack ({modules} import together)",
                 reason=reason, commands=(), verify=(check_cmd(ctx, fresh=True),))]
