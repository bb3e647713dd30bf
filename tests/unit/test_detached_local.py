"""The detached job scripts run here with bash (the setsid path: no systemd): start, pick up, wait, vanish."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpufleet.engine import detached
from gpufleet.engine.command import Cmd

pytestmark = pytest.mark.skipif(Path("/run/systemd/system").is_dir(), reason="would start units on this machine")


def sh(cmd: Cmd, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", cmd.render()], capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def job(tmp_path: Path) -> detached.Job:
    return detached.Job("gpufleet-test-job", str(tmp_path / "job"))


def test_wait_starts_streams_and_exits_with_the_jobs_code(job):
    done = sh(detached.wait_cmd(job, Cmd.of("bash", "-c", "echo hello; echo \"it's $1\"; exit 4", "x", "quoted"),
                                poll=0.2))
    assert done.returncode == 4 and done.stdout == "started\nhello\nit's quoted\n"
    assert Path(job.rc_file).read_text() == "4\n"


def test_start_reports_a_running_or_finished_job_instead_of_starting_it_again(job):
    cmd = Cmd.of("bash", "-c", "sleep 1; exit 3")
    assert sh(detached.start_cmd(job, cmd)).stdout == "started\n"
    assert sh(detached.start_cmd(job, cmd)).stdout == "running\n"
    while not Path(job.rc_file).exists():
        time.sleep(0.1)
    assert sh(detached.start_cmd(job, cmd)).stdout == "finished 3\n"
    assert sh(detached.start_cmd(job, cmd, retry_failed=True)).stdout == "started\n"


def test_a_picked_up_job_streams_its_last_lines(job):
    assert sh(detached.start_cmd(job, Cmd.of("bash", "-c", "for i in $(seq 30); do echo line$i; done; sleep 1"))
              ).stdout == "started\n"
    time.sleep(0.3)
    again = sh(detached.wait_cmd(job, Cmd.of("false"), poll=0.2))
    lines = again.stdout.splitlines()
    assert again.returncode == 0 and lines[0] == "running" and lines[1:] == [f"line{i}" for i in range(11, 31)]


def test_a_job_that_vanishes_without_an_exit_code_fails_the_wait(job):
    assert sh(detached.start_cmd(job, Cmd.of("sleep", "30"))).stdout == "started\n"
    pid = int(Path(job.pid_file).read_text())
    deadline = time.monotonic() + 5
    while os.getpgid(pid) != pid and time.monotonic() < deadline:  # setsid may not have run yet
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
    done = sh(detached.wait_cmd(job, Cmd.of("sleep", "30"), poll=0.2))
    assert done.returncode == 1 and "died without an exit code" in done.stdout


class LocalSession:
    """Runs each command with sh here: the detached scripts against this machine, as on a host without systemd."""

    name = "local"

    def run(self, cmd, step, check=True, timeout=None):
        from gpufleet.engine.ssh import Result

        done = subprocess.run(["sh", "-c", cmd.render()], capture_output=True, text=True, timeout=timeout)
        return Result("local", step, cmd.display(), done.returncode, done.stdout + done.stderr, 0.0)

    def reconnect(self):
        pass


def test_follow_echoes_the_log_while_the_job_runs_and_returns_its_code(job):
    cmd = Cmd.of("bash", "-c", "for i in 1 2 3; do echo step $i; sleep 0.4; done; exit 5")
    assert sh(detached.start_cmd(job, cmd)).stdout == "started\n"
    seen: list[str] = []
    assert detached.follow(LocalSession(), job, echo=seen.append, poll=0.1, timeout=30) == 5
    assert [line.split("] ", 1)[-1] for line in seen] == ["step 1", "step 2", "step 3"]


def test_a_job_that_ends_between_the_looks_is_finished_not_absent(tmp_path):
    """The exit-code file appears just after job_state's first look (here: while it asks systemctl)."""
    import subprocess

    from gpufleet import remote

    rc = tmp_path / "exit-code"
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "systemctl").write_text(f"#!/bin/sh\necho 0 > {rc}\nexit 3\n")  # the unit ends as it is asked about
    (fake / "systemctl").chmod(0o755)
    script = remote.text("job_state.sh") + 'job_state "$@"\n'
    proc = subprocess.run(["bash", "-c", script, "job-state", str(rc), "gpufleet-step-x", str(tmp_path / "pid")],
                          capture_output=True, text=True, env={"PATH": f"{fake}:/usr/bin:/bin"})
    assert proc.stdout.strip() == "finished 0"


