"""Benchmark (on demand, never in CI): `inv status` against the plain-ssh floor, pyinfra and Ansible on the same hosts.

Boots a private simulated fleet (or reuses a running one with --reuse), installs pyinfra and ansible-core into a
bench-only venv, then times 1 warm-up + N runs of each tool reading the same things on every host (GPUs, the venv's
packages, git HEAD/status/stash, unit state and hash, free disk). Prints medians, control-node CPU (this process's
children) and host CPU (the hosts' cgroups), with ratios against the floor, in one table; with --upgrade also a
no-op `inv upgrade --hosts all` on the converged fleet against `inv status`. Tears down what it started.

Run as root from the checkout, on a private fleet:
  GPUFLEET_SIM_PREFIX=gfb GPUFLEET_SIM_SUBNET=10.240.0 python3 bench/bench_tools.py --hosts 8 [--runs 5] [--upgrade]
or on light hosts (bench/light_hosts.py: one sshd on 127.0.1.x, no containers), for a machine with cores to spare:
  python3 bench/bench_tools.py --light --hosts 8 [--light-venv /opt/torch/.venv]
Every gpufleet it times is this checkout's (the tools run from it: `python -m invoke` puts the working directory
first on sys.path). To compare two commits, run each one's bench/bench_tools.py (a `git worktree` for the other),
with no PYTHONPATH, on the same --reuse fleet.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gpufleet.facts.script import facts_script  # noqa: E402
from gpufleet.sim.fleet import SimFleet  # noqa: E402
from gpufleet.sim.layout import CHECKOUT, MODEL_PATH, PREFIX, VENV  # noqa: E402
from light_hosts import LightHosts, make_checkout  # noqa: E402  (bench/, this script's directory)

BENCH_VENV = Path(os.environ.get("GPUFLEET_BENCH_VENV", "/var/tmp/gpufleet-bench-venv"))
TOOLS = ("pyinfra==3.10.0", "ansible-core")


def user_reads(venv: Path, checkout: Path) -> str:
    """What an engineer asks each host with a general tool: the same facts as gpufleet's status, the usual
    commands (the last one, df, gives the exit code: a light host has no systemctl, and that is no failure)."""
    return "; ".join([
        "nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,compute_cap,driver_version,memory.total "
        "--format=csv,noheader,nounits",
        "nvidia-smi | head -n 4",
        f"{venv}/bin/python -m pip list --format=json --disable-pip-version-check",
        f"git -C {checkout} rev-parse HEAD", f"git -C {checkout} status --porcelain", f"git -C {checkout} stash list",
        "systemctl is-active sglang.service; systemctl is-enabled sglang.service",
        "sha256sum /etc/systemd/system/sglang.service", f"df -PB1 {venv} {checkout} /tmp",
    ])


class SimHosts:
    """The simulated fleet's hosts as the bench asks them: names, addresses, keys, CPU from their cgroups."""

    port = 22
    venv, checkout, model_path = VENV, CHECKOUT, MODEL_PATH

    def __init__(self, fleet: SimFleet, names: list[str]):
        self.fleet, self.names = fleet, names
        self.address = {n: fleet.host(n).address for n in names}
        self.client_key, self.known_hosts = fleet.client_key, fleet.known_hosts

    def ssh_argv(self, name: str) -> list[str]:
        return self.fleet.ssh_argv(name)

    def cpu_seconds(self) -> float:
        return host_cpu(self.names)


@dataclass
class Sample:
    wall: float
    control_cpu: float
    host_cpu: float


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def host_cpu(names: list[str]) -> float:
    """CPU seconds the hosts' containers have used so far (cgroup v2 cpu.stat of each host's cgroup)."""
    total = 0.0
    for name in names:
        for top in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
            stat = top / f"{PREFIX}-{name}" / "cpu.stat"
            if stat.exists():
                usage = dict(line.split() for line in stat.read_text().splitlines())
                total += int(usage["usage_usec"]) / 1e6
                break
    return total


