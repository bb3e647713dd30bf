#!/bin/bash
# real-gpu-build.sh: prove the sgl-kernel role's detached build path on a real GPU server, over real SSH, offline.
#
# Run as root ON the GPU server, from the repository root, with .whl/ and .debs/ carried next to it exactly as for
# scripts/real-gpu-check.sh (docs/REAL_HARDWARE.md). It
#   1. puts a stand-in sgl-kernel source tree (scripts/real-gpu-kernel/: scikit-build-core + CMake with CXX and CUDA,
#      small FP8 kernels with a C ABI) into a git checkout at $GF_BUILD_WORK/sglang/sgl-kernel;
#   2. runs scripts/real-gpu-check.sh with GF_KEEP_SSHD=1: a private OpenSSH sshd on 127.0.0.1:$GF_PORT, gpufleet's
#      controller venv from the carried wheels, an inventory for this machine (and facts/status over SSH again);
#   3. drives gpufleet's own code over that SSH (the driver below, build.py):
#      a. "follow" pass: the role's plan (roles.sgl_kernel.plan, with a host stack override arch = "9.0a",
#         enable_fp4 = false, no patches); its build command is started with gpufleet.detached.start and followed
#         with detached.follow while, once the build has begun, the client closes its own SSH transport and a
#         second later the sshd is killed for $GF_DROP_DOWN_S s (follow must reconnect both times); its state is
#         read before and after, it is started again (must pick up "finished 0"), its wait_cmd runs once more
#         through the executor (must pick up the finished job), then the role's record and verify commands;
#      b. "upgrade" pass: gpufleet.apply.Upgrade with the sgl-kernel role alone (lock, facts, plan, snapshot,
#         resumable build, verify, wheel fetched to the control node's cache over SFTP, audit) for a second build
#         key (compile_threads = 2), while the sshd is killed (listener and connection processes) once the build
#         has begun and started again $GF_DROP_DOWN_S s later (the executor must reattach); then the same Upgrade
#         again (must be unchanged);
#      If the role's build fails as it is (e.g. CMake finds no nvcc on the SSH login PATH), the failure is kept and
#      the pass is repeated with work-arounds, in this order: stack extra_cmake_args naming the compilers; sshd
#      SetEnv PATH=<this command's PATH>. Each attempt is recorded;
#   4. imports the installed stand-in sgl_kernel in $GF_VENV over SSH and runs its kernels on the GPU
#      (scripts/real-gpu-kernel/check_gpu.py: exact match with torch's FP8 conversion, __CUDA_ARCH__, sm_90a);
#   5. reads what the library was compiled for: cuobjdump --list-elf/--list-ptx/--dump-sass, the build.ninja lines.
# Everything lands in $OUT (default $GF_BUILD_WORK/out): run.log and capture.tar.gz. Nothing is fetched.
# It writes outside $GF_BUILD_WORK: /var/lib/gpufleet (builds, snapshots, lock, audit log), $GF_VENV (the stand-in
# sgl-kernel wheel is installed there, with its gpufleet-sgl-kernel.json record) and what real-gpu-check.sh touches.
# Parameters (environment; defaults in brackets):
#   GF_BUILD_WORK [/root/gpufleet-build]  GF_PORT [2222]  GF_HOST [h200]  GF_VENV [/opt/torch/.venv]
#   GF_ARCH [9.0a]  GF_STACK [stack.toml]  GF_DROP_DOWN_S [2]: seconds the sshd stays down in the upgrade pass
#   GF_KEEP_SSHD [0]: 1 leaves sshd running; the rest of real-gpu-check.sh's parameters pass through to it
set -u
REPO=$(pwd -P)
W=${GF_BUILD_WORK:-/root/gpufleet-build}
PORT=${GF_PORT:-2222}
HOST=${GF_HOST:-h200}
VENV=${GF_VENV:-/opt/torch/.venv}
ARCH=${GF_ARCH:-9.0a}
STACK=${GF_STACK:-$REPO/stack.toml}
OUT=${OUT:-$W/out}
CW=$W/check         # real-gpu-check.sh's work folder: sshd, keys, controller venv, inventory
C=$W/capture        # everything in here goes into capture.tar.gz
CHECKOUT=$W/sglang
export PYTHONUNBUFFERED=1 PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

