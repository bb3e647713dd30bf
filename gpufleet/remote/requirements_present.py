# Exit 0 when every requirement is installed (pip's own vendored packaging reads them), else 1: then pip installs.
# Run with the venv's python. Args: argv[1:] requirement strings.
import sys
import importlib.metadata as md
from pip._vendor.packaging.requirements import Requirement
for text in sys.argv[1:]:
    req = Requirement(text)
    try:
        have = md.version(req.name)
    except md.PackageNotFoundError:
        sys.exit(1)
    if not req.specifier.contains(have, prereleases=True):
        sys.exit(1)
