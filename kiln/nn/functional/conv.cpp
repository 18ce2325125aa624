// Differentiable convolutions: conv2d, conv1d (conv2d on [N, C, 1, L]) and conv_transpose2d.
// Argument checks and shape inference live here; the math is three raw kernels
// (kiln/kernels/conv.h): forward, backward-to-input and backward-to-weight. A transposed
// convolution is the backward-to-input kernel run forward, so its backward reuses the other two:
//   conv2d:            y  = fwd(x, w) + b    dx = bwd_input(dy, w)   dw = bwd_weight(dy, x)
//   conv_transpose2d:  y  = bwd_input(x, w)  dx = fwd(dy, w)         dw = bwd_weight(x, dy)
// Memory format: an input with channels-last strides runs the NHWC kernels and gives a
// channels-last output (the same [N, C, H, W] sizes); any other non-contiguous input is made
// NCHW-contiguous first. f16/bf16 compute in f32 on the CPU (through differentiable casts) and
// natively on CUDA (cuDNN, f32 accumulation).
// Double backward (create_graph through a convolution) is not implemented and says so.
#include <string>

#include "kiln/core/autocast.h"
#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/kernels/conv.h"
#include "kiln/kernels/memory_format.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/functional/detail.h"
#include "kiln/nn/functional/pair_arg.h"

