#pragma once
// TensorDataset: samples are rows of in-memory tensors (torch.utils.data.TensorDataset).
// Zero-copy: get(i) returns views inputs[i] and targets[i] of the tensors given, which the
// dataset keeps alive (wrap foreign memory with kiln::from_blob to avoid any copy).
#include "kiln/data/dataset.h"

namespace kiln::data {

class TensorDataset : public Dataset {
 public:
  // inputs: [N, ...]; targets: [N, ...] or undefined.
  explicit TensorDataset(Tensor inputs, Tensor targets = Tensor());
  int64_t size() const override { return n_; }
  Example get(int64_t index) const override;
  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_, targets_;
  int64_t n_ = 0;
};

}  // namespace kiln::data
