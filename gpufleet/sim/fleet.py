"""Boot and tear down simulated Blackwell GPU servers: systemd-nspawn containers with real systemd and sshd."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.sim import holder, nvidia_smi, system
from gpufleet.sim.router import ROUTER_VERSION, SimRouter
from gpufleet.sim.system import sh
# One fleet per (prefix, subnet), its addresses and shared paths: in layout.py, which the inventory renderer reads too.
from gpufleet.sim.layout import (BRIDGE, CHECKOUT, CONTROL_ADDR, GIT_PORT, GITHUB_ADDR, GITHUB_PORT, HOME_DIR,
                                 INDEX_PORT, MODEL_PATH, PREFIX, RUN_DIR, SIM_USERS, SUBNET, SUDO_PASSWORD,
                                 SUDOERS, VENV, VETH_PREFIX)

NSPAWN_MARKER = "systemd-nspawn"

# What every simulated host's nvidia-smi reports until a test changes it: the fake's own defaults.
BLACKWELL = dict(nvidia_smi.DEFAULTS)

# Units of the inherited root that a GPU box would not run; they would also fight over the shared lower layer.
MASKED_UNITS = (
    "postgresql.service", "e2scrub_reap.service", "apt-daily-upgrade.timer", "apt-daily.timer",
    "dpkg-db-backup.timer", "e2scrub_all.timer", "fstrim.timer", "man-db.timer", "systemd-timesyncd.service",
    "systemd-pstore.service", "getty@tty1.service", "console-getty.service", "redis-server.service",
    "nginx.service", "memcached.service", "docker.service", "containerd.service", "cron.service",
)


class SimError(GpufleetError):
    """The simulated fleet could not be built, booted or torn down."""


@dataclass
class SimHost:
    """One simulated GPU server as the harness knows it."""

    name: str
    address: str
    pid: int = 0

    @property
    def netns(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def cgroup(self) -> str:
        return f"{PREFIX}-{self.name}"

    @property
    def veth(self) -> str:
        return f"{VETH_PREFIX}{self.name}"


@dataclass
class SimState:
    """What sim.up started, saved so sim.down (or a later run) can stop exactly that."""

    hosts: list[SimHost] = field(default_factory=list)
    index_pid: int = 0
    git_pid: int = 0
    github_pid: int = 0
    inventory: str = ""

    @classmethod
    def load(cls, path: Path) -> "SimState":
        if not path.exists():
            return cls()
        data = json.loads(path.read_text())
        return cls(hosts=[SimHost(**h) for h in data.get("hosts", [])], index_pid=data.get("index_pid", 0),
                   git_pid=data.get("git_pid", 0), github_pid=data.get("github_pid", 0),
                   inventory=data.get("inventory", ""))

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2))


class SimFleet:
    """The simulated fleet on this machine: artifacts in home_dir, mounts and live state in run_dir."""

    def __init__(self, run_dir: Path = RUN_DIR, home_dir: Path = HOME_DIR):
        self.run_dir, self.home_dir = Path(run_dir), Path(home_dir)
        self.state_path = self.run_dir / "state.json"
        self.known_hosts = self.run_dir / "known_hosts"
        self.client_key = self.home_dir / "id_ed25519"
        self.sudo_password_file = self.home_dir / "sudo-password"  # opspw's sudo password (layout.SUDO_PASSWORD)
        self.logs = self.run_dir / "logs"

    # ---- paths and addresses -------------------------------------------------------------------------------------
    @property
    def index_url(self) -> str:
        return f"http://{CONTROL_ADDR}:{INDEX_PORT}/simple"

    @property
    def upstream_url(self) -> str:
        return f"git://{CONTROL_ADDR}:{GIT_PORT}/sglang.git"

    @property
    def upstream_bare(self) -> Path:
        return self.run_dir / "git" / "sglang.git"

    @property
    def wheels_dir(self) -> Path:
        return self.home_dir / "wheels"

    @property
    def index_root(self) -> Path:
        return self.run_dir / "index"

    def host_dir(self, name: str) -> Path:
        return self.run_dir / "hosts" / name

    def host_root(self, name: str) -> Path:
        """The host's root filesystem as seen from the control node (writes show inside the container)."""
        return self.host_dir(name) / "root"

    @staticmethod
    def address(i: int) -> str:
        return f"{SUBNET}.{10 + i}"

    def state(self) -> SimState:
        return SimState.load(self.state_path)

    # ---- lifecycle -------------------------------------------------------------------------------------------------
    def up(self, count: int = 3, inventory: Path | None = None, on_progress=print) -> SimState:
        """Clear leftovers, build artifacts, start the index and git daemon, boot count hosts, write the inventory."""
        if count < 1 or count > 40:
            raise SimError(f"--count must be between 1 and 40 (got {count})")
        self.require_tools()
        holder.hold(PREFIX, SUBNET)  # before clearing: leftovers are a killed run's, never a live one's fleet
        self.clear_leftovers()
        _enough_inotify_instances(count)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        state = SimState()
        on_progress("building stand-in wheels, package index and upstream sglang repo")
        self._build_artifacts()
        self._bridge_up()
        self._start_servers(state)
        if SimRouter(self.run_dir).start():  # the real sglang-router, when scripts/bootstrap installed it
            on_progress(f"router (sglang-router {ROUTER_VERSION}) at {SimRouter(self.run_dir).url}")
        on_progress("building the host template (venv with the old stack, sglang checkout)")
        self._build_template()
        for i in range(1, count + 1):
            host = SimHost(f"gpu{i}", self.address(i))
            on_progress(f"booting {host.name} at {host.address}")
            self._boot(host)
            state.hosts.append(host)
            state.save(self.state_path)
        self._wait_ssh(state.hosts)
        self._write_known_hosts(state.hosts)
        if inventory is not None:
            self.write_inventory(Path(inventory), state.hosts)
            state.inventory = str(Path(inventory).resolve())
        state.save(self.state_path)
        return state

    def down(self) -> None:
        """Stop every host and server sim.up started and remove every mount, link, namespace and cgroup."""
        holder.hold(PREFIX, SUBNET)
        try:
            self.clear_leftovers()
            inventory = self.state().inventory
            if inventory and Path(inventory).exists():
                Path(inventory).unlink()
            shutil.rmtree(self.run_dir, ignore_errors=True)
        finally:
            holder.release(PREFIX, SUBNET)

    def clear_leftovers(self) -> None:
        """Remove what a killed or earlier run left behind; safe to call when nothing is there."""
        SimRouter(self.run_dir).stop()
        state = self.state()
        for host in state.hosts:
            system.stop_pid(host.pid, NSPAWN_MARKER)
        for pid, marker in ((state.index_pid, "http.server"), (state.git_pid, "git-daemon"),
                            (state.github_pid, "git-daemon")):
            if pid:
                system.stop_pid(pid, marker, timeout=5)
        for hierarchy in system.CGROUP_HIERARCHIES:
            if hierarchy.is_dir():
                for d in hierarchy.glob(f"{PREFIX}-*"):
                    system.remove_cgroup(d.name)
        system.unmount_all(self.run_dir)
        for ns in system.netns_list(f"{PREFIX}-"):
            sh("ip", "netns", "del", ns, check=False)
        for link in system.links(VETH_PREFIX) + system.links(BRIDGE):
            sh("ip", "link", "del", link, check=False)
        if self.run_dir.exists():
            for child in self.run_dir.iterdir():
                if child.name != "state.json":
                    shutil.rmtree(child, ignore_errors=True) if child.is_dir() else child.unlink()
            self.state_path.unlink(missing_ok=True)

    def status(self) -> list[dict]:
        """One dict per host: name, address, whether its container runs and its sshd answers."""
        rows = []
        for host in self.state().hosts:
            running = system.pid_alive(host.pid, NSPAWN_MARKER)
            rows.append({"name": host.name, "address": host.address, "container": running,
                         "ssh": running and _port_open(host.address, 22, 1.0)})
        return rows

    # ---- per-host controls used by tests and fault injection -------------------------------------------------------
    def host(self, name: str) -> SimHost:
        for h in self.state().hosts:
            if h.name == name:
                return h
        raise SimError(f"no simulated host named {name!r}")

    def set_link(self, name: str, up: bool) -> None:
        """Cut or restore the host's network link (its side of the veth pair)."""
        sh("ip", "-n", self.host(name).netns, "link", "set", "eth0", "up" if up else "down")

    def set_gpus(self, name: str, **overrides) -> None:
        """Change what the host's nvidia-smi reports (count, compute_cap, fail, ...), and its driver's version file."""
        root = self.host_root(name)
        _write_gpus(root, {**json.loads((root / "etc/gpufleet-sim/gpus.json").read_text()), **overrides})

    def set_build_seconds(self, name: str, seconds: int | None) -> None:
        """Make the host's sgl-kernel builds last `seconds` more (the stand-in CMake sleeps while configuring: see the
        payload's cmake/utils.cmake), so a benchmark's build has a known length; None removes it. Read at each build."""
        path = self.host_root(name) / "etc/gpufleet-sim/build-seconds"
        if seconds is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(f"{int(seconds)}\n")

    def set_backends(self, name: str, behaviour: dict | None) -> None:
        """Tell the host's stand-in server what each backend set does (launch_server.Behaviour: wrong answers, fails
        to start, tokens per second, load time); None removes the file (every set works). Read at each launch."""
        path = self.host_root(name) / "etc/gpufleet-sim/backends.json"
        if behaviour is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(json.dumps(behaviour, indent=2))

    def ssh_argv(self, name: str) -> list[str]:
        """An OpenSSH command line to the host with the fleet's key and known_hosts (for tests and debugging)."""
        return ["ssh", "-i", str(self.client_key), "-o", f"UserKnownHostsFile={self.known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                f"root@{self.host(name).address}"]

    def run_on(self, name: str, command: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run a shell command on a simulated host over plain OpenSSH (test helper, not the tool's engine)."""
        proc = subprocess.run(self.ssh_argv(name) + [command], capture_output=True, text=True, timeout=300)
        if check and proc.returncode != 0:
            raise SimError(f"{name}: `{command}` exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")
        return proc

    def publish(self, wheel: Path) -> None:
        """Put a new wheel on the package index (as a nightly index moves while a roll goes on)."""
        from gpufleet.sim import index

        index.build_index([wheel], self.index_root)

    def unpublish(self, filename: str) -> None:
        """Take a wheel off the package index again."""
        from gpufleet.sim import index

        for path in (self.index_root / "files" / filename, self.index_root / "files" / f"{filename}.metadata"):
            path.unlink(missing_ok=True)
        index.build_index([], self.index_root)

    def reset_host(self, name: str) -> None:
        """Put a host back to its freshly booted state (a new, empty upper layer)."""
        state = self.state()
        host = next(h for h in state.hosts if h.name == name)
        self._shutdown(host)
        self._boot(host)
        state.save(self.state_path)
        self._wait_ssh([host])
        self._write_known_hosts(state.hosts)

    def reboot(self, name: str, wait: bool = True) -> None:
        """Restart the host's container on the same disk, as a reboot does: its systemd shuts down (every process
        on it ends, every SSH connection drops), then boots again with its upper layer kept (what gpufleet wrote
        stays, unlike reset_host) and a new boot id. With wait, returns once its sshd answers again."""
        state = self.state()
        host = next(h for h in state.hosts if h.name == name)
        system.stop_pid(host.pid, NSPAWN_MARKER)  # SIGTERM: nspawn has the container's systemd power off
        system.remove_cgroup(host.cgroup)
        system.unmount_all(self.host_dir(host.name) / "root")  # the overlay only: its tmpfs (upper layer) stays
        self._mount_root(host)
        self._spawn(host)
        state.save(self.state_path)
        if wait:
            self._wait_ssh([host])

    # ---- building --------------------------------------------------------------------------------------------------
    @staticmethod
    def require_tools() -> None:
        if not re.fullmatch(r"[a-z][a-z0-9]{0,7}", PREFIX):
            raise SimError(f"GPUFLEET_SIM_PREFIX must be 1-8 lower-case letters and digits, starting with a letter "
                           f"(got {PREFIX!r}): it names links of at most 15 characters")
        if os.geteuid() != 0:
            raise SimError("the simulated fleet needs root (network namespaces, mounts, containers)")
        missing = [t for t in ("systemd-nspawn", "ip", "sshd", "ssh-keygen", "git") if not _which(t)]
        if missing:
            raise SimError("missing tools: " + ", ".join(missing)
                           + " (apt-get install openssh-server systemd-container iproute2 git)")

    def _build_artifacts(self) -> None:
        from gpufleet.sim import index, upstream, wheels

        self.home_dir.mkdir(parents=True, exist_ok=True)
        self.sudo_password_file.write_text(SUDO_PASSWORD + "\n")
        self.sudo_password_file.chmod(0o600)
        if not self.client_key.exists():
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "gpufleet-sim", "-f", str(self.client_key))
        stamp = self.wheels_dir / ".source-hash"
        digest = _source_hash()
        if not stamp.exists() or stamp.read_text() != digest:
            shutil.rmtree(self.wheels_dir, ignore_errors=True)
            self.wheels_dir.mkdir(parents=True)
            wheels.build_stack_wheels(self.wheels_dir)
            _fetch_build_tools(self.wheels_dir)
            stamp.write_text(digest)
        index.build_index(sorted(self.wheels_dir.glob("*.whl")), self.index_root)
        self.upstream_bare.parent.mkdir(parents=True, exist_ok=True)
        upstream.build_upstream(self.upstream_bare)

    def _bridge_up(self) -> None:
        sh("ip", "link", "add", BRIDGE, "type", "bridge")
        sh("ip", "addr", "add", f"{CONTROL_ADDR}/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")

    def _start_servers(self, state: SimState) -> None:
        """The package index, the upstream git daemon and the stand-in GitHub; each pid is saved as soon as it runs,
        so a start that fails halfway leaves nothing clear_leftovers cannot find."""
        from gpufleet.sim import index, upstream

        index_pid = state.index_pid = system.spawn_detached(
            index.serve_index_command(self.index_root, CONTROL_ADDR, INDEX_PORT), self.logs / "index.log")
        state.save(self.state_path)
        # git-daemon itself, not the `git daemon` wrapper, so the recorded pid is the server's.
        daemon = str(Path(sh("git", "--exec-path").stdout.strip()) / "git-daemon")
        git_pid = system.spawn_detached(
            [daemon, "--reuseaddr", "--export-all", f"--base-path={self.upstream_bare.parent}",
             f"--listen={CONTROL_ADDR}", f"--port={GIT_PORT}", str(self.upstream_bare.parent)],
            self.logs / "git-daemon.log")
        state.git_pid = git_pid
        state.save(self.state_path)
        # The stand-in GitHub: git://127.0.0.1:<GITHUB_PORT>/NVIDIA/cutlass stands for https://github.com/NVIDIA/cutlass.
        github_root = self.run_dir / "github"
        upstream.build_github(github_root)
        github_pid = system.spawn_detached(
            [daemon, "--reuseaddr", "--export-all", f"--base-path={github_root}",
             f"--listen={GITHUB_ADDR}", f"--port={GITHUB_PORT}", str(github_root)],
            self.logs / "github-daemon.log")
        state.github_pid = github_pid
        state.save(self.state_path)
        for addr, port, pid, marker, log in (
                (CONTROL_ADDR, INDEX_PORT, index_pid, "http.server", "index.log"),
                (CONTROL_ADDR, GIT_PORT, git_pid, "git-daemon", "git-daemon.log"),
                (GITHUB_ADDR, GITHUB_PORT, github_pid, "git-daemon", "github-daemon.log")):
            _wait_port(addr, port, 15, f"control-node server on port {port}")
            if not system.pid_alive(pid, marker):
                raise SimError(f"{marker} exited (is port {port} on {addr} taken?):\n"
                               + (self.logs / log).read_text(errors="replace")[-1500:])

    def _build_template(self) -> None:
        """A shared lower layer: what every simulated host has before gpufleet touches it."""
        from gpufleet.sim import upstream

        tdir = self.run_dir / "template"
        tdir.mkdir(parents=True)
        # A tmpfs of its own: overlayfs refuses a lower layer nested inside another lower layer (here "/").
        sh("mount", "-t", "tmpfs", "-o", "mode=755", f"{PREFIX}-template", str(tdir))
        for sub in ("upper", "work", "root"):
            (tdir / sub).mkdir()
        root = tdir / "root"
        sh("mount", "-t", "overlay", "overlay", "-o",
           f"lowerdir=/,upperdir={tdir / 'upper'},workdir={tdir / 'work'}", str(root))
        try:
            self._populate_template(root)
            self._add_model_dir(root)
            upstream.clone_with_local_edits(self.upstream_bare, root / CHECKOUT.lstrip("/"))
            sh("git", "-C", str(root / CHECKOUT.lstrip("/")), "remote", "set-url", "origin", self.upstream_url)
            self._chroot(root, _TEMPLATE_SCRIPT.format(venv=VENV, wheels=self.wheels_dir, checkout=CHECKOUT)
                         + _USERS_SCRIPT.format(users=" ".join(SIM_USERS), password=SUDO_PASSWORD))
        finally:
            system.unmount_all(root)
        shutil.rmtree(tdir / "work", ignore_errors=True)

    def _populate_template(self, root: Path) -> None:
        systemd_dir = root / "etc/systemd/system"
        for unit in MASKED_UNITS:
            link = systemd_dir / unit
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to("/dev/null")
        # The inherited root's .bashrc runs pyenv init on every remote command; a GPU box has a plain one.
        (root / "root/.bashrc").write_text("# ~/.bashrc of a simulated GPU server\n")
        (root / "root/.profile").write_text('[ -f ~/.bashrc ] && . ~/.bashrc\n')
        # The control node's pip configuration names indexes a GPU box would not have; give hosts plain pip.
        for conf in (root / "etc/pip.conf", root / "etc/xdg/pip", root / "root/.config/pip", root / "root/.pip"):
            if conf.is_dir():
                shutil.rmtree(conf)
            elif conf.exists():
                conf.unlink()
        for key in (root / "etc/ssh").glob("ssh_host_*"):
            key.unlink()
        # sudo for the non-root logins (SIM_USERS); the users themselves are added in the chroot (_USERS_SCRIPT)
        sudoers = root / "etc/sudoers.d/gpufleet-sim"
        sudoers.parent.mkdir(parents=True, exist_ok=True)
        sudoers.write_text(SUDOERS)
        sudoers.chmod(0o440)
        smi = root / "usr/bin/nvidia-smi"
        shutil.copy(nvidia_smi.__file__, smi)
        smi.chmod(0o755)
        _write_gpus(root, BLACKWELL)
        # the stand-in driver's /proc/driver: a directory of the root bound there at boot, before sshd starts
        (root / f"etc/systemd/system/{DRIVER_UNIT}").write_text(DRIVER_UNIT_TEXT)
        wants = root / "etc/systemd/system/sysinit.target.wants"
        wants.mkdir(parents=True, exist_ok=True)
        (wants / DRIVER_UNIT).symlink_to(f"/etc/systemd/system/{DRIVER_UNIT}")

    @staticmethod
    def _add_model_dir(root: Path) -> None:
        """A tiny model at the inventory's model_path: config.json, an index naming 3 safetensors shards, the shards."""
        import struct

        model = root / MODEL_PATH.lstrip("/")
        model.mkdir(parents=True, exist_ok=True)
        (model / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForCausalLM"],
                                                       "model_type": "qwen3_5_moe", "num_experts": 512}))
        weight_map = {}
        for i in range(1, 4):
            shard = f"model-{i:05d}-of-00003.safetensors"
            header = json.dumps({f"layers.{i}.weight": {"dtype": "F32", "shape": [512], "data_offsets": [0, 2048]}})
            (model / shard).write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(2048))
            weight_map[f"layers.{i}.weight"] = shard
        (model / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": 3 * 2048}, "weight_map": weight_map}))

    @staticmethod
    def _chroot(root: Path, script: str) -> None:
        for sub in ("proc", "dev", "sys"):
            sh("mount", "--rbind" if sub != "proc" else "--bind", f"/{sub}", str(root / sub))
            if sub != "proc":
                sh("mount", "--make-rslave", str(root / sub))
        try:
            proc = subprocess.run(["chroot", str(root), "/bin/bash", "-euc", script], capture_output=True, text=True,
                                  env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                       "HOME": "/root", "LANG": "C.UTF-8"})
            if proc.returncode != 0:
                raise SimError(f"building the host template failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        finally:
            for sub in ("sys", "dev", "proc"):
                system.unmount_all(root / sub)

    def _boot(self, host: SimHost) -> None:
        hdir = self.host_dir(host.name)
        hdir.mkdir(parents=True, exist_ok=True)
        system.unmount_all(hdir)
        sh("mount", "-t", "tmpfs", "-o", "mode=755", f"{PREFIX}-{host.name}", str(hdir))
        for sub in ("upper", "work", "root"):
            (hdir / sub).mkdir()
        root = self._mount_root(host)
        self._personalise(host, root)
        if host.netns not in system.netns_list(host.netns):
            sh("ip", "netns", "add", host.netns)
            sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", "eth0", "netns", host.netns)
            sh("ip", "link", "set", host.veth, "master", BRIDGE, "up")
            sh("ip", "-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            sh("ip", "-n", host.netns, "link", "set", "eth0", "up")
            sh("ip", "-n", host.netns, "link", "set", "lo", "up")
            # No default route: a simulated host reaches its own subnet (control node, other hosts) and nothing else.
        self._spawn(host)

    def _mount_root(self, host: SimHost) -> Path:
        """The host's root: an overlay of its upper layer (on its tmpfs) over the template and /."""
        hdir = self.host_dir(host.name)
        root = hdir / "root"
        sh("mount", "-t", "overlay", "overlay", "-o",
           # redirect_dir: a directory of the lower layers can be renamed, as on a real server's ext4 or xfs (the
           # staged venv is swapped in by rename; without it overlayfs answers EXDEV and gpufleet changes in place)
           f"lowerdir={self.run_dir / 'template/upper'}:/,upperdir={hdir / 'upper'},workdir={hdir / 'work'},"
           "redirect_dir=on", str(root))
        return root

    def _spawn(self, host: SimHost) -> None:
        """Boot the container on its mounted root, in its network namespace and a cgroup of our own."""
        host.pid = system.spawn_detached(
            ["systemd-nspawn", "-q", "-D", str(self.host_dir(host.name) / "root"), "-b", "--register=no",
             "--keep-unit", f"--hostname={host.name}", f"--network-namespace-path=/run/netns/{host.netns}"],
            self.logs / f"{host.name}.console.log", cgroup=host.cgroup)

    def _personalise(self, host: SimHost, root: Path) -> None:
        (root / "etc/hostname").write_text(host.name + "\n")
        key = root / "etc/ssh/ssh_host_ed25519_key"
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"root@{host.name}", "-f", str(key))
        ssh_dir = root / "root/.ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        auth = ssh_dir / "authorized_keys"
        auth.write_text(Path(str(self.client_key) + ".pub").read_text())
        auth.chmod(0o600)
        for user in SIM_USERS:  # the same client key logs in as each non-root user
            home = root / "home" / user
            pw = {line.split(":")[0]: line.split(":") for line in (root / "etc/passwd").read_text().splitlines()}
            uid, gid = int(pw[user][2]), int(pw[user][3])
            (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
            (home / ".ssh/authorized_keys").write_text(auth.read_text())
            for path in (home / ".ssh", home / ".ssh/authorized_keys"):
                os.chown(path, uid, gid)
            (home / ".ssh/authorized_keys").chmod(0o600)
        # sudo warns on every call when the host cannot resolve its own name
        hosts = root / "etc/hosts"
        hosts.write_text(hosts.read_text() + f"127.0.1.1 {host.name}\n")
        _write_gpus(root, dict(BLACKWELL, uuid_seed=host.name))

    def _shutdown(self, host: SimHost) -> None:
        system.stop_pid(host.pid, NSPAWN_MARKER)
        system.remove_cgroup(host.cgroup)
        system.unmount_all(self.host_dir(host.name))

    def _wait_ssh(self, hosts: list[SimHost], timeout: float = 90.0) -> None:
        for host in hosts:
            try:
                _wait_port(host.address, 22, timeout, f"sshd on {host.name}")
            except SimError as exc:
                log = self.logs / f"{host.name}.console.log"
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise SimError(f"{exc}\n--- console of {host.name} ---\n{tail}") from None

    def _write_known_hosts(self, hosts: list[SimHost]) -> None:
        lines = []
        for host in hosts:
            pub = (self.host_root(host.name) / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{host.address} {pub[0]} {pub[1]}")
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def write_inventory(self, path: Path, hosts: list[SimHost]) -> None:
        """The inventory of the simulated fleet: real SSH settings, package sources on the control node."""
        from gpufleet.sim.inventory_file import render_inventory

        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_inventory(self, hosts))


_TEMPLATE_SCRIPT = """
/usr/bin/python3 -m venv {venv}
{venv}/bin/pip install -q --no-index --find-links {wheels} --disable-pip-version-check \
    'torch==2.9.1+cu130' 'flashinfer-python==0.6.4' 'flashinfer-cubin==0.6.4' \
    'flashinfer-jit-cache==0.6.4+cu130' 'sgl-kernel==0.3.16' wheel
{venv}/bin/pip install -q --no-index --find-links {wheels} --disable-pip-version-check \
    --no-build-isolation --no-deps -e {checkout}/python
"""

DRIVER_UNIT = "gpufleet-sim-driver.service"
# /proc/driver/nvidia/version exists while a real driver is loaded (the facts script keys the driver's CUDA version
# on it); this kernel has none, so each host binds a directory of its own root over /proc/driver
DRIVER_UNIT_TEXT = """[Unit]
Description=The simulated NVIDIA driver's /proc/driver (gpufleet sim)
DefaultDependencies=no
Before=sysinit.target ssh.service

[Service]
Type=oneshot
RemainAfterExit=yes
ExecStart=/bin/mount --bind /etc/gpufleet-sim/driver /proc/driver
"""


def _write_gpus(root: Path, gpus: dict) -> None:
    """The stand-in nvidia-smi's config in a host's root, and the driver version file that goes with it."""
    conf = root / "etc/gpufleet-sim"
    (conf / "driver/nvidia").mkdir(parents=True, exist_ok=True)
    (conf / "gpus.json").write_text(json.dumps(gpus))
    text = nvidia_smi.module_text({**nvidia_smi.DEFAULTS, **gpus})
    version = conf / "driver/nvidia/version"
    if text is None:
        version.unlink(missing_ok=True)
    else:
        version.write_text(text)


_USERS_SCRIPT = """
for u in {users}; do
    id -u "$u" >/dev/null 2>&1 || useradd -m -s /bin/bash "$u"
    echo "$u:{password}" | chpasswd
    printf '# ~/.bashrc of a simulated GPU server\n' > "/home/$u/.bashrc"
done
"""


INOTIFY_INSTANCES = Path("/proc/sys/fs/inotify/max_user_instances")


def _enough_inotify_instances(count: int) -> None:
    """Each systemd container holds about ten inotify instances of root's (the kernel's default 128 stops the
    eleventh host, or a second fleet on the same machine): raise the limit, never lower it."""
    want = max(1024, 16 * count)
    try:
        if int(INOTIFY_INSTANCES.read_text()) < want:
            INOTIFY_INSTANCES.write_text(f"{want}\n")
    except (OSError, ValueError) as exc:
        raise SimError(f"cannot raise {INOTIFY_INSTANCES} to {want} (systemd containers need it): {exc}") from None


def _which(tool: str) -> bool:
    return shutil.which(tool) is not None or Path("/usr/sbin", tool).exists()


def _port_open(addr: str, port: int, timeout: float) -> bool:
    try:
        with socket.create_connection((addr, port), timeout=timeout) as s:
            s.settimeout(timeout)
            return port != 22 or s.recv(4).startswith(b"SSH")
    except OSError:
        return False


def _wait_port(addr: str, port: int, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _port_open(addr, port, 1.0):
            return
        time.sleep(0.3)
    raise SimError(f"{what} did not answer on {addr}:{port} within {timeout:.0f}s")


def _source_hash() -> str:
    """A hash of the harness sources that decide the wheels' content (rebuild them when it changes)."""
    import hashlib

    h = hashlib.sha256()
    here = Path(__file__).parent
    for p in sorted(here.rglob("*")):
        # every payload file (kernel sources, CMake modules) decides what the sim builds, not only Python
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            h.update(p.relative_to(here).as_posix().encode())
            h.update(p.read_bytes())
    return h.hexdigest()


def _fetch_build_tools(dest: Path) -> None:
    """Real wheels of the build tools a host needs offline (editable installs, the sgl-kernel build), and the pip
    gpufleet fetches from the stack's index to resolve and install on hosts."""
    from gpufleet.fleet.executor import RESOLVER_PIP

    cmd = [os.sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--dest", str(dest),
           "wheel", "setuptools", "scikit-build-core", "packaging", "pathspec", f"pip=={RESOLVER_PIP}",
           # upstream's CMakeLists sets CMP0177, which CMake knows from 3.31 (manylinux wheels of it on PyPI)
           "cmake>=3.31"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SimError(f"could not fetch build-tool wheels for the simulated index: {proc.stderr.strip()[-800:]}")
