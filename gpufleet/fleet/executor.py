"""The executor: plans each role against the host as it is, re-checks, snapshots, applies, verifies, records."""

from __future__ import annotations

import json
import os
import posixpath
import threading
import time
import zipfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Sequence

from gpufleet.kernel import buildcache
from gpufleet.remote import text as remote_text
from gpufleet.fleet import hoststate, staging
from gpufleet.wheels import push
from gpufleet.engine import detached, readahead
from gpufleet.engine.command import Cmd
from gpufleet.errors import GpufleetError, RemoteCommandError
from gpufleet.facts.checkout import redact_url
from gpufleet.wheels.fetch import WheelCache, fetch_pip_wheel, sha256_of
from gpufleet.facts.gather import gather_facts
from gpufleet.facts.script import unit_name
from gpufleet.fleet.hoststate import HostClaimedError, RunInfo
from gpufleet.config.lock import FleetLock
from gpufleet.fleet.lockstate import locked_stack
from gpufleet.plan import PlanContext, Role, Step, Unchanged, Upload, brief
from gpufleet.roleapi import Selection, needs
from gpufleet.wheels.push import PushItem

TOOLS_DIR = "/var/cache/gpufleet/tools"  # gpufleet's own pip wheel on each host
JOBS_DIR = "/var/lib/gpufleet/jobs"  # detached installs into a staged venv: their logs and exit codes, per run
RESOLVER_PIP = "26.3"  # the pip that resolves and installs on every host: its dry run reads metadata only

# Entry statuses: planned (dry run), unchanged (the role said so), done-already (its `needed` check said so at
# apply time), changed, verified (a check-only step passed), failed, skipped (--only/--skip left the role out),
# refused (a role it needs is left out and not on target on this host).


class RoleRefused(GpufleetError):
    """A selected role needs a role that --only/--skip leaves out and that is not on target on this host."""


class DiskSpaceError(GpufleetError):
    """A host has too little free disk for what a step would write; nothing was written."""


@dataclass
class Entry:
    """One planned item on one host and what became of it."""

    item: Step | Unchanged
    status: str
    seconds: float = 0.0

    def to_json(self) -> dict:
        return {**self.item.to_json(), "status": self.status, "seconds": round(self.seconds, 2)}


@dataclass
class HostReport:
    """What an upgrade did (or, in a dry run, would do) on one host."""

    host: str
    dry_run: bool
    entries: list[Entry] = field(default_factory=list)
    outcome: str = "ok"  # ok | failed | locked | unreachable
    error: str | None = None
    next_step: str | None = None
    snapshot: str | None = None
    lock_holder: str | None = None  # dry run: another run holds the host's lock now
    seconds: float = 0.0
    wheels: list[dict] = field(default_factory=list)  # files handed over: name, version, filename, url, sha256
    staged_venv: str | None = None  # where this run changed the venv before switching (or left it, on a failure)
    server_stopped: str | None = None  # the unit this run stopped for the venv switch (deploy-model starts it)
    facts: object = field(default=None, repr=False)  # a dry run's facts, as its roles planned from them
    reads: object = field(default=None, repr=False)  # a dry run's readahead.Reads: more reads, remembered too

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    def with_status(self, *statuses: str) -> list[Entry]:
        return [e for e in self.entries if e.status in statuses]

    def to_json(self) -> dict:
        return {"host": self.host, "dry_run": self.dry_run, "outcome": self.outcome, "ok": self.ok,
                "error": self.error, "next": self.next_step, "snapshot": self.snapshot,
                "lock_holder": self.lock_holder, "seconds": round(self.seconds, 2),
                "staged_venv": self.staged_venv, "server_stopped": self.server_stopped,
                "changed": [f"{e.item.role}: {e.item.title}" for e in self.with_status("changed")],
                "wheels": self.wheels,
                "entries": [e.to_json() for e in self.entries]}


