"""The companion-package checks real flashinfer runs at import (flashinfer/jit/env.py)."""

from __future__ import annotations

import importlib
import importlib.util
import os

from flashinfer.version import __version__ as flashinfer_version

HINT = "Please install the same version of both packages. Set FLASHINFER_DISABLE_VERSION_CHECK=1 to bypass this check."


def companion_version(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    return importlib.import_module(module).__version__


def public(version: str) -> str:
    return version.split("+", 1)[0]


def check_companion_versions() -> None:
    if os.environ.get("FLASHINFER_DISABLE_VERSION_CHECK") == "1":
        return
    cubin = companion_version("flashinfer_cubin")
    if cubin is not None and cubin != flashinfer_version:
        raise RuntimeError(
            f"flashinfer-cubin version ({cubin}) does not match flashinfer version ({flashinfer_version}). {HINT}"
        )
    jit_cache = companion_version("flashinfer_jit_cache")
    # The jit-cache wheel carries a CUDA suffix (0.6.5+cu130); only its public version must match.
    if jit_cache is not None and public(jit_cache) != flashinfer_version:
        raise RuntimeError(
            f"flashinfer-jit-cache version ({jit_cache}) does not match flashinfer version ({flashinfer_version}). "
            f"{HINT}"
        )
