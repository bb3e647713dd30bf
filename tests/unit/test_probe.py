"""The backend probe's planner: candidates from [probe], their argv, judging, choosing, what --apply writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufleet.errors import ConfigError
from gpufleet.config.inventory import Host
from gpufleet.probe.candidates import (Candidate, Outcome, candidate_stack, candidates, choose, current_candidate,
                            failure_reason, judge, launch_argv, settings_changes, tokens_per_second)
from gpufleet.config.stack import KnownAnswer, Stack, load_stack, stack_for_host
from gpufleet.roles.model_server import exec_args

REPO = Path(__file__).resolve().parents[2]
HOST = Host(name="gpu1", address="10.0.0.1")


def stack(**probe) -> Stack:
    return stack_for_host(Stack(), {"probe": probe}, source="/inv/hosts.toml", host="gpu1") if probe else Stack()


def flag(argv: list[str], name: str) -> str | None:
    return argv[argv.index(name) + 1] if name in argv else None


def test_default_candidates_are_the_product_in_config_order():
    found, notes = candidates(Stack())
    assert len(found) == 2 * 1 * 2 * 2 and notes == []
    assert found[0] == Candidate("triton", "flashinfer_cutlass", "flashinfer_cudnn", "NEXTN") == current_candidate(Stack())
    assert found[1].speculative is None and found[-1] == Candidate("flashinfer", "flashinfer_cutlass",
                                                                   "flashinfer_cutlass", None)
    assert len(set(found)) == len(found)


def test_repo_stack_toml_probe_section_is_valid_and_matches_the_defaults():
    assert load_stack(REPO / "stack.toml").probe == Stack().probe


def test_argv_is_the_roles_own_with_backends_overridden():
    base = Stack()
    off = Candidate("flashinfer", "triton", "flashinfer_cutlass", None)
    argv = launch_argv(HOST, base, off)
    assert (flag(argv, "--attention-backend"), flag(argv, "--moe-runner-backend"),
            flag(argv, "--fp4-gemm-backend")) == ("flashinfer", "triton", "flashinfer_cutlass")
    assert "--speculative-algorithm" not in argv and "--speculative-num-steps" not in argv
    assert argv == exec_args(HOST, candidate_stack(base, off))
    on = launch_argv(HOST, base, Candidate("triton", "flashinfer_cutlass", "flashinfer_cudnn", "NEXTN"))
    assert on == exec_args(HOST, base)  # the production set's argv is exactly the production unit's
    assert candidate_stack(stack(health_timeout=42), off).server.health_timeout == 42


def test_speculative_on_falls_back_to_stack_toml_when_the_host_turned_it_off():
    base = Stack()
    host = stack_for_host(base, {"server": {"speculative": {"algorithm": "none"}}}, source="x", host="gpu1")
    found, notes = candidates(host, base)
    assert {c.speculative for c in found} == {"NEXTN", None} and notes == []
    argv = launch_argv(HOST, host, found[0], base)
    assert flag(argv, "--speculative-algorithm") == "NEXTN"
    nowhere = stack_for_host(base, {"server": {"speculative": {"algorithm": "none"}}}, source="x", host="gpu1")
    found, notes = candidates(nowhere, nowhere)
    assert {c.speculative for c in found} == {None} and "speculative on left out" in notes[0]


def test_judge_needs_every_expected_answer_case_insensitively():
    prompts = [KnownAnswer(prompt="capital of France?", expect="Paris"), KnownAnswer(prompt="17+25?", expect="42")]
    assert judge(prompts, ["PARIS.", "It is 42"]) == (True, "")
    ok, why = judge(prompts, ["!!!! !!!!", "It is 42"])
    assert not ok and why == "'Paris' not in '!!!! !!!!'"
    ok, why = judge(prompts, ["London " * 20, "41"])
    assert not ok and why.endswith("(+1 more of 2)") and "..." in why
    assert judge(prompts, ["Paris"]) == (False, "no answer to '17+25?'")


def test_tokens_per_second_and_choice_of_the_fastest_correct():
    assert tokens_per_second(150, 0.5) == 300.0 and tokens_per_second(None, 1) is None
    assert tokens_per_second(10, 0) is None
    a, b, c, d = (Candidate("a", "m", "f", None), Candidate("b", "m", "f", None), Candidate("c", "m", "f", None),
                  Candidate("d", "m", "f", None))
    outs = [Outcome(a, "correct", tokens_per_second=100), Outcome(b, "wrong", tokens_per_second=900),
            Outcome(c, "correct", tokens_per_second=250), Outcome(d, "failed")]
    assert choose(outs).candidate == c
    assert choose([o for o in outs if o.candidate != c]).candidate == a
    assert choose([outs[1], outs[3]]) is None
    tie = [Outcome(a, "correct", tokens_per_second=5), Outcome(b, "correct", tokens_per_second=5)]
    assert choose(tie).candidate == a


def test_failure_reason_is_the_error_line_of_the_journal():
    journal = """Dec 03 01:51:52 gpu1 gpufleet-probe-ab-2[101]: [2026-12-03 01:51:52] server_args={...}
