#include "kiln/optim/grad_scaler.h"

#include "kiln/core/autograd.h"
#include "kiln/cuda/cuda.h"
#include "kiln/kernels/amp_kernels.h"

namespace kiln::amp {

GradScaler::GradScaler(const GradScalerOptions& o) : o_(o) {
  enabled_ = o.enabled().value_or(kiln::cuda::is_available());
  KILN_CHECK(o.init_scale() > 0 && o.growth_factor() > 1 && o.backoff_factor() > 0 && o.backoff_factor() < 1 &&
                 o.growth_interval() > 0,
             "GradScaler: need init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval > 0");
}

void GradScaler::lazy_init(Device device) {
  if (scale_.defined() && scale_.device() == device) return;
  NoGradGuard ng;
  double s = scale_.defined() ? scale_.item<double>() : o_.init_scale();
  double t = growth_tracker_.defined() ? growth_tracker_.item<double>() : 0;
  double k = skipped_.defined() ? skipped_.item<double>() : 0;
  scale_ = full({}, s, TensorOptions().dtype(DType::F32).device(device));
  growth_tracker_ = full({}, t, TensorOptions().dtype(DType::I64).device(device));
  skipped_ = full({}, k, TensorOptions().dtype(DType::I64).device(device));
  found_inf_ = zeros({}, TensorOptions().dtype(DType::F32).device(device));
}

Tensor GradScaler::scale(const Tensor& loss) {
  if (!enabled_) return loss;
  lazy_init(loss.device());
  return loss * scale_.to(loss.dtype());
}

void GradScaler::unscale(optim::Optimizer& opt) {
  if (!enabled_ || unscaled_) return;
  KILN_CHECK(scale_.defined(), "GradScaler.unscale: call scale(loss) (and backward) first");
  NoGradGuard ng;
  std::vector<Tensor> grads;
  for (const Tensor& p : opt.parameters()) {
    if (!p.grad().defined()) continue;
    Tensor& g = const_cast<Tensor&>(p).mutable_grad();
    if (!g.is_contiguous()) g = g.contiguous();
    grads.push_back(g);
  }
  found_inf_.zero_();
  Tensor inv = 1.0 / scale_;
  kernels::unscale_and_check_(grads, inv, found_inf_);
  unscaled_ = true;
}

void GradScaler::step(optim::Optimizer& opt) {
  if (!enabled_) {
    opt.step();
    return;
  }
  unscale(opt);
  optim::StepFlags flags;
  flags.found_inf = found_inf_;
  opt.step(flags);
}

void GradScaler::update() {
  if (!enabled_) return;
  KILN_CHECK(scale_.defined(), "GradScaler.update: nothing was scaled this step");
  NoGradGuard ng;
  // Computed where the tensors live: on a GPU a one-thread kernel reads found_inf and writes the
  // next scale and growth tracker, so the training step does not wait for the host.
  kernels::amp_update_scale_(scale_, growth_tracker_, skipped_, found_inf_, o_.growth_factor(), o_.backoff_factor(),
                             o_.growth_interval());
  unscaled_ = false;
}

int64_t GradScaler::num_skipped_steps() const { return enabled_ && skipped_.defined() ? skipped_.item<int64_t>() : 0; }

double GradScaler::get_scale() const {
  if (!enabled_) return 1.0;
  return scale_.defined() ? scale_.item<double>() : o_.init_scale();
}

std::vector<std::pair<std::string, Tensor>> GradScaler::state_dict() const {
  return {
      {"scale", scalar_tensor(get_scale(), DType::F64)},
      {"growth_tracker", scalar_tensor(growth_tracker_.defined() ? growth_tracker_.item<double>() : 0, DType::F64)}};
}

void GradScaler::load_state_dict(const std::vector<std::pair<std::string, Tensor>>& items) {
  NoGradGuard ng;
  double s = o_.init_scale(), t = 0;
  for (const auto& [k, v] : items) {
    if (k == "scale") s = v.item<double>();
    else if (k == "growth_tracker") t = v.item<double>();
    else KILN_FAIL("GradScaler.load_state_dict: unexpected key '", k, "'");
  }
  Device d = scale_.defined() ? scale_.device() : Device::cpu();
  scale_ = full({}, s, TensorOptions().dtype(DType::F32).device(d));
  growth_tracker_ = full({}, t, TensorOptions().dtype(DType::I64).device(d));
  if (!skipped_.defined() || skipped_.device() != d) skipped_ = zeros({}, TensorOptions().dtype(DType::I64).device(d));
  found_inf_ = zeros({}, TensorOptions().dtype(DType::F32).device(d));
}

}  // namespace kiln::amp
