"""End to end, network faults injected for real (issue 15: faults 1, 3, 8, 9): the link cut for 10 s while pip
installs torch, sshd restarted mid-run, changed host keys of a target and of a jump host in a roll, and a slow, lossy
link (200 ms round trip, 1 % loss) through the sim's user-space relay."""

from __future__ import annotations

import json
import math
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpufleet.sim import wheels
from gpufleet.sim.relay import Relay
from tests.sim.helpers import REPO, inv_json, write_inventory

pytestmark = pytest.mark.sim

TARGET = {name: wheels.TARGET[name] for name in ("torch", "flashinfer-python", "flashinfer-cubin",
                                                 "flashinfer-jit-cache")}
# A hook in the host's venv (a .pth runs it at each interpreter start) holds the pip process that installs torch at
# its start while HOLD exists, says so in STARTED, and writes DONE when that pip exits normally: the test cuts the
# link, restarts sshd, ... while that real pip runs, then lets it go. Bounded: 5 minutes.
HOLD, STARTED, DONE = "root/gpufleet-test-hold-pip", "root/gpufleet-test-pip-started", "root/gpufleet-test-pip-done"
HOOK = f'''"""gpufleet sim test hook: hold `pip install --no-index ... torch==...` at its start while /{HOLD} exists."""
import atexit, os, time
try:
    _argv = open("/proc/self/cmdline", "rb").read().split(b"\\0")
except OSError:
    _argv = []
if (b"install" in _argv and b"--no-index" in _argv and b"--dry-run" not in _argv
        and any(a.startswith(b"torch==") for a in _argv) and os.path.exists("/{HOLD}")):
    open("/{STARTED}", "w").write(str(os.getpid()))
    for _ in range(1200):
        if not os.path.exists("/{HOLD}"):
            break
        time.sleep(0.25)
    atexit.register(lambda: open("/{DONE}", "w").write("done"))
'''


def on(fleet, host: str, command: str, check: bool = True) -> str:
    return fleet.run_on(host, command, check=check).stdout


def versions(fleet, host: str) -> dict[str, str]:
    lines = on(fleet, host, "cd / && /root/venv/bin/python -m pip list --format=freeze").splitlines()
    return dict(line.split("==", 1) for line in lines if "==" in line)


def on_target(fleet, host: str) -> bool:
    have = versions(fleet, host)
    return all(have.get(name) == version for name, version in TARGET.items())


def last_audit(fleet, host: str) -> dict:
    return json.loads(on(fleet, host, "tail -n 1 /var/lib/gpufleet/audit.log"))


def lock_held(fleet, host: str) -> bool:
    return fleet.run_on(host, "test -e /var/lib/gpufleet/lock", check=False).returncode == 0


def wait_for(what: str, check, timeout: float, proc: subprocess.Popen | None = None, output: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"inv exited {proc.returncode} before {what}:\n{output.read_text()[-5000:]}")
        time.sleep(0.2)
    raise AssertionError(f"no {what} within {timeout:.0f}s" + (f":\n{output.read_text()[-5000:]}" if output else ""))


@pytest.fixture(scope="module")
def cache(sim_fleet, tmp_path_factory):
    """One control-node cache for the module: the first upgrade builds sgl-kernel, the later ones install that."""
    path = tmp_path_factory.mktemp("faults-net-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GPUFLEET_CACHE_DIR", str(path))
        yield path


