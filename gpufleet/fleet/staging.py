"""The staged venv on a host: changed beside the live one, swapped in atomically once verified (remote/venv_stage.py)."""

from __future__ import annotations

from dataclasses import dataclass

from gpufleet import remote
from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError, RemoteCommandError

_SCRIPT = "venv_stage.py"
_EXIT = {2: "no venv", 3: "too little disk", 4: "the copy failed", 5: "the switch was refused"}


class StagingError(GpufleetError):
    """The staged venv could not be made, kept or switched in; the live venv is as it was."""


def _cmd(*args: str) -> Cmd:
    # no keep_owner: cp -a keeps every owner as it was, and the launchers it rewrites keep theirs
    return Cmd.of("python3", "-c", remote.text(_SCRIPT), *args, cwd="/")


def _values(output: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)


@dataclass(frozen=True)
class Estimate:
    """What staging the venv costs, read (read-only) on the host."""

    present: bool
    files: int = 0
    dirs: int = 0
    need: int = 0  # bytes: one directory block per directory (files are hard links)
    free: int = 0
    reusable: bool = False

    def describe(self, venv: str) -> str:
        if not self.present:
            return f"no venv at {venv} yet: nothing to stage"
        seconds = max(0.1, self.files / 40000)  # cp -al links some 40k files a second on a server's disk
        reuse = "; a clean staged copy from an earlier run is there and will be reused" if self.reusable else ""
        return (f"the venv is changed as a hard-linked copy beside {venv} ({self.files} files, {self.dirs} "
                f"directories: about {self.need / 2**20:.0f} MiB of directory entries and ~{seconds:.0f} s to make, "
                f"{self.free / 2**30:.1f} GiB free there), plus what the new wheels unpack to; the live venv is "
                f"untouched until one atomic swap, the server is stopped only for that swap{reuse}")


def estimate(session, venv: str) -> Estimate:
    result = session.run(_cmd("estimate", venv), step="venv: staging cost", check=False)
    if result.exit_code != 0:
        raise RemoteCommandError(result, _cmd("estimate", venv))
    v = _values(result.output)
    if v.get("present") != "yes":
        return Estimate(False)
    return Estimate(True, int(v["files"]), int(v["dirs"]), int(v["need"]), int(v["free"]), v["reusable"] == "yes")


@dataclass(frozen=True)
class Stage:
    """A staged venv ready for changes: where it is, and whether an earlier run's clean copy was reused."""

    path: str | None  # None: this filesystem cannot swap directories, the venv is changed in place
    reused: bool
    note: str


def prepare(session, venv: str, by: str) -> Stage:
    """Make (or reuse a clean) staged copy of the live venv; the live venv is never written."""
    cmd = _cmd("prepare", venv, by)
    result = session.run(cmd, step="venv: stage a copy", check=False, timeout=3600)
    if result.exit_code != 0:
        what = _EXIT.get(result.exit_code or -1, f"exit code {result.exit_code}")
        if result.exit_code in _EXIT:
            raise StagingError(f"host {session.name}: staging {venv} failed ({what}): "
                               f"{(result.output.strip().splitlines() or ['?'])[-1]}")
        raise RemoteCommandError(result, cmd)
    v = _values(result.output)
    if v.get("mode") == "in-place":
        return Stage(None, False, f"changing the venv in place: {v.get('why', '?')}; a failed step leaves it as it "
                                  f"failed, the run's snapshot is the way back")
    if v.get("reused") == "yes":
        note = f"reusing the clean staged venv {v['stage']} left by {v.get('by_before', 'an earlier run')}"
    else:
        gone = v.get("discarded", "none")
        note = (f"staged the venv at {v['stage']} ({v.get('files', '?')} files hard-linked in {v.get('seconds', '?')} s)"
                + (f"; discarded an earlier staged copy: {gone}" if gone != "none" else ""))
    return Stage(v["stage"], v.get("reused") == "yes", note)


def mark(session, venv: str, state: str) -> None:
    """Record that a change of the staged venv is under way ("dirty") or finished ("clean")."""
    cmd = _cmd("mark", venv, state)
    result = session.run(cmd, step=f"venv: mark the staged copy {state}", check=False)
    if result.exit_code != 0:
        raise RemoteCommandError(result, cmd)


def switch(session, venv: str) -> str:
    """Swap the staged venv in for the live one in one step; the old one (kept in the run's snapshot) is removed."""
    cmd = _cmd("switch", venv)
    result = session.run(cmd, step="venv: switch to the staged copy", check=False, timeout=3600)
    if result.exit_code != 0:
        if result.exit_code == 5:
            raise StagingError(f"host {session.name}: not switching {venv}: "
                               f"{(result.output.strip().splitlines() or ['?'])[-1]}")
        raise RemoteCommandError(result, cmd)
    v = _values(result.output)
    how = ("one atomic exchange (renameat2)" if v.get("switched") == "atomic"
           else "two renames (this filesystem cannot exchange)")
    return f"switched to the new venv by {how} in {v.get('seconds', '?')} s; {v.get('scripts_fixed', '0')} launcher(s) " \
           f"pointed at {venv}"


def discard(session, venv: str) -> None:
    """Remove a staged copy that nothing was changed in (the live venv was already on target)."""
    cmd = _cmd("discard", venv)
    result = session.run(cmd, step="venv: remove the unused staged copy", check=False)
    if result.exit_code != 0:
        raise RemoteCommandError(result, cmd)
