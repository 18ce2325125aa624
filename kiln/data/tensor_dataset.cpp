#include "kiln/data/tensor_dataset.h"

namespace kiln::data {

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) : inputs_(std::move(inputs)), targets_(std::move(targets)) {
  KILN_CHECK(inputs_.defined() && inputs_.dim() >= 1,
             "TensorDataset: inputs must be a tensor with at least one dimension");
  KILN_CHECK(inputs_.device().is_cpu(), "TensorDataset: inputs must live on the CPU, got ", inputs_.device());
  n_ = inputs_.size(0);
  if (targets_.defined()) {
    KILN_CHECK(targets_.dim() >= 1 && targets_.size(0) == n_, "TensorDataset: inputs ", inputs_.sizes(),
               " and targets ", targets_.sizes(), " must have the same first dimension");
    KILN_CHECK(targets_.device().is_cpu(), "TensorDataset: targets must live on the CPU, got ", targets_.device());
  }
}

Example TensorDataset::get(int64_t index) const {
  KILN_CHECK(index >= 0 && index < n_, "TensorDataset: index ", index, " out of range [0, ", n_, ")");
  Example ex;
  ex.input = inputs_.select(0, index);
  if (targets_.defined()) ex.target = targets_.select(0, index);
  return ex;
}

}  // namespace kiln::data
