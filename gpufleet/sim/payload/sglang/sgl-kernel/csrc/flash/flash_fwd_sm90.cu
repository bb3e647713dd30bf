// Toy FA3 forward (gpufleet simulated sgl-kernel): flash_ops is built for sm_90a only, as upstream's FA3.
#include <cutlass/cutlass.h>

__global__ void flash_fwd_kernel(float* out, const float* q, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    out[i] = cutlass::silu(q[i]);
  }
}

extern "C" int sgl_kernel_flash_fwd_ready(void) {
  return CUTLASS_MAJOR > 0;
}
