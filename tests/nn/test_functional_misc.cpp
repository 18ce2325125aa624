// leaky_relu, linear, dropout, l1 / smooth-l1 / BCE-with-logits losses and blocked attention:
// forward against references computed here, f64 gradchecks, dropout statistics and
// reproducibility, blocked attention == naive attention, error paths.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include <kiln/kernels/attention.h>
#include <kiln/nn/functional.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace F = kiln::nn::functional;
using kiln::DType;
using kiln::IntList;
using kiln::Reduction;
using kiln::Tensor;
using kiln::TensorOptions;

double max_err(const std::vector<double>& a, const std::vector<double>& b) {
  REQUIRE(a.size() == b.size());
  double e = 0;
  for (size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(a[i] - b[i]));
  return e;
}

// softmax(q k^T / sqrt(D) [+ causal]) v with kiln ops: the full score matrix.
Tensor naive_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  Tensor s = kiln::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    int64_t Tq = q.size(-2), Tk = k.size(-2);
    TensorOptions o = TensorOptions().dtype(DType::I64);
    Tensor keep = kiln::arange(static_cast<double>(Tk), o).view({1, Tk}) <=
                  kiln::arange(static_cast<double>(Tq), o).view({Tq, 1});
    s = kiln::where(keep, s, -std::numeric_limits<double>::infinity());
  }
  return kiln::matmul(kiln::softmax(s, -1), v);
}

}  // namespace

// ------------------------------------------------------------------------------ leaky_relu

TEST_CASE("leaky_relu: forward and gradcheck", "[linear]") {
  kiln::manual_seed(10);
  Tensor x = kiln::randn({5, 7}, f64(true));
  std::vector<double> xv = values(x), want;
  for (double v : xv) want.push_back(v > 0 ? v : 0.2 * v);
  CHECK(max_err(values(F::leaky_relu(x, 0.2)), want) == 0);
  CHECK(max_err(values(F::leaky_relu(x.t(), 0.2).t()), want) == 0);
  CHECK(kiln::gradcheck([](const TL& in) { return F::leaky_relu(in[0], 0.1); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::leaky_relu(in[0].t(), 0.3); }, {x}));
}

// ------------------------------------------------------------------------------ linear

TEST_CASE("linear: x @ w^T + b for any leading dims, gradchecks", "[linear]") {
  kiln::manual_seed(11);
  Tensor x = kiln::randn({2, 3, 4}, f64(true));
  Tensor w = kiln::randn({5, 4}, f64(true)), b = kiln::randn({5}, f64(true));
  std::vector<double> xv = values(x), wv = values(w), bv = values(b), want(2 * 3 * 5);
  for (int r = 0; r < 6; ++r)
    for (int o = 0; o < 5; ++o) {
      double s = bv[o];
      for (int i = 0; i < 4; ++i) s += xv[r * 4 + i] * wv[o * 4 + i];
      want[r * 5 + o] = s;
    }
  Tensor y = F::linear(x, w, b);
  CHECK(y.sizes() == IntList{2, 3, 5});
  CHECK(max_err(values(y), want) < 1e-12);
  CHECK(F::linear(x.select(0, 0).select(0, 0), w).sizes() == IntList{5});
  CHECK(kiln::gradcheck([](const TL& in) { return F::linear(in[0], in[1], in[2]); }, {x, w, b}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::linear(in[0], in[1]); },
                        {x.select(0, 1).detach().requires_grad_(), w}));
  CHECK_THROWS_AS(F::linear(x, kiln::randn({5, 3}, f64())), kiln::Error);
  CHECK_THROWS_AS(F::linear(x, w, kiln::randn({4}, f64())), kiln::Error);
}

// With a bias of the input's dtype the bias is the GEMM's epilogue and the backward one node:
// views for every operand, a single row, double backward, and a bias of another dtype (the
// composite path, which promotes).
TEST_CASE("linear: the bias epilogue path on views, one row, double backward", "[linear]") {
  kiln::manual_seed(12);
  Tensor xp = kiln::randn({4, 3, 2}, f64(true)), wt = kiln::randn({4, 5}, f64(true));
  Tensor bw = kiln::randn({10}, f64(true));
  auto f = [](const TL& in) { return F::linear(in[0].permute({2, 1, 0}), in[1].t(), in[2].slice(0, 0, 10, 2)); };
  const Tensor y = f({xp, wt, bw});
  const Tensor want = kiln::matmul(xp.permute({2, 1, 0}), wt) + bw.slice(0, 0, 10, 2);
  CHECK(y.sizes() == IntList{2, 3, 5});
  CHECK(max_err(values(y), values(want)) < 1e-12);
  CHECK(kiln::gradcheck(f, {xp, wt, bw}));
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        const Tensor out = f(in);
        return kiln::autograd::grad({(out * out).sum()}, {in[1]}, {}, true, true)[0];
      },
      {xp, wt, bw}));
  Tensor row = kiln::randn({4}, f64(true)), b = kiln::randn({5}, f64(true));
  CHECK(kiln::gradcheck([](const TL& in) { return F::linear(in[0], in[1].t(), in[2]); }, {row, wt, b}));
  const Tensor mixed = F::linear(xp.permute({2, 1, 0}), wt.t(), kiln::randn({5}));  // f32 bias, f64 input
  CHECK(mixed.dtype() == kiln::DType::F64);
}

