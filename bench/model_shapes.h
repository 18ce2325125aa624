#pragma once
// Parameter shapes of well-known models, for the optimizer and training-utility benches (CPU and
// GPU): the tensor lists a fused multi-tensor kernel sees in real training; and the per-parameter
// AdamW loop those benches validate and time the fused step against.
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/core/autograd.h"
#include "kiln/core/tensor.h"

namespace kiln::bench {

// ResNet-18 (ImageNet stem, 1000 classes): 11.7M parameters in 62 tensors.
inline std::vector<IntList> resnet18_shapes() {
  std::vector<IntList> s;
  auto bn = [&](int64_t c) {
    s.push_back({c});
    s.push_back({c});
  };
  s.push_back({64, 3, 7, 7});
  bn(64);
  int64_t in = 64;
  for (int64_t c : {64, 128, 256, 512}) {
    for (int block = 0; block < 2; ++block) {
      const int64_t cin = block == 0 ? in : c;
      s.push_back({c, cin, 3, 3});
      bn(c);
      s.push_back({c, c, 3, 3});
      bn(c);
      if (block == 0 && cin != c) {  // downsample
        s.push_back({c, cin, 1, 1});
        bn(c);
      }
    }
    in = c;
  }
  s.push_back({1000, 512});
  s.push_back({1000});
  return s;
}

// GPT-2 124M (tied embeddings counted once): 124.4M parameters in 148 tensors.
inline std::vector<IntList> gpt2_124m_shapes() {
  const int64_t d = 768;
  std::vector<IntList> s = {{50257, d}, {1024, d}};
  for (int l = 0; l < 12; ++l) {
    s.push_back({d});
    s.push_back({d});  // ln_1
    s.push_back({d, 3 * d});
    s.push_back({3 * d});  // attn.c_attn
    s.push_back({d, d});
    s.push_back({d});  // attn.c_proj
    s.push_back({d});
    s.push_back({d});  // ln_2
    s.push_back({d, 4 * d});
    s.push_back({4 * d});  // mlp.c_fc
    s.push_back({4 * d, d});
    s.push_back({d});  // mlp.c_proj
  }
  s.push_back({d});
  s.push_back({d});  // ln_f
  return s;
}

// AdamW (decoupled weight decay) as a per-parameter loop of tensor ops, what a plain
// implementation does: ~10 passes and temporaries per parameter, on the parameters' device.
struct LoopAdamW {
  std::vector<Tensor> params, m, v;
  double lr, b1 = 0.9, b2 = 0.999, eps = 1e-8, wd;
  int t = 0;

  LoopAdamW(std::vector<Tensor> parameters, double learning_rate, double weight_decay)
      : params(std::move(parameters)), lr(learning_rate), wd(weight_decay) {
    for (const Tensor& p : params) {
      m.push_back(zeros_like(p));
      v.push_back(zeros_like(p));
    }
  }

  void step() {
    NoGradGuard ng;
    ++t;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    for (size_t i = 0; i < params.size(); ++i) {
      Tensor p = params[i].detach();
      const Tensor& g = params[i].grad();
      p.mul_(1 - lr * wd);
      m[i].mul_(b1).add_(g, 1 - b1);
      v[i].mul_(b2).add_(g * g, 1 - b2);
      Tensor denom = v[i].sqrt().div_(std::sqrt(bc2)).add_(eps);
      p.add_(m[i] / denom, -lr / bc1);
    }
  }
};

}  // namespace kiln::bench
