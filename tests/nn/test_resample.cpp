// F::pad, F::interpolate (every mode) and nn::Upsample: forward values and input gradients against PyTorch's
// (computed with torch 2.x in float64 and in torch_reference/resample.json), f64 gradchecks, non-contiguous and
// channels-last inputs, the error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/nn/torch_reference.h"
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

// PyTorch's values for these tests (tests/nn/torch_reference/resample.json, tests/nn/torch_reference.h)
const std::vector<double>& torch_ref(const char* name) { return torch_reference("resample", name); }

namespace F = kiln::nn::functional;
using kiln::nn::functional::InterpolateOptions;
using O = InterpolateOptions;

// The inputs the PyTorch references were computed from.
Tensor seq(int64_t n, double a = 0.37, double b = 0.1) { return sin_seq(n, a, b); }

// seq(24) as PyTorch computes it (float64): the values of image() and, its first 18, of the pad tests' input.
const std::vector<double> k_seq = {0.09983341664682815, 0.4528862853790683,   0.7446431199708593,  0.9356160015533859,
                                   0.9999576464987401,  0.9289597150038692,   0.7322314440302514,  0.4363990821601263,
                                   0.08150215176026912, -0.28442571253646254, -0.6118578909427193, -0.8564779741650012,
                                   -0.9851777815038593, -0.980538397794069,   -0.8431877418564172, -0.59171558063101,
                                   -0.2601574914304689, 0.10661169378122266,  0.4589514863776903,  0.7491743483316894,
                                   0.9379999767747389,  0.999871708718139,    0.9264154954967662,  0.7275732909714597};

// Nearest-neighbour resampling and every pad mode only pick input values: their PyTorch outputs
// are k_seq read as `planes` planes of [H, W], element [p, i, j] of the output being plane p's
// (rows[i], cols[j]), or `fill` where rows[i] or cols[j] is -1 (a padded element).
std::vector<double> pick(int64_t planes, int64_t H, int64_t W, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& cols, double fill = 0) {
  std::vector<double> out;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i : rows)
      for (int64_t j : cols) out.push_back(i < 0 || j < 0 ? fill : k_seq.at((p * H + i) * W + j));
  return out;
}

Tensor image() { return seq(24).view({2, 1, 3, 4}); }

// An output against PyTorch's: its sizes, then every element within tol (absolute).
void check_parity(const std::string& what, const Tensor& got, const IntList& sizes, const std::vector<double>& want,
                  double tol) {
  INFO(what);
  CHECK(got.sizes() == sizes);
  check_close(got, want, 0, tol, what);
}

// The gradient of image() through weighted_sum(interpolate(image(), o), 0.21, 0.3), the loss of
// the PyTorch script.
Tensor image_grad(const InterpolateOptions& o) {
  Tensor x = image().requires_grad_();
  weighted_sum(F::interpolate(x, o), 0.21, 0.3).backward();
  return x.grad();
}

// f64 gradcheck of interpolate(., o) at x.
bool interpolate_gradcheck(const Tensor& x, const InterpolateOptions& o) {
  return kiln::gradcheck([o](const TL& in) { return F::interpolate(in[0], o); }, {x});
}

}  // namespace

// ------------------------------------------------------------------------------ interpolate

TEST_CASE("interpolate: nearest and nearest-exact match PyTorch", "[resample]") {
  Tensor x = image();
  check_parity("nearest 5x7", F::interpolate(x, O().size({5, 7})), {2, 1, 5, 7},
               pick(2, 3, 4, {0, 0, 1, 1, 2}, {0, 0, 1, 1, 2, 2, 3}), 1e-15);
  check_parity("nearest-exact 5x7", F::interpolate(x, O().size({5, 7}).mode("nearest-exact")), {2, 1, 5, 7},
               pick(2, 3, 4, {0, 0, 1, 2, 2}, {0, 0, 1, 2, 2, 3, 3}), 1e-15);
  check_parity("nearest x1.5", F::interpolate(x, O().scale_factor({1.5})), {2, 1, 4, 6},
               pick(2, 3, 4, {0, 0, 1, 2}, {0, 0, 1, 2, 2, 3}), 1e-15);
  // scale 2 is pixel doubling; the same size is the identity
  Tensor d = F::interpolate(x, O().scale_factor({2.0}));
  CHECK(kiln::equal(d.slice(2, 0, 6, 2).slice(3, 0, 8, 2), x));
  CHECK(kiln::equal(d.slice(2, 1, 6, 2).slice(3, 1, 8, 2), x));
  CHECK(kiln::equal(F::interpolate(x, O().size({3, 4})), x));
}

