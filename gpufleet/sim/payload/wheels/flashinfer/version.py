"""Version of this flashinfer-python build."""

__version__ = "@VERSION@"
__git_version__ = "@GIT_VERSION@"
