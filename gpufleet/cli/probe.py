"""`inv probe-backends`: try each candidate backend set on a host, pick the fastest correct one, leave it serving."""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path

from gpufleet.fleet import hoststate
from gpufleet.cli import render
from gpufleet.cli.fleetdir import fleet_dir
from gpufleet.cli.target import Target
from gpufleet.engine.command import mask
from gpufleet.errors import ConfigError, GpufleetError
from gpufleet.fleet.health import Gate
from gpufleet.fleet.hoststate import HostClaimedError, RunInfo
from gpufleet.config.inventory import load_inventory
from gpufleet.engine.output import emit
from gpufleet.probe.candidates import Candidate, Outcome, candidates, choose, current_candidate, launch_argv, settings_changes
from gpufleet.probe.inventory_write import write_host_server_keys
from gpufleet.probe.on_host import (HostProber, leftovers_cmd, production_state, production_unit, start_production,
                                   stop_production)
from gpufleet.probe.view import candidates_table, outcomes_table
from gpufleet.fleet.roll import runs_dir, utc_stamp
from gpufleet.engine.runner import session_for
from gpufleet.config.stack import host_stacks
from gpufleet.fleet.procedures import deploy_one
from gpufleet.roles.model_server import served_name


@dataclass
class HostProbe:
    """One host's probe: its candidates, what each did, the choice, and how the host was left."""

    host: str
    candidates: list[Candidate]
    notes: list[str] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    chosen: Outcome | None = None
    status: str = "pending"  # pending | running | completed | interrupted | locked | failed
    error: str | None = None
    applied: dict[str, str] | None = None  # the inventory keys --apply wrote (empty: the host already had them)
    left: str = ""  # how the host was left: serving what, proven how
    health: dict | None = None
    record: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "completed" and self.chosen is not None and self.error is None

    def to_json(self) -> dict:
        return {"host": self.host, "ok": self.ok, "status": self.status, "error": self.error,
                "candidates": len(self.candidates), "notes": self.notes,
                "results": [o.to_json() for o in self.outcomes],
                "chosen": self.chosen.to_json() if self.chosen else None, "applied": self.applied,
                "left": self.left, "health": self.health, "record": self.record}


