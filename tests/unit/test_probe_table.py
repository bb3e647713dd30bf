"""The probe's tables and its stand-in server's backend behaviour file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from gpufleet.probe.candidates import Candidate, Outcome
from gpufleet.probe.view import candidates_table, outcomes_table

PAYLOAD = Path(__file__).resolve().parents[2] / "gpufleet/sim/payload/sglang/python"


def text(table) -> str:
    console = Console(width=250, record=True, highlight=False)
    console.print(table)
    return console.export_text()


def test_outcomes_table_marks_the_fastest_correct_and_says_why_others_lost():
    good = Outcome(Candidate("triton", "fc", "cutlass", None), "correct", tokens_per_second=356.04, load_seconds=1.2)
    outs = [Outcome(Candidate("triton", "fc", "cudnn", "NEXTN"), "correct", tokens_per_second=97.1, load_seconds=1.0),
            Outcome(Candidate("triton", "fc", "cudnn", None), "failed", reason="RuntimeError: [cudnn] no engine"),
            good, Outcome(Candidate("flashinfer", "fc", "cudnn", None), "wrong", reason="'Paris' not in '!!'",
                          tokens_per_second=800.0, load_seconds=1.1)]
    lines = text(outcomes_table("gpu1", outs, good)).splitlines()
    [row] = [line for line in lines if "<- fastest correct" in line]
    assert "cutlass" in row and "356.0" in row and "1.2 s" in row and " off " in row
    assert any("FAILED to start" in line and "RuntimeError: [cudnn] no engine" in line for line in lines)
    assert any("WRONG" in line and "'Paris' not in '!!'" in line and "800.0" in line for line in lines)


def test_candidates_table_counts_and_marks_production():
    cands = [Candidate("triton", "fc", "cudnn", "NEXTN"), Candidate("triton", "fc", "cudnn", None)]
    out = text(candidates_table("gpu1", cands, cands[0]))
    assert "2 candidate backend set(s)" in out and out.count("production now") == 1


def stand_in():
    sys.path.insert(0, str(PAYLOAD))
    try:
        from sglang import launch_server
    finally:
        sys.path.remove(str(PAYLOAD))
    return launch_server


def test_stand_in_parses_the_real_flags_and_applies_rules_in_order(tmp_path):
    ls = stand_in()
    args, _ = ls.parse_args(["--model-path", "/m", "--attention-backend", "flashinfer", "--moe-runner-backend", "fc",
                             "--fp4-gemm-backend", "cudnn", "--speculative-algorithm", "NEXTN",
                             "--speculative-num-steps", "3"])
    assert ls.backend_values(args) == {"attention_backend": "flashinfer", "moe_runner_backend": "fc",
                                       "fp4_gemm_backend": "cudnn", "speculative_algorithm": "NEXTN"}
    rules = tmp_path / "backends.json"
    rules.write_text(json.dumps({"default": {"tokens_per_second": 100, "load_seconds": 2}, "rules": [
        {"when": {"attention_backend": "flashinfer"}, "wrong_answers": True, "tokens_per_second": 500},
        {"when": {"attention_backend": "flashinfer", "speculative_algorithm": "none"}, "fail_start": "boom"}]}))
    spec_on = ls.Behaviour.of(args, str(rules))
    assert (spec_on.tokens_per_second, spec_on.load_seconds, spec_on.wrong_answers, spec_on.fail_start) == (
        500, 2, True, None)
    off, _ = ls.parse_args(["--model-path", "/m", "--attention-backend", "flashinfer"])
    assert ls.Behaviour.of(off, str(rules)).fail_start == "boom"
    assert ls.Behaviour.of(argparse.Namespace(**vars(off)), str(tmp_path / "absent.json")).tokens_per_second == ls.DEFAULT_TOKENS_PER_SECOND
