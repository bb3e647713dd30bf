"""Benchmark (on demand, never in CI): a rolling upgrade of 4 hosts against one host's upgrade and the ideal (issue 13).

Boots a private simulated fleet of 4 hosts on the old stack and gives every sgl-kernel build a fixed extra length
(SimFleet.set_build_seconds: the stand-in CMake sleeps while configuring), then times, each on freshly reset hosts
with an empty control-node cache of its own:
  single       `inv upgrade --host gpu1`: one host, old stack to new, the build included;
  single, cached  `inv upgrade --host gpu2` with single's cache: the same host work, the build's wheel handed over;
  roll, batch B   `inv upgrade --hosts all --batch B`: the canary (builds; stop, upgrade, deploy, health gate, fleet
                  lock), then the other 3 hosts B at a time, each installing the canary's wheel from the control
                  node's cache (gpufleet/kernel/buildcache.py; the sgl-kernel role plans an upload, not a build).
The ideal of a roll: its canary's seconds + ceil(3 / B) x one later host's seconds (the median later host of the
batch-1 roll, where hosts do not compete): one build, N installs, each batch fully in parallel, no overhead between.
Every run is reported (no warm-up: each is minutes long). The hosts' work runs on this machine's cores too.

Run as root from the checkout, on a private fleet:
  GPUFLEET_SIM_PREFIX=gbr GPUFLEET_SIM_SUBNET=10.231.0 python3 bench/bench_roll.py [--build-seconds 60] [--batches 1,3]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpufleet.sim.fleet import SimFleet  # noqa: E402
from gpufleet.sim.inventory_file import render_inventory  # noqa: E402

HOSTS = ["gpu1", "gpu2", "gpu3", "gpu4"]
# A quick health gate, as tests/sim/test_roll.py: the stand-in server warms up in 1 s.
FAST = '[defaults.stack.server]\nhealth_timeout = 60\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'


def say(line: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {line}", file=sys.stderr, flush=True)


def fresh(fleet: SimFleet, names: list[str], build_seconds: int, reset: bool = True) -> None:
    """The hosts back to their freshly booted state (the old stack), each build made build_seconds longer."""
    for name in names:
        if reset:
            fleet.reset_host(name)
        fleet.set_build_seconds(name, build_seconds)


def inv(args: list[str], env: dict) -> tuple[float, subprocess.CompletedProcess, tuple[float, float]]:
    """One `inv ARGS --json`: its wall seconds, the process, and the 1-minute load average before and after."""
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), *args, "--json"], capture_output=True,
                          text=True, env={**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"},
                                          **env}, cwd=REPO)  # `python -m` imports from the working directory first
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"bench: `inv {' '.join(args)}` exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    return wall, proc, (load0, os.getloadavg()[0])


def run_env(work: Path, name: str) -> dict:
    """An empty control-node cache, runs and locks directory of the run's own: its canary must build."""
    d = work / name
    return {"GPUFLEET_CACHE_DIR": str(d / "cache"), "GPUFLEET_RUNS_DIR": str(d / "runs"),
            "GPUFLEET_LOCKS_DIR": str(d / "locks")}


def build_seconds(env: dict) -> float | None:
    """The canary's build as it recorded it (record.json's seconds, in the run's control-node cache)."""
    records = sorted(Path(env["GPUFLEET_CACHE_DIR"]).glob("sgl-kernel/*/record.json"))
    return json.loads(records[0].read_text())["seconds"] if records else None


def kernel_seconds(report: dict) -> float | None:
    found = [e for e in report["entries"] if e["role"] == "sgl-kernel" and e["status"] == "changed"]
    return found[0]["seconds"] if found else None


def single(work: Path, inventory: Path, host: str, env: dict) -> dict:
    wall, proc, load = inv(["upgrade", "--host", host, "--inventory", str(inventory)], env)
    [report] = json.loads(proc.stdout)
    if report["outcome"] != "ok":
        raise SystemExit(f"bench: upgrade of {host}: {report['outcome']}: {report.get('error')}")
    kernel = next(e for e in report["entries"] if e["role"] == "sgl-kernel")
    return {"wall": wall, "load": load, "kernel": kernel_seconds(report), "kernel_title": kernel.get("title", "")}