T0=$(date +%s.%N)
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }'; }
log() { printf '[%6ss] %s\n' "$(since "$T0")" "$*"; }

timed() {  # timed NAME CMD...: stdout+stderr to $C/NAME (5 min at most); name, rc, seconds to timings.tsv
    local name=$1 s rc d
    shift
    s=$(date +%s.%N)
    timeout -k 5 300 "$@" >"$C/$name" 2>&1 </dev/null
    rc=$?
    d=$(since "$s")
    printf '%s\t%s\t%s\n' "$name" "$rc" "$d" >>"$C/timings.tsv"
    log "$name: rc=$rc in ${d}s ($(wc -c <"$C/$name") bytes)"
    return $rc
}

stop_sshd() {
    local pid
    pid=$(cat "$CW/sshd.pid" 2>/dev/null)
    if [ -n "$pid" ] && [ "${GF_KEEP_SSHD:-0}" != 1 ]; then kill "$pid" 2>/dev/null && log "stopped sshd $pid"; fi
}

finish() {
    stop_sshd
    cp -f "$CW/sshd.log" "$C/sshd.log" 2>/dev/null
    printf 'total\t-\t%s\n' "$(since "$T0")" >>"$C/timings.tsv"
    (cd "$W" && tar -czf "$OUT/capture.tar.gz" capture)
    log "captured $(tar -tzf "$OUT/capture.tar.gz" | wc -l) entries in $OUT/capture.tar.gz"
}