// ------------------------------------------------------------------------------ dropout

TEST_CASE("dropout: kept fraction, scaling, reproducibility, masked gradient", "[dropout]") {
  const int64_t n = 100000;
  const double p = 0.3;
  Tensor x = kiln::rand({n}, f64()) + 1.0;  // all in [1, 2): a zero means dropped
  kiln::manual_seed(42);
  Tensor y1 = F::dropout(x, p, true);
  kiln::manual_seed(42);
  Tensor y2 = F::dropout(x, p, true);
  Tensor y3 = F::dropout(x, p, true);
  CHECK(kiln::equal(y1, y2));
  CHECK_FALSE(kiln::equal(y1, y3));
  std::vector<double> xv = values(x), yv = values(y1);
  int64_t kept = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (yv[i] != 0) {
      ++kept;
      worst = std::max(worst, std::abs(yv[i] - xv[i] / (1 - p)));
    }
  }
  // binomial std of the kept fraction: sqrt(p (1 - p) / n) ~ 0.0014; allow 5 sigma
  CHECK(std::abs(static_cast<double>(kept) / n - (1 - p)) < 0.0075);
  CHECK(worst < 1e-12);

  // float32 gives the same mask for the same seed
  kiln::manual_seed(42);
  std::vector<double> y32 = values(F::dropout(x.to(DType::F32), p, true));
  bool same_mask = true;
  for (int64_t i = 0; i < n; ++i) same_mask = same_mask && ((y32[i] == 0) == (yv[i] == 0));
  CHECK(same_mask);

  // gradient: masked identically and scaled
  Tensor xs = kiln::randn({1000}, f64(true));
  kiln::manual_seed(7);
  Tensor ys = F::dropout(xs, 0.5, true);
  Tensor gy = kiln::randn({1000}, f64());
  ys.backward(gy);
  std::vector<double> yv2 = values(ys), gv = values(xs.grad()), gyv = values(gy), xv2 = values(xs);
  bool ok = true;
  for (int i = 0; i < 1000; ++i) {
    bool dropped = yv2[i] == 0 && xv2[i] != 0;
    ok = ok && (dropped ? gv[i] == 0 : std::abs(gv[i] - 2 * gyv[i]) < 1e-12);
  }
  CHECK(ok);
  // gradcheck with a fixed seed per evaluation (the same mask each time)
  CHECK(kiln::gradcheck(
      [](const TL& in) {
        kiln::manual_seed(3);
        return F::dropout(in[0], 0.4, true);
      },
      {kiln::randn({4, 5}, f64(true))}));
  // a non-contiguous input
  Tensor xt = kiln::randn({30, 40}, f64());
  kiln::manual_seed(5);
  Tensor a = F::dropout(xt.t(), 0.5, true);
  kiln::manual_seed(5);
  Tensor b = F::dropout(xt.t().contiguous(), 0.5, true);
  CHECK(kiln::equal(a, b));
}

TEST_CASE("dropout: p = 0 and eval return the input, p = 1 gives zeros, bad p throws", "[dropout]") {
  Tensor x = kiln::randn({10, 10}, f64(true));
  CHECK(F::dropout(x, 0.0, true).is_same(x));
  CHECK(F::dropout(x, 0.7, false).is_same(x));
  Tensor z = F::dropout(x, 1.0, true);
  CHECK(max_err(values(z), std::vector<double>(100, 0.0)) == 0);
  z.sum().backward();
  CHECK(max_err(values(x.grad()), std::vector<double>(100, 0.0)) == 0);
  CHECK_THROWS_AS(F::dropout(x, -0.1, true), kiln::Error);
  CHECK_THROWS_AS(F::dropout(x, 1.5, true), kiln::Error);
  try {
    F::dropout(x, 1.5, true);
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    CHECK(m.find("dropout") != std::string::npos);
    CHECK(m.find("[10, 10]") != std::string::npos);
  }
}