namespace kiln::nn::functional {

using autograd::SavedTensor;
using autograd::TensorList;
using kernels::ConvGeometry;

namespace {

using detail::pair_arg;

// A 2-D convolution's input: [N, C, H, W] or an unbatched [C, H, W].
void check_image_input(const char* op, const Tensor& x) {
  KILN_CHECK(x.dim() == 4 || x.dim() == 3, op, ": expected a 4-D input [N, C, H, W] (or 3-D [C, H, W]), got sizes ",
             x.sizes());
}

// What a convolution's backward keeps: which gradients it computes, x (needed for dw only) and
// the weight (for dx only) saved, the operands' sizes and options. A private copy x of the
// input x_in (x != x_in) cannot be modified, so it is saved instead of x_in.
struct ConvSaved {
  bool gx, gw, gb;
  SavedTensor sx, sw;
  IntList xsizes, wsizes;
  TensorOptions opts;
  ConvSaved(const char* node, const Tensor& x_in, const Tensor& x, const Tensor& weight, const Tensor& bias)
      : gx(x_in.requires_grad()),
        gw(weight.requires_grad()),
        gb(bias.defined() && bias.requires_grad()),
        sx(gw ? SavedTensor(x.data_ptr() == x_in.data_ptr() ? x_in : x, node) : SavedTensor()),
        sw(gx ? SavedTensor(weight, node) : SavedTensor()),
        xsizes(x_in.sizes()),
        wsizes(weight.sizes()),
        opts(x.options()) {}
};

void check_common(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias) {
  KILN_CHECK(x.defined(), op, ": input is undefined");
  KILN_CHECK(weight.defined(), op, ": weight is undefined");
  KILN_CHECK(x.device() == weight.device(), op, ": input and weight on different devices: ", x.device(), " (sizes ",
             x.sizes(), ") and ", weight.device(), " (sizes ", weight.sizes(), ")");
  KILN_CHECK(x.dtype() == weight.dtype(), op, ": input and weight have different dtypes: ", x.dtype(), " (sizes ",
             x.sizes(), ") and ", weight.dtype(), " (sizes ", weight.sizes(), ")");
  KILN_CHECK(x.is_floating_point(), op, ": expected a floating-point input, got ", x.dtype());
  if (bias.defined()) {
    KILN_CHECK(bias.device() == x.device() && bias.dtype() == x.dtype(), op, ": bias (", bias.dtype(), " on ",
               bias.device(), ") must match the input (", x.dtype(), " on ", x.device(), ")");
  }
}

bool is_half(DType d) { return d == DType::F16 || d == DType::BF16; }

// The front shared by conv2d and conv_transpose2d: checks the operands and reruns the op,
// again(x, w, b), on the autocast dtype (autocast off), on an unbatched [C, H, W] input made a
// batch of one (squeezed back), and on the CPU for f16/bf16 in f32 (cast back). An undefined
// result: the op goes on itself. weight_layout names the expected 4-D weight in the error.
template <class Again>
Tensor conv_front(const char* op, const char* weight_layout, const Tensor& x, const Tensor& weight, const Tensor& bias,
                  Again&& again) {
  if (auto out = amp::autocast_rerun(amp::Policy::LowPrecision, {x, weight, bias},
                                     [&](const auto& a) { return again(a[0], a[1], a[2]); }))
    return *out;
  check_common(op, x, weight, bias);
  check_image_input(op, x);
  if (x.dim() == 3) return again(x.unsqueeze(0), weight, bias).squeeze(0);
  KILN_CHECK(weight.dim() == 4, op, ": expected a 4-D weight ", weight_layout, ", got sizes ", weight.sizes(),
             " (input sizes ", x.sizes(), ")");
  if (is_half(x.dtype()) && x.device().is_cpu()) {  // CUDA: cuDNN takes f16/bf16 natively
    Tensor b = bias.defined() ? bias.to(DType::F32) : Tensor();
    return again(x.to(DType::F32), weight.to(DType::F32), b).to(x.dtype());
  }
  return Tensor();
}

MemoryFormat kernel_format(const Tensor& x) {
  return kernels::memory_format(x) == MemoryFormat::ChannelsLast ? MemoryFormat::ChannelsLast
                                                                 : MemoryFormat::Contiguous;
}

// t (no autograd) laid out as `fmt`, copying only when needed.
// The kernels' geometry: an [N, C, H, W] input of `x`'s memory format, K output channels, a
// kh x kw kernel, an OH x OW output, and the op's stride, padding, dilation and groups.
struct ConvShape {
  int64_t N, C, H, W, K, kh, kw, OH, OW;
};
ConvGeometry geometry(const ConvShape& s, const IntList& stride, const IntList& padding, const IntList& dilation,
                      int64_t groups, const Tensor& x) {
  ConvGeometry g;
  g.N = s.N, g.C = s.C, g.H = s.H, g.W = s.W, g.K = s.K, g.kh = s.kh, g.kw = s.kw, g.OH = s.OH, g.OW = s.OW;
  g.sh = stride[0], g.sw = stride[1], g.ph = padding[0], g.pw = padding[1], g.dh = dilation[0], g.dw = dilation[1];
  g.groups = groups;
  g.channels_last = kernel_format(x) == MemoryFormat::ChannelsLast;
  return g;
}

Tensor as_format(const Tensor& t, MemoryFormat fmt) {
  if (kernels::has_layout(t, fmt)) return t;
  if (fmt == MemoryFormat::Contiguous) return t.contiguous();
  Tensor r = kernels::empty_4d(t.sizes(), t.options(), fmt);
  r.copy_(t);
  return r;
}

[[noreturn]] void no_double_backward(const char* op) {
  KILN_FAIL(op,
            ": double backward (create_graph=true through a convolution) is not implemented "
            "yet");
}

// Records a convolution's backward node `node`: dx is allocated like the input (in fmt) when
// wanted, and backward(c, grad_out, gy, dx) (gy: grad_out in fmt) returns {dx, dw, db}.
template <class Backward>
void record_conv_backward(const char* node, const char* op, const Tensor& x_in, const Tensor& x, const Tensor& weight,
                          const Tensor& bias, Tensor& out, MemoryFormat fmt, Backward backward) {
  if (!autograd::any_requires_grad({&x_in, &weight, &bias})) return;
  const ConvSaved c(node, x_in, x, weight, bias);
  autograd::record_function(node, {&x_in, &weight, &bias}, {&out}, [=](const TensorList& grads) {
    if (GradMode::is_enabled()) no_double_backward(op);
    const Tensor dx = c.gx ? kernels::empty_4d(c.xsizes, c.opts, fmt) : Tensor();
    return backward(c, grads[0], as_format(grads[0], fmt), dx);
  });
}

}  // namespace

namespace {

// conv2d; `forward`, when given, is tried in place of the forward kernel (detail::ConvForward).
Tensor conv2d_impl(const Tensor& x_in, const Tensor& weight, const Tensor& bias, const Conv2dParams& params,
                   const detail::ConvForward* forward = nullptr) {
  const char* op = "conv2d";
  Tensor rerun = conv_front(op, "[C_out, C_in / groups, kH, kW]", x_in, weight, bias,
                            [&](const Tensor& x, const Tensor& w, const Tensor& b) { return conv2d(x, w, b, params); });
  if (rerun.defined()) return rerun;
  const IntList stride = pair_arg(op, "stride", params.stride);
  const IntList padding = pair_arg(op, "padding", params.padding);
  const IntList dilation = pair_arg(op, "dilation", params.dilation);
  const int64_t groups = params.groups;
  const int64_t N = x_in.size(0), C = x_in.size(1), H = x_in.size(2), W = x_in.size(3);
  const int64_t K = weight.size(0), kh = weight.size(2), kw = weight.size(3);
  KILN_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive, got ", stride, " (input sizes ",
             x_in.sizes(), ", weight sizes ", weight.sizes(), ")");
  KILN_CHECK(dilation[0] > 0 && dilation[1] > 0, op, ": dilation must be positive, got ", dilation);
  KILN_CHECK(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be non-negative, got ", padding);
  KILN_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  KILN_CHECK(C % groups == 0 && K % groups == 0, op, ": groups=", groups, " must divide both the input channels ", C,
             " and the output channels ", K, " (input sizes ", x_in.sizes(), ", weight sizes ", weight.sizes(), ")");
  KILN_CHECK(weight.size(1) * groups == C, op, ": input sizes ", x_in.sizes(), " have ", C,
             " channels but weight sizes ", weight.sizes(), " with groups=", groups, " expect ",
             weight.size(1) * groups);
  KILN_CHECK(kh > 0 && kw > 0, op, ": empty kernel in weight sizes ", weight.sizes());
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == K, op, ": bias sizes ", bias.sizes(), " do not match the ", K,
               " output channels of weight sizes ", weight.sizes());
  const int64_t ekh = dilation[0] * (kh - 1) + 1, ekw = dilation[1] * (kw - 1) + 1;
  KILN_CHECK(ekh <= H + 2 * padding[0] && ekw <= W + 2 * padding[1], op, ": kernel ", kh, "x", kw, " (dilated ", ekh,
             "x", ekw, ") is larger than the padded input ", H + 2 * padding[0], "x", W + 2 * padding[1],
             " (input sizes ", x_in.sizes(), ", weight sizes ", weight.sizes(), ", padding ", padding, ")");

  const int64_t OH = kernels::window_out_size(H, kh, stride[0], padding[0], dilation[0]),
                OW = kernels::window_out_size(W, kw, stride[1], padding[1], dilation[1]);
  const ConvGeometry g = geometry({N, C, H, W, K, kh, kw, OH, OW}, stride, padding, dilation, groups, x_in);
  const MemoryFormat fmt = kernel_format(x_in);

  Tensor x, w, b;
  {
    NoGradGuard ng;
    x = as_format(x_in.detach(), fmt);
    w = weight.detach().contiguous();
    b = bias.defined() ? bias.detach().contiguous() : Tensor();
  }
  Tensor out = kernels::empty_4d({N, K, g.OH, g.OW}, x.options(), fmt);
  if (!forward || !(*forward)(out, x, w, b, g)) kernels::conv2d_forward(out, x, w, b, g);

  record_conv_backward("Conv2dBackward", op, x_in, x, weight, bias, out, fmt,
                       [g, fmt](const ConvSaved& c, const Tensor& grad_out, const Tensor& gy, const Tensor& dx) {
                         Tensor dw, db;
                         if (c.gx && c.gw && kernels::conv2d_backward.has(kernels::backend_of(gy.device()))) {
                           dw = empty(c.wsizes, c.opts);
                           if (c.gb) db = empty({g.K}, c.opts);
                           kernels::conv2d_backward(dx, dw, db, gy, as_format(c.sx.get().detach(), fmt),
                                                    c.sw.get().detach(), g);
                           return TensorList{dx, dw, db};
                         }
                         if (c.gx) kernels::conv2d_backward_input(dx, gy, c.sw.get().detach().contiguous(), g);
                         if (c.gw || c.gb) {
                           if (c.gw) dw = empty(c.wsizes, c.opts);
                           if (c.gb) db = empty({g.K}, c.opts);
                           Tensor xs = c.gw ? as_format(c.sx.get().detach(), fmt) : Tensor();
                           if (c.gw) kernels::conv2d_backward_weight(dw, db, gy, xs, g);
                           else db = grad_out.sum({0, 2, 3});
                         }
                         return TensorList{dx, dw, db};
                       });
  return out;
}

}  // namespace

Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dParams& params) {
  return conv2d_impl(x, weight, bias, params);
}

