"""Stand-in for torch's C extension: only the build flags other builds read."""

_GLIBCXX_USE_CXX11_ABI = True
