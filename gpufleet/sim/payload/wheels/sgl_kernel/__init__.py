"""Stand-in sgl-kernel (prebuilt wheel): version, FP4 op entry points, and what the build targeted."""

from __future__ import annotations

import json
import os

import torch

__version__ = "@VERSION@"
build_info = json.loads('@BUILD_INFO@')
FP4_OPS = ("cutlass_scaled_fp4_mm", "scaled_fp4_quant", "scaled_fp4_experts_quant", "cutlass_fp4_group_mm")
# The symbol a torch of another minor release no longer exports, as real ABI breaks report it.
MISSING_SYMBOL = "_ZN3c1013MessageLogger6streamB5cxx11Ev"


def _release(version: str) -> tuple[str, ...]:
    return tuple(version.split("+")[0].split(".")[:2])


def _check_torch_abi() -> None:
    if os.environ.get("SGL_KERNEL_SIM_SKIP_ABI_CHECK") == "1":
        return
    if _release(torch.__version__) == _release(build_info["torch"]):
        return
    library = os.path.join(os.path.dirname(__file__), "sm100", "common_ops.abi3.so")
    major, minor = torch.cuda.get_device_capability() if torch.cuda.is_available() else (0, 0)
    raise ImportError(
        "[sgl_kernel] CRITICAL: Could not load any common_ops library!\n"
        f"- ImportError: {library}: undefined symbol: {MISSING_SYMBOL}\n"
        f"GPU Info: Compute capability: {major}{minor}, Expected variant: SM{major}{minor}, "
        f"CUDA version: {torch.version.cuda}\n"
        f"(sgl-kernel {__version__} was built against torch {build_info['torch']}, this is torch {torch.__version__})\n"
        "Please ensure sgl_kernel is properly installed with:\npip install --upgrade sgl_kernel"
    )


def _make_op(name: str):
    def op(*args, **kwargs):
        return {"op": name, "args": len(args), "kwargs": sorted(kwargs)}

    op.__name__ = name
    return op


_check_torch_abi()
for _name in FP4_OPS if build_info.get("fp4") else ():
    globals()[_name] = _make_op(_name)
    torch.ops._register("sgl_kernel", _name, globals()[_name])
