"""Stand-in flashinfer for the simulated fleet: version, and the real import-time version rules."""

from flashinfer.jit import env as _env
from flashinfer.version import __git_version__, __version__

_env.check_companion_versions()

__all__ = ["__version__", "__git_version__"]
