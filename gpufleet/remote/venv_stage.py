"""The staged venv: a hard-linked copy beside the live one that an upgrade changes, then swaps in atomically.

    python3 -c "$(cat venv_stage.py)" estimate LIVE
    python3 -c "$(cat venv_stage.py)" prepare LIVE RUN_TEXT
    python3 -c "$(cat venv_stage.py)" mark LIVE dirty|clean
    python3 -c "$(cat venv_stage.py)" switch LIVE
    python3 -c "$(cat venv_stage.py)" discard LIVE
    python3 -c "$(cat venv_stage.py)" heal LIVE
    python3 -c "$(cat venv_stage.py)" swap-in LIVE NEW     (a rollback: NEW replaces LIVE in one step)

LIVE may be a symlink: the directory it resolves to is staged and swapped; the link is left alone. The stage is
REAL.gpufleet-next (same directory, so same filesystem: hard links and rename work), its state REAL.gpufleet-next.json:
`base` (the live venv as it was when staged), `state` ("clean" between steps, "dirty" while one runs), `by`.
Where the filesystem cannot rename the live directory (overlayfs without redirect_dir), prepare makes no stage and
prints `mode=in-place` with the reason. Prints `key=value` lines. Exit codes: 0 ok, 2 usage or no venv, 3 too little disk, 4 copy failed, 5 switch refused
or failed. Runs with the host's python3 (stdlib only); never imports gpufleet.
"""

import ctypes
import errno
import json
import os
import platform
import shutil
import sys
import time

MARGIN = 64 * 2**20  # never fill a filesystem to the last block: the server and pip need room to breathe


def paths(live):
    real = os.path.realpath(live)
    return real, real + ".gpufleet-next", real + ".gpufleet-next.json", real + ".gpufleet-prev"


def fingerprint(real):
    """What changes whenever anything installs into or removes from the venv: its top, bin and site-packages
    directories (inode and mtime); pip and uv always add or remove a *.dist-info directory there."""
    parts = []
    for sub in ["", "bin"] + sorted(os.path.join("lib", d, "site-packages") for d in _listdir(os.path.join(real, "lib"))):
        try:
            st = os.stat(os.path.join(real, sub))
        except OSError:
            continue
        parts.append("%s:%d:%d" % (sub or ".", st.st_ino, st.st_mtime_ns))
    return " ".join(parts)


def _listdir(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def census(real):
    """Files and directories in the venv, and what a hard-linked copy costs: one directory block each, no data."""
    files = dirs = 0
    for _, dnames, fnames in os.walk(real):
        dirs += 1
        files += len(fnames) + sum(1 for d in dnames if os.path.islink(os.path.join(_, d)))
    block = os.statvfs(real).f_bsize if os.path.exists(real) else 4096
    return files, dirs, dirs * block


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def read_state(marker):
    try:
        with open(marker) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def write_state(marker, state):
    tmp = marker + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, marker)


def say(**values):
    for k, v in values.items():
        print("%s=%s" % (k, v))
    sys.stdout.flush()


def estimate(live):
    real, stage, marker, _ = paths(live)
    if not os.path.isdir(real):
        say(real=real, present="no")
        return 0
    files, dirs, need = census(real)
    old = read_state(marker)
    say(real=real, stage=stage, present="yes", files=files, dirs=dirs, need=need, free=free_bytes(os.path.dirname(real)),
        staged=("yes" if os.path.isdir(stage) and old else "no"),
        reusable=("yes" if old and os.path.isdir(stage) and old.get("base") == fingerprint(real)
                  and old.get("state") == "clean" else "no"))
    return 0


def prepare(live, by):
    heal(live, quiet=True)
    real, stage, marker, _ = paths(live)
    if not os.path.isdir(real):
        print("no venv at %s" % live)
        return 2
    base = fingerprint(real)
    old = read_state(marker)
    if old and os.path.isdir(stage) and old.get("base") == base and old.get("state") == "clean":
        say(stage=stage, reused="yes", by_before=old.get("by", "?"))
        return 0
    why = ("none" if not os.path.lexists(stage) and not old else
           "the live venv changed since it was staged" if old and old.get("base") != base else
           "a run stopped in the middle of changing it" if old and old.get("state") != "clean" else
           "it has no state file")
    _remove(stage)
    files, dirs, need = census(real)
    free = free_bytes(os.path.dirname(real))
    if free < need + MARGIN:
        say(files=files, dirs=dirs, need=need + MARGIN, free=free)
        print("too little disk beside %s for the staged copy: it needs %d MiB (directory entries of %d directories, "
              "plus a %d MiB margin), %d MiB free" % (real, (need + MARGIN) >> 20, dirs, MARGIN >> 20, free >> 20))
        return 3
    write_state(marker, {"base": base, "state": "dirty", "by": by, "created": time.time()})
    started = time.monotonic()
    rc = os.spawnvp(os.P_WAIT, "cp", ["cp", "-al", "--", real, stage])
    if rc != 0:
        _remove(stage)
        os.unlink(marker)
        print("could not make a hard-linked copy of %s at %s (cp exit %d)" % (real, stage, rc))
        return 4
    seconds = time.monotonic() - started
    cannot = swap_refused(real, stage)
    if cannot:
        _remove(stage)
        os.unlink(marker)
        say(mode="in-place", why=cannot)
        return 0
    write_state(marker, {"base": base, "state": "clean", "by": by, "created": time.time()})
    say(stage=stage, reused="no", discarded=why, files=files, dirs=dirs, seconds="%.2f" % seconds)
    return 0


