"""How long `inv TASK ...` takes from process start to its first TCP connect and its first SSH packet, in wall and
CPU time (issue 13).

  python3 bench/first_packet.py [--runs 5] [--gpufleet] -- status --json --inventory hosts/x.toml

Runs Invoke's `inv` program (or, with --gpufleet, the installed command's program) in this process with the socket
watched, and connects nothing: a connect to port 22 is noted (seconds since the process started, from
/proc/self/stat, and the CPU used) and reported as done; the first bytes paramiko sends on it (its `SSH-2.0-...`
banner: the first SSH packet, which needs paramiko imported) are noted too and the process exits. gpufleet may open
the TCP connection before it imports paramiko (engine/dial.py), so the two can be far apart.
"""

from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def since_start() -> float:
    """Seconds since this process was started by the kernel."""
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
    start = int(fields[19]) / os.sysconf("SC_CLK_TCK")
    return time.clock_gettime(time.CLOCK_BOOTTIME) - start


def watch() -> None:
    real_connect, real_send, real_sendall = socket.socket.connect, socket.socket.send, socket.socket.sendall
    first: list[str] = []  # the first connect's times (hosts race here: the first one counts)
    lock = threading.Lock()
    ssh = weakref.WeakSet()  # the sockets "connected" to port 22 (socket.socket has slots: no attribute of its own)

    def connect(self, address):
        if isinstance(address, tuple) and len(address) >= 2 and address[1] == 22:
            with lock:
                if not first:
                    first.append(f"{since_start():.3f} {time.process_time():.3f}")
            ssh.add(self)
            return None  # reported as connected: nothing leaves this machine
        return real_connect(self, address)

    def banner(self, data) -> None:
        if self in ssh and bytes(data[:4]) == b"SSH-":
            os.write(1, f"{first[0]} {since_start():.3f} {time.process_time():.3f}\n".encode())  # one write
            os._exit(0)

    def send(self, data, *args):
        banner(self, data)
        return real_send(self, data, *args)

    def sendall(self, data, *args):
        banner(self, data)
        return real_sendall(self, data, *args)

    socket.socket.connect, socket.socket.send, socket.socket.sendall = connect, send, sendall


def child(argv: list[str]) -> None:
    watch()
    if argv[:1] == ["--gpufleet"]:
        sys.argv = ["gpufleet", *argv[1:]]
        from gpufleet.cli.main import program

        program.run(sys.argv)
    else:
        from invoke.main import program

        program.run(["inv", "-r", str(REPO), *argv])
    print("no ssh connect", flush=True)


def main() -> None:
    args = sys.argv[1:]
    runs = 5
    program = []
    if args[:1] == ["--runs"]:
        runs, args = int(args[1]), args[2:]
    if args[:1] == ["--gpufleet"]:  # the installed command (gpufleet/cli/main.py) instead of `inv` in this checkout
        program, args = ["--gpufleet"], args[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    times = []
    for _ in range(runs + 1):  # the first warms the page cache
        # bytecode caches on, as for an installed tool (PYTHONDONTWRITEBYTECODE means compiling every module anew)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        env["PYTHONPATH"] = os.pathsep.join([str(REPO), *filter(None, [env.get("PYTHONPATH")])])  # this checkout's code
        out = subprocess.run([sys.executable, __file__, "--child", *program, *args], capture_output=True,
                             text=True, env=env, cwd=REPO).stdout
        times.append([float(x) for x in out.splitlines()[0].split()])
    connect_wall, connect_cpu, banner_wall, banner_cpu = (statistics.median(t[i] for t in times[1:]) for i in range(4))
    print(f"to first TCP connect: median {connect_wall:.3f} s wall, {connect_cpu:.3f} s CPU; "
          f"to first SSH packet (the client's banner): {banner_wall:.3f} s wall, {banner_cpu:.3f} s CPU "
          f"({runs} runs, load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2:])
    else:
        main()