def timed(argv: list[str] | list[list[str]], hosts, env: dict | None = None, ok=(0,),
          stdin: str | None = None) -> Sample:
    """One run: a command, or several started together (one ssh per host), waited for; its wall and CPU (the hosts'
    CPU is NaN where it cannot be read)."""
    argvs = argv if argv and isinstance(argv[0], list) else [argv]
    cpu0, host0, t0 = children_cpu(), hosts.cpu_seconds(), time.perf_counter()
    procs = [subprocess.Popen(a, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, env=tool_env(env), text=True) for a in argvs]
    outs = [p.communicate(stdin)[0] for p in procs]
    wall = time.perf_counter() - t0
    host1 = hosts.cpu_seconds()
    sample = Sample(wall, children_cpu() - cpu0, host1 - host0 if host1 is not None else math.nan)
    for p, out, a in zip(procs, outs, argvs):
        if p.returncode not in ok:
            raise SystemExit(f"bench: `{shlex.join(a)[:200]}` exited {p.returncode}:\n{out[-2000:]}")
    return sample


def tool_env(extra: dict | None = None) -> dict:
    """The environment each tool runs in: bytecode caches on, as for any installed tool (a shell that sets
    PYTHONDONTWRITEBYTECODE would make gpufleet compile its modules on every start: ~0.25 s of CPU here)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **(extra or {})}


def bench_venv() -> Path:
    """The bench-only venv with pyinfra and ansible-core (made once, kept for later runs)."""
    if not (BENCH_VENV / "bin" / "ansible").exists() or not (BENCH_VENV / "bin" / "pyinfra").exists():
        python = next((c for c in (shutil.which("python3.12"), "/root/.pyenv/versions/3.12.1/bin/python")
                       if c and _runs(c)), sys.executable)  # a pyenv shim may name a version it will not run
        subprocess.run([python, "-m", "venv", str(BENCH_VENV)], check=True)
        subprocess.run([str(BENCH_VENV / "bin" / "pip"), "install", "-q", *TOOLS], check=True)
    return BENCH_VENV


def _runs(python: str) -> bool:
    return subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0


def tool_files(hosts, work: Path) -> tuple[Path, Path]:
    """pyinfra's and Ansible's inventories for the hosts: root, the fleet's key, strict host keys."""
    key, known, port = hosts.client_key, hosts.known_hosts, hosts.port
    pyinv = work / "pyinfra_inventory.py"
    pyinv.write_text("hosts = [\n" + "".join(
        f"    ({addr!r}, {{'ssh_user': 'root', 'ssh_port': {port}, 'ssh_key': {str(key)!r}, "
        f"'ssh_known_hosts_file': {str(known)!r}, 'ssh_strict_host_key_checking': 'yes'}}),\n"
        for addr in hosts.address.values()) + "]\n")
    ini = work / "ansible_inventory.ini"
    ini.write_text("[fleet]\n" + "".join(f"{n} ansible_host={a}\n" for n, a in hosts.address.items())
                   + f"\n[fleet:vars]\nansible_user=root\nansible_port={port}\n"
                   f"ansible_ssh_private_key_file={key}\n"
                   f"ansible_ssh_common_args='-o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes'\n"
                   "ansible_python_interpreter=/usr/bin/python3\n")
    return pyinv, ini


def commands(hosts, inventory: Path, venv: Path, work: Path) -> dict:
    pyinv, ini = tool_files(hosts, work)
    names, reads = hosts.names, user_reads(hosts.venv, hosts.checkout)
    inv = [sys.executable, "-m", "invoke", "-r", str(REPO)]
    script = facts_script(hosts.venv, hosts.checkout, "sglang",
                          [hosts.venv, hosts.checkout, hosts.model_path, "/tmp"])  # as gather_facts sends it
    ansible_env = {"ANSIBLE_PIPELINING": "True", "ANSIBLE_HOST_KEY_CHECKING": "True",
                   "ANSIBLE_SSH_ARGS": "-o ControlMaster=no -o ControlPersist=no", "ANSIBLE_NOCOLOR": "1",
                   "ANSIBLE_LOCAL_TEMP": str(work / "ansible-local"), "ANSIBLE_DEPRECATION_WARNINGS": "False"}
    return {
        "plain ssh, user reads (floor)": dict(argv=[hosts.ssh_argv(n) + [reads] for n in names]),
        # what the connection alone costs (sshd's key exchange and session): the part of host CPU no script saves
        "plain ssh, `true` (the connection alone)": dict(argv=[hosts.ssh_argv(n) + ["true"] for n in names]),
        # sent as gpufleet sends it: the remote command `bash -c SCRIPT` (stdin would serialise the hosts here)
        "plain ssh, gpufleet's facts script": dict(argv=[hosts.ssh_argv(n) + [shlex.join(["bash", "-c", script])]
                                                         for n in names]),
        "gpufleet: inv status --json": dict(argv=inv + ["status", "--json", "--hosts", "all", "--inventory",
                                                        str(inventory)], ok=(0, 1)),
        "pyinfra 3.10 exec": dict(argv=[str(venv / "bin" / "pyinfra"), "-y", str(pyinv), "exec", "--",
                                        reads]),
        "Ansible shell (forks 64, pipelining)": dict(
            argv=[str(venv / "bin" / "ansible"), "fleet", "-i", str(ini), "-f", "64", "-m", "shell", "-a",
                  reads], env=ansible_env),
    }


