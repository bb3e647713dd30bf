"""`inv status`'s gate for the comparison imports (cli/common.py): open once every host's exec is on its way."""

from __future__ import annotations

import threading

from gpufleet.cli.common import AllSent


def test_opens_only_when_every_host_has_sent():
    gate = AllSent(3)
    for _ in range(2):
        gate.arrive()
        assert not gate.event.is_set()
    gate.arrive()
    assert gate.event.is_set()


def test_arrivals_from_many_threads_count_once_each():
    gate = AllSent(64)
    start = threading.Barrier(64)

    def host():
        start.wait()
        gate.arrive()

    threads = [threading.Thread(target=host) for _ in range(63)]
    for t in threads:
        t.start()
    start.wait()  # the 64th party: all arrive together, less one
    for t in threads:
        t.join()
    assert not gate.event.is_set() and gate.left == 1
    gate.arrive()
    assert gate.event.is_set()


def test_no_hosts_is_open_at_once():
    assert AllSent(0).event.is_set()
