// nn::MultiheadAttention (torch's form): outputs, attention weights and gradients against PyTorch's
// (the values in torch_reference/multihead_attention.json; inputs in transformer_test_util.h), the projection and mask
// routes against each other, batch_first and unbatched layouts, fully masked rows, dropout, f64 gradchecks, parameter
// names, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/nn/torch_reference.h"
#include "tests/nn/transformer_test_util.h"

using namespace kiln_test;
using namespace kiln_test::transformer;

namespace {

// PyTorch's values for these tests (tests/nn/torch_reference/multihead_attention.json, tests/nn/torch_reference.h)
const std::vector<double>& torch_ref(const char* name) { return torch_reference("multihead_attention", name); }

}  // namespace

TEST_CASE("MultiheadAttention: cross-attention with both masks matches PyTorch, with gradients", "[transformer]") {
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2));
  set_params_to_sequence(mha);
  Tensor q = mha_query().requires_grad_(), k = mha_key().requires_grad_(), v = mha_value().requires_grad_();
  auto args = MultiheadAttentionArgs().attn_mask(mha_attn_mask()).key_padding_mask(mha_key_padding_mask());
  auto [out, weights] = mha(q, k, v, args);
  CHECK(out.sizes() == IntList{3, 2, 4});
  CHECK(weights.sizes() == IntList{2, 3, 5});
  check_close(out, torch_ref("k_mha_out"), 0, 1e-13, "output");
  check_close(weights, torch_ref("k_mha_weights"), 0, 1e-13, "weights averaged over heads");
  weighted_sum(out, 0.11, 0.3).backward();
  check_close(q.grad(), torch_ref("k_mha_grad_query"), 0, 1e-13, "query gradient");
  check_close(k.grad(), torch_ref("k_mha_grad_key"), 0, 1e-13, "key gradient");
  check_close(v.grad(), torch_ref("k_mha_grad_value"), 0, 1e-13, "value gradient");
  check_close(mha.in_proj_weight.grad(), torch_ref("k_mha_grad_in_proj_weight"), 0, 1e-13, "in_proj_weight gradient");
  auto [out2, per_head] = mha(q, k, v, MultiheadAttentionArgs(args).average_attn_weights(false));
  CHECK(per_head.sizes() == IntList{2, 2, 3, 5});
  check_close(per_head, torch_ref("k_mha_weights_per_head"), 0, 1e-13, "weights per head");
  check_close(out2, torch_ref("k_mha_out"), 0, 1e-13, "output with weights per head");
}

TEST_CASE("MultiheadAttention: batch_first self-attention with a 3-D float mask matches PyTorch", "[transformer]") {
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2).batch_first(true));
  set_params_to_sequence(mha);
  Tensor x = sin_seq(24, 0.41, 0.7).view({2, 3, 4}).requires_grad_();
  Tensor mask = sin_seq(36, 0.53, 0.2).view({4, 3, 3});
  auto [y, w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(mask).need_weights(false));
  CHECK_FALSE(w.defined());
  check_close(y, torch_ref("k_mha_self_out"), 0, 1e-13, "output");
  y.sum().backward();
  check_close(x.grad(), torch_ref("k_mha_self_grad_x"), 0, 1e-13, "input gradient");
}

