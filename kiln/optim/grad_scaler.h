#pragma once
// Dynamic loss scaling for f16 training, with PyTorch's defaults and names:
//
//   kiln::amp::GradScaler scaler;                 // enabled only where it is needed (see below)
//   scaler.scale(loss).backward();
//   scaler.unscale(opt);                          // optional: before clipping
//   kiln::optim::clip_grad_norm(params, 1.0);
//   scaler.step(opt);                             // skipped (on the device) if a gradient is Inf/NaN
//   scaler.update();                              // backoff x0.5 on overflow, growth x2 every 2000 clean steps
//
// The scale, the found-inf flag and the growth tracker are tensors: unscale is one fused kernel
// over all gradients, and the optimizer reads found-inf itself, so no host read happens in
// scale/unscale/step. update() computes the next scale from them in a kernel where they live (one
// GPU thread on a device), so a whole step - update included - runs without a host sync.
//
// bf16 has f32's range and needs no scaling; on the CPU there is no f16 training. So by default
// the scaler is enabled only when a CUDA device is available; GradScalerOptions().enabled(true)
// forces it on (tests), and a disabled scaler passes everything through unchanged.
#include <optional>

#include "kiln/core/arg.h"
#include "kiln/optim/optimizer.h"

namespace kiln::amp {

struct GradScalerOptions {
  KILN_ARG(double, init_scale) = 65536.0;
  KILN_ARG(double, growth_factor) = 2.0;
  KILN_ARG(double, backoff_factor) = 0.5;
  KILN_ARG(int64_t, growth_interval) = 2000;
  KILN_ARG(std::optional<bool>, enabled) = std::nullopt;  // unset: when a CUDA device is available
};

class GradScaler {
 public:
  explicit GradScaler(const GradScalerOptions& options = {});
  bool is_enabled() const { return enabled_; }

  Tensor scale(const Tensor& loss);
  // Divides the gradients of opt's parameters by the scale (once per step) and records found-inf.
  void unscale(optim::Optimizer& opt);
  // Unscales if not done yet, then steps the optimizer unless found-inf is set.
  void step(optim::Optimizer& opt);
  // The next scale: x backoff after an overflow, x growth after growth_interval clean steps.
  void update();

  double get_scale() const;  // reads the scale (a host sync on a device)
  // Steps skipped because a gradient was Inf/NaN, counted on the device by update(); reading it
  // is a host sync. A statistic of this scaler's life, not part of state_dict().
  int64_t num_skipped_steps() const;
  const Tensor& skipped_steps_tensor() const { return skipped_; }
  const Tensor& scale_tensor() const { return scale_; }
  const Tensor& found_inf() const { return found_inf_; }

  // {"scale", "growth_tracker"} as tensors, for checkpoints.
  std::vector<std::pair<std::string, Tensor>> state_dict() const;
  void load_state_dict(const std::vector<std::pair<std::string, Tensor>>& items);

 private:
  void lazy_init(Device device);
  GradScalerOptions o_;
  bool enabled_;
  Tensor scale_, found_inf_, growth_tracker_, skipped_;
  bool unscaled_ = false;
};

}  // namespace kiln::amp
