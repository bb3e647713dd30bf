"""gpufleet's own state on a host under /var/lib/gpufleet: the run lock, snapshots before changes, the audit log."""

from __future__ import annotations

import getpass
import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError, RemoteCommandError
from gpufleet.facts.script import unit_name

STATE_DIR = "/var/lib/gpufleet"
LOCK_DIR = f"{STATE_DIR}/lock"
SNAPSHOTS_DIR = f"{STATE_DIR}/snapshots"
AUDIT_LOG = f"{STATE_DIR}/audit.log"
_HELD = 3  # exit code of the lock command when another run holds the lock


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return f"uid{os.getuid()}"


@dataclass(frozen=True)
class RunInfo:
    """Who runs what from where: written into the lock's holder file and every audit record."""

    user: str
    control_host: str
    pid: int
    started: str
    command: str
    token: str = field(default_factory=lambda: uuid.uuid4().hex)

    @classmethod
    def current(cls, command: str) -> "RunInfo":
        return cls(_user(), socket.gethostname(), os.getpid(), utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), command)

    @property
    def who(self) -> str:
        return f"{self.user}@{self.control_host}"

    def holder_text(self) -> str:
        return (f"holder={self.who}\npid={self.pid}\nstarted={self.started}\ncommand={self.command}\n"
                f"token={self.token}\n")


class HostClaimedError(GpufleetError):
    """Another run holds the host's lock; names the holder."""

    def __init__(self, host: str, holder: str):
        self.host, self.holder = host, holder
        super().__init__(f"host {host} is locked by {holder}: another gpufleet run is changing it; refusing to run "
                         f"a second one")


def describe_holder(text: str) -> str:
    """A holder file as one phrase: `alice@laptop (pid 42, since ..., running `inv upgrade ...`)`."""
    values = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    if "holder" not in values:
        return " ".join(text.split()) or "an unknown holder (the lock has no holder file)"
    details = [f"pid {values['pid']}" if values.get("pid") else "",
               f"since {values['started']}" if values.get("started") else "",
               f"running `{values['command']}`" if values.get("command") else ""]
    details = [d for d in details if d]
    return values["holder"] + (f" ({', '.join(details)})" if details else "")


_LOCK = f'''
mkdir -p {STATE_DIR} || exit 2
if mkdir {LOCK_DIR} 2>/dev/null; then
    printf '%s' "$1" > {LOCK_DIR}/holder || {{ rm -rf {LOCK_DIR}; exit 2; }}
    exit 0
fi
cat {LOCK_DIR}/holder 2>/dev/null
exit {_HELD}
'''

# Only the run that took the lock removes it (its token is in the holder file).
_UNLOCK = f'grep -qxF "token=$1" {LOCK_DIR}/holder 2>/dev/null && rm -rf {LOCK_DIR}; exit 0'


def claim_host(session, run: RunInfo) -> None:
    """Take the host's lock by an atomic mkdir; refuse with the holder's details when another run has it."""
    cmd = Cmd.of("bash", "-c", _LOCK, "lock", run.holder_text())
    result = session.run(cmd, step="lock", check=False)
    if result.exit_code == _HELD:
        raise HostClaimedError(session.name, describe_holder(result.output))
    if result.exit_code != 0:
        raise RemoteCommandError(result, cmd)


def release_claim(session, run: RunInfo) -> None:
    session.run(Cmd.of("bash", "-c", _UNLOCK, "unlock", run.token), step="unlock")


def read_claim(session) -> str | None:
    """The holder of the host's lock, described, or None when it is free (read-only)."""
    body = f'[ -d {LOCK_DIR} ] || exit 1; cat {LOCK_DIR}/holder 2>/dev/null; exit 0'
    result = session.run(Cmd.of("bash", "-c", body), step="read lock", check=False)
    return describe_holder(result.output) if result.exit_code == 0 else None


