"""flashinfer's version rules, then its import: argv[1] is JSON {distribution: wanted version} of its three packages
(python, cubin, jit-cache, in that order); exit 1 with one line naming every problem."""

import importlib.metadata as md
import json
import sys

from versions import covers, versions_match

want = json.loads(sys.argv[1])
have = {}
for n in want:
    try:
        have[n] = md.version(n)
    except md.PackageNotFoundError:
        have[n] = None
py, cubin, jit = have["flashinfer-python"], have["flashinfer-cubin"], have["flashinfer-jit-cache"]
names = ", ".join("%s %s" % (n, have[n] or "(absent)") for n in want)
problems = []
if cubin != py:
    problems.append("flashinfer-cubin must equal flashinfer-python")
if not (py and jit and covers(py, jit)):
    problems.append("flashinfer-jit-cache's public version must equal flashinfer-python")
for n, v in want.items():
    if not versions_match(have[n], v):
        problems.append("%s is %s, stack.toml wants %s" % (n, have[n] or "absent", v))
if problems:
    print("flashinfer versions do not fit (%s): %s" % (names, "; ".join(problems)))
    sys.exit(1)
try:
    import flashinfer
except Exception as exc:
    print("import flashinfer failed with %s: %s: %s" % (names, type(exc).__name__, exc))
    sys.exit(1)
print("flashinfer %s imports (%s)" % (flashinfer.__version__, names))