def measure(name: str, spec: dict, hosts, runs: int) -> list[Sample]:
    timed(spec["argv"], hosts, spec.get("env"), spec.get("ok", (0,)), spec.get("stdin"))  # warm-up
    samples = [timed(spec["argv"], hosts, spec.get("env"), spec.get("ok", (0,)), spec.get("stdin"))
               for _ in range(runs)]
    print(f"  {name}: " + ", ".join(f"{s.wall:.2f}" for s in samples) + " s", file=sys.stderr)
    return samples


def table(results: dict[str, list[Sample]], hosts: int, floor: str) -> str:
    """Medians, with the ratios the targets name (against the floor and against `inv status`) and the CPU bound:
    the run's control and host CPU over this machine's cores, the least wall time that CPU allows here."""
    med = {k: Sample(*(statistics.median(getattr(s, f) for s in v) for f in ("wall", "control_cpu", "host_cpu")))
           for k, v in results.items()}
    base = med[floor].wall
    ours = next((m.wall for k, m in med.items() if k.startswith("gpufleet: inv status")), math.nan)
    cores = os.cpu_count() or 1
    lines = [f"| {hosts} host(s) | wall (median) | x floor | x inv status | control CPU | host CPU per host | "
             f"CPU bound ({cores} cores) |", "|---|---|---|---|---|---|---|"]
    for k, m in med.items():
        per_host = f"{m.host_cpu / hosts:.2f} s" if not math.isnan(m.host_cpu) else "n/a"
        bound = (m.control_cpu + (0 if math.isnan(m.host_cpu) else m.host_cpu)) / cores
        lines.append(f"| {k} | {m.wall:.2f} s | {m.wall / base:.2f} | {m.wall / ours:.2f} | {m.control_cpu:.2f} s | "
                     f"{per_host} | {bound:.2f} s |")
    return "\n".join(lines)


def converge(inventory: Path, env: dict) -> None:
    """One real `inv upgrade --hosts all` (not timed): the fleet on target before the no-op runs."""
    subprocess.run([sys.executable, "-m", "invoke", "-r", str(REPO), "upgrade", "--hosts", "all", "--inventory",
                    str(inventory)], check=True, stdout=subprocess.DEVNULL, env=tool_env(env))



def settle(hosts, quiet: float = 0.05, most: float = 120.0) -> float:
    """Wait until the hosts use under `quiet` of a core each over a second, at most `most` s; the seconds waited.
    A roll ends with model servers just started on every host, and their start would be timed as the no-op's."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < most:
        before = hosts.cpu_seconds()
        time.sleep(1.0)
        if before is None or hosts.cpu_seconds() - before < quiet * len(hosts.names):
            break
    return time.perf_counter() - t0


def interleaved(specs: dict[str, dict], hosts, runs: int) -> dict[str, list[Sample]]:
    """Each spec's warm-up, then the specs taken in turn each run: ratios between them then see the same load."""
    for spec in specs.values():
        timed(spec["argv"], hosts, spec.get("env"), spec.get("ok", (0,)))
    samples: dict[str, list[Sample]] = {k: [] for k in specs}
    for _ in range(runs):
        for k, spec in specs.items():
            samples[k].append(timed(spec["argv"], hosts, spec.get("env"), spec.get("ok", (0,))))
    for k, v in samples.items():
        print(f"  {k}: " + ", ".join(f"{s.wall:.2f}" for s in v) + " s", file=sys.stderr)
    return samples


