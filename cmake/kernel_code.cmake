# Helpers of the scripts that read what nvcc makes of a kernel file without a GPU
# (tests/kernel_code/check_pointwise_code.cmake, bench/lab/check_attention_code.cmake).

# Splits the next `.entry` off PTX text: <name_var> gets the kernel's mangled name and <body_var>
# its text up to the next entry; <rest_var> (the PTX, updated in place) loses both. <name_var> is
# empty when no entry is left.
function(kiln_ptx_next_entry rest_var name_var body_var)
  set(rest "${${rest_var}}")
  string(FIND "${rest}" ".entry " pos)
  if(pos EQUAL -1)
    set(${name_var} "" PARENT_SCOPE)
    set(${rest_var} "" PARENT_SCOPE)
    return()
  endif()
  math(EXPR start "${pos} + 7")
  string(SUBSTRING "${rest}" ${start} -1 rest)
  string(FIND "${rest}" ".entry " pos)
  if(pos EQUAL -1)
    set(body "${rest}")
    set(rest "")
  else()
    string(SUBSTRING "${rest}" 0 ${pos} body)
    string(SUBSTRING "${rest}" ${pos} -1 rest)
  endif()
  string(REGEX MATCH "^[A-Za-z0-9_$]+" name "${body}")
  set(${name_var} "${name}" PARENT_SCOPE)
  set(${body_var} "${body}" PARENT_SCOPE)
  set(${rest_var} "${rest}" PARENT_SCOPE)
endfunction()

# Compiles <source> to <cubin> with `ptxas -v` (nvcc flags after the named arguments) and fails
# with <what> in the message when ptxas reports fewer than <min_kernels> kernels or any spill.
# <report_var> gets the registers each kernel uses, for the caller's status line.
function(kiln_check_no_spills what nvcc source cubin min_kernels report_var)
  execute_process(COMMAND "${nvcc}" ${ARGN} -cubin -Xptxas -v "${source}" -o "${cubin}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: nvcc -cubin failed:\n${err}")
  endif()
  set(report "${out}${err}")
  string(REGEX MATCHALL "[0-9]+ bytes spill stores, [0-9]+ bytes spill loads" spills "${report}")
  list(LENGTH spills kernels)
  if(kernels LESS min_kernels)
    message(FATAL_ERROR "${what}: ptxas -v reported ${kernels} kernels, expected at least ${min_kernels}:\n${report}")
  endif()
  foreach(s IN LISTS spills)
    if(NOT s STREQUAL "0 bytes spill stores, 0 bytes spill loads")
      message(FATAL_ERROR "${what}: a kernel spills (${s}):\n${report}")
    endif()
  endforeach()
  string(REGEX MATCHALL "Used [0-9]+ registers" regs "${report}")
  string(REPLACE ";" ", " regs "${regs}")
  set(${report_var} "${kernels} kernels, none spills (${regs})" PARENT_SCOPE)
  set(KILN_PTXAS_REPORT "${report}" PARENT_SCOPE)
endfunction()

# Fails with "<what>: PTX of <label> lacks <instr>" unless <text> holds <instr>.
function(kiln_require_in_ptx what text instr label)
  string(FIND "${text}" "${instr}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: PTX of ${label} lacks ${instr}")
  endif()
endfunction()

# Compiles <source> to <ptx_file> (nvcc flags after the named arguments) and reads it into <out_var>.
function(kiln_compile_ptx what nvcc source ptx_file out_var)
  execute_process(COMMAND "${nvcc}" ${ARGN} -ptx "${source}" -o "${ptx_file}" RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what}: nvcc -ptx failed:\n${err}")
  endif()
  file(READ "${ptx_file}" text)
  set(${out_var} "${text}" PARENT_SCOPE)
endfunction()

# <out_var> gets `cuobjdump -sass <cubin>`, or stays empty (with a status line saying why) when
# cuobjdump is not installed beside <nvcc> (or given as CUOBJDUMP) or fails: SASS checks are
# the optional ones.
function(kiln_read_sass nvcc cubin out_var)
  set(${out_var} "" PARENT_SCOPE)
  if(DEFINED CUOBJDUMP AND NOT CUOBJDUMP STREQUAL "")
    set(tool "${CUOBJDUMP}")
  else()
    get_filename_component(nvcc_dir "${nvcc}" DIRECTORY)
    find_program(KILN_CUOBJDUMP cuobjdump HINTS "${nvcc_dir}")
    set(tool "${KILN_CUOBJDUMP}")
  endif()
  if(NOT tool)
    message(STATUS "SASS: cuobjdump not found, not checked (PTX and ptxas are the required checks)")
    return()
  endif()
  execute_process(COMMAND "${tool}" -sass "${cubin}" RESULT_VARIABLE rc OUTPUT_VARIABLE sass ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(STATUS "SASS: ${tool} failed, not checked: ${err}${sass}")
    return()
  endif()
  set(${out_var} "${sass}" PARENT_SCOPE)
endfunction()
