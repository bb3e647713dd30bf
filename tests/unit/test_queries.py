"""Each Query's parser on real output: captured on an H200 server where the fixtures cover it, else produced by
running the query's own remote file here (bash/python3), the way pyinfra tests its facts."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet.engine import detached
from gpufleet.engine.query import Query, ask
from gpufleet.engine.ssh import Result
from gpufleet.errors import UnreachableError
from gpufleet.facts.gather import facts_query
from gpufleet.facts import modelfiles
from gpufleet.fleet import health
from gpufleet.probe import on_host
from gpufleet.wheels import push
from gpufleet.roles import model_server, sgl_kernel

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


class LocalSession:
    """Runs a query's command with bash on this machine, as HostSession.run would on a host."""

    name = "local"

    def __init__(self, path_prefix: Path | None = None):
        self.env = dict(os.environ)
        if path_prefix:
            self.env["PATH"] = f"{path_prefix}:{self.env['PATH']}"

    def run(self, cmd, step, check=True, timeout=None):
        proc = subprocess.run(["bash", "-c", cmd.render()], capture_output=True, text=True, env=self.env,
                              timeout=timeout or 120)
        return Result(self.name, step, cmd.display(), proc.returncode, proc.stdout + proc.stderr, 0.0)


class Host:
    """The inventory fields the queries read."""

    name = "local"

    def __init__(self, tmp: Path):
        self.venv, self.sglang_checkout, self.model_path = str(tmp / "venv"), str(tmp / "co"), str(tmp / "model")
        self.service = "gpufleet-test-none"


def build_rows(tag: str, step: str) -> list[dict]:
    text = (FIXTURES / "real-h200-build" / f"results-{tag}.jsonl").read_text()
    return [r for r in map(json.loads, text.splitlines()) if r["step"] == step]


def fake_systemctl(tmp: Path, body: str) -> Path:
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "systemctl").write_text("#!/bin/bash\n" + body)
    (bin_dir / "systemctl").chmod(0o755)
    return bin_dir


# ---- facts ---------------------------------------------------------------------------------------------------------
def test_facts_on_the_real_h200_output(tmp_path):
    facts = facts_query(Host(tmp_path)).parse("h200", (FIXTURES / "real-h200-ssh" / "facts-raw.txt").read_text())
    assert [g.name for g in facts.gpus.gpus] == ["NVIDIA H200"] and facts.gpus.cuda_version == "13.0"


def test_facts_run_here(tmp_path):
    facts = ask(LocalSession(), facts_query(Host(tmp_path)))
    assert facts.host == "local" and facts.cpu_count == os.cpu_count()
    assert f"could not read packages on host local: venv missing: {tmp_path / 'venv'}" in facts.problems


def test_a_lost_connection_is_unreachable_not_a_parse_error(tmp_path):
    class Lost(LocalSession):
        def run(self, cmd, step, check=True, timeout=None):
            return Result(self.name, step, "", None, "[gpufleet] connection lost", 0.0)
    with pytest.raises(UnreachableError, match="connection lost during facts"):
        ask(Lost(), facts_query(Host(tmp_path)))


# ---- push: which files are there -----------------------------------------------------------------------------------
def test_push_check_run_here(tmp_path):
    same, other = tmp_path / "same", tmp_path / "other"
    same.write_bytes(b"abc")
    other.write_bytes(b"xyz")
    sha = hashlib.sha256(b"abc").hexdigest()
    items = [push.PushItem(same, str(same), sha), push.PushItem(same, str(other), sha),
             push.PushItem(same, str(tmp_path / "absent"), sha)]
    assert ask(LocalSession(), push.check_query(items)) == ["present", "differs", "absent"]


def test_push_check_without_an_answer_is_an_error(tmp_path):
    item = push.PushItem(tmp_path / "f", "/f", "0" * 64)
    with pytest.raises(push.PushError, match="no answer for item 0"):
        push.check_query([item]).parse("h", "bash: openssl: broken\n")


# ---- model files ---------------------------------------------------------------------------------------------------
def safetensors(path: Path, data_bytes: int, cut: int = 0) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [data_bytes // 4], "data_offsets": [0, data_bytes]}}).encode()
    blob = struct.pack("<Q", len(header)) + header + b"\0" * data_bytes
    path.write_bytes(blob[:len(blob) - cut])


def test_model_files_run_here(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "m-1.safetensors", "b": "m-2.safetensors", "c": "m-3.safetensors"}}))
    safetensors(model / "m-1.safetensors", 64)
    safetensors(model / "m-2.safetensors", 64, cut=8)
    query = modelfiles.model_query(str(model), sys.executable)
    report = ask(LocalSession(), query)
    assert (report.config, report.index, report.shards, report.missing) == (True, True, 2, ["m-3.safetensors"])
    assert report.bad == [("m-2.safetensors", f"{report.bytes - (model / 'm-1.safetensors').stat().st_size} bytes, "
                                              f"its header says {(model / 'm-1.safetensors').stat().st_size}")]
    assert not report.ok


