"""JIT environment of the stand-in flashinfer."""
