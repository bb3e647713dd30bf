"""Import the installed stand-in sgl_kernel and run its kernels on the GPU; check them against torch; print JSON.

Run with the server's torch venv, from outside the source tree (so the installed wheel is imported):
    cd /tmp && /opt/torch/.venv/bin/python /path/to/scripts/real-gpu-kernel/check_gpu.py
Exit 0 only when every check passed. Checks (fresh random bf16 inputs at each size, output poisoned with NaN first):
amax and scale equal torch's exactly; every FP8 byte equals torch's own float32 -> float8_e4m3fn conversion of
x * (1 / scale) (clamped to +-448) on the CPU; the dequantized values lie within one rounding step of x; no NaN is
left. Also the code that ran: __CUDA_ARCH__ and whether it was the sm_90a feature set.
"""

from __future__ import annotations

import json
import sys
import time

import torch

import sgl_kernel

FP8_MAX = 448.0
SIZES = (1, 1000, (1 << 20) + 3, 64 << 20)


def check(n: int, gen: torch.Generator) -> dict:
    x = (torch.randn(n, generator=gen, dtype=torch.float32) * 3.0).to(torch.bfloat16)
    xd = x.cuda()
    q = torch.full((n,), float("nan"), dtype=torch.float32, device="cuda").to(torch.float8_e4m3fn)  # poison
    q, scale, amax = sgl_kernel.per_tensor_quant_fp8(xd, q)
    torch.cuda.synchronize()
    ref_amax = x.float().abs().max()
    ref_scale = ref_amax / FP8_MAX
    inv = torch.tensor(1.0, dtype=torch.float32) / ref_scale
    ref_q = (x.float() * inv).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    got = q.cpu()
    mismatched = int((got.view(torch.uint8) != ref_q.view(torch.uint8)).sum())
    deq = got.float() * scale.cpu()
    err = (deq - x.float()).abs()
    bound = torch.maximum(x.float().abs() * 2.0 ** -4, torch.full_like(err, 2.0 ** -10) * ref_scale)
    return {
        "n": n, "amax": float(amax.cpu()), "ref_amax": float(ref_amax), "scale": float(scale.cpu()),
        "ref_scale": float(ref_scale), "amax_equal": bool(amax.cpu() == ref_amax),
        "scale_equal": bool(scale.cpu() == ref_scale), "bytes_mismatched": mismatched,
        "nan_left": int(torch.isnan(got.float()).sum()), "max_abs_err": float(err.max()),
        "within_one_step": bool((err <= bound * (1 + 1e-6)).all()),
    }


def timing(n: int) -> dict:
    x = torch.randn(n, dtype=torch.bfloat16, device="cuda")
    q = torch.empty(n, dtype=torch.float8_e4m3fn, device="cuda")
    for _ in range(3):
        sgl_kernel.per_tensor_quant_fp8(x, q)
    times = []
    for _ in range(20):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        sgl_kernel.per_tensor_quant_fp8(x, q)  # synchronizes its stream itself
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    ms = sorted(times)[len(times) // 2]
    moved = n * 2 * 2 + n  # bf16 read twice (amax, quantize), fp8 written once
    return {"n": n, "median_ms": round(ms, 4), "bytes_moved": moved, "gb_per_s": round(moved / ms / 1e6, 1),
            "note": "includes the C ABI call's own cudaMemsetAsync and cudaStreamSynchronize"}


def main() -> int:
    t0 = time.monotonic()
    out: dict = {"torch": torch.__version__, "torch_cuda": torch.version.cuda,
                 "device": torch.cuda.get_device_name(0), "capability": list(torch.cuda.get_device_capability(0)),
                 "sgl_kernel": sgl_kernel.__version__, "build_info": sgl_kernel.build_info}
    arch, sm90a = sgl_kernel.arch_probe()
    out["arch_probe"] = {"cuda_arch": arch, "sm90a_features": sm90a}
    gen = torch.Generator().manual_seed(int(time.time_ns() % (1 << 31)))
    out["checks"] = [check(n, gen) for n in SIZES]
    out["timing"] = timing(256 << 20)
    ok = (arch == 900 and sm90a and all(c["amax_equal"] and c["scale_equal"] and c["bytes_mismatched"] == 0
                                          and c["nan_left"] == 0 and c["within_one_step"] for c in out["checks"]))
    out["ok"] = ok
    out["seconds"] = round(time.monotonic() - t0, 2)
    print(json.dumps(out, indent=2))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
