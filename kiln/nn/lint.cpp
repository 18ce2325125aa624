// nn::lint: the guide's "no bias before BatchNorm". A normalisation layer
// subtracts the per-channel mean, so a bias added just before it is cancelled: a wasted
// parameter and a wasted pass over the activations.
#include <iostream>

#include "kiln/nn/conv.h"
#include "kiln/nn/linear.h"
#include "kiln/nn/normalization.h"

namespace kiln::nn {

namespace {
bool has_bias_before_norm(Module* m) {
  if (auto* c = dynamic_cast<Conv2d*>(m)) return c->bias.defined();
  if (auto* c = dynamic_cast<Conv1d*>(m)) return c->bias.defined();
  if (auto* l = dynamic_cast<Linear*>(m)) return l->bias.defined();
  return false;
}
bool is_norm(Module* m) {
  return dynamic_cast<BatchNorm*>(m) || dynamic_cast<GroupNorm*>(m) || dynamic_cast<LayerNorm*>(m);
}
}  // namespace

std::vector<std::string> lint(Module& module, bool print) {
  std::vector<std::string> warnings;
  for (auto& [path, m] : module.named_modules()) {
    auto kids = m->named_children();
    // Registration order is the order of use in every model of the zoo and in Sequential.
    for (size_t i = 0; i + 1 < kids.size(); ++i) {
      if (has_bias_before_norm(kids[i].second) && is_norm(kids[i + 1].second)) {
        std::string a = path.empty() ? kids[i].first : path + "." + kids[i].first;
        std::string b = path.empty() ? kids[i + 1].first : path + "." + kids[i + 1].first;
        warnings.push_back("kiln::nn::lint: " + a + " (" + kids[i].second->type_name() + ") has a bias but feeds " + b +
                           " (" + kids[i + 1].second->type_name() +
                           "), which cancels it: construct it with bias(false)");
      }
    }
  }
  if (print)
    for (const auto& w : warnings) std::cerr << w << "\n";
  return warnings;
}

}  // namespace kiln::nn
