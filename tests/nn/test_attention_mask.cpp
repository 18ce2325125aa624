// F::scaled_dot_product_attention's full form (attn_mask, dropout_p, scale): values and gradients
// against PyTorch's (torch 2.x, float64, in torch_reference/attention_mask.json), the mask forms against each other and
// against the blocked causal path, dropout's expectation and reproducibility, gradchecks, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <vector>

#include <kiln/kiln.h>
#include "tests/nn/torch_reference.h"
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

// PyTorch's values for these tests (tests/nn/torch_reference/attention_mask.json, tests/nn/torch_reference.h)
const std::vector<double>& torch_ref(const char* name) { return torch_reference("attention_mask", name); }

namespace F = kiln::nn::functional;

Tensor q_in() { return sin_seq(24, 0.37, 0.1).view({1, 2, 3, 4}); }
Tensor k_in() { return sin_seq(40, 0.23, 0.5).view({1, 2, 5, 4}); }
Tensor v_in() { return sin_seq(40, 0.31, 0.9).view({1, 2, 5, 4}); }
// [3, 5]: key j of query i takes part unless (5 i + j) % 3 == 1
Tensor bool_mask() {
  std::vector<bool> m;
  for (int i = 0; i < 15; ++i) m.push_back(i % 3 != 1);
  return kiln::tensor(m).view({3, 5});
}

}  // namespace

TEST_CASE("sdpa: bool and additive masks and scale match PyTorch", "[attention]") {
  check_close(F::scaled_dot_product_attention(q_in(), k_in(), v_in(), bool_mask()), torch_ref("k_sdpa_bool_mask"), 0,
              1e-14);
  Tensor q = q_in().requires_grad_(), k = k_in().requires_grad_(), v = v_in().requires_grad_();
  Tensor fmask = sin_seq(10, 0.7, 0.2).view({2, 1, 5});
  Tensor out = F::scaled_dot_product_attention(q, k, v, fmask, 0.0, false, 0.3);
  check_close(out, torch_ref("k_sdpa_float_mask_scale"), 0, 1e-14);
  weighted_sum(out, 0.21, 0.3).backward();
  check_close(q.grad(), torch_ref("k_sdpa_grad_q"), 0, 1e-13, "dq");
  check_close(k.grad(), torch_ref("k_sdpa_grad_k"), 0, 1e-13, "dk");
  check_close(v.grad(), torch_ref("k_sdpa_grad_v"), 0, 1e-13, "dv");
}

TEST_CASE("sdpa: mask forms agree with each other and with the blocked path", "[attention]") {
  Tensor q = q_in(), k = k_in(), v = v_in();
  // a bool mask is an additive mask of 0 / -inf
  Tensor additive = kiln::zeros({3, 5}, f64()).masked_fill(kiln::logical_not(bool_mask()), -INFINITY);
  check_close(F::scaled_dot_product_attention(q, k, v, additive),
              values(F::scaled_dot_product_attention(q, k, v, bool_mask())), 0, 1e-15);
  // the top-left causal mask spelled out equals is_causal on the blocked kernels (Tq 3, Tk 5)
  Tensor causal = kiln::ones({3, 5}, DType::Bool).tril();
  check_close(F::scaled_dot_product_attention(q, k, v, causal), values(F::scaled_dot_product_attention(q, k, v, true)),
              0, 1e-14);
  // no mask, no dropout: the blocked path, with the scale passed through
  // (D = 4: the default scale is 0.5, so scale 0.3 is q * 0.6 at the default)
  check_close(F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true, 0.3),
              values(F::scaled_dot_product_attention(q * 0.6, k, v, true)), 0, 1e-14);
  check_close(F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, false, std::nullopt),
              values(F::scaled_dot_product_attention(q, k, v)), 0, 0);
  // an all-true mask changes nothing; a non-contiguous mask reads right
  check_close(F::scaled_dot_product_attention(q, k, v, kiln::ones({5}, DType::Bool)),
              values(F::scaled_dot_product_attention(q, k, v)), 0, 1e-14);
  Tensor mt = bool_mask().t().contiguous().t();
  check_close(F::scaled_dot_product_attention(q, k, v, mt),
              values(F::scaled_dot_product_attention(q, k, v, bool_mask())), 0, 0);
}

TEST_CASE("sdpa: dropout on the attention probabilities", "[attention]") {
  Tensor q = q_in(), k = k_in(), v = v_in();
  Tensor plain = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, true);
  kiln::manual_seed(11);
  Tensor a = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.4, true);
  kiln::manual_seed(11);
  Tensor b = F::scaled_dot_product_attention(q, k, v, Tensor(), 0.4, true);
  CHECK(kiln::equal(a, b));
  CHECK_FALSE(kiln::allclose(a, plain));
  CHECK(values(F::scaled_dot_product_attention(q, k, v, Tensor(), 1.0)) == std::vector<double>(24, 0.0));
  // E[dropout(p)] = p, so the mean over many draws approaches the plain output
  // (4000 draws at once: a leading batch of expanded copies, each with its own mask)
  IntList many{4000, 2, 3, 4}, many_kv{4000, 2, 5, 4};
  Tensor draws =
      F::scaled_dot_product_attention(q.expand(many), k.expand(many_kv), v.expand(many_kv), Tensor(), 0.4, true);
  check_close(draws.mean({0}, true), values(plain), 0, 0.05);
}

