#include "kiln/core/denormal.h"

#include <omp.h>

#if defined(__SSE__) || defined(__x86_64__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#define KILN_HAS_MXCSR 1
#else
#define KILN_HAS_MXCSR 0
#endif

namespace kiln {

namespace {

#if KILN_HAS_MXCSR
void set_this_thread(bool on) {
  _MM_SET_FLUSH_ZERO_MODE(on ? _MM_FLUSH_ZERO_ON : _MM_FLUSH_ZERO_OFF);
  _MM_SET_DENORMALS_ZERO_MODE(on ? _MM_DENORMALS_ZERO_ON : _MM_DENORMALS_ZERO_OFF);
}
#endif

}  // namespace

bool set_flush_denormal(bool on) {
#if KILN_HAS_MXCSR
  set_this_thread(on);
  // Every thread of the pool runs this region once; the pool's threads persist, so the kernels'
  // later parallel regions run with the new mode.
#pragma omp parallel
  set_this_thread(on);
  return true;
#else
  (void)on;
  return false;
#endif
}

bool flush_denormal() {
#if KILN_HAS_MXCSR
  return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON && _MM_GET_DENORMALS_ZERO_MODE() == _MM_DENORMALS_ZERO_ON;
#else
  return false;
#endif
}

}  // namespace kiln
