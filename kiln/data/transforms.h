#pragma once
// Per-sample transforms, run in the DataLoader's workers.
//
// Each transform gets the sample and a DataRng seeded by (loader seed, epoch, sample index), so
// a sample's crop and flip do not depend on the worker count. Image transforms take [C, H, W] (or
// [H, W]) tensors of any dtype and never modify their input (samples are usually views of the
// dataset's memory).
//
// Fusion into collation: a Compose whose last transforms are ToFloat / Normalize / ChannelsLast
// (the "conversion tail") is not run per sample. The DataLoader writes each sample's uint8 (or
// float) pixels straight into the batch buffer as x * a[c] + b[c] in f32/f16/bf16, in NCHW or
// channels-last (NHWC strides) layout: one pass over the data instead of three, and no
// per-sample float tensors. The result equals running the transforms one by one.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/data/dataset.h"
#include "kiln/data/rng.h"

namespace kiln::data {

class Transform {
 public:
  virtual ~Transform() = default;
  // Replaces ex (typically ex.input) with the transformed sample.
  virtual void apply(Example& ex, DataRng& rng) const = 0;
  virtual std::string name() const = 0;
};

// Crops a random size x size window (h x w) after zero-padding each border by `padding`.
class RandomCrop : public Transform {
 public:
  RandomCrop(int64_t size, int64_t padding = 0) : h_(size), w_(size), pad_(padding) {}
  RandomCrop(int64_t height, int64_t width, int64_t padding) : h_(height), w_(width), pad_(padding) {}
  void apply(Example& ex, DataRng& rng) const override;
  std::string name() const override { return "RandomCrop"; }

 private:
  int64_t h_, w_, pad_;
};

// Mirrors the image left-right with probability p.
class RandomHorizontalFlip : public Transform {
 public:
  explicit RandomHorizontalFlip(double p = 0.5) : p_(p) {}
  void apply(Example& ex, DataRng& rng) const override;
  std::string name() const override { return "RandomHorizontalFlip"; }

 private:
  double p_;
};

// uint8 [0, 255] -> floating point [0, 1] (PyTorch's ToTensor scaling); floating inputs are cast.
class ToFloat : public Transform {
 public:
  explicit ToFloat(DType dtype = DType::F32);
  void apply(Example& ex, DataRng& rng) const override;
  std::string name() const override { return "ToFloat"; }
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
};

// (x - mean[c]) / std[c] per channel (dim 0 of a [C, H, W] sample). One value broadcasts.
class Normalize : public Transform {
 public:
  Normalize(std::vector<double> mean, std::vector<double> std);
  void apply(Example& ex, DataRng& rng) const override;
  std::string name() const override { return "Normalize"; }
  const std::vector<double>& mean() const { return mean_; }
  const std::vector<double>& stddev() const { return std_; }

 private:
  std::vector<double> mean_, std_;
};

// Channels-last memory format: a [C, H, W] sample keeps its logical shape with HWC strides, and
// collation produces [N, C, H, W] batches with NHWC strides (what tensor-core convolutions want).
class ChannelsLast : public Transform {
 public:
  void apply(Example& ex, DataRng& rng) const override;
  std::string name() const override { return "ChannelsLast"; }
};

// The fused conversion: out = x * scale[c] + shift[c] in `dtype`, optionally channels-last.
struct Conversion {
  bool active = false;
  DType dtype = DType::F32;
  bool to_float = false;  // a ToFloat was seen: uint8 inputs are scaled by 1/255
  std::vector<std::pair<std::vector<double>, std::vector<double>>> normalizes;  // (mean, std)
  bool channels_last = false;
  // Per-channel affine (a, b) for input dtype `in` and `channels` channels.
  void coefficients(DType in, int64_t channels, std::vector<float>* a, std::vector<float>* b) const;
};

class Compose {
 public:
  Compose() = default;
  template <class... T> explicit Compose(T... transforms) { (add(std::make_shared<T>(std::move(transforms))), ...); }
  Compose& add(std::shared_ptr<const Transform> t);
  bool empty() const { return ts_.empty(); }
  size_t size() const { return ts_.size(); }
  // Runs every transform (none fused).
  void apply(Example& ex, DataRng& rng) const { apply_range(ex, rng, ts_.size()); }
  // Runs the first n transforms.
  void apply_range(Example& ex, DataRng& rng, size_t n) const;
  // Splits off the conversion tail: returns how many leading transforms must run per sample and
  // fills `tail` with the fused conversion of the rest.
  size_t split_fused(Conversion* tail) const;
  std::string str() const;

 private:
  std::vector<std::shared_ptr<const Transform>> ts_;
};

}  // namespace kiln::data
