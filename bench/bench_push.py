"""Benchmark: pushing large files onto a simulated host, each way gpufleet could, against OpenSSH scp (the baseline).

Run as root: python3 bench/bench_push.py [--big-mib 512] [--set-mib 256] [--set-files 20] [--rounds 3]
It boots its own one-host fleet (GPUFLEET_SIM_PREFIX=gfd, GPUFLEET_SIM_SUBNET=10.217.0 unless set) and removes it
at the end. Two loads: one ~512 MiB random file (a flashinfer-jit-cache wheel) and ~20 files of ~256 MiB in all
(a CUDA wheel cascade). Each method writes into an emptied directory on the host; MB/s = 1e6 bytes per second;
"raw" methods stop when the data is on the host, the push_files rows also include the remote sha256 check before
and the on-host verification and rename after.

Figures on the 2-core development machine (two runs of `--rounds 3`, other engineers' tests running beside them:
the same method moves by up to 40% between runs, so read ratios within one run):

    host gpu1 (10.217.0.11), 2 cores, rounds=3; push_files' ssh: ssh -T -x ...

    one big file: 1 file(s), 512 MiB
      scp (baseline; SFTP protocol, default cipher)              302.8 MB/s   1.00x scp (median of 3)
      scp -O (legacy scp protocol)                               325.7 MB/s   1.08x scp (median of 3)
      scp -c aes128-gcm@openssh.com                              443.6 MB/s   1.46x scp (median of 3)
      paramiko sftp.put (apply.py today)                         221.5 MB/s   0.73x scp (median of 3)
      paramiko sftp tuned (64 MiB window, 255 KiB writes)        328.0 MB/s   1.08x scp (median of 3)
      paramiko exec channel, dd of=                              374.1 MB/s   1.24x scp (median of 3)
      ssh 'dd of=' per file, default cipher                      515.3 MB/s   1.70x scp (median of 3)
      ssh 'dd of=' per file, aes128-gcm@openssh.com              493.1 MB/s   1.63x scp (median of 3)
      ssh 'dd of=' 2 files at a time, aes128-gcm@openssh.com     553.0 MB/s   1.83x scp (median of 3)
      push_files openssh (tar stream, check+verify+rename)       365.6 MB/s   1.21x scp (median of 3)
      push_files paramiko (tar stream, check+verify+rename)      256.6 MB/s   0.85x scp (median of 3)

    cuda cascade: 20 file(s), 256 MiB
      scp (baseline; SFTP protocol, default cipher)              256.8 MB/s   1.00x scp (median of 3)
      scp -O (legacy scp protocol)                               283.8 MB/s   1.11x scp (median of 3)
      scp -c aes128-gcm@openssh.com                              333.2 MB/s   1.30x scp (median of 3)
      paramiko sftp.put (apply.py today)                         215.3 MB/s   0.84x scp (median of 3)
      paramiko sftp tuned (64 MiB window, 255 KiB writes)        271.3 MB/s   1.06x scp (median of 3)
      paramiko exec channel, dd of=                              142.1 MB/s   0.55x scp (median of 3)
      ssh 'dd of=' per file, default cipher                       40.1 MB/s   0.16x scp (median of 3)
      ssh 'dd of=' per file, aes128-gcm@openssh.com               43.3 MB/s   0.17x scp (median of 3)
      ssh 'dd of=' 2 files at a time, aes128-gcm@openssh.com      73.4 MB/s   0.29x scp (median of 3)
      push_files openssh (tar stream, check+verify+rename)       223.6 MB/s   0.87x scp (median of 3)
      push_files paramiko (tar stream, check+verify+rename)      198.8 MB/s   0.77x scp (median of 3)
A second run, with the streaming phase of push_files alone (no check, connection set-up or verification):

    host gpu1 (10.217.0.11), 2 cores, rounds=3; push_files' ssh: ssh -T -x ...

    one big file: 1 file(s), 512 MiB
      scp (baseline; SFTP protocol, default cipher)              211.3 MB/s   1.00x scp (median of 3)
      scp -O (legacy scp protocol)                               304.2 MB/s   1.44x scp (median of 3)
      scp -c aes128-gcm@openssh.com                              478.1 MB/s   2.26x scp (median of 3)
      paramiko sftp.put (apply.py today)                         256.2 MB/s   1.21x scp (median of 3)
      paramiko sftp tuned (64 MiB window, 255 KiB writes)        281.5 MB/s   1.33x scp (median of 3)
      paramiko exec channel, dd of=                              251.0 MB/s   1.19x scp (median of 3)
      ssh 'dd of=' per file, default cipher                      336.5 MB/s   1.59x scp (median of 3)
      ssh 'dd of=' per file, aes128-gcm@openssh.com              423.3 MB/s   2.00x scp (median of 3)
      ssh 'dd of=' 2 files at a time, aes128-gcm@openssh.com     438.8 MB/s   2.08x scp (median of 3)
      push_files openssh (tar stream, check+verify+rename)       321.3 MB/s   1.52x scp (median of 3; streaming alone 428 MB/s)
      push_files paramiko (tar stream, check+verify+rename)      251.3 MB/s   1.19x scp (median of 3; streaming alone 320 MB/s)

    cuda cascade: 20 file(s), 256 MiB
      scp (baseline; SFTP protocol, default cipher)              293.0 MB/s   1.00x scp (median of 3)
      scp -O (legacy scp protocol)                               331.8 MB/s   1.13x scp (median of 3)
      scp -c aes128-gcm@openssh.com                              355.9 MB/s   1.21x scp (median of 3)
      paramiko sftp.put (apply.py today)                         272.1 MB/s   0.93x scp (median of 3)
      paramiko sftp tuned (64 MiB window, 255 KiB writes)        269.2 MB/s   0.92x scp (median of 3)
      paramiko exec channel, dd of=                              151.7 MB/s   0.52x scp (median of 3)
      ssh 'dd of=' per file, default cipher                       41.9 MB/s   0.14x scp (median of 3)
      ssh 'dd of=' per file, aes128-gcm@openssh.com               42.9 MB/s   0.15x scp (median of 3)
      ssh 'dd of=' 2 files at a time, aes128-gcm@openssh.com      73.6 MB/s   0.25x scp (median of 3)
      push_files openssh (tar stream, check+verify+rename)       221.7 MB/s   0.76x scp (median of 3; streaming alone 315 MB/s)
      push_files paramiko (tar stream, check+verify+rename)      175.2 MB/s   0.60x scp (median of 3; streaming alone 246 MB/s)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("GPUFLEET_SIM_PREFIX", "gfd")
os.environ.setdefault("GPUFLEET_SIM_SUBNET", "10.217.0")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import paramiko  # noqa: E402

from gpufleet.engine.command import Cmd  # noqa: E402
from gpufleet.wheels.fetch import sha256_of  # noqa: E402
from gpufleet.config.inventory import load_inventory  # noqa: E402
from gpufleet.wheels.push import PushItem, openssh_argv, push_files  # noqa: E402
from gpufleet.engine.runner import session_for  # noqa: E402
from gpufleet.sim.fleet import SimFleet  # noqa: E402

REMOTE = "/root/bench-push"
GCM = "aes128-gcm@openssh.com"


def make_files(workdir: Path, big_mib: int, set_mib: int, set_files: int) -> dict[str, list[Path]]:
    """Random (incompressible) files: one big one, and a cascade of a few large and many small wheels."""
    workdir.mkdir(parents=True, exist_ok=True)
    big = workdir / "flashinfer_jit_cache.whl"
    _random_file(big, big_mib << 20)
    weights = [2 ** (i % 5) for i in range(set_files)]  # sizes spread 1:16, like cublas next to cuda-runtime
    cascade = []
    for i, w in enumerate(weights):
        path = workdir / f"nvidia_cuda_part{i:02d}.whl"
        _random_file(path, (set_mib << 20) * w // sum(weights))
        cascade.append(path)
    return {"one big file": [big], "cuda cascade": cascade}


def _random_file(path: Path, size: int) -> None:
    if path.exists() and path.stat().st_size == size:
        return
    with open(path, "wb") as f:
        for left in range(size, 0, -(1 << 24)):
            f.write(os.urandom(min(left, 1 << 24)))


def _ssh_opts(fleet: SimFleet) -> list[str]:
    """What fleet.ssh_argv uses (the fleet's key and known_hosts, strict checking), minus the destination."""
    return fleet.ssh_argv("gpu1")[1:-1]


def scp(fleet, session, files, *extra: str) -> None:
    subprocess.run(["scp", "-q", *extra, *_ssh_opts(fleet), *map(str, files),
                    f"root@{session.host.address}:{REMOTE}/"], check=True)


def ssh_cat(fleet, session, files, *extra: str, parallel: int = 1) -> None:
    """`ssh host 'cat > file' < file`, one ssh per file, `parallel` at a time."""
    def one(path: Path) -> None:
        with open(path, "rb") as f:
            subprocess.run(["ssh", *extra, *_ssh_opts(fleet), f"root@{session.host.address}",
                            Cmd.of("dd", f"of={REMOTE}/{path.name}", "bs=1M", "status=none").render()],
                           stdin=f, check=True)
    _in_parallel(one, files, parallel)


def _in_parallel(fn, files, parallel: int) -> None:
    pending = list(files)
    lock = threading.Lock()
    errors = []

    def worker():
        while True:
            with lock:
                if not pending:
                    return
                path = pending.pop(0)
            try:
                fn(path)
            except Exception as exc:  # noqa: BLE001 - reported after the join
                errors.append(exc)
    threads = [threading.Thread(target=worker) for _ in range(parallel)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]


def sftp_put(fleet, session, files) -> None:
    """What apply.py does today: Fabric's sftp().put (paramiko pipelines writes of 32 KiB)."""
    sftp = session.conn.sftp()
    for path in files:
        sftp.put(str(path), f"{REMOTE}/{path.name}")


def sftp_tuned(fleet, session, files) -> None:
    """paramiko SFTP on its own channel with a 64 MiB window, writes of 255 KiB (sftp-server accepts 256 KiB)."""
    sftp = paramiko.SFTPClient.from_transport(session.conn.transport, window_size=64 << 20,
                                              max_packet_size=1 << 18)
    try:
        for path in files:
            with open(path, "rb") as src, sftp.open(f"{REMOTE}/{path.name}", "wb") as dst:
                dst.MAX_REQUEST_SIZE = 255 << 10
                dst.set_pipelined(True)
                while chunk := src.read(4 << 20):
                    dst.write(chunk)
    finally:
        sftp.close()


def paramiko_cat(fleet, session, files) -> None:
    """An exec channel per file on the session's transport: `dd of=FILE` fed with sendall of 1 MiB chunks."""
    for path in files:
        chan = session.conn.transport.open_session(window_size=64 << 20)
        chan.exec_command(Cmd.of("dd", f"of={REMOTE}/{path.name}", "bs=1M", "status=none").render())
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                chan.sendall(chunk)
        chan.shutdown_write()
        assert chan.recv_exit_status() == 0
        chan.close()


def pushed(method: str):
    def run(fleet, session, files) -> None:
        items = [PushItem(p, f"{REMOTE}/{p.name}", SHAS[p]) for p in files]
        report = push_files(session, items, method=method)
        assert len(report.pushed) == len(items) and report.method == method, report
        PHASES.append(report.bytes_sent / 1e6 / sum(f.seconds for f in report.pushed))
    return run


PHASES: list[float] = []  # push_files' streaming phase alone (no check, connection set-up, verify), MB/s


SHAS: dict[Path, str] = {}

METHODS = [
    ("scp (baseline; SFTP protocol, default cipher)", lambda f, s, files: scp(f, s, files)),
    ("scp -O (legacy scp protocol)", lambda f, s, files: scp(f, s, files, "-O")),
    (f"scp -c {GCM}", lambda f, s, files: scp(f, s, files, "-c", GCM)),
    ("paramiko sftp.put (apply.py today)", sftp_put),
    ("paramiko sftp tuned (64 MiB window, 255 KiB writes)", sftp_tuned),
    ("paramiko exec channel, dd of=", paramiko_cat),
    ("ssh 'dd of=' per file, default cipher", lambda f, s, files: ssh_cat(f, s, files)),
    (f"ssh 'dd of=' per file, {GCM}", lambda f, s, files: ssh_cat(f, s, files, "-c", GCM)),
    (f"ssh 'dd of=' 2 files at a time, {GCM}", lambda f, s, files: ssh_cat(f, s, files, "-c", GCM, parallel=2)),
    ("push_files openssh (tar stream, check+verify+rename)", pushed("openssh")),
    ("push_files paramiko (tar stream, check+verify+rename)", pushed("paramiko")),
]


def measure(fleet, session, fn, files, rounds: int) -> float:
    PHASES.clear()
    size = sum(p.stat().st_size for p in files)
    rates = []
    for _ in range(rounds):
        session.run(Cmd.of("bash", "-c", f"rm -rf {REMOTE} && mkdir -p {REMOTE} && sync"), step="bench: empty")
        started = time.perf_counter()
        fn(fleet, session, files)
        rates.append(size / 1e6 / (time.perf_counter() - started))
    check = session.run(Cmd.of("bash", "-c", f"cd {REMOTE} && sha256sum *"), step="bench: check")
    got = {line.split()[1]: line.split()[0] for line in check.output.splitlines()}
    assert got == {p.name: SHAS[p] for p in files}, f"{fn}: files on the host differ"
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--big-mib", type=int, default=512)
    parser.add_argument("--set-mib", type=int, default=256)
    parser.add_argument("--set-files", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/var/tmp/gpufleet-bench-push"))
    args = parser.parse_args()
    loads = make_files(args.workdir, args.big_mib, args.set_mib, args.set_files)
    for files in loads.values():
        for p in files:
            SHAS[p] = sha256_of(p)  # also leaves the files in the page cache, as the wheel cache's would be
    fleet = SimFleet()
    inventory = args.workdir / "hosts.toml"
    fleet.up(count=1, inventory=inventory, on_progress=lambda m: None)
    try:
        inv = load_inventory(inventory)
        with session_for(inv.hosts["gpu1"], inv) as session:
            print(f"host gpu1 ({session.host.address}), {os.cpu_count()} cores, rounds={args.rounds}; "
                  f"push_files' ssh: {' '.join(openssh_argv(session)[:3])} ...")
            measure(fleet, session, METHODS[0][1], loads["one big file"], 1)  # warm-up: first writes cost more
            for load, files in loads.items():
                size = sum(p.stat().st_size for p in files)
                print(f"\n{load}: {len(files)} file(s), {size / 2**20:.0f} MiB")
                base = None
                for name, fn in METHODS:
                    rate = measure(fleet, session, fn, files, args.rounds)
                    base = base or rate
                    phase = f"; streaming alone {statistics.median(PHASES):.0f} MB/s" if PHASES else ""
                    print(f"  {name:<56} {rate:7.1f} MB/s  {rate / base:5.2f}x scp (median of {args.rounds}{phase})",
                          flush=True)
            session.run(Cmd.of("rm", "-rf", REMOTE), step="bench: clean up")
    finally:
        fleet.down()


if __name__ == "__main__":
    main()
