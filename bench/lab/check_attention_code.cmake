# Reads the code nvcc makes of bench/lab/attention_cuda.cu, so that a machine without a GPU still
# checks what the tensor-core versions compile to (docs/lab.md, "The attention lab"):
#  1. PTX (nvcc -ptx -arch=sm_90): every fa2_kernel (versions 3, 4) holds
#     mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, ldmatrix .x4 and ldmatrix .x4.trans, and
#     the version-4 kernels (template flag true, "Lb1" in the mangled name) cp.async; plus EXTRA_PTX
#     if given (the self-test names an instruction the file does not use, and must fail);
#  2. ptxas -v (sm_90): no kernel spills ("0 bytes spill stores, 0 bytes spill loads") and none has
#     more than 227 KB of static shared memory (the dynamic sizes are static_asserts in the source);
#  3. SASS, when cuobjdump (and the nvdisasm it calls) is found: HMMA.16816.F32.BF16, LDSM.16.M88.4,
#     LDSM.16.MT88.4 and LDGSTS are there. Without cuobjdump this step says so and is left out.
#
#   cmake -DNVCC=... -DSOURCE=.../attention_cuda.cu -DWORK_DIR=... [-DCUOBJDUMP=...] [-DEXTRA_PTX=...]
#         -P check_attention_code.cmake
cmake_minimum_required(VERSION 3.16)
include("${CMAKE_CURRENT_LIST_DIR}/../../cmake/kernel_code.cmake")
foreach(var NVCC SOURCE WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_attention_code: -D${var}=... is required")
  endif()
endforeach()
get_filename_component(_lab_dir "${SOURCE}" DIRECTORY)
file(MAKE_DIRECTORY "${WORK_DIR}")
set(_flags -std=c++17 -O3 -arch=sm_90 -I "${_lab_dir}")

# ---- 1. PTX
kiln_compile_ptx(check_attention_code "${NVCC}" "${SOURCE}" "${WORK_DIR}/attention.ptx" ptx ${_flags})

# the text of each .entry up to the next one, checked for the instructions its version must use
set(_required_fa2 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
                  "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16")
set(_required_v4 "cp.async.cg.shared.global" "cp.async.wait_group")
set(_fa2_entries 0)
set(_rest "${ptx}")
kiln_ptx_next_entry(_rest name body)
while(NOT name STREQUAL "")
  if(name MATCHES "fa2_kernel")
    math(EXPR _fa2_entries "${_fa2_entries} + 1")
    set(required ${_required_fa2})
    if(name MATCHES "Lb1E")
      list(APPEND required ${_required_v4})
    endif()
    foreach(instr IN LISTS required)
      kiln_require_in_ptx(check_attention_code "${body}" "${instr}" "${name}")
    endforeach()
  endif()
  kiln_ptx_next_entry(_rest name body)
endwhile()
if(_fa2_entries LESS 4)
  message(FATAL_ERROR "check_attention_code: expected 4 fa2_kernel entries (D = 64, 128; versions 3, 4), "
                      "found ${_fa2_entries}")
endif()
if(DEFINED EXTRA_PTX AND NOT EXTRA_PTX STREQUAL "")
  kiln_require_in_ptx(check_attention_code "${ptx}" "${EXTRA_PTX}" "the file")
endif()
message(STATUS "PTX: ${_fa2_entries} fa2_kernel entries, each with mma.sync m16n8k16 bf16 and ldmatrix (.trans); "
               "version 4's with cp.async")

# ---- 2. ptxas -v
kiln_check_no_spills(check_attention_code "${NVCC}" "${SOURCE}" "${WORK_DIR}/attention.cubin" 8 ptxas_line ${_flags})
set(report "${KILN_PTXAS_REPORT}")
string(REGEX MATCHALL "[0-9]+ bytes smem" smems "${report}")
foreach(s IN LISTS smems)
  string(REGEX MATCH "^[0-9]+" bytes "${s}")
  if(bytes GREATER 232448)
    message(FATAL_ERROR "check_attention_code: a kernel uses ${bytes} bytes of static shared memory (> 227 KB)")
  endif()
endforeach()
message(STATUS "ptxas: ${ptxas_line}")

# ---- 3. SASS, when cuobjdump is here
kiln_read_sass("${NVCC}" "${WORK_DIR}/attention.cubin" sass)
if(sass STREQUAL "")
  return()
endif()
foreach(instr HMMA.16816.F32.BF16 LDSM.16.M88.4 LDSM.16.MT88.4 LDGSTS)
  string(FIND "${sass}" "${instr}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_attention_code: SASS lacks ${instr}")
  endif()
endforeach()
message(STATUS "SASS: HMMA.16816.F32.BF16, LDSM.16.M88.4, LDSM.16.MT88.4 and LDGSTS present")
