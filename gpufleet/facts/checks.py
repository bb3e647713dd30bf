"""Checks of gathered facts against what the inventory expects, as plain sentences."""

from __future__ import annotations

from collections import Counter

from gpufleet.facts.model import HostFacts


def _capability(value: str) -> tuple[int, ...]:
    try:
        parts = [int(part) for part in value.strip().split(".")]
    except ValueError:
        return ()
    return tuple(parts + [0] * (2 - len(parts)))  # "12" means "12.0"


def gpu_problems(facts: HostFacts, count: int, compute_capability: str, name: str | None = None) -> list[str]:
    """Why a host's GPUs are not the expected count x model x compute capability; empty when they are."""
    host = facts.host
    if facts.gpus is None:
        reasons = [p for p in facts.problems if p.startswith("could not read GPUs")]
        return [f"host {host} has no readable GPUs" + (f" ({reasons[0]})" if reasons else "")]
    gpus = facts.gpus.gpus
    problems = []
    if len(gpus) != count:
        problems.append(f"host {host} has {len(gpus)} GPU{'s' if len(gpus) != 1 else ''}, inventory expects {count}")
    want = _capability(compute_capability)
    for gpu in gpus:
        if _capability(gpu.compute_capability) != want:
            problems.append(f"host {host} GPU {gpu.index} ({gpu.name}) has compute capability "
                            f"{gpu.compute_capability}, expected {compute_capability}")
        if name is not None and gpu.name != name:
            problems.append(f"host {host} GPU {gpu.index} is {gpu.name}, expected {name}")
    models = Counter(gpu.name for gpu in gpus)
    if len(models) > 1:
        mix = ", ".join(f"{n} x {model}" for model, n in models.most_common())
        problems.append(f"host {host} has mixed GPUs: {mix}")
    return problems
