#pragma once
// CIFAR-10 and CIFAR-100 in their binary formats (the "-binary" archives, extracted).
//
// CIFAR-10: data_batch_{1..5}.bin (train) and test_batch.bin, each 10000 records of
// <1 label byte><3072 pixel bytes> (3x32x32, channel-major). CIFAR-100: train.bin and test.bin,
// records of <coarse label><fine label><3072 pixel bytes>. `root` may be the folder holding the
// files or its parent (cifar-10-batches-bin / cifar-100-binary are looked for). The readers check
// that each file is a whole number of records and that labels are in range; errors name the path.
#include <string>
#include <vector>

#include "kiln/data/dataset.h"

namespace kiln::data {

class CIFAR : public Dataset {
 public:
  int64_t size() const override { return images_.size(0); }
  Example get(int64_t index) const override;
  int64_t length(int64_t) const override { return 1; }
  const Tensor& images() const { return images_; }   // [N, 3, 32, 32] uint8
  const Tensor& targets() const { return labels_; }  // [N] int64
  int64_t num_classes() const { return num_classes_; }

  // Reads records from explicit files (what the constructors call). label_bytes: 1 (CIFAR-10)
  // or 2 (CIFAR-100); label_byte picks which of them is the target.
  static void read_records(const std::vector<std::string>& files, int label_bytes, int label_byte, int64_t num_classes,
                           Tensor* images, Tensor* labels);

 protected:
  CIFAR() = default;
  Tensor images_, labels_;
  int64_t num_classes_ = 10;
};

class CIFAR10 : public CIFAR {
 public:
  explicit CIFAR10(const std::string& root, Split split = Split::Train);
};

class CIFAR100 : public CIFAR {
 public:
  // fine = true: the 100 fine labels; false: the 20 coarse superclasses.
  explicit CIFAR100(const std::string& root, Split split = Split::Train, bool fine = true);
};

}  // namespace kiln::data
