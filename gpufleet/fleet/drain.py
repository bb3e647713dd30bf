"""A roll behind the router: each host's worker drained before its server stops, re-added once healthy; the speed gate.

RollHooks wraps RollProcedures (procedure/recover) and is called by it at two points: `before_stop` (first thing
on a host: take the worker out of the router, wait until the server has no request in flight, measure its speed)
and `after_health` (after the health gate: measure again, fail the host when slower than the gate allows). After
the procedure the worker is re-added and the roll waits until the router reports it healthy; a failed host is
re-added only once its rollback proved it healthy; a host that stays out is named in the roll's summary.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from datetime import datetime, timezone
from typing import Callable

from gpufleet.config import lock
from gpufleet.errors import GpufleetError
from gpufleet.fleet import health, inflight, speed
from gpufleet.fleet.router import RouterClient, RouterError, Worker, worker_url
from gpufleet.roles.model_server import served_name

POLL = 0.5  # seconds between reads of a drained server's load


class DrainRefused(GpufleetError):
    """Draining this host would leave a model without a healthy worker in the router."""


class SpeedGateFailed(GpufleetError):
    """The new stack decodes slower than the old by more than the gate allows."""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class RollHooks:
    """Drain/rejoin through the router (when one is configured) and the throughput gate (unless turned off)."""

    def __init__(self, *, stacks: dict, router_cfg=None, client: RouterClient | None = None, summary=None,
                 record=None, speed_gate: bool = True, drain_timeout: float | None = None,
                 on_drain_timeout: str | None = None, say: Callable[[str], None] = print,
                 previous_out: list[str] = ()):
        self.stacks, self.cfg, self.client, self.summary, self.record = stacks, router_cfg, client, summary, record
        self.speed_gate = speed_gate
        self.drain_timeout = drain_timeout or (router_cfg.drain_timeout if router_cfg else 300.0)
        self.on_drain_timeout = on_drain_timeout or (router_cfg.on_drain_timeout if router_cfg else "cut")
        self.rejoin_timeout = router_cfg.rejoin_timeout if router_cfg else 300.0
        self.say = say
        self.previous_out = set(previous_out)  # hosts a resumed roll left out of the router
        self._lock = threading.Lock()  # hosts of one batch drain in parallel: the last-worker check is atomic
        self._draining: set[str] = set()  # worker URLs this roll has taken out and not yet put back
        self.clock, self.sleep = time.monotonic, time.sleep

    # ---- the two points inside RollProcedures.procedure ---------------------------------------------------------
    def before_stop(self, session, result, log) -> None:
        """Before anything on the host changes: drain its worker, then measure the old stack's speed."""
        if self.client is not None:
            self.drain(session, result, log)
        if self.speed_gate and self._gate_on(session):
            self.measure(session, result, log, "before")

    def after_health(self, session, result, log) -> None:
        """After the health gate: the new stack's speed against the old's."""
        if not (self.speed_gate and self._gate_on(session)):
            return
        before = (result.speed or {}).get("before")
        if before is None:
            result.steps.append("speed gate: no figure from before (the server was not serving): not compared")
            return
        after = self.measure(session, result, log, "after")
        stack = self.stacks[session.name]
        old = speed.Speed(**before)
        result.speed["slowdown_percent"] = speed.slowdown_percent(old, after)
        why = speed.verdict(old, after, stack.speed_gate.max_slowdown_percent)
        if why:
            result.speed["passed"] = False
            raise SpeedGateFailed(f"speed gate on {session.name}: {why}")
        result.speed["passed"] = True
        result.steps.append(f"speed gate: {old.tokens_per_second} -> {after.tokens_per_second} tokens/s "
                            f"({result.speed['slowdown_percent']}% slower; allowed "
                            f"{stack.speed_gate.max_slowdown_percent}%)")

    # ---- around the procedure and its undo ----------------------------------------------------------------------
    def wrap(self, procedure: Callable, recover: Callable | None) -> tuple[Callable, Callable | None]:
        """procedure and recover with the worker put back where each ends healthy, kept out where not."""
        def wrapped(session, result, log):
            try:
                procedure(session, result, log)
            except BaseException:
                self._left_out(session, result, log, "the host failed")
                raise
            self.rejoin(session, result, log)
            self._speed_into_lock(session, result, log)

        def wrapped_recover(session, result, log):
            recover(session, result, log)
            if self._taken_out(result) and self._serving(session):
                try:
                    self.rejoin(session, result, log)
                except GpufleetError as exc:
                    log(f"router: could not re-add the worker after the rollback: {exc}")
                    self._left_out(session, result, log, str(exc))
        return wrapped, (wrapped_recover if recover is not None else None)

    # ---- drain and rejoin ---------------------------------------------------------------------------------------
    def drain(self, session, result, log) -> None:
        stack = self.stacks[session.name]
        url = worker_url(session.host, stack)
        with self._lock:
            workers = self.client.workers()
            mine = next((w for w in workers if w.url == url), None)
            if mine is None and session.name in self.previous_out:
                # the roll this one resumes took it out and left it out: put it back once it proves healthy
                result.router = {"worker_url": url, "taken_out": True, "state": "out", "drain_seconds": 0.0}
                log(f"router: {url} was left out by the roll this one resumes: it is re-added once healthy")
                result.steps.append("router: out since the resumed roll (no drain needed)")
                return
            if mine is None:
                result.router = {"worker_url": url, "state": "absent", "taken_out": False}
                log(f"router: {url} is not one of its workers: nothing to drain (it will not be added)")
                result.steps.append("router: absent (not drained, not added)")
                return
            others = self._healthy_others(workers, mine)
            if not others:
                raise DrainRefused(f"host {session.name}: its worker {url} is the last healthy worker of model "
                                   f"{mine.model_id!r} in the router {self.client.admin_url}; refusing to drain it "
                                   f"(bring another worker of the model up first)")
            self._draining.add(url)
            result.router = {"worker_url": url, "model_id": mine.model_id, "taken_out": True, "state": "draining",
                             "removed_at": _now()}
            self.client.remove(mine)
        log(f"router: removed {url} (model {mine.model_id}); {len(others)} other healthy worker(s) serve it")
        started = self.clock()
        self.client.wait_gone(url, self.drain_timeout)
        first, cut = self._wait_idle(session, stack, log, started)
        seconds = round(self.clock() - started, 2)
        result.router.update(state="drained", drained_at=_now(), drain_seconds=seconds, in_flight_at_removal=first,
                             cut_requests=cut)
        self._save()
        note = f"router: drained in {seconds}s ({first} request(s) in flight at removal"
        note += f"; {cut} cut at the drain timeout)" if cut else ")"
        result.steps.append(note)
        log(note)

    def _healthy_others(self, workers: list[Worker], mine: Worker) -> list[Worker]:
        return [w for w in workers if w.model_id == mine.model_id and w.url != mine.url and w.healthy
                and w.url not in self._draining]

    def _wait_idle(self, session, stack, log, started: float) -> tuple[int, int]:
        """Wait until the server has no request in flight: (requests at the first read, requests cut)."""
        address = health.Gate(session, stack).address
        first, said, zeros = None, started, 0
        while True:
            try:
                now_in_flight = inflight.in_flight(session, stack.server.port, address)
            except inflight.LoadUnknown as exc:
                log(f"router: WARNING: cannot read the server's requests in flight ({exc}); not waiting")
                return first or 0, 0
            first = now_in_flight if first is None else first
            # idle twice in a row: a request the router picked this worker for just before the removal may still be
            # on its way (connected, not yet counted by the server)
            zeros = zeros + 1 if now_in_flight == 0 else 0
            if zeros >= 2:
                return first, 0
            if now_in_flight == 0:
                self.sleep(POLL)
                continue
            waited = self.clock() - started
            if waited > self.drain_timeout:
                if self.on_drain_timeout == "cut":
                    log(f"router: WARNING: {now_in_flight} request(s) still in flight after the drain timeout "
                        f"({self.drain_timeout:.0f}s): stopping the server cuts them")
                    return first, now_in_flight
                if self.clock() - said >= self.drain_timeout:
                    log(f"router: {now_in_flight} request(s) still in flight after {waited:.0f}s; waiting "
                        f"(on_drain_timeout = wait)")
                    said = self.clock()
            self.sleep(POLL)

    def rejoin(self, session, result, log) -> None:
        """Put a worker this roll took out back, and wait until the router reports it healthy."""
        if not self._taken_out(result):
            return
        url = result.router["worker_url"]
        started = self.clock()
        result.router["readded_at"] = _now()  # from here the router may send it requests
        existing = self.client.find(url)
        worker_id = existing.id if existing else self.client.add(url)
        self.client.wait_healthy(url, self.rejoin_timeout, worker_id)
        with self._lock:
            self._draining.discard(url)
        result.router.update(state="in", rejoined_at=_now(), rejoin_seconds=round(self.clock() - started, 2))
        if self.summary is not None and session.name in self.summary.out_of_router:
            self.summary.out_of_router.remove(session.name)
        self._save()
        result.steps.append(f"router: re-added, healthy after {result.router['rejoin_seconds']}s")
        log(f"router: {url} re-added and healthy")

    def _left_out(self, session, result, log, why: str) -> None:
        if not self._taken_out(result):
            return
        result.router["state"] = "out"
        if self.summary is not None and session.name not in self.summary.out_of_router:
            self.summary.out_of_router.append(session.name)
        self._save()
        log(f"router: {result.router['worker_url']} stays out of the router ({why.splitlines()[0][:200]})")

    @staticmethod
    def _taken_out(result) -> bool:
        return bool(result.router and result.router.get("taken_out"))

    def _serving(self, session) -> bool:
        stack = self.stacks[session.name]
        try:
            resp = health.request(session, stack.server.port, "GET", "/health", address=health.Gate(session, stack).address)
        except health._REQUEST_ERRORS:
            return False
        return resp.status == 200

    # ---- speed ------------------------------------------------------------------------------------------------
    def _gate_on(self, session) -> bool:
        return self.stacks[session.name].speed_gate.enabled

    def measure(self, session, result, log, when: str) -> speed.Speed | None:
        stack = self.stacks[session.name]
        if when == "before" and not self._serving(session):
            log("speed gate: the server is not serving: no figure before the change")
            return None
        found = speed.measure(session, stack, served_name(session.host, stack), health.Gate(session, stack).address)
        result.speed = {**(result.speed or {}), when: found.to_json()}
        self._save()
        log(f"speed gate: {when}: {found.tokens_per_second} tokens/s ({found.concurrency} x {found.max_tokens} "
            f"tokens in {found.seconds}s)")
        return found

    def _speed_into_lock(self, session, result, log) -> None:
        """The lock this host just recorded gets the speed gate's two figures (kept beside the stack they measured)."""
        figures = result.speed or {}
        if not (self.summary and self.summary.lock and figures.get("before") and figures.get("after")):
            return
        found = lock.load(self.summary.lock)
        if found.lock.canary != session.name or found.speed is not None:
            return
        before, after = figures["before"], figures["after"]
        found = found.model_copy(update={"speed": lock.LockSpeed(
            host=session.name, before_tokens_per_second=before["tokens_per_second"],
            after_tokens_per_second=after["tokens_per_second"], concurrency=after["concurrency"],
            max_tokens=after["max_tokens"])})
        path = Path(self.summary.lock)
        tmp = path.with_suffix(".toml.tmp")
        tmp.write_text(lock.render(found))
        os.replace(tmp, path)
        log(f"fleet lock {path.name}: speed {before['tokens_per_second']} -> {after['tokens_per_second']} tokens/s")

    def _save(self) -> None:
        if self.record is not None:
            self.record.save()
