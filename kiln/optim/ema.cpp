#include "kiln/optim/ema.h"

#include <algorithm>

#include "kiln/core/autograd.h"
#include "kiln/kernels/multi_tensor.h"

namespace kiln::optim {

EMA::EMA(nn::Module& model, double decay) : model_(model), decay_(decay) {
  KILN_CHECK(decay >= 0.0 && decay < 1.0, "EMA: decay must be in [0, 1), got ", decay);
  NoGradGuard ng;
  for (auto& [name, t] : model.state_dict()) {
    if (!is_floating(t.dtype())) continue;
    names_.push_back(name);
    live_.push_back(t);
    shadow_.push_back(t.clone());
  }
}

void EMA::update() {
  NoGradGuard ng;
  double d = decay_;
  if (warmup_) d = std::min(d, (1.0 + static_cast<double>(updates_)) / (10.0 + static_cast<double>(updates_)));
  // shadow += (1 - d) * (param - shadow) for every tensor, in one multi-tensor pass (a few
  // launches on a GPU instead of two kernels and a temporary per tensor).
  kernels::multi_tensor_lerp_(shadow_, live_, 1.0 - d);
  ++updates_;
}

EMA::Swap::Swap(EMA& ema) : ema_(ema) {
  NoGradGuard ng;
  for (size_t i = 0; i < ema_.live_.size(); ++i) {
    saved_.push_back(ema_.live_[i].clone());
    Tensor t = ema_.live_[i];
    t.copy_(ema_.shadow_[i]);
  }
}

EMA::Swap::~Swap() {
  NoGradGuard ng;
  for (size_t i = 0; i < saved_.size(); ++i) {
    Tensor t = ema_.live_[i];
    t.copy_(saved_[i]);
  }
}

void EMA::copy_to_model() {
  NoGradGuard ng;
  for (size_t i = 0; i < live_.size(); ++i) {
    Tensor t = live_[i];
    t.copy_(shadow_[i]);
  }
}

nn::StateDict EMA::state_dict() const {
  nn::StateDict d;
  for (size_t i = 0; i < names_.size(); ++i) d.insert("ema." + names_[i], shadow_[i]);
  d.insert("ema.__num_updates", scalar_tensor(static_cast<double>(updates_), DType::I64));
  return d;
}

void EMA::load_state_dict(const nn::StateDict& dict) {
  NoGradGuard ng;
  for (size_t i = 0; i < names_.size(); ++i) {
    const Tensor& src = dict.at("ema." + names_[i]);
    KILN_CHECK(src.sizes() == shadow_[i].sizes(), "EMA.load_state_dict: '", names_[i], "' has sizes ", src.sizes(),
               ", expected ", shadow_[i].sizes());
    shadow_[i].copy_(src);
  }
  updates_ = dict.at("ema.__num_updates").item<int64_t>();
}

}  // namespace kiln::optim
