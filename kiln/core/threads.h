#pragma once
// The CPU kernels' thread pool (OpenMP), as torch::set_num_threads / torch::get_num_threads.
//
// set_num_threads(n) sets how many threads the CPU kernels launched from the calling thread use
// (and from threads it creates afterwards, which inherit it); n < 1 throws kiln::Error. As in
// libtorch it sets OpenMP's thread count, so OMP_NUM_THREADS gives the default.
namespace kiln {

void set_num_threads(int n);
// How many threads a CPU kernel launched from the calling thread uses.
int get_num_threads();

}  // namespace kiln
