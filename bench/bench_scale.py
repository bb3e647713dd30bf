"""Benchmark (on demand): how the control node scales with the number of hosts, on light hosts (issue 13).

A light host is one private sshd (no systemd, no container) answering on 127.0.1.1, 127.0.1.2, ...: every name is
its own address in the inventory and known_hosts, so gpufleet opens one SSH connection per host and runs the whole
facts script there, as on a real box (the venv is a plain one made here; no GPUs: the GPU section says so). For each
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
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PORT = 2299


def start_sshd(work: Path) -> subprocess.Popen:
    """One sshd on 0.0.0.0:PORT for root with a fresh key pair; its host key goes into known_hosts per address."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "host_key")], check=True)
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / "client_key")], check=True)
    (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
    os.chmod(work, 0o755)
    (work / "sshd_config").write_text(
        f"Port {PORT}\nListenAddress 0.0.0.0\nHostKey {work / 'host_key'}\nPidFile {work / 'sshd.pid'}\n"
        f"AuthorizedKeysFile {work / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
        "MaxStartups 1024\nMaxSessions 64\nLogLevel ERROR\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(work / "sshd_config")],
                            stderr=open(work / "sshd.log", "w"))
    for _ in range(100):
        if subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{PORT}"], capture_output=True).returncode == 0:
            return proc
        time.sleep(0.1)
    raise SystemExit(f"bench: sshd did not start: {(work / 'sshd.log').read_text()[-2000:]}")


def write_inventory(work: Path, hosts: int, parallel: int, venv: Path) -> Path:
    key = (work / "host_key.pub").read_text().split()
    addresses = [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(hosts)]
    (work / "known_hosts").write_text("".join(f"[{a}]:{PORT} {key[0]} {key[1]}\n" for a in addresses))
    text = (f'[settings]\nknown_hosts = "{work / "known_hosts"}"\nparallelism = {parallel}\nconnect_timeout = 60\n'
            f'ssh_config = "{work / "ssh_config"}"\n\n'
            f'[defaults]\nuser = "root"\nport = {PORT}\nidentity_file = "{work / "client_key"}"\nvenv = "{venv}"\n'
            f'sglang_checkout = "/nonexistent/sglang"\nservice = "sglang"\nmodel_path = "/tmp"\n\n'
            '[defaults.gpus]\ncount = 1\ncompute_capability = "9.0"\n\n')
    text += "".join(f'[hosts.h{i + 1}]\naddress = "{a}"\n\n' for i, a in enumerate(addresses))
    (work / "ssh_config").write_text("")
    path = work / f"inv-{hosts}-{parallel}.toml"
    path.write_text(text)
    return path


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
    sshd, rows = None, []
    try:
        sshd = start_sshd(work)
        for parallel in map(int, args.parallel.split(",")):
            for hosts in map(int, args.hosts.split(",")):
                inventory = write_inventory(work, hosts, parallel, venv)
                for _ in range(args.warmups):
                    run_status(inventory)
                samples = [run_status(inventory) for _ in range(args.runs)]
                wall, cpu, rss = (statistics.median(s[i] for s in samples) for i in range(3))
                rows.append((hosts, parallel, wall, cpu, rss))
                print(f"  {hosts} hosts, parallelism {parallel}: {wall:.2f} s wall, {cpu:.2f} s CPU, {rss} MiB",
                      file=sys.stderr)
    finally:
        if sshd is not None:
            sshd.send_signal(signal.SIGTERM)
            sshd.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    print("| hosts | parallelism | wall (median) | control CPU | CPU per host | peak RSS |")
    print("|---|---|---|---|---|---|")
    for hosts, parallel, wall, cpu, rss in rows:
        print(f"| {hosts} | {parallel} | {wall:.2f} s | {cpu:.2f} s | {1000 * cpu / hosts:.0f} ms | {rss} MiB |")
    print(f"\n(conditions: {os.cpu_count()} cores shared with the light hosts' sshd and facts scripts, load "
          f"{os.getloadavg()[0]:.1f} at the end; a bare `python3 -c pass` costs {calibration():.3f} s CPU here)")


if __name__ == "__main__":
    main()
