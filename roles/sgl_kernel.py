"""sgl-kernel role: build the wheel from the checkout once per build key, reuse it on every host with that key."""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from dataclasses import dataclass, replace
from pathlib import Path

import tomllib

from packaging.utils import canonicalize_name

from gpufleet.config import series
from gpufleet import remote
from gpufleet.kernel import buildcache
from gpufleet.kernel import cmake
from gpufleet.engine import detached
from gpufleet.kernel import sources
from gpufleet.kernel.buildcache import BuildInputs, LocalCache
from gpufleet.engine import query
from gpufleet.engine.command import Cmd, script
from gpufleet.engine.query import Query
from gpufleet.facts.script import KERNEL_DIRS
from gpufleet import roles as registry
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged, Upload
from gpufleet.remote.versions import versions_match
from gpufleet.roleapi import Cell, Column, Declares, Import, Package, normalized, packages
from gpufleet.roles import pip

name = "sgl-kernel"
FP4_OPS = ("cutlass_scaled_fp4_mm", "scaled_fp4_quant", "scaled_fp4_experts_quant", "cutlass_fp4_group_mm")
GIB = 1024 ** 3
GIB_PER_JOB = 4  # one nvcc job of sgl-kernel needs several GiB; too many jobs is the usual OOM
BUILD_TIMEOUT = 6 * 3600.0
KERNEL_NAMES = ("sgl-kernel", "sglang-kernel")


def protected() -> list[str]:
    """What a build must never let pip change in the venv: every role's pins (upstream's pyproject asks for torch)
    and sgl-kernel itself."""
    return [*dict.fromkeys([*(p.name for p in packages(registry.ROLES) if p.want), *KERNEL_NAMES])]


