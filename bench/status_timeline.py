"""Where one `inv` run's wall time goes, against real hosts: when each stage happens, from process start (issue 13).

  .venv/bin/python bench/status_timeline.py [--runs 5] -- status --json --inventory hosts/x.toml --host gpu1
  .venv/bin/python bench/status_timeline.py --runs 3 -- upgrade --hosts all --inventory hosts/x.toml

Runs Invoke's `inv` program in a child process per run with a few of its steps watched (nothing is changed or
skipped, and the watched modules are wrapped as they load, so no import moves earlier): the imports that cost most,
the first TCP connect, each host's login (HostSession.open), each exec sent (HostSession.run's `sent`) and its
answer, by step, first and last host, the comparison imports' start and end, the process's end. Prints each mark's
median over the runs (a warm-up run first, not counted), in seconds since the kernel started the process. This is how
the 2026-12-07 runs found the comparison imports competing with the handshakes for the GIL, the facts query built
only after login, and that a no-op `inv upgrade --hosts all` asks each host one exec, as `inv status` does.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WATCHED = ("invoke", "pydantic", "paramiko", "fabric", "jinja2", "rich")


def since_start() -> float:
    """Seconds since this process was started by the kernel."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    return time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")


class Marks:
    """The first time each named thing happened, in seconds since process start; per host, the first and last."""

    def __init__(self):
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def __call__(self, what: str, per_host: bool = False) -> None:
        now = since_start()
        with self.lock:
            if per_host:
                self.seen.setdefault(f"{what}, first host", now)
                self.seen[f"{what}, last host"] = now
            else:
                self.seen.setdefault(what, now)


def watch(mark: Marks) -> None:
    """Note the watched steps as they happen, wrapping each as its module loads (so no import moves earlier)."""
    import importlib.abc
    import importlib.machinery
    import socket

    patchers = {"gpufleet.engine.ssh": watch_session, "gpufleet.cli.common": watch_loader}

    class Imports(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name not in patchers and name not in WATCHED:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or not hasattr(spec.loader, "exec_module"):
                return spec
            real_exec = spec.loader.exec_module

            def exec_module(module):
                # marked as the module runs: importlib.util.find_spec (a lookup that imports nothing) asks too
                if name in WATCHED:
                    mark(f"import {name}")
                real_exec(module)
                if name in patchers:
                    patchers[name](module, mark)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Imports())
    real_connect = socket.socket.connect

    def connect(sock, address):
        mark("first TCP connect")
        return real_connect(sock, address)

    socket.socket.connect = connect


def watch_session(ssh, mark: Marks) -> None:
    """Mark each host's login and its facts exec's send and answer."""
    real_open, real_run = ssh.HostSession.open, ssh.HostSession.run

    def open_(session):
        mark("login begins", per_host=True)
        try:
            return real_open(session)
        finally:
            mark("login done", per_host=True)

    def run(session, cmd, step, *, sent=None, **options):
        def told():
            mark(f"exec sent ({step})", per_host=True)
            if sent is not None:
                sent()
        try:
            return real_run(session, cmd, step, sent=told, **options)
        finally:
            mark(f"answer read ({step})", per_host=True)

    ssh.HostSession.open, ssh.HostSession.run = open_, run


def watch_loader(common, mark: Marks) -> None:
    """Mark when the comparison imports start (every exec sent) and end."""
    real_load = common._load_ahead

    def load(ready):
        real_ready_wait = ready.wait

        def wait(*args):
            result = real_ready_wait(*args)
            mark("comparison imports begin")
            return result

        ready.wait = wait
        real_load(ready)
        mark("comparison imports done")

    common._load_ahead = load


def child(argv: list[str], answer_fd: int) -> None:
    mark = Marks()
    watch(mark)
    sys.argv = ["inv", *argv]
    from invoke.main import program

    try:
        program.run()
    except SystemExit:
        pass
    mark("end")
    os.write(answer_fd, json.dumps(mark.seen).encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--child", type=int, metavar="FD", help=argparse.SUPPRESS)
    parser.add_argument("inv_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    inv_args = args.inv_args[1:] if args.inv_args[:1] == ["--"] else args.inv_args
    if args.child is not None:
        child(inv_args, args.child)
        return
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # as a user's shell has it
    runs: list[dict[str, float]] = []
    for n in range(args.runs + 1):  # the first warms the caches (pyc, page cache) and is not counted
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, __file__, "--child", str(write), "--", *inv_args], cwd=REPO,
                                env=env, stdout=subprocess.DEVNULL, pass_fds=(write,))
        os.close(write)
        with os.fdopen(read) as answer:
            seen = json.loads(answer.read() or "{}")
        proc.wait()
        if n:
            runs.append(seen)
    names = sorted({k for r in runs for k in r}, key=lambda k: statistics.median(r[k] for r in runs if k in r))
    print(f"`inv {' '.join(inv_args)}`: median of {len(runs)} runs, seconds since process start")
    for name in names:
        print(f"  {statistics.median(r[name] for r in runs if name in r):6.3f}  {name}")


if __name__ == "__main__":
    main()
