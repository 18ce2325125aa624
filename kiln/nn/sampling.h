#pragma once
// Next-token sampling from any model's logits (temperature, top-k, top-p / nucleus), as the
// generate loops of Hugging Face and nanoGPT do it. GPT::generate uses it.
#include <cstdint>

#include "kiln/core/arg.h"
#include "kiln/core/generator.h"
#include "kiln/core/tensor.h"

namespace kiln::nn {

struct SamplingOptions {
  // Logits are divided by it; 0 (or less) picks the most likely token (greedy, argmax).
  KILN_ARG(double, temperature) = 1.0;
  // Keep only the k most likely tokens (ties with the k-th are kept); 0 keeps all.
  KILN_ARG(int64_t, top_k) = 0;
  // Keep the smallest set of most likely tokens whose probability reaches top_p (at least one);
  // 1 keeps all. Applied after top_k.
  KILN_ARG(double, top_p) = 1.0;
};

// The distribution sample_next_token draws from: logits [V] or [B, V] -> f64 probabilities on
// the CPU, same sizes, zero outside top-k / top-p, each row summing to 1.
Tensor sampling_probs(const Tensor& logits, const SamplingOptions& opts = {});

// Draws one token per row: logits [V] -> int64 [], [B, V] -> int64 [B], on logits' device.
// Uniform numbers come from `generator` (the CPU default generator when null), one per row.
Tensor sample_next_token(const Tensor& logits, const SamplingOptions& opts = {}, Generator* generator = nullptr);

}  // namespace kiln::nn