def build_jobs(cpus: int | None, mem_bytes: int | None, override: int | str = "auto") -> int:
    """Parallel compile jobs: the stack's number, else bounded by cores, RAM (4 GiB a job) and upstream's nproc/3."""
    if isinstance(override, int):
        return max(1, override)
    cpus = max(1, cpus or 1)
    by_mem = (mem_bytes or 0) // GIB // GIB_PER_JOB if mem_bytes else cpus
    return max(1, min(cpus, by_mem, max(1, cpus // 3), 48))


def _cuda(ctx: PlanContext) -> str:
    facts = ctx.facts
    if facts.nvcc_version:
        return facts.nvcc_version
    if facts.gpus is not None and getattr(facts.gpus, "cuda_version", None):
        return facts.gpus.cuda_version
    raise PlanError(ctx.host.name, name, "CUDA version unknown (no nvcc and no driver CUDA version in facts)")


def _package(facts, wanted: str) -> str | None:
    norm = lambda n: n.lower().replace("_", "-").replace(".", "-")  # noqa: E731  PEP 503
    for pkg, ver in (facts.packages or {}).items():
        if norm(pkg) == norm(wanted):
            return ver
    return None


def _sections(text: str) -> dict[str, str]:
    found, cur = {}, None
    for line in text.splitlines():
        if line.startswith(("@@tree ", "@@dir ")):
            tag, _, value = line.partition(" ")
            found[tag[2:]] = value.strip()
            cur = None
        elif line in ("@@installed", "@@record", "@@pyproject", "@@cmake", "@@end"):
            cur = line[2:]
            found.setdefault(cur, "")
        elif cur:
            found[cur] += line + "\n"
    return found


@dataclass(frozen=True)
class Source:
    """The checkout's sgl-kernel as the build sees it: where it lives, its tree, pyproject and CMakeLists at HEAD."""

    directory: str
    tree: str
    pyproject: dict
    cmakelists: str

    @property
    def declared_name(self) -> str:
        return str(self.pyproject.get("project", {}).get("name", ""))

    def build_requires(self) -> list[str]:
        return [str(r) for r in self.pyproject.get("build-system", {}).get("requires", [])]


def inputs(ctx: PlanContext, tree: str) -> BuildInputs:
    """The build key's inputs. The build compiles exactly what the key names: the kernel directory's tree at HEAD
    (exported by _tree_cmd, which refuses a HEAD that moved since the plan) with the patch series the digest covers.
    Uncommitted edits in the checkout are not in the key, so they are not built either: a build from the working
    tree would give one key two different wheels (and the cache would hand the other hosts a wheel made from one
    box's local edits). Keys recorded before stay valid: their meaning is unchanged."""
    cfg = ctx.stack.sgl_kernel
    torch = _package(ctx.facts, "torch")
    if not torch:
        raise PlanError(ctx.host.name, name, "torch is not installed in the venv (the torch role runs first)")
    return BuildInputs(torch=torch, cuda=_cuda(ctx), arch=cfg.arch, source_tree=tree,
                       patches=series.patches_digest(_patch_dir(ctx)), fp4=cfg.enable_fp4,
                       extra_cmake_args=tuple(cfg.extra_cmake_args), compile_threads=cfg.compile_threads,
                       defines=tuple(sorted(cfg.cmake_defines.items())))


def _patch_dir(ctx: PlanContext) -> Path:
    p = Path(ctx.stack.sgl_kernel.patches)
    return p if p.is_absolute() else ctx.repo / p


def _read_tree(ctx: PlanContext, key_hint: str = "", full: bool = False) -> dict[str, str]:
    if ctx.read is None:
        raise PlanError(ctx.host.name, name, "needs a remote probe to read the checkout's sgl-kernel tree")
    return query.read(ctx, tree_query(ctx.host, key_hint, full))


def tree_query(host, key_hint: str = "", full: bool = False) -> Query[dict[str, str]]:
    """The checkout's sgl-kernel at HEAD (with pyproject and CMakeLists when full) and the build records."""
    cmd = Cmd.of("bash", "-c", remote.text("kernel_probe.sh"), "kernel-probe", host.sglang_checkout,
                 "1" if full else "", buildcache.installed_record(host.venv),
                 f"{detached.BUILDS_DIR}/{key_hint or 'none'}/record.json", *KERNEL_DIRS)
    return Query(cmd, lambda host_name, output: _sections(output), "sgl-kernel build state")


def _kernel_tree(ctx: PlanContext, found: dict[str, str]) -> str:
    """The tree of the kernel directory the probe found at HEAD; a clear PlanError when there is none."""
    if not found.get("dir", "") or not found.get("tree", ""):
        raise PlanError(ctx.host.name, name, f"no sgl-kernel in {ctx.host.sglang_checkout} at HEAD (looked for a "
                                             f"pyproject naming {' or '.join(KERNEL_NAMES)} in "
                                             f"{', '.join(d + '/' for d in KERNEL_DIRS)})")
    return found["tree"]


def read_source(ctx: PlanContext, found: dict[str, str]) -> Source:
    """The kernel directory the probe found, with its pyproject parsed; a clear PlanError when there is none."""
    tree = _kernel_tree(ctx, found)
    directory = found["dir"]
    try:
        pyproject = tomllib.loads(found.get("pyproject", ""))
    except tomllib.TOMLDecodeError as exc:
        raise PlanError(ctx.host.name, name, f"{directory}/pyproject.toml at HEAD is not TOML: {exc}") from None
    return Source(directory, tree, pyproject, found.get("cmake", ""))


def plan(ctx: PlanContext, cache: LocalCache | None = None) -> list:
    """Unchanged when the installed wheel has the current key; else install a wheel with that key, or build one."""
    cache = cache or LocalCache()
    # the key needs only the tree: the texts (the CMakeLists is ~22 KB) are read when a build or install is planned,
    # with the host's record of that key, so a converged host's survey sends neither
    found = _read_tree(ctx)
    tree = _kernel_tree(ctx, found)
    built = inputs(ctx, tree)
    key = built.key()
    installed = buildcache.Record.from_json(found.get("installed", "").strip() or "null")
    version = next((v for v in map(lambda n: _package(ctx.facts, n), KERNEL_NAMES) if v), None)
    if installed and installed.key == key and version and version == _wheel_version(installed.wheel):
        return [Unchanged(name, f"sgl-kernel {version} installed from build {key[:12]} (targets "
                                f"{','.join(installed.archs) or '?'})")]
    # the host's record of a build with this key, and the texts a build reads: asked only now, as the key needs the
    # first read's tree
    again = _read_tree(ctx, key, full=True)
    source = read_source(ctx, again)
    if source.tree != tree:
        raise PlanError(ctx.host.name, name, f"{source.directory}/ moved while planning (tree {tree[:10]}, then "
                                             f"{source.tree[:10]}): run again")
    on_host = buildcache.Record.from_json(again.get("record", "").strip() or "null")
    why = (f"venv has sgl-kernel {version or 'none'}"
           + (f" from build {installed.key[:12]}" if installed else " not built by gpufleet")
           + f"; torch {built.torch}, CUDA {built.cuda}, {source.directory}/ tree {source.tree[:10]} want build "
             f"{key[:12]}")
    if on_host and on_host.key == key:
        return [_install_step(ctx, key, on_host.wheel, on_host.origin, f"{why}; a wheel with that key is on the host")]
    cached = cache.wheel(key)
    if cached is not None:
        remote = f"{buildcache.host_dir(key)}/cached/{cached.name}"
        rec = cache.record(key)
        origin = rec.origin.replace("built-here", "copied-from " + rec.inputs.get("host", "?")) if rec else "cache"
        step = _install_step(ctx, key, remote, origin, f"{why}; the control node caches a wheel with that key")
        digest = hashlib.sha256(cached.read_bytes()).hexdigest()
        return [replace(step, uploads=(Upload(cached.resolve().as_uri(), digest, remote),))]
    return [_build_step(ctx, source, built, key, why)]


def _wheel_version(wheel: str) -> str:
    parts = Path(wheel).name.split("-")
    return parts[1] if len(parts) > 1 else ""


def _py(ctx: PlanContext) -> str:
    return f"{ctx.host.venv}/bin/python"


def remote_source(file: str) -> str:
    """The text of a script under gpufleet/remote/ (sent to hosts as an argument, never installed there)."""
    return remote.text(file)


def _verify(ctx: PlanContext, key: str) -> Cmd:
    """The installed record is this build's, and (with FP4 on) it found the FP4 ops where this commit exports them."""
    return Cmd.of("python3", "-c", remote_source("kernel_installed.py"), "verify",
                  buildcache.installed_record(ctx.host.venv), key, "1" if ctx.stack.sgl_kernel.enable_fp4 else "0",
                  cwd="/")


def _record_cmd(ctx: PlanContext, key: str, wheel_expr: str, origin: str, inputs_json: str) -> Cmd:
    """Install the wheel (never its dependencies), then record what it really is, read from the installed files."""
    paths = json.dumps([buildcache.record_path(key), buildcache.installed_record(ctx.host.venv)])
    text = (f"set -e\nwheel={wheel_expr}\n"
            f"[ -f \"$wheel\" ] || {{ echo \"no sgl-kernel wheel at $wheel\"; exit 1; }}\n"
            f"cd /\n{shlex.quote(_py(ctx))} -m pip install --disable-pip-version-check --force-reinstall --no-deps "
            f"\"$wheel\"\n"
            f"{shlex.quote(_py(ctx))} -B -c \"$1\" \"$wheel\" \"${{@:2}}\"\n")
    return Cmd.of("bash", "-c", text, "record", remote_source("kernel_record.py"), origin, inputs_json, key, paths,
                  json.dumps(list(FP4_OPS)), "1" if ctx.stack.sgl_kernel.enable_fp4 else "0",
                  remote_source("kernel_archs.py"), cwd="/", keep_owner=(ctx.host.venv,))


_TOOLS_PRESENT = remote.text("requirements_present.py")  # exit 0 when every requirement is installed


def _tools_cmd(ctx: PlanContext, tools: list[str]) -> Cmd:
    """Install the build tools unless the venv has every one already (a rebuild asks no index)."""
    install = pip.install_cmd(ctx, tools, index_url=ctx.stack.pip.index_url,
                              extra_index_urls=[*ctx.stack.pip.extra_index_urls, ctx.stack.torch.index_url])
    check = Cmd.of(_py(ctx), "-c", _TOOLS_PRESENT, *tools)
    # The install's argv stays arguments (never pasted into the text): an index URL's password is a Secret, kept
    # off sudo's logged command line and out of every display.
    return Cmd.of("bash", "-c", f"{check.render()} 2>/dev/null && exit 0; exec \"$@\"", "build-tools",
                  *install.argv, env=dict(install.env), cwd="/", keep_owner=install.keep_owner)


def _needed(ctx: PlanContext, key: str) -> Cmd:
    """Exit 0 while the venv's sgl-kernel is not from this build (a re-run skips a step another run finished)."""
    return Cmd.of("python3", "-c", remote_source("kernel_installed.py"), "needed",
                  buildcache.installed_record(ctx.host.venv), key)


def _install_step(ctx: PlanContext, key: str, wheel: str, origin: str, why: str) -> Step:
    inputs_json = json.dumps({"key": key})
    return Step(role=name, title=f"install sgl-kernel wheel {Path(wheel).name} (build {key[:12]})", reason=why,
                commands=(_record_cmd(ctx, key, shlex.quote(wheel), origin, inputs_json),),
                needed=_needed(ctx, key), verify=(_verify(ctx, key),), timeout=1800, changes=("venv",))


# Paths the CMakeLists names relative to its own directory that leave it: the mid-2026 layout's
# python/sglang/kernels/aot/CMakeLists.txt reads `${PROJECT_SOURCE_DIR}/../jit/include` (upstream, mid-2026); the
# pinned sgl-kernel/CMakeLists.txt names nothing outside sgl-kernel/ (only cmake/, include/, csrc/ and FetchContent).
_OUTSIDE = re.compile(r"\$\{(?:PROJECT_SOURCE_DIR|CMAKE_CURRENT_SOURCE_DIR|CMAKE_CURRENT_LIST_DIR|CMAKE_SOURCE_DIR)\}"
                      r"/((?:\.\./)+[^\s\"')$;]*)")


def outside_paths(directory: str, cmakelists: str) -> list[str]:
    """Repository paths outside the kernel directory that its CMakeLists reads (the build tree needs them too)."""
    found = []
    for rel in _OUTSIDE.findall(cmakelists):
        path = posixpath.normpath(posixpath.join(directory, rel.rstrip("/")))
        if path not in (".", "..") and not path.startswith("../") and path not in found:
            found.append(path)
    return found


def tree_dir(key: str) -> str:
    """Where the build's own copy of the kernel sources lives (HEAD's tree with the site's patches applied)."""
    return f"{detached.Job.for_key(key).dir}/src"


def _tree_cmd(ctx: PlanContext, source: Source, key: str, patched: str) -> Cmd:
    """Export HEAD's kernel directory (and what its CMakeLists reads outside it) into the build job's own directory
    and apply the site's kernel patches there: the checkout and its .git are only read, never written (no patch, no
    build dir, no __pycache__), so a failed or killed build leaves the checkout as it was, and every host of one
    stack looks the same to `inv patches`. A re-run keeps the tree of a running or finished job and makes a
    half-made or failed one again (remote/kernel_tree.sh)."""
    job = detached.Job.for_key(key)
    pdir = _patch_dir(ctx)
    patches = [part for pname in series.series_names(pdir) for part in (pname, (pdir / pname).read_text())]
    text = remote.text("job_state.sh") + remote.text("kernel_tree.sh") + 'kernel_tree "$@"\n'
    return Cmd.of("bash", "-c", text, "kernel-tree", ctx.host.sglang_checkout, tree_dir(key), source.tree,
                  job.rc_file, job.unit, job.pid_file, source.directory,
                  *outside_paths(source.directory, patched), "--", *patches, cwd="/")


def build_tools(ctx: PlanContext, source: Source) -> list[str]:
    """What the build environment needs: the stack's tools (a CMake new enough for upstream's policies), what the
    pyproject's build-system asks for, and the stack's own packages pinned to what is installed, so that resolving
    a build requirement (upstream asks for torch) can never replace them."""
    # here: packaging's requirement grammar costs ~15 ms to import, which every plan with nothing to build would pay
    from packaging.requirements import InvalidRequirement, Requirement

    wanted: dict[str, str] = {}
    for text in [*ctx.stack.sgl_kernel.build_tools, *source.build_requires(), "wheel"]:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:
            raise PlanError(ctx.host.name, name, f"{source.directory}/pyproject.toml build requirement {text!r}: "
                                                 f"{exc}") from None
        key = canonicalize_name(req.name)
        if key in protected():
            continue
        wanted.setdefault(key, str(req))
    for dist in protected():
        have = _package(ctx.facts, dist)
        if have:
            wanted[dist] = f"{dist}=={have}"
    return list(wanted.values())


def dependencies(ctx: PlanContext, source: Source) -> list[sources.Dependency]:
    where = f"{ctx.host.sglang_checkout}/{source.directory}/CMakeLists.txt"
    try:
        return sources.parse_declarations(source.cmakelists, where)
    except sources.SourceError as exc:
        raise PlanError(ctx.host.name, name, str(exc)) from None


def defines(ctx: PlanContext, deps: list[sources.Dependency]) -> dict[str, str]:
    """Every -D the build gets: the stack's options (narrowing the gencode list), FP4, and the handed-over sources."""
    cfg = ctx.stack.sgl_kernel
    found = {"SGL_KERNEL_COMPILE_THREADS": str(cfg.compile_threads), **cfg.cmake_defines}
    if cfg.enable_fp4:
        found["SGL_KERNEL_ENABLE_FP4"] = "1"
    return {**found, **sources.cmake_defines(deps)}


def patched_cmakelists(ctx: PlanContext, source: Source) -> str:
    """The CMakeLists as the build will see it: HEAD's with the site's kernel patches applied (by git, here)."""
    import subprocess
    import tempfile

    pdir = _patch_dir(ctx)
    with tempfile.TemporaryDirectory(prefix="gpufleet-cmake-") as tmp:
        target = Path(tmp) / "CMakeLists.txt"
        target.write_text(source.cmakelists)
        for pname in series.series_names(pdir):
            proc = subprocess.run(["git", "apply", "--include=CMakeLists.txt", str(pdir / pname)], cwd=tmp,
                                  capture_output=True, text=True, env={"GIT_CEILING_DIRECTORIES": tmp, "PATH":
                                                                       "/usr/bin:/bin:/usr/local/bin"})
            if proc.returncode != 0:
                raise PlanError(ctx.host.name, name, f"patch {pname} does not apply to {source.directory}/CMakeLists"
                                                     f".txt at HEAD: {proc.stderr.strip()[:300]} (see `inv patches`)")
        return target.read_text()


def targets(ctx: PlanContext, source: Source, given: dict[str, str], cuda: str) -> str:
    """The architectures each library will be compiled for, read off the patched CMakeLists under these options."""
    try:
        ev = cmake.evaluate(patched_cmakelists(ctx, source), given, cuda_version=cuda)
    except cmake.CMakeError as exc:
        return f"targets unknown ({exc})"
    libs = {t: a for t, a in ev.targets.items() if a}
    if not libs:
        return "targets unknown (no gencode list found)"
    groups: dict[tuple[str, ...], list[str]] = {}
    for target, archs in libs.items():
        groups.setdefault(tuple(archs), []).append(target)
    text = "; ".join(f"{', '.join(ts)}: {','.join(a)}" for a, ts in groups.items())
    ignored = [f"{k}={v} (the CMakeLists sets {ev.forced[k]})" for k, v in given.items()
               if k in ev.forced and cmake.truthy(v) != cmake.truthy(ev.forced[k])]
    unread = [k for k in ctx.stack.sgl_kernel.cmake_defines if k not in ev.options and k not in ev.variables_read]
    return (text + (f"; overridden by the CMakeLists: {', '.join(ignored)}" if ignored else "")
            + (f"; not read by the CMakeLists: {', '.join(unread)}" if unread else ""))


def _build_step(ctx: PlanContext, source: Source, built: BuildInputs, key: str, why: str) -> Step:
    cfg = ctx.stack.sgl_kernel
    jobs = build_jobs(ctx.facts.cpu_count, ctx.facts.mem_total_bytes, cfg.max_jobs)
    job = detached.Job.for_key(key)
    deps = dependencies(ctx, source)
    given = defines(ctx, deps)
    # CUDACXX: CMake's project(... CUDA) looks for nvcc on PATH and in $CUDA_PATH only, never in CUDA_HOME, and an SSH
    # login PATH often lacks {cuda_home}/bin (seen on a real H200: "No CMAKE_CUDA_COMPILER could be found").
    # CPLUS_INCLUDE_PATH: CUDA 13 moved cuda/cub/thrust under include/cccl (upstream's Dockerfile sets the same).
    # TORCH_CUDA_ARCH_LIST narrows nothing in upstream's CMakeLists (it clears torch's arch flags and writes its own
    # gencode list); it is kept for code that asks torch which arch to build for.
    env = {"TORCH_CUDA_ARCH_LIST": cfg.arch, "CUDA_HOME": cfg.cuda_home, "CUDACXX": f"{cfg.cuda_home}/bin/nvcc",
           "CPLUS_INCLUDE_PATH": cfg.cccl_include, "MAX_JOBS": str(jobs), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
           "CMAKE_ARGS": " ".join(cfg.extra_cmake_args), "PATH": f"{ctx.host.venv}/bin:/usr/local/sbin:"
           "/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    settings = [f"--config-settings=build-dir={job.dir}/cmake-build",
                *(f"--config-settings=cmake.define.{k}={v}" for k, v in given.items())]
    # --verbose: CMake's and the compiler's lines reach build.log, so following a long build shows its progress.
    # Built in the job's own tree, never in the checkout (see _tree_cmd).
    tree = tree_dir(key)
    wheel_cmd = Cmd.of(_py(ctx), "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps",
                       "--disable-pip-version-check", "--verbose", "-w", f"{job.dir}/dist", *settings, env=env,
                       cwd=f"{tree}/{source.directory}")
    inner = Cmd.of("bash", "-c", f"date +%s > {shlex.quote(job.dir)}/started && rm -rf "
                                 f"{shlex.quote(job.dir)}/dist && {wheel_cmd.render()}")
    # The detached job itself stays as it was (its command names the unit); the install (_record_cmd) keeps the
    # venv's owner. Nothing here writes to the checkout, so nothing needs its owner kept.
    # Build tools come from the stack's own indexes only (never a default index the box may not reach).
    tools = _tools_cmd(ctx, build_tools(ctx, source))
    uploads = tuple(Upload(d.fetch_url(cfg.source_mirrors), None, d.archive, d.name, d.tag) for d in deps)
    unpack = (script(sources.unpack_script(deps)),) if deps else ()
    inputs_json = json.dumps({**built.__dict__, "extra_cmake_args": list(built.extra_cmake_args),
                              "defines": dict(built.defines), "host": ctx.host.name, "key": key, "jobs": jobs,
                              "directory": source.directory})
    wheel_expr = f"$(ls {shlex.quote(job.dir)}/dist/*.whl | head -n1)"
    handed = f"; {len(deps)} FetchContent source(s) handed over by the control node" if deps else ""
    # The wheel is recorded and installed: its sources are not needed again (a rebuild of this key never happens;
    # a failed build keeps them until the re-run makes them again).
    cleanup = Cmd.of("rm", "-rf", "--", tree, cwd="/")
    return Step(role=name, title=f"build {source.declared_name or 'sgl-kernel'} "
                                 f"{ctx.facts.checkout.kernel_version if ctx.facts.checkout else ''}"
                                 f" for {cfg.arch} (build {key[:12]}, {jobs} jobs)".replace("  ", " "),
                reason=(why + "; no wheel with that key on the host or in the cache; "
                        + targets(ctx, source, given, built.cuda) + handed),
                commands=(_tree_cmd(ctx, source, key, patched_cmakelists(ctx, source)), tools, *unpack,
                          detached.wait_cmd(job, inner), _record_cmd(ctx, key, wheel_expr, "built-here", inputs_json),
                          cleanup),
                needed=_needed(ctx, key), verify=(_verify(ctx, key),), timeout=BUILD_TIMEOUT,
                changes=("venv", "cache"), resumable=True, artifacts=(key,), uploads=uploads)


def status_cell(facts, stack) -> Cell:
    """The venv's sgl-kernel against the version the checkout's pyproject declares (what a build installs)."""
    packages = facts.packages or {}
    current = next((packages[n] for n in KERNEL_NAMES if packages.get(n)), None)
    source = getattr(facts.checkout, "kernel_version", None) if facts.checkout else None
    if source:
        return Cell(current or "absent", f"{source} (from checkout)", not versions_match(current, normalized(source)))
    return Cell(current or "absent", "built from checkout", current is None)


declares = Declares(
    section="sgl_kernel",
    needs=("torch", "sglang-checkout"),  # built against the venv's torch from the checkout: its build key is both
    packages=(Package(KERNEL_NAMES[0], aliases=KERNEL_NAMES[1:]),),  # built from the checkout: no pin, own column
    columns=(Column("sgl-kernel", status_cell),),
    imports=(Import("sgl_kernel", (KERNEL_NAMES[0],), ops=FP4_OPS, ops_label="FP4",
                    hints=(("undefined symbol", "sgl-kernel was built against another torch: rebuild it for this "
                                                "torch"),)),))
