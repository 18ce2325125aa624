#include "kiln/data/collate.h"

#include <algorithm>
#include <cstring>

#include "kiln/data/staging.h"

namespace kiln::data {

namespace {

Tensor alloc(StagingPool* pool, const IntList& sizes, const IntList& strides, DType dtype) {
  if (pool) return pool->acquire(sizes, strides, dtype);
  int64_t n = 1;
  for (int64_t v : sizes) n *= v;
  auto st = std::make_shared<Storage>(std::max<size_t>(1, static_cast<size_t>(n) * element_size(dtype)), Device::cpu(),
                                      cpu_allocator());
  return make_tensor(st, sizes, strides, dtype);
}

bool is_channels_last_sample(const Tensor& t) {
  if (t.dim() != 3 || t.size(0) <= 1) return false;
  int64_t c = t.size(0), w = t.size(2);
  return t.stride(0) == 1 && t.stride(2) == c && t.stride(1) == w * c;
}

// Copies sample `src` into `slot` (same sizes). memcpy when both have the same dense layout.
void copy_into(const Tensor& slot, const Tensor& src) {
  if (slot.dtype() == src.dtype() && slot.strides() == src.strides() &&
      (src.is_contiguous() || is_channels_last_sample(src))) {
    std::memcpy(slot.data_ptr(), src.data_ptr(), src.nbytes());
    return;
  }
  Tensor dst = slot;
  dst.copy_(src);
}

template <class In, class Out>
void convert_image(const In* in, Out* out, int64_t c, int64_t hw, bool channels_last, const float* a, const float* b) {
  if (!channels_last) {
    for (int64_t k = 0; k < c; ++k) {
      const In* src = in + k * hw;
      Out* dst = out + k * hw;
      float ak = a[k], bk = b[k];
      for (int64_t i = 0; i < hw; ++i) dst[i] = static_cast<Out>(static_cast<float>(src[i]) * ak + bk);
    }
  } else {
    for (int64_t k = 0; k < c; ++k) {
      const In* src = in + k * hw;
      float ak = a[k], bk = b[k];
      for (int64_t i = 0; i < hw; ++i) out[i * c + k] = static_cast<Out>(static_cast<float>(src[i]) * ak + bk);
    }
  }
}

template <class Out>
void convert_dispatch_in(const Tensor& src, Out* out, int64_t c, int64_t hw, bool cl, const float* a, const float* b) {
  if (src.dtype() == DType::U8) {
    convert_image(src.data_ptr<uint8_t>(), out, c, hw, cl, a, b);
  } else {
    Tensor f = src.dtype() == DType::F32 ? src : src.to(DType::F32);
    convert_image(f.data_ptr<float>(), out, c, hw, cl, a, b);
  }
}

// The fused conversion of one image sample into its slot of the batch buffer.
void convert_into(const Tensor& batch, int64_t row, const Tensor& sample, const Conversion& conv,
                  const std::vector<float>& a, const std::vector<float>& b) {
  Tensor src = sample.contiguous();
  int64_t c = src.dim() == 3 ? src.size(0) : 1;
  int64_t hw = src.numel() / std::max<int64_t>(c, 1);
  size_t off = static_cast<size_t>(row * batch.stride(0));
  // Checked here so that the message stays collate's own.
  KILN_CHECK(is_floating(batch.dtype()), "collate: conversion to ", batch.dtype(), " is not supported");
  dispatch_floating(batch.dtype(), "collate", [&](auto tag) {
    using T = typename decltype(tag)::type;
    convert_dispatch_in(src, batch.data_ptr<T>() + off, c, hw, conv.channels_last, a.data(), b.data());
  });
}

// Stacks or pads one field (inputs or targets). Returns the batch tensor; fills `mask` when the
// samples had different lengths and mask is wanted.
void fill_mask(StagingPool* pool, const std::vector<Tensor>& xs, int64_t longest, Tensor* mask) {
  const int64_t B = static_cast<int64_t>(xs.size());
  *mask = alloc(pool, {B, longest}, {longest, 1}, DType::Bool);
  bool* m = mask->data_ptr<bool>();
  for (int64_t k = 0; k < B; ++k)
    for (int64_t t = 0; t < longest; ++t) m[k * longest + t] = t < xs[static_cast<size_t>(k)].size(0);
}

Tensor collate_field(const std::vector<Tensor>& xs, const char* what, double pad, StagingPool* pool, Tensor* mask,
                     bool always_mask, const Conversion* conv) {
  const Tensor& first = xs[0];
  const int64_t B = static_cast<int64_t>(xs.size());
  bool same = true;
  for (const auto& x : xs) {
    KILN_CHECK(x.defined(), "collate: a sample has no ", what, " while others do");
    KILN_CHECK(x.dim() == first.dim() && x.dtype() == first.dtype(), "collate: ", what,
               " of different ranks or dtypes in one batch: ", first.sizes(), " ", first.dtype(), " vs ", x.sizes(),
               " ", x.dtype());
    if (x.sizes() != first.sizes()) same = false;
  }
  IntList sample_sizes = first.sizes();
  if (conv && conv->active) {
    KILN_CHECK(same, "collate: the fused ToFloat/Normalize tail needs images of one shape, got ", first.sizes(),
               " and others");
    KILN_CHECK(first.dim() == 2 || first.dim() == 3,
               "collate: ToFloat/Normalize/ChannelsLast "
               "expect images [C, H, W] or [H, W], got ",
               first.sizes());
    IntList sizes{B};
    sizes.insert(sizes.end(), sample_sizes.begin(), sample_sizes.end());
    bool cl = conv->channels_last && sizes.size() == 4;
    KILN_CHECK(!conv->channels_last || cl, "collate: ChannelsLast needs [C, H, W] images, got ", first.sizes());
    IntList strides = cl ? channels_last_strides(sizes) : contiguous_strides(sizes);
    Tensor out = alloc(pool, sizes, strides, conv->dtype);
    std::vector<float> a, b;
    conv->coefficients(first.dtype(), first.dim() == 3 ? first.size(0) : 1, &a, &b);
    for (int64_t k = 0; k < B; ++k) convert_into(out, k, xs[static_cast<size_t>(k)], *conv, a, b);
    return out;
  }
  if (same) {
    IntList sizes{B};
    sizes.insert(sizes.end(), sample_sizes.begin(), sample_sizes.end());
    bool cl = is_channels_last_sample(first);
    for (const auto& x : xs) cl = cl && is_channels_last_sample(x);
    IntList strides = cl ? channels_last_strides(sizes) : contiguous_strides(sizes);
    Tensor out = alloc(pool, sizes, strides, first.dtype());
    for (int64_t k = 0; k < B; ++k) copy_into(out.select(0, k), xs[static_cast<size_t>(k)]);
    if (mask && always_mask) {
      KILN_CHECK(first.dim() >= 1, "collate: a padding mask needs sequences, got ", what, " ", first.sizes());
      fill_mask(pool, xs, first.size(0), mask);
    }
    return out;
  }
  // Variable length along dim 0: pad to the longest.
  KILN_CHECK(first.dim() >= 1, "collate: ", what, " of different shapes in one batch");
  int64_t longest = 0;
  for (const auto& x : xs) {
    for (int64_t d = 1; d < x.dim(); ++d)
      KILN_CHECK(x.size(d) == first.size(d), "collate: ", what, " ", first.sizes(), " and ", x.sizes(),
                 " differ beyond dim 0; only the length (dim 0) may vary");
    longest = std::max(longest, x.size(0));
  }
  IntList sizes{B, longest};
  sizes.insert(sizes.end(), sample_sizes.begin() + 1, sample_sizes.end());
  Tensor out = alloc(pool, sizes, contiguous_strides(sizes), first.dtype());
  out.fill_(pad);
  for (int64_t k = 0; k < B; ++k) {
    const Tensor& x = xs[static_cast<size_t>(k)];
    if (x.size(0) > 0) copy_into(out.select(0, k).narrow(0, 0, x.size(0)), x);
  }
  if (mask) fill_mask(pool, xs, longest, mask);
  return out;
}

}  // namespace

Batch collate(const std::vector<Example>& samples, const CollateOptions& options, StagingPool* pool) {
  KILN_CHECK(!samples.empty(), "collate: empty batch");
  Batch batch;
  std::vector<Tensor> xs, ys;
  xs.reserve(samples.size());
  for (const auto& s : samples) xs.push_back(s.input);
  batch.input =
      collate_field(xs, "inputs", options.pad_value(), pool, &batch.mask, options.always_mask(), &options.conversion());
  bool has_target = samples[0].target.defined();
  if (has_target) {
    ys.reserve(samples.size());
    for (const auto& s : samples) ys.push_back(s.target);
    double pad = is_floating(ys[0].dtype()) ? options.pad_value() : options.target_pad_value();
    batch.target = collate_field(ys, "targets", pad, pool, nullptr, false, nullptr);
  } else {
    for (const auto& s : samples)
      KILN_CHECK(!s.target.defined(), "collate: some samples have a target and some do not");
  }
  return batch;
}

}  // namespace kiln::data
