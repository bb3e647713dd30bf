"""The simulated upstream sglang git repository, its moves, and the hosts' checkout with the two local SM120 edits."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

PAYLOAD = Path(__file__).parent / "payload"
TREE = PAYLOAD / "sglang"
# A CUDA 13 toolkit stand-in (bin/nvcc --version, include/cccl/cuda/atomic) for /usr/local/cuda on the hosts.
FAKE_CUDA = PAYLOAD / "cuda"
COMMUNICATORS = "python/sglang/srt/distributed/device_communicators"
SIZES_FILE = f"{COMMUNICATORS}/all_reduce_utils.py"
SYMM_MEM_FILE = f"{COMMUNICATORS}/torch_symm_mem.py"
IDENTITY = ["-c", "user.name=SGLang Sim", "-c", "user.email=sim@sglang.invalid", "-c", "commit.gpgsign=false"]
BASE_DATE = 1793534400  # 2026-11-01T12:00:00Z; commit n is dated n hours later, so shas are reproducible.
SM120_SIZES = """    12: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
"""


def git(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run git isolated from the caller's config; raise with git's own words on failure."""
    base = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0"}
    proc = subprocess.run(["git", *args], cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True)
    if proc.returncode != 0:
        detail = proc.stderr.strip() or proc.stdout.strip()
        raise RuntimeError(f"git {' '.join(args)} failed ({proc.returncode}): {detail}")
    return proc.stdout.strip()


def commit_env(number: int) -> dict[str, str]:
    stamp = f"@{BASE_DATE + number * 3600} +0000"
    return {"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp}


def copy_tree(dest: Path) -> None:
    shutil.copytree(TREE, dest, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build", "dist"))


def commit_all(work: Path, message: str, number: int) -> str:
    git("add", "-A", cwd=work)
    git(*IDENTITY, "commit", "-q", "-m", message, cwd=work, env=commit_env(number))
    return git("rev-parse", "HEAD", cwd=work)


def build_upstream(bare_path: Path) -> str:
    """Create (or reset) a bare repo whose main holds the sglang-shaped tree; returns main's sha, the same every run."""
    bare_path = Path(bare_path)
    git("init", "-q", "--bare", "-b", "main", str(bare_path))
    (bare_path / "git-daemon-export-ok").touch()
    with tempfile.TemporaryDirectory(prefix="gpufleet-upstream-") as tmp:
        work = Path(tmp) / "sglang"
        git("init", "-q", "-b", "main", str(work))
        copy_tree(work)
        sha = commit_all(work, "Initial sglang tree (simulated upstream)", 0)
        # Forced, so rebuilding over a repo whose main has moved resets it to the initial tree.
        git("push", "-q", "--force", str(bare_path), "main:main", cwd=work)
    return sha


def write_files(work: Path, files: dict[str, str | None]) -> None:
    for rel, text in files.items():
        target = work / rel
        if text is None:
            target.unlink(missing_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)


def add_upstream_commit(bare_path: Path, files: dict[str, str | None], message: str) -> str:
    """Commit files (path -> text; None deletes) on main through a temporary clone; returns the new sha."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-upstream-") as tmp:
        work = Path(tmp) / "sglang"
        git("clone", "-q", "-b", "main", str(bare_path), str(work))
        write_files(work, files)
        number = int(git("rev-list", "--count", "HEAD", cwd=work))
        sha = commit_all(work, message, number)
        git("push", "-q", "origin", "main:main", cwd=work)
    return sha


def add_sizes_entry(text: str) -> str:
    """Add the capability-12 row after the capability-10 row of TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES."""
    if re.search(r"^\s*12: \{", text, re.M):
        return text
    row10 = re.search(r"^    10: \{\n(?:        .*\n)*?    \},\n", text, re.M)
    if row10 is None:
        raise ValueError("no capability-10 row in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    return text[: row10.end()] + SM120_SIZES + text[row10.end():]


def add_multimem_entry(text: str) -> str:
    """Add `12: [6, 8]` after the capability-10 line of _WORLD_SIZES_MULTIMEM."""
    if re.search(r"_WORLD_SIZES_MULTIMEM = \{[^}]*\b12: \[", text):
        return text
    row10 = re.search(r"(_WORLD_SIZES_MULTIMEM = \{\n(?:.*\n)*?)(\s*)(10: \[[^\]]*\],\n)", text)
    if row10 is None:
        raise ValueError("no capability-10 entry in _WORLD_SIZES_MULTIMEM")
    return text[: row10.end()] + row10.group(2).lstrip("\n") + "12: [6, 8],\n" + text[row10.end():]


def clone_with_local_edits(bare_path: Path, dest: Path) -> None:
    """Clone main to dest and make the two local SM120 edits as uncommitted changes, like /root/sglang-main."""
    dest = Path(dest)
    git("clone", "-q", "-b", "main", str(bare_path), str(dest))
    # The operators who ran `git stash` on the real boxes had an identity; so does this checkout.
    git("config", "user.name", "root", cwd=dest)
    git("config", "user.email", "root@localhost", cwd=dest)
    for rel, edit in ((SIZES_FILE, add_sizes_entry), (SYMM_MEM_FILE, add_multimem_entry)):
        path = dest / rel
        path.write_text(edit(path.read_text()))


def install_fake_cuda(root: Path) -> Path:
    """Copy the CUDA toolkit stand-in to root (e.g. <container>/usr/local/cuda); returns root."""
    shutil.copytree(FAKE_CUDA, root, dirs_exist_ok=True)
    (Path(root) / "bin" / "nvcc").chmod(0o755)
    return Path(root)