class HeldPip:
    """The pip hook on one host, and an `inv upgrade` of it running in the background."""

    def __init__(self, fleet, host: str, inventory: Path, tmp_path: Path):
        self.fleet, self.host, self.root = fleet, host, fleet.host_root(host)
        [site] = self.root.glob("root/venv/lib/python3*/site-packages")
        (site / "gpufleet_test_hold.py").write_text(HOOK)
        (site / "gpufleet_test_hold.pth").write_text("import gpufleet_test_hold\n")
        (self.root / HOLD).touch()
        self.output, self.report = tmp_path / "upgrade.out", tmp_path / "upgrade.json"
        command = [sys.executable, "-m", "invoke", "upgrade", "--inventory", str(inventory), "--host", host, "--json"]
        with open(self.output, "w") as err, open(self.report, "w") as out:
            self.proc = subprocess.Popen(command, cwd=REPO, stdout=out, stderr=err, text=True)

    def wait_started(self) -> None:
        wait_for("pip held at its start", (self.root / STARTED).exists, 300, self.proc, self.output)

    def release(self) -> None:
        (self.root / HOLD).unlink(missing_ok=True)

    def wait_done(self) -> None:
        """pip ran its install to the end (seen on the host's disk, whatever the link does)."""
        wait_for("pip exit", (self.root / DONE).exists, 120, None, self.output)

    def finish(self, timeout: float = 300) -> tuple[int, dict]:
        rc = self.proc.wait(timeout=timeout)
        [report] = json.loads(self.report.read_text())
        return rc, report

    def close(self) -> None:
        self.release()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def gpu1(sim_fleet, cache):
    """gpu1 on the old stack; fresh again afterwards (link up), for the later tests and modules."""
    sim_fleet.reset_host("gpu1")
    try:
        yield sim_fleet
    finally:
        sim_fleet.set_link("gpu1", True)
        sim_fleet.reset_host("gpu1")


def rerun_changes_nothing(inventory: Path, host: str) -> None:
    proc, [again] = inv_json("upgrade", "--inventory", str(inventory), "--host", host)
    assert proc.returncode == 0 and again["outcome"] == "ok", (again, proc.stderr[-3000:])
    assert {e["status"] for e in again["entries"]} == {"unchanged"}, again["entries"]


# ---- 1. the link cut for 10 s during the torch install ------------------------------------------------------------

@pytest.mark.parametrize("keepalive", [15, 1], ids=["link-survives", "declared-lost"])
def test_link_cut_for_ten_seconds_while_pip_installs_torch(gpu1, tmp_path, keepalive):
    """pip runs (and ends) on the host while its link is down for 10 s. With the default keepalive the connection
    outlives the cut; with keepalive 1 (dead after 3 s unanswered) it is declared lost, and the run reconnects and
    follows the same detached install to its end: the upgrade completes either way, and a re-run changes nothing."""
    fleet = gpu1
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu1"],
                                extra=f"[settings]\nkeepalive = {keepalive}\n")
    held = HeldPip(fleet, "gpu1", inventory, tmp_path)
    try:
        held.wait_started()
        cut = time.monotonic()
        fleet.set_link("gpu1", False)
        try:
            held.release()
            held.wait_done()  # the whole install ran while the link was down
            time.sleep(max(0.0, cut + 10 - time.monotonic()))
        finally:
            fleet.set_link("gpu1", True)
        rc, report = held.finish()
    finally:
        held.close()
    text = held.output.read_text()
    assert rc == 0 and report["outcome"] == "ok", (report, text[-3000:])
    assert [(e["role"], e["status"]) for e in report["entries"]][:2] == [("torch", "changed"),
                                                                         ("flashinfer", "changed")]
    assert not lock_held(fleet, "gpu1") and last_audit(fleet, "gpu1")["outcome"] == "ok"
    assert "Traceback" not in text, text[-3000:]
    if keepalive == 1:
        assert "connection lost during 'install torch" in text and "reattaching" in text, text[-3000:]
    # A re-run (the lock of a run that lost its host is taken over when its holder is gone) converges.
    proc, [again] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu1")
    assert proc.returncode == 0 and again["outcome"] == "ok", (again, proc.stderr[-3000:])
    assert on_target(fleet, "gpu1"), versions(fleet, "gpu1")
    assert on(fleet, "gpu1", "cd / && /root/venv/bin/python -m pip check", check=False).startswith("No broken")
    assert not lock_held(fleet, "gpu1")
    rerun_changes_nothing(inventory, "gpu1")


# ---- 3. sshd restarted on the host mid-run ---------------------------------------------------------------------

