"""Put a host back on a snapshot taken before an upgrade: exact venv, checkout HEAD with its local edits, unit."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from gpufleet.fleet import hoststate
from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError
from gpufleet.facts.script import unit_name

# Exit codes of the restore script, so the error says which part could not be restored.
_WHAT = {2: "no such snapshot", 3: "the venv", 4: "the sglang checkout", 5: "the systemd unit"}

_LATEST = r'''
ls -1d /var/lib/gpufleet/snapshots/*/ 2>/dev/null | sort | tail -n 1 | sed 's:/$::'
'''

_DESCRIBE = r'''
d=$1
[ -f "$d/manifest.json" ] || exit 2
cat "$d/manifest.json"; echo
printf 'venv=%s\n' "$([ -d "$d/venv" ] && echo yes || echo no)"
printf 'git_head=%s\n' "$(cat "$d/git-head" 2>/dev/null)"
printf 'git_branch=%s\n' "$(cat "$d/git-branch" 2>/dev/null)"
printf 'diff_lines=%s\n' "$(wc -l < "$d/git.diff" 2>/dev/null || echo 0)"
printf 'untracked=%s\n' "$(wc -l < "$d/untracked.txt" 2>/dev/null || echo 0)"
printf 'unit_path=%s\n' "$(cat "$d/unit-path" 2>/dev/null)"
printf 'unit_active=%s\n' "$(cat "$d/unit-active" 2>/dev/null)"
'''

_RESTORE = r'''
set -u
d=$1 venv=$2 co=$3 unit=$4
[ -f "$d/manifest.json" ] || exit 2
systemctl stop -- "$unit" 2>/dev/null || true
if [ -d "$d/venv" ]; then
    # Swap in a hard-linked copy (the snapshot stays intact for another rollback); keep the replaced venv until
    # the copy is complete so a failure here leaves a working venv behind.
    rm -rf -- "$venv.gpufleet-new" "$venv.gpufleet-old"
    cp -al -- "$d/venv" "$venv.gpufleet-new" 2>/dev/null || cp -a -- "$d/venv" "$venv.gpufleet-new" || exit 3
    if [ -e "$venv" ]; then mv -- "$venv" "$venv.gpufleet-old" || exit 3; fi
    mv -- "$venv.gpufleet-new" "$venv" || { mv -- "$venv.gpufleet-old" "$venv"; exit 3; }
    rm -rf -- "$venv.gpufleet-old"
fi
g() { git -c safe.directory='*' -c core.quotepath=false -C "$co" "$@"; }
if [ -f "$d/git-head" ]; then
    head=$(cat "$d/git-head"); branch=$(cat "$d/git-branch" 2>/dev/null)
    g reset -q --hard || exit 4
    g clean -q -fd || exit 4
    if [ -n "$branch" ]; then g checkout -q "$branch" || exit 4; fi
    g reset -q --hard "$head" || exit 4
    if [ -s "$d/git.diff" ]; then g apply --binary "$d/git.diff" || exit 4; fi
    if [ -f "$d/untracked.tar.gz" ]; then tar -C "$co" -xzf "$d/untracked.tar.gz" || exit 4; fi
fi
current=$(systemctl show -p FragmentPath --value -- "$unit" 2>/dev/null)
[ -n "$current" ] || current=/etc/systemd/system/$unit
env_file=/etc/gpufleet/${unit%.service}.env
if [ -f "$d/unit-path" ]; then
    cp -p -- "$d/$(basename "$(cat "$d/unit-path")")" "$(cat "$d/unit-path")" || exit 5
    if [ -f "$d/unit.env" ]; then cp -p -- "$d/unit.env" "$env_file" || exit 5; fi
else
    # The unit did not exist before the upgrade.
    systemctl disable -- "$unit" 2>/dev/null || true
    rm -f -- "$current" "$env_file"
fi
systemctl daemon-reload 2>/dev/null || true
if [ "$(cat "$d/unit-active" 2>/dev/null)" = active ]; then systemctl start -- "$unit" || exit 5; fi
echo restored
'''

_CHECK = r'''
d=$1 venv=$2 co=$3
if [ -f "$d/pip-freeze.txt" ]; then
    (cd / && PIP_CONFIG_FILE=/dev/null "$venv/bin/python" -m pip freeze --all) > /tmp/gpufleet-freeze.$$ 2>&1
    if ! diff -u "$d/pip-freeze.txt" /tmp/gpufleet-freeze.$$; then rm -f /tmp/gpufleet-freeze.$$; exit 1; fi
    rm -f /tmp/gpufleet-freeze.$$
fi
g() { git -c safe.directory='*' -C "$co" "$@"; }
if [ -f "$d/git-head" ]; then
    [ "$(g rev-parse HEAD)" = "$(cat "$d/git-head")" ] || { echo "HEAD is not $(cat "$d/git-head")"; exit 1; }
    g diff HEAD --binary | cmp -s - "$d/git.diff" || { echo "local edits differ from the snapshot"; exit 1; }
fi
echo "packages, HEAD and local edits match the snapshot"
'''


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
    path = session.run(Cmd.of("bash", "-c", _LATEST), step="find snapshot").output.strip()
    if not path:
        raise RollbackError(f"host {session.name}: no snapshot in {hoststate.SNAPSHOTS_DIR}: nothing to roll back to")
    return path


def describe(session, path: str) -> SnapshotInfo:
    """Read a snapshot's manifest and contents (read-only)."""
    result = session.run(Cmd.of("bash", "-c", _DESCRIBE, "describe", path), step="read snapshot", check=False)
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
        cmd = Cmd.of("bash", "-c", _RESTORE, "restore", info.path, host.venv, host.sglang_checkout,
                     unit_name(host.service))
        result = session.run(cmd, step="rollback", check=False, timeout=3600)
        if result.exit_code != 0:
            what = _WHAT.get(result.exit_code, f"exit code {result.exit_code}")
            raise RollbackError(f"host {host.name}: rollback to {info.path} failed restoring {what}:\n"
                                f"{result.tail()}")
        check = session.run(Cmd.of("bash", "-c", _CHECK, "check", info.path, host.venv, host.sglang_checkout),
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
