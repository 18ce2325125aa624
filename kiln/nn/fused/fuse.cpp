#include "kiln/nn/fused/fuse.h"

#include <memory>
#include <typeinfo>

#include "kiln/nn/activation.h"
#include "kiln/nn/container.h"
#include "kiln/nn/conv.h"
#include "kiln/nn/fused/conv_batch_norm_relu.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/fused/linear_gelu.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

namespace {

// Module i of seq as exactly an M (not a subclass, whose forward may differ), or null.
template <class M> std::shared_ptr<M> exactly(const Sequential& seq, size_t i) {
  if (i >= seq.size() || seq.is_fused(i)) return nullptr;
  const auto& m = *(seq.begin() + static_cast<std::ptrdiff_t>(i));
  return typeid(*m) == typeid(M) ? std::static_pointer_cast<M>(m) : nullptr;
}

// Conv2d -> BatchNorm2d -> ReLU [-> MaxPool2d(2)] at i; returns the run's length, 0 when there
// is none.
size_t fuse_conv_block(Sequential& seq, size_t i) {
  auto conv = exactly<Conv2d>(seq, i);
  auto bn = exactly<BatchNorm2d>(seq, i + 1);
  if (!conv || !bn || !ConvBatchNormReLU2d::supports(*conv, *bn)) return 0;
  if (!exactly<ReLU>(seq, i + 2)) return 0;
  size_t n = 3;
  auto pool = exactly<MaxPool2d>(seq, i + n);
  if (pool && ConvBatchNormReLU2d::supports_pool(*pool)) ++n;
  else pool = nullptr;
  seq.fuse_run(i, n, std::make_shared<ConvBatchNormReLU2d>(conv, bn, pool));
  return n;
}

size_t fuse_linear_gelu(Sequential& seq, size_t i) {
  auto linear = exactly<Linear>(seq, i);
  auto gelu = exactly<GELU>(seq, i + 1);
  if (!linear || !gelu) return 0;
  seq.fuse_run(i, 2, std::make_shared<LinearGELU>(linear, gelu));
  return 2;
}

int64_t fuse_sequential(Sequential& seq) {
  int64_t fused = 0;
  for (size_t i = 0; i < seq.size();) {
    size_t n = fuse_conv_block(seq, i);
    if (n == 0) n = fuse_linear_gelu(seq, i);
    fused += n > 0;
    i += n > 0 ? n : 1;
  }
  return fused;
}

}  // namespace

int64_t fuse(Module& module) {
  int64_t fused = 0;
  for (auto& [name, m] : module.named_modules()) {
    if (auto* seq = dynamic_cast<Sequential*>(m)) fused += fuse_sequential(*seq);
    for (const auto& chain : m->chains()) fused += fuse_sequential(*chain);
  }
  return fused;
}

}  // namespace kiln::nn
