"""Stand-in flashinfer-cubin (precompiled kernels) for the simulated fleet."""

__version__ = "@VERSION@"
