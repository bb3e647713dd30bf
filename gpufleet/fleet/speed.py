"""Decode speed of a host's server, measured as the backend probe times a candidate, and the roll's gate on it."""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass

from gpufleet.errors import GpufleetError
from gpufleet.fleet import health

GENERATION_TIMEOUT = 900.0  # as the probe's: a cold server may compile kernels on its first long generation


class SpeedError(GpufleetError):
    """The speed could not be measured (a generation failed or reported no usage)."""


@dataclass(frozen=True)
class Speed:
    """One measurement: completion tokens per second over the wall time of `concurrency` generations at once."""

    tokens_per_second: float
    concurrency: int
    max_tokens: int
    completion_tokens: int
    seconds: float

    def to_json(self) -> dict:
        return asdict(self)


def payload(model: str, prompt: str, max_tokens: int) -> dict:
    """The probe's throughput request (gpufleet/probe/on_host.py chat(..., ignore_eos=True)): deterministic, thinking
    off, and exactly max_tokens generated (sglang's ignore_eos), so two measurements time the same work."""
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, "chat_template_kwargs": {"enable_thinking": False}, "ignore_eos": True}


def measure(session, stack, model: str, address: str = "127.0.0.1") -> Speed:
    """The fastest of `speed_gate.rounds` rounds (a busy moment only ever slows a round down)."""
    rounds = [measure_round(session, stack, model, address) for _ in range(stack.speed_gate.rounds)]
    return max(rounds, key=lambda s: s.tokens_per_second)


def measure_round(session, stack, model: str, address: str = "127.0.0.1") -> Speed:
    """`speed_gate.concurrency` throughput generations at once on the host's server (over its SSH connection)."""
    probe, gate = stack.probe, stack.speed_gate
    body = payload(model, probe.throughput_prompt, probe.throughput_max_tokens)
    tokens: list[int] = []
    errors: list[str] = []

    def one() -> None:
        try:
            resp = health.request(session, stack.server.port, "POST", "/v1/chat/completions", body,
                                  address=address, timeout=GENERATION_TIMEOUT)
        except health._REQUEST_ERRORS as exc:
            errors.append(health._why(exc))
            return
        if resp.status != 200:
            errors.append(f"HTTP {resp.status}: {resp.body[:200].decode(errors='replace')}")
            return
        usage = ((resp.json() or {}).get("usage") or {}).get("completion_tokens")
        if not isinstance(usage, int) or usage <= 0:
            errors.append("the reply has no usage.completion_tokens")
            return
        tokens.append(usage)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(gate.concurrency)]
    began = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.monotonic() - began
    if errors:
        raise SpeedError(f"host {session.name}: measuring decode speed: {errors[0]}")
    total = sum(tokens)
    return Speed(round(total / seconds, 1) if seconds > 0 else 0.0, gate.concurrency, probe.throughput_max_tokens,
                 total, round(seconds, 2))


def slowdown_percent(before: Speed, after: Speed) -> float:
    """How much slower after is than before, in percent (negative: faster)."""
    if before.tokens_per_second <= 0:
        return 0.0
    return round(100.0 * (before.tokens_per_second - after.tokens_per_second) / before.tokens_per_second, 1)


def verdict(before: Speed, after: Speed, max_slowdown: float) -> str | None:
    """None when after is within max_slowdown percent of before; else why the gate fails."""
    if before.concurrency != after.concurrency or before.max_tokens != after.max_tokens:
        return (f"the two measurements differ in shape (concurrency {before.concurrency} vs {after.concurrency}, "
                f"max_tokens {before.max_tokens} vs {after.max_tokens})")
    slower = slowdown_percent(before, after)
    if slower > max_slowdown:
        return (f"decode speed fell from {before.tokens_per_second} to {after.tokens_per_second} tokens/s "
                f"({slower}% slower; the gate allows {max_slowdown}%)")
    return None