TEST_CASE("interpolate: bilinear and linear match PyTorch", "[resample]") {
  Tensor x = image();
  check_parity("bilinear 5x7 align_corners", F::interpolate(x, O().size({5, 7}).mode("bilinear").align_corners(true)),
               {2, 1, 5, 7}, torch_ref("k_bilinear_5x7_ac"), 1e-14);
  check_parity("bilinear 5x7", F::interpolate(x, O().size({5, 7}).mode("bilinear")), {2, 1, 5, 7},
               torch_ref("k_bilinear_5x7"), 1e-14);
  check_parity("bilinear x1.5", F::interpolate(x, O().scale_factor({1.5}).mode("bilinear")), {2, 1, 4, 6},
               torch_ref("k_bilinear_sf15"), 1e-14);
  check_parity("bilinear 2x3", F::interpolate(x, O().size({2, 3}).mode("bilinear")), {2, 1, 2, 3},
               torch_ref("k_bilinear_down_2x3"), 1e-14);
  check_parity("linear 8", F::interpolate(seq(10).view({1, 2, 5}), O().size({8}).mode("linear")), {1, 2, 8},
               torch_ref("k_linear_8"), 1e-14);
  // f32 follows the f64 values to float rounding
  check_parity("bilinear 5x7 f32", F::interpolate(x.to(DType::F32), O().size({5, 7}).mode("bilinear")), {2, 1, 5, 7},
               torch_ref("k_bilinear_5x7"), 1e-6);
  // align_corners keeps the corner pixels exactly
  Tensor ac = F::interpolate(x, O().size({6, 9}).mode("bilinear").align_corners(true));
  CHECK(kiln::equal(ac.slice(2, 0, 6, 5).slice(3, 0, 9, 8), x.slice(2, 0, 3, 2).slice(3, 0, 4, 3)));
}

TEST_CASE("interpolate: bicubic and area match PyTorch", "[resample]") {
  Tensor x = image();
  check_parity("bicubic 5x7", F::interpolate(x, O().size({5, 7}).mode("bicubic")), {2, 1, 5, 7},
               torch_ref("k_bicubic_5x7"), 1e-14);
  check_parity("bicubic 5x7 align_corners", F::interpolate(x, O().size({5, 7}).mode("bicubic").align_corners(true)),
               {2, 1, 5, 7}, torch_ref("k_bicubic_5x7_ac"), 1e-14);
  check_parity("bicubic x1.5", F::interpolate(x, O().scale_factor({1.5}).mode("bicubic")), {2, 1, 4, 6},
               torch_ref("k_bicubic_sf15"), 1e-14);
  check_parity("bicubic 2x3", F::interpolate(x, O().size({2, 3}).mode("bicubic")), {2, 1, 2, 3},
               torch_ref("k_bicubic_down_2x3"), 1e-14);
  check_parity("area 2x3", F::interpolate(x, O().size({2, 3}).mode("area")), {2, 1, 2, 3}, torch_ref("k_area_2x3"),
               1e-15);
  check_parity("area 3", F::interpolate(seq(10).view({1, 2, 5}), O().size({3}).mode("area")), {1, 2, 3},
               torch_ref("k_area_linear_3"), 1e-15);
  CHECK(kiln::equal(F::interpolate(x, O().size({3, 4}).mode("bicubic")), x));  // same size: the identity
  check_close(image_grad(O().size({5, 7}).mode("bicubic")), torch_ref("k_bicubic_5x7_grad"), 0, 1e-13);
  Tensor g = kiln::randn({1, 2, 3, 4}, f64(true));
  for (bool ac : {false, true}) CHECK(interpolate_gradcheck(g, O().size({5, 3}).mode("bicubic").align_corners(ac)));
  CHECK(interpolate_gradcheck(g, O().size({2, 3}).mode("area")));
}

TEST_CASE("interpolate: gradients match PyTorch and gradcheck", "[resample]") {
  check_close(image_grad(O().size({5, 7}).mode("bilinear")), torch_ref("k_bilinear_5x7_grad"), 0, 1e-13);
  check_close(image_grad(O().scale_factor({1.5})), torch_ref("k_nearest_sf15_grad"), 0, 1e-13);
  Tensor g = kiln::randn({1, 2, 3, 3}, f64(true));
  for (bool ac : {false, true}) CHECK(interpolate_gradcheck(g, O().size({4, 5}).mode("bilinear").align_corners(ac)));
  CHECK(interpolate_gradcheck(g, O().size({2, 5})));
  CHECK(interpolate_gradcheck(kiln::randn({2, 1, 4}, f64(true)), O().size({7}).mode("linear").align_corners(true)));
}

