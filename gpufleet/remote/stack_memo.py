"""The whole-stack check remembered on the host: a pass is answered again while nothing the check reads has changed.

What it reads, as one digest: the expectations, the interpreter, every entry at the top of each import path
(site-packages included: any pip install, uninstall or venv swap renames or adds one there), the environment that
steers CUDA and imports, the boot, and the NVIDIA driver's version and GPU entries. A file edited by hand deep inside
a package is not seen until one of those changes; the verify step of a run that changed something always checks
afresh (GPUFLEET_FRESH=1).

The GPUs as nvidia-smi lists them are not asked again here (the facts read in the same plan already ask): a pass is
kept with `@@gpus DIGEST` of the GPUs it was checked on, and the control node checks afresh when its facts list other
GPUs (roles/verify.py; gpu_digest is the one rule for both sides). Stdlib only: shipped to hosts.
"""

import hashlib
import os
import stat
import sys
import time

_ENV = ("CUDA", "LD_", "NVIDIA", "PYTHON", "TORCH")
GPU_FIELDS = ("index", "uuid", "pci.bus_id", "compute_cap", "driver_version")
GPUS = "@@gpus "  # the line a remembered pass ends with: the digest of the GPUs it was checked on


def gpu_digest(rows):
    """The digest of GPUs given as rows of GPU_FIELDS values (strings, as nvidia-smi prints them), in any order."""
    lines = sorted(",".join(str(cell).strip() for cell in row) for row in rows)
    return hashlib.sha256("\n".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def memo_dir():
    base = os.environ.get("GPUFLEET_HOST_CACHE")
    if not base:
        cache = os.environ.get("XDG_CACHE_HOME") or (os.path.join(os.environ["HOME"], ".cache")
                                                     if os.environ.get("HOME") else "")
        base = os.path.join(cache, "gpufleet") if cache else ""
    return os.path.join(base, "stack-checks") if base else ""


def _stat(path):
    try:
        s = os.stat(path)
    except OSError:
        return "absent"
    if stat.S_ISDIR(s.st_mode):
        # a package directory is replaced whole by pip (a new inode); its times change with every __pycache__
        return "dir %d" % s.st_ino
    return "%d %d %d %d" % (s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns)


def _read(path):
    try:
        with open(path, "rb") as f:
            return f.read(65536)
    except OSError:
        return b""


def _names(path, prefix=""):
    try:
        return sorted(n for n in os.listdir(path) if n.startswith(prefix))
    except OSError:
        return []


def fingerprint(argument):
    """The digest of what the check reads (the expectations in `argument` included)."""
    h = hashlib.sha256()

    def add(*parts):
        h.update(("\0".join(str(p) for p in parts) + "\n").encode("utf-8", "surrogateescape"))

    add(argument, sys.executable, os.path.realpath(sys.executable), sys.version)
    add(*["%s=%s" % (k, v) for k, v in sorted(os.environ.items()) if k.startswith(_ENV)])
    here = os.getcwd()
    for d in sys.path:
        if not d or os.path.abspath(d) == here:  # the working directory is not the stack
            continue
        add(d)  # not its times: an import's first __pycache__ there changes them, and nothing else
        for name in _names(d):
            if name != "__pycache__":  # bytecode written by an import changes nothing the check sees
                add(name, _stat(os.path.join(d, name)))
    add(_read("/proc/sys/kernel/random/boot_id"), _read("/proc/driver/nvidia/version"))
    add(*_names("/proc/driver/nvidia/gpus"), *_names("/dev", "nvidia"))
    return h.hexdigest()


def _gpus():
    """The digest of the GPUs as the driver answers now (10 ms on a real H200); None when nvidia-smi fails."""
    import subprocess

    try:
        proc = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.split(",") for line in proc.stdout.splitlines() if line.strip()]
    return gpu_digest(rows) if proc.returncode == 0 and rows else None


def remembered(key):
    """The summary of an earlier pass with this digest, prefixed with when it was checked; None when there is none."""
    folder = memo_dir()
    if not folder or os.environ.get("GPUFLEET_FRESH"):
        return None
    text = _read(os.path.join(folder, key)).decode("utf-8", "replace").strip()
    return text or None


def remember(key, summary):
    """Keep a pass with the GPUs it was checked on (best effort: a cache that cannot be written, or GPUs nvidia-smi
    cannot list, only mean checking afresh next time)."""
    folder = memo_dir()
    gpus = _gpus() if folder else None
    if not gpus:
        return
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = "as checked at %s (nothing it reads has changed since): %s\n%s%s\n" % (when, summary, GPUS, gpus)
    temp = os.path.join(folder, ".%s.%d" % (key, os.getpid()))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        with open(temp, "w") as f:
            f.write(text)
        os.replace(temp, os.path.join(folder, key))
        cutoff = time.time() - 30 * 86400
        for name in os.listdir(folder):
            path = os.path.join(folder, name)
            if os.stat(path).st_mtime < cutoff:
                os.unlink(path)
    except OSError:
        pass
