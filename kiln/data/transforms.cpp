#include "kiln/data/transforms.h"

#include <algorithm>
#include <cstring>

namespace kiln::data {

namespace {

struct Chw {
  int64_t c, h, w;
  bool had_channel;
};

Chw chw_of(const Tensor& t, const char* op) {
  KILN_CHECK(t.defined() && (t.dim() == 2 || t.dim() == 3), op, ": expected an image [C, H, W] or [H, W], got ",
             t.defined() ? t.sizes() : IntList{});
  if (t.dim() == 2) return {1, t.size(0), t.size(1), false};
  return {t.size(0), t.size(1), t.size(2), true};
}

}  // namespace

void RandomCrop::apply(Example& ex, DataRng& rng) const {
  Chw s = chw_of(ex.input, "RandomCrop");
  int64_t ph = s.h + 2 * pad_, pw = s.w + 2 * pad_;
  KILN_CHECK(h_ <= ph && w_ <= pw, "RandomCrop: crop ", h_, "x", w_, " is larger than the padded image ", ph, "x", pw);
  int64_t top = rng.randint(ph - h_ + 1), left = rng.randint(pw - w_ + 1);
  Tensor in = ex.input.contiguous();
  const size_t es = in.element_size();
  Tensor out = s.had_channel ? empty({s.c, h_, w_}, in.dtype()) : empty({h_, w_}, in.dtype());
  const auto* src = static_cast<const unsigned char*>(in.data_ptr());
  auto* dst = static_cast<unsigned char*>(out.data_ptr());
  std::memset(dst, 0, out.nbytes());
  // Source columns [x0, x1) of the crop land on output columns starting at ox.
  int64_t x0 = std::max<int64_t>(0, left - pad_), x1 = std::min<int64_t>(s.w, left - pad_ + w_);
  int64_t ox = x0 - (left - pad_);
  for (int64_t c = 0; c < s.c; ++c)
    for (int64_t y = 0; y < h_; ++y) {
      int64_t sy = top + y - pad_;
      if (sy < 0 || sy >= s.h || x1 <= x0) continue;
      std::memcpy(dst + ((c * h_ + y) * w_ + ox) * es, src + ((c * s.h + sy) * s.w + x0) * es,
                  static_cast<size_t>(x1 - x0) * es);
    }
  ex.input = out;
}

void RandomHorizontalFlip::apply(Example& ex, DataRng& rng) const {
  Chw s = chw_of(ex.input, "RandomHorizontalFlip");
  if (!rng.bernoulli(p_)) return;
  Tensor in = ex.input.contiguous();
  const size_t es = in.element_size();
  Tensor out = empty(in.sizes(), in.dtype());
  const auto* src = static_cast<const unsigned char*>(in.data_ptr());
  auto* dst = static_cast<unsigned char*>(out.data_ptr());
  for (int64_t r = 0; r < s.c * s.h; ++r) {
    const unsigned char* a = src + r * s.w * es;
    unsigned char* b = dst + r * s.w * es;
    if (es == 1) {
      for (int64_t x = 0; x < s.w; ++x) b[x] = a[s.w - 1 - x];
    } else {
      for (int64_t x = 0; x < s.w; ++x) std::memcpy(b + x * es, a + (s.w - 1 - x) * es, es);
    }
  }
  ex.input = out;
}

ToFloat::ToFloat(DType dtype) : dtype_(dtype) {
  KILN_CHECK(is_floating(dtype), "ToFloat: target dtype must be floating point, got ", dtype);
}

void ToFloat::apply(Example& ex, DataRng&) const {
  KILN_CHECK(ex.input.defined(), "ToFloat: undefined input");
  if (ex.input.dtype() == DType::U8) {
    ex.input = (ex.input.to(DType::F32) * (1.0 / 255.0)).to(dtype_);
  } else {
    ex.input = ex.input.to(dtype_);
  }
}

Normalize::Normalize(std::vector<double> mean, std::vector<double> std) : mean_(std::move(mean)), std_(std::move(std)) {
  KILN_CHECK(!mean_.empty() && mean_.size() == std_.size(), "Normalize: mean (", mean_.size(), " values) and std (",
             std_.size(), " values) must be non-empty and the same length");
  for (double s : std_) KILN_CHECK(s != 0.0, "Normalize: std must be non-zero");
}

void Normalize::apply(Example& ex, DataRng&) const {
  Chw s = chw_of(ex.input, "Normalize");
  KILN_CHECK(ex.input.is_floating_point(),
             "Normalize: expects a floating-point image (put ToFloat "
             "before it), got ",
             ex.input.dtype());
  KILN_CHECK(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == s.c, "Normalize: ", mean_.size(),
             " means for an image with ", s.c, " channels");
  DType dt = ex.input.dtype();
  Tensor x = ex.input.to(DType::F32).contiguous().clone();
  float* p = x.data_ptr<float>();
  int64_t hw = s.h * s.w;
  for (int64_t c = 0; c < s.c; ++c) {
    size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
    float m = static_cast<float>(mean_[k]), inv = static_cast<float>(1.0 / std_[k]);
    for (int64_t i = 0; i < hw; ++i) p[c * hw + i] = (p[c * hw + i] - m) * inv;
  }
  ex.input = x.to(dt);
}

void ChannelsLast::apply(Example& ex, DataRng&) const {
  KILN_CHECK(ex.input.defined() && ex.input.dim() == 3, "ChannelsLast: expects [C, H, W], got ",
             ex.input.defined() ? ex.input.sizes() : IntList{});
  ex.input = ex.input.permute({1, 2, 0}).contiguous().permute({2, 0, 1});
}

void Conversion::coefficients(DType in, int64_t channels, std::vector<float>* a, std::vector<float>* b) const {
  std::vector<double> da(static_cast<size_t>(channels), 1.0), db(static_cast<size_t>(channels), 0.0);
  if (to_float && in == DType::U8)
    for (auto& v : da) v = 1.0 / 255.0;
  for (const auto& [mean, std] : normalizes) {
    KILN_CHECK(mean.size() == 1 || static_cast<int64_t>(mean.size()) == channels, "Normalize: ", mean.size(),
               " means for an image with ", channels, " channels");
    for (int64_t c = 0; c < channels; ++c) {
      size_t k = mean.size() == 1 ? 0 : static_cast<size_t>(c);
      da[static_cast<size_t>(c)] /= std[k];
      db[static_cast<size_t>(c)] = (db[static_cast<size_t>(c)] - mean[k]) / std[k];
    }
  }
  a->assign(da.begin(), da.end());
  b->assign(db.begin(), db.end());
}

Compose& Compose::add(std::shared_ptr<const Transform> t) {
  KILN_CHECK(t != nullptr, "Compose::add: null transform");
  ts_.push_back(std::move(t));
  return *this;
}

void Compose::apply_range(Example& ex, DataRng& rng, size_t n) const {
  for (size_t i = 0; i < n && i < ts_.size(); ++i) ts_[i]->apply(ex, rng);
}

size_t Compose::split_fused(Conversion* tail) const {
  *tail = Conversion{};
  size_t start = ts_.size();
  while (start > 0) {
    const Transform* t = ts_[start - 1].get();
    if (dynamic_cast<const ToFloat*>(t) || dynamic_cast<const Normalize*>(t) || dynamic_cast<const ChannelsLast*>(t))
      --start;
    else break;
  }
  // The tail is fusable when a Normalize never precedes the ToFloat (it needs floats) unless the
  // input is float already — we cannot know that here, so require a ToFloat first or no ToFloat.
  bool seen_normalize = false;
  for (size_t i = start; i < ts_.size(); ++i) {
    const Transform* t = ts_[i].get();
    if (auto* f = dynamic_cast<const ToFloat*>(t)) {
      if (seen_normalize || tail->to_float) return ts_.size();  // unusual order: run unfused
      tail->to_float = true;
      tail->dtype = f->dtype();
    } else if (auto* nm = dynamic_cast<const Normalize*>(t)) {
      seen_normalize = true;
      tail->normalizes.emplace_back(nm->mean(), nm->stddev());
    } else {
      tail->channels_last = true;
    }
  }
  if (start == ts_.size()) return start;
  if (!tail->to_float) {
    // Normalize without ToFloat is only valid on float inputs (keep it unfused so its own dtype
    // check runs); a lone ChannelsLast keeps the dtype and is handled by plain collation.
    *tail = Conversion{};
    return ts_.size();
  }
  tail->active = true;
  return start;
}

std::string Compose::str() const {
  std::string s = "Compose(";
  for (size_t i = 0; i < ts_.size(); ++i) s += (i ? ", " : "") + ts_[i]->name();
  return s + ")";
}

}  // namespace kiln::data
