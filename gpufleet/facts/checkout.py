"""The state of the sglang source checkout: head, branch, upstream distance, local edits, stashes, origin."""

from __future__ import annotations

import re
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel

from gpufleet.errors import FactError
from gpufleet.facts.sections import first_line, script_note

# Where sgl-kernel lives in an sglang checkout, newest layout last: upstream moved it in mid-2026.
KERNEL_DIRS = ("sgl-kernel", "python/sglang/kernels/aot")
_MARKERS = ("@@status", "@@stash")
_ESCAPES = {"a": "\a", "b": "\b", "t": "\t", "n": "\n", "v": "\v", "f": "\f", "r": "\r", '"': '"', "\\": "\\"}


class CheckoutFacts(BaseModel):
    """A git checkout; present is False when the path is missing (exists False) or is not the top of a git repo."""

    path: str
    present: bool
    exists: bool = True
    head: str | None = None
    branch: str | None = None
    upstream: str | None = None
    ahead: int | None = None
    behind: int | None = None
    modified: list[str] = []
    untracked: list[str] = []
    stashes: list[str] = []
    remote_url: str | None = None
    kernel_dir: str | None = None  # where the checkout keeps sgl-kernel: sgl-kernel/ or python/sglang/kernels/aot/
    kernel_name: str | None = None  # the pip name its pyproject declares: sgl-kernel, or sglang-kernel (mid-2026 on)
    kernel_version: str | None = None  # the version its pyproject declares: what a build of this checkout installs


def parse_checkout(text: str, host: str | None) -> CheckoutFacts:
    """Parse the `checkout` section: `key=value` lines, then `@@status` porcelain v1 lines, then `@@stash` lines."""
    head, status, stash = _parts(text)
    values = dict(line.split("=", 1) for line in head if re.match(r"^[a-z_]+=", line))
    if "path" not in values or "present" not in values:
        raise FactError("source checkout", host, script_note(text) or f"unexpected output {first_line(text)!r}")
    if values["present"] != "yes":
        return CheckoutFacts(path=values["path"], present=False, exists=values.get("exists") == "yes")
    if status is None or stash is None:
        failed = "\n".join(status or head)
        raise FactError("source checkout", host, f"git failed in {values['path']}: {first_line(failed)!r}")
    modified, untracked = _porcelain(status, host)
    ahead, behind = _ahead_behind(values.get("ahead_behind", ""))
    return CheckoutFacts(path=values["path"], present=True, head=values.get("head") or None,
                         branch=values.get("branch") or None, upstream=values.get("upstream") or None,
                         ahead=ahead, behind=behind, modified=modified, untracked=untracked,
                         stashes=[line for line in stash if line.strip()],
                         remote_url=redact_url(values.get("remote_url") or "") or None,
                         kernel_dir=values.get("kernel_dir") or None, kernel_name=values.get("kernel_name") or None,
                         kernel_version=values.get("kernel_version") or None)


def _parts(text: str) -> tuple[list[str], list[str] | None, list[str] | None]:
    parts: list[list[str]] = [[]]
    for line in text.splitlines():
        if len(parts) <= len(_MARKERS) and line == _MARKERS[len(parts) - 1]:
            parts.append([])
        else:
            parts[-1].append(line)
    missing: list[None] = [None] * (3 - len(parts))
    head, status, stash = [*parts, *missing]
    return head, status, stash


def _ahead_behind(value: str) -> tuple[int | None, int | None]:
    counts = value.split()
    if len(counts) == 2 and all(c.isdigit() for c in counts):
        return int(counts[0]), int(counts[1])
    return None, None


def _porcelain(lines: list[str], host: str | None) -> tuple[list[str], list[str]]:
    modified, untracked = [], []
    for line in lines:
        if not line.strip():
            continue
        if len(line) < 4 or line[2] != " ":
            raise FactError("source checkout", host, f"unexpected git status line {line!r}")
        code, path = line[:2], line[3:]
        if "R" in code or "C" in code:
            path = path.rsplit(" -> ", 1)[-1]
        (untracked if code == "??" else modified).append(unquote_path(path))
    return modified, untracked


def unquote_path(path: str) -> str:
    """Undo git's C-style quoting of a path (`"a\\tb"`, octal escapes for raw bytes)."""
    if not (len(path) >= 2 and path[0] == path[-1] == '"'):
        return path
    body, out, i = path[1:-1], bytearray(), 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            if re.match(r"[0-7]{3}", body[i + 1:i + 4]):
                out.append(int(body[i + 1:i + 4], 8))
                i += 4
                continue
            out += _ESCAPES.get(body[i + 1], body[i + 1]).encode()
            i += 2
        else:
            out += body[i].encode()
            i += 1
    return out.decode("utf-8", "replace")


def redact_url(url: str) -> str:
    """A remote URL without credentials: http(s) user info is dropped, any password elsewhere too."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if not parts.username and not parts.password:
        return url
    # https tokens are often passed as the user name, so http(s) loses the whole user info
    keep = "" if parts.scheme in ("http", "https") else f"{parts.username}@"
    netloc = keep + (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
