"""A fleet lock: the full stack of a canary proven healthy, recorded so every later host gets exactly that."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError

from gpufleet.config.util import read_toml, validation_error
from gpufleet.config.series import patches_digest
from gpufleet.errors import ConfigError
from gpufleet.remote.versions import versions_match
from packaging.utils import canonicalize_name

FORMAT = 1
# Built or checked out on the host, never taken from an index: the lock's commit and build key govern them.
NOT_PINNED = ("sglang", "sgl-kernel")

Sha256 = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{64}$")]
Commit = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{7,40}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LockMeta(_Strict):
    format: int
    created: str
    canary: str
    command: str = ""


class LockSglang(_Strict):
    commit: Commit
    patches: Sha256  # sha256 of patches/sglang (series and every patch it names)


class LockKernel(_Strict):
    build_key: Sha256 | None = None
    patches: Sha256


class LockWheel(_Strict):
    name: str
    version: str
    filename: Annotated[str, StringConstraints(pattern=r"^[^/]+\.whl$")]
    url: str = ""
    sha256: Sha256


class LockSpeed(_Strict):
    """The canary's decode speed on the old stack and on this one (the roll's speed gate), tokens per second."""

    host: str
    before_tokens_per_second: float
    after_tokens_per_second: float
    concurrency: int
    max_tokens: int


class FleetLock(_Strict):
    """What a lock file holds; `path` is where it was read from or written to."""

    lock: LockMeta
    sglang: LockSglang
    sgl_kernel: LockKernel
    packages: dict[str, str]  # every distribution in the canary's venv -> version
    wheels: list[LockWheel] = []  # files the control node handed the canary
    speed: LockSpeed | None = None  # the speed gate's two figures on the canary, when it measured them
    path: str = Field("", exclude=True)

    def constraints(self) -> list[str]:
        """`name==version` for every locked distribution pip may take from an index."""
        return [f"{name}=={version}" for name, version in sorted(self.packages.items()) if name not in NOT_PINNED]

    def file_hashes(self) -> dict[str, str]:
        return {w.filename: w.sha256 for w in self.wheels}


def load(path: str | Path) -> FleetLock:
    """Read and validate a lock file; every problem names the file, the field and the value."""
    data = read_toml(path)
    meta = data.get("lock")
    if isinstance(meta, dict) and meta.get("format") not in (None, FORMAT):
        raise ConfigError(str(path), f"lock format {meta['format']!r} is not {FORMAT}: written by another "
                                     f"gpufleet version", field="lock.format", value=meta["format"], has_value=True)
    try:
        found = FleetLock(**data)
    except ValidationError as exc:
        raise validation_error(exc, path, FleetLock) from None
    packages = {str(canonicalize_name(n)): v for n, v in found.packages.items()}
    return found.model_copy(update={"packages": packages, "path": str(path)})


def render(found: FleetLock, note: str = "") -> str:
    """The lock as TOML, with a header saying what it is."""
    import tomlkit  # only a canary that records a lock writes one

    doc = tomlkit.document()
    doc.add(tomlkit.comment("gpufleet fleet lock: the stack of a canary that passed its health gate."))
    doc.add(tomlkit.comment("`inv upgrade --lock THIS` converges hosts to it; `inv status --lock THIS` compares."))
    if note:
        doc.add(tomlkit.comment(note))
    data = found.model_dump(exclude={"path"})
    for key in ("lock", "sglang", "sgl_kernel"):
        doc[key] = {k: v for k, v in data[key].items() if v is not None}
    if data.get("speed"):
        doc["speed"] = data["speed"]
    doc["packages"] = dict(sorted(data["packages"].items()))
    if data["wheels"]:  # an empty array of tables is written as `wheels = []` above the header
        wheels = tomlkit.aot()
        for wheel in sorted(data["wheels"], key=lambda w: w["filename"]):
            wheels.append(tomlkit.item(wheel))
        doc["wheels"] = wheels
    return tomlkit.dumps(doc)


def save(found: FleetLock, directory: Path, stamp: str) -> Path:
    """Write `<directory>/<stamp>-<canary>.toml` atomically; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{stamp}-{found.lock.canary}.toml"
    tmp = path.with_suffix(".toml.tmp")
    tmp.write_text(render(found))
    os.replace(tmp, path)
    return path


def locks_dir(default: Path) -> Path:
    """Where roll-recorded locks go: $GPUFLEET_LOCKS_DIR, else the repo's locks/."""
    return Path(os.environ.get("GPUFLEET_LOCKS_DIR") or default)


@dataclass
class LockDrift:
    """How one host differs from a lock; empty lists mean it matches."""

    host: str
    packages: list[str] = field(default_factory=list)  # "torch: 2.9.1 (lock: 2.12.0...)" / "absent (lock: ...)"
    other: list[str] = field(default_factory=list)  # sglang commit, sgl-kernel build
    extra: list[str] = field(default_factory=list)  # installed here, not in the lock (shown; not installed by us)

    @property
    def matches(self) -> bool:
        """Every locked distribution at its version, the commit and the build: extras alone do not break a match."""
        return not (self.packages or self.other)

    def to_json(self) -> dict:
        return {"host": self.host, "matches": self.matches, "packages": self.packages, "other": self.other,
                "extra": self.extra}


def compare(found: FleetLock, host: str, packages: dict[str, str], head: str | None,
            build_key: str | None) -> LockDrift:
    """Every locked distribution the host lacks or has at another version, every extra one, the commit, the build."""
    drift = LockDrift(host)
    have = {str(canonicalize_name(n)): v for n, v in packages.items()}
    for name, want in sorted(found.packages.items()):
        got = have.get(name)
        if got is None:
            drift.packages.append(f"{name}: absent (lock: {want})")
        elif not versions_match(got, want):
            drift.packages.append(f"{name}: {got} (lock: {want})")
    for name in sorted(set(have) - set(found.packages)):
        drift.extra.append(f"{name}: {have[name]} is not in the lock")
    if head is None:
        drift.other.append("sglang checkout: unreadable")
    elif not head.startswith(found.sglang.commit) and not found.sglang.commit.startswith(head):
        drift.other.append(f"sglang commit {head[:12]} (lock: {found.sglang.commit[:12]})")
    if found.sgl_kernel.build_key and build_key != found.sgl_kernel.build_key:
        drift.other.append(f"sgl-kernel build {(build_key or 'unknown')[:12]} (lock: "
                           f"{found.sgl_kernel.build_key[:12]})")
    return drift


def check_patches(stack, found: FleetLock, host: str | None = None) -> None:
    """The site's patch series must be the ones the lock was proven with."""

    for section, where in (("sglang", stack.sglang.patches), ("sgl_kernel", stack.sgl_kernel.patches)):
        recorded = getattr(found, section).patches
        if patches_digest(where) != recorded:
            raise ConfigError(found.path, f"the patch series in {where} is not the one this lock was proven with "
                                          f"(sha256 {patches_digest(where)[:12]}): restore those patches or record "
                                          f"a new lock", host=host, field=f"{section}.patches",
                              value=recorded, has_value=True)
