// Toy silu_and_mul (gpufleet simulated sgl-kernel): one small kernel, compiled for every gencode of the build.
#include <cutlass/cutlass.h>

#include "sgl_kernel_ops.h"

__global__ void silu_and_mul_kernel(float* out, const float* input, int d) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < d) {
    float x = input[i];
    out[i] = cutlass::silu(x) * input[d + i];
  }
}

extern "C" int sgl_kernel_silu_and_mul_grid(int n) {
  return (n + 255) / 256;
}
