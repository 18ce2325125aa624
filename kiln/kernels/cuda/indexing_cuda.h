#pragma once
// CUDA indexing kernels (kernels/cuda/indexing.cu): the contracts of kiln/kernels/indexing.h for
// CUDA tensors (the dispatcher in kernels/indexing.cpp has checked devices, dtypes and shapes).
// Only declared when kiln is built with CUDA.
#include "kiln/kernels/indexing.h"

namespace kiln::kernels::cuda {

void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op);
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op);
void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op);
void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op);
// One device reduction and one 16-byte device-to-host copy (synchronises the current stream and
// is reported by sync-debug mode).
std::pair<int64_t, int64_t> index_min_max(const Tensor& index, const char* op);

}  // namespace kiln::kernels::cuda
