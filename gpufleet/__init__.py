"""gpufleet: keep a fleet of Blackwell GPU servers on one known-good SGLang stack, over SSH."""

__version__ = "0.1.0"
