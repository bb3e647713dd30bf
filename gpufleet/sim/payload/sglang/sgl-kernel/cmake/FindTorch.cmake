# Stand-in for torch's TorchConfig.cmake (gpufleet simulated sglang): the simulated torch wheel has no CMake package
# and no libraries. Like torch's Caffe2 cuda.cmake it sets CUDA_VERSION (major.minor of the toolkit found), which
# the CMakeLists' gencode and FA3 conditions read; and it records the torch this build saw, which the package reads
# at import to stand in for the C++ ABI a real build links against.
find_package(CUDAToolkit REQUIRED)
set(CUDA_VERSION "${CUDAToolkit_VERSION_MAJOR}.${CUDAToolkit_VERSION_MINOR}")
message(STATUS "Caffe2: CUDA detected: ${CUDA_VERSION}")

execute_process(
    COMMAND "${Python_EXECUTABLE}" -c "import torch; print(torch.__version__)"
    OUTPUT_VARIABLE TORCH_VERSION
    ERROR_VARIABLE _torch_error
    RESULT_VARIABLE _torch_result
    OUTPUT_STRIP_TRAILING_WHITESPACE
)
if(NOT _torch_result EQUAL 0)
    message(FATAL_ERROR "Could not import torch with ${Python_EXECUTABLE}: ${_torch_error}")
endif()
set(TORCH_LIBRARIES "")
set(TORCH_BUILD_RECORD "${CMAKE_CURRENT_BINARY_DIR}/_built_with_torch.txt")
file(WRITE "${TORCH_BUILD_RECORD}" "${TORCH_VERSION}\n")
set(Torch_FOUND TRUE)
message(STATUS "Found Torch: ${TORCH_VERSION}")
