// Entry points the CUDA sources define and the extension module (common_extension.cc) calls.
#pragma once

#ifdef __cplusplus
extern "C" {
#endif

// 1 when this library was compiled with ENABLE_NVFP4 (the FP4 ops are registered), else 0.
int sgl_kernel_nvfp4_enabled(void);
// Launch nothing; returns the number of elements a toy kernel would process (keeps the device code linked).
int sgl_kernel_silu_and_mul_grid(int n);

#ifdef __cplusplus
}
#endif
