"""Benchmark (on demand): how the control node scales with the number of hosts, on light hosts (issue 13).

A light host (bench/light_hosts.py) is one private sshd (no systemd, no container) answering on 127.0.1.1,
127.0.1.2, ...: every name is its own address in the inventory and known_hosts, so gpufleet opens one SSH connection
per host and runs the whole facts script there, as on a real box (the venv is a plain one made here; no GPUs: the GPU section says so). For each
N and parallelism cap it runs `inv status --json` WARMUPS (1) + RUNS times and prints the median wall time, the control node's
CPU and peak memory (ru_maxrss of the inv process). The hosts' work runs on the same machine, so wall time here
is an upper bound; the control CPU and memory are the figures to read.

Run as root from the checkout:  python3 bench/bench_scale.py [--hosts 16,64,128,256] [--parallel 16,64] [--runs 3] [--warmups 1]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from light_hosts import LightHosts  # noqa: E402


def run_status(inventory: Path) -> tuple[float, float, int]:
    """(wall s, control CPU s, peak RSS MiB) of one `inv status --json` (its own rusage, via a wrapper)."""
    wrapper = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
               "p = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True); "
               "w = time.perf_counter() - t; r = resource.getrusage(resource.RUSAGE_CHILDREN); "
               "print(w, r.ru_utime + r.ru_stime, r.ru_maxrss // 1024, p.returncode); "
               "sys.stderr.write(p.stderr[-1500:] if p.returncode not in (0, 1) else '')")
    out = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "invoke", "-r", str(REPO), "status",
                          "--json", "--inventory", str(inventory)], capture_output=True, text=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                         cwd=REPO)  # `python -m` imports from the working directory first: this checkout's gpufleet
    wall, cpu, rss, code = out.stdout.split()
    if code not in ("0", "1"):
        raise SystemExit(f"bench: inv status exited {code}: {out.stderr}")
    return float(wall), float(cpu), int(rss)



def calibration() -> float:
    """CPU seconds of a bare `python3 -c pass` here and now: how fast this machine's CPU is under its load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(5):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", default="16,64,128,256")
    parser.add_argument("--parallel", default="16,64")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warmups", type=int, default=1, help="untimed runs first (0 for the largest N)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-scale-"))
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    sshd, rows = LightHosts(work, max(map(int, args.hosts.split(",")))), []
    try:
        sshd.start()
        for parallel in map(int, args.parallel.split(",")):
            for hosts in map(int, args.hosts.split(",")):
                inventory = sshd.write_inventory(work / f"inv-{hosts}-{parallel}.toml", venv=venv,
                                                 checkout=Path("/nonexistent/sglang"), count=hosts, parallel=parallel)
                for _ in range(args.warmups):
                    run_status(inventory)
                samples = [run_status(inventory) for _ in range(args.runs)]
                wall, cpu, rss = (statistics.median(s[i] for s in samples) for i in range(3))
                rows.append((hosts, parallel, wall, cpu, rss))
                print(f"  {hosts} hosts, parallelism {parallel}: {wall:.2f} s wall, {cpu:.2f} s CPU, {rss} MiB",
                      file=sys.stderr)
    finally:
        sshd.stop()
        shutil.rmtree(work, ignore_errors=True)
    print("| hosts | parallelism | wall (median) | control CPU | CPU per host | peak RSS |")
    print("|---|---|---|---|---|---|")
    for hosts, parallel, wall, cpu, rss in rows:
        print(f"| {hosts} | {parallel} | {wall:.2f} s | {cpu:.2f} s | {1000 * cpu / hosts:.0f} ms | {rss} MiB |")
    print(f"\n(conditions: {os.cpu_count()} cores shared with the light hosts' sshd and facts scripts, load "
          f"{os.getloadavg()[0]:.1f} at the end; a bare `python3 -c pass` costs {calibration():.3f} s CPU here)")


if __name__ == "__main__":
    main()
