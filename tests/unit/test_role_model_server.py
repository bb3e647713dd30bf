"""The model-server planner with fake facts and probes: exact unit, diff, restart decision, secrets; its commands run here."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from gpufleet.testing.context import plan_context
from gpufleet.engine.command import MASK, Secret
from gpufleet.facts.checkout import CheckoutFacts
from gpufleet.facts.model import HostFacts
from gpufleet.facts.unit import UnitFacts
from gpufleet.config.inventory import Host, load_inventory
from gpufleet.facts.modelfiles import MARKER
from gpufleet.plan import PlanContext, PlanError, Step, Unchanged
from gpufleet.engine.ssh import Result
from gpufleet.config.stack import Stack, host_stacks, load_stack, stack_for_host
from gpufleet.roles import model_server as ms

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"torch": "2.9.1+cu130", "sglang": "0.5.9", "sgl-kernel": "0.3.16"}
DEFAULT_ARGV = [
    "/root/venv/bin/python", "-m", "sglang.launch_server",
    "--model-path", "/models/Qwen3.5-397B-A17B-NVFP4",
    "--served-model-name", "/models/Qwen3.5-397B-A17B-NVFP4",
    "--tp", "8", "--host", "0.0.0.0", "--port", "30000",
    "--quantization", "modelopt_fp4", "--attention-backend", "triton",
    "--moe-runner-backend", "flashinfer_cutlass", "--fp4-gemm-backend", "flashinfer_cudnn",
    "--kv-cache-dtype", "fp8_e4m3", "--mem-fraction-static", "0.85",
    "--disable-custom-all-reduce",
    "--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
    "--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder",
]
MODEL_OK = {"dir": "/models/Qwen3.5-397B-A17B-NVFP4", "exists": True, "config": True, "index": True, "shards": 3,
            "bytes": 6300, "missing": [], "empty": [], "bad": [], "error": None}


def example():
    inv = load_inventory(REPO / "hosts/example.toml")
    return inv, host_stacks(load_stack(REPO / "stack.toml"), inv)


def facts(*, active="active", enabled="enabled", packages=PACKAGES, head="a" * 40) -> HostFacts:
    return HostFacts(host="gpu1", python_version="3.12.3", packages=packages,
                     checkout=CheckoutFacts(path="/root/sglang-main", present=True, head=head, modified=["x.py"]),
                     unit=UnitFacts(systemd=True, present=active != "inactive", enabled=enabled, active=active))


class Probe:
    """Answers the role's two probes (model files, state); records the steps asked."""

    def __init__(self, *, unit: str | None = None, record: dict | None = None, env_sha=None, env_mode=None,
                 model=MODEL_OK, need_reload=False):
        self.unit, self.record, self.env_sha, self.env_mode = unit, record, env_sha, env_mode
        self.model, self.need_reload, self.asked = model, need_reload, []

    def __call__(self, cmd, step):
        self.asked.append(step)
        if step == "model files":
            return Result("gpu1", step, cmd.display(), 0, MARKER + json.dumps(self.model) + "\n", 0.0)
        lines = [f"need_reload={'yes' if self.need_reload else 'no'}"]
        if self.env_sha:
            lines += [f"env_sha={self.env_sha}", f"env_mode={self.env_mode}"]
        if self.record is not None:
            lines.append("record=" + json.dumps(self.record))
        body = "@@unit absent\n" if self.unit is None else "@@unit present\n" + self.unit
        return Result("gpu1", step, cmd.display(), 0, "\n".join(lines) + "\n" + body, 0.0)


def context(probe, *, host=None, stack=None, **fact_kw) -> PlanContext:
    return plan_context(host=host, stack=stack, facts=facts(**fact_kw), read=probe, repo=REPO)


def converged(**fact_kw) -> tuple[Probe, PlanContext]:
    """A host whose unit, record and state already match."""
    probe = Probe()
    ctx = context(probe, **fact_kw)
    probe.unit = ms.render_unit(ctx.host, ctx.stack, "3.12")
    probe.record = ms.stack_record(ctx, None)
    return probe, ctx


