"""Backend probe planning: candidate backend sets from [probe], their stacks and argv, judging and choosing."""

from __future__ import annotations

import itertools
import re
from dataclasses import asdict, dataclass, field

from gpufleet.roles.model_server import exec_args

# Outcomes of one candidate.
CORRECT, WRONG, FAILED, TIMEOUT, ERROR = "correct", "wrong", "failed", "timeout", "error"


@dataclass(frozen=True)
class Candidate:
    """One backend set: attention, MoE runner, FP4 GEMM backend, speculative decoding algorithm (None: off)."""

    attention: str
    moe: str
    fp4: str
    speculative: str | None

    @property
    def spec_label(self) -> str:
        return self.speculative or "off"

    @property
    def label(self) -> str:
        return f"{self.attention}/{self.moe}/{self.fp4}/spec {self.spec_label}"

    def to_json(self) -> dict:
        return {"attention_backend": self.attention, "moe_runner_backend": self.moe, "fp4_gemm_backend": self.fp4,
                "speculative_algorithm": self.speculative or "none"}


def speculative_on(host_stack, base_stack):
    """What "speculative on" means for a host: its [server.speculative], else stack.toml's; None when both are off.

    A host whose earlier probe chose "off" has algorithm "none" in its overrides; falling back to stack.toml's
    section keeps "on" a candidate for the next probe."""
    for stack in (host_stack, base_stack):
        if stack is not None and stack.server.speculative.algorithm:
            return stack.server.speculative
    return None


def candidates(host_stack, base_stack=None) -> tuple[list[Candidate], list[str]]:
    """The cartesian product of [probe]'s lists, in config order; notes say what was left out and why."""
    probe = host_stack.probe
    on = speculative_on(host_stack, base_stack)
    notes, specs = [], []
    for flag in probe.speculative:
        if flag and on is None:
            notes.append("speculative on left out: neither the host nor stack.toml configures an algorithm")
        else:
            specs.append(on.algorithm if flag else None)
    found = [Candidate(a, m, f, s) for a, m, f, s in itertools.product(
        probe.attention_backends, probe.moe_runner_backends, probe.fp4_gemm_backends, specs)]
    return found, notes


def candidate_stack(host_stack, candidate: Candidate, base_stack=None):
    """The host's stack with the candidate's backends in [server] and the probe's health deadline."""
    server = host_stack.server
    if candidate.speculative is None:
        spec = server.speculative.model_copy(update={"algorithm": None})
    else:
        spec = speculative_on(host_stack, base_stack)
    server = server.model_copy(update={
        "attention_backend": candidate.attention, "moe_runner_backend": candidate.moe,
        "fp4_gemm_backend": candidate.fp4, "speculative": spec, "health_timeout": host_stack.probe.health_timeout})
    return host_stack.model_copy(update={"server": server})


def launch_argv(host, host_stack, candidate: Candidate, base_stack=None) -> list[str]:
    """The candidate's server argv: the model-server role's own, with the backend fields overridden."""
    return exec_args(host, candidate_stack(host_stack, candidate, base_stack))


def current_candidate(host_stack) -> Candidate:
    """The backend set the host's production server is configured with."""
    s = host_stack.server
    return Candidate(s.attention_backend, s.moe_runner_backend, s.fp4_gemm_backend, s.speculative.algorithm)


@dataclass
class Outcome:
    """What one candidate did: outcome, why, throughput and load time, the answers it gave."""

    candidate: Candidate
    outcome: str = "pending"  # correct | wrong | failed | timeout | error
    reason: str = ""
    tokens_per_second: float | None = None
    load_seconds: float | None = None
    answers: list[dict] = field(default_factory=list)
    unit: str = ""

    @property
    def correct(self) -> bool:
        return self.outcome == CORRECT

    def to_json(self) -> dict:
        data = asdict(self)
        data["candidate"] = self.candidate.to_json()
        data["label"] = self.candidate.label
        return data


def judge(prompts, answers: list[str]) -> tuple[bool, str]:
    """Correct when every expected substring is in its answer (case-insensitive); else which ones were missed."""
    missed = [f"{p.expect!r} not in {_short(a)!r}" for p, a in zip(prompts, answers)
              if p.expect.lower() not in a.lower()]
    missed += [f"no answer to {p.prompt[:40]!r}" for p in prompts[len(answers):]]
    if not missed:
        return True, ""
    return False, missed[0] + (f" (+{len(missed) - 1} more of {len(prompts)})" if len(missed) > 1 else "")


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def tokens_per_second(completion_tokens: int | None, seconds: float) -> float | None:
    """Completion tokens (from the reply's usage) over the generation's wall time; None when unknown."""
    if not completion_tokens or seconds <= 0:
        return None
    return round(completion_tokens / seconds, 1)


def choose(outcomes: list[Outcome]) -> Outcome | None:
    """The fastest correct candidate (the first listed among equals); None when none was correct."""
    best = None
    for out in outcomes:
        if out.correct and (best is None or (out.tokens_per_second or 0) > (best.tokens_per_second or 0)):
            best = out
    return best


_ERROR_LINE = re.compile(r"\b(\w+(Error|Exception)|CUDA error|Assertion|error)\b[:\s]", re.IGNORECASE)


def failure_reason(journal: str, limit: int = 160) -> str:
    """The line of a failed launch's journal that says why: the last error-like line, else the last line."""
    lines = [line.strip() for line in journal.splitlines() if line.strip() and not line.startswith("-- ")]
    # journalctl prefixes "Dec 03 01:51:52 host ident[pid]: "; the message is what follows.
    messages = [re.sub(r"^\w{3} \d\d \d\d:\d\d:\d\d \S+ [^:]+: ", "", line) for line in lines]
    for message in reversed(messages):
        if _ERROR_LINE.search(message) and "sigquit" not in message.lower():
            return message[:limit]
    return (messages[-1] if messages else "no output")[:limit]


def settings_changes(chosen: Candidate, host_stack, base_stack=None) -> dict[str, str]:
    """The [hosts.<h>.stack.server] keys (dotted) that must change so the host runs chosen; empty when it does."""
    now = current_candidate(host_stack)
    changes = {}
    for key, old, new in (("attention_backend", now.attention, chosen.attention),
                          ("moe_runner_backend", now.moe, chosen.moe),
                          ("fp4_gemm_backend", now.fp4, chosen.fp4),
                          ("speculative.algorithm", now.speculative, chosen.speculative)):
        if old != new:
            changes[key] = new if new is not None else "none"
    return changes
