#include "kiln/core/threads.h"

#include <omp.h>

#include "kiln/core/error.h"

namespace kiln {

void set_num_threads(int n) {
  KILN_CHECK(n >= 1, "set_num_threads: the number of threads must be at least 1, got ", n);
  omp_set_num_threads(n);
}

int get_num_threads() { return omp_get_max_threads(); }

}  // namespace kiln
