"""sgl-kernel role: build the wheel from the checkout once per build key, reuse it on every host with that key."""

from __future__ import annotations

import hashlib
import json
import shlex
from dataclasses import replace
from pathlib import Path

from gpufleet import buildcache, detached
from gpufleet.buildcache import BuildInputs, LocalCache
from gpufleet.command import Cmd, script
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged, Upload
from roles import pip

name = "sgl-kernel"
FP4_OPS = ("cutlass_scaled_fp4_mm", "scaled_fp4_quant", "scaled_fp4_experts_quant", "cutlass_fp4_group_mm")
GIB = 1024 ** 3
GIB_PER_JOB = 4  # one nvcc job of sgl-kernel needs several GiB; too many jobs is the usual OOM
BUILD_TIMEOUT = 6 * 3600.0


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


_PROBE = """cd {checkout} 2>/dev/null && echo "@@tree $(git rev-parse HEAD:sgl-kernel 2>/dev/null)"
echo "@@installed"; cat {installed} 2>/dev/null; echo; echo "@@record"; cat {builds}/{key}/record.json 2>/dev/null; echo
echo "@@end"
"""


def _sections(text: str) -> dict[str, str]:
    found, cur = {}, None
    for line in text.splitlines():
        if line.startswith("@@tree "):
            found["tree"] = line.split(" ", 1)[1].strip()
        elif line in ("@@installed", "@@record", "@@end"):
            cur = line[2:]
            found.setdefault(cur, "")
        elif cur:
            found[cur] += line + "\n"
    return found


def inputs(ctx: PlanContext, tree: str) -> BuildInputs:
    cfg = ctx.stack.sgl_kernel
    torch = _package(ctx.facts, "torch")
    if not torch:
        raise PlanError(ctx.host.name, name, "torch is not installed in the venv (the torch role runs first)")
    return BuildInputs(torch=torch, cuda=_cuda(ctx), arch=cfg.arch, source_tree=tree,
                       patches=buildcache.patches_digest(_patch_dir(ctx)), fp4=cfg.enable_fp4,
                       extra_cmake_args=tuple(cfg.extra_cmake_args), compile_threads=cfg.compile_threads)


def _patch_dir(ctx: PlanContext) -> Path:
    p = Path(ctx.stack.sgl_kernel.patches)
    return p if p.is_absolute() else ctx.repo / p


def _probe(ctx: PlanContext, key_hint: str = "") -> dict[str, str]:
    if ctx.probe is None:
        raise PlanError(ctx.host.name, name, "needs a remote probe to read the checkout's sgl-kernel tree")
    text = _PROBE.format(checkout=shlex.quote(ctx.host.sglang_checkout), installed=buildcache.installed_record(ctx.host.venv),
                         builds=detached.BUILDS_DIR, key=key_hint or "none")
    return _sections(ctx.probe(script(text), "sgl-kernel build state").output)


def plan(ctx: PlanContext, cache: LocalCache | None = None) -> list:
    """Unchanged when the installed wheel has the current key; else install a wheel with that key, or build one."""
    cache = cache or LocalCache()
    tree = _probe(ctx).get("tree", "")
    if not tree:
        raise PlanError(ctx.host.name, name, f"no sgl-kernel/ tree at HEAD of {ctx.host.sglang_checkout}")
    built = inputs(ctx, tree)
    key = built.key()
    state = _probe(ctx, key)
    installed = buildcache.Record.from_json(state.get("installed", "").strip() or "null")
    on_host = buildcache.Record.from_json(state.get("record", "").strip() or "null")
    version = _package(ctx.facts, "sgl-kernel") or _package(ctx.facts, "sglang-kernel")
    if installed and installed.key == key and version and version == _wheel_version(installed.wheel):
        return [Unchanged(name, f"sgl-kernel {version} installed from build {key[:12]} (targets "
                                f"{','.join(installed.archs) or '?'})")]
    why = (f"venv has sgl-kernel {version or 'none'}"
           + (f" from build {installed.key[:12]}" if installed else " not built by gpufleet")
           + f"; torch {built.torch}, CUDA {built.cuda}, arch {built.arch}, tree {tree[:10]} want build {key[:12]}")
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
    return [_build_step(ctx, built, key, why)]