// ------------------------------------------------------------------------------ losses

TEST_CASE("l1_loss and smooth_l1_loss: values for every reduction, gradchecks", "[loss]") {
  kiln::manual_seed(12);
  Tensor x = (kiln::randn({4, 5}, f64()) * 2.0).requires_grad_();
  Tensor t = kiln::randn({4, 5}, f64());
  std::vector<double> xv = values(x), tv = values(t), l1, sl1;
  const double beta = 0.7;
  for (size_t i = 0; i < xv.size(); ++i) {
    double d = std::abs(xv[i] - tv[i]);
    l1.push_back(d);
    sl1.push_back(d < beta ? 0.5 * d * d / beta : d - 0.5 * beta);
  }
  double s1 = 0, s2 = 0;
  for (size_t i = 0; i < l1.size(); ++i) {
    s1 += l1[i];
    s2 += sl1[i];
  }
  CHECK(max_err(values(F::l1_loss(x, t, Reduction::None)), l1) < 1e-12);
  CHECK(F::l1_loss(x, t).item<double>() == Approx(s1 / 20).epsilon(1e-12));
  CHECK(F::l1_loss(x, t, Reduction::Sum).item<double>() == Approx(s1).epsilon(1e-12));
  CHECK(max_err(values(F::smooth_l1_loss(x, t, Reduction::None, beta)), sl1) < 1e-12);
  CHECK(F::smooth_l1_loss(x, t, Reduction::Mean, beta).item<double>() == Approx(s2 / 20).epsilon(1e-12));
  CHECK(F::smooth_l1_loss(x, t, Reduction::Sum, 0.0).item<double>() == Approx(s1).epsilon(1e-12));
  CHECK(kiln::gradcheck([&](const TL& in) { return F::l1_loss(in[0], in[1], Reduction::Sum); },
                        {x, t.detach().requires_grad_()}));
  CHECK(kiln::gradcheck([&](const TL& in) { return F::smooth_l1_loss(in[0], in[1], Reduction::Mean, beta); },
                        {x, t.detach().requires_grad_()}));
  CHECK_THROWS_AS(F::l1_loss(x, kiln::randn({5, 4}, f64())), kiln::Error);
  CHECK_THROWS_AS(F::smooth_l1_loss(x, t, Reduction::Mean, -1.0), kiln::Error);
}

TEST_CASE("binary_cross_entropy_with_logits: stable values, pos_weight, gradchecks", "[loss]") {
  kiln::manual_seed(13);
  Tensor x = kiln::tensor({-800.0, -30.0, -1.5, 0.0, 0.5, 3.0, 40.0, 900.0}, f64()).reshape({2, 4});
  Tensor t = kiln::tensor({0.0, 1.0, 0.3, 1.0, 0.0, 1.0, 0.0, 1.0}, f64()).reshape({2, 4});
  Tensor pw = kiln::tensor({2.0, 0.5, 1.0, 3.0}, f64());
  std::vector<double> xv = values(x), tv = values(t), pwv = values(pw), want, want_pw;
  for (size_t i = 0; i < xv.size(); ++i) {
    // softplus(-x) computed in long double as the reference
    long double sp = std::log1p(std::exp(-std::abs(static_cast<long double>(xv[i])))) + std::max(-xv[i], 0.0);
    want.push_back(static_cast<double>((1 - tv[i]) * xv[i] + sp));
    double lw = 1 + (pwv[i % 4] - 1) * tv[i];
    want_pw.push_back(static_cast<double>((1 - tv[i]) * xv[i] + lw * sp));
  }
  CHECK(max_err(values(F::binary_cross_entropy_with_logits(x, t, Reduction::None)), want) < 1e-12);
  CHECK(max_err(values(F::binary_cross_entropy_with_logits(x, t, Reduction::None, pw)), want_pw) < 1e-12);
  double s = 0;
  for (double v : want) s += v;
  CHECK(F::binary_cross_entropy_with_logits(x, t).item<double>() == Approx(s / 8).epsilon(1e-12));
  // the gradient at x = 0 is exact: (1 - t) - sigmoid(0) = -0.5 for t = 1
  Tensor x0 = kiln::zeros({1}, f64(true));
  F::binary_cross_entropy_with_logits(x0, kiln::ones({1}, f64()), Reduction::Sum).backward();
  CHECK(x0.grad().item<double>() == Approx(-0.5).epsilon(1e-15));
  Tensor xs = (kiln::randn({3, 4}, f64()) * 2.0).requires_grad_();
  Tensor ts = kiln::rand({3, 4}, f64(true));
  Tensor pws = (kiln::rand({4}, f64()) + 0.5).detach().requires_grad_();
  CHECK(kiln::gradcheck(
      [](const TL& in) { return F::binary_cross_entropy_with_logits(in[0], in[1], Reduction::Mean, in[2]); },
      {xs, ts, pws}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::binary_cross_entropy_with_logits(in[0], in[1], Reduction::None); },
                        {xs, ts}));
  CHECK_THROWS_AS(F::binary_cross_entropy_with_logits(xs, kiln::rand({4, 3}, f64())), kiln::Error);
  CHECK_THROWS_AS(F::binary_cross_entropy_with_logits(xs, ts, Reduction::Mean, kiln::ones({3}, f64())), kiln::Error);
}

