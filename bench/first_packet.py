"""How long `inv TASK ...` takes from process start to its first SSH connect, in wall and CPU time (issue 13).

  python3 bench/first_packet.py [--runs 5] -- status --json --inventory hosts/x.toml

Runs Invoke's `inv` program in this process with socket.connect watched: at the first connect to port 22 it prints
the seconds since the process started (from /proc/self/stat) and the CPU it used, and exits without connecting.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def since_start() -> float:
    """Seconds since this process was started by the kernel."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start


def watch() -> None:
    real = socket.socket.connect

    def connect(self, address):
        if isinstance(address, tuple) and len(address) >= 2 and address[1] == 22:
            os.write(1, f"{since_start():.3f} {time.process_time():.3f}\n".encode())  # one write: hosts race here
            os._exit(0)
        return real(self, address)

    socket.socket.connect = connect


def child(argv: list[str]) -> None:
    watch()
    from invoke.main import program

    program.run(["inv", "-r", str(REPO), *argv])
    print("no ssh connect", flush=True)


def main() -> None:
    args = sys.argv[1:]
    runs = 5
    if args[:1] == ["--runs"]:
        runs, args = int(args[1]), args[2:]
    if args[:1] == ["--"]:
        args = args[1:]
    walls, cpus = [], []
    for _ in range(runs + 1):  # the first warms the page cache
        # bytecode caches on, as for an installed tool (PYTHONDONTWRITEBYTECODE means compiling every module anew)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True,
                             env=env).stdout
        wall, cpu = map(float, out.splitlines()[0].split())
        walls.append(wall)
        cpus.append(cpu)
    print(f"to first SSH connect: median {statistics.median(walls[1:]):.3f} s wall, "
          f"{statistics.median(cpus[1:]):.3f} s CPU ({runs} runs, load {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        main()