TEST_CASE("sdpa with masks: gradcheck", "[attention]") {
  kiln::manual_seed(12);
  Tensor q = kiln::randn({2, 3, 4}, f64(true)), k = kiln::randn({2, 5, 4}, f64(true)),
         v = kiln::randn({2, 5, 3}, f64(true));
  CHECK(kiln::gradcheck(
      [](const TL& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], bool_mask(), 0.0, false, 0.7); },
      {q, k, v}));
  Tensor fmask = kiln::randn({3, 5}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], in[3]); },
                        {q, k, v, fmask}));
}

TEST_CASE("sdpa with masks: errors", "[attention]") {
  Tensor q = q_in(), k = k_in(), v = v_in();
  CHECK_THAT(error_of([&] { F::scaled_dot_product_attention(q, k, v, bool_mask(), 0.0, true); }),
             Catch::Contains("an attn_mask or is_causal, not both"));
  CHECK_THAT(error_of([&] { F::scaled_dot_product_attention(q, k, v, Tensor(), 1.5); }),
             Catch::Contains("dropout_p must be in [0, 1]"));
  CHECK_THAT(error_of([&] {
               F::scaled_dot_product_attention(q, k, v, kiln::ones({3, 4}, DType::Bool));
             }),
             Catch::Contains("cannot be broadcast"));
  CHECK_THAT(error_of([&] {
               F::scaled_dot_product_attention(q, k, v, kiln::ones({2, 2, 3, 5}, DType::Bool));
             }),
             Catch::Contains("does not broadcast to the scores' sizes [1, 2, 3, 5]"));
  CHECK_THAT(error_of([&] {
               F::scaled_dot_product_attention(q, k, v, kiln::ones({3, 5}, DType::I64));
             }),
             Catch::Contains("attn_mask must be bool"));
  CHECK_THAT(error_of([&] { F::scaled_dot_product_attention(q, k, v, Tensor(), 0.0, false, 0.0); }),
             Catch::Contains("scale must be non-zero"));
  CHECK_THAT(error_of([&] { F::scaled_dot_product_attention(q, k.slice(-1, 0, 3), v, bool_mask()); }),
             Catch::Contains("mismatched sizes"));
}

TEST_CASE("sdpa: a query whose keys are all masked attends to nothing, as in PyTorch", "[attention]") {
  // torch 2.x gives such a row 0 (bool or -inf mask, with or without dropout) where a plain
  // softmax would give NaN; its gradients are 0 and the other rows are untouched.
  Tensor keep = kiln::ones({3, 5}, kiln::TensorOptions().dtype(kiln::DType::Bool));
  keep.select(0, 1).fill_(0.0);  // query 1 sees no key
  Tensor additive = kiln::zeros({3, 5}, f64()).masked_fill(kiln::logical_not(keep), -INFINITY);
  for (int form = 0; form < 3; ++form) {
    INFO((form == 0 ? "bool mask" : form == 1 ? "additive -inf mask" : "bool mask with dropout"));
    Tensor q = q_in().requires_grad_(), k = k_in().requires_grad_(), v = v_in().requires_grad_();
    kiln::manual_seed(3);
    Tensor y = F::scaled_dot_product_attention(q, k, v, form == 1 ? additive : keep, form == 2 ? 0.3 : 0.0);
    CHECK(values(y.select(2, 1)) == std::vector<double>(8, 0.0));
    Tensor full = kiln::ones({3, 5}, kiln::TensorOptions().dtype(kiln::DType::Bool));
    kiln::manual_seed(3);
    Tensor ref = F::scaled_dot_product_attention(q, k, v, full.select(0, 0).unsqueeze(0), form == 2 ? 0.3 : 0.0);
    if (form < 2) {  // the unmasked rows as without a mask
      check_same_tensor(y.select(2, 0), ref.select(2, 0), 1e-15, "row 0");
      check_same_tensor(y.select(2, 2), ref.select(2, 2), 1e-15, "row 2");
    }
    (y * y).sum().backward();
    CHECK(values(q.grad().select(2, 1)) == std::vector<double>(8, 0.0));
    for (const Tensor& g : {q.grad(), k.grad(), v.grad()})
      for (double x : values(g)) CHECK(std::isfinite(x));
  }
  // The weights form keeps the plain softmax: NaN there (what nn::MultiheadAttention returns).
  auto [y, p] = F::scaled_dot_product_attention_and_weights(q_in(), k_in(), v_in(), keep);
  for (double x : values(p.select(2, 1))) CHECK(std::isnan(x));
  for (double x : values(p.select(2, 0))) CHECK(std::isfinite(x));
}
