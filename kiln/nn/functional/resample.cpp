// F::pad and F::interpolate, built from differentiable ops that exist on every device:
//   constant pad        -> narrow (negative amounts) and cat with full() blocks
//   reflect / replicate / circular pad -> one index_select per padded dim
//   nearest resize      -> one index_select per spatial dim
//   (bi)linear, bicubic -> per spatial dim, two (four) index_selects of the neighbours mixed by
//                          the interpolation weights; both are separable, so one pass per dim
//   area                -> adaptive_avg_pool2d
// The index and weight tables are computed on the host with PyTorch's source-coordinate rules
// and copied to x's device; the gradients come from index_select's backward (an index_add).
#include <cmath>
#include <string>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/shape.h"
#include "kiln/nn/functional.h"

namespace kiln::nn::functional {

namespace {

Tensor index_tensor(const std::vector<int64_t>& idx, const Device& device) {
  return kiln::tensor(idx, TensorOptions().dtype(DType::I64)).to(device);
}

// x's size along dim d becomes len: the source index of each output position.
Tensor gather_along(const Tensor& x, int64_t d, const std::vector<int64_t>& idx) {
  return index_select(x, d, index_tensor(idx, x.device()));
}

// Source index of output position o for a non-constant pad of (left, right) over a dim of n.
int64_t pad_source(const std::string& mode, int64_t o, int64_t left, int64_t n) {
  int64_t i = o - left;
  if (mode == "reflect") {
    if (i < 0) i = -i;
    if (i >= n) i = 2 * (n - 1) - i;
    return i;
  }
  if (mode == "replicate") return i < 0 ? 0 : (i >= n ? n - 1 : i);
  return ((i % n) + n) % n;  // circular
}

Tensor pad_constant(const Tensor& x, const IntList& pad, double value) {
  Tensor out = x;
  const int64_t pairs = static_cast<int64_t>(pad.size()) / 2;
  for (int64_t k = 0; k < pairs; ++k) {
    const int64_t d = x.dim() - 1 - k;
    int64_t left = pad[2 * k], right = pad[2 * k + 1];
    const int64_t n = out.size(d);
    KILN_CHECK(n + left + right >= 0, "pad: the input size ", n, " of dim ", d, " plus the padding (", left, ", ",
               right, ") gives a negative output size (input sizes ", x.sizes(), ")");
    const int64_t crop_l = left < 0 ? -left : 0, crop_r = right < 0 ? -right : 0;
    KILN_CHECK(crop_l + crop_r <= n, "pad: the negative padding (", left, ", ", right, ") of dim ", d,
               " crops more than its size ", n, " (input sizes ", x.sizes(), ")");
    if (crop_l + crop_r > 0) out = out.narrow(d, crop_l, n - crop_l - crop_r);
    std::vector<Tensor> parts;
    IntList block = out.sizes();
    if (left > 0) {
      block[static_cast<size_t>(d)] = left;
      parts.push_back(full(block, value, out.options()));
    }
    parts.push_back(out);
    if (right > 0) {
      block[static_cast<size_t>(d)] = right;
      parts.push_back(full(block, value, out.options()));
    }
    if (parts.size() > 1) out = cat(parts, d);
  }
  return out;
}

Tensor pad_indexed(const Tensor& x, const IntList& pad, const std::string& mode) {
  const int64_t pairs = static_cast<int64_t>(pad.size()) / 2;
  KILN_CHECK(x.dim() == pairs + 1 || x.dim() == pairs + 2, "pad: mode '", mode, "' with ", pad.size(),
             " padding values pads the last ", pairs, " dim(s) of a ", pairs + 1, "-D or ", pairs + 2,
             "-D input, got sizes ", x.sizes());
  Tensor out = x;
  for (int64_t k = 0; k < pairs; ++k) {
    const int64_t d = x.dim() - 1 - k;
    const int64_t left = pad[2 * k], right = pad[2 * k + 1], n = x.size(d);
    KILN_CHECK(left >= 0 && right >= 0, "pad: mode '", mode, "' needs non-negative padding, got (", left, ", ", right,
               ") for dim ", d);
    if (left == 0 && right == 0) continue;
    KILN_CHECK(n > 0, "pad: mode '", mode, "' cannot pad the empty dim ", d, " (input sizes ", x.sizes(), ")");
    if (mode == "reflect")
      KILN_CHECK(left < n && right < n, "pad: reflect padding (", left, ", ", right, ") must be smaller than the size ",
                 n, " of dim ", d, " (input sizes ", x.sizes(), ")");
    if (mode == "circular")
      KILN_CHECK(left <= n && right <= n, "pad: circular padding (", left, ", ", right, ") must be at most the size ",
                 n, " of dim ", d, " (input sizes ", x.sizes(), ")");
    std::vector<int64_t> idx(static_cast<size_t>(n + left + right));
    for (size_t o = 0; o < idx.size(); ++o) idx[o] = pad_source(mode, static_cast<int64_t>(o), left, n);
    out = gather_along(out, d, idx);
  }
  return out;
}

// One spatial dim's resampling plan: out[o] = sum_k weight[k][o] * in[index[k][o]] over the
// plan's taps (1 for nearest, with no weights; 2 for linear; 4 for cubic).
struct AxisPlan {
  std::vector<std::vector<int64_t>> index;
  std::vector<std::vector<double>> weight;
  explicit AxisPlan(size_t taps, bool weighted) : index(taps), weight(weighted ? taps : 0) {}
};

// PyTorch's nearest rules, in float as its kernels compute them. scale: the given scale factor,
// or 0 when the size was given.
AxisPlan nearest_plan(int64_t in, int64_t out, double scale, bool exact) {
  AxisPlan p(1, false);
  const float ratio = scale > 0 ? static_cast<float>(1.0 / scale) : static_cast<float>(in) / static_cast<float>(out);
  for (int64_t o = 0; o < out; ++o) {
    int64_t src;
    if (!exact && out == in) {
      src = o;
    } else if (!exact && out == 2 * in) {
      src = o / 2;
    } else {
      const float f = exact ? (static_cast<float>(o) + 0.5f) * ratio : static_cast<float>(o) * ratio;
      src = std::min(static_cast<int64_t>(std::floor(f)), in - 1);
    }
    p.index[0].push_back(src);
  }
  return p;
}

// The source-to-output ratio of the linear and cubic modes (PyTorch's area_pixel_compute_scale).
template <class T> T source_ratio(int64_t in, int64_t out, double scale, bool align_corners) {
  if (align_corners) return out > 1 ? static_cast<T>(in - 1) / static_cast<T>(out - 1) : T(0);
  return scale > 0 ? static_cast<T>(1.0 / scale) : static_cast<T>(in) / static_cast<T>(out);
}

template <class T> T clamp01(T v) { return v < T(0) ? T(0) : (v > T(1) ? T(1) : v); }

// PyTorch's linear source coordinates and weights, in T (float for f32/f16/bf16, double for f64).
template <class T> AxisPlan linear_plan(int64_t in, int64_t out, double scale, bool align_corners) {
  AxisPlan p(2, true);
  const T ratio = source_ratio<T>(in, out, scale, align_corners);
  for (int64_t o = 0; o < out; ++o) {
    int64_t i0 = o, i1 = o;
    T l1 = 0;
    if (in != out) {
      T real = align_corners ? ratio * static_cast<T>(o) : ratio * (static_cast<T>(o) + T(0.5)) - T(0.5);
      if (real < T(0)) real = T(0);
      i0 = static_cast<int64_t>(real);
      i1 = i0 + (i0 < in - 1 ? 1 : 0);
      l1 = clamp01(real - static_cast<T>(i0));
    }
    p.index[0].push_back(i0);
    p.index[1].push_back(i1);
    p.weight[0].push_back(static_cast<double>(T(1) - l1));
    p.weight[1].push_back(static_cast<double>(l1));
  }
  return p;
}

// PyTorch's bicubic: Keys' convolution with A = -0.75 over the 4 neighbours of floor(source)
// (indices clamped at the border); the source coordinate is not clamped at 0.
template <class T> AxisPlan cubic_plan(int64_t in, int64_t out, double scale, bool align_corners) {
  AxisPlan p(4, true);
  const T ratio = source_ratio<T>(in, out, scale, align_corners), A = T(-0.75);
  auto near = [A](T x) { return ((A + 2) * x - (A + 3)) * x * x + 1; };       // |x| <= 1
  auto far = [A](T x) { return ((A * x - 5 * A) * x + 8 * A) * x - 4 * A; };  // 1 < |x| < 2
  for (int64_t o = 0; o < out; ++o) {
    const T real = align_corners ? ratio * static_cast<T>(o) : ratio * (static_cast<T>(o) + T(0.5)) - T(0.5);
    const T fl = std::floor(real);
    const int64_t base = static_cast<int64_t>(fl);
    const T t = real - fl;
    const T w[4] = {far(t + 1), near(t), near(1 - t), far(2 - t)};
    for (int k = 0; k < 4; ++k) {
      p.index[k].push_back(std::min(std::max(base - 1 + k, int64_t(0)), in - 1));
      p.weight[k].push_back(static_cast<double>(w[k]));
    }
  }
  return p;
}

template <class T>
AxisPlan weighted_plan(const std::string& mode, int64_t in, int64_t out, double scale, bool align_corners) {
  return mode == "bicubic" ? cubic_plan<T>(in, out, scale, align_corners)
                           : linear_plan<T>(in, out, scale, align_corners);
}

Tensor apply_plan(const Tensor& x, int64_t d, const AxisPlan& p) {
  if (p.weight.empty()) return gather_along(x, d, p.index[0]);
  IntList wshape(static_cast<size_t>(x.dim()), 1);
  wshape[static_cast<size_t>(d)] = static_cast<int64_t>(p.index[0].size());
  Tensor out;
  for (size_t k = 0; k < p.index.size(); ++k) {
    Tensor w = kiln::tensor(p.weight[k], TensorOptions().dtype(DType::F64)).to(x.device(), x.dtype()).view(wshape);
    Tensor term = gather_along(x, d, p.index[k]) * w;
    out = out.defined() ? out + term : term;
  }
  return out;
}

}  // namespace

Tensor pad(const Tensor& x, const IntList& pad, const std::string& mode, double value) {
  KILN_CHECK(x.defined(), "pad: input is undefined");
  KILN_CHECK(pad.size() % 2 == 0, "pad: padding length must be divisible by 2, got ", pad.size(), " values ", pad);
  KILN_CHECK(static_cast<int64_t>(pad.size()) / 2 <= x.dim(), "pad: padding length ", pad.size(),
             " is too large for an input of ", x.dim(), " dims (sizes ", x.sizes(), ")");
  if (mode == "constant") return pad_constant(x, pad, value);
  KILN_CHECK(mode == "reflect" || mode == "replicate" || mode == "circular", "pad: unknown mode '", mode,
             "' (expected constant, reflect, replicate or circular)");
  KILN_CHECK(value == 0.0, "pad: a padding value is only used by mode 'constant', got mode '", mode, "' and value ",
             value);
  KILN_CHECK(!pad.empty() && pad.size() <= 6, "pad: mode '", mode, "' takes 2, 4 or 6 padding values, got ",
             pad.size());
  return pad_indexed(x, pad, mode);
}

Tensor interpolate(const Tensor& x, const InterpolateOptions& options) {
  const std::string& mode = options.mode();
  KILN_CHECK(x.defined(), "interpolate: input is undefined");
  KILN_CHECK(mode == "nearest" || mode == "nearest-exact" || mode == "linear" || mode == "bilinear" ||
                 mode == "bicubic" || mode == "area",
             "interpolate: unknown mode '", mode,
             "' (expected nearest, nearest-exact, linear, bilinear, bicubic or area)");
  KILN_CHECK(x.dim() == 3 || x.dim() == 4,
             "interpolate: expected a 3-D [N, C, W] or 4-D [N, C, H, W] input, got sizes ", x.sizes());
  KILN_CHECK(x.is_floating_point(), "interpolate: expected a floating-point input, got ", x.dtype());
  const bool weighted = mode == "linear" || mode == "bilinear" || mode == "bicubic";
  if (mode == "linear")
    KILN_CHECK(x.dim() == 3, "interpolate: got a ", x.dim(), "-D input, but mode 'linear' needs a 3-D input");
  if (mode == "bilinear" || mode == "bicubic")
    KILN_CHECK(x.dim() == 4, "interpolate: got a ", x.dim(), "-D input, but mode '", mode, "' needs a 4-D input");
  KILN_CHECK(
      weighted || !options.align_corners(),
      "interpolate: align_corners can only be set with the interpolating modes (linear, bilinear, bicubic), got mode '",
      mode, "'");
  const int64_t spatial = x.dim() - 2;
  const bool has_size = !options.size().empty(), has_scale = !options.scale_factor().empty();
  KILN_CHECK(has_size != has_scale, has_size ? "interpolate: only one of size or scale_factor should be given"
                                             : "interpolate: either size or scale_factor should be given");
  auto per_dim = [&](const auto& v, const char* what) {
    using V = std::decay_t<decltype(v)>;
    KILN_CHECK(v.size() == 1 || static_cast<int64_t>(v.size()) == spatial, "interpolate: ", what, " must have 1 or ",
               spatial, " values for an input of sizes ", x.sizes(), ", got ", v.size());
    return v.size() == 1 ? V(static_cast<size_t>(spatial), v[0]) : v;
  };
  IntList out_size(static_cast<size_t>(spatial));
  std::vector<double> scales(static_cast<size_t>(spatial), 0.0);
  if (has_size) {
    out_size = per_dim(options.size(), "size");
  } else {
    scales = per_dim(options.scale_factor(), "scale_factor");
    for (size_t i = 0; i < scales.size(); ++i) {
      KILN_CHECK(scales[i] > 0 && std::isfinite(scales[i]), "interpolate: scale_factor must be positive, got ",
                 scales[i]);
      out_size[i] =
          static_cast<int64_t>(std::floor(static_cast<double>(x.size(static_cast<int64_t>(i) + 2)) * scales[i]));
    }
  }
  for (size_t i = 0; i < out_size.size(); ++i) {
    const int64_t in = x.size(static_cast<int64_t>(i) + 2);
    KILN_CHECK(in > 0 && out_size[i] > 0,
               "interpolate: input and output sizes should be greater than 0, got input sizes ", x.sizes(),
               " and output size ", out_size);
  }
  if (mode == "area") {  // adaptive average pooling, as PyTorch
    if (spatial == 2) return adaptive_avg_pool2d(x, out_size);
    return adaptive_avg_pool2d(x.unsqueeze(2), {1, out_size[0]}).squeeze(2);
  }
  Tensor out = x;
  for (int64_t i = 0; i < spatial; ++i) {
    const int64_t d = i + 2, in = x.size(d), n = out_size[static_cast<size_t>(i)];
    const double s = scales[static_cast<size_t>(i)];
    const bool ac = options.align_corners();
    AxisPlan p = !weighted                 ? nearest_plan(in, n, s, mode == "nearest-exact")
                 : x.dtype() == DType::F64 ? weighted_plan<double>(mode, in, n, s, ac)
                                           : weighted_plan<float>(mode, in, n, s, ac);
    out = apply_plan(out, d, p);
  }
  return out;
}

}  // namespace kiln::nn::functional