def steps(items) -> list[Step]:
    return [i for i in items if isinstance(i, Step)]


# ---- rendering ----------------------------------------------------------------------------------------------------

def test_exec_argv_for_the_defaults():
    inv, stacks = example()
    assert ms.exec_args(inv.hosts["gpu1"], stacks["gpu1"]) == DEFAULT_ARGV


def test_exec_argv_for_a_host_override():
    inv, stacks = example()
    argv = ms.exec_args(inv.hosts["gpu3"], stacks["gpu3"])
    want = list(DEFAULT_ARGV)
    want[want.index("triton")] = "flashinfer"
    want[want.index("0.85")] = "0.8"
    assert argv == want


def test_exec_argv_optional_flags_and_extra_args():
    over = {"model": {"served_name": "qwen3.5"},
            "server": {"context_length": 131072, "disable_custom_all_reduce": False, "reasoning_parser": None,
                       "speculative": {"algorithm": "EAGLE3", "draft_model_path": "/models/draft"},
                       "extra_args": ["--enable-torch-symm-mem", "--chat-template", "a b"]}}
    stack = stack_for_host(Stack(), over, source="hosts.toml", host="gpu1")
    argv = ms.exec_args(Host(name="gpu1", address="10.0.0.1", venv="/opt/v"), stack)
    assert argv[:3] == ["/opt/v/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--served-model-name") + 1] == "qwen3.5"
    assert argv[argv.index("--context-length") + 1] == "131072"
    assert "--disable-custom-all-reduce" not in argv and "--reasoning-parser" not in argv
    i = argv.index("--speculative-algorithm")
    assert argv[i:i + 10] == ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "3",
                              "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
                              "--speculative-draft-model-path", "/models/draft"]
    assert argv[-5:] == ["--tool-call-parser", "qwen3_coder", "--enable-torch-symm-mem", "--chat-template", "a b"]


def test_no_speculative_flags_when_off():
    stack = stack_for_host(Stack(), {"server": {"speculative": {"algorithm": "none"}}}, source="h.toml", host="g")
    assert not [a for a in ms.exec_args(Host(name="g", address="10.0.0.1"), stack) if "speculative" in a]


def test_unit_text_for_the_defaults():
    inv, stacks = example()
    text = ms.render_unit(inv.hosts["gpu1"], stacks["gpu1"], "3.12")
    exec_start = text.split("ExecStart=", 1)[1].split("\nRestart=", 1)[0]
    assert exec_start.split(" \\\n    ") == [
        "/root/venv/bin/python -m sglang.launch_server", "--model-path /models/Qwen3.5-397B-A17B-NVFP4",
        "--served-model-name /models/Qwen3.5-397B-A17B-NVFP4", "--tp 8", "--host 0.0.0.0", "--port 30000",
        "--quantization modelopt_fp4", "--attention-backend triton", "--moe-runner-backend flashinfer_cutlass",
        "--fp4-gemm-backend flashinfer_cudnn", "--kv-cache-dtype fp8_e4m3", "--mem-fraction-static 0.85",
        "--disable-custom-all-reduce", "--speculative-algorithm NEXTN", "--speculative-num-steps 3",
        "--speculative-eagle-topk 1", "--speculative-num-draft-tokens 4", "--reasoning-parser qwen3",
        "--tool-call-parser qwen3_coder"]
    env = [line for line in text.splitlines() if line.startswith("Environment")]
    assert env == [
        "Environment=CUDA_HOME=/usr/local/cuda",
        "Environment=PATH=/root/venv/bin:/usr/local/cuda/bin:/usr/bin:/bin",
        "Environment=LD_LIBRARY_PATH=/root/venv/lib/python3.12/site-packages/nvidia/cu13/lib:/usr/local/cuda/lib64",
        "Environment=SGLANG_ENABLE_JIT_DEEPGEMM=0",
        "Environment=SGLANG_ENABLE_SPEC_V2=True",
        "EnvironmentFile=-/etc/gpufleet/sglang.env",
    ]
    for line in ("Type=simple", "Restart=on-failure", "RestartSec=10", "TimeoutStartSec=7200",
                 "StandardOutput=journal", "StandardError=journal", "WantedBy=multi-user.target"):
        assert line in text.splitlines()
    assert "{{" not in text and "{%" not in text


