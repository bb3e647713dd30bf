"""Ctrl-C during a run that changes hosts: the first finishes (or restores) the hosts in flight and stops before the
next; the second stops now, after writing records that say those hosts' state is unknown and what to run."""

from __future__ import annotations

import os
import signal
import sys
import threading
from typing import Callable

EXIT_INTERRUPTED = 130


class Interrupts:
    """A SIGINT handler for the main thread while hosts are being changed (a no-op in other threads).

    tell: one line to the user, at once; in_flight(): the hosts being changed now; abort(): write what is known
    (records, audit) before a second Ctrl-C ends the process; exit: how the process ends then (os._exit: the threads
    changing hosts are not waited for)."""

    def __init__(self, tell: Callable[[str], None], in_flight: Callable[[], list[str]], abort: Callable[[], None],
                 *, doing: str = "finishing (or restoring, if it fails)", exit: Callable[[int], None] = os._exit):
        self.tell, self.in_flight, self.abort, self.doing, self.exit = tell, in_flight, abort, doing, exit
        self.requested = threading.Event()
        self._previous = None

    @property
    def interrupted(self) -> bool:
        return self.requested.is_set()

    def __enter__(self) -> "Interrupts":
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self.handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def handle(self, signum=signal.SIGINT, frame=None) -> None:
        if not self.requested.is_set():
            self.requested.set()
            hosts = ", ".join(self.in_flight()) or "the hosts in flight"
            line = (f"interrupt: {self.doing} {hosts}, then stopping; hosts not reached stay untouched; Ctrl-C again "
                    f"to stop now")
            # from a thread: the interrupted main thread may hold the output lock this line needs
            threading.Thread(target=self.tell, args=(line,), daemon=True).start()
            return
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, lambda *_: self.exit(EXIT_INTERRUPTED))  # a third one: no more writing
        raw("interrupt again: stopping now, without waiting for the hosts in flight; writing what is known\n")
        try:
            self.abort()
        except BaseException as exc:  # noqa: BLE001 - the exit below must happen whatever the records did
            raw(f"could not write every record: {type(exc).__name__}: {exc}\n")
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            self.exit(EXIT_INTERRUPTED)


def raw(text: str) -> None:
    """Straight to stderr's file descriptor: the interrupted main thread may hold the lock of every other output."""
    try:
        os.write(2, text.encode())
    except OSError:
        pass