def test_sshd_restarted_while_pip_installs(gpu1, tmp_path):
    """`systemctl restart ssh` on the host while the upgrade's pip runs: the run completes (sshd's restart leaves
    open sessions alone), the host is on the new stack, and a re-run changes nothing."""
    fleet = gpu1
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", ["gpu1"])
    pid_before = on(fleet, "gpu1", "systemctl show -p MainPID --value ssh").strip()
    held = HeldPip(fleet, "gpu1", inventory, tmp_path)
    try:
        held.wait_started()
        on(fleet, "gpu1", "systemctl restart ssh")
        pid_after = on(fleet, "gpu1", "systemctl show -p MainPID --value ssh").strip()
        held.release()
        rc, report = held.finish()
    finally:
        held.close()
    assert pid_after not in ("0", pid_before), (pid_before, pid_after)  # sshd really restarted
    assert rc == 0 and report["outcome"] == "ok", (report, held.output.read_text()[-3000:])
    assert on_target(fleet, "gpu1") and not lock_held(fleet, "gpu1")
    assert last_audit(fleet, "gpu1")["outcome"] == "ok"
    rerun_changes_nothing(inventory, "gpu1")


# ---- 8. changed host keys mid-fleet: a target's and a jump host's ------------------------------------------------

def _fingerprint(pub: Path) -> str:
    """The key as `ssh-keygen -l` shows it: type and SHA256 fingerprint."""
    bits, digest, *_, kind = subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True,
                                            check=True).stdout.split()
    return f"ssh-{kind.strip('()').lower()} {digest}"


def _new_host_key(fleet, host: str, tmp_path: Path) -> tuple[str, str]:
    """Give the host a new ed25519 host key (as a reinstall would) and restart its sshd: (old, new) fingerprints."""
    key = fleet.host_root(host) / "etc/ssh/ssh_host_ed25519_key"
    old = _fingerprint(Path(f"{key}.pub"))
    fresh = tmp_path / f"{host}_new_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(fresh)], check=True)
    shutil.copyfile(fresh, key)
    shutil.copyfile(f"{fresh}.pub", f"{key}.pub")
    # OpenSSH takes an option's first value: these come before the harness's strict ones
    subprocess.run(["ssh", "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
                    *fleet.ssh_argv(host)[1:], "systemctl restart ssh"], check=True, capture_output=True, timeout=60)
    new = _fingerprint(Path(f"{key}.pub"))
    assert old != new
    fleet._write_known_hosts(fleet.state().hosts)  # the harness's own ssh (fleet.run_on) knows the new key
    return old, new


@pytest.fixture
def three_hosts(sim_fleet, cache):
    for name in ("gpu1", "gpu2", "gpu3"):
        sim_fleet.reset_host(name)
    try:
        yield sim_fleet
    finally:
        for name in ("gpu1", "gpu2", "gpu3"):
            sim_fleet.reset_host(name)


def test_changed_host_keys_of_a_target_and_of_a_jump_host_in_a_roll(three_hosts, tmp_path):
    """gpu2 got a new host key; gpu3 is reached through gpu2. The roll names gpu2's key as gpu2's and, for gpu3, as
    its jump host's (gpu3's own key is fine), showing both keys as OpenSSH does; --max-fail 1 lets the roll go on to
    gpu3 after gpu2 and stops it after gpu3. Nothing on gpu2 or gpu3 changed."""
    fleet = three_hosts
    known = tmp_path / "known_hosts"
    shutil.copyfile(fleet.known_hosts, known)  # what the operator knew before gpu2 was reinstalled
    known_before = known.read_text()
    fast = ('[defaults.stack.server]\nhealth_timeout = 15\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'
            '[hosts.gpu3]\njump = "gpu2"\n')
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", known_hosts=str(known), extra=fast)
    old, new = _new_host_key(fleet, "gpu2", tmp_path)
    before = {h: versions(fleet, h) for h in ("gpu2", "gpu3")}

    proc, summary = inv_json("upgrade", "--hosts", "all", "--max-fail", "1", "--inventory", str(inventory))
    assert proc.returncode == 1, (summary, proc.stderr[-3000:])
    results = {r["host"]: r for r in summary["results"]}
    assert summary["status"] == "stopped" and results["gpu1"]["outcome"] == "ok", summary
    address = fleet.host("gpu2").address
    both_keys = f"CHANGED from {old} (known for {address} in {known}:2) to {new}"
    target, jumped = results["gpu2"], results["gpu3"]
    assert target["outcome"] == "hostkey" and target["error"].startswith("host gpu2: its host key " + both_keys), target
    assert jumped["outcome"] == "hostkey", jumped
    assert jumped["error"].startswith("host gpu3's jump host gpu2: its host key " + both_keys), jumped
    assert f"ssh-keygen -f {known} -R {address}" in jumped["error"]
    # the jump host's key, never the target's: gpu3's own entry is right, nothing was recorded or dropped
    assert "host gpu3: its host key" not in jumped["error"]
    assert known.read_text() == known_before
    assert {h: versions(fleet, h) for h in ("gpu2", "gpu3")} == before
    assert on_target(fleet, "gpu1")

    # --max-fail 0: the roll stops at gpu2; gpu3 is not reached.
    proc, summary = inv_json("upgrade", "--hosts", "all", "--inventory", str(inventory))
    results = {r["host"]: r["outcome"] for r in summary["results"]}
    assert summary["status"] == "stopped" and results["gpu1"] in ("ok", "unchanged"), summary
    assert (results["gpu2"], results["gpu3"]) == ("hostkey", "not-reached"), summary


