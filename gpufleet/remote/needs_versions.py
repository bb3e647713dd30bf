"""A step's `needed` check: exit 0 while a distribution differs from its pin (argv[1]: JSON {name: version}), exit 1
once all match. Any surprise also means "needed": a wrong "done" would skip a real change."""

import json
import sys

try:
    import importlib.metadata as md

    from versions import versions_match

    for name, want in json.loads(sys.argv[1]).items():
        try:
            have = md.version(name)
        except md.PackageNotFoundError:
            sys.exit(0)
        if not versions_match(have, want):
            sys.exit(0)
except SystemExit:
    raise
except BaseException:
    sys.exit(0)
sys.exit(1)
