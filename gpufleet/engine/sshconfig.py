"""ssh_config as text, read without paramiko: Include expanded, and whether it may send a host elsewhere than its
inventory address and port (engine/dial.py opens TCP connections before paramiko is imported)."""

from __future__ import annotations

import glob
import os
import shlex
from pathlib import Path

from gpufleet.errors import HostKeyError

# Keywords that change where paramiko/Fabric connect (the address, the port, a hop); a config holding one of them
# is read by paramiko before anything is dialled. Match is there because its conditions are paramiko's to judge.
REROUTING = frozenset({"hostname", "proxyjump", "proxycommand", "match", "canonicalizehostname"})


def expand_includes(path: str | Path, depth: int = 0) -> str:
    """The text of an ssh_config with every `Include` replaced by the files it names (globs, ~, and paths relative
    to ~/.ssh as OpenSSH resolves them), since paramiko's parser has no Include."""
    if depth > 16:
        raise HostKeyError(f"{path}: Include nests more than 16 deep (a loop?)")
    lines = []
    for line in Path(path).read_text().splitlines():
        words = line.strip().split(None, 1)
        if len(words) == 2 and words[0].lower() == "include":
            for pattern in shlex.split(words[1]):
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(os.path.expanduser("~/.ssh"), pattern)
                for included in sorted(glob.glob(pattern)):
                    if os.path.isfile(included):
                        lines.append(expand_includes(included, depth + 1))
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def keywords(text: str) -> set[str]:
    """The keywords an ssh_config text sets (lower case), in any Host or Match block; `Key=value` counts too."""
    found = set()
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            found.add(line.replace("=", " ", 1).split(None, 1)[0].lower())
    return found
