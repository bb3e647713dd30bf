#pragma once

extern "C" {
const char* sgl_kernel_build_info();
int sgl_kernel_has_fp4();
#ifdef ENABLE_NVFP4
int sgl_kernel_nvfp4_scaled_mm_ready();
#endif
}
