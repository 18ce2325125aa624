#pragma once
// The IDX format (MNIST, Fashion-MNIST, EMNIST, ...) and the MNIST-style datasets over it.
//
// An IDX file is a 4-byte magic number (0, 0, type code, number of dimensions), one big-endian
// uint32 per dimension, then the data in row-major order. Files may be gzip-compressed (zlib
// detects it). Every reader checks the magic, that the file holds exactly the bytes the header
// promises, and (for the datasets) that images and labels agree; errors name the path.
#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

// Reads a whole IDX file into a CPU tensor with the header's shape. Type codes: 0x08 u8,
// 0x09 i8 and 0x0B i16 (widened to int32), 0x0C i32, 0x0D f32, 0x0E f64.
Tensor read_idx(const std::string& path);
// Writes `t` as an IDX file (u8, i32, f32 or f64; gzip-compressed when `gzip`). For tests and for
// exporting data sets.
void write_idx(const std::string& path, const Tensor& t, bool gzip = false);

// MNIST-style image classification data from four IDX files in `root`:
// {train,t10k}-{images-idx3,labels-idx1}-ubyte, each optionally with a .gz suffix.
// Samples: input [1, 28, 28] uint8 (a view of the images), target a scalar int64 label.
class MNIST : public Dataset {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/mnist";
  explicit MNIST(const std::string& root = kDefaultRoot, Split split = Split::Train);
  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  int64_t length(int64_t) const override { return 1; }
  const Tensor& images() const { return images_; }   // [N, 1, H, W] uint8
  const Tensor& targets() const { return labels_; }  // [N] int64
  int64_t num_classes() const { return 10; }
  virtual std::vector<std::string> classes() const;

 protected:
  MNIST(const std::string& root, Split split, const char* name, const char* package);

 private:
  void load(const std::string& root, Split split, const char* name, const char* package);
  Tensor images_, labels_;
};

// Fashion-MNIST (Xiao et al. 2017): the same format, ten clothing classes. The default root is
// where Debian's dataset-fashion-mnist package installs it.
class FashionMNIST : public MNIST {
 public:
  static constexpr const char* kDefaultRoot = "/usr/share/datasets/fashion-mnist";
  explicit FashionMNIST(const std::string& root = kDefaultRoot, Split split = Split::Train);
  std::vector<std::string> classes() const override;
};

}  // namespace kiln::data