def roll(work: Path, inventory: Path, batch: int, env: dict) -> dict:
    wall, proc, load = inv(["upgrade", "--hosts", "all", "--batch", str(batch), "--inventory", str(inventory)], env)
    summary = json.loads(proc.stdout)
    if summary["status"] != "completed":
        raise SystemExit(f"bench: roll with --batch {batch}: {summary['status']}: {summary.get('note')}")
    hosts = {r["host"]: r for r in summary["results"]}
    canary = summary["batches"][0][0]
    others = [h for h in hosts if h != canary]
    # which hosts compiled (their logs announce the build step) rather than install the canary's wheel
    record = Path(env["GPUFLEET_RUNS_DIR"]) / summary["started"]
    built = [h for h in hosts if "\nsgl-kernel: build sgl-kernel " in (record / f"{h}.log").read_text(errors="replace")]
    return {"wall": wall, "load": load, "batches": summary["batches"], "canary": hosts[canary]["seconds"],
            "others": [hosts[h]["seconds"] for h in others], "build": build_seconds(env),
            "built_on": built}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--build-seconds", type=int, default=60, help="the fixed extra length of each build")
    parser.add_argument("--batches", default="1,3", help="comma-separated --batch values to roll with")
    parser.add_argument("--keep", action="store_true", help="leave the fleet up afterwards")
    args = parser.parse_args()
    fleet, work = SimFleet(), Path(tempfile.mkdtemp(prefix="gpufleet-bench-roll-"))
    say(f"booting {len(HOSTS)} hosts (load {os.getloadavg()[0]:.1f})")
    fleet.up(count=len(HOSTS), inventory=work / "sim.toml", on_progress=lambda m: say(f"sim: {m}"))
    try:
        inventory = work / "hosts.toml"
        text = render_inventory(fleet, fleet.state().hosts)
        inventory.write_text(text.replace("[defaults.stack.pip]", FAST + "[defaults.stack.pip]"))
        fresh(fleet, HOSTS, args.build_seconds, reset=False)
        env = run_env(work, "single")
        say("single: inv upgrade --host gpu1 (builds)")
        one = single(work, inventory, "gpu1", env)
        say(f"  {one['wall']:.1f} s (sgl-kernel step {one['kernel']} s: {one['kernel_title']})")
        say("single, cached: inv upgrade --host gpu2 (the wheel from the control node's cache)")
        cached = single(work, inventory, "gpu2", env)
        say(f"  {cached['wall']:.1f} s (sgl-kernel step {cached['kernel']} s: {cached['kernel_title']})")
        rolls = {}
        for batch in map(int, args.batches.split(",")):
            say(f"resetting the hosts; then a roll with --batch {batch}")
            fresh(fleet, HOSTS, args.build_seconds)
            rolls[batch] = roll(work, inventory, batch, run_env(work, f"roll-{batch}"))
            r = rolls[batch]
            say(f"  {r['wall']:.1f} s: canary {r['canary']} s (build {r['build']} s), others {r['others']} s, "
                f"batches {r['batches']}, built on {', '.join(r['built_on']) or 'no host'}")
        later = statistics.median(rolls[1]["others"]) if 1 in rolls else cached["wall"]
        print(f"\n4 hosts, old stack to new, each build {args.build_seconds} s longer (stand-in), "
              f"{os.cpu_count()} cores shared with the hosts\n")
        print("| run | wall | x single host | ideal | x ideal | canary (its build) | later hosts each | load 1 min "
              "before-after |")
        print("|---|---|---|---|---|---|---|---|")
        print(f"| single: `inv upgrade --host gpu1` | {one['wall']:.1f} s | 1.00 | | | "
              f"sgl-kernel step {one['kernel']:.1f} s | | {one['load'][0]:.1f}-{one['load'][1]:.1f} |")
        print(f"| single, wheel from the cache (gpu2) | {cached['wall']:.1f} s | {cached['wall'] / one['wall']:.2f} "
              f"| | | sgl-kernel step {cached['kernel'] or 0:.1f} s | | {cached['load'][0]:.1f}-{cached['load'][1]:.1f} |")
        for batch, r in rolls.items():
            ideal = r["canary"] + math.ceil(3 / batch) * later
            build = f"{r['build']:.1f} s" if r["build"] is not None else "?"
            print(f"| roll `--hosts all --batch {batch}` | {r['wall']:.1f} s | {r['wall'] / one['wall']:.2f} | "
                  f"{ideal:.1f} s | {r['wall'] / ideal:.2f} | {r['canary']:.1f} s ({build}) | "
                  f"{', '.join(f'{s:.1f}' for s in r['others'])} s | {r['load'][0]:.1f}-{r['load'][1]:.1f} |")
        print(f"\n(ideal = the roll's canary + ceil(3 / batch) x {later:.1f} s, the median later host of the "
              f"batch-1 roll; a roll host also stops, deploys and passes the health gate, a single upgrade does not)")
    finally:
        if not args.keep:
            fleet.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
