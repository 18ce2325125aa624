#pragma once
// Automatic mixed precision: inside an Autocast scope, ops that gain from low precision run in
// it, and ops that need range or accuracy run in f32. The policy is this one table:
//
//   low precision (f16 / bf16):  matmul, mm, bmm, linear, conv1d, conv2d, conv_transpose2d,
//                                scaled_dot_product_attention
//   f32:                         softmax, log_softmax, cross_entropy, nll_loss, mse/l1/
//                                smooth_l1/bce losses, batch/layer/group/rms norm
//   everything else:             runs in the dtype of its inputs (promotion as usual)
//
// Only f32 inputs are cast down (f64 stays f64, as in PyTorch); gradients flow back through the
// casts to the f32 parameters. Autocast is thread-local, like grad mode.
//
//   { kiln::amp::Autocast ac(kiln::DType::BF16); loss = F::cross_entropy(net(x), y); }
#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "kiln/core/tensor.h"

namespace kiln::amp {

class Autocast {
 public:
  explicit Autocast(DType dtype, bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  std::optional<DType> prev_;
};

// RAII: no autocast inside (an autocast op runs on its already-cast inputs with autocast off, so
// its own internals are not cast again).
class NoAutocastGuard {
 public:
  NoAutocastGuard();
  ~NoAutocastGuard();
  NoAutocastGuard(const NoAutocastGuard&) = delete;
  NoAutocastGuard& operator=(const NoAutocastGuard&) = delete;

 private:
  std::optional<DType> prev_;
};

// The low-precision dtype of the innermost active Autocast, if any.
std::optional<DType> autocast_dtype();

// Policy helpers for op implementations: the input as the op should see it.
Tensor to_autocast_low(const Tensor& t);  // f32 -> the autocast dtype when active
Tensor to_autocast_f32(const Tensor& t);  // f16/bf16 -> f32 when active

// An op's place in the table above, declared once at the op's entry:
//
//   Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
//     if (auto out = amp::autocast_rerun(amp::Policy::LowPrecision, {x, w, b},
//                                        [&](const auto& a) { return linear(a[0], a[1], a[2]); }))
//       return *out;
//     ...   // autocast is off, or the inputs already have the op's dtype
//
// When autocast is active and the policy's cast changes any of `args` (undefined ones stay
// undefined), runs `op` on the cast arguments and returns its result; otherwise returns nothing
// and the op goes on with its own inputs. LowPrecision ops rerun with autocast off
// (NoAutocastGuard), so their internals are not cast again; F32 ops rerun as they are.
enum class Policy { LowPrecision, F32 };
std::optional<Tensor> autocast_rerun(Policy policy, std::initializer_list<Tensor> args,
                                     const std::function<Tensor(const std::vector<Tensor>&)>& op);

}  // namespace kiln::amp
