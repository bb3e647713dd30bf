"""Build facts of this (stand-in) torch, shaped like the real torch.version."""

__version__ = "@VERSION@"
cuda = "@CUDA@"
git_version = "@GIT_VERSION@"
hip = None
debug = False