TEST_CASE("interpolate: non-contiguous and channels-last inputs", "[resample]") {
  kiln::manual_seed(3);
  Tensor x = kiln::randn({2, 3, 5, 4}, f64());
  for (const std::string mode : {"nearest", "bilinear"}) {
    InterpolateOptions o = InterpolateOptions().size({7, 6}).mode(mode);
    Tensor want = F::interpolate(x, o);
    check_close(F::interpolate(channels_last(x), o), values(want), 0, 1e-15, mode + " channels-last");
    Tensor t = x.transpose(2, 3).contiguous().transpose(2, 3);  // H and W strides swapped
    check_close(F::interpolate(t, o), values(want), 0, 1e-15, mode + " transposed");
    Tensor wide = kiln::randn({2, 3, 5, 8}, f64());
    check_close(F::interpolate(wide.slice(3, 0, 8, 2), o),
                values(F::interpolate(wide.slice(3, 0, 8, 2).contiguous(), o)), 0, 1e-15, mode + " strided");
  }
}

TEST_CASE("interpolate: errors", "[resample]") {
  Tensor x = image();
  const struct {
    Tensor x;
    InterpolateOptions o;
    const char* message;
  } cases[] = {
      {x, O(), "either size or scale_factor should be given"},
      {x, O().size({4, 4}).scale_factor({2}), "only one of size or scale_factor"},
      {x, O().size({4, 4}).mode("trilinear"), "unknown mode 'trilinear'"},
      {x, O().size({4, 4}).align_corners(true), "align_corners can only be set with the interpolating modes"},
      {x, O().size({4, 4}).mode("area").align_corners(true), "align_corners can only be set"},
      {x.select(1, 0), O().size({4}).mode("bicubic"), "mode 'bicubic' needs a 4-D input"},
      {x, O().size({4}).mode("linear"), "mode 'linear' needs a 3-D input"},
      {x.view({2, 12}), O().size({4}), "expected a 3-D [N, C, W] or 4-D [N, C, H, W] input"},
      {x, O().size({4, 4, 4}), "size must have 1 or 2 values"},
      {x, O().scale_factor({0.1}), "sizes should be greater than 0"},
      {x, O().scale_factor({-2}), "scale_factor must be positive"},
      {kiln::ones({1, 1, 2, 2}, DType::I64), O().size({4}), "floating-point"},
  };
  for (const auto& c : cases) CHECK_THAT(error_of([&] { F::interpolate(c.x, c.o); }), Catch::Contains(c.message));
}

TEST_CASE("nn::Upsample runs interpolate and prints as PyTorch", "[resample]") {
  kiln::nn::Upsample up(O().scale_factor({2}).mode("bilinear").align_corners(true));
  Tensor x = image();
  CHECK(kiln::equal(up(x), F::interpolate(x, up.options)));
  CHECK(up.str() == "Upsample(scale_factor=2.0, mode='bilinear')");
  kiln::nn::Upsample sized(O().size({4, 6}));
  CHECK(sized.extra_repr() == "size=(4, 6), mode='nearest'");
  CHECK(sized(x).sizes() == IntList{2, 1, 4, 6});
}

// ------------------------------------------------------------------------------ pad

TEST_CASE("pad: constant, reflect, replicate and circular match PyTorch", "[resample]") {
  Tensor p = seq(18).view({1, 2, 3, 3});
  check_parity("constant", F::pad(p, {1, 2, 0, 1}, "constant", -1.5), {1, 2, 4, 6},
               pick(2, 3, 3, {0, 1, 2, -1}, {-1, 0, 1, 2, -1, -1}, -1.5), 0);
  check_parity("constant, negative (a crop)", F::pad(p, {-1, 1, 1, -2}), {1, 2, 2, 3},
               pick(2, 3, 3, {-1, 0}, {1, 2, -1}), 0);
  check_parity("reflect", F::pad(p, {2, 1, 1, 2}, "reflect"), {1, 2, 6, 6},
               pick(2, 3, 3, {1, 0, 1, 2, 1, 0}, {2, 1, 0, 1, 2, 1}), 0);
  check_parity("replicate", F::pad(p, {2, 1, 1, 2}, "replicate"), {1, 2, 6, 6},
               pick(2, 3, 3, {0, 0, 1, 2, 2, 2}, {0, 0, 0, 1, 2, 2}), 0);
  check_parity("circular", F::pad(p, {2, 1, 1, 3}, "circular"), {1, 2, 7, 6},
               pick(2, 3, 3, {2, 0, 1, 2, 0, 1, 2}, {1, 2, 0, 1, 2, 0}), 0);
  // constant padding of every dim, and of a non-contiguous view
  Tensor all = F::pad(kiln::ones({2, 2}), {1, 0, 0, 1});
  CHECK(values(all) == std::vector<double>{0, 1, 1, 0, 1, 1, 0, 0, 0});
  Tensor t = p.transpose(2, 3);
  check_close(F::pad(t, {2, 1, 1, 2}, "reflect"), values(F::pad(t.contiguous(), {2, 1, 1, 2}, "reflect")), 0, 0);
  check_close(F::pad(t, {1, 1}, "constant", 3.0), values(F::pad(t.contiguous(), {1, 1}, "constant", 3.0)), 0, 0);
  // integer tensors pad too
  CHECK(values(F::pad(kiln::tensor({1, 2}), {1, 1}, "constant", 7)) == std::vector<double>{7, 1, 2, 7});
}

