#pragma once
// kiln-train --cuda-graphs: a few eager warm-up steps (they create the optimizer state and let
// cuDNN autotune, neither of which may happen inside a capture), then one capture of a whole
// training step on static input tensors, then one graph launch per step. The batches the loader
// delivers are copied into the static inputs on the device before each replay.
#include <functional>

#include <kiln/core/shape.h>
#include <kiln/kiln.h>

namespace kiln_train {

class StepGraph {
 public:
  StepGraph(bool enabled, kiln::optim::Optimizer& opt, int warmup_steps = 3)
      : enabled_(enabled), opt_(opt), warmup_(warmup_steps) {}

  // True when the next step should go through the graph (capturing it first if needed).
  bool active() const { return enabled_ && eager_steps_ >= warmup_; }
  bool captured() const { return graph_.captured(); }
  // The steps a run takes before its step is replayed: the eager ones, then the capture.
  int steps_to_capture() const { return warmup_ + 1; }
  void count_eager_step() { ++eager_steps_; }

  // Runs `step_fn` (one whole step: forward, backward, optimizer) through the graph; returns its
  // loss tensor, which the replays overwrite in place.
  kiln::Tensor step(const kiln::data::Batch& batch,
                    const std::function<kiln::Tensor(const kiln::data::Batch&)>& step_fn) {
    if (!graph_.captured()) {
      static_.input = kiln::empty_preserving_layout(batch.input, batch.input.options());
      static_.target = kiln::empty_preserving_layout(batch.target, batch.target.options());
      copy_in(batch);
      // Gradients to none: the captured backward allocates them in the graph's private pool and
      // every replay writes them at the same addresses (so nothing may zero_grad() afterwards).
      opt_.zero_grad();
      graph_.capture([&] { loss_ = step_fn(static_); });
      std::printf("cuda graph: captured the training step (%lld nodes)\n", static_cast<long long>(graph_.num_nodes()));
    } else {
      copy_in(batch);
    }
    graph_.replay();
    return loss_;
  }

 private:
  void copy_in(const kiln::data::Batch& batch) {
    KILN_CHECK(batch.input.sizes() == static_.input.sizes() && batch.target.sizes() == static_.target.sizes(),
               "--cuda-graphs: every batch must have the captured shape ", static_.input.sizes(), " (got ",
               batch.input.sizes(), "); the training loader drops the last partial batch for this reason");
    static_.input.copy_(batch.input, /*non_blocking=*/true);
    static_.target.copy_(batch.target, /*non_blocking=*/true);
  }

  bool enabled_;
  kiln::optim::Optimizer& opt_;
  int warmup_;
  int eager_steps_ = 0;
  kiln::cuda::Graph graph_;
  kiln::data::Batch static_;
  kiln::Tensor loss_;
};

}  // namespace kiln_train
