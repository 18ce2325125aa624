#pragma once
#include "kiln/nn/module.h"

namespace kiln::nn {

// A lookup table: indices (any shape, int64/int32) -> [..., embedding_dim]. Init N(0, 1).
class Embedding : public Module {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim);
  Tensor forward(const Tensor& indices) override;
  std::string extra_repr() const override;

  int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

}  // namespace kiln::nn
