"""The simulated upstream sglang git repository, its moves, and the hosts' checkout with the two local SM120 edits.

Real upstream sgl-project/sglang is the ground truth: wherever gpufleet relies on upstream, the payload
(payload/sglang/) repeats upstream's lines. Mirrored file versions (sgl-project/sglang commits):

* pinned era (build_upstream's initial commit):
  - python/sglang/srt/distributed/device_communicators/all_reduce_utils.py at 25b38cc2abad2667508ad11d25192e275d60936f:
    TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES, line for line.
  - .../device_communicators/torch_symm_mem.py at 5a7255c6fb5709a643e9a0bf22dbba12d4c424a8: the table's import,
    `class TorchSymmMemCommunicator:`, the comments and `_WORLD_SIZES_MULTIMEM`, the
    `def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):` signature and its checks
    (a capability without a table row raises KeyError, as upstream).
  - sgl-kernel/CMakeLists.txt at 00390b8633f913f53d98d3acdbc1ab8f0d62da1b: cmake_minimum_required, project, the
    CMP0169/CMP0177 policies, find_package(Python/CUDAToolkit/Torch), the CUDA_VERSION messages, the options,
    SGL_KERNEL_CUDA_FLAGS and every gencode block (FA3 forced on for CUDA >= 12.4), FetchContent of repo-cutlass
    (GIT_TAG: the stand-in GitHub's sha, see build_github), the common_ops_sm90_build/common_ops_sm100_build
    targets installed to sgl_kernel/sm90 and sgl_kernel/sm100, and the FA3 flash_ops block.
  - sgl-kernel/pyproject.toml (scikit-build-core, sgl-kernel 0.3.21) and sgl_kernel's loader
    (sgl-kernel/python/sgl_kernel/load_utils.py at 00acd8d762839f5a5bded5b28cc94e77f2e9dea7: sm90/ for capability
    9.0, sm100/ otherwise, the "[sgl_kernel] CRITICAL: Could not load any common_ops library!" error).
* mid-2026 layout (add_new_layout_commit): the kernel under python/sglang/kernels/aot/ as
  python/sglang/kernels/aot/pyproject.toml at 008b79d2358b08adf9b6c879625030f890c8c4e2 (pip name sglang-kernel,
  0.4.6.post1; the CMake project keeps its name), torch_symm_mem.py at 0cd72ba41d483ac6c1ea96f056b2bcbfb4365121
  (table defined at its end, class derives BaseCommunicator), all_reduce_utils.py unchanged (stale).

Stand-ins reproduce paths, names, shapes, the lines patches touch and the build's options, not upstream's code: the
kernels are toys, torch is gpufleet's stand-in wheel (cmake/FindTorch.cmake stands in for torch's CMake package).
"""

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


# The stand-in "GitHub": small repositories at the URLs upstream's CMakeLists fetches (FetchContent), one commit
# each with a fixed date and identity so their shas are the same every run; the payload's GIT_TAG names that sha.
GITHUB_IDENTITY = ["-c", "user.name=GitHub Sim", "-c", "user.email=github-sim@sglang.invalid",
                   "-c", "commit.gpgsign=false"]
GITHUB_DATE = 1767268800  # 2026-01-01T12:00:00Z
CUTLASS_REPO = "NVIDIA/cutlass"
CUTLASS_FILES = {
    "README.md": "# CUTLASS (simulated)\n\nA stand-in for https://github.com/NVIDIA/cutlass served to the gpufleet "
                 "simulated fleet: the one header the simulated sgl-kernel includes.\n",
    "include/cutlass/cutlass.h": """// Stand-in for CUTLASS's include/cutlass/cutlass.h (gpufleet simulated GitHub).
#pragma once

#define CUTLASS_MAJOR 4
#define CUTLASS_MINOR 2
#define CUTLASS_PATCH 1

#if defined(__CUDACC__)
#define CUTLASS_HOST_DEVICE __forceinline__ __device__ __host__
#else
#define CUTLASS_HOST_DEVICE inline
#endif

namespace cutlass {

CUTLASS_HOST_DEVICE float silu(float x) { return x / (1.0f + expf(-x)); }

}  // namespace cutlass
""",
}
GITHUB_REPOS = {CUTLASS_REPO: CUTLASS_FILES}


