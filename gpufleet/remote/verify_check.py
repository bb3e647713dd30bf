"""The whole-stack check: one process imports every role's modules in order, as sglang does, and names each problem.

argv[1] is JSON: "packages" {distribution: wanted version}, "names" {distribution: [it and its other names]},
"imports" [{"module", "dists", "ops", "ops_label", "hints"}] (the first is what the others run with: torch), and
"torch" (expectations) with "probe" (the torch report program). Exit 1 with one `stack problem:` line per problem.
A pass is remembered on the host (stack_memo.py) and answered again while nothing the check reads has changed.
"""

import sys

import light_site
from stack_memo import fingerprint, remember, remembered

light_site.begin()  # run with -S: sys.path as at a normal start, no .pth import lines run yet (light_site.py)
key = fingerprint(sys.argv[1])  # before anything is imported: what the check is about to read
earlier = remembered(key)
if earlier:
    print(earlier)
    sys.exit(0)
light_site.finish()  # the check imports the stack as sglang does: with every .pth import line run
# only now: a remembered pass needs none of these (importlib.metadata alone is ~20 ms of the host's CPU)
import importlib  # noqa: E402
import importlib.metadata as md  # noqa: E402
import json  # noqa: E402

from torch_problems import torch_problems, torch_report  # noqa: E402
from versions import versions_match  # noqa: E402

want = json.loads(sys.argv[1])
problems = []


def have(n):
    try:
        return md.version(n)
    except md.PackageNotFoundError:
        return None


def installed(dist):
    """`name version` of the first of the distribution's names that is installed, else `name absent`."""
    found = next((n for n in want["names"].get(dist, [dist]) if have(n)), None)
    return "%s %s" % (found, have(found)) if found else "%s absent" % dist


def tail(exc):
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return "%s: %s" % (type(exc).__name__, " | ".join(lines[:3]) or "(no message)")


for n, v in want["packages"].items():
    if not versions_match(have(n), v):
        problems.append("%s is %s, stack.toml wants %s" % (n, have(n) or "not installed", v))
imports = want["imports"]
named = [", ".join(installed(d) for d in imp["dists"]) for imp in imports]
base = named[0] if named else ""
mods = {}
for i, imp in enumerate(imports):
    try:
        mods[imp["module"]] = importlib.import_module(imp["module"])
    except BaseException as exc:
        involved = named[i] + (" with " + base if i else "")
        hint = "".join(" (%s)" % text for needle, text in imp["hints"] if needle in str(exc))
        problems.append("import %s failed (%s): %s%s" % (imp["module"], involved, tail(exc), hint))
if "torch" in mods and "torch" in want:
    problems += ["%s (%s)" % (p, base) for p in torch_problems(torch_report(want["probe"]), want["torch"])]
for i, imp in enumerate(imports):
    module = mods.get(imp["module"])
    if module is None or not imp["ops"]:
        continue
    # an op is exported by the module or registered with torch under the module's name
    ns = getattr(mods["torch"].ops, imp["module"], None) if "torch" in mods else None

    def has_op(op):
        try:
            return hasattr(module, op) or (ns is not None and hasattr(ns, op))
        except Exception:
            return False
    missing = [op for op in imp["ops"] if not has_op(op)]
    if missing:
        problems.append("%s lacks %s ops: %s" % (named[i], imp["ops_label"], ", ".join(missing)))
for p in problems:
    print("stack problem: " + p)
if problems:
    sys.exit(1)
parts = []
for i, imp in enumerate(imports):
    text = named[i]
    if imp["module"] == "torch" and "torch" in want:
        t = want["torch"]
        text += " (CUDA %s, cc %d.%d, %s)" % (t.get("cuda") or "?", t["cap"][0], t["cap"][1], t["arch"])
    if imp["ops"]:
        text += " with %s ops" % imp["ops_label"]
    parts.append(text)
summary = "%s import together" % ", ".join(parts)
print(summary)
remember(key, summary)