TEST_CASE("MultiheadAttention: the projection routes, mask forms and layouts agree", "[transformer]") {
  kiln::manual_seed(3);
  MultiheadAttention mha(MultiheadAttentionOptions(6, 3));
  mha.to(DType::F64);
  Tensor x = kiln::randn({4, 2, 6}, f64());
  Tensor kv = kiln::randn({5, 2, 6}, f64());
  // One GEMM for self-attention, the row blocks of in_proj_weight for separate tensors: the same result.
  auto [self_out, self_w] = mha(x, x, x);
  auto [copies_out, copies_w] = mha(x, x.clone(), x.clone());
  check_same_tensor(copies_out, self_out, 1e-14, "self-attention through separate key and value");
  check_same_tensor(copies_w, self_w, 1e-14, "its weights");
  auto [kv_out, kv_w] = mha(x, kv, kv);
  auto [kv2_out, kv2_w] = mha(x, kv, kv.clone());
  check_same_tensor(kv2_out, kv_out, 1e-14, "key is value against separate key and value");
  // need_weights only adds the weights; forward(x) is self-attention without them.
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().need_weights(false))), self_out, 1e-14,
                    "need_weights=false");
  check_same_tensor(mha(x), self_out, 1e-14, "forward(x)");
  // A bool mask (true: masked) equals the float mask with -inf there; the masked weights are 0.
  Tensor bool_mask = kiln::rand({4, 5}, f64()) < 0.3;
  bool_mask.select(1, 0).fill_(0.0);  // every query keeps key 0
  Tensor float_mask = kiln::zeros({4, 5}, f64()).masked_fill(bool_mask, -INFINITY);
  Tensor padding = kiln::zeros({2, 5}, kiln::TensorOptions().dtype(DType::Bool));
  padding.select(0, 1).narrow(0, 3, 2).fill_(1.0);
  auto [b_out, b_w] = mha(x, kv, kv, MultiheadAttentionArgs().attn_mask(bool_mask).key_padding_mask(padding));
  auto [f_out, f_w] = mha(x, kv, kv, MultiheadAttentionArgs().attn_mask(float_mask).key_padding_mask(padding));
  check_same_tensor(f_out, b_out, 1e-14, "float mask against bool mask");
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t s = 0; s < 5; ++s) {
        const bool masked = bool_mask.select(0, l).select(0, s).item() != 0 || (n == 1 && s >= 3);
        if (masked) CHECK(b_w.select(0, n).select(0, l).select(0, s).item() == 0.0);
        else CHECK(b_w.select(0, n).select(0, l).select(0, s).item() > 0.0);
      }
  // is_causal without a mask, the causal option and an explicit causal mask agree.
  Tensor later = kiln::ones({4, 4}, f64()).triu(1) > 0.5;
  auto [c_out, c_w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(later));
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().is_causal(true))), c_out, 1e-14, "is_causal");
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().is_causal(true).need_weights(false))), c_out,
                    1e-14, "is_causal, blocked kernel");
  // torch's hint: is_causal with a mask runs the causal kernel in the mask's place when no padding
  // mask and no weights are asked for (so a wrong hint shows), and uses the mask otherwise.
  Tensor not_causal = kiln::zeros({4, 4}, kiln::TensorOptions().dtype(DType::Bool));
  not_causal.select(1, 2).fill_(1.0);
  auto [nc_out, nc_w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(not_causal));
  check_same_tensor(
      std::get<0>(mha(x, x, x, MultiheadAttentionArgs().attn_mask(not_causal).is_causal(true).need_weights(false))),
      c_out, 1e-12, "is_causal hint without weights: the causal kernel");
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().attn_mask(not_causal).is_causal(true))), nc_out,
                    1e-14, "is_causal hint with weights: the mask");
  MultiheadAttention causal(MultiheadAttentionOptions(6, 3).causal(true));
  causal.load_state_dict(mha.state_dict());
  causal.to(DType::F64);
  check_same_tensor(std::get<0>(causal(x, x, x)), c_out, 1e-14, "causal option");
  check_same_tensor(causal(x), c_out, 1e-14, "causal option, forward(x)");
  // causal and a padding mask together: both apply.
  Tensor pad_self = kiln::zeros({2, 4}, kiln::TensorOptions().dtype(DType::Bool));
  pad_self.select(0, 0).select(0, 3).fill_(1.0);
  auto [cp_out, cp_w] = causal(x, x, x, MultiheadAttentionArgs().key_padding_mask(pad_self));
  auto [mp_out, mp_w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(later).key_padding_mask(pad_self));
  check_same_tensor(cp_out, mp_out, 1e-14, "causal option with a padding mask");
  // batch_first is the transposed layout; an unbatched input is a batch of one.
  MultiheadAttention bf(MultiheadAttentionOptions(6, 3).batch_first(true));
  bf.load_state_dict(mha.state_dict());
  bf.to(DType::F64);
  auto [bf_out, bf_w] = bf(x.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1));
  check_same_tensor(bf_out.transpose(0, 1), kv_out, 1e-14, "batch_first");
  check_same_tensor(bf_w, kv_w, 1e-14, "batch_first weights");
  check_same_tensor(bf(x.transpose(0, 1)).transpose(0, 1), self_out, 1e-14, "batch_first forward(x)");
  Tensor x1 = x.select(1, 1), kv1 = kv.select(1, 1);
  auto [u_out, u_w] = mha(x1, kv1, kv1, MultiheadAttentionArgs().key_padding_mask(padding.select(0, 1)));
  CHECK(u_out.sizes() == IntList{4, 6});
  CHECK(u_w.sizes() == IntList{4, 5});
  auto [n_out, n_w] = mha(x, kv, kv, MultiheadAttentionArgs().key_padding_mask(padding));
  check_same_tensor(u_out, n_out.select(1, 1), 1e-14, "unbatched");
  check_same_tensor(u_w, n_w.select(0, 1), 1e-14, "unbatched weights");
}

