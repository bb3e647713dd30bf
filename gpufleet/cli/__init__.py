"""The command line: what each Invoke task does, rendering, live progress."""

import sys


def keep_bytecode_caches() -> None:
    """Undo Invoke's `sys.dont_write_bytecode = True` (its --write-pyc is off by default, set as it parses the core
    flags) for the modules imported after it: else every `inv` compiles gpufleet's modules from source again (0.05 s
    of CPU here). Python's own switches (-B, PYTHONDONTWRITEBYTECODE) still decide."""
    sys.dont_write_bytecode = bool(sys.flags.dont_write_bytecode)
