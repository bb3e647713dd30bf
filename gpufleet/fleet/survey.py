"""Before a roll: every host planned read-only, side by side; a host already on target is left out of the roll."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gpufleet.config import lock
from gpufleet.engine.runner import for_each_host
from gpufleet.errors import GpufleetError
from gpufleet.fleet.executor import Executor, HostReport
from gpufleet.fleet.lockstate import host_build_key


ON_TARGET = "left as it is: on target (read-only survey: no role has anything to change)"


@dataclass
class Surveyed:
    """One host as the survey found it: on target or not, and why in one line."""

    host: str
    on_target: bool
    why: str
    report: HostReport | None = None
    build_key: str | None = None

    def drift(self, found: lock.FleetLock) -> list[str]:
        """How the host differs from a fleet lock, from the facts the survey read (empty: it matches)."""
        facts = self.report.facts
        if facts is None or facts.packages is None:
            return ["its packages could not be read"]
        head = facts.checkout.head if facts.checkout and facts.checkout.present else None
        d = lock.compare(found, self.host, facts.packages, head, self.build_key)
        return d.packages + d.extra + d.other


def judge(name: str, report: HostReport) -> Surveyed:
    """On target when the plan ran and every role found nothing to change or check."""
    if not report.ok:
        first = (report.error or report.outcome).splitlines()[0]
        return Surveyed(name, False, f"could not be planned read-only ({report.outcome}: {first})", report)
    if report.lock_holder:
        return Surveyed(name, False, f"locked by {report.lock_holder}", report)
    pending = [e for e in report.entries if e.status in ("planned", "refused")]
    if pending:
        return Surveyed(name, False, "; ".join(f"{e.item.role}: {e.item.reason}" for e in pending[:2])
                        + (f" (+{len(pending) - 2} more)" if len(pending) > 2 else ""), report)
    return Surveyed(name, True, "on target: every role plans nothing (read-only survey)", report)


def survey(hosts: list, inventory, planner: Executor, stacks: dict, *, secrets: tuple[str, ...] = (),
           build_keys: bool = False, opened=None) -> dict[str, Surveyed]:
    """Each host planned (dry run) over its own connection, in parallel up to settings.parallelism; with
    build_keys, the sgl-kernel build record of each host on target is read too (for a fleet lock's comparison);
    opened: sessions opened ahead (engine.runner.open_ahead)."""
    def one(session) -> Surveyed:
        report = planner.host(session, stacks[session.name])
        found = judge(session.name, report)
        if found.on_target and build_keys:
            found.build_key = host_build_key(report.reads.view())
            if planner.read_memory:  # the build record too, next time
                planner.read_memory.keep(session.host, list(report.reads.used.values()))
        return found

    outcomes = for_each_host(hosts, inventory, one, secrets=secrets, opened=opened)
    return {o.host: o.value if o.ok else Surveyed(o.host, False, f"{o.kind}: {o.error.splitlines()[0]}")
            for o in outcomes}


def newest_lock_matched(found: Surveyed, directory) -> lock.FleetLock | None:
    """The newest recorded fleet lock in directory this host matches exactly, if any."""
    for path in sorted(directory.glob("*.toml"), reverse=True) if directory.is_dir() else []:
        try:
            candidate = lock.load(path)
        except GpufleetError:
            continue  # an unreadable lock file is not one to hold a roll to
        if not found.drift(candidate):
            return candidate
    return None


@dataclass
class LeftOut:
    """What the survey decided for a roll: the hosts left out as they are (name -> why) and the lock to hold the
    rest to (when the survey found the fleet on one recorded lock)."""

    hosts: dict[str, list[str]]  # name -> the steps its roll result records
    held: lock.FleetLock | None = None
    note: str = ""


def decide(kind: str, order: list[str], found: dict[str, Surveyed], *, given: lock.FleetLock | None,
           partial: bool, locks) -> LeftOut:
    """Which surveyed hosts the roll leaves out. An upgrade roll holds every host it rolls to one fleet lock, so a
    host on target is left out only when that lock is known now: the one given; or, when no host has anything to
    change, the newest recorded lock the first host matches (a host that differs from it is rolled to it). When
    some host will change and no lock is given, the canary records the lock later hosts converge to: all roll."""
    on = [n for n in order if n in found and found[n].on_target]
    if kind != "upgrade" or partial:
        return LeftOut({n: [ON_TARGET] for n in on})
    if given is not None:
        left = {}
        for n in on:
            if differs := found[n].drift(given):
                found[n].on_target, found[n].why = False, f"differs from the lock: {'; '.join(differs[:3])}"
            else:
                left[n] = [ON_TARGET, f"matches lock {Path(given.path).name}"]
        return LeftOut(left)
    if len(on) < len([n for n in order if n in found]):
        return LeftOut({}, note="some hosts will change: every host is rolled, held to the lock the canary records")
    if not on:
        return LeftOut({})
    held = newest_lock_matched(found[on[0]], locks)
    if held is None:
        return LeftOut({n: [ON_TARGET, f"no recorded fleet lock matches {on[0]}"] for n in on})
    name = Path(held.path).name
    left = {}
    for n in on:
        if differs := found[n].drift(held):
            found[n].on_target, found[n].why = False, f"differs from the fleet lock {name}: {'; '.join(differs[:3])}"
        else:
            left[n] = [ON_TARGET, f"matches lock {name}"]
    return LeftOut(left, held=held)
