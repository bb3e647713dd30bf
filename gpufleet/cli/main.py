"""The installed `gpufleet` command: Invoke's own Program over the tasks' Collection, as Fabric's `fab` is built.

`gpufleet [--fleet DIR] TASK [flags]` runs the same tasks as `inv` in a checkout; the fleet directory (hosts/,
stack.toml, patches/, runs/, locks/) is --fleet, else $GPUFLEET_DIR, else the current directory.
"""

from __future__ import annotations

from invoke import Argument, Exit, Program

from gpufleet.cli import fleetdir, keep_bytecode_caches
from gpufleet.cli.tasks import ns
from gpufleet.errors import GpufleetError


def version() -> str:
    """gpufleet's installed version (the distribution's metadata), or the source tree's when not installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("gpufleet")
    except PackageNotFoundError:
        return "unknown (not installed)"


class GpufleetProgram(Program):
    """Invoke's Program with one more core flag: --fleet DIR."""

    def print_version(self) -> None:
        # read only for --version: the metadata lookup (importlib.metadata, a sys.path scan) is not every task's cost
        print(f"{self.name} {version()}")

    def core_args(self) -> list[Argument]:
        return super().core_args() + [
            Argument(names=("fleet",), help="the fleet directory holding hosts/, stack.toml and patches/; runs/ "
                                            "and locks/ are written there (default: $GPUFLEET_DIR, else the "
                                            "current directory)"),
        ]

    def parse_core(self, argv) -> None:
        super().parse_core(argv)
        keep_bytecode_caches()  # the tasks' lazy imports come later
        fleetdir.set_explicit(self.args["fleet"].value, prog=self.binary_names[0])
        if self.args["fleet"].value:
            try:
                fleetdir.fleet_dir()
            except GpufleetError as exc:
                raise Exit(f"error: {exc}", code=2) from None

    def parse_tasks(self) -> None:
        # `gpufleet init DIR`: Invoke's positional arguments are required and would eat `-h`, so the task takes
        # --directory and a bare word right after `init` is read as its value.
        words = self.core.unparsed
        if len(words) > 1 and words[0] == "init" and not words[1].startswith("-"):
            self.core.unparsed = ["init", "--directory", *words[1:]]
        super().parse_tasks()


program = GpufleetProgram(name="gpufleet", binary="gpufleet", binary_names=["gpufleet"], namespace=ns)
