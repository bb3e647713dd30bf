"""Put a host back on a snapshot taken before an upgrade: exact venv, checkout HEAD with its local edits, unit."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime

from gpufleet import remote
from gpufleet.fleet import hoststate
from gpufleet.engine.command import Cmd
from gpufleet.errors import ConnectionLost, GpufleetError, UnreachableError
from gpufleet.facts.script import unit_name

# Exit codes of the restore script, so the error says which part could not be restored.
_WHAT = {2: "no such snapshot", 3: "the venv", 4: "the sglang checkout", 5: "the systemd unit"}
RECONNECT_FOR = 600.0  # how long a rollback waits for a host that dropped off (inventory: settings.reconnect_for)

class RollbackError(GpufleetError):
    """A rollback could not find, restore or confirm a snapshot."""


@dataclass
class SnapshotInfo:
    """What a snapshot holds, as read on the host."""

    path: str
    manifest: dict = field(default_factory=dict)
    details: dict = field(default_factory=dict)

    def lines(self) -> list[str]:
        d = self.details
        out = [f"snapshot {self.path} taken {self.manifest.get('created', '?')} by {self.manifest.get('by', '?')}"]
        out.append("venv: exact copy" if d.get("venv") == "yes" else "venv: not in the snapshot")
        if d.get("git_head"):
            out.append(f"sglang: {d.get('git_branch') or 'detached'}@{d['git_head'][:12]} with "
                       f"{d.get('diff_lines', '0')} diff lines and {d.get('untracked', '0')} untracked files")
        out.append(f"unit: {d['unit_path']} ({d.get('unit_active') or 'inactive'})" if d.get("unit_path")
                   else "unit: none before the upgrade (will be removed)")
        return out


def latest_snapshot(session) -> str:
    """The newest snapshot on the host, or a clear error when there is none."""
    path = session.run(Cmd.of("bash", "-c", remote.text("snapshot_latest.sh")), step="find snapshot").output.strip()
    if not path:
        raise RollbackError(f"host {session.name}: no snapshot in {hoststate.SNAPSHOTS_DIR}: nothing to roll back to")
    return path


def describe(session, path: str) -> SnapshotInfo:
    """Read a snapshot's manifest and contents (read-only)."""
    result = session.run(Cmd.of("bash", "-c", remote.text("snapshot_describe.sh"), "describe", path),
                         step="read snapshot", check=False)
    if result.exit_code is None:  # the host dropped off under the read: unreachable, not a bad manifest
        raise ConnectionLost(result, None)
    if result.exit_code == 2:
        raise RollbackError(f"host {session.name}: {path} is not a gpufleet snapshot")
    first, _, rest = result.output.partition("\n")
    try:
        manifest = json.loads(first)
    except json.JSONDecodeError:
        raise RollbackError(f"host {session.name}: unreadable manifest in {path}: {first[:200]!r}") from None
    details = dict(line.split("=", 1) for line in rest.splitlines() if "=" in line)
    return SnapshotInfo(path, manifest, details)


def reach(session, seconds: float, say=print, clock=time.monotonic, sleep=time.sleep) -> None:
    """Make sure the host answers before a rollback: one that dropped off (rebooting, a cut link) is tried again
    for up to `seconds`, saying so once, then given systemd's own wait for the end of its boot. UnreachableError
    when it stays silent; a refused host key or login is never waited for."""
    timeout = getattr(getattr(session, "settings", None), "connect_timeout", None)
    try:
        if session.run(Cmd.of("true"), step="still answering?", check=False, timeout=timeout).exit_code == 0:
            return
        why = "the connection was lost"
    except UnreachableError as exc:
        why = str(exc)
    if "authentication failed" in why:
        raise UnreachableError(why)
    say(f"{session.name} is not answering (rebooting?); waiting up to {seconds:.0f} s for it to come back")
    started = clock()
    delay = 1.0
    while True:
        try:
            session.reconnect()
            if session.run(Cmd.of("true"), step="back?", check=False, timeout=timeout).exit_code == 0:
                break
        except UnreachableError as exc:
            why = str(exc)
            if "authentication failed" in why:
                raise
        waited = clock() - started
        if waited >= seconds:
            raise UnreachableError(f"host {session.name}: not answering after waiting {waited:.0f} s (rebooting? "
                                   f"settings.reconnect_for is {seconds:.0f} s): {why}")
        sleep(min(delay, max(0.1, seconds - waited)))
        delay = min(delay * 2, 10.0)
    # back: let its boot finish (units started) before restoring anything; degraded or not, the restore judges
    session.run(Cmd.of("systemctl", "is-system-running", "--wait"), step="boot finished?", check=False,
                timeout=max(30.0, min(seconds, 120.0)))
    say(f"{session.name} answers again after {clock() - started:.0f} s")


def reach_then(session, seconds: float, then, say=print, clock=time.monotonic, sleep=time.sleep):
    """reach() the host, then return then(); a host that drops off again under then() is waited for again, all
    within the same `seconds`: a rebooting host's sshd can still take a login while its shutdown goes on."""
    started = clock()
    while True:
        reach(session, max(1.0, seconds - (clock() - started)), say, clock=clock, sleep=sleep)
        try:
            return then()
        except UnreachableError as exc:
            if "authentication failed" in str(exc) or clock() - started >= seconds:
                raise
            say(f"{session.name} dropped off again: {str(exc).splitlines()[0]}")


def snapshot_of_run(session, roll_started: str, pid: int, command: str) -> str | None:
    """The first snapshot a roll's run took on the host (started at the roll's stamp, by its pid and command):
    the host as it was before that run changed it; None when that run took none there."""
    try:
        since = datetime.strptime(roll_started, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%dT%H:%M:%SZ")
    except ValueError:
        return None
    found, _ = hoststate.list_snapshots(session)
    for snap in found:  # oldest first
        m = snap.manifest
        if m.get("created", "") >= since and m.get("command") == command and m.get("pid", pid) == pid:
            return snap.path
    return None


def restore(session, info: SnapshotInfo, say=print) -> str:
    """Restore the snapshot under the host's lock, then prove packages, HEAD and local edits match it."""
    host = session.host
    run = hoststate.RunInfo.current(f"rollback {info.path}")
    if note := hoststate.claim_host(session, run):
        say(note)
    try:
        say(f"restoring {info.path}")
        cmd = Cmd.of("bash", "-c", remote.text("snapshot_restore.sh"), "restore", info.path, host.venv,
                     host.sglang_checkout, unit_name(host.service), remote.text("venv_stage.py"),
                     keep_owner=(host.venv, host.sglang_checkout))
        result = session.run(cmd, step="rollback", check=False, timeout=3600)
        if result.exit_code != 0:
            what = _WHAT.get(result.exit_code, f"exit code {result.exit_code}")
            raise RollbackError(f"host {host.name}: rollback to {info.path} failed restoring {what}:\n"
                                f"{result.tail()}")
        check = session.run(Cmd.of("bash", "-c", remote.text("snapshot_check.sh"), "check", info.path, host.venv,
                                   host.sglang_checkout, keep_owner=(host.venv, host.sglang_checkout)),
                            step="rollback: compare with snapshot", check=False)
        if check.exit_code != 0:
            raise RollbackError(f"host {host.name}: after rollback the host differs from {info.path}:\n{check.tail()}")
        say(check.output.strip().splitlines()[-1])
        hoststate.append_audit(session, {"when": hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "who": run.who,
                                         "command": run.command, "host": host.name, "outcome": "rolled back",
                                         "snapshot": info.path})
        return check.output.strip()
    finally:
        hoststate.release_claim(session, run)