// ------------------------------------------------------------------------------ attention

TEST_CASE("scaled_dot_product_attention: blocked == naive in f64, causal and not", "[attention]") {
  kiln::manual_seed(14);
  const int64_t blk = kiln::kernels::cpu::attention_block_size();
  // T not a multiple of the block size; Tq != Tk; Dv != D; leading dims [2, 3]
  for (bool causal : {false, true}) {
    for (IntList t :
         {IntList{blk + 7, blk + 7}, IntList{2 * blk + 5, blk + 19}, IntList{9, 2 * blk + 3}, IntList{1, 1}}) {
      INFO("causal " << causal << " Tq " << t[0] << " Tk " << t[1]);
      Tensor q = kiln::randn({2, 3, t[0], 8}, f64()) * 1.5;
      Tensor k = kiln::randn({2, 3, t[1], 8}, f64()) * 1.5;
      Tensor v = kiln::randn({2, 3, t[1], 5}, f64());
      Tensor got = F::scaled_dot_product_attention(q, k, v, causal);
      CHECK(got.sizes() == IntList{2, 3, t[0], 5});
      CHECK(max_err(values(got), values(naive_attention(q, k, v, causal))) < 1e-10);
    }
  }
  // float32 against the f64 naive result
  Tensor q = kiln::randn({2, 100, 16}), k = kiln::randn({2, 100, 16}), v = kiln::randn({2, 100, 16});
  Tensor ref = naive_attention(q.to(DType::F64), k.to(DType::F64), v.to(DType::F64), true);
  CHECK(max_err(values(F::scaled_dot_product_attention(q, k, v, true)), values(ref)) < 1e-5);
}

TEST_CASE("scaled_dot_product_attention: backward == naive backward, gradchecks", "[attention]") {
  kiln::manual_seed(15);
  const int64_t blk = kiln::kernels::cpu::attention_block_size();
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    // the kernel's two schedules: rows of one head split over threads (few heads), and one pass
    // per head (at least two heads per thread)
    for (int64_t B : {int64_t{2}, int64_t{2 * kiln::get_num_threads() + 1}}) {
      INFO("batch " << B);
      Tensor q = kiln::randn({B, blk + 9, 6}, f64(true)), k = kiln::randn({B, blk + 3, 6}, f64(true)),
             v = kiln::randn({B, blk + 3, 4}, f64(true));
      Tensor gy = kiln::randn({B, blk + 9, 4}, f64());
      TL g1 = kiln::autograd::grad({F::scaled_dot_product_attention(q, k, v, causal)}, {q, k, v}, {gy});
      TL g2 = kiln::autograd::grad({naive_attention(q, k, v, causal)}, {q, k, v}, {gy});
      for (int i = 0; i < 3; ++i) CHECK(max_err(values(g1[i]), values(g2[i])) < 1e-10);
    }
    // full Jacobian check on a small case that still spans two blocks of queries
    Tensor qs = kiln::randn({1, blk + 3, 2}, f64(true)), ks = kiln::randn({1, blk + 3, 2}, f64(true)),
           vs = kiln::randn({1, blk + 3, 2}, f64(true));
    CHECK(kiln::gradcheck(
        [causal](const TL& in) { return F::scaled_dot_product_attention(in[0], in[1], in[2], causal); }, {qs, ks, vs}));
    // second derivative through create_graph
    Tensor q2 = kiln::randn({1, 5, 3}, f64(true)), k2 = kiln::randn({1, 4, 3}, f64(true)),
           v2 = kiln::randn({1, 4, 2}, f64(true));
    Tensor g2y = kiln::randn({1, 5, 2}, f64());
    CHECK(kiln::gradcheck(
        [&](const TL& in) {
          TL g = kiln::autograd::grad({F::scaled_dot_product_attention(in[0], in[1], in[2], causal)}, {in[0], in[1]},
                                      {g2y}, true, true);
          return (g[0] * g[0]).sum() + (g[1] * g[1]).sum();
        },
        {q2, k2, v2}));
  }
}

