# Finds the NVIDIA libraries that do not ship with every CUDA toolkit (cuDNN, NCCL) in any of
# the layouts kiln meets:
#   1. <NAME>_ROOT (CMake or environment variable): a folder with include/ and lib/ or lib64/;
#   2. the CUDA toolkit's own include/ and lib/ (some toolkit installs bundle them);
#   3. NVIDIA's pip wheels (nvidia-cudnn-cu13, nvidia-nccl-cu13, as a PyTorch venv holds them):
#      <site-packages>/nvidia/<name>/{include,lib}, with only versioned libraries (libcudnn.so.9);
#   4. the system paths.
# The first that has both the header and the library wins, and the status line says which, so a
# build log shows where each library came from (docs/gpu.md explains the GPU machine's layout).

# Site-packages folders of the python3 on PATH (the GPU machine's PyTorch venv), once per configure.
function(_kiln_python_site_dirs out)
  if(DEFINED KILN_PYTHON_SITE_DIRS)
    set(${out} ${KILN_PYTHON_SITE_DIRS} PARENT_SCOPE)
    return()
  endif()
  set(dirs)
  find_program(KILN_PYTHON3 NAMES python3 python)
  if(KILN_PYTHON3)
    execute_process(
      COMMAND ${KILN_PYTHON3} -c "import site, sysconfig; p = sysconfig.get_paths(); print(';'.join(dict.fromkeys([p['purelib'], p['platlib']] + site.getsitepackages())))"
      OUTPUT_VARIABLE dirs OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      set(dirs)
    endif()
  endif()
  set(KILN_PYTHON_SITE_DIRS "${dirs}" CACHE INTERNAL "site-packages folders searched for NVIDIA wheels")
  set(${out} ${dirs} PARENT_SCOPE)
endfunction()

# kiln_find_cuda_library(<PREFIX> NAME <dir name> HEADER <header> LIBRARY <lib name> SOVERSION <n>)
# Sets <PREFIX>_FOUND, <PREFIX>_INCLUDE_DIR, <PREFIX>_LIBRARY, <PREFIX>_LIBRARY_DIR and
# <PREFIX>_FROM (a word for the status line).
function(kiln_find_cuda_library prefix)
  cmake_parse_arguments(A "" "NAME;HEADER;LIBRARY;SOVERSION" "" ${ARGN})
  string(TOUPPER "${A_NAME}" upper)
  set(lib_names ${A_LIBRARY} lib${A_LIBRARY}.so.${A_SOVERSION})

  set(roots)
  set(from)
  if(DEFINED ${upper}_ROOT)
    list(APPEND roots "${${upper}_ROOT}")
    list(APPEND from "${upper}_ROOT")
  endif()
  if(DEFINED ENV{${upper}_ROOT})
    list(APPEND roots "$ENV{${upper}_ROOT}")
    list(APPEND from "\$ENV{${upper}_ROOT}")
  endif()
  if(CUDAToolkit_LIBRARY_ROOT)
    list(APPEND roots "${CUDAToolkit_LIBRARY_ROOT}")
    list(APPEND from "the CUDA toolkit")
  endif()
  _kiln_python_site_dirs(site_dirs)
  foreach(site ${site_dirs})
    if(IS_DIRECTORY "${site}/nvidia/${A_NAME}")
      list(APPEND roots "${site}/nvidia/${A_NAME}")
      list(APPEND from "the ${A_NAME} pip wheel")
    endif()
  endforeach()

  # Each root on its own, so the header and the library come from the same install.
  set(found_inc)
  set(found_lib)
  set(found_from "the system paths")
  foreach(root from_word IN ZIP_LISTS roots from)
    unset(_kiln_inc)
    unset(_kiln_lib)
    find_path(_kiln_inc ${A_HEADER} PATHS "${root}" PATH_SUFFIXES include NO_DEFAULT_PATH NO_CACHE)
    find_library(_kiln_lib NAMES ${lib_names} PATHS "${root}" PATH_SUFFIXES lib lib64 NO_DEFAULT_PATH NO_CACHE)
    if(_kiln_inc AND _kiln_lib)
      set(found_inc "${_kiln_inc}")
      set(found_lib "${_kiln_lib}")
      set(found_from "${from_word}")
      break()
    endif()
  endforeach()
  if(NOT found_lib)
    unset(_kiln_inc)
    unset(_kiln_lib)
    find_path(_kiln_inc ${A_HEADER} NO_CACHE)
    find_library(_kiln_lib NAMES ${lib_names} NO_CACHE)
    if(_kiln_inc AND _kiln_lib)
      set(found_inc "${_kiln_inc}")
      set(found_lib "${_kiln_lib}")
    endif()
  endif()

  if(found_lib)
    get_filename_component(lib_dir "${found_lib}" DIRECTORY)
    set(${prefix}_FOUND ON PARENT_SCOPE)
    set(${prefix}_INCLUDE_DIR "${found_inc}" PARENT_SCOPE)
    set(${prefix}_LIBRARY "${found_lib}" PARENT_SCOPE)
    set(${prefix}_LIBRARY_DIR "${lib_dir}" PARENT_SCOPE)
    set(${prefix}_FROM "${found_from}" PARENT_SCOPE)
  else()
    set(${prefix}_FOUND OFF PARENT_SCOPE)
    set(${prefix}_FROM "not found: set ${upper}_ROOT to a folder with include/${A_HEADER} and lib/lib${A_LIBRARY}.so*, or install the ${A_NAME} pip wheel into the python3 on PATH" PARENT_SCOPE)
  endif()
endfunction()
