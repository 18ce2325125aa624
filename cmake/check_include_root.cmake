# Proves that the library's include directories reach kiln/ and nothing else of the repository:
# a source that includes "kiln/core/tensor.h" and "tests/test_util.h", compiled with exactly the
# include directories of the kiln target, must fail on tests/test_util.h; the same source with
# the repository root added must compile (so the failure is the include path, not the probe).
#
#   cmake -DCXX=<c++ compiler> -DLIBRARY_INCLUDE_DIRS="<dir>|<dir>..." -DSOURCE_DIR=<repository>
#         -DWORK_DIR=<scratch folder> -P cmake/check_include_root.cmake
cmake_minimum_required(VERSION 3.25)
include(${CMAKE_CURRENT_LIST_DIR}/require_script_args.cmake)
require_script_args(check_include_root CXX LIBRARY_INCLUDE_DIRS SOURCE_DIR WORK_DIR)

string(REPLACE "|" ";" include_dirs "${LIBRARY_INCLUDE_DIRS}")
set(include_flags)
foreach(dir IN LISTS include_dirs)
  if(dir STREQUAL SOURCE_DIR)
    message(FATAL_ERROR "check_include_root: the kiln target has the repository root ${dir} among its include directories")
  endif()
  list(APPEND include_flags -I${dir})
endforeach()

# Written in the build folder: a quoted include looks next to the including file first, and
# nothing named tests/ is there.
file(WRITE ${WORK_DIR}/library_source.cpp
  "#include \"kiln/core/tensor.h\"\n#include \"tests/test_util.h\"\n")

execute_process(
  COMMAND ${CXX} -std=c++17 -fsyntax-only ${include_flags} ${WORK_DIR}/library_source.cpp
  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
if(rc EQUAL 0)
  message(FATAL_ERROR "check_include_root: a library source included tests/test_util.h, so the kiln target's include directories reach beyond kiln/: ${include_dirs}")
endif()
if(NOT out MATCHES "tests/test_util\\.h: No such file")
  message(FATAL_ERROR "check_include_root: the probe failed, but not for want of tests/test_util.h:\n${out}")
endif()

execute_process(
  COMMAND ${CXX} -std=c++17 -fsyntax-only ${include_flags} -I${SOURCE_DIR} ${WORK_DIR}/library_source.cpp
  OUTPUT_VARIABLE out ERROR_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_include_root: with the repository root added the probe should compile, but:\n${out}")
endif()
message(STATUS "include root: tests/test_util.h is out of the library's reach (found once the repository root is added)")
