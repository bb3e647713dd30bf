#include "build_info.h"
#include "sgl_kernel_ops.h"

extern "C" const char* sgl_kernel_build_info() { return SGL_KERNEL_BUILD_INFO; }

extern "C" int sgl_kernel_has_fp4() {
#ifdef ENABLE_NVFP4
  return sgl_kernel_nvfp4_scaled_mm_ready();
#else
  return 0;
#endif
}
