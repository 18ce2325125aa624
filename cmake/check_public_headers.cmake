# Fails when the installed headers (cmake/kiln_public_headers.cmake) are not exactly the headers
# that <kiln/kiln.h> includes, directly or not: an installed kiln.h must not reach a header the
# package lacks, and nothing internal is installed for no reason. The compiler computes the
# closure (g++ -H), once with the CUDA backend on and once off, whatever this build's own choice.
#
#   cmake -DCXX=<c++ compiler> -DSOURCE_DIR=<repository> -DINCLUDE_ROOT=<build>/include
#         -DWORK_DIR=<scratch folder> [-DEXTRA_INCLUDE=kiln/<header>]
#         -P cmake/check_public_headers.cmake
#
# EXTRA_INCLUDE makes the probe include one more header next to kiln.h; the self-test of this
# check uses it to show that an uninstalled header is reported.
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/require_script_args.cmake)
require_script_args(check_public_headers CXX SOURCE_DIR INCLUDE_ROOT WORK_DIR)
include(${SOURCE_DIR}/cmake/kiln_public_headers.cmake)

set(probe_text "#include <kiln/kiln.h>\n")
if(EXTRA_INCLUDE)
  string(APPEND probe_text "#include <${EXTRA_INCLUDE}>\n")
endif()
file(WRITE ${WORK_DIR}/probe.cpp "${probe_text}")

set(closure)          # paths relative to kiln/, both configurations
set(first_includer)   # "header=includer" pairs, to say who pulled a header in
foreach(with_cuda 0 1)
  # This configuration's config.h, in a folder searched before the include root.
  set(KILN_WITH_CUDA ${with_cuda})
  set(KILN_WITH_CUDNN ${with_cuda})
  set(KILN_WITH_CUDNN_FRONTEND ${with_cuda})
  set(PROJECT_VERSION 0.0.0)
  configure_file(${SOURCE_DIR}/kiln/config.h.in ${WORK_DIR}/cuda${with_cuda}/kiln/config.h @ONLY)
  execute_process(
    COMMAND ${CXX} -std=c++17 -x c++ -M -MG -H -I${WORK_DIR}/cuda${with_cuda} -I${INCLUDE_ROOT}
            ${WORK_DIR}/probe.cpp
    OUTPUT_QUIET
    ERROR_VARIABLE tree
    RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_public_headers: the compiler failed on the probe (KILN_WITH_CUDA=${with_cuda}):\n${tree}")
  endif()
  # -H prints one line per included header: its depth as dots, then its path.
  string(REPLACE "\n" ";" lines "${tree}")
  set(stack probe.cpp)
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^(\\.+) (.+)$")
      continue()
    endif()
    string(LENGTH "${CMAKE_MATCH_1}" depth)
    cmake_path(NORMAL_PATH CMAKE_MATCH_2 OUTPUT_VARIABLE path)
    set(rel)
    foreach(root "${INCLUDE_ROOT}/kiln/" "${WORK_DIR}/cuda${with_cuda}/kiln/")
      string(FIND "${path}" "${root}" at)
      if(at EQUAL 0)
        string(LENGTH "${root}" root_length)
        string(SUBSTRING "${path}" ${root_length} -1 rel)
      endif()
    endforeach()
    # the includer is the last header seen one level up
    list(LENGTH stack n)
    while(n GREATER depth)
      list(POP_BACK stack)
      list(LENGTH stack n)
    endwhile()
    list(GET stack -1 parent)
    if(rel)
      list(APPEND stack kiln/${rel})
      if(NOT rel IN_LIST closure)
        list(APPEND closure ${rel})
        list(APPEND first_includer "${rel}=${parent}")
      endif()
    else()
      list(APPEND stack "${path}")
    endif()
  endforeach()
endforeach()
list(REMOVE_ITEM closure config.h)  # generated, installed from the build folder

set(errors)
foreach(rel IN LISTS closure)
  if(rel IN_LIST KILN_PUBLIC_HEADERS OR rel IN_LIST KILN_PUBLIC_HEADERS_INTERNAL_EXCEPTIONS)
    continue()
  endif()
  set(by "?")
  foreach(pair IN LISTS first_includer)
    string(FIND "${pair}" "${rel}=" at)
    if(at EQUAL 0)
      string(REPLACE "${rel}=" "" by "${pair}")
    endif()
  endforeach()
  if(rel MATCHES "^kernels/")
    list(APPEND errors "kiln/${rel} is internal (kernels/) but ${by} includes it: a public header must not")
  else()
    list(APPEND errors "kiln/${rel} is not installed but ${by} includes it: add it to KILN_PUBLIC_HEADERS if it is API, else stop including it")
  endif()
endforeach()
foreach(rel IN LISTS KILN_PUBLIC_HEADERS KILN_PUBLIC_HEADERS_INTERNAL_EXCEPTIONS)
  if(NOT rel IN_LIST closure)
    list(APPEND errors "kiln/${rel} is listed in cmake/kiln_public_headers.cmake but kiln.h does not include it: remove it from the list")
  endif()
endforeach()

if(errors)
  list(JOIN errors "\n  " text)
  message(FATAL_ERROR "public headers: the installed list and the closure of <kiln/kiln.h> differ:\n  ${text}")
endif()
list(LENGTH closure count)
message(STATUS "public headers: kiln.h includes ${count} headers, all installed (CUDA on and off)")
