"""The backend probe for people: one rich table per host (candidate, verdict and why, tokens/s, load time, choice)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpufleet.probe.candidates import CORRECT, Candidate, Outcome

VERDICT = {"correct": "[green]correct[/]", "wrong": "[red]WRONG[/]", "failed": "[red]FAILED to start[/]",
           "timeout": "[red]TIMEOUT[/]", "error": "[red]ERROR[/]", "pending": "[dim]not run[/]"}


def candidates_table(host: str, candidates: list[Candidate], current: Candidate | None = None) -> Table:
    """--dry-run: the candidates that would be tried, the production set marked."""
    table = Table(title=f"{host}: {len(candidates)} candidate backend set(s) (dry run: nothing started)")
    for col in ("#", "attention", "moe runner", "fp4 gemm", "speculative", ""):
        table.add_column(col)
    for i, c in enumerate(candidates, 1):
        table.add_row(str(i), c.attention, c.moe, c.fp4, c.spec_label, "production now" if c == current else "")
    return table


def _num(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:.1f}{unit}"


def outcomes_table(host: str, outcomes: list[Outcome], chosen: Outcome | None) -> Table:
    """The probe's result: verdict with its reason, tokens/s, load time, the chosen set marked."""
    table = Table(title=f"{host}: backend probe")
    for col in ("#", "attention", "moe runner", "fp4 gemm", "speculative", "result", "why", "tokens/s", "load"):
        table.add_column(col, justify="right" if col in ("#", "tokens/s", "load") else "left")
    table.add_column("")
    for i, out in enumerate(outcomes, 1):
        c = out.candidate
        why = "" if out.outcome == CORRECT else escape(out.reason)
        table.add_row(str(i), c.attention, c.moe, c.fp4, c.spec_label, VERDICT.get(out.outcome, out.outcome), why,
                      _num(out.tokens_per_second), _num(out.load_seconds, " s"),
                      "[bold green]<- fastest correct[/]" if out is chosen else "")
    return table
