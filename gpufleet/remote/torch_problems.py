"""What torch on a host reports against what it must be: shared by the torch role's check and the verify check."""

import contextlib
import io
import json

from versions import covers


def torch_report(program):
    """Run the torch report program (TORCH_REPORT, passed by the control node) here; its last line is the report."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            exec(compile(program, "torch_report", "exec"), {"__name__": "torch_report"})
        except SystemExit:
            pass
    lines = out.getvalue().strip().splitlines()
    return json.loads(lines[-1]) if lines else {"error": "the torch report printed nothing"}


def torch_problems(r, want):
    """One sentence per difference between the report `r` and the expectations `want`."""
    found = []
    v = r.get("version") or "?"
    # the stack's pin may leave out the label torch.__version__ carries
    if not covers(want["version"], v):
        found.append("torch.__version__ is %s, stack.toml wants %s" % (v, want["version"]))
    if want.get("cuda") and r.get("cuda") != want["cuda"]:
        found.append("torch.version.cuda is %s, the build label wants CUDA %s" % (r.get("cuda"), want["cuda"]))
    cap = want.get("cap")
    if cap and not r.get("cap"):
        why = r.get("cuda_error") or "torch.cuda.is_available() is False"
        found.append("torch sees no GPU (%s); the host's GPUs have compute capability %d.%d" % (why, cap[0], cap[1]))
    elif cap and list(r["cap"]) != list(cap):
        found.append("torch reports device capability %d.%d, the host's GPUs are %d.%d" % (
            r["cap"][0], r["cap"][1], cap[0], cap[1]))
    arch = want.get("arch")
    archs = r.get("arch_list") or []
    if arch and not any(a == arch or (a.startswith(arch) and a[len(arch):].isalpha()) for a in archs):
        found.append("torch's arch list %s lacks %s (the GPUs' arch)" % (" ".join(archs) or "(empty)", arch))
    return found