TEST_CASE("MultiheadAttention: a query with every key masked, as in PyTorch", "[transformer]") {
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2));
  set_params_to_sequence(mha);
  Tensor padding = bool_tensor({true, true, true, true, true, false, false, false, false, false}, {2, 5});
  Tensor q = mha_query().requires_grad_(), k = mha_key(), v = mha_value();
  // With the weights: a plain softmax, NaN for sample 0 (torch's need_weights=True path).
  auto [out, w] = mha(q, k, v, MultiheadAttentionArgs().key_padding_mask(padding));
  for (double x : values(out.select(1, 0))) CHECK(std::isnan(x));
  for (double x : values(w.select(0, 0))) CHECK(std::isnan(x));
  for (double x : values(out.select(1, 1))) CHECK(std::isfinite(x));
  // Without: the query attends to nothing, so its output is out_proj's bias, and gradients stay finite.
  auto [out2, none] = mha(q, k, v, MultiheadAttentionArgs().key_padding_mask(padding).need_weights(false));
  check_same_tensor(out2.select(1, 0), mha.out_proj.bias.view({1, 4}).expand({3, 4}), 0, "output of the masked sample");
  check_same_tensor(out2.select(1, 1), out.select(1, 1), 1e-14, "the other sample");
  out2.sum().backward();
  for (double x : values(q.grad())) CHECK(std::isfinite(x));
  for (double x : values(mha.in_proj_weight.grad())) CHECK(std::isfinite(x));
  CHECK(values(q.grad().select(1, 0)) == std::vector<double>(12, 0.0));
}

TEST_CASE("TransformerEncoder: left padding under a causal mask stays finite, as in PyTorch", "[transformer]") {
  // Sample 0's first two positions are padding, so its first query sees no key at all; torch's
  // encoder (scaled_dot_product_attention inside) gives that row 0, and nothing turns NaN in the
  // next layer or in the gradients.
  kiln::manual_seed(13);
  TransformerEncoder encoder(TransformerEncoderOptions(
      TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0).batch_first(true), 2));
  encoder.to(DType::F64);
  Tensor src = kiln::randn({2, 5, 8}, f64(true));
  Tensor padding = bool_tensor({true, true, false, false, false, false, false, false, false, false}, {2, 5});
  Tensor out = encoder(src, Tensor(), padding, /*is_causal=*/true);
  out.narrow(1, 2, 3).sum().backward();
  for (double x : values(out)) CHECK(std::isfinite(x));
  for (double x : values(src.grad())) CHECK(std::isfinite(x));
  for (const Tensor& p : encoder.parameters())
    for (double x : values(p.grad())) CHECK(std::isfinite(x));
}

TEST_CASE("MultiheadAttention: dropout on the attention probabilities in training only", "[transformer]") {
  kiln::manual_seed(4);
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2).dropout(1.0));
  set_params_to_sequence(mha);
  Tensor q = mha_query(), k = mha_key(), v = mha_value();
  // p = 1 drops every probability: the weights are 0 and the output is out_proj's bias.
  auto [out, w] = mha(q, k, v);
  CHECK(values(w) == std::vector<double>(30, 0.0));
  check_same_tensor(out, mha.out_proj.bias.view({1, 1, 4}).expand({3, 2, 4}), 0, "output under full dropout");
  CHECK(kiln::equal(mha(q), mha.out_proj.bias.view({1, 1, 4}).expand({3, 2, 4})));
  mha.eval();
  MultiheadAttention plain(MultiheadAttentionOptions(4, 2));
  set_params_to_sequence(plain);
  check_same_tensor(std::get<0>(mha(q, k, v)), std::get<0>(plain(q, k, v)), 0, "eval: no dropout");
  // 0 < p < 1: the kept probabilities are scaled by 1 / (1 - p), the mask follows the seed.
  MultiheadAttention half(MultiheadAttentionOptions(4, 2).dropout(0.5));
  set_params_to_sequence(half);
  kiln::manual_seed(9);
  auto [o1, w1] = half(q, k, v, MultiheadAttentionArgs().average_attn_weights(false));
  kiln::manual_seed(9);
  auto [o2, w2] = half(q, k, v, MultiheadAttentionArgs().average_attn_weights(false));
  CHECK(kiln::equal(o1, o2));
  half.eval();
  auto [oe, we] = half(q, k, v, MultiheadAttentionArgs().average_attn_weights(false));
  const auto a = values(w1), b = values(we);
  int kept = 0, dropped = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0.0) ++dropped;
    else {
      ++kept;
      CHECK(std::abs(a[i] - 2.0 * b[i]) <= 1e-14);
    }
  }
  CHECK(kept > 10);
  CHECK(dropped > 10);
}

