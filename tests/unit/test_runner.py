"""for_each_host without hosts: one host's failure stops only that host, and its outcome keeps the exception."""

from __future__ import annotations

from types import SimpleNamespace

from gpufleet.config.inventory import Host
from gpufleet.engine import runner
from gpufleet.engine.command import Cmd
from gpufleet.testing.session import FakeSession


def test_a_failed_host_keeps_the_exception_with_its_result_and_command(monkeypatch):
    sessions = {"gpu1": FakeSession(name="gpu1", default=(0, "fine\n")),
                "gpu2": FakeSession(name="gpu2", default=(2, "boom\n"))}
    monkeypatch.setattr(runner, "session_for", lambda host, inventory, secrets=(), dialed=None: sessions[host.name])
    inventory = SimpleNamespace(settings=SimpleNamespace(parallelism=2))
    hosts = [Host(name="gpu1", address="10.0.0.1"), Host(name="gpu2", address="10.0.0.2")]
    ok, failed = runner.for_each_host(hosts, inventory, lambda s: s.run(Cmd.of("check"), "check").output)
    assert ok.ok and ok.value == "fine\n" and ok.exception is None
    assert failed.kind == "failed" and failed.error == str(failed.exception)
    assert "host gpu2: step 'check' failed: `check` returned exit code 2" in failed.error
    assert failed.exception.result.output == "boom\n" and failed.exception.cmd == Cmd.of("check")