TEST_CASE("scaled_dot_product_attention: strided views give the contiguous results", "[attention]") {
  kiln::manual_seed(16);
  const int64_t blk = kiln::kernels::cpu::attention_block_size();
  const int64_t B = 2, T = blk + 5, H = 3, D = 4;
  for (bool causal : {false, true}) {
    INFO("causal " << causal);
    // q, k, v as a fused projection hands them over: [B, H, T, D] views of [B, T, 3, H, D]
    Tensor x = kiln::randn({B, T, 3, H, D}, f64(true));
    auto qkv = x.permute({2, 0, 3, 1, 4}).unbind(0);
    Tensor y = F::scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], causal);
    CHECK(y.sizes() == IntList{B, H, T, D});
    CHECK(y.transpose(1, 2).is_contiguous());  // heads merge back with a view
    Tensor xc = x.detach().clone().requires_grad_(true);
    Tensor qc = xc.select(2, 0).transpose(1, 2).contiguous(), kc = xc.select(2, 1).transpose(1, 2).contiguous(),
           vc = xc.select(2, 2).transpose(1, 2).contiguous();
    Tensor want = naive_attention(qc, kc, vc, causal);
    CHECK(max_err(values(y), values(want)) < 1e-10);
    Tensor gy = kiln::randn({B, H, T, D}, f64());
    Tensor gx = kiln::autograd::grad({y}, {x}, {gy})[0];
    Tensor gxc = kiln::autograd::grad({want}, {xc}, {gy})[0];
    CHECK(max_err(values(gx), values(gxc)) < 1e-10);
    // mixed: k with a non-unit last stride (copied), v 5-D (reshaped), in a 3-D batch
    Tensor q3 = kiln::randn({H, T, D}, f64(true));
    Tensor k3 = kiln::randn({H, D, T}, f64(true));
    Tensor v3 = kiln::randn({H, T, D}, f64(true));
    Tensor kt = k3.transpose(1, 2);
    Tensor got = F::scaled_dot_product_attention(q3, kt, v3, causal);
    Tensor ref = naive_attention(q3, k3.transpose(1, 2), v3, causal);
    CHECK(max_err(values(got), values(ref)) < 1e-10);
    TL g1 = kiln::autograd::grad({got}, {q3, k3, v3}, {gy[0]});
    TL g2 = kiln::autograd::grad({ref}, {q3, k3, v3}, {gy[0]});
    for (int i = 0; i < 3; ++i) CHECK(max_err(values(g1[i]), values(g2[i])) < 1e-10);
    Tensor q5 = kiln::randn({2, 1, H, T, D}, f64());
    CHECK(max_err(values(F::scaled_dot_product_attention(q5, q5, q5, causal)),
                  values(naive_attention(q5, q5, q5, causal))) < 1e-10);
  }
}

TEST_CASE("scaled_dot_product_attention: mismatched q/k/v throw naming the shapes", "[attention]") {
  Tensor q = kiln::randn({2, 5, 8}), k = kiln::randn({2, 6, 8}), v = kiln::randn({2, 6, 4});
  CHECK_NOTHROW(F::scaled_dot_product_attention(q, k, v));
  CHECK_THROWS_AS(F::scaled_dot_product_attention(q, kiln::randn({2, 6, 7}), v), kiln::Error);
  CHECK_THROWS_AS(F::scaled_dot_product_attention(q, k, kiln::randn({2, 5, 4})), kiln::Error);
  CHECK_THROWS_AS(F::scaled_dot_product_attention(q, kiln::randn({3, 6, 8}), kiln::randn({3, 6, 4})), kiln::Error);
  CHECK_THROWS_AS(F::scaled_dot_product_attention(q, k.to(DType::F64), v), kiln::Error);
  CHECK_THROWS_AS(F::scaled_dot_product_attention(kiln::randn({5}), k, v), kiln::Error);
  try {
    F::scaled_dot_product_attention(q, kiln::randn({2, 6, 7}), v);
  } catch (const kiln::Error& e) {
    std::string m = e.what();
    CHECK(m.find("scaled_dot_product_attention") != std::string::npos);
    CHECK(m.find("[2, 6, 7]") != std::string::npos);
  }
}
