"""Benchmark: reading a fleet's state with gpufleet (one connection, one round trip per host, hosts in parallel)
against the manual baseline (one `ssh host cmd` per fact, host after host). Prints the ratio of one run.

Run as root: python3 bench/bench_status.py [--hosts 3] [--rounds 3]
It uses a running simulated fleet (`inv sim.up`) or boots one and removes it afterwards."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpufleet.facts.gather import gather_facts  # noqa: E402
from gpufleet.config.inventory import load_inventory  # noqa: E402
from gpufleet.engine.runner import for_each_host  # noqa: E402
from gpufleet.sim.fleet import SimFleet  # noqa: E402

# What an engineer types to learn the same facts, one command at a time.
MANUAL_COMMANDS = [
    "nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total --format=csv,noheader",
    "nvidia-smi | head -n 4",
    "cat /etc/os-release", "nproc", "free -b", "df -B1 /root /tmp",
    "/root/venv/bin/python -m pip list --format=json",
    "git -C /root/sglang-main rev-parse HEAD", "git -C /root/sglang-main status --porcelain",
    "git -C /root/sglang-main stash list", "systemctl is-active sglang",
]


def manual(fleet: SimFleet, names: list[str]) -> float:
    started = time.perf_counter()
    for name in names:
        for cmd in MANUAL_COMMANDS:
            subprocess.run(fleet.ssh_argv(name) + [cmd], capture_output=True)
    return time.perf_counter() - started


def gpufleet(inventory_path: Path) -> float:
    inv = load_inventory(inventory_path)
    started = time.perf_counter()
    outcomes = for_each_host(list(inv.hosts.values()), inv, gather_facts)
    elapsed = time.perf_counter() - started
    assert all(o.ok for o in outcomes), [o.error for o in outcomes if not o.ok]
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    fleet = SimFleet()
    booted = not fleet.status() or len(fleet.status()) < args.hosts
    inventory = fleet.run_dir.parent / f"bench-{fleet.run_dir.name}.toml"
    if booted:
        fleet.up(count=args.hosts, inventory=inventory, on_progress=lambda m: None)
    else:
        fleet.write_inventory(inventory, fleet.state().hosts[: args.hosts])
    names = [h.name for h in fleet.state().hosts[: args.hosts]]
    try:
        base = [manual(fleet, names) for _ in range(args.rounds)]
        ours = [gpufleet(inventory) for _ in range(args.rounds)]
    finally:
        if booted:
            fleet.down()
    b, o = statistics.median(base), statistics.median(ours)
    print(f"hosts={len(names)} rounds={args.rounds}")
    print(f"baseline (ssh per command, {len(MANUAL_COMMANDS)} commands/host, serial): median {b:.3f}s")
    print(f"gpufleet (one connection + one round trip per host, parallel):   median {o:.3f}s")
    print(f"ratio baseline/gpufleet: {b / o:.1f}x")


if __name__ == "__main__":
    main()