# ---- systemd unit state (health gate, probe) -----------------------------------------------------------------------
SHOW = """case "$*" in
  "show -p ActiveState -p SubState -p NRestarts -p MainPID -- demo.service")
    printf 'ActiveState=active\\nSubState=running\\nNRestarts=2\\nMainPID=4242\\n' ;;
  "show -p ActiveEnterTimestamp --value -- demo.service") date -d '-90 seconds' '+%a %Y-%m-%d %H:%M:%S %Z' ;;
  "cat -- demo.service") echo "[Service]" ;;
  "is-active -- demo.service") echo active ;;
  "is-active -- "*) echo inactive; exit 3 ;;
  *) exit 1 ;;
esac
"""


def test_unit_state_run_with_a_stand_in_systemctl(tmp_path):
    state = ask(LocalSession(fake_systemctl(tmp_path, SHOW)), health.unit_state_query("demo.service"))
    assert (state.active, state.sub, state.restarts, state.pid) == ("active", "running", 2, 4242)
    assert 85 <= state.age <= 120


def test_production_state_run_with_a_stand_in_systemctl(tmp_path):
    session = LocalSession(fake_systemctl(tmp_path, SHOW))
    assert ask(session, on_host.production_state_query("demo.service")) == (True, "active")
    assert ask(session, on_host.production_state_query("other.service")) == (False, "inactive")


# ---- the model server's state probe ----------------------------------------------------------------------------------
def test_model_server_state_run_here(tmp_path, monkeypatch):
    host = Host(tmp_path)
    unit, env = tmp_path / "u.service", tmp_path / "e.env"
    unit.write_text("[Unit]\nDescription=x\n")
    env.write_text("A=1\n")
    env.chmod(0o640)
    monkeypatch.setattr(model_server, "unit_path", lambda h: str(unit))
    monkeypatch.setattr(model_server, "env_path", lambda h: str(env))
    monkeypatch.setattr(model_server, "record_path", lambda h: str(tmp_path / "none.json"))
    state = ask(LocalSession(), model_server.state_query(host))
    assert state.unit == "[Unit]\nDescription=x\n" and state.env_mode == "640" and state.record is None


def test_model_server_state_without_the_marker_is_a_plan_error(tmp_path):
    with pytest.raises(model_server.PlanError, match="could not read the unit's state"):
        model_server.state_query(Host(tmp_path)).parse("h", "bash: sha256sum: command not found\n")


# ---- sgl-kernel build state ----------------------------------------------------------------------------------------
def test_kernel_tree_on_the_real_h200_output(tmp_path):
    # captured before the probe named the kernel directory (`@@dir`) and sent pyproject/CMakeLists texts
    query = sgl_kernel.tree_query(Host(tmp_path), "d69f9c799e93")
    found = query.parse("h200", build_rows("upgrade", query.step)[-1]["output"])
    assert found["tree"] == "963828444b15370e9d6dd1629f16921da2eda7e8"
    assert json.loads(found["installed"])["archs"] == ["sm_90a"]


def test_kernel_tree_run_here(tmp_path):
    host = Host(tmp_path)
    co = Path(host.sglang_checkout)
    (co / "sgl-kernel").mkdir(parents=True)
    (co / "sgl-kernel" / "pyproject.toml").write_text('[project]\nname = "sgl-kernel"\nversion = "0.3.1"\n')
    (co / "sgl-kernel" / "CMakeLists.txt").write_text("project(x)\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(co)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "k"], check=True)
    tree = subprocess.run([*git, "rev-parse", "HEAD:sgl-kernel"], capture_output=True, text=True).stdout.strip()
    found = ask(LocalSession(), sgl_kernel.tree_query(host, full=True))
    assert (found["dir"], found["tree"]) == ("sgl-kernel", tree)
    assert 'version = "0.3.1"' in found["pyproject"] and found["cmake"].strip() == "project(x)"
    assert found["installed"].strip() == found["record"].strip() == ""
    short = ask(LocalSession(), sgl_kernel.tree_query(host))
    assert "pyproject" not in short and short["tree"] == tree


# ---- detached jobs -------------------------------------------------------------------------------------------------
def test_detached_poll_on_the_real_h200_output():
    job = detached.Job.for_key("k" * 64)
    polls = [detached.poll_query(job, 0).parse("h200", r["output"]) for r in build_rows("cmake-args", "detached follow")
             if r["output"]]
    assert polls and polls[-1][0] == 0 and polls[-1][1] == "finished"
    assert detached.poll_query(job, 0).parse("h200", "[gpufleet] connection lost\n") is None


def test_detached_state_on_the_real_h200_output():
    job = detached.Job.for_key("k" * 64)
    states = [detached.state_query(job).parse("h200", r["output"]) for r in build_rows("as-is", "detached state")]
    assert states and all(s.status in ("running", "finished", "absent") for s in states)


def test_detached_poll_and_state_run_here(tmp_path):
    job = detached.Job("gpufleet-test-none", str(tmp_path))
    Path(job.log).write_text("one\ntwo\n")
    session = LocalSession(fake_systemctl(tmp_path, "exit 3\n"))
    assert ask(session, detached.poll_query(job, 4)) == (None, "absent", 8, "two\n")
    assert ask(session, detached.state_query(job)) == detached.State("absent")
    Path(job.rc_file).write_text("0\n")
    assert ask(session, detached.poll_query(job, 8)) == (0, "finished", 8, "")
    assert ask(session, detached.state_query(job)) == detached.State("finished", 0)


def test_query_is_plain_data():
    q = Query(push.check_command([]), lambda host, output: output.split(), "s")
    assert q.parse("h", "a b") == ["a", "b"] and q.timeout is None and q.check is False