@dataclass
class Executor:
    """One `inv upgrade` run over many hosts: the roles, who runs it, and what is shared between host threads."""

    roles: Sequence[Role]
    run: RunInfo
    repo: Path
    dry_run: bool = False
    wheels: WheelCache = field(default_factory=WheelCache)
    say: Callable[[str], None] = print  # one whole line (host-prefixed) of live output
    command_timeout: float | None = None
    read_facts: Callable = gather_facts
    build_cache: buildcache.LocalCache = field(default_factory=buildcache.LocalCache)
    reconnect_for: float = 900.0  # how long a resumable step keeps trying to reach a host that dropped off
    lock: FleetLock | None = None  # converge every host to this recorded stack
    host_lock_held: bool = False  # the caller holds each host's lock already (e.g. a probe redeploying): keep it
    resolver_version: str = RESOLVER_PIP
    selection: Selection | None = None  # --only / --skip (and --force)
    snapshots_keep: int | None = None  # after a successful run that took a snapshot, keep this many (None: all)
    read_memory: readahead.Memory | None = None  # each host's last plan reads, asked up front
    _pip_wheel: Path | None = field(default=None, repr=False)
    _pip_guard: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def pip_wheel(self, stack) -> Path:
        """The pinned pip wheel on the control node, fetched once per run for all hosts."""
        with self._pip_guard:
            if self._pip_wheel is None:
                self._pip_wheel = fetch_pip_wheel(self.resolver_version, stack.pip.index_url, stack.pip.trusted_hosts)
            return self._pip_wheel

    def host(self, session, stack) -> HostReport:
        """Plan (dry run) or apply every role on one host; never raises for a failure on the host."""
        return _HostRun(self, session, stack).go()


class _Viewed:
    """A session whose inventory host says another venv path: facts and plans read the staged venv through it."""

    def __init__(self, session, host):
        self._session, self.host = session, host

    def __getattr__(self, name):
        return getattr(self._session, name)


def changes_venv(item) -> bool:
    return isinstance(item, Step) and bool(item.commands or item.uploads) and "venv" in item.changes


