// Compiled by the host C++ compiler, not nvcc: <cuda/std/version> lives in CUDA 13's include/cccl, which the host
// compiler reaches only through CPLUS_INCLUDE_PATH (the build step's environment), as sgl-kernel's host files do.
#include <cuda/std/version>

#define SGL_STR2(x) #x
#define SGL_STR(x) SGL_STR2(x)

extern "C" const char* sgl_kernel_build_info() {
  return "version=" SGL_KERNEL_VERSION "\n"
         "archs=" SGL_KERNEL_ARCHS "\n"
         "fp4=" SGL_STR(SGL_KERNEL_FP4) "\n"
         "cuda=" SGL_KERNEL_CUDA_VERSION "\n"
         "cxx=" SGL_KERNEL_CXX "\n"
         "cccl=" SGL_STR(CCCL_VERSION) "\n";
}
