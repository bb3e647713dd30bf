// What the running GPU code was compiled for: __CUDA_ARCH__ of the machine code the driver picked, and whether it
// was the arch-specific sm_90a target (__CUDA_ARCH_FEAT_SM90_ALL, defined only when compiling for compute_90a).
#include <cuda_runtime.h>

namespace {

__global__ void arch_probe_kernel(int* out) {
#ifdef __CUDA_ARCH__
  out[0] = __CUDA_ARCH__;
#endif
#ifdef __CUDA_ARCH_FEAT_SM90_ALL
  out[1] = 1;
#else
  out[1] = 0;
#endif
}

}  // namespace

// Fills arch[0] = __CUDA_ARCH__, arch[1] = 1 if built for sm_90a; returns a cudaError_t (0 = success).
extern "C" int sgl_standin_arch_probe(int* host_out) {
  int* d = nullptr;
  cudaError_t err = cudaMalloc(&d, 2 * sizeof(int));
  if (err != cudaSuccess) return err;
  int poison[2] = {-1, -1};
  cudaMemcpy(d, poison, sizeof(poison), cudaMemcpyHostToDevice);
  arch_probe_kernel<<<1, 1>>>(d);
  err = cudaGetLastError();
  if (err == cudaSuccess) err = cudaMemcpy(host_out, d, 2 * sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(d);
  return err;
}

extern "C" const char* sgl_standin_error_string(int err) { return cudaGetErrorString(static_cast<cudaError_t>(err)); }
