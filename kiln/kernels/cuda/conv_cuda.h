#pragma once
// The CUDA backend of the nn kernels (same contracts as kiln/kernels/nn_kernels.h, CUDA tensors
// only): convolutions through cuDNN (conv_cudnn.cpp) and the pooling kernels (pool.cu).
// Only declared for builds with CUDA; nn_dispatch.cpp routes CUDA tensors here.
//
// dtypes: f32, f64, f16 and bf16 natively (f16/bf16 convolutions run on tensor cores with f32
// accumulation; pooling computes in f32 for the 16-bit types). Built without cuDNN, the
// convolutions raise a kiln::Error saying so; the pooling kernels do not need cuDNN.
#include "kiln/kernels/nn_kernels.h"

namespace kiln::kernels::cuda {

void conv2d_forward(const Tensor& out, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const ConvGeometry& g);
void conv2d_backward_input(const Tensor& grad_x, const Tensor& grad_out, const Tensor& weight,
                           const ConvGeometry& g);
void conv2d_backward_weight(const Tensor& grad_weight, const Tensor& grad_bias,
                            const Tensor& grad_out, const Tensor& x, const ConvGeometry& g);

void max_pool2d_forward(const Tensor& out, const Tensor& indices, const Tensor& x,
                        const PoolGeometry& g);
void max_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const Tensor& indices,
                         const PoolGeometry& g);
void avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g,
                        bool count_include_pad);
void avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out, const PoolGeometry& g,
                         bool count_include_pad);
void adaptive_avg_pool2d_forward(const Tensor& out, const Tensor& x, const PoolGeometry& g);
void adaptive_avg_pool2d_backward(const Tensor& grad_x, const Tensor& grad_out,
                                  const PoolGeometry& g);

}  // namespace kiln::kernels::cuda
