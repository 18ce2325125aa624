#pragma once
// The CUDA backend's entry points (same contracts as kiln/kernels/kernels.h, CUDA tensors
// only). Only declared when kiln is built with CUDA; dispatch.cpp routes to them.
#include "kiln/kernels/kernels.h"

namespace kiln::kernels::cuda {

void unary(UnaryOp op, const Tensor& out, const Tensor& in, double a, double b);
void binary(BinaryOp op, const Tensor& out, const Tensor& x, const Tensor& y, double alpha, double beta);
void where(const Tensor& out, const Tensor& cond, const Tensor& x, const Tensor& y);
// Same-device copy with any strides, broadcasting and dtype conversion.
void copy(const Tensor& dst, const Tensor& src);
void fill(const Tensor& dst, double value);
void fill_uniform(const Tensor& dst, uint64_t seed, uint64_t offset);
void fill_normal(const Tensor& dst, uint64_t seed, uint64_t offset);
void fill_randint(const Tensor& dst, int64_t low, int64_t high, uint64_t seed, uint64_t offset);
void reduce(ReduceOp op, const Tensor& out, const Tensor& in, const IntList& dims);
void arg_reduce(bool is_max, const Tensor& values, const Tensor& indices, const Tensor& in, int64_t dim);
void matmul(const Tensor& c, const Tensor& a, const Tensor& b);
void softmax(const Tensor& out, const Tensor& in, bool log);
void softmax_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& out, bool log);

}  // namespace kiln::kernels::cuda
