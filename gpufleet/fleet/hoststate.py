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
from gpufleet.facts.unit import unit_name

STATE_DIR = "/var/lib/gpufleet"
LOCK_DIR = f"{STATE_DIR}/lock"
SNAPSHOTS_DIR = f"{STATE_DIR}/snapshots"
AUDIT_LOG = f"{STATE_DIR}/audit.log"
_HELD = 3  # exit code of the lock command when another run holds the lock
BOOT_NOW = "@@boot_now="  # the lock scripts' last line: the host's boot id now (the holder file has the one it was taken in)


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
    values = holder_values(text)
    if "holder" not in values:
        return " ".join(text.split()) or "an unknown holder (the lock has no holder file)"
    details = [f"pid {values['pid']}" if values.get("pid") else "",
               f"since {values['started']}" if values.get("started") else "",
               f"running `{values['command']}`" if values.get("command") else ""]
    details = [d for d in details if d]
    return values["holder"] + (f" ({', '.join(details)})" if details else "")


def claim_host(session, run: RunInfo) -> str | None:
    """Take the host's lock by an atomic mkdir; refuse with the holder's details when another run has it.

    A lock whose holder provably died (taken from this control node by a pid that no longer runs, or runs as another
    process now) is taken over, its token checked so a lock that changed hands meanwhile is never broken; returns
    what was taken over, for the caller to say. A holder that may live, or one on another control node, refuses."""
    cmd = Cmd.of("bash", "-c", remote.text("host_claim.sh"), "lock", run.holder_text(), LOCK_DIR, str(_HELD))
    result = session.run(cmd, step="lock", check=False)
    if result.exit_code == _HELD:
        claim = Claim.parse(result.output)
        state, why = liveness(claim)
        if state != "stale" or "holder" not in claim.values:  # no holder file: a live run may be writing it now
            raise HostClaimedError(session.name, f"{claim.described} ({why})")
        try:
            break_claim(session, claim)
        except ClaimChanged:
            raise HostClaimedError(session.name, read_claim(session) or describe_holder("")) from None
        result = session.run(cmd, step="lock", check=False)
        if result.exit_code == _HELD:
            raise HostClaimedError(session.name, Claim.parse(result.output).described)
        if result.exit_code != 0:
            raise RemoteCommandError(result, cmd)
        return f"took over a stale lock: {claim.described}: {why}"
    if result.exit_code != 0:
        raise RemoteCommandError(result, cmd)
    return None


def release_claim(session, run: RunInfo) -> None:
    session.run(Cmd.of("bash", "-c", remote.text("host_release.sh"), "unlock", run.token, LOCK_DIR), step="unlock")


HOLDER_STEP = "read lock"


def holder_cmd() -> Cmd:
    """The read-only command printing the host's lock (exit 1 when the host is not locked)."""
    return Cmd.of("bash", "-c", remote.text("host_claim_read.sh"), "read-lock", LOCK_DIR)


def holder_of(exit_code: int | None, output: str) -> "Claim | None":
    """The lock holder_cmd found, from its exit code and output; None when the host is not locked."""
    return Claim.parse(output) if exit_code == 0 else None


def read_claim(session) -> str | None:
    """The holder of the host's lock, described, or None when it is free (read-only)."""
    claim = read_holder(session)
    return claim.described if claim else None


