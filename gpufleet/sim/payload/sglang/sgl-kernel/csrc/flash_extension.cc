// FlashAttention 3 ops (sm_90a).
extern "C" int sgl_kernel_flash_ops_ready() { return 1; }