Dec 03 01:51:53 gpu1 gpufleet-probe-ab-2[101]:   File "sglang/srt/model_executor/model_runner.py", line 411
Dec 03 01:51:53 gpu1 gpufleet-probe-ab-2[101]: RuntimeError: CUDNN_STATUS_NOT_SUPPORTED: no engine
Dec 03 01:51:53 gpu1 gpufleet-probe-ab-2[101]: [2026-12-03] Received sigquit from a child process.
Dec 03 01:51:53 gpu1 systemd[1]: gpufleet-probe-ab-2.service: Main process exited, code=exited, status=1/FAILURE
"""
    assert failure_reason(journal) == "RuntimeError: CUDNN_STATUS_NOT_SUPPORTED: no engine"
    assert failure_reason("Dec 03 01:51:53 gpu1 x[1]: just stopped\n") == "just stopped"
    assert failure_reason("") == "no output"


def test_settings_changes_name_only_what_differs():
    base = Stack()
    assert settings_changes(current_candidate(base), base) == {}
    chosen = Candidate("triton", "flashinfer_cutlass", "flashinfer_cutlass", None)
    assert settings_changes(chosen, base) == {"fp4_gemm_backend": "flashinfer_cutlass",
                                              "speculative.algorithm": "none"}
    off = stack_for_host(base, {"server": {"speculative": {"algorithm": "none"}}}, source="x", host="gpu1")
    assert settings_changes(Candidate("flashinfer", "triton", "flashinfer_cudnn", "NEXTN"), off) == {
        "attention_backend": "flashinfer", "moe_runner_backend": "triton", "speculative.algorithm": "NEXTN"}


def test_outcome_json_names_the_candidate():
    data = Outcome(Candidate("a", "m", "f", None), "correct", tokens_per_second=3.0, load_seconds=1.5).to_json()
    assert data["candidate"] == {"attention_backend": "a", "moe_runner_backend": "m", "fp4_gemm_backend": "f",
                                 "speculative_algorithm": "none"}
    assert data["label"] == "a/m/f/spec off" and data["tokens_per_second"] == 3.0


# ---- config errors: one line naming file, field and value ------------------------------------------------------

@pytest.mark.parametrize("toml, field, words", [
    ('[probe]\nattention_backends = []\n', "probe.attention_backends", "at least one value"),
    ('[probe]\nfp4_gemm_backends = ["a", "b", "a"]\n', "probe.fp4_gemm_backends", "lists 'a' twice"),
    ('[probe]\nmoe_runner_backends = ["bad word"]\n', "probe.moe_runner_backends[0]", "single word"),
    ('[probe]\nspeculative = ["yes"]\n', "probe.speculative[0]", "valid boolean"),
    ('[probe]\nhealth_timeout = 0\n', "probe.health_timeout", "greater than 0"),
    ('[probe]\nprompts = []\n', "probe.prompts", "at least 1"),
    ('[[probe.prompts]]\nprompt = "2+2?"\nexpect = " "\n', "probe.prompts[0].expect", "must not be empty"),
    ('[[probe.prompts]]\nprompt = "2+2?"\n', "probe.prompts[0].expect", "required"),
    ('[probe]\nattention = ["triton"]\n', "probe.attention", "unknown key; allowed keys: attention_backends"),
])
def test_bad_probe_config_is_one_clear_error(tmp_path, toml, field, words):
    path = tmp_path / "stack.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as info:
        load_stack(path)
    text = str(info.value)
    assert str(path) in text and f"field {field!r}" in text and words in text and "\n" not in text


def test_bad_host_override_names_the_inventory_and_host():
    with pytest.raises(ConfigError) as info:
        stack_for_host(Stack(), {"probe": {"speculative": []}}, source="/inv/hosts.toml", host="gpu2")
    text = str(info.value)
    assert "/inv/hosts.toml" in text and "'gpu2'" in text and "probe.speculative" in text and "(got [])" in text
