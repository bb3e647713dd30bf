"""`inv deploy-model`: check the model files, install or update the SGLang unit, restart on change, prove it healthy."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

from gpufleet.cli import render
from gpufleet.fleet.executor import HostReport, Executor
from gpufleet.cli.common import REPO, command_line, load, selection
from gpufleet.engine.command import mask
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.fleet.health import Gate
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.engine.output import emit
from gpufleet.plan import Step
from gpufleet.engine.runner import for_each_host
from gpufleet.config.stack import host_stacks
from gpufleet.roles.model_server import ModelServer, served_name

WORDS = {"planned": "will change", "unchanged": "unchanged", "done-already": "already done", "changed": "changed",
         "verified": "verified", "failed": "FAILED", "running": "interrupted"}


@dataclass
class Deployed:
    """One host's deploy: the executor's report and what the health gate saw."""

    report: HostReport
    health: dict | None = None

    def to_json(self) -> dict:
        return {**self.report.to_json(), "health": self.health}


def read_hf_token(path: str | None) -> str | None:
    """The Hugging Face token: from the file --hf-token-file names, else $HF_TOKEN; None when neither is set."""
    if path:
        try:
            text = Path(path).expanduser().read_text()
        except OSError as exc:
            raise ConfigError(path, f"cannot read the Hugging Face token file: {exc.strerror}") from None
        if not text.strip():
            raise ConfigError(path, "the Hugging Face token file is empty")
    else:
        text = os.environ.get("HF_TOKEN", "")
    token = text.strip()
    if any(c.isspace() or c in "'\\\"" for c in token):
        where = path or "$HF_TOKEN"
        raise ConfigError(where, "the Hugging Face token must be one word (no spaces, quotes or backslashes)")
    return token or None


def deploy_model(inventory=None, stack=None, host=None, hosts=None, dry_run=False, as_json=False, download=False,
                 hf_token_file=None, accept_new_host_keys=False) -> int:
    """Deploy the model server on the selected hosts (or show the plan); 1 when any host failed."""
    inv, base = load(inventory, stack, accept_new_host_keys)
    chosen = selection(inv, host, hosts, default=None)  # no silent "all": a deploy restarts servers
    stacks = host_stacks(base, inv, chosen)
    token = read_hf_token(hf_token_file)
    secrets = {"HF_TOKEN": token} if token else {}
    hidden = tuple(secrets.values())
    # With --json, stdout is the JSON document: live lines go to stderr.
    say = (lambda line: emit(mask(line, hidden), sys.stderr)) if as_json else (lambda line: emit(mask(line, hidden)))
    run = Executor(roles=[ModelServer(secrets=secrets, download=download)],
                  run=RunInfo.current(command_line("deploy-model")), repo=REPO, dry_run=dry_run, say=say, command_timeout=inv.settings.command_timeout)

    def work(session) -> Deployed:
        return deploy_one(run, session, stacks[session.name], say)

    outcomes = for_each_host(chosen, inv, work, secrets=hidden)
    results = [o.value if o.ok else Deployed(HostReport(o.host, dry_run, outcome=o.kind, error=o.error))
               for o in outcomes]
    if as_json:
        render.print_json([r.to_json() for r in results])
    else:
        for line in report_lines(results):
            emit(mask(line, hidden))
    return 0 if all(r.report.ok for r in results) else 1


def deploy_one(run: Executor, session, host_stack, say) -> Deployed:
    """Apply the model-server role on one host, then (unless a dry run) prove it healthy; never raises."""
    done = Deployed(run.host(session, host_stack))
    if done.report.ok and not run.dry_run:
        say(f"[{session.name}] health: waiting for /health, then a smoke generation")
        try:
            done.health = Gate(session, host_stack, say=lambda line: say(f"[{session.name}] {line}")).run(
                served_name(session.host, host_stack))
            say(f"[{session.name}] health: ok, smoke answer {done.health['smoke_answer'][:80]!r}")
        except GpufleetError as exc:
            done.report.outcome, done.report.error = "failed", str(exc)
            done.report.next_step = f"read the journal: journalctl -u {session.host.service} on {session.name}"
    return done


def report_lines(results: list[Deployed]) -> list[str]:
    """Plain text for people: each host's items with their reasons (the unit's diff in full), health, a summary."""
    lines = []
    for done in results:
        r = done.report
        lines.append(f"== {r.host}: {r.outcome}{' (dry run)' if r.dry_run else ''}")
        for entry in r.entries:
            item = entry.item
            title = f"{item.role}: {item.title}" if isinstance(item, Step) else f"{item.role}: {item.reason}"
            lines.append(f"  [{WORDS.get(entry.status, entry.status)}] {title}")
            if isinstance(item, Step):
                lines += [f"      {line}" for line in item.reason.splitlines()]
        if done.health:
            lines.append(f"  health: /health 200 after {done.health['health_seconds']} s; smoke answer "
                         f"{done.health['smoke_answer'][:120]!r}")
        if r.lock_holder:
            lines.append(f"  locked by {r.lock_holder}: a run is changing it now; this plan may be out of date")
        if r.error:
            lines.append(f"  error: {r.error}")
        if r.next_step:
            lines.append(f"  next: {r.next_step}")
    failed = [d.report.host for d in results if not d.report.ok]
    changed = [d.report.host for d in results if d.report.with_status("changed", "planned")]
    verb = "would change" if results and results[0].report.dry_run else "changed"
    summary = f"{len(results)} host(s)" + (f", {verb} {', '.join(changed)}" if changed else ", nothing to change")
    lines.append(summary + (f", failed: {', '.join(failed)}" if failed else ""))
    return lines
