"""gpufleet's stand-in for sgl_kernel: loads the built common_ops library (C ABI, ctypes) and exposes its build info.

`build_info` is what gpufleet's sgl-kernel role records after a build (`archs`, `fp4`); `per_tensor_quant_fp8` and
`arch_probe` run the library's kernels on the GPU. Importing needs no GPU and no torch; the kernels need both.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

__version__ = "0.0.1"
__all__ = ["__version__", "build_info", "per_tensor_quant_fp8", "arch_probe"]


def _parse(text: str) -> dict:
    info: dict = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    info["archs"] = [a for a in info.get("archs", "").split(",") if a]
    info["fp4"] = info.get("fp4") == "1"
    return info


def _load() -> tuple[ctypes.CDLL, dict]:
    libraries = sorted(Path(__file__).parent.glob("common_ops*.so"))
    if not libraries:
        raise ImportError("[sgl_kernel] CRITICAL: Could not load any common_ops library (none was built)")
    lib = ctypes.CDLL(str(libraries[0]))
    lib.sgl_kernel_build_info.restype = ctypes.c_char_p
    lib.sgl_standin_error_string.restype = ctypes.c_char_p
    lib.sgl_standin_error_string.argtypes = [ctypes.c_int]
    lib.sgl_standin_per_tensor_quant_fp8.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p,
                                                     ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.sgl_standin_arch_probe.argtypes = [ctypes.POINTER(ctypes.c_int)]
    return lib, {**_parse(lib.sgl_kernel_build_info().decode()), "library": str(libraries[0])}


_lib, build_info = _load()


def _check(err: int, what: str) -> None:
    if err != 0:
        raise RuntimeError(f"sgl_kernel {what}: CUDA error {err}: {_lib.sgl_standin_error_string(err).decode()}")


def arch_probe() -> tuple[int, bool]:
    """(__CUDA_ARCH__ of the code that ran on the GPU, whether it was built for the sm_90a feature set)."""
    out = (ctypes.c_int * 2)()
    _check(_lib.sgl_standin_arch_probe(out), "arch_probe")
    return out[0], bool(out[1])


def per_tensor_quant_fp8(x, q=None):
    """bf16 CUDA tensor -> (float8_e4m3fn tensor, scale, amax) with scale = amax / 448, on torch's current stream."""
    import torch

    if x.dtype != torch.bfloat16 or not x.is_cuda or not x.is_contiguous():
        raise ValueError("x must be a contiguous bf16 CUDA tensor")
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) if q is None else q
    amax = torch.empty((), dtype=torch.float32, device=x.device)
    scale = torch.empty((), dtype=torch.float32, device=x.device)
    stream = torch.cuda.current_stream(x.device).cuda_stream
    _check(_lib.sgl_standin_per_tensor_quant_fp8(x.data_ptr(), x.numel(), q.data_ptr(), amax.data_ptr(),
                                                 scale.data_ptr(), stream), "per_tensor_quant_fp8")
    return q, scale, amax
