"""flashinfer role: python, cubin and jit-cache at one version, installed together; then a fresh JIT cache."""

from __future__ import annotations

import json

from gpufleet import remote
from gpufleet.engine.command import Cmd
from gpufleet.wheels.fetch import wheel_filename
from gpufleet.plan import PlanContext, Step, Unchanged, Upload
from gpufleet.remote.versions import versions_match
from gpufleet.roleapi import Declares, Import, Package
from gpufleet.roles.pip import (WHEEL_DIR, installed_packages, needs_versions, pushed_install,
                                venv_python, wanted_by)

name = "flashinfer"


def _pin_jit_cache(stack, version: str):
    """A lock's jit-cache version sets the stack's label (none when the locked wheel has none)."""
    fi = stack.flashinfer
    jit_cache = fi.jit_cache.model_copy(update={"local_version": version.partition("+")[2] or None})
    return stack.model_copy(update={"flashinfer": fi.model_copy(update={"jit_cache": jit_cache})})


declares = Declares(
    section="flashinfer",
    packages=(Package.at("flashinfer-python", "flashinfer.version", heading="flashinfer"),
              # cubin is python's version exactly: a lock's python version pins both
              Package("flashinfer-cubin", want=lambda stack: stack.flashinfer.version, heading="fi-cubin"),
              Package("flashinfer-jit-cache", want=lambda stack: stack.flashinfer.jit_cache_version,
                      pin=_pin_jit_cache, heading="fi-jit-cache")),
    imports=(Import("flashinfer", ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache")),))
PACKAGES = tuple(p.name for p in declares.packages)
SOURCES = {"flashinfer-python": "python", "flashinfer-cubin": "cubin", "flashinfer-jit-cache": "jit_cache"}
JIT_CACHE = "$HOME/.cache/flashinfer"

# exit 0 (clear needed): the JIT cache holds an entry older than the installed flashinfer-python
_STALE_CACHE = remote.text("flashinfer_stale_cache.sh")

def targets(stack) -> dict[str, str]:
    """The version each of the three packages must have (jit-cache carries the CUDA label)."""
    return {p.name: p.wanted(stack) for p in declares.packages}


def rules_cmd(ctx: PlanContext) -> Cmd:
    """The version rules (cubin == python, jit-cache public == python, all as pinned), then import flashinfer."""
    return Cmd.of(venv_python(ctx), "-c", remote.program("flashinfer_check.py", "versions.py"),
                  json.dumps(targets(ctx.stack)), cwd="/")


def stale_cache_cmd(ctx: PlanContext) -> Cmd:
    return Cmd.of("bash", "-c", _STALE_CACHE, "stale-jit-cache", ctx.host.venv)


def _requirements(ctx: PlanContext) -> tuple[list[str], list[str], list[Upload]]:
    """Requirement strings of index-sourced packages, their index URLs in order (python's first), and the uploads
    of URL-pinned wheels."""
    reqs, indexes, uploads = [], [], []
    for package, version in targets(ctx.stack).items():
        source = getattr(ctx.stack.flashinfer, SOURCES[package])
        if source.url:
            uploads.append(Upload(source.url, source.sha256, f"{WHEEL_DIR}/{wheel_filename(source.url)}",
                                  package, version))
        else:
            reqs.append(f"{package}=={version}")
            indexes.append(source.index_url)
    return reqs, list(dict.fromkeys(indexes)), uploads


def install_step(ctx: PlanContext, have: dict[str, str | None]) -> Step:
    want = targets(ctx.stack)
    reqs, indexes, by_url = _requirements(ctx)
    # One resolution and one install for all three: a version missing from an index changes nothing, and the three
    # never end up at different versions (flashinfer refuses to import then).
    pins, uploads, cmd = pushed_install(ctx, name, reqs, index_url=indexes[0] if indexes else None,
                                        extra_index_urls=indexes[1:], extra_uploads=tuple(by_url))
    had = ", ".join(f"{p} {have[p] or '(absent)'}" for p in PACKAGES)
    wanted = ", ".join(f"{p} {want[p]}" for p in PACKAGES)
    others = sorted(n for n in pins if n not in PACKAGES)
    return Step(role=name, title=f"install flashinfer {want['flashinfer-python']} (python, cubin, jit-cache "
                                 f"{want['flashinfer-jit-cache']})",
                reason=f"venv has {had}; {wanted_by(ctx)} {wanted} (the three move together"
                       + (f"; brings {', '.join(others)}" if others else "") + f"); {len(uploads) - 1} wheel(s) "
                       f"handed over by the control node",
                commands=(cmd,), needed=needs_versions(ctx, {**want, **pins}), verify=(rules_cmd(ctx),),
                changes=("venv",), uploads=uploads)


def clear_cache_step(ctx: PlanContext, reason: str) -> Step:
    return Step(role=name, title="clear flashinfer's JIT cache (~/.cache/flashinfer)", reason=reason,
                commands=(Cmd.of("bash", "-c", f'rm -rf -- "{JIT_CACHE}"'),), needed=stale_cache_cmd(ctx),
                changes=("cache",))


def plan(ctx: PlanContext) -> list[Step | Unchanged]:
    """Install the three packages when any differs and clear the JIT cache after; else say why not."""
    packages = installed_packages(ctx, name)
    want = targets(ctx.stack)
    have = {p: packages.get(p) for p in PACKAGES}
    if any(not versions_match(have[p], want[p]) for p in PACKAGES):
        old = have["flashinfer-python"] or "none"
        return [install_step(ctx, have),
                clear_cache_step(ctx, f"kernels JIT-compiled by flashinfer {old} must not be reused by "
                                      f"{want['flashinfer-python']}")]
    installed = (f"flashinfer-python and flashinfer-cubin {want['flashinfer-python']}, flashinfer-jit-cache "
                 f"{want['flashinfer-jit-cache']} already installed")
    items: list[Step | Unchanged] = [Unchanged(name, installed)]
    if ctx.read is None:
        items.append(Unchanged(name, "JIT cache not looked at (no probe); it is cleared whenever flashinfer changes"))
    elif ctx.read(stale_cache_cmd(ctx), "stale JIT cache?").exit_code == 0:
        items.append(clear_cache_step(ctx, "the JIT cache holds entries older than the installed flashinfer "
                                           "(left by an earlier version)"))
    else:
        items.append(Unchanged(name, "the JIT cache holds nothing older than the installed flashinfer"))
    return items