def calibration() -> float:
    """CPU seconds of a bare `python3 -c pass` here and now: how fast this machine's CPU is under its load."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    for _ in range(5):
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) / 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hosts", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--reuse", type=Path, help="use the running fleet whose inventory this is; leave it up")
    parser.add_argument("--upgrade", action="store_true", help="also a no-op `inv upgrade --hosts all` vs status")
    parser.add_argument("--only", help="comma-separated substrings of the rows to run")
    parser.add_argument("--light", action="store_true", help="light hosts (bench/light_hosts.py) instead of the "
                        "simulated fleet's containers")
    parser.add_argument("--light-venv", type=Path, help="with --light: the venv the hosts read (default: one made "
                        "here, with pip, so that the user reads' `pip list` answers)")
    args = parser.parse_args()
    if args.light and (args.reuse or args.upgrade):
        parser.error("--light hosts have no systemd: no --upgrade, and nothing to --reuse")
    if args.reuse:
        args.reuse = args.reuse.resolve()
    # `python -m invoke -r REPO` imports gpufleet from the working directory before REPO: run every tool from REPO,
    # or a bench of another commit's checkout would time this directory's code
    os.chdir(REPO)
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-"))
    inventory = args.reuse or work / "inventory.toml"
    fleet = light = None
    try:
        if args.light:
            light = LightHosts(work, args.hosts).start()
            venv = args.light_venv or work / "venv"
            if not args.light_venv:
                subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            hosts = light
            light.write_inventory(inventory, venv=venv, checkout=make_checkout(work))
            where = "light hosts: one sshd on 127.0.1.x of this machine, no containers"
        else:
            fleet = SimFleet()
            if not args.reuse:
                fleet.up(count=args.hosts, inventory=inventory,
                         on_progress=lambda m: print(f"sim: {m}", file=sys.stderr))
            chosen = fleet.state().hosts[: args.hosts]
            if args.reuse:  # the tools' and inv's hosts: exactly the chosen ones
                inventory = work / "inventory.toml"
                fleet.write_inventory(inventory, chosen)
            hosts = SimHosts(fleet, [h.name for h in chosen])
            where = "hosts are systemd-nspawn containers on the same machine"
        specs = commands(hosts, inventory, BENCH_VENV, work)
        if args.only:
            specs = {k: v for k, v in specs.items() if any(o in k for o in args.only.split(","))}
        if any(k.startswith(("pyinfra", "Ansible")) for k in specs):  # made only when a row runs its tools
            bench_venv()
        print(f"bench: {len(hosts.names)} hosts, 1 warm-up + {args.runs} runs each, {os.cpu_count()} control cores, "
              f"load {os.getloadavg()[0]:.1f}", file=sys.stderr)
        results = {k: measure(k, v, hosts, args.runs) for k, v in specs.items()}
        if args.upgrade:
            # the rolls' records and the locks they write: the bench's, not the checkout's
            runs = {"GPUFLEET_RUNS_DIR": str(work / "runs"), "GPUFLEET_LOCKS_DIR": str(work / "locks")}
            converge(inventory, runs)
            waited = settle(hosts)
            print(f"  the converged hosts went quiet in {waited:.0f} s", file=sys.stderr)
            inv = [sys.executable, "-m", "invoke", "-r", str(REPO)]
            # the no-op's own `inv status`: on the same converged fleet, in turn with it
            pair = interleaved({
                "gpufleet: inv status --json, converged (in turn with the no-op)": specs.get(
                    "gpufleet: inv status --json") or commands(hosts, inventory, BENCH_VENV, work)[
                    "gpufleet: inv status --json"],
                "gpufleet: inv upgrade --hosts all (no-op)": dict(
                    argv=inv + ["upgrade", "--hosts", "all", "--inventory", str(inventory)], env=runs)}, hosts,
                args.runs)
            results.update(pair)
            status, noop = (statistics.median(s.wall for s in v) for v in pair.values())
            noop_line = (f"no-op `inv upgrade --hosts all` / `inv status`, both on the converged fleet: "
                         f"{noop / status:.2f}")
        floor = next((k for k in results if "floor" in k), next(iter(results)))
        print(table(results, len(hosts.names), floor))
        if args.upgrade:
            print(f"\n{noop_line}")
        print(f"\n(conditions: {os.cpu_count()} control cores shared, load average {os.getloadavg()[0]:.1f} at the "
              f"end; {where}; a bare `python3 -c pass` costs {calibration():.3f} s CPU here)")
    finally:
        if light is not None:
            light.stop()
        if fleet is not None and not args.reuse:
            fleet.down()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
