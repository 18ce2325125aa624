#pragma once
// What the MultiheadAttention and Transformer tests share: names, and the inputs and masks the
// PyTorch reference values were computed from (torch 2.15, float64, every parameter set to a
// fixed sequence in registration order, which is torch's).
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

namespace kiln_test::transformer {

namespace nn = kiln::nn;
namespace F = kiln::nn::functional;
using nn::MultiheadAttention;
using nn::MultiheadAttentionArgs;
using nn::MultiheadAttentionOptions;
using nn::Transformer;
using nn::TransformerDecoder;
using nn::TransformerDecoderLayer;
using nn::TransformerDecoderLayerOptions;
using nn::TransformerDecoderOptions;
using nn::TransformerEncoder;
using nn::TransformerEncoderLayer;
using nn::TransformerEncoderLayerOptions;
using nn::TransformerEncoderOptions;
using nn::TransformerOptions;

inline Tensor bool_tensor(const std::vector<bool>& v, IntList sizes) { return kiln::tensor(v).view(sizes); }

// [L, N, E] = [3, 2, 4] query, [S, N, E] = [5, 2, 4] key and value.
inline Tensor mha_query() { return sin_seq(24, 0.37, 0.1).view({3, 2, 4}); }
inline Tensor mha_key() { return sin_seq(40, 0.23, 0.5).view({5, 2, 4}); }
inline Tensor mha_value() { return sin_seq(40, 0.31, 0.9).view({5, 2, 4}); }
inline Tensor mha_attn_mask() {  // [3, 5], true: masked
  std::vector<bool> m;
  for (int i = 0; i < 15; ++i) m.push_back(i % 4 == 1);
  return bool_tensor(m, {3, 5});
}
inline Tensor mha_key_padding_mask() {  // [2, 5]
  return bool_tensor({false, false, false, false, true, false, true, false, false, false}, {2, 5});
}
inline Tensor encoder_src_mask() {  // [3, 3], true: masked
  std::vector<bool> m;
  for (int i = 0; i < 9; ++i) m.push_back(i % 3 == 2);
  return bool_tensor(m, {3, 3});
}
inline Tensor encoder_key_padding_mask() { return bool_tensor({false, false, true, false, false, false}, {2, 3}); }

}  // namespace kiln_test::transformer
