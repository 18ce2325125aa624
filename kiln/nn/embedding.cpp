// Embedding: its weight (N(0, 1), as PyTorch), forward and printing.
#include "kiln/nn/embedding.h"

#include "kiln/nn/init.h"

namespace kiln::nn {

Embedding::Embedding(int64_t n, int64_t d) : Module("Embedding"), num_embeddings(n), embedding_dim(d) {
  KILN_CHECK(n > 0 && d > 0, "Embedding: sizes must be positive, got ", n, " and ", d);
  weight = register_parameter("weight", empty({n, d}));
  init::normal_(weight);
}

Tensor Embedding::forward(const Tensor& indices) { return kiln::embedding(weight, indices); }

std::string Embedding::extra_repr() const {
  return std::to_string(num_embeddings) + ", " + std::to_string(embedding_dim);
}

}  // namespace kiln::nn
