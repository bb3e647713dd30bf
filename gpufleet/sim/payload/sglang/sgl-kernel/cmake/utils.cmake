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

# Simulation only (upstream has no such step): a build of fixed length for benchmarks (bench/bench_roll.py). When the
# host has /etc/gpufleet-sim/build-seconds (SimFleet.set_build_seconds), configuring sleeps that many seconds, as a
# real sgl-kernel build's nvcc minutes would; without the file the build is the toy kernels' compile alone.
if(EXISTS "/etc/gpufleet-sim/build-seconds")
    file(STRINGS "/etc/gpufleet-sim/build-seconds" _sim_build_seconds LIMIT_COUNT 1 REGEX "^[0-9]+$")
    if(_sim_build_seconds)
        message(STATUS "simulated build length: ${_sim_build_seconds} s (/etc/gpufleet-sim/build-seconds)")
        execute_process(COMMAND sleep "${_sim_build_seconds}")
    endif()
endif()
