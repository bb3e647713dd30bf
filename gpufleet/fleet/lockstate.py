"""Fleet locks against real hosts: record the canary's stack, compare a host with a lock."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

from gpufleet.config import series
from gpufleet import roles as registry
from gpufleet.kernel import buildcache
from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError
from gpufleet.facts.gather import gather_facts
from gpufleet.config.lock import (FORMAT, FleetLock, LockDrift, LockKernel, LockMeta, LockSglang, LockWheel,
                                  check_patches, compare)
from gpufleet.roleapi import packages


class LockRecordError(GpufleetError):
    """The canary's stack could not be recorded as a lock."""


def host_build_key(session) -> str | None:
    """The build key of the sgl-kernel in the host's venv (gpufleet's record there), None when unknown."""
    path = buildcache.installed_record(session.host.venv)
    result = session.run(Cmd.of("cat", path), step="sgl-kernel build record", check=False)
    record = buildcache.Record.from_json(result.output.strip() or "null") if result.exit_code == 0 else None
    return record.key if record else None


def drift(session, found: FleetLock) -> LockDrift:
    """How the host differs from the lock: packages, sglang commit, sgl-kernel build."""
    facts = gather_facts(session)
    if facts.packages is None:
        raise LockRecordError(f"host {session.name}: the venv's packages could not be read "
                              f"({'; '.join(facts.problems) or 'no package list'})")
    head = facts.checkout.head if facts.checkout and facts.checkout.present else None
    return compare(found, session.name, facts.packages, head, host_build_key(session))


def record(session, stack, wheels: list[dict], command: str) -> FleetLock:
    """The canary's full stack as it is now: every distribution, the sglang commit, patch series, build key, and
    the wheel files the control node handed it (name, version, file, URL, sha256)."""
    facts = gather_facts(session)
    if facts.packages is None or not (facts.checkout and facts.checkout.present and facts.checkout.head):
        raise LockRecordError(f"host {session.name}: cannot record a lock: the venv's packages or the sglang "
                              f"checkout could not be read ({'; '.join(facts.problems) or 'no details'})")
    seen = {}
    for w in wheels:  # a file handed over twice (two roles) is one entry
        seen[w["filename"]] = LockWheel(name=w["name"], version=w["version"], filename=w["filename"],
                                        url=w.get("url", ""), sha256=w["sha256"])
    return FleetLock(
        lock=LockMeta(format=FORMAT, created=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                      canary=session.name, command=command),
        sglang=LockSglang(commit=facts.checkout.head, patches=series.patches_digest(Path(stack.sglang.patches))),
        sgl_kernel=LockKernel(build_key=host_build_key(session),
                              patches=series.patches_digest(Path(stack.sgl_kernel.patches))),
        packages=dict(sorted(facts.packages.items())),
        wheels=list(seen.values()))


def locked_stack(stack, found: FleetLock, host: str | None = None):
    """The host's stack with the lock's version of every package a role pins (torch, flashinfer) and its sglang
    commit; the site's patches must be the lock's. Where stack.toml says otherwise the lock wins: converging to a
    recorded, proven stack is the point."""
    check_patches(stack, found, host)
    for package in packages(registry.ROLES):
        if package.pin and package.name in found.packages:
            stack = package.pin(stack, found.packages[package.name])
    return stack.model_copy(update={"sglang": stack.sglang.model_copy(update={"commit": found.sglang.commit})})
