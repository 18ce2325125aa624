#pragma once
// What an optimizer's update rule gets per tensor and gives per element: the part of the rule
// contract (kiln/kernels/multi_tensor.h) that the public optimizer headers, where each rule lives
// (kiln/optim/<name>.h), need. It sits in core because both sides use it: the rules in kiln/optim
// and the multi-tensor launchers in kiln/kernels, which cannot include optim.
#include <cmath>

namespace kiln::math {
// The scalar functions a rule's host/device code calls (kiln::pow and kiln::sqrt on tensors would
// hide them otherwise).
#if defined(__CUDACC__)
using ::fabs;
using ::pow;
using ::sqrt;
#else
using std::fabs;
using std::pow;
using std::sqrt;
#endif
}  // namespace kiln::math

namespace kiln::kernels {

// What a rule's update() and norm_terms() get for one tensor, read where the launcher runs.
struct UpdateScalars {
  double lr;
  double step;            // the parameter's step count for this update (stored count + 1)
  double inv_grad_scale;  // 1 / grad_scale, 1 without a loss scaler
  bool fresh_buffers;     // the buffers were created for this step
  double trust;           // the tensor's trust ratio (rules with per-tensor norms), else 1
};

// One element's contribution to the two per-tensor sums of a rule with per-tensor norms; what a
// and b are is the rule's (LAMB: update^2 and weight^2).
struct NormTerms {
  double a, b;
};

}  // namespace kiln::kernels