def test_systemd_quoting():
    assert ms.sd_quote("--tp") == "--tp"
    assert ms.sd_quote("a b") == '"a b"'
    assert ms.sd_quote('say "hi"') == '"say \\"hi\\""'
    assert ms.sd_quote("100%") == '"100%%"'
    assert ms.sd_quote("$HOME/x") == '"$$HOME/x"'
    assert ms.sd_quote("$HOME", expand=False) == '"$HOME"'
    assert ms.sd_quote("a\\b") == '"a\\\\b"'
    assert ms.sd_quote(";") == '";"'
    assert ms.sd_quote("") == '""'


def test_stack_env_overrides_the_base_environment():
    stack = stack_for_host(Stack(), {"server": {"env": {"CUDA_HOME": "/opt/cuda", "A": "x y"}}}, source="h",
                           host="g")
    env = ms.environment(Host(name="g", address="10.0.0.1"), stack, "3.11")
    assert env["CUDA_HOME"] == "/opt/cuda" and env["A"] == "x y"
    assert 'Environment="A=x y"' in ms.render_unit(Host(name="g", address="10.0.0.1"), stack, "3.11")


def test_env_file_text_and_refusals():
    assert ms.env_file_text({"HF_TOKEN": "hf_abc"}).endswith("HF_TOKEN='hf_abc'\n")
    with pytest.raises(ValueError):
        ms.env_file_text({"HF_TOKEN": "a'b"})


def test_diff_shows_changed_lines_and_is_empty_when_equal():
    inv, stacks = example()
    old = ms.render_unit(inv.hosts["gpu1"], stacks["gpu1"], "3.12")
    new = ms.render_unit(inv.hosts["gpu3"], stacks["gpu3"], "3.12")
    diff = ms.unit_diff(old, new, "/etc/systemd/system/sglang.service")
    assert "-    --attention-backend triton \\\n" in diff and "+    --attention-backend flashinfer \\\n" in diff
    assert "--- /etc/systemd/system/sglang.service (on host)" in diff
    assert ms.unit_diff(new, new, "/x") == ""
    assert ms.unit_diff(None, new, "/x").startswith("--- /dev/null")


# ---- planning -----------------------------------------------------------------------------------------------------

def test_fresh_host_installs_enables_and_starts_once_at_the_end():
    probe = Probe()
    items = ms.ModelServer().plan(context(probe, active="inactive", enabled="not-found"))
    assert isinstance(items[0], Unchanged) and "3 shard(s)" in items[0].reason
    titles = [s.title for s in steps(items)]
    assert titles == ["install /etc/systemd/system/sglang.service", "enable sglang.service at boot",
                      "start sglang.service"]
    install, enable, start = steps(items)
    assert "+ExecStart=/root/venv/bin/python -m sglang.launch_server \\" in install.reason
    assert install.changes == ("unit",) and install.needed is not None and install.verify
    assert start.reason == "the unit changed"
    assert probe.asked == ["model files", "model-server state"]


def test_converged_host_changes_nothing():
    probe, ctx = converged()
    items = ms.ModelServer().plan(ctx)
    assert steps(items) == []
    assert items[-1] == Unchanged("model-server", "sglang.service is active on the stack it was started on: "
                                                  "no restart")


def test_changed_flag_updates_the_unit_and_restarts():
    probe, ctx = converged()
    ctx.stack = stack_for_host(Stack(), {"server": {"attention_backend": "flashinfer"}}, source="h", host="gpu1")
    update, restart = steps(ms.ModelServer().plan(ctx))
    assert update.title == "update /etc/systemd/system/sglang.service"
    assert "+    --attention-backend flashinfer \\" in update.reason
    assert restart.title == "restart sglang.service" and restart.reason == "the unit changed"


