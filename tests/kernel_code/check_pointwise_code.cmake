# Reads the code nvcc makes of the pointwise launchers (kernels/cuda/launch.cuh, instantiated in
# pointwise_code.cu), so that a machine without a GPU still checks what they compile to
# (docs/kernels.md, "CUDA backend"):
#  1. PTX (sm_90): every contiguous_vec_kernel and unary_vec_kernel loads and stores 16 bytes at a
#     time (ld.global.v4 / st.global.v4 in some form); no strided_kernel divides an integer
#     (div.s32/u32/s64/u64, rem.*): its index math is FastDivmod's multiply-high and shift;
#     every kernel writing f16 or bf16 converts with the hardware's cvt.rn.f16.f32 / cvt.rn.bf16.f32
#     (and reads f16 with cvt.f32.f16), not core/half.h's bit manipulation;
#     plus EXTRA_PTX in every strided_kernel if given (the self-test plants one it lacks);
#  2. ptxas -v: no kernel spills;
#  3. SASS, when cuobjdump is found: every vector kernel holds LDG.E.128 and STG.E.128, the
#     16-byte loads and stores the GPU executes. Without cuobjdump this step says so and is left
#     out; SASS_FILE reads a listing instead of running it (the self-test gives one whose vector
#     kernel lacks the 16-byte load, and the check must report it).
#
#   cmake -DNVCC=... -DSOURCE=.../pointwise_code.cu -DINCLUDES="dir;dir" -DWORK_DIR=... [-DEXTRA_PTX=...]
#         [-DCUOBJDUMP=...] [-DSASS_FILE=...] -P check_pointwise_code.cmake
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/kernel_code.cmake")
foreach(var NVCC SOURCE INCLUDES WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_pointwise_code: -D${var}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY "${WORK_DIR}")
set(_flags -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr)
foreach(dir IN LISTS INCLUDES)
  list(APPEND _flags -I "${dir}")
endforeach()

# ---- 1. PTX
kiln_compile_ptx(check_pointwise_code "${NVCC}" "${SOURCE}" "${WORK_DIR}/pointwise.ptx" ptx ${_flags})

set(_vec 0)
set(_strided 0)
set(_rest "${ptx}")
kiln_ptx_next_entry(_rest name body)
while(NOT name STREQUAL "")
  if(name MATCHES "vec_kernel")
    math(EXPR _vec "${_vec} + 1")
    if(NOT body MATCHES "ld\\.global(\\.nc)?\\.v4\\.")
      message(FATAL_ERROR "check_pointwise_code: ${name} has no 16-byte load (ld.global.v4)")
    endif()
    if(NOT body MATCHES "st\\.global\\.v4\\.")
      message(FATAL_ERROR "check_pointwise_code: ${name} has no 16-byte store (st.global.v4)")
    endif()
  elseif(name MATCHES "strided_kernel")
    math(EXPR _strided "${_strided} + 1")
    string(REGEX MATCH "(div|rem)\\.[su](32|64)[^\n]*" division "${body}")
    if(division)
      message(FATAL_ERROR "check_pointwise_code: ${name} divides an integer: ${division}")
    endif()
    if(DEFINED EXTRA_PTX AND NOT EXTRA_PTX STREQUAL "")
      kiln_require_in_ptx(check_pointwise_code "${body}" "${EXTRA_PTX}" "${name}")
    endif()
  endif()
  if(name MATCHES "kernelINS_8BFloat16E")
    kiln_require_in_ptx(check_pointwise_code "${body}" "cvt.rn.bf16.f32" "${name}")
  elseif(name MATCHES "kernelINS_4HalfE")
    kiln_require_in_ptx(check_pointwise_code "${body}" "cvt.rn.f16.f32" "${name}")
    kiln_require_in_ptx(check_pointwise_code "${body}" "cvt.f32.f16" "${name}")
  endif()
  kiln_ptx_next_entry(_rest name body)
endwhile()
if(_vec LESS 4 OR _strided LESS 3)
  message(FATAL_ERROR "check_pointwise_code: expected 4 vector and 3 strided kernels, found ${_vec} and ${_strided}")
endif()
message(STATUS "PTX: ${_vec} vector kernels with 16-byte loads and stores, ${_strided} strided kernels without "
               "integer division")

# ---- 2. ptxas -v
kiln_check_no_spills(check_pointwise_code "${NVCC}" "${SOURCE}" "${WORK_DIR}/pointwise.cubin" 7 ptxas_line ${_flags})
message(STATUS "ptxas: ${ptxas_line}")

# ---- 3. SASS, when cuobjdump is here
if(DEFINED SASS_FILE AND NOT SASS_FILE STREQUAL "")
  file(READ "${SASS_FILE}" sass)
else()
  kiln_read_sass("${NVCC}" "${WORK_DIR}/pointwise.cubin" sass)
  if(sass STREQUAL "")
    return()
  endif()
endif()
# each function's listing runs from its "Function : name" line to the next one
set(_vec_sass 0)
string(FIND "${sass}" "Function : " pos)
while(NOT pos EQUAL -1)
  math(EXPR start "${pos} + 11")
  string(SUBSTRING "${sass}" ${start} -1 sass)
  string(FIND "${sass}" "Function : " pos)
  if(pos EQUAL -1)
    set(body "${sass}")
  else()
    string(SUBSTRING "${sass}" 0 ${pos} body)
  endif()
  string(REGEX MATCH "^[A-Za-z0-9_$]+" name "${body}")
  if(name MATCHES "vec_kernel")
    math(EXPR _vec_sass "${_vec_sass} + 1")
    foreach(instr LDG.E.128 STG.E.128)
      string(FIND "${body}" "${instr}" at)
      if(at EQUAL -1)
        message(FATAL_ERROR "check_pointwise_code: SASS of ${name} lacks ${instr}")
      endif()
    endforeach()
  endif()
endwhile()
if(_vec_sass LESS 4)
  message(FATAL_ERROR "check_pointwise_code: expected 4 vector kernels in the SASS, found ${_vec_sass}")
endif()
message(STATUS "SASS: ${_vec_sass} vector kernels with LDG.E.128 and STG.E.128")
