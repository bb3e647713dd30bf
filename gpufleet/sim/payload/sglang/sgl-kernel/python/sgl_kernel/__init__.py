"""sgl-kernel (simulated tree): loads the built common_ops library and exposes the ops it was built with."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from sgl_kernel.version import __version__

__all__ = ["__version__", "build_info", "FP4_OPS"]

FP4_OPS = ("cutlass_scaled_fp4_mm", "scaled_fp4_quant", "scaled_fp4_experts_quant", "cutlass_fp4_group_mm")
# The symbol a torch of another minor release no longer exports, as real ABI breaks report it.
MISSING_SYMBOL = "_ZN3c1013MessageLogger6streamB5cxx11Ev"


def _critical(details: list[str]) -> ImportError:
    major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
    return ImportError(
        "[sgl_kernel] CRITICAL: Could not load any common_ops library!\n"
        + "".join(f"- {line}\n" for line in details)
        + f"GPU Info: Compute capability: {major}{minor}, Expected variant: SM{major}{minor}, "
        f"CUDA version: {torch.version.cuda}\n"
        "Please ensure sgl_kernel is properly installed with:\npip install --upgrade sgl_kernel"
    )


def _parse(text: str) -> dict:
    info: dict = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    info["archs"] = [arch for arch in info.get("archs", "").split(",") if arch]
    info["fp4"] = info.get("fp4") == "1"
    info["cxx11_abi"] = info.get("cxx11_abi") == "1"
    return info


def _load() -> tuple[ctypes.CDLL, dict]:
    libraries = sorted(Path(__file__).parent.glob("common_ops*.so"))
    if not libraries:
        raise _critical(["ModuleNotFoundError: No module named 'common_ops'"])
    lib = ctypes.CDLL(str(libraries[0]))
    lib.sgl_kernel_build_info.restype = ctypes.c_char_p
    info = _parse(lib.sgl_kernel_build_info().decode())
    info["fp4"] = info["fp4"] and lib.sgl_kernel_has_fp4() == 1
    return lib, {**info, "library": str(libraries[0])}


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def _check_torch_abi(info: dict) -> None:
    if os.environ.get("SGL_KERNEL_SIM_SKIP_ABI_CHECK") == "1" or _release(torch.__version__) == _release(info["torch"]):
        return
    raise _critical([f"ImportError: {info['library']}: undefined symbol: {MISSING_SYMBOL}",
                     f"(built against torch {info['torch']}, this is torch {torch.__version__})"])


def _make_op(name: str):
    def op(*args, **kwargs):
        return {"op": name, "args": len(args), "kwargs": sorted(kwargs)}

    op.__name__ = name
    return op


_lib, build_info = _load()
_check_torch_abi(build_info)
for _name in FP4_OPS if build_info["fp4"] else ():
    globals()[_name] = _make_op(_name)
    torch.ops._register("sgl_kernel", _name, globals()[_name])