main() {
    log "== 1. the machine, as this command sees it"
    {
        echo "date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; uname -a; grep -E '^PRETTY_NAME=' /etc/os-release
        echo "PATH=$PATH"; echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"; echo "nproc=$(nproc)"
        grep -E '^(MemTotal|MemAvailable):' /proc/meminfo
        for b in nvcc c++ g++ gcc cc cmake ninja cuobjdump git python3; do
            echo "which $b: $(command -v $b || echo -)"; done
        for b in /usr/bin/{c++,g++,gcc} /opt/gcc/bin/g++ /usr/local/cuda/bin/{nvcc,cuobjdump}; do
            echo "$b: $(ls -lL "$b" 2>&1 | cut -c1-120)"; done
        echo "g++ --version: $(g++ --version 2>&1 | head -1)"
        echo "/opt/gcc/bin: $(ls /opt/gcc/bin 2>&1 | tr '\n' ' ')"
        echo "cccl: $(ls -d /usr/local/cuda/include/cccl 2>&1)"
        echo "systemd: $(ls -d /run/systemd/system 2>&1)"
        "$VENV/bin/python" -c 'import sys, importlib.metadata as m
print("venv python", sys.version.split()[0])
for d in ("scikit_build_core", "cmake", "ninja", "torch", "pip", "wheel"):
    try: print(" ", d, m.version(d))
    except Exception as e: print(" ", d, "absent", e)'
        nvidia-smi -L
    } >"$C/machine.txt" 2>&1
    cat "$C/machine.txt"
    timed nvcc-version.txt /usr/local/cuda/bin/nvcc --version

    log "== 2. the stand-in sgl-kernel tree in a git checkout at $CHECKOUT"
    mkdir -p "$CHECKOUT" && cp -r "$REPO/scripts/real-gpu-kernel" "$CHECKOUT/sgl-kernel" || return 1
    (cd "$CHECKOUT" && git init -q -b main && git add -A &&
        git -c user.name=gpufleet -c user.email=gpufleet@localhost commit -qm "stand-in sgl-kernel" &&
        git rev-parse HEAD HEAD:sgl-kernel) >"$C/checkout.txt" 2>&1 || { cat "$C/checkout.txt"; return 1; }
    cat "$C/checkout.txt"
    mkdir -p "$W/no-patches"

    log "== 3. sshd, controller and inventory by scripts/real-gpu-check.sh (GF_KEEP_SSHD=1)"
    GF_WORK=$CW GF_PORT=$PORT GF_HOST=$HOST GF_VENV=$VENV GF_CHECKOUT=$CHECKOUT GF_KEEP_SSHD=1 GF_SETENV_PASS=never \
        OUT=$C/check \
        timed check.log bash "$REPO/scripts/real-gpu-check.sh"
    rm -f "$C/check/capture.tar.gz"
    grep -E 'FATAL|rc=|controller python|ssh ok|sshd pid' "$C/check.log"
    if [ ! -x "$CW/venv/bin/python" ] || [ ! -f "$CW/h200.toml" ]; then
        log "FATAL: real-gpu-check.sh left no controller"
        return 1
    fi
    local sshd libdir rc
    sshd=$(sed -n 's/^sshd=//p' "$CW/capture/openssh.txt" | head -1)
    libdir=$([ -d "$CW/lib" ] && echo "$CW/lib")
    cp "$CW/h200.toml" "$C/h200.toml"
    cp "$CW/sshd_config" "$C/sshd_config.txt"

    log "== 4. the role's build over SSH: detached start/follow, then the executor (build.py)"
    write_build_py
    GF_INV=$CW/h200.toml GF_HOST=$HOST GF_STACK=$STACK GF_OUTDIR=$C GF_ARCH=$ARCH GF_NO_PATCHES=$W/no-patches \
        GF_SSHD=$sshd GF_SSHD_CONFIG=$CW/sshd_config GF_SSHD_PIDFILE=$CW/sshd.pid GF_SSHD_LOG=$CW/sshd.log \
        GF_SSHD_LIBDIR=$libdir GF_PORT=$PORT GF_REPO=$REPO GF_CONSOLE_PATH=$PATH GF_DROP_DOWN_S=${GF_DROP_DOWN_S:-2} \
        GPUFLEET_CACHE_DIR=$W/cache PYTHONPATH=$REPO \
        timeout -k 5 480 "$CW/venv/bin/python" "$W/build.py" 2>&1 | tee "$C/build-driver.txt"
    rc=${PIPESTATUS[0]}
    log "build.py exit $rc"
    cat "$C/kernel-check.json" 2>/dev/null

    log "== 5. what the installed library was compiled for"
    local so
    so=$(cd /tmp && "$VENV/bin/python" -c 'import sgl_kernel; print(sgl_kernel.build_info["library"])' 2>/dev/null)
    echo "installed library: ${so:-none}"
    if [ -n "$so" ]; then
        timed cuobjdump-list-elf.txt /usr/local/cuda/bin/cuobjdump --list-elf "$so"
        timed cuobjdump-list-ptx.txt /usr/local/cuda/bin/cuobjdump --list-ptx "$so"
        timed cuobjdump-sass.txt /usr/local/cuda/bin/cuobjdump --dump-sass "$so"
        timed ldd.txt ldd "$so"
        cat "$C/cuobjdump-list-elf.txt" "$C/cuobjdump-list-ptx.txt"
        grep -E 'arch = |code for' "$C/cuobjdump-sass.txt" | sort | uniq -c
        gzip -9 "$C/cuobjdump-sass.txt"
    fi
    for d in /var/lib/gpufleet/builds/*/; do
        local k
        k=$(basename "$d")
        mkdir -p "$C/builds/$k"
        cp -p "$d"build.log "$d"exit-code "$d"record.json "$d"started "$C/builds/$k/" 2>/dev/null
        ls -l "$d" "$d"dist >"$C/builds/$k/ls.txt" 2>&1
        cp "$d"cmake-build/gpufleet-env.txt "$C/builds/$k/" 2>/dev/null
        grep -E '^(CMAKE_(CUDA_COMPILER|CXX_COMPILER|CUDA_HOST_COMPILER|BUILD_TYPE|GENERATOR)|SGL_KERNEL_)[:=A-Z]*=' \
            "$d"cmake-build/CMakeCache.txt >"$C/builds/$k/cmake-cache.txt" 2>/dev/null
        grep -E 'nvcc|FLAGS = ' "$d"cmake-build/build.ninja >"$C/builds/$k/build-ninja-lines.txt" 2>/dev/null
        cp "$d"cmake-build/.ninja_log "$C/builds/$k/ninja_log.txt" 2>/dev/null
    done
    cp -p "$VENV/gpufleet-sgl-kernel.json" "$C/installed-record.json" 2>/dev/null
    tail -n 5 /var/lib/gpufleet/audit.log >"$C/audit-tail.jsonl" 2>/dev/null
    ls -la /var/lib/gpufleet /var/lib/gpufleet/builds >"$C/var-lib-gpufleet.txt" 2>&1
    find "$W/cache" -type f -printf '%P %s\n' >"$C/control-cache.txt" 2>&1

    log "== 6. wrap up"
    finish
    log "done: build.py exit $rc"
    return "$rc"
}

write_build_py() {
    cat >"$W/build.py" <<'EOF'
"""Drive gpufleet's sgl-kernel role, gpufleet.detached and the executor over real SSH; record every result."""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import traceback
from pathlib import Path
from unittest import mock

import roles.sgl_kernel as sk
from gpufleet import detached
from gpufleet.apply import Upgrade, _HostRun
from gpufleet.buildcache import LocalCache
from gpufleet.command import Cmd, script
from gpufleet.gather import gather_facts
from gpufleet.hoststate import RunInfo
from gpufleet.inventory import load_inventory
from gpufleet.plan import PlanContext, Step
from gpufleet.runner import session_for
from gpufleet.stack import host_stacks, load_stack

E = os.environ
OUT = Path(E["GF_OUTDIR"])
REPO = Path(E["GF_REPO"])
HOST = E["GF_HOST"]
T0 = time.monotonic()
SUMMARY: dict = {"attempts": []}
_lines = open(OUT / "transcript.txt", "w")


def now() -> float:
    return round(time.monotonic() - T0, 2)


def say(line: str) -> None:
    text = f"[{now():7.2f}] {line}"
    _lines.write(text + "\n")
    _lines.flush()
    print(text, flush=True)


def save(name: str, data) -> None:
    (OUT / name).write_text(data if isinstance(data, str) else json.dumps(data, indent=2, default=str) + "\n")


def record_results(session, tag: str):
    """Wrap session.run and session.open: every command's start/end time, step, exit code and full output, and
    every connection opened, go to results-<tag>.jsonl."""
    rows = open(OUT / f"results-{tag}.jsonl", "a")
    run_, open_ = session.run, session.open

    def write(row: dict) -> None:
        rows.write(json.dumps(row) + "\n")
        rows.flush()

    def run(cmd, step, **kw):
        t0, n, err = now(), len(session.results), None
        if step == "detached follow" and getattr(session, "drop_armed", None):
            # the link goes away while this poll is in flight (its remote shell takes a few hundred ms to start)
            threading.Timer(0.1, session.drop_armed).start()
            session.drop_armed = None
        try:
            return run_(cmd, step, **kw)
        except BaseException as exc:
            err = f"{type(exc).__name__}: {exc}"
            err = err if len(err) < 1200 else err[:300] + " [...] " + err[-800:]
            raise
        finally:
            r = session.results[-1] if len(session.results) > n else None
            write({"t0": t0, "t1": now(), "step": step, "exit_code": r.exit_code if r else None,
                   "seconds": round(r.seconds, 3) if r else None, "output": r.output if r else None,
                   "error": err, "command": cmd.display()[:400]})

    def connect():
        t0, err = now(), None
        try:
            return open_()
        except BaseException as exc:
            err = f"{type(exc).__name__}: {exc}"
            raise
        finally:
            write({"t0": t0, "t1": now(), "step": "(connect)", "error": err})

    session.run, session.open = run, connect
    return session


def inventory(tag: str, compile_threads: int, extra: list[str]):
    base = Path(E["GF_INV"]).read_text()
    text = (base + f"\n[hosts.{HOST}.stack.sgl_kernel]\narch = \"{E['GF_ARCH']}\"\nenable_fp4 = false\n"
            f"compile_threads = {compile_threads}\npatches = \"{E['GF_NO_PATCHES']}\"\n"
            f"extra_cmake_args = {json.dumps(extra)}\n")
    path = OUT / f"inventory-{tag}.toml"
    path.write_text(text)
    inv = load_inventory(path)
    host = inv.hosts[HOST]
    return inv, host, host_stacks(load_stack(E["GF_STACK"]), inv, [host])[HOST]


def plan_build(session, host, stack, tag: str):
    """The role's own plan; returns (step, job, inner, wait_cmd) with the job and command the role built."""
    facts = gather_facts(session)
    ctx = PlanContext(host=host, stack=stack, facts=facts, repo=REPO,
                      probe=lambda cmd, step: session.run(cmd, step=step, check=False))
    captured = []
    real = detached.wait_cmd

    def spy(job, inner, *a, **kw):
        captured.append((job, inner))
        return real(job, inner, *a, **kw)

    with mock.patch.object(detached, "wait_cmd", spy):
        items = sk.plan(ctx, cache=LocalCache(Path(E["GPUFLEET_CACHE_DIR"]) / "sgl-kernel"))
    save(f"plan-{tag}.json", [i.to_json() for i in items])
    step = items[0]
    if not isinstance(step, Step) or not captured:
        return None, None, None, None
    job, inner = captured[0]
    save(f"build-command-{tag}.json", {
        "job": {"unit": job.unit, "dir": job.dir, "log": job.log, "rc_file": job.rc_file, "pid_file": job.pid_file},
        "inner": inner.render(), "facts": {"cpu_count": facts.cpu_count, "mem_total_bytes": facts.mem_total_bytes,
                                           "nvcc_version": facts.nvcc_version},
        "build_jobs": sk.build_jobs(facts.cpu_count, facts.mem_total_bytes, stack.sgl_kernel.max_jobs),
        "sgl_kernel_stack": stack.sgl_kernel.model_dump(mode="json")})
    return step, job, inner, real(job, inner)


def wait_for_log(job, deadline_s: float = 120.0) -> int:
    """Seconds until the job's log (same machine) has bytes; returns its size then (0: gave up)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            size = os.path.getsize(job.log)
            if size > 0:
                return size
        except OSError:
            pass
        time.sleep(0.05)
    return 0


def rc_file(job):
    try:
        return Path(job.rc_file).read_text().strip()
    except OSError:
        return None


def pass_follow(a: dict, inv, host, stack, config: str) -> dict:
    """detached.start -> state -> follow -> state -> start again. While follow runs, the client closes its own SSH
    transport once the build has begun, and a second later the sshd is killed for GF_DROP_DOWN_S seconds."""
    tag = a["tag"]
    a.update(kind="follow", extra_cmake_args=list(stack.sgl_kernel.extra_cmake_args))
    session = record_results(session_for(host, inv), tag)
    with session:
        step, job, inner, wait = plan_build(session, host, stack, tag)
        if step is None:
            a["error"] = "the role planned no build"
            return a
        a.update(key=job.dir.rsplit("/", 1)[1], job_dir=job.dir, title=step.title)
        hr = _HostRun(Upgrade(roles=[sk], run=RunInfo.current("real-gpu-build follow"), repo=REPO, say=say,
                              reconnect_for=120.0), session, stack)
        a["still_needed"] = hr.still_needed(step)
        i = step.commands.index(wait)
        for cmd in step.commands[:i]:  # patches (none here) and the build dependencies check
            hr.run(cmd, step.title, timeout=600, echo=say)
        t = now()
        a["start"] = detached.start(session, job, inner, retry_failed=True)
        a["start_s"] = round(now() - t, 2)
        a["state_after_start"] = detached.state(session, job).__dict__
        drop: dict = {}

        def close_transport():
            conn = session.conn
            drop.update(t=now(), log_bytes=os.path.getsize(job.log), rc_file=rc_file(job))
            if conn is not None and conn.transport is not None:
                conn.transport.close()  # the client side of the link goes away mid-build, mid-poll
                drop["closed"] = True
            say(f"-- closed the SSH transport (client side) during a poll, at log byte {drop['log_bytes']}")

        def arm():
            if wait_for_log(job):
                drop["armed_at"] = now()
                session.drop_armed = close_transport

        done = threading.Event()
        outage: dict = {}

        def breaker():  # once the transport was closed: take the server away too, unless the build is over
            while "t" not in drop and not done.is_set():
                time.sleep(0.05)
            time.sleep(1.0)
            if not done.is_set() and rc_file(job) is None:
                outage["log_bytes_at_kill"] = os.path.getsize(job.log)
                say(f"-- killing sshd for {E['GF_DROP_DOWN_S']}s during follow, "
                    f"at log byte {outage['log_bytes_at_kill']}")
                outage.update(sshd_outage(float(E["GF_DROP_DOWN_S"]), config))
                outage["rc_file_when_up"] = rc_file(job)
                say(f"-- sshd is back (pid {outage['new_listener']}); "
                    f"build exit-code file: {outage['rc_file_when_up']}")

        th = threading.Thread(target=arm, daemon=True)
        th.start()
        tb = threading.Thread(target=breaker, daemon=True)
        tb.start()
        t = now()
        try:
            a["follow_rc"] = detached.follow(session, job, echo=say, poll=1.0, reconnect_for=120.0, timeout=900.0)
        except Exception as exc:
            # a caller would follow again; the job runs on regardless
            a["follow_error"] = f"{type(exc).__name__}: {exc}"
            say(f"-- follow raised {a['follow_error']}; following again")
            a["follow_rc"] = detached.follow(session, job, echo=say, poll=1.0, reconnect_for=120.0, timeout=900.0)
        a["follow_s"] = round(now() - t, 2)
        done.set()
        th.join(5)
        tb.join(30)  # an outage under way ends with sshd started again
        a["drop"], a["outage"] = drop, outage
        a["built"] = a.get("follow_rc") == 0
        a["state_after_follow"] = detached.state(session, job).__dict__
        a["start_again"] = detached.start(session, job, inner, retry_failed=True)
        a["log_tail"] = Path(job.log).read_text(errors="replace").splitlines()[-40:]
        if a.get("follow_rc") != 0:
            return a
        # the role's own command for this step, on a job that has finished: must pick it up, not build again
        t = now()
        res = hr.run_resumable(wait, step.title, timeout=600)
        a["wait_cmd_pickup"] = {"exit_code": res.exit_code, "seconds": round(now() - t, 2),
                                "lines": len(res.output.splitlines())}
        for cmd in step.commands[i + 1:]:
            hr.run(cmd, step.title, timeout=600, echo=say)
        for cmd in step.verify:
            res = hr.run(cmd, f"{step.title}: verify", timeout=600)
            a["verify"] = res.output.strip().splitlines()[-1:]
        a["ok"] = True
    return a


def sshd_pids():
    listener = int(Path(E["GF_SSHD_PIDFILE"]).read_text().split()[0])
    kids: dict[int, list[int]] = {}
    comm: dict[int, str] = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                stat = (p / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                comm[int(p.name)] = (p / "comm").read_text().strip()
                kids.setdefault(ppid, []).append(int(p.name))
            except (OSError, ValueError, IndexError):
                continue
    found, todo = [], [listener]
    while todo:
        pid = todo.pop()
        for k in kids.get(pid, []):
            todo.append(k)
            if comm.get(k, "").startswith("sshd"):
                found.append(k)
    return listener, found


def port_open() -> bool:
    try:
        socket.create_connection(("127.0.0.1", int(E["GF_PORT"])), 0.5).close()
        return True
    except OSError:
        return False


def restart_sshd(config: str) -> int:
    env = dict(os.environ)
    if E.get("GF_SSHD_LIBDIR"):
        old = env.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = E["GF_SSHD_LIBDIR"] + (":" + old if old else "")
    logf = open(E["GF_SSHD_LOG"], "a")
    logf.write(f"---- sshd restarted by build.py {time.strftime('%H:%M:%S')} with {config}\n")
    logf.flush()
    proc = subprocess.Popen([E["GF_SSHD"], "-f", config, "-D", "-e"], stdin=subprocess.DEVNULL, stdout=logf,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    for _ in range(100):
        if port_open():
            break
        time.sleep(0.1)
    return proc.pid


def sshd_outage(down_s: float, config: str) -> dict:
    """Kill our sshd (the listener, then every sshd process under it: the connections), wait, start it again."""
    listener, conns = sshd_pids()
    out = {"t_kill": now(), "listener": listener, "connection_pids": conns}
    os.kill(listener, signal.SIGTERM)
    for pid in conns:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for _ in range(50):
        if not port_open():
            break
        time.sleep(0.1)
    out["port_closed"] = not port_open()
    time.sleep(down_s)
    out["new_listener"] = restart_sshd(config)
    out["t_up"] = now()
    out["port_open_again"] = port_open()
    return out


def pass_upgrade(a: dict, inv, host, stack, config: str) -> dict:
    """The executor (Upgrade.host with the sgl-kernel role), with an sshd outage once the build has begun."""
    tag = a["tag"]
    a.update(kind="upgrade", extra_cmake_args=list(stack.sgl_kernel.extra_cmake_args),
             compile_threads=stack.sgl_kernel.compile_threads)
    session = record_results(session_for(host, inv), tag)
    with session:
        step, job, inner, wait = plan_build(session, host, stack, tag + "-preview")
        if step is None:
            a["error"] = "the role planned no build"
            return a
        a.update(key=job.dir.rsplit("/", 1)[1], job_dir=job.dir, title=step.title)
        outage: dict = {}

        def breaker():
            if wait_for_log(job, 300.0):
                time.sleep(0.3)
                outage["log_bytes_at_kill"] = os.path.getsize(job.log)
                outage["rc_file_at_kill"] = rc_file(job)
                say(f"-- killing sshd for {E['GF_DROP_DOWN_S']}s at log byte {outage['log_bytes_at_kill']}")
                outage.update(sshd_outage(float(E["GF_DROP_DOWN_S"]), config))
                outage["rc_file_when_up"] = rc_file(job)
                say(f"-- sshd is back (pid {outage['new_listener']}); "
                    f"build exit-code file: {outage['rc_file_when_up']}")

        th = threading.Thread(target=breaker, daemon=True)
        th.start()
        up = Upgrade(roles=[sk], run=RunInfo.current("real-gpu-build upgrade"), repo=REPO, say=say,
                     reconnect_for=180.0, command_timeout=600.0)
        t = now()
        report = up.host(session, stack)
        a["upgrade_s"] = round(now() - t, 2)
        th.join(10)
        a["outage"] = outage
        save(f"report-{tag}.json", report.to_json())
        a["outcome"], a["error"] = report.outcome, report.error
        a["log_tail"] = Path(job.log).read_text(errors="replace").splitlines()[-40:]
        if not report.ok:
            return a
        t = now()
        again = Upgrade(roles=[sk], run=RunInfo.current("real-gpu-build upgrade again"), repo=REPO, say=say,
                        command_timeout=600.0).host(session, stack)
        a["again_s"] = round(now() - t, 2)
        save(f"report-{tag}-again.json", again.to_json())
        a["again"] = [e.status for e in again.entries]
        a["ok"] = again.ok and a["again"] == ["unchanged"]
    return a


def kernel_check(inv, host) -> dict:
    session = record_results(session_for(host, inv), "kernel-check")
    with session:
        code = REPO / "scripts/real-gpu-kernel/check_gpu.py"
        res = session.run(Cmd.of(f"{host.venv}/bin/python", str(code), cwd="/tmp"), step="kernel check", check=False)
    save("kernel-check.json", res.output)
    return {"exit_code": res.exit_code, "seconds": round(res.seconds, 2)}


def ssh_env_probe(inv, host, tag: str) -> str:
    session = record_results(session_for(host, inv), tag)
    with session:
        res = session.run(script('echo "PATH=$PATH"; for b in nvcc c++ g++ gcc cc cmake; do '
                                 'echo "which $b: $(command -v $b || echo -)"; done'), step="ssh environment",
                          check=False)
    save(f"{tag}.txt", res.output)
    return res.output


def attempt(fn, tag: str, *args) -> dict:
    a = {"tag": tag}
    try:
        fn(a, *args)
    except Exception as exc:
        a.update(exception=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
    SUMMARY["attempts"].append(a)
    save("summary.json", SUMMARY)
    say(f"== attempt {a.get('tag')}: ok={a.get('ok', False)} "
        f"{a.get('follow_rc', a.get('outcome', a.get('exception', '')))}")
    return a


def main() -> None:
    SUMMARY["sources"] = {p: hashlib.sha256((REPO / p).read_bytes()).hexdigest() for p in (
        "gpufleet/detached.py", "gpufleet/ssh.py", "gpufleet/apply.py", "roles/sgl_kernel.py",
        "scripts/real-gpu-kernel/CMakeLists.txt")}
    inv, host, stack = inventory("as-is", 1, [])
    env_text = ssh_env_probe(inv, host, "ssh-env")
    SUMMARY["ssh_env"] = env_text.splitlines()
    config = E["GF_SSHD_CONFIG"]
    # 1. the role as it is
    a = attempt(pass_follow, "as-is", inv, host, stack, config)
    extra: list[str] = []
    if not a.get("built"):
        # 2. work-around in the stack: name the compilers CMake and nvcc would not find on the login PATH
        extra = [f"-DCMAKE_CUDA_COMPILER={stack.sgl_kernel.cuda_home}/bin/nvcc"]
        if "which c++: -" in env_text and "which g++: -" in env_text:
            cxx = shutil.which("g++", path=E["GF_CONSOLE_PATH"]) or shutil.which("c++", path=E["GF_CONSOLE_PATH"])
            if cxx:
                extra += [f"-DCMAKE_CXX_COMPILER={cxx}", f"-DCMAKE_CUDA_HOST_COMPILER={cxx}"]
        inv, host, stack = inventory("cmake-args", 1, extra)
        a = attempt(pass_follow, "cmake-args", inv, host, stack, config)
    if not a.get("built"):
        # 3. work-around on the host: give SSH sessions this command's PATH (sshd SetEnv)
        extra = []
        config = config + ".setenv"
        text = Path(E["GF_SSHD_CONFIG"]).read_text() + f'SetEnv "PATH={E["GF_CONSOLE_PATH"]}"\n'
        Path(config).write_text(text)
        SUMMARY["setenv_restart"] = sshd_outage(0.0, config)
        inv, host, stack = inventory("setenv", 1, extra)
        ssh_env_probe(inv, host, "ssh-env-setenv")
        a = attempt(pass_follow, "setenv", inv, host, stack, config)
    if a.get("ok"):
        inv2, host2, stack2 = inventory("upgrade", 2, extra)
        attempt(pass_upgrade, "upgrade", inv2, host2, stack2, config)
        SUMMARY["kernel_check"] = kernel_check(inv2, host2)
    SUMMARY["total_s"] = now()
    follow_ok = any(x.get("kind") == "follow" and x.get("ok") for x in SUMMARY["attempts"])
    upgrade_ok = any(x.get("kind") == "upgrade" and x.get("ok") for x in SUMMARY["attempts"])
    SUMMARY["ok"] = follow_ok and upgrade_ok and SUMMARY.get("kernel_check", {}).get("exit_code") == 0
    save("summary.json", SUMMARY)
    for x in SUMMARY["attempts"]:
        say(f"   {x['tag']:<10} {x.get('kind', '?'):<8} ok={x.get('ok', False)!s:<5} built={x.get('built', '-')!s:<5} "
            f"follow_rc={x.get('follow_rc', '-')} outcome={x.get('outcome', '-')} again={x.get('again', '-')} "
            f"{x.get('exception', '')[:200]}")
    say(f"== kernel check: {SUMMARY.get('kernel_check')}; all ok: {SUMMARY['ok']}")
    raise SystemExit(0 if SUMMARY["ok"] else 1)


main()
EOF
}

rm -rf "$W" && mkdir -p -m 700 "$W" && mkdir -p "$C" "$OUT" || exit 1
main 2>&1 | tee "$OUT/run.log"
exit "${PIPESTATUS[0]}"