TEST_CASE("pad: gradcheck", "[resample]") {
  kiln::manual_seed(4);
  Tensor x = kiln::randn({1, 2, 3, 4}, f64(true));
  for (const std::string mode : {"constant", "reflect", "replicate", "circular"})
    CHECK(kiln::gradcheck([mode](const TL& in) { return F::pad(in[0], {2, 1, 1, 2}, mode); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::pad(in[0], {-1, 2, 1, -1}, "constant", 0.5); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::pad(in[0].transpose(2, 3), {1, 1, 0, 0}, "reflect"); }, {x}));
}

TEST_CASE("pad: errors", "[resample]") {
  Tensor x = kiln::zeros({1, 1, 3, 3});
  const struct {
    IntList pad;
    const char* mode;
    double value;
    const char* message;
  } cases[] = {
      {{1, 2, 3}, "constant", 0, "divisible by 2"},
      {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, "constant", 0, "too large"},
      {{-2, -2}, "constant", 0, "negative output size"},
      {{-4, 2}, "constant", 0, "crops more than its size 3"},
      {{3, 0, 0, 0}, "reflect", 0, "must be smaller than the size 3"},
      {{0, 0, 0, 4}, "circular", 0, "at most the size 3"},
      {{-1, 0, 0, 0}, "replicate", 0, "non-negative padding"},
      {{1, 1}, "reflect", 0, "2-D or 3-D input"},
      {{1, 1}, "mirror", 0, "unknown mode 'mirror'"},
      {{1, 1, 1, 1}, "reflect", 2.0, "only used by mode 'constant'"},
  };
  for (const auto& c : cases)
    CHECK_THAT(error_of([&] { F::pad(x, c.pad, c.mode, c.value); }), Catch::Contains(c.message));
}

// ------------------------------------------------------------------------------ unflatten

TEST_CASE("unflatten and nn::Unflatten", "[resample]") {
  Tensor x = kiln::arange(24.0, f64()).view({2, 12});
  Tensor u = x.unflatten(1, {3, 4});
  CHECK(u.sizes() == IntList{2, 3, 4});
  CHECK(values(u) == values(x));
  CHECK(x.unflatten(-1, {2, -1, 2}).sizes() == IntList{2, 2, 3, 2});
  CHECK(x.unflatten(0, {1, 2}).sizes() == IntList{1, 2, 12});
  // a view, also of a transposed tensor, and differentiable
  Tensor t = x.t();  // [12, 2]
  Tensor tu = t.unflatten(0, {4, 3});
  CHECK(tu.storage() == x.storage());
  CHECK(values(tu.select(0, 1).select(0, 2)) == std::vector<double>{5, 17});
  CHECK(kiln::gradcheck(
      [](const TL& in) {
        return in[0].t().unflatten(0, {2, 3}) * 2.0;
      },
      {kiln::randn({2, 6}, f64(true))}));
  kiln::nn::Unflatten m(1, {3, 2, 2});
  CHECK(m(x).sizes() == IntList{2, 3, 2, 2});
  CHECK(m.str() == "Unflatten(dim=1, unflattened_size=(3, 2, 2))");
  CHECK_THAT(error_of([&] { x.unflatten(1, {5, 2}); }), Catch::Contains("don't multiply up to the size of dim 1 (12)"));
  CHECK_THAT(error_of([&] { x.unflatten(1, {-1, -1}); }), Catch::Contains("only one dimension can be inferred"));
  CHECK_THAT(error_of([&] { x.unflatten(1, {5, -1}); }), Catch::Contains("cannot be inferred"));
  CHECK_THAT(error_of([&] { x.unflatten(1, {}); }), Catch::Contains("sizes must be non-empty"));
  CHECK_THAT(error_of([&] { x.unflatten(2, {2, 6}); }), Catch::Contains("unflatten"));
}