def build_github(root: Path) -> dict[str, str]:
    """Create (or reset) bare repos root/<owner>/<name>.git for GITHUB_REPOS; returns {owner/name: main's sha}.
    Served by a git daemon whose base path is root, so git://<addr>/NVIDIA/cutlass stands for
    https://github.com/NVIDIA/cutlass (stack.toml's sgl_kernel.source_mirrors maps one onto the other)."""
    shas = {}
    for repo, files in GITHUB_REPOS.items():
        bare = Path(root) / f"{repo}.git"
        bare.parent.mkdir(parents=True, exist_ok=True)
        git("init", "-q", "--bare", "-b", "main", str(bare))
        (bare / "git-daemon-export-ok").touch()
        with tempfile.TemporaryDirectory(prefix="gpufleet-github-") as tmp:
            work = Path(tmp) / "repo"
            git("init", "-q", "-b", "main", str(work))
            write_files(work, files)
            git("add", "-A", cwd=work)
            stamp = f"@{GITHUB_DATE} +0000"
            git(*GITHUB_IDENTITY, "commit", "-q", "-m", f"{repo} (simulated)", cwd=work,
                env={"GIT_AUTHOR_DATE": stamp, "GIT_COMMITTER_DATE": stamp})
            git("push", "-q", "--force", str(bare), "main:main", cwd=work)
            shas[repo] = git("rev-parse", "HEAD", cwd=work)
    return shas


def github_sha(repo: str = CUTLASS_REPO) -> str:
    """The sha build_github gives repo's main, computed without a repository (git hash-object on a temp tree)."""
    with tempfile.TemporaryDirectory(prefix="gpufleet-github-") as tmp:
        return build_github(Path(tmp))[repo]


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


# ---- the mid-2026 layout ------------------------------------------------------------------------------------------
# Upstream later moved sgl-kernel to python/sglang/kernels/aot/ (pip name sglang-kernel, 0.4.x; the CMake project
# keeps its name) and moved TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES into torch_symm_mem.py, leaving all_reduce_utils.py's
# copy stale (nothing imports it any more).
OLD_KERNEL_DIR = "sgl-kernel"
NEW_KERNEL_DIR = "python/sglang/kernels/aot"
NEW_KERNEL_VERSION = "0.4.6.post1"
BASE_FILE = f"{COMMUNICATORS}/base.py"
NEW_BASE = '''"""gpufleet simulated sglang: the part of upstream's device_communicators/base.py torch_symm_mem.py uses."""

import enum
import functools


class AllReduceMode(enum.Enum):
    INPLACE = "inplace"
    OUTPLACE = "outplace"


class BaseCommunicator:
    name = "base"

    def __init__(self, world_size: int):
        self.world_size = world_size
        self.disabled = False

    def assert_outplace(self, op: str, inplace) -> None:
        assert not inplace, f"{self.name}: {op} is out-of-place only"

    @staticmethod
    def validate(method):
        @functools.wraps(method)
        def wrapper(self, *args, **kwargs):
            assert not self.disabled, f"{self.name} is disabled"
            return method(self, *args, **kwargs)

        return wrapper
'''
NEW_SYMM_MEM = '''# Adapted from https://github.com/vllm-project/vllm/blob/bf214ca22625e311a2c4c0dfbf7af19128f4919c/vllm/distributed/device_communicators/symm_mem.py
# gpufleet simulated sglang: upstream's torch_symm_mem.py of mid-2026 (sgl-project/sglang, the file version stored at
# commit 0cd72ba41d483ac6c1ea96f056b2bcbfb4365121): the class derives BaseCommunicator, raises RuntimeError where the
# older one disabled itself, and TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES is defined at the end of this module.
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Union

import torch

from .base import AllReduceMode, BaseCommunicator

if TYPE_CHECKING:
    from torch.distributed import ProcessGroup

logger = logging.getLogger(__name__)


class TorchSymmMemCommunicator(BaseCommunicator):
    """
    Thin wrapper around torch-symmetric-memory collectives.

    This communicator:
      - Validates device capability and world size.
      - Chooses between 'multimem' and 'two-shot' all-reduce kernels.

    If any prerequisite is not met, the instance remains disabled and will
    decline to perform symmetric-memory all-reduce.
    """

    name = "torch_symm_mem"

    # Mapping: compute capability major -> supported world sizes for multimem
    # If the current (cc_major, world_size) is not listed, we fall back
    # to the two-shot path.
    _WORLD_SIZES_MULTIMEM = {
        9: [4, 6, 8],
        10: [6, 8],
    }

    def __init__(self, group: ProcessGroup, device: Union[int, str, torch.device]):
        """
        Args:
            group: Torch process group used for rendezvous and naming.
            device: Target CUDA device (index, 'cuda:X', or torch.device).
        """

        torch.cuda.set_device(device)
        self.device = device
        self.group = group
        # upstream: dist.get_world_size(self.group)
        self.world_size = group.size()
        self.device_capability = torch.cuda.get_device_capability(device)[0]
        if self.device_capability < 9:
            raise RuntimeError(
                "TorchSymmMemCommunicator: "
                f"Device capability {self.device_capability} not supported, "
                "communicator is not available."
            )
        if (
            self.world_size
            not in TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability]
        ):
            raise RuntimeError(
                "TorchSymmMemCommunicator: "
                f"World size {self.world_size} not supported, "
                "communicator is not available."
            )
        self.max_size = TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES[self.device_capability][
            self.world_size
        ]
        super().__init__(world_size=self.world_size)

    def get_all_reduce_mode(self, input_size: int) -> Optional[AllReduceMode]:
        if self.disabled or input_size % 4 != 0:
            return None
        return AllReduceMode.OUTPLACE if input_size < self.max_size else None

    @property
    def kernel(self) -> Optional[str]:
        """The all-reduce all_reduce() would run: upstream indexes _WORLD_SIZES_MULTIMEM by capability there."""
        if self.disabled:
            return None
        if self.world_size in self._WORLD_SIZES_MULTIMEM[self.device_capability]:
            return "multimem"
        return "two_shot"


MiB = 1024 * 1024

TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {
    9: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
    10: {
        2: 64 * MiB,  # 64 MB
        4: 64 * MiB,  # 64 MB
        6: 128 * MiB,  # 128 MB
        8: 128 * MiB,  # 128 MB
    },
}
'''