@contextlib.contextmanager
def interrupts_deferred(say):
    """While the production server is put back, Ctrl-C only says so: a half-restored host serves nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, lambda *_: say("interrupt ignored: putting the production server back first"))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@dataclass
class ProbeRun:
    """One `inv probe-backends` run: config, flags, output, and the record directory."""

    inv: object
    base: object
    apply: bool
    secrets: dict[str, str]
    say: object
    command: str
    record_root: Path

    def save(self, report: HostProbe) -> None:
        """runs/<stamp>-probe-<host>/probe.json, rewritten after every candidate (a killed probe leaves it)."""
        path = Path(report.record)
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(report.to_json(), indent=2, default=str))
        tmp.replace(path)

    def host(self, host, host_stack) -> HostProbe:
        """Probe one host; every failure ends up in the report, never raised (Ctrl-C excepted)."""
        found, notes = candidates(host_stack, self.base)
        report = HostProbe(host.name, found, notes)
        folder = self.record_root / f"{utc_stamp()}-probe-{host.name}"
        folder.mkdir(parents=True, exist_ok=True)
        report.record = str(folder / "probe.json")
        self.save(report)
        try:
            with session_for(host, self.inv, tuple(self.secrets.values())) as session:
                self._locked(session, host_stack, report)
        except GpufleetError as exc:
            report.status = "failed" if report.status in ("pending", "running") else report.status
            report.error = report.error or str(exc)
        finally:
            if report.status == "running":
                report.status = "interrupted"
            self.save(report)
        return report

    def _locked(self, session, host_stack, report: HostProbe) -> None:
        run = RunInfo.current(self.command)
        try:
            hoststate.claim_host(session, run)
        except HostClaimedError as exc:
            report.status, report.error = "locked", str(exc)
            return
        try:
            self._probe(session, host_stack, report, run)
        finally:
            try:
                hoststate.release_claim(session, run)
            except GpufleetError as exc:  # must not hide what went wrong before
                self.say(f"[{session.name}] could not release the host lock: {exc}")

    def _probe(self, session, host_stack, report: HostProbe, run: RunInfo) -> None:
        say = _host_say(self.say, session.name)
        installed, active = production_state(session)
        unit = production_unit(session)
        if not installed:
            raise GpufleetError(f"host {session.name}: {unit} is not installed: run `inv deploy-model --host "
                                f"{session.name}` first (the probe uses its environment file and puts it back after)")
        was_active = active in ("active", "activating", "reloading")
        prober = HostProber(session, host_stack, self.base, run.token, say=say)
        report.status, finished = "running", False
        try:
            session.run(leftovers_cmd(), step="probe leftovers", timeout=120)
            stop_production(prober)
            total = len(report.candidates)
            for number, candidate in enumerate(report.candidates, 1):
                say(f"candidate {number}/{total}: {candidate.label}")
                out = prober.try_candidate(number, candidate)
                report.outcomes.append(out)
                say(f"candidate {number}/{total}: {out.outcome}"
                    + (f", {out.tokens_per_second} tokens/s, loaded in {out.load_seconds} s" if out.correct else
                       f": {out.reason}"))
                self.save(report)
            report.chosen = choose(report.outcomes)
            finished = True
        finally:
            with interrupts_deferred(say):
                self._leave_serving(session, host_stack, report, prober, finished, was_active, run, say)
        report.status = "completed"

    def _leave_serving(self, session, host_stack, report, prober, finished, was_active, run, say) -> None:
        """The host serves again whatever happened: the chosen set redeployed (--apply), else the original unit."""
        problems = []
        if prober.current_unit:  # interrupted mid-candidate, or its stop failed: one more try before anything else
            try:
                prober.stop(prober.current_unit)
                prober.current_unit = None
            except GpufleetError as exc:
                problems.append(f"could not stop {prober.current_unit}: {exc}")
        try:
            if finished and self.apply and report.chosen:
                self._apply(session, host_stack, report, say, run)
            else:
                if finished and self.apply:
                    say("no candidate gave every known answer: nothing written, the original server goes back")
                self._restore(session, host_stack, report, was_active, say)
        except GpufleetError as exc:
            problems.append(str(exc))
        if problems:
            report.error = ("\n".join(problems) + f"\nthe host may not be serving: check `systemctl status "
                            f"{production_unit(session)}` on {session.name}, then run `inv deploy-model --host "
                            f"{session.name}`")
        self.save(report)

    def _restore(self, session, host_stack, report: HostProbe, was_active: bool, say) -> None:
        unit = production_unit(session)
        if not was_active:
            report.left = f"{unit} left stopped, as the probe found it"
            say(report.left)
            return
        say(f"starting {unit} again (the original unit, unchanged) and proving it healthy")
        start_production(session)
        report.health = Gate(session, host_stack, say=say).run(served_name(session.host, host_stack))
        report.left = f"{unit} serving its original backends, healthy after {report.health['health_seconds']} s"
        say(report.left)

    def _apply(self, session, host_stack, report: HostProbe, say, run: RunInfo) -> None:
        """Write the chosen set into the host's inventory entry, then redeploy through deploy-model's path."""
        # Imported here: the executor is only needed by --apply (a probe without it never changes the host's stack).
        from gpufleet.fleet.executor import Executor
        from gpufleet.roles.model_server import ModelServer

        changes = settings_changes(report.chosen.candidate, host_stack, self.base)
        path = Path(self.inv.path)
        report.applied = changes
        if changes:
            before = path.read_text()
            write_host_server_keys(path, session.name, changes)
            try:
                new_inv = load_inventory(path)
                new_stack = host_stacks(self.base, new_inv, [new_inv.hosts[session.name]])[session.name]
            except (ConfigError, KeyError):
                path.write_text(before)  # never leave an inventory the next run cannot read
                raise
            say(f"wrote {', '.join(f'{k} = {v!r}' for k, v in changes.items())} into [hosts.{session.name}.stack."
                f"server] of {path}")
        else:
            new_stack = host_stack
            say(f"{session.name} is already configured with the fastest correct set: nothing to write")
        # the probe's host lock stays held through the redeploy: no other run can slip in between
        deployer = Executor(roles=[ModelServer(secrets=self.secrets)], run=run, repo=fleet_dir(), say=self.say,
                           command_timeout=self.inv.settings.command_timeout, host_lock_held=True)
        done = deploy_one(deployer, session, new_stack, self.say)
        if not done.report.ok:
            raise GpufleetError(f"host {session.name}: redeploy with the chosen backends failed: {done.report.error}")
        report.health = done.health
        report.left = (f"{production_unit(session)} redeployed with {report.chosen.candidate.label}, healthy after "
                       f"{done.health['health_seconds']} s")
        say(report.left)


def _host_say(say, host: str):
    return lambda line: say(f"[{host}] {line}")


def probe_backends(target: Target, *, apply: bool = False) -> int:
    """Probe the selected hosts one after another; 0 when each found a correct set (and --apply deployed it)."""
    # resolve() selected no silent "all" (a probe stops production servers), resolved each host's [probe] config
    # and, for --apply, read the token: bad input failed there, before any host is touched
    chosen, stacks, base, hidden, as_json = list(target.hosts), target.stacks, target.stack, target.hidden, target.json
    out = sys.stderr if as_json else sys.stdout

    def say(line: str) -> None:
        emit(mask(line, hidden), out)

    if target.dry_run:
        return _dry_run(chosen, stacks, base, as_json)
    run = ProbeRun(target.inventory, base, apply, target.secrets, say, target.command, runs_dir(fleet_dir() / "runs"))
    reports: list[HostProbe] = []
    try:
        for h in chosen:
            found, notes = candidates(stacks[h.name], base)
            probe = stacks[h.name].probe
            specs = len({c.speculative for c in found})
            say(f"[{h.name}] {len(found)} candidate backend set(s): {len(probe.attention_backends)} attention x "
                f"{len(probe.moe_runner_backends)} moe runner x {len(probe.fp4_gemm_backends)} fp4 gemm x {specs} "
                f"speculative" + "".join(f"; {n}" for n in notes))
            reports.append(run.host(h, stacks[h.name]))
            if not as_json:
                _print_report(reports[-1], hidden)
    except KeyboardInterrupt:
        say("interrupted: the production server was put back (see above); partial results are in the record")
        return 130
    if as_json:
        render.print_json([r.to_json() for r in reports])
    return 0 if reports and all(r.ok for r in reports) else 1


def _print_report(report: HostProbe, hidden: tuple[str, ...]) -> None:
    if report.outcomes:
        render.console.print(outcomes_table(report.host, report.outcomes, report.chosen))
    lines = []
    if report.chosen:
        c = report.chosen
        lines.append(f"{report.host}: fastest correct: {c.candidate.label} ({c.tokens_per_second} tokens/s)")
    elif report.status == "completed":
        lines.append(f"{report.host}: no candidate gave every known answer")
    if report.applied is not None:
        lines.append(f"{report.host}: written into the inventory: "
                     + (", ".join(f"{k} = {v!r}" for k, v in report.applied.items()) or "nothing (already set)"))
    if report.left:
        lines.append(f"{report.host}: {report.left}")
    if report.error:
        lines.append(f"{report.host}: error: {report.error}")
    lines.append(f"{report.host}: record in {report.record}")
    for line in lines:
        emit(mask(line, hidden))


def _dry_run(chosen, stacks, base, as_json: bool) -> int:
    """List each host's candidates (and, in JSON, each one's exact argv); connect to nothing."""
    data = []
    for h in chosen:
        found, notes = candidates(stacks[h.name], base)
        now = current_candidate(stacks[h.name])
        if as_json:
            data.append({"host": h.name, "candidates": [
                {**c.to_json(), "label": c.label, "production": c == now,
                 "argv": launch_argv(h, stacks[h.name], c, base)} for c in found], "notes": notes})
        else:
            render.console.print(candidates_table(h.name, found, now))
            for note in notes:
                emit(f"{h.name}: {note}")
    if as_json:
        render.print_json(data)
    return 0
