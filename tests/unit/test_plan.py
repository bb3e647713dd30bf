"""Plan data: steps and Unchanged entries as JSON, abbreviated commands, the role order."""

from __future__ import annotations

from gpufleet.engine.command import Cmd, Secret
from gpufleet.errors import GpufleetError
from gpufleet.plan import PlanError, Step, Unchanged, Upload, brief


def test_step_json_names_commands_checks_and_uploads():
    step = Step(role="torch", title="install torch 2", reason="venv has 1", commands=(Cmd.of("pip", "install", "t"),),
                needed=Cmd.of("need"), verify=(Cmd.of("check", Secret("pw")),), changes=("venv",),
                uploads=(Upload("https://x/w.whl", "ab" * 32, "/var/cache/w.whl"),))
    assert step.to_json() == {
        "kind": "step", "role": "torch", "title": "install torch 2", "reason": "venv has 1",
        "commands": ["pip install t"], "needed": "need", "verify": ["check ********"], "changes": ["venv"],
        "uploads": [{"url": "https://x/w.whl", "sha256": "ab" * 32, "remote": "/var/cache/w.whl"}]}


def test_step_defaults_match_the_architecture():
    step = Step(role="r", title="t", reason="why", commands=())
    assert (step.needed, step.verify, step.timeout, step.changes, step.uploads) == (None, (), None, (), ())


def test_unchanged_json():
    assert Unchanged("torch", "already there").to_json() == {"kind": "unchanged", "role": "torch",
                                                             "reason": "already there"}


def test_brief_abbreviates_scripts_and_long_arguments_only():
    cmd = Cmd.of("python", "-c", "import a\nimport b\n", "x" * 150, "short", env={"A": "1"}, cwd="/")
    assert brief(cmd) == "cd / && env A=1 python -c <script, 2 lines> <150-character argument> short"
    assert brief(Cmd.of("echo", Secret("pw"))) == "echo ********"


def test_plan_error_names_host_and_role():
    err = PlanError("gpu1", "torch", "no pip")
    assert isinstance(err, GpufleetError) and str(err) == "host gpu1: role torch cannot plan: no pip"


def test_roles_run_in_the_order_of_the_manual_procedure():
    from gpufleet.roles import ROLES

    assert [r.name for r in ROLES] == ["torch", "flashinfer", "locked-packages", "sglang-checkout", "sgl-kernel", "verify"]
    assert all(callable(r.plan) for r in ROLES)
