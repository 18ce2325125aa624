# cmake -DSRC=<source folder> -DOUT=<file.cpp> -P build_commit.cmake
# Writes OUT, the definition of kiln::build_commit() (kiln/core/build_info.h): `git describe
# --always --dirty` of SRC, or "unknown" outside a git checkout. OUT is rewritten only when its
# text changes, so a build at an unchanged commit recompiles nothing.
execute_process(COMMAND git -C "${SRC}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")
endif()
set(text "// Generated at build time by cmake/build_commit.cmake.\n#include \"kiln/core/build_info.h\"\n\nconst char* kiln::build_commit() { return \"${commit}\"; }\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