def holder_values(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


@dataclass(frozen=True)
class Claim:
    """The host's lock as found: its holder file's text (empty when it has none), its values, and the host's boot
    id when it was read (empty when unknown)."""

    text: str
    boot_now: str = ""

    @classmethod
    def parse(cls, output: str) -> "Claim":
        """The lock scripts' output: the holder file, then a last line naming the host's boot id now."""
        lines = output.splitlines()
        boot = next((line[len(BOOT_NOW):].strip() for line in lines if line.startswith(BOOT_NOW)), "")
        text = "\n".join(line for line in lines if not line.startswith(BOOT_NOW)).strip("\n")
        return cls(text + "\n" if text else "", boot)

    @property
    def values(self) -> dict[str, str]:
        return holder_values(self.text)

    @property
    def described(self) -> str:
        return describe_holder(self.text)

    @property
    def control_host(self) -> str | None:
        holder = self.values.get("holder", "")
        return holder.split("@", 1)[1] if "@" in holder else None


def read_holder(session) -> Claim | None:
    """The host's lock with its holder file, or None when the host is not locked (read-only)."""
    result = session.run(holder_cmd(), step=HOLDER_STEP, check=False)
    return holder_of(result.exit_code, result.output)


def _started_epoch(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def _process_start(pid: int) -> float | None:
    """When a local process started (epoch seconds), from /proc; None when it cannot be told."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        ticks = int(fields[19])  # field 22 of stat, counted after the command's closing parenthesis
        boot = next(int(line.split()[1]) for line in open("/proc/stat") if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this control node (one of another user counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid > 0


def liveness(claim: Claim, here: str | None = None) -> tuple[str, str]:
    """Whether the lock's holder still runs: ("live" | "stale" | "unknown", why).

    A lock taken in an earlier boot of the host (its holder file's boot_id is not the host's boot id now) is stale
    whoever took it: no run holds a host across its reboot.
    The holder file names the control node and the pid of the run (`holder=user@node`, `pid=`, `started=`). On this
    control node the pid is checked: gone, or now a process that started after the lock was taken (a reused pid),
    is stale. A lock without a holder file (a run died while taking it) is stale. From another control node it is
    unknown: gpufleet cannot see that node's processes."""
    here = here or socket.gethostname()
    values = claim.values
    if "holder" not in values:
        return "stale", "the lock has no holder file: a run died while taking it"
    taken_in = values.get("boot_id", "").strip()
    if taken_in and claim.boot_now and taken_in != claim.boot_now:
        return "stale", (f"the host rebooted since the lock was taken (boot id {taken_in[:8]} then, "
                         f"{claim.boot_now[:8]} now): no run holds a host across its reboot")
    node = claim.control_host
    try:
        pid = int(values.get("pid", ""))
    except ValueError:
        pid = 0
    if node != here:
        return "unknown", (f"it was taken from another control node ({node}); gpufleet cannot see whether pid "
                           f"{values.get('pid', '?')} still runs there")
    if pid <= 0:
        return "stale", "its holder file names no pid"
    if not pid_alive(pid):
        return "stale", f"pid {pid} no longer runs on {here}"
    began, taken = _process_start(pid), _started_epoch(values.get("started", ""))
    if began is not None and taken is not None and began > taken + 5:
        return "stale", f"pid {pid} on {here} is another process now (it started after the lock was taken)"
    return "live", f"pid {pid} still runs on {here}"


class ClaimChanged(GpufleetError):
    """The host's lock changed hands between reading and breaking it."""


def break_claim(session, claim: Claim) -> None:
    """Remove the host's lock, only while it is still the claim that was read (its token)."""
    cmd = Cmd.of("bash", "-c", remote.text("host_unlock.sh"), "unlock", LOCK_DIR, claim.values.get("token", ""))
    result = session.run(cmd, step="break lock", check=False)
    if result.exit_code == 1:
        raise ClaimChanged(f"host {session.name}: the lock changed hands meanwhile (another run took it); "
                           f"nothing was removed; run `inv unlock` again to see the new holder")
    if result.exit_code != 0:
        raise RemoteCommandError(result, cmd)


def snapshot(session, run: RunInfo) -> str:
    """Save what a rollback needs (pip freeze, checkout HEAD/diff/untracked files, unit file); returns its path."""
    host = session.host
    now = utc_now()
    manifest = json.dumps({"host": host.name, "created": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "by": run.who,
                           "command": run.command, "pid": run.pid, "venv": host.venv, "checkout": host.sglang_checkout,
                           "unit": unit_name(host.service)}, sort_keys=True)
    cmd = Cmd.of("bash", "-c", remote.text("snapshot.sh"), "snapshot", host.venv, host.sglang_checkout,
                 unit_name(host.service), now.strftime("%Y%m%dT%H%M%SZ"), manifest,
                 keep_owner=(host.venv, host.sglang_checkout))  # git diff may refresh the checkout's index
    result = session.run(cmd, step="snapshot")
    return result.output.strip().splitlines()[-1]


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot on a host: its directory, its size on its own (KiB) and its manifest's values."""

    path: str
    kib: int
    manifest: dict

    @property
    def created(self) -> str:
        return self.manifest.get("created", "")

    def to_json(self) -> dict:
        return {"path": self.path, "kib": self.kib, "created": self.created, "by": self.manifest.get("by"),
                "command": self.manifest.get("command")}


def parse_snapshot_list(text: str) -> tuple[list[SnapshotInfo], int]:
    """snapshot_list.sh's output -> the snapshots (oldest first) and their total size in KiB (shared files once)."""
    found: list[SnapshotInfo] = []
    total = 0
    current: tuple[str, int] | None = None
    for line in text.splitlines():
        if line.startswith("@@snapshot "):
            path, _, kib = line[len("@@snapshot "):].rpartition(" ")
            current = (path, int(kib) if kib.isdigit() else 0)
            found.append(SnapshotInfo(current[0], current[1], {}))
        elif line.startswith("@@total "):
            total = int(line.split()[1]) if line.split()[1:] and line.split()[1].isdigit() else 0
        elif line.strip() and current is not None and found and not found[-1].manifest:
            try:
                manifest = json.loads(line)
            except ValueError:
                manifest = {}
            found[-1] = SnapshotInfo(current[0], current[1], manifest if isinstance(manifest, dict) else {})
    return found, total


def list_snapshots(session) -> tuple[list[SnapshotInfo], int]:
    """The host's snapshots, oldest first, with sizes; and their total on disk (read-only)."""
    result = session.run(Cmd.of("bash", "-c", remote.text("snapshot_list.sh"), "snapshots", SNAPSHOTS_DIR),
                         step="list snapshots")
    return parse_snapshot_list(result.output)


def prune_snapshots(session, keep: int, protect: str) -> list[str]:
    """Remove all but the newest `keep` snapshots, never `protect` (the one just taken); the removed paths."""
    result = session.run(Cmd.of("bash", "-c", remote.text("snapshot_prune.sh"), "prune", SNAPSHOTS_DIR, str(keep),
                                protect), step="prune snapshots")
    return [line for line in result.output.splitlines() if line.startswith("/")]


def append_audit(session, record: dict) -> None:
    """Append one JSON line to the host's audit log."""
    line = json.dumps(record, sort_keys=True, default=str)
    session.run(Cmd.of("bash", "-c", remote.text("audit_append.sh"), "audit", AUDIT_LOG, line), step="audit log")
