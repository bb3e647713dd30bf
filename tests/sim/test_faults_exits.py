"""End to end, faults injected for real on the simulated fleet: Ctrl-C mid-roll, gpufleet SIGKILLed mid-install,
the host rebooted during pip and just after it. Each ends with true records (summary.json, the host's audit log),
no lock left, the host on the old stack or the new one, and a re-run that converges."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.sim.helpers import REPO, inv_json, write_inventory

pytestmark = pytest.mark.sim

OLD, NEW = "2.9.1+cu130", "2.12.0.dev20260307+cu130"
FAST = ('[defaults.stack.server]\nhealth_timeout = 15\n[defaults.stack.server.env]\nSGLANG_SIM_WARMUP = "1"\n'
        '[settings]\nreconnect_for = 180\n')
HOLD, HELD = "/root/gfb-hold-pip", "/root/gfb-pip-held"
# A .pth line in the venv: a real `pip install` (not its dry run) waits while the hold file exists, having said so
# in HELD; every other use of the venv's Python is untouched. Bounded: 5 minutes.
HOLD_PTH = ("import os, sys, time; exec(\"if 'install' in sys.argv and '--dry-run' not in sys.argv and "
            f"os.path.exists('{HOLD}'):\\n open('{HELD}', 'w').close()\\n n = 0\\n while os.path.exists('{HOLD}') "
            "and n < 1500:\\n  time.sleep(0.2); n += 1\")\n")


def _torch(fleet, host) -> str:
    return fleet.run_on(host, "/root/venv/bin/python -c 'import torch; print(torch.__version__)'").stdout.strip()


def _pip_check(fleet, host) -> subprocess.CompletedProcess:
    return fleet.run_on(host, "/root/venv/bin/python -m pip check", check=False)


def _locked(fleet, host) -> bool:
    return fleet.run_on(host, "test -d /var/lib/gpufleet/lock", check=False).returncode == 0


def _audit(fleet, host) -> list[dict]:
    text = fleet.run_on(host, "cat /var/lib/gpufleet/audit.log 2>/dev/null", check=False).stdout
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _on_a_stack(fleet, host) -> str:
    """"old" or "new": every distribution of one stack and pip check clean (never between)."""
    torch = _torch(fleet, host)
    assert torch in (OLD, NEW), torch
    assert _pip_check(fleet, host).returncode == 0, _pip_check(fleet, host).stdout
    freeze = fleet.run_on(host, "/root/venv/bin/python -m pip freeze").stdout
    flashinfer = "flashinfer-python==0.6.4" in freeze
    assert flashinfer == (torch == OLD), freeze  # torch and flashinfer from the same stack
    return "old" if torch == OLD else "new"


def _hold_pip(fleet, host) -> None:
    site = fleet.run_on(host, "ls -d /root/venv/lib/python3*/site-packages").stdout.strip()
    fleet.run_on(host, f"cat > {site}/gfb_hold.pth <<'EOF'\n{HOLD_PTH}EOF\ntouch {HOLD}; rm -f {HELD}")


def _summary(started: str | None = None) -> tuple[Path, dict]:
    runs = Path(os.environ["GPUFLEET_RUNS_DIR"])
    path = runs / started / "summary.json" if started else sorted(runs.glob("*/summary.json"))[-1]
    return path, json.loads(path.read_text())


def _no_running(summary: dict) -> None:
    assert summary["status"] != "running", summary
    assert not [r for r in summary["results"] if r["outcome"] == "running"], summary["results"]


class _Run:
    """A real `inv ...` process with its combined output in a file the test can watch."""

    def __init__(self, tmp_path: Path, *args: str):
        self.out = tmp_path / f"run-{time.monotonic_ns()}.out"
        with open(self.out, "w") as sink:
            self.proc = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=REPO, stdout=sink,
                                         stderr=subprocess.STDOUT, text=True)

    def text(self) -> str:
        return self.out.read_text(errors="replace")

    def wait_for(self, what: str, check, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check():
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"exited {self.proc.returncode} before {what}:\n{self.text()[-6000:]}")
            time.sleep(0.3)
        raise AssertionError(f"no {what} within {timeout:.0f}s:\n{self.text()[-6000:]}")

    def finish(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def hosts(sim_fleet, request):
    """The hosts a test breaks, fresh before it and fresh again after it (later tests see clean hosts)."""
    names = request.param
    for h in names:
        sim_fleet.reset_host(h)
    yield names
    for h in names:
        sim_fleet.set_link(h, True)
        sim_fleet.reset_host(h)


@pytest.mark.parametrize("hosts", [["gpu1", "gpu2"]], indirect=True)
def test_ctrl_c_mid_roll_finishes_the_canary_records_interrupted_and_resume_completes(sim_fleet, hosts, tmp_path):
    fleet = sim_fleet
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", hosts, extra=FAST)
    _hold_pip(fleet, "gpu1")
    run = _Run(tmp_path, "upgrade", "--hosts", "gpu1,gpu2", "--inventory", str(inventory))
    try:
        run.wait_for("pip held on gpu1", lambda: fleet.run_on("gpu1", f"test -e {HELD}", check=False).returncode == 0)
        run.proc.send_signal(signal.SIGINT)
        # said at once, while gpu1's pip is still held
        run.wait_for("the interrupt line", lambda: "interrupt: finishing" in run.text(), timeout=30)
        fleet.run_on("gpu1", f"rm -f {HOLD}")
        code = run.finish()
    finally:
        fleet.run_on("gpu1", f"rm -f {HOLD}", check=False)
    text = run.text()
    assert code == 130, text[-6000:]
    assert "interrupt: finishing (or restoring, if it fails) gpu1, then stopping" in text
    assert "Ctrl-C again to stop now" in text and "Traceback" not in text
    path, summary = _summary()
    _no_running(summary)
    outcome = {r["host"]: r["outcome"] for r in summary["results"]}
    assert summary["status"] == "interrupted" and outcome == {"gpu1": "ok", "gpu2": "not-reached"}, summary
    assert _on_a_stack(fleet, "gpu1") == "new" and _on_a_stack(fleet, "gpu2") == "old"
    assert not _locked(fleet, "gpu1") and not _locked(fleet, "gpu2")
    assert _audit(fleet, "gpu1")[-1]["outcome"] == "ok" and _audit(fleet, "gpu1")[-1]["roll"] == summary["started"]
    assert _audit(fleet, "gpu2") == []  # not reached: untouched

    proc, resumed = inv_json("upgrade", "--resume", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert resumed["status"] == "completed" and resumed["resumed_from"] == summary["started"]
    assert {r["host"]: r["outcome"] for r in resumed["results"]} == {"gpu1": "ok", "gpu2": "ok"}
    assert _on_a_stack(fleet, "gpu1") == "new" and _on_a_stack(fleet, "gpu2") == "new"
    assert not _locked(fleet, "gpu2")


@pytest.mark.parametrize("hosts", [["gpu3"]], indirect=True)
def test_sigkill_mid_install_then_resume_takes_over_the_lock_rechecks_and_converges(sim_fleet, hosts, tmp_path):
    fleet = sim_fleet
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", hosts, extra=FAST)
    _hold_pip(fleet, "gpu3")
    run = _Run(tmp_path, "upgrade", "--hosts", "gpu3", "--canary", "gpu3", "--inventory", str(inventory))
    try:
        run.wait_for("pip held on gpu3", lambda: fleet.run_on("gpu3", f"test -e {HELD}", check=False).returncode == 0)
        run.proc.send_signal(signal.SIGKILL)
        run.finish()
    finally:
        fleet.run_on("gpu3", f"rm -f {HOLD}", check=False)
    # what the killed run left: its record says running, the host lock names its (now dead) pid
    path, killed = _summary()
    assert killed["status"] == "running" and killed["results"][0]["outcome"] == "running", killed
    holder = fleet.run_on("gpu3", "cat /var/lib/gpufleet/lock/holder").stdout
    assert f"pid={run.proc.pid}\n" in holder and "boot_id=" in holder
    fleet.run_on("gpu3", "for i in $(seq 100); do pgrep -f 'pip install' >/dev/null || exit 0; sleep 0.3; done",
                 check=False)  # the orphaned pip on the host ends (or is still going: the resume must cope)

    proc, resumed = inv_json("upgrade", "--resume", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = proc.stderr + proc.stdout
    assert "Traceback" not in err
    # the killed roll is reported (and now recorded) as interrupted; its host re-checked; its lock taken over
    old = json.loads(path.read_text())
    assert old["status"] == "interrupted" and old["results"][0]["outcome"] == "interrupted", old
    assert f"(pid {killed['pid']}) was gone" in old["note"]
    assert resumed["status"] == "completed" and resumed["results"][0]["outcome"] == "ok", resumed
    steps = " ".join(resumed["results"][0]["steps"])
    assert f"re-checked after the interrupted roll {killed['started']}: its snapshot /var/lib/gpufleet/snapshots/" \
        in steps, steps
    log = (path.parent.parent / resumed["started"] / "gpu3.log").read_text()
    assert "took over a stale lock" in log and f"pid {run.proc.pid} no longer runs" in log, log[-3000:]
    assert _on_a_stack(fleet, "gpu3") == "new" and not _locked(fleet, "gpu3")
    assert _audit(fleet, "gpu3")[-1]["outcome"] == "ok"


@pytest.mark.parametrize("hosts", [["gpu2"]], indirect=True)
@pytest.mark.parametrize("when", ["during pip", "just after pip"])
def test_host_rebooted_mid_roll_is_waited_for_and_rolled_back(sim_fleet, hosts, tmp_path, when):
    fleet = sim_fleet
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", hosts, extra=FAST)
    boot_before = fleet.run_on("gpu2", "cat /proc/sys/kernel/random/boot_id").stdout.strip()
    if when == "during pip":
        _hold_pip(fleet, "gpu2")
    run = _Run(tmp_path, "upgrade", "--hosts", "gpu2", "--canary", "gpu2", "--inventory", str(inventory))
    try:
        if when == "during pip":
            run.wait_for("pip held", lambda: fleet.run_on("gpu2", f"test -e {HELD}", check=False).returncode == 0)
        else:  # torch's pip finished: the next role has begun
            run.wait_for("torch installed", lambda: "[gpu2] flashinfer:" in run.text())
        fleet.reboot("gpu2")
        code = run.finish()
    finally:
        fleet.run_on("gpu2", f"rm -f {HOLD}", check=False)
    text = run.text()
    assert fleet.run_on("gpu2", "cat /proc/sys/kernel/random/boot_id").stdout.strip() != boot_before
    assert code == 1 and "Traceback" not in text, text[-6000:]
    # the wait for the rebooting host is the rollback's, or (pip ran detached) the executor's reattaching
    assert ("gpu2 is not answering (rebooting?); waiting up to 180 s" in text
            or "reattaching (the work goes on on the host; waiting up to 180 s for it to answer)" in text), text[-6000:]
    path, summary = _summary()
    _no_running(summary)
    [result] = summary["results"]
    assert summary["status"] == "stopped" and result["outcome"] == "rolled-back", result
    assert any(s.startswith("rolled back to /var/lib/gpufleet/snapshots/") for s in result["steps"]), result
    assert "connection lost" in result["error"] or "no exit code" in result["error"], result["error"]
    assert _on_a_stack(fleet, "gpu2") == "old" and not _locked(fleet, "gpu2")
    audit = _audit(fleet, "gpu2")
    assert audit[-1]["outcome"] == "rolled-back" and audit[-1]["roll"] == summary["started"], audit[-1]
    assert any(a.get("outcome") == "rolled back" for a in audit)  # the restore's own line

    proc, again = inv_json("upgrade", "--resume", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert again["status"] == "completed" and again["results"][0]["outcome"] == "ok"
    assert _on_a_stack(fleet, "gpu2") == "new" and not _locked(fleet, "gpu2")


@pytest.mark.parametrize("hosts", [["gpu2"]], indirect=True)
def test_a_step_started_as_the_host_shuts_down_reads_as_the_connection_lost(sim_fleet, hosts):
    """Once a shutdown is queued systemd refuses new units ("transaction is destructive"): a step's detached job
    started in that moment (CI caught one as the reboot above began, just after torch's pip) must end like a step
    the reboot cut, with the connection lost, not with exit 1 as if the install itself had failed."""
    import threading

    from gpufleet.config.inventory import load_inventory
    from gpufleet.engine import detached
    from gpufleet.engine.command import Cmd
    from gpufleet.engine.runner import session_for

    fleet = sim_fleet
    inventory = load_inventory(fleet.inventory_path)
    job = detached.Job("gpufleet-step-shutdown", "/root/shutdown-job")
    with session_for(inventory.hosts["gpu2"], inventory) as session:
        # The shutdown ends this login's scope within milliseconds, the window CI hit. A unit that takes 8 s to stop,
        # ordered after the scope (so stopped before it), holds the host in "stopping" with the login still open.
        scope = session.run(Cmd.of("sh", "-c", "basename \"$(tail -n 1 /proc/self/cgroup)\""), step="scope"
                            ).output.strip()
        assert scope.startswith("session-") and scope.endswith(".scope"), scope
        session.run(Cmd.of("systemd-run", "--quiet", "--unit=gfb-slow-stop", "--property=TimeoutStopSec=8",
                           f"--property=After={scope}", "bash", "-c", "trap '' TERM; while :; do sleep 0.2; done"),
                    step="slow stop")
        rebooting = threading.Thread(target=fleet.reboot, args=("gpu2",))
        rebooting.start()
        try:
            deadline = time.monotonic() + 15
            while session.run(Cmd.of("systemctl", "is-system-running"), step="state", check=False
                              ).output.strip() != "stopping":
                assert time.monotonic() < deadline, "the host never said it was stopping"
                time.sleep(0.05)
            refused = session.run(Cmd.of("systemd-run", "--quiet", "true"), step="refused?", check=False)
            result = session.run(detached.wait_cmd(job, Cmd.of("true"), poll=0.2), step="step", check=False,
                                 timeout=120)
        finally:
            rebooting.join()
    assert refused.exit_code != 0 and "destructive" in refused.output, refused.output  # the case this covers
    assert "the host is shutting down: waiting for it to drop this connection" in result.output, result.output
    assert result.exit_code is None, result.output
    gone = fleet.run_on("gpu2", detached.attach_cmd(job, poll=0.2).render(), check=False)  # after the boot
    assert gone.returncode == 1 and "ended with no exit code" in gone.stdout, gone.stdout


@pytest.mark.parametrize("hosts", [["gpu1"]], indirect=True)
def test_second_ctrl_c_stops_now_records_state_unknown_and_resume_converges(sim_fleet, hosts, tmp_path):
    fleet = sim_fleet
    inventory = write_inventory(fleet, tmp_path / "hosts.toml", hosts, extra=FAST)
    _hold_pip(fleet, "gpu1")
    run = _Run(tmp_path, "upgrade", "--hosts", "gpu1", "--canary", "gpu1", "--inventory", str(inventory))
    try:
        run.wait_for("pip held on gpu1", lambda: fleet.run_on("gpu1", f"test -e {HELD}", check=False).returncode == 0)
        run.proc.send_signal(signal.SIGINT)
        run.wait_for("the interrupt line", lambda: "Ctrl-C again to stop now" in run.text(), timeout=30)
        run.proc.send_signal(signal.SIGINT)
        code = run.finish(timeout=60)  # stops now: pip is still held on the host
        assert fleet.run_on("gpu1", f"test -e {HOLD}", check=False).returncode == 0
    finally:
        fleet.run_on("gpu1", f"rm -f {HOLD}", check=False)
    text = run.text()
    assert code == 130 and "Traceback" not in text, text[-6000:]
    assert "[gpu1] stopped now during:" in text and "its state is unknown" in text, text[-3000:]
    path, summary = _summary()
    _no_running(summary)
    [result] = summary["results"]
    assert summary["status"] == "interrupted" and result["outcome"] == "interrupted", summary
    assert "upgrade --resume` re-checks it" in result["error"] and "rollback --host gpu1" in result["error"]
    last = _audit(fleet, "gpu1")[-1]
    assert last["outcome"] == "interrupted" and last["roll"] == summary["started"] and last["doing"], last
    holder = fleet.run_on("gpu1", "cat /var/lib/gpufleet/lock/holder").stdout  # left for the next run to take over
    assert f"pid={run.proc.pid}\n" in holder
    fleet.run_on("gpu1", "for i in $(seq 100); do pgrep -f 'pip install' >/dev/null || exit 0; sleep 0.3; done",
                 check=False)

    proc, resumed = inv_json("upgrade", "--resume", "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert resumed["status"] == "completed" and resumed["results"][0]["outcome"] == "ok"
    assert "re-checked after the interrupted roll" in " ".join(resumed["results"][0]["steps"])
    assert _on_a_stack(fleet, "gpu1") == "new" and not _locked(fleet, "gpu1")