TEST_CASE("MultiheadAttention: gradcheck", "[transformer]") {
  kiln::manual_seed(6);
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2));
  mha.to(DType::F64);
  Tensor padding = bool_tensor({false, false, true, false, false, false}, {2, 3});
  Tensor fmask = kiln::randn({2, 3}, f64());
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        auto [out, w] = mha(in[0], in[1], in[2], MultiheadAttentionArgs().attn_mask(fmask).key_padding_mask(padding));
        return kiln::cat({out.flatten(), w.flatten()});
      },
      {kiln::randn({2, 2, 4}, f64(true)), kiln::randn({3, 2, 4}, f64(true)), kiln::randn({3, 2, 4}, f64(true))}));
  CHECK(kiln::gradcheck(
      [&](const TL& in) { return std::get<0>(mha(in[0], in[0], in[0], MultiheadAttentionArgs().is_causal(true))); },
      {kiln::randn({3, 2, 4}, f64(true))}));
}

TEST_CASE("MultiheadAttention: torch's initialisation, the GPT constructor, names, errors", "[transformer]") {
  kiln::manual_seed(8);
  MultiheadAttention mha(MultiheadAttentionOptions(8, 2));
  const std::vector<std::string> names = parameter_names(mha);
  CHECK(names == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  const double xavier = std::sqrt(6.0 / (8 + 24));  // xavier_uniform_ of [24, 8]
  CHECK(mha.in_proj_weight.abs().max().item() <= xavier);
  CHECK(mha.in_proj_weight.abs().max().item() > 0.8 * xavier);
  CHECK(mha.in_proj_bias.abs().max().item() == 0.0);
  CHECK(mha.out_proj.bias.abs().max().item() == 0.0);
  CHECK(mha.out_proj.weight.abs().max().item() <= 1.0 / std::sqrt(8.0));
  // The GPT constructor: batch first, its dropout after the projection, Linear's initialisation.
  MultiheadAttention gpt(8, 2, /*causal=*/true, /*bias=*/true, /*dropout=*/0.25);
  CHECK(gpt.options.batch_first());
  CHECK(gpt.options.output_dropout() == 0.25);
  CHECK(gpt.options.dropout() == 0.0);
  CHECK(gpt.in_proj_bias.abs().max().item() > 0.0);

  Tensor x = kiln::zeros({3, 2, 8});
  CHECK_THAT(error_of([&] { MultiheadAttention bad(MultiheadAttentionOptions(6, 4)); }),
             Catch::Contains("embed_dim (6) must be positive and divisible by num_heads (4)"));
  CHECK_THAT(error_of([&] { MultiheadAttention bad(MultiheadAttentionOptions(8, 2).dropout(1.5)); }),
             Catch::Contains("dropout must be in [0, 1], got 1.5"));
  CHECK_THAT(error_of([&] {
               mha(kiln::zeros({3, 2, 2, 8}));
             }),
             Catch::Contains("must all be 3-D ([L, N, E]) or all 2-D"));
  CHECK_THAT(error_of([&] {
               mha(x, kiln::zeros({5, 2, 6}), kiln::zeros({5, 2, 6}));
             }),
             Catch::Contains("a kdim or vdim of its own is not supported"));
  CHECK_THAT(error_of([&] {
               mha(x, kiln::zeros({5, 2, 8}), kiln::zeros({4, 2, 8}));
             }),
             Catch::Contains("key and value must hold the same keys"));
  CHECK_THAT(
      error_of([&] {
        mha(x, x, x, MultiheadAttentionArgs().attn_mask(kiln::zeros({3, 4})));
      }),
      Catch::Contains("attn_mask must be [L, S] = [3, 3] or [N * num_heads, L, S] = [4, 3, 3], got sizes [3, 4]"));
  CHECK_THAT(error_of([&] {
               mha(x, x, x, MultiheadAttentionArgs().key_padding_mask(kiln::zeros({3, 2})));
             }),
             Catch::Contains("key_padding_mask must be [N, S] = [2, 3], got sizes [3, 2]"));
  CHECK_THAT(error_of([&] { mha(x, Tensor(), x); }), Catch::Contains("query, key and value must be defined"));
  CHECK_THAT(error_of([&] {
               mha(x, x, x, MultiheadAttentionArgs().attn_mask(kiln::zeros({8, 3, 3})));
             }),
             Catch::Contains("got sizes [8, 3, 3]"));
  CHECK_THAT(
      error_of([&] {
        mha(x, x, x, MultiheadAttentionArgs().attn_mask(kiln::zeros({3, 3}, kiln::TensorOptions().dtype(DType::I64))));
      }),
      Catch::Contains("attn_mask must be bool (true: not attended to) or floating"));
}