def test_stack_change_under_the_server_restarts_it_and_says_what_changed():
    probe, ctx = converged()
    ctx.facts = facts(packages={**PACKAGES, "torch": "2.12.0.dev20260307+cu130"}, head="b" * 40)
    [restart] = steps(ms.ModelServer().plan(ctx))
    assert restart.title == "restart sglang.service"
    assert "torch 2.9.1+cu130 -> 2.12.0.dev20260307+cu130" in restart.reason
    assert "sglang checkout aaaaaaaaaa -> bbbbbbbbbb" in restart.reason
    # the restart records the stack it starts on: the next plan sees no change
    record = json.loads(restart.commands[0].argv[-1])
    assert record == ms.stack_record(ctx, None)


def test_restart_signal_from_earlier_roles():
    probe, ctx = converged()
    [restart] = steps(ms.ModelServer(restart_needed=True).plan(ctx))
    assert "earlier steps of this run changed the stack" in restart.reason
    venv_step = Step(role="torch", title="t", reason="r", commands=(), changes=("venv",))
    unit_step = Step(role="x", title="t", reason="r", commands=(), changes=("unit",))
    assert ms.stack_changed([venv_step]) and not ms.stack_changed([unit_step, Unchanged("torch", "ok")])


def test_failed_service_is_started_without_other_changes():
    probe, ctx = converged(active="failed")
    [start] = steps(ms.ModelServer().plan(ctx))
    assert start.title == "start sglang.service" and start.reason == "the service is failed"


def test_missing_record_or_stale_daemon_restarts():
    probe, ctx = converged()
    probe.record = None
    [restart] = steps(ms.ModelServer().plan(ctx))
    assert "no record of the stack" in restart.reason
    probe, ctx = converged()
    probe.need_reload = True
    [restart] = steps(ms.ModelServer().plan(ctx))
    assert "NeedDaemonReload" in restart.reason


def test_restart_reasons_table():
    base = dict(unit_changed=False, env_changed=False, need_reload=False, stack_changes=[], active="active",
                restart_needed=False)
    assert ms.restart_reasons(**base) == []
    assert ms.restart_reasons(**{**base, "env_changed": True}) == ["its environment file changed"]
    assert ms.restart_reasons(**{**base, "active": "inactive"}) == ["the service is inactive"]
    assert ms.restart_reasons(**{**base, "unit_changed": True, "stack_changes": ["torch a -> b"]}) == [
        "the unit changed"]


def test_secret_goes_to_a_0600_env_file_and_never_into_the_plan():
    token = "hf_SECRETtoken123"
    probe, ctx = converged()
    items = ms.ModelServer(secrets={"HF_TOKEN": token}).plan(ctx)
    env_step, restart = steps(items)
    assert env_step.title == "write /etc/gpufleet/sglang.env (HF_TOKEN, mode 0600)"
    assert restart.reason == "its environment file changed"
    assert any(isinstance(p, Secret) for p in env_step.commands[0].argv)
    shown = json.dumps([i.to_json() for i in items]) + "".join(str(c) for c in env_step.commands)
    assert token not in shown and MASK in shown
    # same content, right mode: unchanged; wrong mode: rewritten
    probe.env_sha, probe.env_mode = ms.sha256(ms.env_file_text({"HF_TOKEN": token})), "600"
    assert steps(ms.ModelServer(secrets={"HF_TOKEN": token}).plan(ctx)) == []
    probe.env_mode = "644"
    [fix, _] = steps(ms.ModelServer(secrets={"HF_TOKEN": token}).plan(ctx))
    assert "mode 644" in fix.reason


def test_missing_shard_stops_planning_before_anything_else():
    model = {**MODEL_OK, "shards": 2, "missing": ["model-00002-of-00003.safetensors"]}
    probe = Probe(model=model)
    with pytest.raises(PlanError) as err:
        ms.ModelServer().plan(context(probe))
    assert "model-00002-of-00003.safetensors" in str(err.value) and "--download" in str(err.value)
    assert probe.asked == ["model files"]


