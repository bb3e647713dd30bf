"""The staged venv: remote/venv_stage.py run for real on a scratch venv, and the executor's order around it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import remote
from gpufleet.config.stack import Stack
from gpufleet.engine.command import Cmd
from gpufleet.facts.model import HostFacts
from gpufleet.fleet.executor import Executor
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.plan import Step, Unchanged
from gpufleet.testing.session import FakeSession

RUN = RunInfo("alice", "laptop", 42, "2026-12-02T10:00:00Z", "inv upgrade --host gpu1", token="t0k")


def stage(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", remote.text("venv_stage.py"), *map(str, args)], capture_output=True,
                          text=True, cwd="/")


def values(proc) -> dict[str, str]:
    return dict(line.split("=", 1) for line in proc.stdout.splitlines() if "=" in line)


@pytest.fixture
def venv(tmp_path) -> Path:
    """A small venv-shaped tree: a launcher, a package and its dist-info in site-packages."""
    v = tmp_path / "opt" / "venv"
    site = v / "lib" / "python3.12" / "site-packages"
    (site / "torch-2.9.1.dist-info").mkdir(parents=True)
    (site / "torch").mkdir()
    (site / "torch" / "__init__.py").write_text("version = '2.9.1'\n")
    (v / "bin").mkdir()
    launcher = v / "bin" / "torchrun"
    launcher.write_text(f"#!{v}/bin/python\nimport torch\n")
    launcher.chmod(0o755)
    os.symlink("/usr/bin/python3", v / "bin" / "python")
    return v


def install_in(stage_dir: Path, version: str) -> None:
    """What pip does in the staged copy: replace files (unlink, then write) and write launchers naming its python."""
    site = stage_dir / "lib" / "python3.12" / "site-packages"
    for old in site.glob("torch-*.dist-info"):
        os.rename(old, site / f"torch-{version}.dist-info")
    init = site / "torch" / "__init__.py"
    init.unlink()
    init.write_text(f"version = '{version}'\n")
    launcher = stage_dir / "bin" / "torchrun"
    launcher.unlink()
    launcher.write_text(f"#!{stage_dir}/bin/python\nimport torch\n")
    launcher.chmod(0o755)


def test_prepare_links_change_switch_swaps_and_points_launchers_at_the_live_path(venv):
    init = venv / "lib/python3.12/site-packages/torch/__init__.py"
    proc = stage("prepare", venv, "alice@laptop")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = values(proc)
    staged = Path(got["stage"])
    assert staged == Path(str(venv) + ".gpufleet-next") and got["reused"] == "no"
    copy = staged / "lib/python3.12/site-packages/torch/__init__.py"
    assert copy.stat().st_ino == init.stat().st_ino  # hard-linked, not copied
    assert stage("mark", venv, "dirty").returncode == 0
    install_in(staged, "2.12.0")
    assert stage("mark", venv, "clean").returncode == 0
    assert init.read_text() == "version = '2.9.1'\n"  # the live venv never saw the change
    proc = stage("switch", venv)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = values(proc)
    assert got["switched"] in ("atomic", "two-renames") and got["scripts_fixed"] == "1"
    assert init.read_text() == "version = '2.12.0'\n"
    assert (venv / "bin/torchrun").read_text().splitlines()[0] == f"#!{venv}/bin/python"
    assert os.access(venv / "bin/torchrun", os.X_OK)
    assert not staged.exists() and not Path(str(staged) + ".json").exists()


def test_a_clean_copy_is_reused_a_dirty_one_or_one_of_another_live_venv_is_discarded(venv):
    assert stage("prepare", venv, "run-1").returncode == 0
    staged = Path(str(venv) + ".gpufleet-next")
    install_in(staged, "2.12.0")
    again = values(stage("prepare", venv, "run-2"))
    assert again["reused"] == "yes" and again["by_before"] == "run-1"
    assert stage("mark", venv, "dirty").returncode == 0  # a run died in the middle of a step
    third = values(stage("prepare", venv, "run-3"))
    assert third["reused"] == "no" and third["discarded"] == "a run stopped in the middle of changing it"
    assert "2.9.1" in (staged / "lib/python3.12/site-packages/torch/__init__.py").read_text()
    (venv / "lib/python3.12/site-packages/extra-1.0.dist-info").mkdir()  # somebody installed into the live venv
    fourth = values(stage("prepare", venv, "run-4"))
    assert fourth["reused"] == "no" and fourth["discarded"] == "the live venv changed since it was staged"


def test_switch_refuses_a_dirty_copy_and_a_live_venv_changed_since(venv):
    assert stage("prepare", venv, "run").returncode == 0
    stage("mark", venv, "dirty")
    proc = stage("switch", venv)
    assert proc.returncode == 5 and "middle of a change" in proc.stdout
    stage("mark", venv, "clean")
    (venv / "lib/python3.12/site-packages/late-1.0.dist-info").mkdir()
    proc = stage("switch", venv)
    assert proc.returncode == 5 and "changed after it was staged" in proc.stdout
    assert (venv / "lib/python3.12/site-packages/torch/__init__.py").exists()


def test_a_symlinked_venv_swaps_the_directory_it_names_and_keeps_the_link(venv, tmp_path):
    link = tmp_path / "current"
    link.symlink_to(venv)
    got = values(stage("prepare", link, "run"))
    assert Path(got["stage"]) == Path(str(venv) + ".gpufleet-next")
    install_in(Path(got["stage"]), "2.12.0")
    assert stage("switch", link).returncode == 0
    assert link.is_symlink() and "2.12.0" in (link / "lib/python3.12/site-packages/torch/__init__.py").read_text()


def test_heal_puts_back_a_venv_left_between_two_renames(venv):
    prev = Path(str(venv) + ".gpufleet-prev")
    os.rename(venv, prev)  # a two-rename switch died after its first rename
    proc = stage("heal", venv)
    assert proc.returncode == 0 and venv.is_dir() and not prev.exists()


def test_estimate_counts_what_the_copy_costs(venv):
    got = values(stage("estimate", venv))
    assert got["present"] == "yes" and int(got["files"]) == 3 and int(got["dirs"]) >= 6
    assert int(got["need"]) >= int(got["dirs"]) * 512 and got["staged"] == "no"
    assert values(stage("estimate", venv.parent / "nothing"))["present"] == "no"


# ---- the executor around the staged copy (scripted session) -------------------------------------------------------

STAGE = "/root/venv.gpufleet-next"


def session_for(extra=None) -> FakeSession:
    return FakeSession({"snapshot": (0, "/var/lib/gpufleet/snapshots/20261202T100000Z\n"), "read lock": (1, ""),
                        "venv: stage a copy": (0, f"stage={STAGE}\nreused=no\ndiscarded=none\nfiles=9\nseconds=0.1\n"),
                        "venv: switch to the staged copy": (0, "switched=atomic\nseconds=0.0001\nscripts_fixed=2\n"),
                        "venv: staging cost": (0, "present=yes\nfiles=9\ndirs=3\nneed=12288\nfree=1073741824\n"
                                                  "reusable=no\n"),
                        "server running?": (3, ""), **(extra or {})})


def venv_role(seen_venvs, *plans):
    calls = iter(plans)

    class R:
        name = "torch"

        @staticmethod
        def plan(ctx):
            seen_venvs.append(ctx.host.venv)
            return next(calls)(ctx)
    return R


def install(ctx) -> list:
    return [Step(role="torch", title="install torch", reason="old", commands=(Cmd.of(f"{ctx.host.venv}/bin/pip", "x"),),
                 verify=(Cmd.of(f"{ctx.host.venv}/bin/python", "check"),), changes=("venv",))]


def on_target(ctx) -> list:
    return [Unchanged("torch", "torch 2.12 installed")]


def executor(roles, **kw) -> tuple[Executor, list[str], list[str]]:
    lines, facts_of = [], []

    def read_facts(session):
        facts_of.append(session.host.venv)
        return HostFacts(host="gpu1")
    return Executor(roles=roles, run=RUN, repo=Path("."), say=lines.append, read_facts=read_facts, **kw), lines, \
        facts_of


def test_a_venv_change_is_planned_again_against_the_staged_copy_then_switched_and_proved():
    seen: list[str] = []
    ex, lines, facts_of = executor([venv_role(seen, install, install, on_target)])
    session = session_for()
    report = ex.host(session, Stack())
    assert report.ok, report.error
    assert seen == ["/root/venv", STAGE, "/root/venv"]  # found the change, planned it on the copy, proved it live
    assert facts_of[:2] == ["/root/venv", STAGE] and facts_of[-1] == "/root/venv"
    order = [s for s in session.steps if s not in ("facts",)]
    assert order[:2] == ["lock", "snapshot"]
    i = order.index
    assert i("snapshot") < i("venv: stage a copy") < i("venv: mark the staged copy dirty") < i("install torch") \
        < i("install torch: verify") < i("venv: mark the staged copy clean") < i("server running?") \
        < i("venv: switch to the staged copy")
    [cmd] = [c for s, c in session.calls if s == "install torch"]
    assert cmd.argv[:2] == ("bash", "-c") and "job-wait" in cmd.argv  # detached from the connection
    assert f"{STAGE}/bin/pip x" in cmd.display() and "gpufleet-step-" in cmd.display()
    assert "remove job logs" in session.steps
    assert [e.status for e in report.entries] == ["changed", "changed"]
    assert report.entries[-1].item.title == "switch /root/venv to the staged copy in one atomic swap"
    assert report.staged_venv == STAGE and report.server_stopped is None
    assert any("one atomic exchange" in line for line in lines)


def test_a_failed_step_leaves_the_live_venv_alone_and_says_where_the_changes_are():
    seen: list[str] = []
    ex, _, _ = executor([venv_role(seen, install, install)])
    session = session_for({"install torch": (1, "pip: no space left")})
    report = ex.host(session, Stack())
    assert report.outcome == "failed"
    assert "venv: switch to the staged copy" not in session.steps and "server running?" not in session.steps
    assert "venv: mark the staged copy clean" not in session.steps  # the next run discards the half-changed copy
    assert "the live venv /root/venv is untouched" in report.next_step and STAGE in report.next_step


def test_a_running_server_is_stopped_only_for_the_switch():
    seen: list[str] = []
    ex, lines, _ = executor([venv_role(seen, install, install, on_target)])
    session = session_for({"server running?": (0, "")})
    report = ex.host(session, Stack())
    assert report.ok and report.server_stopped == "sglang.service"
    steps = session.steps
    assert steps.index("install torch") < steps.index("stop the server for the venv switch") \
        < steps.index("venv: switch to the staged copy")


def test_a_role_still_off_target_after_the_switch_fails_the_run():
    seen: list[str] = []
    ex, _, _ = executor([venv_role(seen, install, install, install)])
    report = ex.host(session_for(), Stack())
    assert report.outcome == "failed" and "after the venv switch torch is not on target" in report.error


def test_a_copy_that_ends_unchanged_is_removed_not_switched():
    seen: list[str] = []
    ex, _, _ = executor([venv_role(seen, install, on_target)])
    session = session_for()
    report = ex.host(session, Stack())
    assert report.ok and "venv: remove the unused staged copy" in session.steps
    assert "venv: switch to the staged copy" not in session.steps and report.staged_venv is None


def test_the_dry_run_shows_what_staging_costs():
    seen: list[str] = []
    ex, _, _ = executor([venv_role(seen, install)], dry_run=True)
    report = ex.host(session_for(), Stack())
    assert [e.status for e in report.entries] == ["planned", "planned"]
    reason = report.entries[-1].item.reason
    assert "hard-linked copy beside /root/venv (9 files, 3 directories" in reason and "1.0 GiB free" in reason
    assert json.dumps(report.to_json())


# ---- room on disk ------------------------------------------------------------------------------------------------

def room(checks) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", remote.text("disk_room.py"), json.dumps(checks)], capture_output=True,
                          text=True, cwd="/")


def small_wheel(path: Path, member_bytes: int) -> Path:
    import zipfile

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("pkg/data.bin", b"\0" * member_bytes)  # compresses to almost nothing
    return path


def test_room_counts_what_wheels_unpack_to_per_filesystem(tmp_path):
    wheel = small_wheel(tmp_path / "pkg-1.0-py3-none-any.whl", 3 * 2**20)
    proc = room([{"path": str(tmp_path / "cache"), "need": 100, "what": "wheels handed over"},
                 {"path": str(tmp_path / "venv" / "not-yet"), "need": 0, "what": "unpacked", "unpack": [str(wheel)]}])
    assert proc.returncode == 0, proc.stdout
    [line] = [ln for ln in proc.stdout.splitlines() if ln.startswith("room ")]  # one filesystem: needs summed
    assert f"need={100 + 3 * 2**20} " in line and "wheels handed over 0 MiB; unpacked 3 MiB" in line


def test_too_little_room_is_one_sentence_with_the_numbers(tmp_path):
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    proc = room([{"path": str(tmp_path), "need": free + 2**30, "what": "wheels handed over"}])
    assert proc.returncode == 3
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith(f"too little disk for {tmp_path}: it needs ") and "margin" in last and "is free there" in last


def test_an_upgrade_without_room_for_its_wheels_stops_before_any_snapshot_stage_or_push(tmp_path):
    from gpufleet.plan import Upload
    from gpufleet.wheels.fetch import WheelCache

    wheel = small_wheel(tmp_path / "torch-2.12.0-cp312-cp312-linux_x86_64.whl", 2**20)
    digest = __import__("hashlib").sha256(wheel.read_bytes()).hexdigest()
    up = Upload(wheel.as_uri(), digest, f"/var/cache/gpufleet/wheels/{wheel.name}", "torch", "2.12.0")

    def with_wheel(ctx):
        return [Step(role="torch", title="install torch", reason="old", commands=(Cmd.of("pip", "x"),),
                     changes=("venv",), uploads=(up,))]
    seen: list[str] = []
    ex, _, _ = executor([venv_role(seen, with_wheel)], wheels=WheelCache(tmp_path / "cache"))
    ex.wheels.get = lambda url, sha=None: wheel  # the control node has the file already
    session = session_for({"install torch: which wheels are on the host?": (0, "@@push 0 absent\n"),
                           "install torch: room on disk?": (3, "room 1 need=5 free=1 what=x\ntoo little disk for "
                                                               "/var/cache/gpufleet/wheels and /root/venv: it needs 1 "
                                                               "MiB (...) and 0 MiB is free there\n")})
    report = ex.host(session, Stack())
    assert report.outcome == "failed" and "too little disk for /var/cache/gpufleet/wheels" in report.error
    assert "nothing was written" in report.error
    assert not {"snapshot", "venv: stage a copy", "install torch"} & set(session.steps)
    [(_, cmd)] = [c for c in session.calls if c[0] == "install torch: room on disk?"]
    checks = json.loads(cmd.argv[-1])
    assert checks[0] == {"path": "/var/cache/gpufleet/wheels", "need": wheel.stat().st_size,
                         "what": "wheels handed over"}
    assert checks[1]["path"] == "/root/venv" and checks[1]["need"] == 2**20


def test_a_filesystem_that_cannot_rename_the_venv_changes_it_in_place_and_says_why():
    seen: list[str] = []
    ex, lines, _ = executor([venv_role(seen, install, install)])
    session = session_for({"venv: stage a copy": (0, "mode=in-place\nwhy=this filesystem cannot rename /root/venv "
                                                     "(overlayfs without redirect_dir: Invalid cross-device link)\n")})
    report = ex.host(session, Stack())
    assert report.ok and report.staged_venv is None and seen == ["/root/venv"]
    [cmd] = [c for s, c in session.calls if s == "install torch"]
    assert cmd.argv[0] == "/root/venv/bin/pip" and "venv: switch to the staged copy" not in session.steps
    assert any("changing the venv in place: this filesystem cannot rename /root/venv" in line for line in lines)


@pytest.fixture
def overlay(tmp_path):
    """A real overlayfs without redirect_dir (as a container image's root often is), its venv in the lower layer."""
    if os.geteuid() != 0:
        pytest.skip("mounting an overlay needs root")
    lower, upper, work, merged = (tmp_path / n for n in ("lower", "upper", "work", "merged"))
    for d in (upper, work, merged):
        d.mkdir()
    (lower / "venv" / "bin").mkdir(parents=True)
    (lower / "venv" / "bin" / "tool").write_text("#!/bin/sh\n")
    opts = f"lowerdir={lower},upperdir={upper},workdir={work},redirect_dir=off"
    if subprocess.run(["mount", "-t", "overlay", "overlay", "-o", opts, str(merged)]).returncode != 0:
        pytest.skip("this kernel cannot mount an overlay here")
    yield merged
    subprocess.run(["umount", str(merged)])


def test_overlayfs_without_redirect_dir_is_found_out_before_any_change(overlay):
    proc = stage("prepare", overlay / "venv", "run")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = values(proc)
    assert got["mode"] == "in-place" and "overlayfs without redirect_dir" in got["why"]
    assert sorted(p.name for p in overlay.iterdir()) == ["venv"]  # no copy, no state file left
    assert (overlay / "venv" / "bin" / "tool").read_text() == "#!/bin/sh\n"


def test_swap_in_replaces_the_live_venv_in_one_step_and_removes_the_old(venv, tmp_path):
    new = Path(str(venv) + ".gpufleet-new")
    subprocess.run(["cp", "-al", str(venv), str(new)], check=True)
    install_in(new, "2.9.0")
    proc = stage("swap-in", venv, new)
    assert proc.returncode == 0 and values(proc)["swapped"] == "atomic"
    assert "2.9.0" in (venv / "lib/python3.12/site-packages/torch/__init__.py").read_text() and not new.exists()


def test_swap_in_on_overlayfs_without_redirect_dir_says_so_and_changes_nothing(overlay):
    new = overlay / "venv.gpufleet-new"
    (new / "bin").mkdir(parents=True)
    proc = stage("swap-in", overlay / "venv", new)
    assert proc.returncode == 7 and (overlay / "venv" / "bin" / "tool").exists() and new.is_dir()


def test_after_a_lost_connection_the_install_is_followed_not_started_again():
    seen: list[str] = []
    ex, lines, _ = executor([venv_role(seen, install, install, on_target)])
    session = session_for({"install torch": [(None, ""), (0, "Successfully installed torch\n")]})
    session.reconnect = lambda: None
    report = ex.host(session, Stack())
    assert report.ok, report.error
    first, second = [c for s, c in session.calls if s == "install torch"]
    assert "job-wait" in first.argv and "job-attach" in second.argv  # never a second pip over a half-done one
    assert any("connection lost during 'install torch'" in line for line in lines)
