"""Stand-in triton for the simulated fleet: only its version."""

__version__ = "@VERSION@"
