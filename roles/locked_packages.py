"""locked-packages role: with a fleet lock, every other locked distribution at its locked version, handed over."""

from __future__ import annotations

from gpufleet.plan import PlanContext, Step, Unchanged
from gpufleet.remote.versions import versions_match
from gpufleet.roleapi import Declares
from gpufleet.wheels.wheelset import canonical
from gpufleet.roles.pip import installed_packages, needs_versions, pushed_install

name = "locked-packages"
declares = Declares()  # what it installs is the lock's list, not the stack's


def plan(ctx: PlanContext) -> list[Step | Unchanged]:
    """Nothing without a lock (stack.toml's pins decide); Unchanged when the venv has every locked version; else
    one offline install."""
    if ctx.lock is None:
        return []
    have = {canonical(n): v for n, v in installed_packages(ctx, name).items()}
    editable = {canonical(n) for n in (ctx.facts.editables or {})}
    pinned = {r.split("==")[0]: r.split("==", 1)[1] for r in ctx.lock.constraints()}
    differ = {n: v for n, v in pinned.items() if n not in editable and not versions_match(have.get(n), v)}
    if not differ:
        return [Unchanged(name, f"every distribution of {ctx.lock.path} is installed at its locked version")]
    # every index of the stack: a locked distribution may live on the torch or flashinfer index only (triton,
    # nvidia-*), and the pins are exact (with the lock's sha256 where it recorded the file)
    fi = ctx.stack.flashinfer
    indexes = [ctx.stack.torch.index_url, *(src.index_url for src in (fi.python, fi.cubin, fi.jit_cache)
                                            if src.index_url)]
    pins, uploads, cmd = pushed_install(ctx, name, [f"{n}=={v}" for n, v in sorted(differ.items())],
                                        index_url=ctx.stack.pip.index_url, extra_index_urls=indexes,
                                        pre=ctx.stack.torch.pre)
    listed = ", ".join(f"{n} {have.get(n) or '(absent)'} -> {v}" for n, v in sorted(differ.items()))
    return [Step(role=name, title=f"install {len(differ)} locked distribution(s)",
                 reason=f"the lock {ctx.lock.path} (proven on {ctx.lock.lock.canary}) has {listed}",
                 commands=(cmd,), needed=needs_versions(ctx, {**differ, **pins}), changes=("venv",), uploads=uploads)]