Tensor detail::conv2d_with_forward(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   const Conv2dParams& params, const ConvForward& forward) {
  return conv2d_impl(x, weight, bias, params, &forward);
}

Tensor conv1d(const Tensor& x, const Tensor& weight, const Tensor& bias, int64_t stride, int64_t padding,
              int64_t dilation, int64_t groups) {
  const char* op = "conv1d";
  check_common(op, x, weight, bias);
  KILN_CHECK(x.dim() == 3 || x.dim() == 2, op, ": expected a 3-D input [N, C, L] (or 2-D [C, L]), got sizes ",
             x.sizes());
  if (x.dim() == 2) return conv1d(x.unsqueeze(0), weight, bias, stride, padding, dilation, groups).squeeze(0);
  KILN_CHECK(weight.dim() == 3, op, ": expected a 3-D weight [C_out, C_in / groups, K], got sizes ", weight.sizes(),
             " (input sizes ", x.sizes(), ")");
  KILN_CHECK(stride > 0, op, ": stride must be positive, got ", stride);
  KILN_CHECK(groups > 0 && x.size(1) % groups == 0 && weight.size(0) % groups == 0, op, ": groups=", groups,
             " must divide the input channels ", x.size(1), " and the output channels ", weight.size(0));
  KILN_CHECK(weight.size(1) * groups == x.size(1), op, ": input sizes ", x.sizes(), " have ", x.size(1),
             " channels but weight sizes ", weight.sizes(), " with groups=", groups, " expect ",
             weight.size(1) * groups);
  KILN_CHECK(dilation > 0 && padding >= 0, op, ": bad dilation ", dilation, " or padding ", padding);
  KILN_CHECK(dilation * (weight.size(2) - 1) + 1 <= x.size(2) + 2 * padding, op, ": kernel ", weight.size(2),
             " (dilation ", dilation, ") is larger than the padded input ", x.size(2) + 2 * padding, " (input sizes ",
             x.sizes(), ", weight sizes ", weight.sizes(), ")");
  Conv2dParams p;
  p.stride = {1, stride};
  p.padding = {0, padding};
  p.dilation = {1, dilation};
  p.groups = groups;
  return conv2d(x.unsqueeze(2), weight.unsqueeze(2), bias, p).squeeze(2);
}

