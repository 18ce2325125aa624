#pragma once
// Raw indexing kernels (no autograd): index_select / index_add along one dimension with a 1-D
// index, and gather / scatter_add with an index of the input's rank (PyTorch semantics).
// Every operand may be strided (transposed or sliced views are read and written in place).
// Indices are int64 or int32 and every one is checked against the dimension it indexes. On the
// CPU an out-of-range index throws kiln::Error naming the op, the index value and the dimension's
// size before anything is written; on a GPU the kernel skips it (nothing is written out of
// bounds) and the same error is raised at the next synchronisation (kiln/cuda/cuda.h,
// check_device_errors; docs/kernels.md).
//
// The accumulating kernels (index_add, scatter_add) are correct with repeated indices: they are
// parallelised only over the positions that do not run along `dim`, so each thread owns the
// destination elements it adds into and the adds along `dim` run in order (deterministic).
//
// `op` is the name used in error messages (embedding, one_hot... pass their own).
#include <cstdint>
#include <utility>

#include "kiln/core/tensor.h"
#include "kiln/kernels/dispatch.h"

namespace kiln::kernels {

// out = in.index_select(dim, index): out has in's sizes with sizes[dim] = index.numel().
// index is 0-D or 1-D.
void index_select(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index,
                  const char* op = "index_select");
// out.index_select(dim, index) += src, summing where index repeats. src has out's sizes with
// sizes[dim] = index.numel(); index is 0-D or 1-D; src and out share a dtype (not bool).
void index_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op = "index_add");
// out[p] = in[p with p[dim] replaced by index[p]] for every position p of index.
// index has in's rank and index.size(d) <= in.size(d) for d != dim; out has index's sizes.
void gather(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op = "gather");
// out[p with p[dim] replaced by index[p]] += src[p] for every position p of index, summing
// where positions collide. index, src and out share a rank; index.size(d) <= src.size(d) for
// every d and index.size(d) <= out.size(d) for d != dim.
void scatter_add(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src,
                 const char* op = "scatter_add");
// Smallest and largest value of a non-empty index tensor (int64 or int32). Reads the values on
// the host: an explicit synchronisation point when the tensor lives on a device.
std::pair<int64_t, int64_t> index_min_max(const Tensor& index, const char* op);

// Runs f(TypeTag<U>) with U the unsigned integer of dt's element size: the backends' gathers only
// move bits, whatever the dtype.
template <class F> void dispatch_by_size(DType dt, F&& f) {
  switch (element_size(dt)) {
    case 1: return f(TypeTag<uint8_t>{});
    case 2: return f(TypeTag<uint16_t>{});
    case 4: return f(TypeTag<uint32_t>{});
    case 8: return f(TypeTag<uint64_t>{});
    default: KILN_FAIL("gather: unsupported element size ", element_size(dt));
  }
}

// The backends' slots behind the checked entry points above (arguments already checked; `dim`
// wrapped to be non-negative).
namespace backend {
inline Kernel<void(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op)> index_select{
    "index_select"};
inline Kernel<void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op)> index_add{
    "index_add"};
inline Kernel<void(const Tensor& out, const Tensor& in, int64_t dim, const Tensor& index, const char* op)> gather{
    "gather"};
inline Kernel<void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, const char* op)> scatter_add{
    "scatter_add"};
inline Kernel<std::pair<int64_t, int64_t>(const Tensor& index, const char* op)> index_min_max{"index_min_max"};
}  // namespace backend

}  // namespace kiln::kernels