def _wheel_version(wheel: str) -> str:
    parts = Path(wheel).name.split("-")
    return parts[1] if len(parts) > 1 else ""


def _py(ctx: PlanContext) -> str:
    return f"{ctx.host.venv}/bin/python"


def _verify(ctx: PlanContext, key: str) -> Cmd:
    code = ("import json, sys, torch, sgl_kernel\n"
            f"ops = {FP4_OPS!r}\n"
            "ns = getattr(torch.ops, 'sgl_kernel', None)\n"
            "def has(o):\n"
            "    try:\n        return hasattr(sgl_kernel, o) or (ns is not None and hasattr(ns, o))\n"
            "    except Exception:\n        return False\n"
            "missing = [o for o in ops if not has(o)]\n"
            "fp4 = " + repr(ctx.stack.sgl_kernel.enable_fp4) + "\n"
            "if fp4 and missing: sys.exit('sgl_kernel lacks FP4 ops: ' + ', '.join(missing))\n"
            f"rec = json.load(open({buildcache.installed_record(ctx.host.venv)!r}))\n"
            f"if rec['key'] != {key!r}: sys.exit('installed record is for another build')\n"
            "print('sgl_kernel', sgl_kernel.__version__, 'torch', torch.__version__, 'ok')\n")
    return Cmd.of(_py(ctx), "-c", code)


def _record_script(ctx: PlanContext, key: str, wheel_expr: str, origin: str, inputs_json: str) -> Cmd:
    """Install the wheel, read what it really targets from sgl_kernel.build_info, write record.json files."""
    d = buildcache.host_dir(key)
    code = ("import json, sys, time, os\n"
            "wheel, origin, inputs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])\n"
            "import sgl_kernel\n"
            "info = sgl_kernel.build_info\n"
            f"d = {d!r}\n"
            "started = os.path.join(d, 'started')\n"
            "secs = time.time() - float(open(started).read()) if os.path.exists(started) else 0.0\n"
            f"rec = dict(key={key!r}, inputs=inputs, wheel=wheel, archs=list(info.get('archs', [])),\n"
            "           fp4=bool(info.get('fp4')), seconds=round(secs, 1), origin=origin)\n"
            "for p in (os.path.join(d, 'record.json'), " + repr(buildcache.installed_record(ctx.host.venv)) + "):\n"
            "    open(p + '.tmp', 'w').write(json.dumps(rec, indent=2, sort_keys=True)); os.replace(p + '.tmp', p)\n"
            "print('recorded', rec['archs'], 'fp4', rec['fp4'])\n")
    text = (f"set -e\nwheel={wheel_expr}\n"
            f"[ -f \"$wheel\" ] || {{ echo \"no sgl-kernel wheel at $wheel\"; exit 1; }}\n"
            f"{shlex.quote(_py(ctx))} -m pip install --disable-pip-version-check --force-reinstall --no-deps "
            f"\"$wheel\"\n"
            f"{shlex.quote(_py(ctx))} -c {shlex.quote(code)} \"$wheel\" {shlex.quote(origin)} "
            f"{shlex.quote(inputs_json)}\n")
    return script(text)


def _needed(ctx: PlanContext, key: str) -> Cmd:
    """Exit 0 while the venv's sgl-kernel is not from this build (a re-run skips a step another run finished)."""
    code = (f"import json, sys\ntry:\n    done = json.load(open({buildcache.installed_record(ctx.host.venv)!r}))['key'] == {key!r}\n"
            "except Exception:\n    done = False\nsys.exit(1 if done else 0)\n")
    return Cmd.of("python3", "-c", code)


def _install_step(ctx: PlanContext, key: str, wheel: str, origin: str, why: str) -> Step:
    inputs_json = json.dumps({"key": key})
    return Step(role=name, title=f"install sgl-kernel wheel {Path(wheel).name} (build {key[:12]})", reason=why,
                commands=(_record_script(ctx, key, shlex.quote(wheel), origin, inputs_json),),
                needed=_needed(ctx, key), verify=(_verify(ctx, key),), timeout=1800, changes=("venv",))