_SNAPSHOT = r'''
set -u
venv=$1 co=$2 unit=$3 stamp=$4 manifest=$5
base=/var/lib/gpufleet/snapshots
mkdir -p "$base" || exit 2
d="$base/$stamp" n=1
while ! mkdir "$d" 2>/dev/null; do d="$base/$stamp-$n"; n=$((n + 1)); [ $n -lt 100 ] || exit 2; done
chmod 700 "$d"  # it may hold the server's environment file (secrets)
printf '%s\n' "$manifest" > "$d/manifest.json"
if [ -x "$venv/bin/python" ]; then
    if (cd / && "$venv/bin/python" -m pip --version) >/dev/null 2>&1; then
        (cd / && PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip freeze --all) > "$d/pip-freeze.txt" || exit 4
    elif command -v uv >/dev/null 2>&1; then
        uv pip freeze --python "$venv/bin/python" > "$d/pip-freeze.txt" || exit 4
    else
        (cd / && "$venv/bin/python" -c 'import importlib.metadata as m
for d in sorted(m.distributions(), key=lambda d: d.metadata["Name"].lower()):
    print("%s==%s" % (d.metadata["Name"], d.version))') > "$d/pip-freeze.txt" || exit 4
    fi
fi
# The venv itself, hard-linked: pip and uv replace files rather than rewrite them, so the snapshot keeps the exact
# old files (a source-built sgl-kernel, a nightly torch that has left its index) at almost no disk cost.
if [ -d "$venv" ]; then
    cp -al -- "$venv" "$d/venv" 2>/dev/null || { rm -rf -- "$d/venv"; cp -a -- "$venv" "$d/venv"; } || exit 6
fi
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
if [ -d "$co" ] && [ "$(g rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$co" && pwd -P)" ]; then
    g rev-parse HEAD > "$d/git-head" || exit 5
    g symbolic-ref -q --short HEAD > "$d/git-branch" || true
    g diff HEAD --binary > "$d/git.diff" || exit 5
    g stash list > "$d/git-stash-list" || true
    g ls-files --others --exclude-standard -z > "$d/untracked.z" || exit 5
    tr '\0' '\n' < "$d/untracked.z" > "$d/untracked.txt"
    if [ -s "$d/untracked.z" ]; then tar -C "$co" --null -T "$d/untracked.z" -czf "$d/untracked.tar.gz" || exit 5; fi
    rm -f "$d/untracked.z"
fi
path=
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
    path=$(systemctl show -p FragmentPath --value -- "$unit" 2>/dev/null)
fi
if [ -z "$path" ] && [ -f "/etc/systemd/system/$unit" ]; then path=/etc/systemd/system/$unit; fi
if [ -n "$path" ] && [ -f "$path" ]; then cp -p -- "$path" "$d/" && printf '%s\n' "$path" > "$d/unit-path"; fi
for f in "/etc/gpufleet/${unit%.service}.env"; do [ -f "$f" ] && cp -p -- "$f" "$d/unit.env"; done
systemctl is-active -- "$unit" > "$d/unit-active" 2>/dev/null || true
# Keep the newest snapshots only; each pins the files of a whole venv.
ls -1d "$base"/*/ 2>/dev/null | sort | head -n -5 | xargs -r rm -rf --
echo "$d"
'''


def snapshot(session, run: RunInfo) -> str:
    """Save what a rollback needs (pip freeze, checkout HEAD/diff/untracked files, unit file); returns its path."""
    host = session.host
    now = utc_now()
    manifest = json.dumps({"host": host.name, "created": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "by": run.who,
                           "command": run.command, "venv": host.venv, "checkout": host.sglang_checkout,
                           "unit": unit_name(host.service)}, sort_keys=True)
    cmd = Cmd.of("bash", "-c", _SNAPSHOT, "snapshot", host.venv, host.sglang_checkout, unit_name(host.service),
                 now.strftime("%Y%m%dT%H%M%SZ"), manifest)
    result = session.run(cmd, step="snapshot")
    return result.output.strip().splitlines()[-1]


def append_audit(session, record: dict) -> None:
    """Append one JSON line to the host's audit log."""
    line = json.dumps(record, sort_keys=True, default=str)
    body = f'mkdir -p {STATE_DIR} && printf "%s\\n" "$1" >> {AUDIT_LOG}'
    session.run(Cmd.of("bash", "-c", body, "audit", line), step="audit log")