def _new_kernel_text(rel: str, text: str) -> str:
    """A kernel file as it reads after the move (rel relative to the kernel directory)."""
    if rel == "pyproject.toml":
        text = re.sub(r'^name = "sgl-kernel"$', 'name = "sglang-kernel"', text, flags=re.M)
        text = re.sub(r'^version = "[^"]+"$', f'version = "{NEW_KERNEL_VERSION}"', text, flags=re.M)
        text = text.replace('"torch==2.9.1"', '"torch==2.13.0"')
        text = text.replace("/tree/main/sgl-kernel", f"/tree/main/{NEW_KERNEL_DIR}")
    elif rel == "python/sgl_kernel/version.py":
        text = f'__version__ = "{NEW_KERNEL_VERSION}"\n'
    return text


def new_layout_files(tree: Path = TREE) -> dict[str, str | None]:
    """The mid-2026 layout as a change to the pinned-era tree (path -> text; None deletes), for add_upstream_commit:
    sgl-kernel/ moved to python/sglang/kernels/aot/ (pip name sglang-kernel), the size table moved into
    torch_symm_mem.py (which no longer imports all_reduce_utils), all_reduce_utils.py left as it was."""
    tree = Path(tree)
    files: dict[str, str | None] = {}
    for path in sorted((tree / OLD_KERNEL_DIR).rglob("*")):
        if not path.is_file() or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(tree / OLD_KERNEL_DIR).as_posix()
        files[f"{OLD_KERNEL_DIR}/{rel}"] = None
        files[f"{NEW_KERNEL_DIR}/{rel}"] = _new_kernel_text(rel, path.read_text())
    files[SYMM_MEM_FILE] = NEW_SYMM_MEM
    files[BASE_FILE] = NEW_BASE
    return files


def add_new_layout_commit(bare_path: Path) -> str:
    """Move upstream main to the mid-2026 layout (one commit on main); returns its sha."""
    return add_upstream_commit(bare_path, new_layout_files(), "Move sgl-kernel to python/sglang/kernels/aot and the "
                                                              "symm-mem size table into torch_symm_mem.py")


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
