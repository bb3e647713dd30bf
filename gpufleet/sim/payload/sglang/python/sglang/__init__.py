"""SGLang (simulated upstream tree)."""

from sglang.version import __version__

__all__ = ["__version__"]
