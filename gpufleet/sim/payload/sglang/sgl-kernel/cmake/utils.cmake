# Stand-in for upstream's cmake/utils.cmake (gpufleet simulated sglang): the helpers the CMakeLists calls.

# find_package(Torch) finds cmake/FindTorch.cmake: the simulated torch wheel ships no CMake package of its own.
list(APPEND CMAKE_MODULE_PATH "${CMAKE_CURRENT_LIST_DIR}")

# Drop the gencode flags torch's CMake adds (TORCH_CUDA_ARCH_LIST) and CMake's default architecture: the gencode
# list the CMakeLists writes into SGL_KERNEL_CUDA_FLAGS is the only one a library is compiled for.
macro(clear_cuda_arches CUDA_ARCH_FLAGS)
    string(REGEX MATCHALL "-gencode[= ]arch=[^ ]+" ${CUDA_ARCH_FLAGS} "${CMAKE_CUDA_FLAGS}")
    string(REGEX REPLACE "-gencode[= ]arch=[^ ]+ *" "" CMAKE_CUDA_FLAGS "${CMAKE_CUDA_FLAGS}")
    set(CMAKE_CUDA_ARCHITECTURES OFF)
endmacro()
