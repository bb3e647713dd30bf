"""`inv` in this checkout: the installed `gpufleet` command's tasks (gpufleet/cli/tasks.py), over this directory's
fleet files (hosts/, stack.toml, patches/, runs/, locks/) unless $GPUFLEET_DIR names another (run `inv --list`)."""

from pathlib import Path

from gpufleet.cli import fleetdir, keep_bytecode_caches

keep_bytecode_caches()
fleetdir.use_default(Path(__file__).resolve().parent)

from gpufleet.cli.tasks import ns  # noqa: E402

__all__ = ["ns"]
