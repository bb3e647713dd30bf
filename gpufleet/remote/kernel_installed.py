"""Is the venv's sgl-kernel this build's? Reads the record the install left beside it (kernel_record.py).

Args: MODE RECORD KEY [FP4]. MODE `needed`: exit 0 while the installed sgl-kernel is not from build KEY, 1 when it
is (a re-run skips what another run finished). MODE `verify`: exit 0 and say what the build targets when it is
KEY's (and, with FP4 = 1, its FP4 ops were found); else exit with the reason.
"""

import json
import sys


def main(mode: str, record: str, key: str, fp4: str = "0") -> None:
    try:
        with open(record) as f:
            rec = json.load(f)
    except (OSError, ValueError):
        rec = {}
    if mode == "needed":
        sys.exit(1 if rec.get("key") == key else 0)
    if rec.get("key") != key:
        sys.exit("installed record is for another build")
    if fp4 == "1" and not rec.get("fp4"):
        sys.exit("the installed sgl-kernel has no FP4 ops")
    where = sorted(set(rec.get("fp4_ops", {}).values())) or ["-"]
    print("sgl-kernel build", rec["key"][:12], "targets", ",".join(rec.get("archs") or ["?"]),
          "fp4 ops in", "+".join(where))


if __name__ == "__main__":
    main(*sys.argv[1:])
