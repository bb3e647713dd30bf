// Toy scaled_fp4_quant (gpufleet simulated sgl-kernel): as upstream's nvfp4 sources, the kernel exists only when
// the build defines ENABLE_NVFP4 (CUDA >= 12.8 or SGL_KERNEL_ENABLE_FP4).
#include <cutlass/cutlass.h>

#include "sgl_kernel_ops.h"

#if defined ENABLE_NVFP4 && ENABLE_NVFP4
__global__ void scaled_fp4_quant_kernel(unsigned char* out, const float* input, float global_scale, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = static_cast<unsigned char>(fminf(fabsf(input[i] * global_scale), 6.0f) * 2.0f);
  }
}

extern "C" int sgl_kernel_nvfp4_enabled(void) {
  return CUTLASS_MAJOR > 0;
}
#else
extern "C" int sgl_kernel_nvfp4_enabled(void) {
  return 0;
}
#endif
