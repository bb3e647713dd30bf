"""Sessions opened ahead (engine.runner.open_ahead): for_each_host takes them instead of opening its own, a failed
open is reported as the host's own open would be, and what nobody takes is closed, even while still connecting."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from gpufleet.engine import runner
from gpufleet.errors import UnreachableError


class Session:
    """A stand-in HostSession: counts opens and closes; `gate` holds an open until set; `fail` makes it raise."""

    def __init__(self, name: str, fail: bool = False, gate: threading.Event | None = None):
        self.name, self.fail, self.gate = name, fail, gate
        self.opens = self.closes = 0
        self.conn = None

    def open(self):
        if self.gate is not None:
            self.gate.wait(10)
        self.opens += 1
        if self.fail:
            raise UnreachableError(f"host {self.name} (10.0.0.9): cannot connect: refused")
        self.conn = object()
        return self

    def close(self):
        self.closes += 1
        self.conn = None

    def __enter__(self):
        return self.open() if self.conn is None else self

    def __exit__(self, *exc):
        self.close()


def hosts(*names):
    return [SimpleNamespace(name=n) for n in names]


def fleet(monkeypatch, **special):
    """An inventory of parallelism 8 whose sessions are Session stand-ins, each kept by name in `made`."""
    made: dict[str, list[Session]] = {}

    def session_for(host, inventory, secrets=(), dialed=None):
        session = special.get(host.name, lambda: Session(host.name))()
        made.setdefault(host.name, []).append(session)
        return session

    monkeypatch.setattr(runner, "session_for", session_for)
    return SimpleNamespace(settings=SimpleNamespace(parallelism=8)), made


def test_the_work_runs_on_the_session_opened_ahead(monkeypatch):
    inventory, made = fleet(monkeypatch)
    with runner.open_ahead(hosts("gpu1", "gpu2"), inventory) as opened:
        outcomes = runner.for_each_host(hosts("gpu1", "gpu2"), inventory, lambda s: id(s), opened=opened)
    assert [o.value for o in outcomes] == [id(made["gpu1"][0]), id(made["gpu2"][0])]
    assert all(len(made[n]) == 1 and made[n][0].opens == 1 and made[n][0].closes == 1 for n in ("gpu1", "gpu2"))


def test_an_open_that_failed_ahead_is_the_hosts_outcome(monkeypatch):
    inventory, made = fleet(monkeypatch, gpu2=lambda: Session("gpu2", fail=True))
    with runner.open_ahead(hosts("gpu1", "gpu2"), inventory) as opened:
        outcomes = runner.for_each_host(hosts("gpu1", "gpu2"), inventory, lambda s: "read", opened=opened)
    assert outcomes[0].ok and outcomes[0].value == "read"
    assert outcomes[1].kind == "unreachable" and "cannot connect: refused" in outcomes[1].error
    assert len(made["gpu2"]) == 1 and made["gpu2"][0].opens == 1  # not tried again behind the report's back


def test_sessions_nobody_takes_are_closed_even_one_still_connecting(monkeypatch):
    gate = threading.Event()
    inventory, made = fleet(monkeypatch, gpu2=lambda: Session("gpu2", gate=gate))
    opened = runner.open_ahead(hosts("gpu1", "gpu2"), inventory)
    opened.close()  # returns at once: gpu2 is still connecting
    first, second = made["gpu1"][0], made["gpu2"][0]
    wait_for(lambda: first.closes == 1)  # by close(), or by its own thread if its open ended after
    assert second.opens == 0 and second.closes == 0
    gate.set()
    wait_for(lambda: second.closes == 1)
    assert second.opens == 1 and first.opens == 1  # closed by its own thread once open; nothing opened twice


def wait_for(condition) -> None:
    for _ in range(1000):
        if condition():
            return
        threading.Event().wait(0.01)
    raise AssertionError("not within 10 s")


def test_only_sessions_opened_with_the_same_secrets_are_taken(monkeypatch):
    inventory, made = fleet(monkeypatch)
    with runner.open_ahead(hosts("gpu1"), inventory, ("hf_secret",)) as opened:
        runner.for_each_host(hosts("gpu1"), inventory, lambda s: None, opened=opened)  # no secrets: its own session
    assert len(made["gpu1"]) == 2 and [s.closes for s in made["gpu1"]] == [1, 1]


def test_only_the_first_wave_is_opened_ahead(monkeypatch):
    inventory, made = fleet(monkeypatch)
    with runner.open_ahead(hosts("gpu1", "gpu2", "gpu3"), inventory, parallelism=2) as opened:
        runner.for_each_host(hosts("gpu1", "gpu2", "gpu3"), inventory, lambda s: None, parallelism=2, opened=opened)
    assert sorted(made) == ["gpu1", "gpu2", "gpu3"] and all(len(v) == 1 for v in made.values())


def test_a_task_opens_ahead_what_its_first_pass_takes(monkeypatch):
    from gpufleet.cli import tasks

    asked = []
    monkeypatch.setattr(runner, "open_ahead", lambda hosts, inventory, secrets=(): asked.append(
        ([h.name for h in hosts], secrets)))
    both = hosts("gpu1", "gpu2")
    roll = SimpleNamespace(rolls=True, resumed=None, hosts=both, inventory=None, hidden=("tok",))
    tasks._opened_ahead(roll)
    tasks._opened_ahead(SimpleNamespace(**{**vars(roll), "resumed": object()}))  # a resumed roll surveys only some
    single = SimpleNamespace(rolls=False, hosts=both[:1], inventory=None, hidden=("tok",))
    tasks._opened_ahead(single)  # an upgrade's sessions mask only their own secrets
    tasks._opened_ahead(single, single.hidden)  # deploy-model's mask the task's token too
    assert asked == [(["gpu1", "gpu2"], ("tok",)), ([], ("tok",)), (["gpu1"], ()), (["gpu1"], ("tok",))]
