#include "kiln/nn/checkpoint.h"

#include "kiln/core/autograd.h"
#include "kiln/cuda/cuda.h"
#include "kiln/core/generator.h"

namespace kiln {

namespace {
struct RngState {
  Device device;
  uint64_t seed, offset;
};

std::vector<RngState> capture_rng(const std::vector<Tensor>& inputs) {
  std::vector<RngState> s;
  auto add = [&](Device d) {
    for (const auto& r : s)
      if (r.device == d) return;
    Generator& g = default_generator(d);
    s.push_back({d, g.seed(), g.offset()});
  };
  add(Device::cpu());
  for (const auto& t : inputs)
    if (t.defined()) add(t.device());
  return s;
}

void restore_rng(const std::vector<RngState>& s) {
  for (const auto& r : s) default_generator(r.device).set_state(r.seed, r.offset);
}
}  // namespace

Tensor checkpoint(const std::function<Tensor(const std::vector<Tensor>&)>& fn, const std::vector<Tensor>& inputs) {
  if (!GradMode::is_enabled()) return fn(inputs);  // nothing to save anyway
  const std::vector<RngState> rng_before = capture_rng(inputs);
  Tensor out;
  {
    NoGradGuard ng;
    out = fn(inputs);
  }
  KILN_CHECK(out.defined() && is_floating(out.dtype()), "checkpoint: the segment must return a floating tensor");
  // The node depends on every input; parameters used inside fn are reached by the nested
  // backward below. It must exist even if no input requires grad (the parameters might).
  std::vector<const Tensor*> in_ptrs;
  for (const auto& t : inputs) in_ptrs.push_back(&t);
  std::vector<Tensor> saved = inputs;
  auto node = std::make_shared<autograd::FunctionNode>(
      "CheckpointBackward", [fn, saved, rng_before](const autograd::TensorList& g) {
        // Recompute with the RNG as it was in forward, then put it back.
        const std::vector<RngState> rng_now = capture_rng(saved);
        restore_rng(rng_before);
        std::vector<Tensor> detached;
        for (const auto& t : saved) {
          if (!t.defined()) {
            detached.push_back(t);
            continue;
          }
          Tensor d = t.detach();
          if (t.requires_grad()) d.requires_grad_(true);
          detached.push_back(d);
        }
        Tensor y;
        {
          EnableGradGuard eg;
          y = fn(detached);
        }
        restore_rng(rng_now);
        if (y.requires_grad()) y.backward(g[0]);  // accumulates into parameters and `detached`
        autograd::TensorList grads;
        for (const auto& d : detached) grads.push_back(d.defined() && d.requires_grad() ? d.grad() : Tensor());
        return grads;
      });
  autograd::record(node, in_ptrs, {&out});
  return out;
}

Tensor checkpoint_sequential(nn::Sequential& seq, int64_t segments, const Tensor& input) {
  const int64_t n = static_cast<int64_t>(seq.size());
  KILN_CHECK(segments >= 1, "checkpoint_sequential: segments must be >= 1, got ", segments);
  const int64_t per = (n + segments - 1) / segments;
  Tensor h = input;
  for (int64_t start = 0; start < n; start += per) {
    const int64_t end = std::min(n, start + per);
    // forward_range: the Sequential's fused runs (nn::fuse) inside the segment run fused
    auto run = [&seq, start, end](const std::vector<Tensor>& in) {
      return seq.forward_range(static_cast<size_t>(start), static_cast<size_t>(end), in[0]);
    };
    h = end < n ? checkpoint(run, {h}) : run({h});
  }
  return h;
}

}  // namespace kiln