def swap_refused(real, stage):
    """Why the two directories cannot be swapped here, or None. Swapping the live venv with its fresh hard-linked copy
    and back changes nothing anyone can read (the same files under the same path), so it is a safe test; overlayfs
    without redirect_dir refuses to rename a directory of a lower layer (a container image's venv) with EXDEV."""
    try:
        if exchange(real, stage):
            exchange(real, stage)
        return None
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return ("this filesystem cannot rename %s (overlayfs without redirect_dir: %s)" % (real, exc.strerror))
        raise


def mark(live, state):
    _, stage, marker, _ = paths(live)
    old = read_state(marker)
    if not old or not os.path.isdir(stage):
        print("no staged venv for %s" % live)
        return 2
    old["state"] = state
    write_state(marker, old)
    return 0


def fix_scripts(stage, real):
    """pip writes launchers whose first lines name the python it ran with (the stage's): point them at the live path.
    Only files the stage wrote itself can name it; each is rewritten as a new file, never in place."""
    old, new = (stage + "/bin/").encode(), (real + "/bin/").encode()
    fixed = 0
    bindir = os.path.join(stage, "bin")
    for name in _listdir(bindir):
        path = os.path.join(bindir, name)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        with open(path, "rb") as f:
            data = f.read()
        if not data.startswith(b"#!") or old not in data[:4096]:
            continue
        head, tail = data[:4096], data[4096:]
        st = os.stat(path)
        tmp = path + ".gpufleet-tmp"
        with open(tmp, "wb") as f:
            f.write(head.replace(old, new) + tail)
        os.chmod(tmp, st.st_mode & 0o7777)
        try:
            os.chown(tmp, st.st_uid, st.st_gid)
        except PermissionError:
            pass
        os.replace(tmp, path)
        fixed += 1
    return fixed


def exchange(a, b):
    """Swap two directories in one atomic step (renameat2 RENAME_EXCHANGE); False where the kernel or filesystem
    cannot (then the caller falls back to two renames it can finish or undo)."""
    libc = ctypes.CDLL(None, use_errno=True)
    at_fdcwd, rename_exchange = -100, 2
    func = getattr(libc, "renameat2", None)
    if func is not None:
        rc = func(at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange)
    else:
        nr = {"x86_64": 316, "aarch64": 276}.get(platform.machine())
        if nr is None:
            return False
        rc = libc.syscall(nr, at_fdcwd, a.encode(), at_fdcwd, b.encode(), rename_exchange)
    if rc == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(err, os.strerror(err), a)


def switch(live):
    heal(live, quiet=True)
    real, stage, marker, prev = paths(live)
    state = read_state(marker)
    if not state or not os.path.isdir(stage):
        print("no staged venv for %s to switch to" % live)
        return 5
    if state.get("state") != "clean":
        print("the staged venv %s is in the middle of a change (state %s): not switching" % (stage, state.get("state")))
        return 5
    if state.get("base") != fingerprint(real):
        print("the live venv %s changed after it was staged: not switching (a re-run stages it again)" % real)
        return 5
    fixed = fix_scripts(stage, real)
    started = time.monotonic()
    try:
        atomic = exchange(real, stage)
    except OSError as exc:
        print("switching %s and %s failed: %s" % (real, stage, exc))
        return 5
    if not atomic:
        # Two renames; `heal` puts the old one back if a run dies between them.
        write_state(marker, dict(state, state="switching"))
        os.rename(real, prev)
        os.rename(stage, real)
        stage = prev
    switched = time.monotonic() - started
    os.unlink(marker)
    _remove(stage)  # the old venv: the run's snapshot holds a hard-linked copy of it
    say(switched="atomic" if atomic else "two-renames", seconds="%.4f" % switched, scripts_fixed=fixed)
    return 0


def swap_in(live, new):
    """Exchange NEW with the directory LIVE names, then remove what was live; exit 7 where the filesystem cannot
    swap (the caller moves instead), the live venv untouched."""
    real = os.path.realpath(live)
    try:
        if not exchange(real, new):
            return 7
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            return 7
        raise
    _remove(new)
    say(swapped="atomic")
    return 0


def heal(live, quiet=False):
    """Undo a two-rename switch that died between its renames: the old venv goes back in place."""
    real, stage, marker, prev = paths(live)
    if not os.path.lexists(real) and os.path.isdir(prev):
        os.rename(prev, real)
        if not quiet:
            print("put the old venv back from %s" % prev)
    return 0


def _remove(path):
    if os.path.islink(path) or os.path.isfile(path):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    cmd, live = argv[1], argv[2].rstrip("/") or "/"
    if cmd == "estimate":
        return estimate(live)
    if cmd == "prepare" and len(argv) == 4:
        return prepare(live, argv[3])
    if cmd == "mark" and len(argv) == 4 and argv[3] in ("dirty", "clean"):
        return mark(live, argv[3])
    if cmd == "switch":
        return switch(live)
    if cmd == "discard":
        _, stage, marker, _ = paths(live)
        _remove(stage)
        _remove(marker)
        return 0
    if cmd == "swap-in" and len(argv) == 4:
        return swap_in(live, argv[3])
    if cmd == "heal":
        return heal(live)
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