class _HostRun:
    """The state of one host's run: its report, its facts, whether the snapshot was taken, the staged venv."""

    def __init__(self, upgrade: Executor, session, stack):
        self.up, self.session, self.stack = upgrade, session, stack
        self.report = HostReport(session.name, upgrade.dry_run)
        self._resolver: Upload | None = None
        self.stage: staging.Stage | None = None  # while set, roles plan and change the staged copy of the venv
        self.jobs_used = False
        self.in_place = False  # the filesystem cannot swap directories: the venv is changed where it is
        self.stage_changed = False
        self.facts = None  # a dry run's facts, as the roles planned from them

    @property
    def host(self):
        """The inventory host as roles see it: its venv is the staged copy while one is being changed."""
        host = self.session.host
        return host.model_copy(update={"venv": self.stage.path}) if self.stage else host

    def read_facts(self):
        return self.up.read_facts(_Viewed(self.session, self.host) if self.stage else self.session)

    def say(self, text: str) -> None:
        self.up.say(f"[{self.session.name}] {text}")

    def read(self, cmd: Cmd, step: str):
        return self.session.run(cmd, step=step, check=False, timeout=self.up.command_timeout)

    def context(self, facts) -> PlanContext:
        return PlanContext(host=self.host, stack=self.stack, facts=facts, read=self.read, repo=self.up.repo,
                           resolver=self.resolver, lock=self.up.lock)

    def resolver(self) -> Upload:
        """gpufleet's pip wheel, put on the host once per run: roles resolve and install with it."""
        if self._resolver is None:
            local = self.up.pip_wheel(self.stack)
            up = Upload(local.resolve().as_uri(), sha256_of(local), f"{TOOLS_DIR}/{local.name}", "pip",
                        self.up.resolver_version)
            self.push(None, [up])
            self._resolver = up
        return self._resolver

    def go(self) -> HostReport:
        started = time.monotonic()
        try:
            if self.up.lock is not None:
                try:
                    self.stack = locked_stack(self.stack, self.up.lock, self.session.name)
                except GpufleetError as exc:
                    self.fail(exc, "use the patches the lock was recorded with, or record a new lock")
                    return self.report
            if self.up.dry_run:
                self.plan_only()
            else:
                self.apply()
        finally:
            self.report.seconds = time.monotonic() - started
        return self.report

    def plan_only(self) -> None:
        try:
            # Nothing changes in a dry run, so every role sees today's facts, and the reads they plan from are
            # gathered and answered side by side: a few exec round trips per host instead of one per read.
            memory = self.up.read_memory
            reads = readahead.Reads(self.session, self.up.command_timeout,
                                    memory.recall(self.session.host) if memory else ())
            asking = reads.view()
            first = reads.plan(lambda: (reads.tolerant(lambda: hoststate.read_claim(asking)),
                                        reads.tolerant(lambda: self.up.read_facts(asking))))
            self.report.lock_holder, self.facts = first
            self.report.facts, self.report.reads = self.facts, reads
            ctx = replace(self.context(self.facts), read=reads.read, resolver=lambda: self.resolver_now(reads))
            self.reads_passed_over = lambda: setattr(reads, "passed_over", True)
            planned = reads.plan(lambda: self.plan_roles(ctx, gathering=reads.gathering))
            self.report.entries.extend(planned[0])
            if memory:  # what this plan read: asked up front next time
                memory.keep(self.session.host, list(reads.used.values()))
            if any(changes_venv(e.item) for e in self.report.entries):
                self.report.entries.append(Entry(self.switch_step(staging.estimate(self.session,
                                                                                   self.session.host.venv)), "planned"))
            if planned[1]:
                raise RoleRefused("; ".join(planned[1].values()))
        except RoleRefused as exc:
            self.fail(exc, "run the role it needs too, or pass --force to run it against the host as it is")
        except GpufleetError as exc:
            self.fail(exc, "fix the cause, then run the dry run again")

    def resolver_now(self, reads: readahead.Reads) -> Upload:
        """The resolver in a dry run: its upload waits for the real pass (a gathering pass may be wrong about it).
        Once it is on the host, answers read before it may be stale (a read of it that was asked up front found
        none): later reads go to the host."""
        if self._resolver is not None:
            return self._resolver
        if reads.gathering:
            raise readahead.Pending
        upload = self.resolver()
        reads.forget()
        return upload

    def plan_roles(self, ctx: PlanContext, gathering: bool = False) -> tuple[list[Entry], dict[str, str]]:
        """Every role's plan against ctx (entries in role order) and the roles refused. While gathering reads a role
        that fails is passed over, so the roles after it still say what they will read."""
        behind = self.survey(ctx)
        refused = self.refusals(behind, quiet=gathering)
        entries: list[Entry] = []
        for role in self.up.roles:
            if self.skip(role, behind, entries):
                continue
            if role.name in refused:
                entries.append(Entry(Unchanged(role.name, refused[role.name]), "refused"))
                continue
            try:
                items = role.plan(ctx)
            except (Exception, readahead.Pending):  # noqa: BLE001 - only while gathering: the real pass raises it
                if gathering:
                    self.reads_passed_over()
                    continue
                raise
            entries += [Entry(item, "unchanged" if isinstance(item, Unchanged) else "planned") for item in items]
        return entries, refused

    def switch_step(self, cost: staging.Estimate | None = None) -> Step:
        venv = self.session.host.venv
        return Step(role="venv", title=f"switch {venv} to the staged copy in one atomic swap",
                    reason=cost.describe(venv) if cost else "the staged venv is on target and verified",
                    commands=(), changes=("venv",))

    def survey(self, ctx: PlanContext) -> dict[str, str]:
        """Plan (read-only) each role --only/--skip leaves out: name -> why it is not on target, for those behind."""
        sel, behind = self.up.selection, {}
        for role in self.up.roles if sel else ():
            if sel.runs(role.name):
                continue
            try:
                pending = [i for i in role.plan(ctx) if isinstance(i, Step) and (i.commands or i.uploads)]
                if pending:
                    behind[role.name] = pending[0].reason
            except GpufleetError as exc:
                behind[role.name] = f"could not plan it: {exc}"
        return behind

    def refusals(self, behind: dict[str, str], quiet: bool = False) -> dict[str, str]:
        """Roles that run but need a left-out role that is behind: name -> why refused (none with --force)."""
        found, sel = {}, self.up.selection
        for role in self.up.roles if sel else ():
            if not sel.runs(role.name):
                continue
            missing = [d for d in needs(role, self.up.roles) if d in behind]
            if not missing:
                continue
            why = "; ".join(f"{d}: {behind[d]}" for d in missing)
            if sel.force:
                if quiet:
                    continue
                self.say(f"{role.name}: runs although {', '.join(missing)} is left out and not on target (--force)")
                continue
            found[role.name] = (f"{role.name} needs {', '.join(missing)}, which --only/--skip leaves out and which "
                                f"is not on target on {self.session.name} ({why}); run "
                                f"{'it' if len(missing) == 1 else 'them'} too, or pass --force")
        return found

    def skip(self, role, behind: dict[str, str], entries: list[Entry] | None = None) -> bool:
        """True for a role --only/--skip leaves out; recorded as skipped, saying whether it is on target here."""
        sel = self.up.selection
        if sel is None or sel.runs(role.name):
            return False
        note = f"skipped ({sel.left_out[role.name]})"
        note += f"; not on target: {behind[role.name]}" if role.name in behind else "; on target"
        (self.report.entries if entries is None else entries).append(Entry(Unchanged(role.name, note), "skipped"))
        return True

    def apply(self) -> None:
        run = self.up.run
        try:
            if not self.up.host_lock_held and (note := hoststate.claim_host(self.session, run)):
                self.say(note)
        except HostClaimedError as exc:
            self.report.outcome, self.report.error = "locked", str(exc)
            self.report.next_step = (f"wait for that run to finish; if it is gone for good, `inv unlock --host "
                                     f"{self.session.name}` (it shows the holder) and run again")
            self.audit()
            return
        except GpufleetError as exc:
            self.fail(exc, "fix the cause, then run again")
            return
        self.report.outcome = "running"
        try:
            self.apply_roles()
            self.report.outcome = "ok"
            self.prune_snapshots()
        except RoleRefused as exc:
            self.fail(exc, "run the role it needs too, or pass --force to run it against the host as it is")
        except GpufleetError as exc:
            self.fail(exc, self.resume_hint())
        finally:
            if self.report.outcome == "running":  # an unexpected exception is on its way up
                self.report.outcome, self.report.error = "failed", "interrupted"
            self.audit()
            self.remove_jobs()
            if not self.up.host_lock_held:
                try:
                    hoststate.release_claim(self.session, run)
                except GpufleetError as exc:
                    self.say(f"could not release the lock: {exc}")

    def apply_roles(self) -> None:
        # Until a role has something to do, the host is as this host's last plan found it: what that plan read is
        # asked up front, side by side in one exec (engine/readahead.py), and the facts and the roles' plans read
        # those answers; a read not among them, and every read once a role has something to do, goes to the host.
        memory = self.up.read_memory
        reads = readahead.Reads(self.session, self.up.command_timeout,
                                memory.recall(self.session.host) if memory else ())
        if reads.remembered:
            reads.fetch([])
        ahead = True

        def context(facts) -> PlanContext:
            ctx = self.context(facts)
            return replace(ctx, read=reads.read, resolver=lambda: self.resolver_now(reads)) if ahead else ctx

        def remember() -> None:
            if memory:  # what the plan read while the host was as it found it: asked up front next time
                memory.keep(self.session.host, list(reads.used.values()))
        facts = self.up.read_facts(reads.view())
        behind = self.survey(context(facts))
        refused = self.refusals(behind)
        if refused:  # before anything changes
            raise RoleRefused("; ".join(refused.values()))
        for role in self.up.roles:
            changed = False
            if self.skip(role, behind):
                continue
            items = role.plan(context(facts))
            if ahead and not all(isinstance(i, Unchanged) for i in items):
                ahead = False  # this role changes or checks the host: from here on every read goes to it
                remember()
            if self.stage is None and not self.in_place and any(changes_venv(i) for i in items):
                for item in items:  # its wheels first: room for them is checked before anything else is written
                    if changes_venv(item):
                        self.push(item, item.uploads, record=False)
                self.begin_stage()  # the live venv is never written: this role and the rest change a staged copy
                if self.stage is not None:
                    facts = self.read_facts()
                    items = role.plan(self.context(facts))
            for item in items:
                if isinstance(item, Unchanged):
                    self.report.entries.append(Entry(item, "unchanged"))
                else:
                    changed |= self.apply_step(item)
            if changed:  # the next role plans against the host as it is now
                facts = self.read_facts()
        if ahead:
            remember()
        if self.stage is not None:
            self.finish_stage()

    def begin_stage(self) -> None:
        """Snapshot the host, then make (or reuse a clean) staged copy of the venv for the changes."""
        self.ensure_snapshot()
        by = " ".join(self.up.run.holder_text().split("\n")[:4])
        stage = staging.prepare(self.session, self.session.host.venv, by)
        self.say(stage.note)
        if stage.path is None:
            self.in_place = True
            return
        self.stage = stage
        self.report.staged_venv = stage.path
        self.stage_changed = stage.reused  # a reused copy holds an earlier run's changes

    def finish_stage(self) -> None:
        """Stop the server if it runs, swap the staged venv in, then prove every role on target on the live path."""
        venv = self.session.host.venv
        if not self.stage_changed:
            staging.discard(self.session, venv)
            self.stage = None
            self.report.staged_venv = None
            return
        entry = Entry(self.switch_step(), "running")
        self.report.entries.append(entry)
        started = time.monotonic()
        try:
            unit = unit_name(self.session.host.service)
            active = self.session.run(Cmd.of("systemctl", "is-active", "--quiet", "--", unit),
                                      step="server running?", check=False)
            if active.exit_code == 0:
                self.say(f"stopping {unit} for the venv switch (`inv deploy-model` starts it on the new stack and "
                         f"proves it healthy)")
                self.run(Cmd.of("systemctl", "stop", "--", unit), "stop the server for the venv switch", timeout=600)
                self.report.server_stopped = unit
            self.say(staging.switch(self.session, venv))
            self.stage = None
            entry.status = "changed"
        except BaseException:
            entry.status = "failed"
            raise
        finally:
            entry.seconds = time.monotonic() - started
        self.prove_on_target()

    def prove_on_target(self) -> None:
        """After the switch every selected role plans nothing more on the live venv; check-only steps run again."""
        ctx = self.context(self.read_facts())
        for role in self.up.roles:
            if self.up.selection is not None and not self.up.selection.runs(role.name):
                continue
            for item in role.plan(ctx):
                if isinstance(item, Unchanged):
                    continue
                if item.commands or item.uploads:
                    raise staging.StagingError(f"host {self.session.name}: after the venv switch {role.name} is not "
                                               f"on target on the live path: {item.reason}")
                for cmd in item.verify:
                    self.run(cmd, f"{item.title}: after the switch", timeout=item.timeout or self.up.command_timeout)

    def apply_step(self, step: Step) -> bool:
        """Run one step if its `needed` check still says so; True when it changed the host."""
        entry = Entry(step, "running")
        self.report.entries.append(entry)
        started = time.monotonic()
        try:
            if step.needed is not None and not self.still_needed(step):
                entry.status = "done-already"
                self.say(f"{step.role}: {step.title}: already done")
                return False
            self.say(f"{step.role}: {step.title}")
            if step.commands or step.uploads:
                self.ensure_snapshot()
            self.push(step, step.uploads)
            timeout = step.timeout or self.up.command_timeout
            staged = self.stage is not None and changes_venv(step)
            if staged:  # a run that dies from here on leaves the copy marked half-changed: the next run discards it
                staging.mark(self.session, self.session.host.venv, "dirty")
            for i, cmd in enumerate(step.commands):
                if step.resumable:
                    self.run_resumable(cmd, step.title, timeout=timeout)
                elif staged:
                    # detached from the connection: a dropped link or a restarted sshd neither kills pip halfway nor
                    # turns an install that finished into a failure; a reconnect follows the same job to its end
                    job = self.step_job(step, i)
                    self.run_resumable(detached.wait_cmd(job, cmd, poll=1.0), step.title, timeout=timeout,
                                       shown=brief(cmd), again=detached.attach_cmd(job, poll=1.0))
                else:
                    self.run(cmd, step.title, timeout=timeout, echo=self.up.say)
            for cmd in step.verify:
                result = self.run(cmd, f"{step.title}: verify" if step.commands else step.title, timeout=timeout)
                self.say(f"{step.role}: {(result.output.strip().splitlines() or ['ok'])[-1]}")
            if staged:
                staging.mark(self.session, self.session.host.venv, "clean")
                self.stage_changed = True
            for key in step.artifacts:
                if buildcache.fetch_to_cache(self.session, key, self.up.build_cache):
                    self.say(f"{step.role}: build {key[:12]} cached on the control node for the other hosts")
            entry.status = "changed" if step.commands or step.uploads else "verified"
            return entry.status == "changed"
        except BaseException:
            entry.status = "failed"
            raise
        finally:
            entry.seconds = time.monotonic() - started

    def remove_jobs(self) -> None:
        """The run's detached installs are over (their output is in the report and the errors): drop their logs."""
        if not self.jobs_used:
            return
        try:
            self.session.run(Cmd.of("rm", "-rf", "--", f"{JOBS_DIR}/{self.up.run.token}"), step="remove job logs",
                             check=False)
        except GpufleetError as exc:
            self.say(f"could not remove {JOBS_DIR}/{self.up.run.token}: {exc}")

    def step_job(self, step: Step, index: int) -> detached.Job:
        """The detached job of one command of one step in this run (a later run never picks up its result)."""
        self.jobs_used = True
        key = sha256_text(f"{self.up.run.token}\0{step.role}\0{step.title}\0{index}")
        return detached.Job(f"gpufleet-step-{key[:12]}", f"{JOBS_DIR}/{self.up.run.token}/{key[:12]}")

    def run(self, cmd: Cmd, step: str, shown: str | None = None, **options):
        """session.run, with inline scripts abbreviated in the error (its output tail says what went wrong)."""
        result = self.session.run(cmd, step=step, check=False, **options)
        if not result.ok:
            raise RemoteCommandError(result, cmd, shown=shown or brief(cmd))
        return result

    def run_resumable(self, cmd: Cmd, step: str, timeout: float | None, shown: str | None = None,
                      again: Cmd | None = None):
        """Run a command that is safe to re-run; when the connection drops, reconnect and run it again (or `again`:
        what follows the same work without starting it twice)."""
        deadline = time.monotonic() + self.up.reconnect_for
        delay = 1.0
        while True:
            try:
                return self.run(cmd, step, shown=shown, timeout=timeout, echo=self.up.say)
            except RemoteCommandError as exc:
                if exc.exit_code is not None or time.monotonic() > deadline:
                    raise
                self.say(f"connection lost during '{step}'; reattaching (the work goes on on the host; waiting up to "
                         f"{self.up.reconnect_for:.0f} s for it to answer)")
            cmd = again or cmd
            while True:
                time.sleep(delay)
                delay = min(delay * 2, 15.0)
                try:
                    self.session.reconnect()
                    break
                except GpufleetError:
                    if time.monotonic() > deadline:
                        raise

    def still_needed(self, step: Step) -> bool:
        result = self.session.run(step.needed, step=f"{step.title}: still needed?", check=False,
                                  timeout=self.up.command_timeout)
        if result.exit_code in (0, 1):
            return result.exit_code == 0
        raise RemoteCommandError(result, step.needed, shown=brief(step.needed))

    def prune_snapshots(self) -> None:
        """After a successful run that took a snapshot: keep the newest `snapshots_keep`, never the one just taken."""
        if self.report.snapshot is None or self.up.snapshots_keep is None:
            return
        try:
            removed = hoststate.prune_snapshots(self.session, self.up.snapshots_keep, self.report.snapshot)
        except GpufleetError as exc:
            self.say(f"could not prune old snapshots: {exc}")
            return
        if removed:
            self.say(f"removed {len(removed)} old snapshot(s), keeping the newest {self.up.snapshots_keep}: "
                     + ", ".join(removed))

    def ensure_snapshot(self) -> None:
        if self.report.snapshot is None:
            self.report.snapshot = hoststate.snapshot(self.session, self.up.run)
            self.say(f"state before this run saved in {self.report.snapshot}")

    def push(self, step: Step | None, uploads: Sequence[Upload], record: bool = True) -> None:
        """Put wheels on the host unless they are there already: one check, then one verified stream of what is
        missing (gpufleet.wheels.push). Each is fetched once per run (and cached) on the control node for all hosts, and
        only when some host lacks it."""
        title = step.title if step else "resolver"
        wanted: list[tuple[Upload, str, Path | None]] = []
        for up in uploads:
            local = None
            sha = up.sha256
            if sha is None:  # the index published no hash: what the control node fetched decides
                local = self.up.wheels.get(up.url, None)
                sha = self.up.wheels.sha256(local)
            wanted.append((up, sha, local))
            # wheels only: a build's FetchContent source archive is handed over the same way but is no distribution
            if record and step is not None and up.name and up.remote.endswith(".whl"):
                self.report.wheels.append({"name": up.name, "version": up.version, "filename":
                                           posixpath.basename(up.remote), "url": redact_url(up.url), "sha256": sha})
        if not wanted:
            return
        probes = [PushItem(Path(os.devnull), up.remote, sha) for up, sha, _ in wanted]
        check = self.session.run(push.check_command(probes), step=f"{title}: which wheels are on the host?")
        states = push.parse_check(self.session.name, probes, check.output)
        lacking = [(PushItem(local or self.up.wheels.get(up.url, sha), up.remote, sha), state)
                   for (up, sha, local), state in zip(wanted, states) if state != "present"]
        self.check_room(step, [up.remote for (up, _, _), state in zip(wanted, states) if state == "present"],
                        [item for item, _ in lacking])
        if lacking:
            missing = [item for item, _ in lacking]
            size = sum(item.local.stat().st_size for item in missing)
            self.say(f"handing over {len(missing)} wheel(s), {size / 2**20:.1f} MiB, from the control node")
            # checked above, before fetching: push_files need not ask the host again
            push.push_files(self.session, missing, say=self.say, states=[state for _, state in lacking])

    def check_room(self, step: Step | None, present: list[str], lacking: list[PushItem]) -> None:
        """Before a wheel is handed over or installed: the cache's filesystem must hold the missing wheels and the
        venv's what every wheel of the step unpacks to (the old files stay, held by the snapshot); one round trip."""
        checks: list[dict] = []
        for directory in dict.fromkeys(posixpath.dirname(item.remote) for item in lacking):
            need = sum(item.local.stat().st_size for item in lacking if posixpath.dirname(item.remote) == directory)
            checks.append({"path": directory, "need": need, "what": "wheels handed over"})
        if step is not None and changes_venv(step):
            local = sum(_unpacked(item.local) for item in lacking if item.remote.endswith(".whl"))
            checks.append({"path": self.host.venv, "need": local, "what": "unpacked into the venv",
                           "unpack": [p for p in present if p.endswith(".whl")]})
        if not checks:
            return
        cmd = Cmd.of("python3", "-c", remote_text("disk_room.py"), json.dumps(checks), cwd="/")
        result = self.session.run(cmd, step=f"{step.title if step else 'resolver'}: room on disk?", check=False)
        if result.exit_code == 3:
            raise DiskSpaceError(f"host {self.session.name}: {(result.output.strip().splitlines() or ['?'])[-1]}; "
                                 f"nothing was written")
        if result.exit_code != 0:
            raise RemoteCommandError(result, cmd, shown=brief(cmd))

    def resume_hint(self) -> str:
        failed = next((e for e in self.report.entries if e.status == "failed"), None)
        where = f" at '{failed.item.title}'" if failed else ""
        hint = (f"fix the cause, then run `{self.up.run.command}` again: steps already done are skipped and the run "
                f"continues{where}")
        if self.stage is not None:
            hint += (f"; the live venv {self.session.host.venv} is untouched: the changes so far are in the staged copy "
                     f"{self.stage.path} (a re-run reuses it if its last step finished, else makes a new one)")
        if self.report.snapshot:
            hint += f"; the state before this run is saved in {self.report.snapshot} on {self.session.name}"
        return hint

    def fail(self, exc: GpufleetError, next_step: str) -> None:
        self.report.outcome, self.report.error, self.report.next_step = "failed", str(exc), next_step

    def audit(self) -> None:
        r = self.report
        failed = next((e for e in r.entries if e.status == "failed"), None)
        record = {"when": hoststate.utc_now().strftime("%Y-%m-%dT%H:%M:%SZ"), "who": self.up.run.who,
                  "pid": self.up.run.pid, "command": self.up.run.command, "host": r.host, "outcome": r.outcome,
                  "changed": [f"{e.item.role}: {e.item.title}" for e in r.with_status("changed")],
                  "done_already": [f"{e.item.role}: {e.item.title}" for e in r.with_status("done-already")],
                  "unchanged": [f"{e.item.role}: {e.item.reason}" for e in r.with_status("unchanged")],
                  "failed": ({"step": f"{failed.item.role}: {failed.item.title}"} if failed else None),
                  "error": r.error, "snapshot": r.snapshot}
        try:
            hoststate.append_audit(self.session, record)
        except GpufleetError as exc:
            self.say(f"could not append to {hoststate.AUDIT_LOG}: {exc}")


def _unpacked(wheel: Path) -> int:
    """What a wheel takes once installed: its members' sizes, read from the zip's directory only."""
    try:
        with zipfile.ZipFile(wheel) as z:
            return sum(info.file_size for info in z.infolist())
    except (OSError, zipfile.BadZipFile):
        return wheel.stat().st_size  # not a zip: the hash check on the host will say so; count it as it is


def sha256_text(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()