def test_attach_follows_a_finished_job_and_never_restarts_one_that_is_gone(tmp_path):
    """After a reconnect the executor attaches: a job gone with no exit code (its host rebooted) is an error, not a
    second run of a half-done install."""
    import subprocess

    from gpufleet.engine import detached

    job = detached.Job("gpufleet-step-test", str(tmp_path / "job"))
    (tmp_path / "job").mkdir()
    gone = subprocess.run(["bash", "-c", detached.attach_cmd(job, poll=0.1).render()], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert gone.returncode == 1 and "ended with no exit code" in gone.stdout
    assert not (tmp_path / "job" / "build.log").exists()  # nothing was started
    (tmp_path / "job" / "build.log").write_text("Successfully installed torch\n")
    (tmp_path / "job" / "exit-code").write_text("0\n")
    done = subprocess.run(["bash", "-c", detached.attach_cmd(job, poll=0.1).render()], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 0 and "Successfully installed torch" in done.stdout


def _shutting_down(tmp_path: Path, looks: int) -> tuple[dict, Path]:
    """A PATH whose systemctl says the host is stopping for its first `looks` is-system-running calls (each counted
    in a file), running after; every other systemctl call fails, as for a unit that is not active."""
    fake, count = tmp_path / "bin", tmp_path / "looks"
    fake.mkdir(parents=True)
    count.write_text("")
    (fake / "systemctl").write_text(
        "#!/bin/sh\n[ \"$1\" = is-system-running ] || exit 3\n"
        f"echo x >> {count}\n"
        f"if [ $(wc -l < {count}) -le {looks} ]; then echo stopping; else echo running; fi\n")
    (fake / "systemctl").chmod(0o755)
    return {"PATH": f"{fake}:/usr/bin:/bin"}, count


def test_a_job_stopped_by_a_shutdown_waits_for_the_shutdown_instead_of_failing_at_once(job, tmp_path):
    """systemd stops the running units before it ends the SSH sessions: the wait would exit 1 as if the install had
    failed; it waits while the host is stopping, so the caller sees the connection drop and reattaches after the
    boot. (Here the "shutdown" ends after 5 looks and the wait then reports the vanished job.)"""
    assert sh(detached.start_cmd(job, Cmd.of("sleep", "30"))).stdout == "started\n"
    pid = int(Path(job.pid_file).read_text())
    deadline = time.monotonic() + 5
    while os.getpgid(pid) != pid and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(pid, signal.SIGKILL)
    env, looks = _shutting_down(tmp_path, 5)
    done = subprocess.run(["bash", "-c", detached.wait_cmd(job, Cmd.of("sleep", "30"), poll=0.2).render()],
                          capture_output=True, text=True, env=env, timeout=30)
    assert "the host is shutting down: waiting for it to drop this connection" in done.stdout, done.stdout
    assert len(looks.read_text().splitlines()) == 6  # it looked until the host no longer said stopping
    assert done.returncode == 1 and "died without an exit code" in done.stdout


def test_a_job_killed_while_the_host_stops_leaves_no_exit_code(job, tmp_path):
    """A signal's exit code (143) during a shutdown is the shutdown's, not the job's: no exit-code file, so the
    attach after the boot says the job ended with none instead of reporting an install failure."""
    env, _ = _shutting_down(tmp_path, 1000)
    start = subprocess.run(["bash", "-c", detached.start_cmd(job, Cmd.of("bash", "-c", "kill -TERM $$")).render()],
                           capture_output=True, text=True, env=env, timeout=30)
    assert start.stdout == "started\n"
    time.sleep(1)
    assert not Path(job.rc_file).exists()
    env, _ = _shutting_down(tmp_path / "booted", 0)
    gone = subprocess.run(["bash", "-c", detached.attach_cmd(job, poll=0.1).render()], capture_output=True,
                          text=True, env=env, timeout=30)
    assert gone.returncode == 1 and "ended with no exit code" in gone.stdout


def test_a_job_that_fails_by_a_signal_outside_a_shutdown_keeps_its_exit_code(job, tmp_path):
    env, _ = _shutting_down(tmp_path, 0)
    done = subprocess.run(["bash", "-c", detached.wait_cmd(job, Cmd.of("bash", "-c", "kill -TERM $$"),
                                                           poll=0.2).render()],
                          capture_output=True, text=True, env=env, timeout=30)
    assert done.returncode == 143 and Path(job.rc_file).read_text() == "143\n"