# ---- 9. a slow, lossy link through the relay ---------------------------------------------------------------------

@pytest.fixture
def slow_gpu3(sim_fleet, cache, tmp_path):
    """gpu3 reached only through the relay: 100 ms each way (200 ms round trip), 1 % of chunks lost and held for a
    250 ms RTO; an inventory with tight timeouts (2 s connect, 1 s keepalive: dead after 3 s unanswered)."""
    sim_fleet.reset_host("gpu3")
    relay = Relay((sim_fleet.host("gpu3").address, 22), delay=0.1, loss=0.01, rto=0.25, seed=15).start()
    try:
        host, port = relay.address
        pub = " ".join((sim_fleet.host_root("gpu3") / "etc/ssh/ssh_host_ed25519_key.pub").read_text().split()[:2])
        known = tmp_path / "known_hosts"
        known.write_text(f"[{host}]:{port} {pub}\n")
        inventory = write_inventory(sim_fleet, tmp_path / "hosts.toml", ["gpu3"], known_hosts=str(known),
                                    connect_timeout=2, extra=f'[settings]\nkeepalive = 1\n'
                                                             f'[hosts.gpu3]\naddress = "{host}"\nport = {port}\n')
        yield sim_fleet, relay, inventory
    finally:
        relay.stop()
        sim_fleet.reset_host("gpu3")


def test_slow_lossy_link_scales_the_timeouts(slow_gpu3):
    """The round trip measured at connect stretches the dead-link limit and a reconnect's handshake beyond the
    inventory's tight values; a reconnect over the slow link works."""
    from gpufleet.config.inventory import load_inventory
    from gpufleet.engine.command import Cmd
    from gpufleet.engine.runner import session_for

    fleet, relay, path = slow_gpu3
    inventory = load_inventory(path)
    session = session_for(inventory.hosts["gpu3"], inventory)
    with session:
        link = session.link
        assert link.round_trip >= 0.2  # the relay's two delays
        assert link.handshake > inventory.settings.connect_timeout
        assert link.dead_after > inventory.settings.keepalive * 3
        sock = session.conn.transport.sock
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == int(link.dead_after * 1000)
        session.reconnect()
        assert session.conn.connect_timeout == math.ceil(link.handshake)  # Fabric keeps whole seconds
        assert session.run(Cmd.of("hostname"), step="probe").output.strip() == "gpu3"
    assert relay.connections == 2


def test_upgrade_over_a_slow_lossy_link_completes(slow_gpu3):
    fleet, relay, inventory = slow_gpu3
    proc, [report] = inv_json("upgrade", "--inventory", str(inventory), "--host", "gpu3")
    assert proc.returncode == 0 and report["outcome"] == "ok", (report, proc.stderr[-3000:])
    assert relay.connections >= 1 and relay.losses > 0  # it went through the relay, and lost chunks on the way
    assert on_target(fleet, "gpu3")
    rerun_changes_nothing(inventory, "gpu3")
