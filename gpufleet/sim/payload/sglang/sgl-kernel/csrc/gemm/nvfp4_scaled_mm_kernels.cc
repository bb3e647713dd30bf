// NVFP4 GEMM entry points. CUDA 13 moved libcu++ headers such as this one under include/cccl/.
#include <cuda/atomic>

#include "sgl_kernel_ops.h"

extern "C" int sgl_kernel_nvfp4_scaled_mm_ready() {
  cuda::atomic<int> ready{1};
  return ready.load();
}
