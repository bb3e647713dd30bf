"""Stand-in flashinfer-jit-cache (prebuilt kernel cache, per CUDA version) for the simulated fleet."""

__version__ = "@VERSION@"
