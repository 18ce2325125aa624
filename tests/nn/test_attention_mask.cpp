// F::scaled_dot_product_attention's full form (attn_mask, dropout_p, scale): values and gradients
// against PyTorch's (torch 2.x, float64, pasted below), the mask forms against each other and
// against the blocked causal path, dropout's expectation and reproducibility, gradchecks, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <optional>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

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

// Reference values (PyTorch, float64), row-major; the comment gives the sizes.

// [1, 2, 3, 4]
const std::vector<double> k_sdpa_bool_mask = {
    0.24640823852575353,    0.24450121450117268,   0.21928519036883526,   0.17316408183286952,  0.6579955951745367,
    0.6093817764096818,     0.5026738499285235,    0.3480445875715703,    -0.20695566987884234, -0.10851061591477605,
    0.00027906542961053107, 0.10904214266840082,   0.5843662159129133,    0.7191382073415291,   0.7853526965646285,
    0.7766972669359992,     -0.061575871351609496, -0.023147055675800596, 0.017488435023451942, 0.05645670319099824,
    -0.07314468955625354,   -0.20694711033440494,  -0.32102067116833977,  -0.4044904132272992};
// [1, 2, 3, 4]
const std::vector<double> k_sdpa_float_mask_scale = {
    0.2255661590432445,   0.11717473342833308,   -0.002387294670821728, -0.1217217351407988,  0.26014552680357406,
    0.13099776722485565,  -0.010638384186964955, -0.15126034800603186,  -0.25935795805899153, -0.2841488733444864,
    -0.28185106380332453, -0.25268358619132586,  0.1877076049321281,    0.30831078163467257,  0.3995218096846762,
    0.4526452808937448,   -0.20083659766878906,  -0.14587620083162509,  -0.07700900852990522, -0.000800327181661814,
    -0.4148316161090909,  -0.3784399604400663,   -0.30597054091750286,  -0.20433207458358899};
// [1, 2, 3, 4]
const std::vector<double> k_sdpa_grad_q = {
    0.04854756086630392,  0.1106687151013102,  0.1669612568788352,   0.21446041508025332,    0.10774971267020829,
    0.20865490670367734,  0.29857082895049625, 0.3727618586523147,   0.08318781596308532,    0.14580236216525674,
    0.20073790474234185,  0.2451011419375598,  -0.01513461178363113, -0.0068239274447481025, 0.0018461541138189257,
    0.010419003886000922, 0.309801292230885,   0.2959152434761729,   0.2664441644542809,     0.2229402146726651,
    0.2772841555967945,   0.27351621027559464, 0.2553429292723462,   0.22372144859384085};
// [1, 2, 5, 4]
const std::vector<double> k_sdpa_grad_k = {
    0.18501013896715038,  0.18200764217443766,   0.15437126484986247,  0.1058414610161991,    0.20532613425751745,
    0.1847477555035859,   0.13916463473314442,   0.0747462335023858,   -0.2577579982586151,   -0.2656282760386299,
    -0.2375470127753905,  -0.17731487571641527,  -0.13633683850016248, -0.0911617197115303,   -0.03364828981890226,
    0.028419278249450876, 0.0037585635341098483, -0.00996540192786336, -0.022340596988714056, -0.03169209705162051,
    -0.04030950760690693, -0.09117297227699944,  -0.129696602861148,   -0.1506664066823088,   -0.0749845843132967,
    -0.10320647882812102, -0.11745986059703825,  -0.115815601263262,   0.01965940219071932,   0.04792224052281465,
    0.06969902841354012,  0.08204237978141624,   0.17068418810140226,  0.24206087396504333,   0.2806757560964091,
    0.28130249134962043,  -0.07504949837191796,  -0.09560366338273747, -0.10321832105176294,  -0.0968628631854658};
// [1, 2, 5, 4]
const std::vector<double> k_sdpa_grad_v = {
    0.28126043529857864,  0.31885427158853125,  0.34243823451228783,  0.35097608788461915,  0.5901934822009455,
    0.6686057434725685,   0.7176406915556454,   0.7351438205383077,   0.6010881417227348,   0.6506184556367718,
    0.6715617848829541,   0.6629979178889429,   0.4168265638846227,   0.41648607595905507,  0.39784595179558874,
    0.36172520434882305,  0.23222303495215071,  0.22367695047843564,  0.20530291000611406,  0.17790823525918284,
    0.012721312259734899, -0.10085935743100241, -0.21000845147320113, -0.30993015835727117, -0.1022600362438196,
    -0.1514387699484911,  -0.19396356115102553, -0.22796594832289047, -0.24092072531556968, -0.28378566069356725,
    -0.3141815733118831,  -0.3307729223778188,  -0.4151160079508681,  -0.47862234504238393, -0.5210988919075712,
    -0.54067930678582,    -0.41137406911436525, -0.5396118096317422,  -0.6441399944258063,  -0.720365846285616};

}  // namespace

TEST_CASE("sdpa: bool and additive masks and scale match PyTorch", "[attention]") {
  check_close(F::scaled_dot_product_attention(q_in(), k_in(), v_in(), bool_mask()), k_sdpa_bool_mask, 0, 1e-14);
  Tensor q = q_in().requires_grad_(), k = k_in().requires_grad_(), v = v_in().requires_grad_();
  Tensor fmask = sin_seq(10, 0.7, 0.2).view({2, 1, 5});
  Tensor out = F::scaled_dot_product_attention(q, k, v, fmask, 0.0, false, 0.3);
  check_close(out, k_sdpa_float_mask_scale, 0, 1e-14);
  weighted_sum(out, 0.21, 0.3).backward();
  check_close(q.grad(), k_sdpa_grad_q, 0, 1e-13, "dq");
  check_close(k.grad(), k_sdpa_grad_k, 0, 1e-13, "dk");
  check_close(v.grad(), k_sdpa_grad_v, 0, 1e-13, "dv");
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
