"""The sgl-kernel build key and wheel cache: on the host under BUILDS_DIR/<key>/, on the control node locally."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet.engine.detached import BUILDS_DIR
from gpufleet.cachedir import cache_root



@dataclass(frozen=True)
class BuildInputs:
    """Everything that decides the built wheel's content."""

    torch: str
    cuda: str
    arch: str
    source_tree: str  # git rev-parse HEAD:sgl-kernel of the checkout
    patches: str  # sha256 of the patch series and its patches
    fp4: bool
    extra_cmake_args: tuple[str, ...] = ()
    compile_threads: int = 1
    defines: tuple[tuple[str, str], ...] = ()  # the stack's -D options (they change which archs are built)

    def key(self) -> str:
        data = {**asdict(self), "extra_cmake_args": list(self.extra_cmake_args)}
        if self.defines:
            data["defines"] = dict(self.defines)
        else:  # keys of builds recorded before options existed stay the same
            data.pop("defines")
        data = json.dumps(data, sort_keys=True)
        return hashlib.sha256(data.encode()).hexdigest()


def host_dir(key: str) -> str:
    return f"{BUILDS_DIR}/{key}"


def record_path(key: str) -> str:
    return f"{host_dir(key)}/record.json"


def installed_record(venv: str) -> str:
    """Which build a venv's sgl-kernel came from; it lives in the venv so a restored venv brings its own record."""
    return f"{venv}/gpufleet-sgl-kernel.json"


@dataclass
class Record:
    """What was built or installed under a key, written as record.json on the host and in the local cache."""

    key: str
    inputs: dict
    wheel: str
    archs: list[str] = field(default_factory=list)
    fp4: bool = False
    seconds: float = 0.0
    origin: str = "built-here"  # or "copied-from <host>"
    libraries: dict = field(default_factory=dict)  # each built library: archs and PTX read off it, and how
    fp4_ops: dict = field(default_factory=dict)  # FP4 op -> the module that exports it
    torch: str = ""
    cuda: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Record | None":
        try:
            data = json.loads(text)
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (ValueError, TypeError, KeyError):
            return None


class LocalCache:
    """Wheels on the control node, one directory per key holding the wheel and its record.json."""

    def __init__(self, root: Path | None = None):
        root = root or cache_root() / "sgl-kernel"
        self.root = Path(root)

    def wheel(self, key: str) -> Path | None:
        found = sorted((self.root / key).glob("*.whl")) if (self.root / key).is_dir() else []
        return found[0] if found and (self.root / key / "record.json").exists() else None

    def record(self, key: str) -> Record | None:
        p = self.root / key / "record.json"
        return Record.from_json(p.read_text()) if p.exists() else None

    def store(self, record: Record, wheel_bytes_from: Path) -> Path:
        d = self.root / record.key
        tmp = self.root / f".{record.key}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        shutil.copy(wheel_bytes_from, tmp / Path(record.wheel).name)
        (tmp / "record.json").write_text(record.to_json())
        shutil.rmtree(d, ignore_errors=True)
        tmp.rename(d)  # a reader never sees a wheel without its record
        return d / Path(record.wheel).name


def fetch_to_cache(session, key: str, cache: LocalCache) -> Path | None:
    """Copy a host's built wheel and record into the local cache over SFTP; None when the host has none."""
    try:
        record = Record.from_json(session.get_text(record_path(key)))
    except OSError:
        return None
    if record is None or record.key != key:
        return None
    tmp = cache.root / f".{key}.download.whl"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    session.get(record.wheel, tmp)
    try:
        return cache.store(record, tmp)
    finally:
        tmp.unlink(missing_ok=True)


def push_from_cache(session, key: str, cache: LocalCache) -> str:
    """Upload a cached wheel to the host's build dir over SFTP; returns its remote path."""
    wheel = cache.wheel(key)
    if wheel is None:
        raise FileNotFoundError(f"no cached sgl-kernel wheel for key {key[:12]}")
    if not session.alive:
        session.open()
    from gpufleet.engine.command import Cmd

    session.run(Cmd.of("mkdir", "-p", f"{host_dir(key)}/cached"), "prepare cache upload")
    remote = f"{host_dir(key)}/cached/{wheel.name}"
    session.put(wheel, remote)
    return remote
