"""gpufleet's own state on a host under /var/lib/gpufleet: the run lock, snapshots before changes, the audit log."""

from __future__ import annotations

import getpass
import json
import os
import socket
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone

from gpufleet import remote
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


def claim_host(session, run: RunInfo) -> None:
    """Take the host's lock by an atomic mkdir; refuse with the holder's details when another run has it."""
    cmd = Cmd.of("bash", "-c", remote.text("host_claim.sh"), "lock", run.holder_text(), LOCK_DIR, str(_HELD))
    result = session.run(cmd, step="lock", check=False)
    if result.exit_code == _HELD:
        raise HostClaimedError(session.name, describe_holder(result.output))
    if result.exit_code != 0:
        raise RemoteCommandError(result, cmd)


def release_claim(session, run: RunInfo) -> None:
    session.run(Cmd.of("bash", "-c", remote.text("host_release.sh"), "unlock", run.token, LOCK_DIR), step="unlock")


def read_claim(session) -> str | None:
    """The holder of the host's lock, described, or None when it is free (read-only)."""
    result = session.run(Cmd.of("bash", "-c", remote.text("host_claim_read.sh"), "read-lock", LOCK_DIR),
                         step="read lock", check=False)
    return describe_holder(result.output) if result.exit_code == 0 else None


def snapshot(session, run: RunInfo) -> str:
    """Save what a rollback needs (pip freeze, checkout HEAD/diff/untracked files, unit file); returns its path."""
    host = session.host
    now = utc_now()
    manifest = json.dumps({"host": host.name, "created": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "by": run.who,
                           "command": run.command, "venv": host.venv, "checkout": host.sglang_checkout,
                           "unit": unit_name(host.service)}, sort_keys=True)
    cmd = Cmd.of("bash", "-c", remote.text("snapshot.sh"), "snapshot", host.venv, host.sglang_checkout,
                 unit_name(host.service), now.strftime("%Y%m%dT%H%M%SZ"), manifest,
                 keep_owner=(host.venv, host.sglang_checkout))  # git diff may refresh the checkout's index
    result = session.run(cmd, step="snapshot")
    return result.output.strip().splitlines()[-1]


def append_audit(session, record: dict) -> None:
    """Append one JSON line to the host's audit log."""
    line = json.dumps(record, sort_keys=True, default=str)
    session.run(Cmd.of("bash", "-c", remote.text("audit_append.sh"), "audit", AUDIT_LOG, line), step="audit log")
