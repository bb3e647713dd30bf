"""Put a host back on a snapshot taken before an upgrade: exact venv, checkout HEAD with its local edits, unit."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpufleet import remote
from gpufleet.fleet import hoststate
from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError
from gpufleet.facts.script import unit_name

# Exit codes of the restore script, so the error says which part could not be restored.
_WHAT = {2: "no such snapshot", 3: "the venv", 4: "the sglang checkout", 5: "the systemd unit"}

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
    if result.exit_code == 2:
        raise RollbackError(f"host {session.name}: {path} is not a gpufleet snapshot")
    first, _, rest = result.output.partition("\n")
    try:
        manifest = json.loads(first)
    except json.JSONDecodeError:
        raise RollbackError(f"host {session.name}: unreadable manifest in {path}: {first[:200]!r}") from None
    details = dict(line.split("=", 1) for line in rest.splitlines() if "=" in line)
    return SnapshotInfo(path, manifest, details)


def restore(session, info: SnapshotInfo, say=print) -> str:
    """Restore the snapshot under the host's lock, then prove packages, HEAD and local edits match it."""
    host = session.host
    run = hoststate.RunInfo.current(f"rollback {info.path}")
    hoststate.claim_host(session, run)
    try:
        say(f"restoring {info.path}")
        cmd = Cmd.of("bash", "-c", remote.text("snapshot_restore.sh"), "restore", info.path, host.venv,
                     host.sglang_checkout,
                     unit_name(host.service), keep_owner=(host.venv, host.sglang_checkout))
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
