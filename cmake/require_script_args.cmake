# For the scripts run with cmake -P (cmake/check_*.cmake), which take their inputs as -D<var>=...:
# stops with "<script>: -D<var>=... is required" for the first of the named variables not given.
function(require_script_args script)
  foreach(var IN LISTS ARGN)
    if(NOT DEFINED ${var})
      message(FATAL_ERROR "${script}: -D${var}=... is required")
    endif()
  endforeach()
endfunction()