def _patch_cmds(ctx: PlanContext) -> list[Cmd]:
    pdir = _patch_dir(ctx)
    cmds = []
    for pname in buildcache.series_names(pdir):
        text = (pdir / pname).read_text()
        sub = [] if "\n+++ b/sgl-kernel/" in text or text.startswith("+++ b/sgl-kernel/") else [
            "--directory=sgl-kernel"]
        args = " ".join(sub)
        # Idempotent: a patch that reverse-applies is already in the tree.
        body = (f'if printf "%s" "$1" | git apply --reverse --check {args} - 2>/dev/null; then '
                f'echo "already applied: $2"; else printf "%s" "$1" | git apply {args} - && echo "applied: $2"; fi')
        cmds.append(Cmd.of("bash", "-c", body, "patch", text, pname, cwd=ctx.host.sglang_checkout))
    return cmds


def _build_step(ctx: PlanContext, built: BuildInputs, key: str, why: str) -> Step:
    cfg = ctx.stack.sgl_kernel
    jobs = build_jobs(ctx.facts.cpu_count, ctx.facts.mem_total_bytes, cfg.max_jobs)
    job = detached.Job.for_key(key)
    cmake_args = " ".join([f"-DSGL_KERNEL_COMPILE_THREADS={cfg.compile_threads}", *cfg.extra_cmake_args])
    # CUDACXX: CMake's project(... CUDA) looks for nvcc on PATH and in $CUDA_PATH only, never in CUDA_HOME, and an SSH
    # login PATH often lacks {cuda_home}/bin (seen on a real H200: "No CMAKE_CUDA_COMPILER could be found").
    env = {"TORCH_CUDA_ARCH_LIST": cfg.arch, "CUDA_HOME": cfg.cuda_home, "CUDACXX": f"{cfg.cuda_home}/bin/nvcc",
           "CPLUS_INCLUDE_PATH": cfg.cccl_include, "MAX_JOBS": str(jobs), "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs),
           "CMAKE_ARGS": cmake_args}
    settings = [f"--config-settings=build-dir={job.dir}/cmake-build"]
    if cfg.enable_fp4:
        settings.append("--config-settings=cmake.define.SGL_KERNEL_ENABLE_FP4=1")
    # --verbose: CMake's and the compiler's lines reach build.log, so following a long build shows its progress.
    wheel_cmd = Cmd.of(_py(ctx), "-m", "pip", "wheel", ".", "--no-build-isolation", "--no-deps",
                       "--disable-pip-version-check", "--verbose", "-w", f"{job.dir}/dist", *settings, env=env,
                       cwd=f"{ctx.host.sglang_checkout}/sgl-kernel")
    inner = Cmd.of("bash", "-c", f"date +%s > {shlex.quote(job.dir)}/started && rm -rf "
                                 f"{shlex.quote(job.dir)}/dist && {wheel_cmd.render()}")
    # Build tools come from the stack's own indexes only (never a default index the box may not reach).
    install = pip.install_cmd(ctx, ["scikit-build-core>=0.10", "wheel"], index_url=ctx.stack.pip.index_url,
                              extra_index_urls=[ctx.stack.torch.index_url])
    # braces: install renders as `cd / && ...`, and `a || cd / && b` would run b whatever a says (seen on a real H200)
    deps = script(f"{shlex.quote(_py(ctx))} -c 'import scikit_build_core' 2>/dev/null || {{ {install.render()}; }}")
    inputs_json = json.dumps({**built.__dict__, "extra_cmake_args": list(built.extra_cmake_args),
                              "host": ctx.host.name, "key": key, "jobs": jobs})
    wheel_expr = f"$(ls {shlex.quote(job.dir)}/dist/*.whl | head -n1)"
    return Step(role=name, title=f"build sgl-kernel {ctx.facts.checkout.kernel_version if ctx.facts.checkout else ''}"
                                 f" for {cfg.arch} (build {key[:12]}, {jobs} jobs)".replace("  ", " "),
                reason=why + "; no wheel with that key on the host or in the cache",
                commands=(*_patch_cmds(ctx), deps, detached.wait_cmd(job, inner),
                          _record_script(ctx, key, wheel_expr, "built-here", inputs_json)),
                needed=_needed(ctx, key), verify=(_verify(ctx, key),), timeout=BUILD_TIMEOUT,
                changes=("checkout", "venv", "cache"), resumable=True, artifacts=(key,))
