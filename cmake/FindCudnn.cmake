# Locate cuDNN (9.x) headers and library.
# Sets STITCH_CUDNN_INCLUDE_DIR, STITCH_CUDNN_LIBRARY, STITCH_CUDNN_LIBRARY_DIR and
# STITCH_CUDNN_RPATH_EXTRA. Order: CUDNN_ROOT / CUDNN_HOME / CUDNN_PATH, the CUDA toolkit's folders
# and the system's (a cuDNN installed from a package); then NVIDIA's wheel (nvidia-cudnn-cu13,
# laid out as nvidia/cudnn/{include,lib}) in the Python environment building us.

set(_dnn_hints)
foreach(_var CUDNN_ROOT CUDNN_HOME CUDNN_PATH)
  if(DEFINED ENV{${_var}} AND NOT "$ENV{${_var}}" STREQUAL "")
    list(APPEND _dnn_hints "$ENV{${_var}}")
  endif()
endforeach()

find_path(_dnn_inc cudnn_graph.h
  HINTS ${_dnn_hints} ${CUDAToolkit_INCLUDE_DIRS}
  PATH_SUFFIXES include include/x86_64-linux-gnu)
find_library(_dnn_lib NAMES cudnn libcudnn.so.9
  HINTS ${_dnn_hints} ${CUDAToolkit_LIBRARY_DIR}
  PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)

if(_dnn_inc AND _dnn_lib)
  set(STITCH_CUDNN_INCLUDE_DIR "${_dnn_inc}")
  set(STITCH_CUDNN_LIBRARY "${_dnn_lib}")
  get_filename_component(STITCH_CUDNN_LIBRARY_DIR "${_dnn_lib}" DIRECTORY)
  set(STITCH_CUDNN_RPATH_EXTRA "${STITCH_CUDNN_LIBRARY_DIR}")
  message(STATUS "stitchcuda: cuDNN from the system: ${_dnn_lib}")
else()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, nvidia; print(';'.join(os.path.join(p, 'cudnn') for p in nvidia.__path__))"
    OUTPUT_VARIABLE _dnn_wheel_roots OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  foreach(_root IN LISTS _dnn_wheel_roots)
    if(EXISTS "${_root}/include/cudnn_graph.h" AND EXISTS "${_root}/lib/libcudnn.so.9")
      set(STITCH_CUDNN_INCLUDE_DIR "${_root}/include")
      set(STITCH_CUDNN_LIBRARY "${_root}/lib/libcudnn.so.9")
      set(STITCH_CUDNN_LIBRARY_DIR "${_root}/lib")
      break()
    endif()
  endforeach()
  if(NOT STITCH_CUDNN_LIBRARY)
    message(FATAL_ERROR
      "stitchcuda: cuDNN 9 not found: no cudnn_graph.h / libcudnn in CUDNN_ROOT, the CUDA toolkit or the "
      "system, and the Python environment has no nvidia-cudnn-cu13 wheel (pip install 'nvidia-cudnn-cu13>=9,<10').")
  endif()
  # The wheel is found again at run time through $ORIGIN/../../nvidia/cudnn/lib; no absolute path.
  set(STITCH_CUDNN_RPATH_EXTRA "")
  message(STATUS "stitchcuda: cuDNN from the nvidia-cudnn-cu13 wheel: ${STITCH_CUDNN_LIBRARY}")
endif()
