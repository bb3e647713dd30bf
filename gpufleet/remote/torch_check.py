"""The torch role's check: argv[1] is JSON expectations with "probe", the torch report program; exit 1 naming what
differs."""

import json
import sys

from torch_problems import torch_problems, torch_report

want = json.loads(sys.argv[1])
r = torch_report(want["probe"])
if "error" in r:
    print("torch verification failed: " + r["error"])
    sys.exit(1)
problems = torch_problems(r, want)
for p in problems:
    print("torch verification failed: " + p)
if problems:
    sys.exit(1)
print("torch %s: CUDA %s, capability %d.%d, arch list has %s" % (r["version"], r["cuda"], r["cap"][0], r["cap"][1],
                                                                   want["arch"]))
