"""The command line: what each Invoke task does, rendering, live progress."""

import sys


def keep_bytecode_caches() -> None:
    """Undo Invoke's `sys.dont_write_bytecode = True` (its --write-pyc is off by default, set as it parses the core
    flags) for the modules imported after it: else every `inv` compiles gpufleet's modules from source again (0.05 s
    of CPU here). Python's own switches (-B, PYTHONDONTWRITEBYTECODE) still decide."""
    sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)


def exit_without_collecting() -> None:
    """At exit, freeze what the run allocated (gc.freeze) instead of letting the interpreter's final garbage
    collections walk it: with pydantic's schemas, paramiko and the roles loaded, those took 70-100 ms after the last
    line was printed (8 ms frozen; issue 13). Exit handlers, flushes and module teardown still run as ever."""
    import atexit
    import gc

    atexit.register(gc.freeze)
