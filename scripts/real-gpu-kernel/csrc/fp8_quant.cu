// Per-tensor FP8 (e4m3) quantization of a bf16 tensor, as sgl-kernel's sgl_per_tensor_quant_fp8 does:
// amax = max |x| (cub::BlockReduce, then one atomic per block), scale = amax / 448, q = sat_e4m3(x * (1 / scale)).
#include <cstdint>

#include <cub/block/block_reduce.cuh>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

namespace {

constexpr int kThreads = 256;
constexpr float kFp8Max = 448.0f;  // largest finite e4m3 value

__global__ void amax_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, float* __restrict__ amax) {
  using Reduce = cub::BlockReduce<float, kThreads>;
  __shared__ typename Reduce::TempStorage tmp;
  float m = 0.0f;
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    m = fmaxf(m, fabsf(__bfloat162float(x[i])));
  }
  float block_max = Reduce(tmp).Reduce(m, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) {
    // non-negative floats order like their bit patterns as signed ints
    atomicMax(reinterpret_cast<int*>(amax), __float_as_int(block_max));
  }
}

__global__ void quant_kernel(const __nv_bfloat16* __restrict__ x, int64_t n, const float* __restrict__ amax,
                             float* __restrict__ scale_out, uint8_t* __restrict__ q) {
  const float scale = *amax / kFp8Max;
  const float inv = 1.0f / scale;
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *scale_out = scale;
  }
  for (int64_t i = blockIdx.x * int64_t(kThreads) + threadIdx.x; i < n; i += int64_t(gridDim.x) * kThreads) {
    float v = __fmul_rn(__bfloat162float(x[i]), inv);
    q[i] = static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3));
  }
}

}  // namespace

// C ABI for ctypes: device pointers in, a cudaError_t out (0 = success). amax must be a device float.
extern "C" int sgl_standin_per_tensor_quant_fp8(const void* x_bf16, int64_t n, void* q_fp8, float* amax,
                                                  float* scale, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  cudaError_t err = cudaMemsetAsync(amax, 0, sizeof(float), s);
  if (err != cudaSuccess) return err;
  int blocks = static_cast<int>((n + kThreads - 1) / kThreads);
  blocks = blocks < 1 ? 1 : (blocks > 1024 ? 1024 : blocks);
  auto x = static_cast<const __nv_bfloat16*>(x_bf16);
  amax_kernel<<<blocks, kThreads, 0, s>>>(x, n, amax);
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  quant_kernel<<<blocks, kThreads, 0, s>>>(x, n, amax, scale, static_cast<uint8_t*>(q_fp8));
  if ((err = cudaGetLastError()) != cudaSuccess) return err;
  return cudaStreamSynchronize(s);
}