Tensor conv_transpose2d(const Tensor& x_in, const Tensor& weight, const Tensor& bias,
                        const ConvTranspose2dParams& params) {
  const char* op = "conv_transpose2d";
  Tensor rerun =
      conv_front(op, "[C_in, C_out / groups, kH, kW]", x_in, weight, bias,
                 [&](const Tensor& x, const Tensor& w, const Tensor& b) { return conv_transpose2d(x, w, b, params); });
  if (rerun.defined()) return rerun;
  const IntList stride = pair_arg(op, "stride", params.stride);
  const IntList padding = pair_arg(op, "padding", params.padding);
  const IntList opad = pair_arg(op, "output_padding", params.output_padding);
  const IntList dilation = pair_arg(op, "dilation", params.dilation);
  const int64_t groups = params.groups;
  const int64_t N = x_in.size(0), Cin = x_in.size(1), H = x_in.size(2), W = x_in.size(3);
  const int64_t kh = weight.size(2), kw = weight.size(3);
  KILN_CHECK(stride[0] > 0 && stride[1] > 0, op, ": stride must be positive, got ", stride, " (input sizes ",
             x_in.sizes(), ", weight sizes ", weight.sizes(), ")");
  KILN_CHECK(dilation[0] > 0 && dilation[1] > 0, op, ": dilation must be positive, got ", dilation);
  KILN_CHECK(padding[0] >= 0 && padding[1] >= 0, op, ": padding must be non-negative, got ", padding);
  KILN_CHECK(groups > 0, op, ": groups must be positive, got ", groups);
  KILN_CHECK(Cin % groups == 0, op, ": groups=", groups, " must divide the input channels ", Cin, " (input sizes ",
             x_in.sizes(), ")");
  KILN_CHECK(weight.size(0) == Cin, op, ": input sizes ", x_in.sizes(), " have ", Cin, " channels but weight sizes ",
             weight.sizes(), " expect ", weight.size(0));
  KILN_CHECK(kh > 0 && kw > 0, op, ": empty kernel in weight sizes ", weight.sizes());
  for (int i = 0; i < 2; ++i)
    KILN_CHECK(opad[i] >= 0 && (opad[i] < stride[i] || opad[i] < dilation[i]), op, ": output_padding ", opad,
               " must be smaller than either stride ", stride, " or dilation ", dilation);
  const int64_t Cout = weight.size(1) * groups;
  if (bias.defined())
    KILN_CHECK(bias.dim() == 1 && bias.size(0) == Cout, op, ": bias sizes ", bias.sizes(), " do not match the ", Cout,
               " output channels (weight sizes ", weight.sizes(), ", groups=", groups, ")");
  const int64_t OH = (H - 1) * stride[0] - 2 * padding[0] + dilation[0] * (kh - 1) + opad[0] + 1;
  const int64_t OW = (W - 1) * stride[1] - 2 * padding[1] + dilation[1] * (kw - 1) + opad[1] + 1;
  KILN_CHECK(OH > 0 && OW > 0, op, ": the output would be ", OH, "x", OW, " (input sizes ", x_in.sizes(),
             ", weight sizes ", weight.sizes(), ", stride ", stride, ", padding ", padding, ")");

  // The convolution this op is the transpose of: input [N, Cout, OH, OW] -> output [N, Cin, H, W].
  const ConvGeometry g = geometry({N, Cout, OH, OW, Cin, kh, kw, H, W}, stride, padding, dilation, groups, x_in);
  const MemoryFormat fmt = kernel_format(x_in);

  Tensor x, w;
  {
    NoGradGuard ng;
    x = as_format(x_in.detach(), fmt);
    w = weight.detach().contiguous();
  }
  Tensor out = kernels::empty_4d({N, Cout, OH, OW}, x.options(), fmt);
  kernels::conv2d_backward_input(out, x, w, g);
  if (bias.defined()) {
    NoGradGuard ng;
    out.add_(bias.detach().view({1, Cout, 1, 1}));
  }

  record_conv_backward("ConvTranspose2dBackward", op, x_in, x, weight, bias, out, fmt,
                       [g, fmt](const ConvSaved& c, const Tensor&, const Tensor& gy, const Tensor& dx) {
                         if (c.gx) kernels::conv2d_forward(dx, gy, c.sw.get().detach().contiguous(), Tensor(), g);
                         Tensor dw, db;
                         if (c.gw) {
                           dw = empty(c.wsizes, c.opts);
                           kernels::conv2d_backward_weight(dw, Tensor(), as_format(c.sx.get().detach(), fmt), gy, g);
                         }
                         if (c.gb) db = gy.sum({0, 2, 3});
                         return TensorList{dx, dw, db};
                       });
  return out;
}

}  // namespace kiln::nn::functional
