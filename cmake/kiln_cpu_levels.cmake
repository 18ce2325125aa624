# CPU levels (kiln/core/cpu_isa.h, docs/kernels.md "One binary, every x86-64"): the library is
# compiled for the portable x86-64 baseline, and the CPU kernels once more per level listed in
# KILN_CPU_ISAS, each copy made into one object whose functions carry the level's name
# (cmake/kiln_cpu_level_object.py says why). At run time each kernel call takes the copy of the
# level in use.
#
# In: the target `kiln`, KILN_INCLUDE_ROOT, KILN_CXX_FLAGS (the library's warning and math flags). Out: KILN_CPU_ISA_<LEVEL>_BUILT (0/1) for config.h.
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64)$")
  set(_kiln_default_isas "avx2;avx512")
else()
  set(_kiln_default_isas "")
endif()
set(KILN_CPU_ISAS "${_kiln_default_isas}" CACHE STRING
    "CPU levels whose kernels are compiled beside the baseline (avx2, avx512; empty: baseline only)")
set(_kiln_isa_level_avx2 1)
set(_kiln_isa_flags_avx2 -march=x86-64-v3)
set(_kiln_isa_level_avx512 2)
set(_kiln_isa_flags_avx512 -march=x86-64-v4)

# The files compiled per level: the CPU kernels, and the optimizers' files, which register the
# CPU step of their update rule.
file(GLOB KILN_CPU_LEVEL_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/kiln/kernels/cpu/*.cpp)
foreach(opt adam adamw sgd lamb lars)
  list(APPEND KILN_CPU_LEVEL_SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/kiln/optim/${opt}.cpp)
endforeach()

find_package(Python3 REQUIRED COMPONENTS Interpreter)
foreach(_name AVX2 AVX512)
  set(KILN_CPU_ISA_${_name}_BUILT 0)
endforeach()
foreach(isa ${KILN_CPU_ISAS})
  if(NOT DEFINED _kiln_isa_level_${isa})
    message(FATAL_ERROR "KILN_CPU_ISAS: unknown CPU level '${isa}' (avx2, avx512)")
  endif()
  string(TOUPPER ${isa} _name)
  set(KILN_CPU_ISA_${_name}_BUILT 1)
  set(_objs kiln_cpu_${isa}_objects)
  add_library(${_objs} OBJECT ${KILN_CPU_LEVEL_SOURCES})
  target_include_directories(${_objs} PRIVATE ${KILN_INCLUDE_ROOT})
  target_link_libraries(${_objs} PRIVATE Eigen3::Eigen OpenMP::OpenMP_CXX Threads::Threads)
  target_compile_features(${_objs} PRIVATE cxx_std_17)
  target_compile_definitions(${_objs} PRIVATE KILN_THIS_CPU_ISA=${_kiln_isa_level_${isa}})
  target_compile_options(${_objs} PRIVATE ${KILN_CXX_FLAGS} ${_kiln_isa_flags_${isa}})
  set(_out ${CMAKE_CURRENT_BINARY_DIR}/kiln_cpu_${isa}.o)
  add_custom_command(
    OUTPUT ${_out}
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_SOURCE_DIR}/cmake/kiln_cpu_level_object.py
            --suffix ${isa} --out ${_out} --ld ${CMAKE_LINKER} --objcopy ${CMAKE_OBJCOPY} --nm ${CMAKE_NM} --readelf ${CMAKE_READELF}
            $<TARGET_OBJECTS:${_objs}>
    DEPENDS ${_objs} $<TARGET_OBJECTS:${_objs}> ${CMAKE_CURRENT_SOURCE_DIR}/cmake/kiln_cpu_level_object.py
    COMMAND_EXPAND_LISTS
    COMMENT "kiln: the ${isa} copy of the CPU kernels")
  set_source_files_properties(${_out} PROPERTIES EXTERNAL_OBJECT TRUE GENERATED TRUE)
  target_sources(kiln PRIVATE ${_out})
endforeach()
message(STATUS "kiln: CPU levels beside the baseline: ${KILN_CPU_ISAS}")
