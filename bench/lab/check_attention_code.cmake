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
foreach(var NVCC SOURCE WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_attention_code: -D${var}=... is required")
  endif()
endforeach()
get_filename_component(_lab_dir "${SOURCE}" DIRECTORY)
file(MAKE_DIRECTORY "${WORK_DIR}")
set(_flags -std=c++17 -O3 -arch=sm_90 -I "${_lab_dir}")

# ---- 1. PTX
execute_process(COMMAND "${NVCC}" ${_flags} -ptx "${SOURCE}" -o "${WORK_DIR}/attention.ptx"
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_attention_code: nvcc -ptx failed:\n${err}")
endif()
file(READ "${WORK_DIR}/attention.ptx" ptx)

# the text of each .entry up to the next one, checked for the instructions its version must use
set(_required_fa2 "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" "ldmatrix.sync.aligned.m8n8.x4.shared.b16"
                  "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16")
set(_required_v4 "cp.async.cg.shared.global" "cp.async.wait_group")
set(_fa2_entries 0)
set(_rest "${ptx}")
string(FIND "${_rest}" ".entry " pos)
while(NOT pos EQUAL -1)
  math(EXPR start "${pos} + 7")
  string(SUBSTRING "${_rest}" ${start} -1 _rest)
  string(FIND "${_rest}" ".entry " pos)
  if(pos EQUAL -1)
    set(body "${_rest}")
  else()
    string(SUBSTRING "${_rest}" 0 ${pos} body)
  endif()
  string(REGEX MATCH "^[A-Za-z0-9_$]+" name "${body}")
  if(name MATCHES "fa2_kernel")
    math(EXPR _fa2_entries "${_fa2_entries} + 1")
    set(required ${_required_fa2})
    if(name MATCHES "Lb1E")
      list(APPEND required ${_required_v4})
    endif()
    foreach(instr IN LISTS required)
      string(FIND "${body}" "${instr}" at)
      if(at EQUAL -1)
        message(FATAL_ERROR "check_attention_code: PTX of ${name} lacks ${instr}")
      endif()
    endforeach()
  endif()
endwhile()
if(_fa2_entries LESS 4)
  message(FATAL_ERROR "check_attention_code: expected 4 fa2_kernel entries (D = 64, 128; versions 3, 4), "
                      "found ${_fa2_entries}")
endif()
if(DEFINED EXTRA_PTX AND NOT EXTRA_PTX STREQUAL "")
  string(FIND "${ptx}" "${EXTRA_PTX}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_attention_code: PTX lacks ${EXTRA_PTX}")
  endif()
endif()
message(STATUS "PTX: ${_fa2_entries} fa2_kernel entries, each with mma.sync m16n8k16 bf16 and ldmatrix (.trans); "
               "version 4's with cp.async")

# ---- 2. ptxas -v
execute_process(COMMAND "${NVCC}" ${_flags} -cubin -Xptxas -v "${SOURCE}" -o "${WORK_DIR}/attention.cubin"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_attention_code: nvcc -cubin failed:\n${err}")
endif()
set(report "${out}${err}")
string(REGEX MATCHALL "[0-9]+ bytes spill stores, [0-9]+ bytes spill loads" spills "${report}")
list(LENGTH spills kernels)
if(kernels LESS 8)
  message(FATAL_ERROR "check_attention_code: ptxas -v reported ${kernels} kernels, expected at least 8:\n${report}")
endif()
foreach(s IN LISTS spills)
  if(NOT s STREQUAL "0 bytes spill stores, 0 bytes spill loads")
    message(FATAL_ERROR "check_attention_code: a kernel spills (${s}):\n${report}")
  endif()
endforeach()
string(REGEX MATCHALL "[0-9]+ bytes smem" smems "${report}")
foreach(s IN LISTS smems)
  string(REGEX MATCH "^[0-9]+" bytes "${s}")
  if(bytes GREATER 232448)
    message(FATAL_ERROR "check_attention_code: a kernel uses ${bytes} bytes of static shared memory (> 227 KB)")
  endif()
endforeach()
string(REGEX MATCHALL "Used [0-9]+ registers" regs "${report}")
string(REPLACE ";" ", " regs "${regs}")
message(STATUS "ptxas: ${kernels} kernels, none spills (${regs})")

# ---- 3. SASS, when cuobjdump is here
if(NOT DEFINED CUOBJDUMP OR CUOBJDUMP STREQUAL "")
  get_filename_component(_nvcc_dir "${NVCC}" DIRECTORY)
  find_program(CUOBJDUMP cuobjdump HINTS "${_nvcc_dir}")
endif()
if(NOT CUOBJDUMP)
  message(STATUS "SASS: cuobjdump not found, not checked (PTX and ptxas are the required checks)")
  return()
endif()
execute_process(COMMAND "${CUOBJDUMP}" -sass "${WORK_DIR}/attention.cubin" RESULT_VARIABLE rc OUTPUT_VARIABLE sass
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(STATUS "SASS: ${CUOBJDUMP} failed, not checked: ${err}${sass}")
  return()
endif()
foreach(instr HMMA.16816.F32.BF16 LDSM.16.M88.4 LDSM.16.MT88.4 LDGSTS)
  string(FIND "${sass}" "${instr}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "check_attention_code: SASS lacks ${instr}")
  endif()
endforeach()
message(STATUS "SASS: HMMA.16816.F32.BF16, LDSM.16.M88.4, LDSM.16.MT88.4 and LDGSTS present")
