"""verify role: torch, flashinfer (all three) and sgl_kernel import together in the venv, as stack.toml pins them."""

from __future__ import annotations

import json

from gpufleet.engine.command import Cmd
from gpufleet.facts.torch_report import TORCH_REPORT
from gpufleet.plan import PlanContext, Step, Unchanged
from gpufleet.roles import flashinfer, torch
from gpufleet.roles.pip import venv_python

name = "verify"
FP4_OPS = ("cutlass_scaled_fp4_mm", "scaled_fp4_quant", "scaled_fp4_experts_quant", "cutlass_fp4_group_mm")
PROBLEM = "stack problem: "

# One process imports everything in the order sglang does; every problem is printed, each naming its packages.
_CHECK = r'''
import contextlib, importlib, io, json, sys
import importlib.metadata as md
want = json.loads(sys.argv[1])
problems = []
def have(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return None
def same(h, v):
    return h == v or bool(h and "+" not in h and h == v.split("+")[0])
versions = {n: have(n) for n in want["packages"]}
for n, v in want["packages"].items():
    if not same(versions[n], v):
        problems.append("%s is %s, stack.toml wants %s" % (n, versions[n] or "not installed", v))
kernel_dist = next((n for n in ("sgl-kernel", "sglang-kernel") if have(n)), None)
kernel = "%s %s" % (kernel_dist, have(kernel_dist)) if kernel_dist else "sgl-kernel (not installed)"
fi = ", ".join("%s %s" % (n, versions[n] or "absent") for n in want["packages"] if n.startswith("flashinfer"))
torch_v = "torch %s" % (have("torch") or "absent")
def tail(exc):
    lines = [l for l in str(exc).strip().splitlines() if l.strip()]
    return "%s: %s" % (type(exc).__name__, " | ".join(lines[:3]) or "(no message)")
mods = {}
for mod, involved in (("torch", torch_v), ("flashinfer", fi + " with " + torch_v),
                      ("sgl_kernel", kernel + " with " + torch_v)):
    try:
        mods[mod] = importlib.import_module(mod)
    except BaseException as exc:
        text = tail(exc)
        hint = ""
        if mod == "sgl_kernel" and "undefined symbol" in str(exc):
            hint = " (sgl-kernel was built against another torch: rebuild it for this torch)"
        problems.append("import %s failed (%s): %s%s" % (mod, involved, text, hint))
if "torch" in mods:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        try:
            exec(compile(want["probe"], "torch_probe", "exec"), {"__name__": "torch_probe"})
        except SystemExit:
            pass
    report = json.loads(buf.getvalue().strip().splitlines()[-1])
    problems += ["%s (%s)" % (p, torch_v) for p in torch_problems(report, want["torch"])]
if "sgl_kernel" in mods:
    ns = getattr(mods["torch"].ops, "sgl_kernel", None) if "torch" in mods else None
    def has_op(op):
        try:
            return hasattr(mods["sgl_kernel"], op) or (ns is not None and hasattr(ns, op))
        except Exception:
            return False
    missing = [op for op in want["fp4_ops"] if not has_op(op)]
    if missing:
        problems.append("%s lacks FP4 ops: %s" % (kernel, ", ".join(missing)))
for p in problems:
    print("stack problem: " + p)
if problems:
    sys.exit(1)
t = want["torch"]
print("%s (CUDA %s, cc %d.%d, %s), %s, %s with FP4 ops import together" % (
    torch_v, t.get("cuda") or "?", t["cap"][0], t["cap"][1], t["arch"], fi, kernel))
'''


def expectations(ctx: PlanContext) -> dict:
    # torch's version is checked by torch_problems (torch.__version__), the others by their metadata
    return {"packages": flashinfer.targets(ctx.stack), "torch": torch.expectations(ctx), "fp4_ops": list(FP4_OPS),
            "probe": TORCH_REPORT}


def check_cmd(ctx: PlanContext) -> Cmd:
    """The whole-stack check: exit 0 with a one-line summary, or exit 1 with one `stack problem:` line each."""
    code = torch.TORCH_PROBLEMS + _CHECK
    return Cmd.of(venv_python(ctx), "-c", code, json.dumps(expectations(ctx)), cwd="/")


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
        if result.exit_code == 0:
            return [Unchanged(name, result.output.strip().splitlines()[-1])]
        reason = "now: " + "; ".join(problems_in(result.output))
    return [Step(role=name, title="verify the whole stack (torch, flashinfer, sgl_kernel import together)",
                 reason=reason, commands=(), verify=(cmd,))]
