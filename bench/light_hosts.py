"""Light hosts for the benchmarks: one private sshd on 127.0.1.x, each address a host of its own (no systemd).

Every address is its own inventory host and known_hosts entry, so each tool opens one SSH connection per host and
runs its reads there, as on a real box, but without a container around it: a machine with cores to spare (a lent
16-core GPU server) then shows what the tools cost when the hosts do not share the control node's cores. The sshd
runs in a cgroup of its own where the kernel lets one be made, so the hosts' CPU is read as for the simulated fleet.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

PORT = 2299
CGROUP_NAME = "gpufleet-bench-light"


def sshd_binary() -> str:
    """sshd by its absolute path (it re-executes itself for each connection): $GPUFLEET_BENCH_SSHD or the PATH's."""
    found = os.environ.get("GPUFLEET_BENCH_SSHD") or shutil.which("sshd") or "/usr/sbin/sshd"
    return str(Path(found).resolve())


def addresses(count: int) -> list[str]:
    return [f"127.0.{1 + i // 250}.{1 + i % 250}" for i in range(count)]


class LightHosts:
    """One sshd for root answering every 127.0.1.x address, with a fresh host key and client key under `work`."""

    port = PORT
    venv: str | None = None  # what the hosts' inventory names (write_inventory): the bench's reads look there too
    checkout: str | None = None
    model_path: str | None = None

    def __init__(self, work: Path, count: int):
        self.work, self.count = work, count
        self.client_key = work / "client_key"
        self.known_hosts = work / "known_hosts"
        self.names = [f"h{i + 1}" for i in range(count)]
        self.address = dict(zip(self.names, addresses(count)))
        self.proc: subprocess.Popen | None = None
        self.cgroup: Path | None = None

    def start(self) -> "LightHosts":
        work = self.work
        for key in ("host_key", "client_key"):
            if not (work / key).exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(work / key)], check=True)
        (work / "authorized_keys").write_text((work / "client_key.pub").read_text())
        os.chmod(work, 0o755)
        kind, blob = (work / "host_key.pub").read_text().split()[:2]
        self.known_hosts.write_text("".join(f"[{a}]:{PORT} {kind} {blob}\n" for a in self.address.values()))
        (work / "sshd_config").write_text(
            f"Port {PORT}\nListenAddress 0.0.0.0\nHostKey {work / 'host_key'}\nPidFile {work / 'sshd.pid'}\n"
            f"AuthorizedKeysFile {work / 'authorized_keys'}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxStartups 1024\nMaxSessions 64\nLogLevel ERROR\n")
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        if _answers():
            raise SystemExit(f"bench: port {PORT} is taken already (another bench's light hosts?): stop that first")
        self.cgroup = _own_cgroup()
        sshd = [sshd_binary(), "-D", "-e", "-f", str(work / "sshd_config")]
        self.proc = subprocess.Popen(_with_plain_home(work, sshd), stderr=open(work / "sshd.log", "w"),
                                     preexec_fn=(lambda: _join(self.cgroup)) if self.cgroup else None)
        for _ in range(100):
            if _answers():
                return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        raise SystemExit(f"bench: sshd did not start: {(work / 'sshd.log').read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=30)
        if self.cgroup is not None:
            _remove_cgroup(self.cgroup)

    def ssh_argv(self, name: str) -> list[str]:
        return ["ssh", "-i", str(self.client_key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                "-p", str(PORT), f"root@{self.address[name]}"]

    def cpu_seconds(self) -> float | None:
        """CPU the hosts (sshd and every session under it) have used so far; None where no cgroup could be made."""
        if self.cgroup is None:
            return None
        usage = dict(line.split() for line in (self.cgroup / "cpu.stat").read_text().splitlines())
        return int(usage["usage_usec"]) / 1e6

    def write_inventory(self, path: Path, *, venv: Path, checkout: Path, count: int | None = None,
                        parallel: int = 64, gpus: int = 1, capability: str = "9.0", model_path: str = "/tmp",
                        service: str = "sglang") -> Path:
        """gpufleet's inventory for the first `count` hosts (all by default): root, the bench's key, strict host
        keys, no ~/.ssh/config. What it names the hosts' venv, checkout and model path becomes theirs here too."""
        self.venv, self.checkout, self.model_path = str(venv), str(checkout), model_path
        chosen = list(self.address.items())[:count]
        text = (f'[settings]\nknown_hosts = "{self.known_hosts}"\nparallelism = {parallel}\nconnect_timeout = 60\n'
                f'ssh_config = "{self.work / "ssh_config"}"\n\n'
                f'[defaults]\nuser = "root"\nport = {PORT}\nidentity_file = "{self.client_key}"\nvenv = "{venv}"\n'
                f'sglang_checkout = "{checkout}"\nservice = "{service}"\nmodel_path = "{model_path}"\n\n'
                f'[defaults.gpus]\ncount = {gpus}\ncompute_capability = "{capability}"\n\n')
        text += "".join(f'[hosts.{n}]\naddress = "{a}"\n\n' for n, a in chosen)
        (self.work / "ssh_config").write_text("")
        path.write_text(text)
        return path


def _answers() -> bool:
    return subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{PORT}"], capture_output=True).returncode == 0


def _with_plain_home(work: Path, argv: list[str]) -> list[str]:
    """argv run in a mount namespace of its own where root's ~/.bashrc and ~/.profile are the distribution's skeleton
    files: bash sources ~/.bashrc for every command sshd runs, and a development machine's (pyenv's init: ~0.1 s of
    CPU a login) is not a server's. Only those files are covered (an interpreter under /root stays reachable).
    Where no namespace can be made, argv as it is."""
    home = work / "home"
    home.mkdir(exist_ok=True)
    binds = []
    for dot in (".bashrc", ".profile"):
        if not (Path("/root") / dot).is_file():
            continue
        skeleton = Path("/etc/skel") / dot
        (home / dot).write_bytes(skeleton.read_bytes() if skeleton.is_file() else b"")
        binds.append(f"mount --bind {home / dot} /root/{dot}")
    if not binds or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0:
        return argv
    return ["unshare", "-m", "--propagation", "private", "bash", "-c", " && ".join(binds) + ' && exec "$@"', "-",
            *argv]


def make_checkout(work: Path) -> Path:
    """A small git checkout with an upstream (a clone of a one-commit repository), as the facts script reads one."""
    origin, checkout = work / "origin.git", work / "checkout"
    if not checkout.exists():
        env = {**os.environ, "GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "bench@localhost",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "bench@localhost"}
        seed = work / "seed"
        subprocess.run(["git", "init", "-q", "-b", "main", str(seed)], check=True, env=env)
        (seed / "README.md").write_text("bench checkout\n")
        subprocess.run(["git", "-C", str(seed), "add", "README.md"], check=True, env=env)
        subprocess.run(["git", "-C", str(seed), "commit", "-q", "-m", "seed"], check=True, env=env)
        subprocess.run(["git", "clone", "-q", "--bare", str(seed), str(origin)], check=True, env=env)
        subprocess.run(["git", "clone", "-q", str(origin), str(checkout)], check=True, env=env)
    return checkout


def _own_cgroup() -> Path | None:
    """A fresh cgroup v2 directory for the sshd (on a hybrid host's unified mount too), or None where the kernel or a
    container does not allow one."""
    for top in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        if not (top / "cgroup.controllers").exists():  # not a cgroup v2 mount (a hybrid host's /sys/fs/cgroup)
            continue
        cgroup = top / CGROUP_NAME
        try:
            if cgroup.exists():
                _remove_cgroup(cgroup)
            cgroup.mkdir()
        except OSError:
            return None
        if (cgroup / "cpu.stat").exists():
            return cgroup
        _remove_cgroup(cgroup)
        return None
    return None


def _join(cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(os.getpid()))


def _remove_cgroup(cgroup: Path) -> None:
    for _ in range(50):  # the sessions' processes leave it a moment after sshd's TERM
        try:
            cgroup.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.1)
