# Locate cuBLASLt headers and library.
# Sets STITCH_CUBLASLT_INCLUDE_DIR, STITCH_CUBLASLT_LIBRARY, STITCH_CUBLASLT_LIBRARY_DIR and
# STITCH_CUBLASLT_RPATH_EXTRA. Order: the CUDA toolkit CMake found; then NVIDIA's wheel
# (nvidia-cublas, laid out as nvidia/cu13/{include,lib}) in the Python environment building us.

find_path(_lt_inc cublasLt.h HINTS ${CUDAToolkit_INCLUDE_DIRS} NO_DEFAULT_PATH)
find_library(_lt_lib NAMES cublasLt HINTS ${CUDAToolkit_LIBRARY_DIR} NO_DEFAULT_PATH)

if(_lt_inc AND _lt_lib)
  set(STITCH_CUBLASLT_INCLUDE_DIR "${_lt_inc}")
  set(STITCH_CUBLASLT_LIBRARY "${_lt_lib}")
  get_filename_component(STITCH_CUBLASLT_LIBRARY_DIR "${_lt_lib}" DIRECTORY)
  set(STITCH_CUBLASLT_RPATH_EXTRA "${STITCH_CUBLASLT_LIBRARY_DIR}")
  message(STATUS "stitchcuda: cuBLASLt from the CUDA toolkit: ${_lt_lib}")
else()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, nvidia; print(';'.join(os.path.join(p, 'cu13') for p in nvidia.__path__))"
    OUTPUT_VARIABLE _wheel_roots OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  foreach(_root IN LISTS _wheel_roots)
    if(EXISTS "${_root}/include/cublasLt.h" AND EXISTS "${_root}/lib/libcublasLt.so.13")
      set(STITCH_CUBLASLT_INCLUDE_DIR "${_root}/include")
      set(STITCH_CUBLASLT_LIBRARY "${_root}/lib/libcublasLt.so.13")
      set(STITCH_CUBLASLT_LIBRARY_DIR "${_root}/lib")
      break()
    endif()
  endforeach()
  if(NOT STITCH_CUBLASLT_LIBRARY)
    message(FATAL_ERROR
      "stitchcuda: cuBLASLt not found: the CUDA toolkit at '${CUDAToolkit_LIBRARY_DIR}' has no "
      "libcublasLt and the Python environment has no nvidia-cublas wheel (pip install 'nvidia-cublas>=13,<14').")
  endif()
  # The wheel is found again at run time through $ORIGIN/../../nvidia/cu13/lib; no absolute path.
  set(STITCH_CUBLASLT_RPATH_EXTRA "")
  message(STATUS "stitchcuda: cuBLASLt from the nvidia-cublas wheel: ${STITCH_CUBLASLT_LIBRARY}")
endif()
