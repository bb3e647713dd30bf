"""`inv deploy-model`: check the model files, install or update the SGLang unit, restart on change, prove it healthy."""

from __future__ import annotations

import sys

from gpufleet.cli import render
from gpufleet.fleet.executor import HostReport, Executor
from gpufleet.cli.common import exit_code
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.cli.target import Target
from gpufleet.engine.command import mask
from gpufleet.fleet.hoststate import RunInfo
from gpufleet.fleet.procedures import Deployed, deploy_one
from gpufleet.engine.output import emit
from gpufleet.plan import Step
from gpufleet.engine.runner import Opened, for_each_host
from gpufleet.roles.model_server import ModelServer

WORDS = {"planned": "will change", "unchanged": "unchanged", "done-already": "already done", "changed": "changed",
         "verified": "verified", "failed": "FAILED", "running": "interrupted", "skipped": "skipped",
         "refused": "refused"}


def deploy_model(target: Target, opened: Opened | None = None) -> int:
    """Deploy the model server on the selected hosts (or show the plan); 1 when any host failed.
    opened: the hosts' sessions opened ahead (engine.runner.open_ahead), with the task's hidden secrets."""
    hidden = target.hidden
    # With --json, stdout is the JSON document: live lines go to stderr.
    say = ((lambda line: emit(mask(line, hidden), sys.stderr)) if target.json
           else (lambda line: emit(mask(line, hidden))))
    run = Executor(roles=[ModelServer(secrets=target.secrets, download=target.download)],
                   run=RunInfo.current(target.command), repo=fleet_dir(), dry_run=target.dry_run, say=say,
                   command_timeout=target.inventory.settings.command_timeout,
                   snapshots_keep=target.inventory.settings.snapshots_keep)

    def work(session) -> Deployed:
        return deploy_one(run, session, target.stacks[session.name], say)

    outcomes = for_each_host(list(target.hosts), target.inventory, work, secrets=hidden, opened=opened)
    results = [o.value if o.ok else Deployed(HostReport(o.host, target.dry_run, outcome=o.kind, error=o.error))
               for o in outcomes]
    if target.json:
        render.print_json([r.to_json() for r in results])
    else:
        for line in report_lines(results):
            emit(mask(line, hidden))
    return exit_code(r.report.outcome for r in results)


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