def test_download_step_when_asked():
    probe = Probe(model={**MODEL_OK, "config": False})
    items = ms.ModelServer(download=True, secrets={"HF_TOKEN": "hf_x"}).plan(context(probe))
    dl = items[0]
    assert isinstance(dl, Step) and dl.title.startswith("download nvidia/Qwen3.5-397B-A17B-NVFP4 to /models/")
    assert "config.json missing" in dl.reason and dl.needed is not None and dl.verify
    assert "hf_x" not in dl.commands[0].display() and "hf_x" in dl.commands[0].render()


def test_unknown_python_version_is_a_plan_error():
    probe = Probe()
    ctx = context(probe)
    ctx.facts = ctx.facts.model_copy(update={"python_version": None})
    with pytest.raises(PlanError, match="Python version"):
        ms.ModelServer().plan(ctx)


def test_parse_state():
    state = ms.parse_state("env_sha=abc\nenv_mode=600\nneed_reload=no\nrecord={\"a\": 1}\n@@unit present\n[Unit]\nX=1\n")
    assert state == ms.HostState(unit="[Unit]\nX=1\n", env_sha="abc", env_mode="600", record={"a": 1})
    assert ms.parse_state("@@unit absent\n").unit is None
    assert ms.parse_state("record={broken\n@@unit absent\n").record is None
    with pytest.raises(ValueError):
        ms.parse_state("bash: error")


# ---- the role's commands, run here with bash --------------------------------------------------------------------

def _sh(cmd) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", cmd.render()], capture_output=True, text=True)


def test_write_needed_and_verify_commands_work(tmp_path):
    path = str(tmp_path / "sub" / "sglang.env")
    text = "HF_TOKEN='hf_x'\n"
    digest = ms.sha256(text)
    assert _sh(ms._differs_cmd(path, digest, "600")).returncode == 0  # absent: needed
    assert _sh(ms._write_cmd(path, Secret(text), "600")).returncode == 0
    assert Path(path).read_text() == text and oct(os.stat(path).st_mode & 0o777) == "0o600"
    assert _sh(ms._differs_cmd(path, digest, "600")).returncode == 1  # done
    assert _sh(ms._matches_cmd(path, digest, "600")).returncode == 0
    os.chmod(path, 0o644)
    assert _sh(ms._differs_cmd(path, digest, "600")).returncode == 0
    assert _sh(ms._matches_cmd(path, digest, "600")).returncode == 1


def test_state_probe_reads_files(tmp_path):
    unit, env = tmp_path / "u.service", tmp_path / "e.env"
    unit.write_text("[Unit]\nDescription=x")  # no trailing newline
    env.write_text("A=1\n")
    env.chmod(0o600)
    cmd = ms.Cmd.of("bash", "-c", ms._STATE_PROBE, "state", str(unit), str(env), str(tmp_path / "none.json"),
                    str(tmp_path / "none2.json"), "gpufleet-test-none.service")
    state = ms.parse_state(_sh(cmd).stdout)
    assert state.unit == "[Unit]\nDescription=x" and state.env_mode == "600" and state.env_sha == ms.sha256("A=1\n")
    assert state.record is None and state.kernel_sha is None


def test_a_converged_hosts_plan_renders_no_unit_once_its_sha256_is_remembered(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUFLEET_CACHE_DIR", str(tmp_path))
    probe, ctx = converged()
    ms.unit_sha256(ctx.host, ctx.stack, "3.12")  # what an earlier status or plan remembered

    def no_render():
        raise AssertionError("rendered a unit the host already has")

    monkeypatch.setattr(ms, "unit_template", no_render)
    assert steps(ms.ModelServer().plan(ctx)) == []
    probe.unit = probe.unit.replace("RestartSec=10", "RestartSec=20")  # edited on the host: rendered for the diff
    with pytest.raises(AssertionError, match="rendered a unit"):
        ms.ModelServer().plan(ctx)
