#include "kiln/data/cifar.h"

#include <cstring>

#include "kiln/data/file_reader.h"

namespace kiln::data {

namespace {
constexpr int64_t kPixels = 3 * 32 * 32;

std::string resolve(const std::string& root, const std::string& sub, const std::string& probe, const char* name) {
  if (file_exists(root + "/" + probe)) return root;
  if (file_exists(root + "/" + sub + "/" + probe)) return root + "/" + sub;
  KILN_FAIL(name, ": ", probe, " not found in ", root, " or ", root, "/", sub,
            ". Download the binary version of the data set and pass the folder holding its .bin "
            "files as root");
}
}  // namespace

void CIFAR::read_records(const std::vector<std::string>& files, int label_bytes, int label_byte, int64_t num_classes,
                         Tensor* images, Tensor* labels) {
  const int64_t rec = label_bytes + kPixels;
  std::vector<std::string> blobs;
  int64_t total = 0;
  for (const auto& f : files) {
    std::string bytes = read_whole_file(f);
    KILN_CHECK(!bytes.empty(), "CIFAR: ", f, " is empty");
    KILN_CHECK(static_cast<int64_t>(bytes.size()) % rec == 0, "CIFAR: ", f, " has ", bytes.size(),
               " bytes, not a whole number of ", rec, "-byte records: truncated or corrupt");
    total += static_cast<int64_t>(bytes.size()) / rec;
    blobs.push_back(std::move(bytes));
  }
  *images = empty({total, 3, 32, 32}, DType::U8);
  *labels = empty({total}, DType::I64);
  auto* ip = images->data_ptr<uint8_t>();
  auto* lp = labels->data_ptr<int64_t>();
  int64_t k = 0;
  for (size_t fi = 0; fi < blobs.size(); ++fi) {
    const auto* p = reinterpret_cast<const unsigned char*>(blobs[fi].data());
    int64_t n = static_cast<int64_t>(blobs[fi].size()) / rec;
    for (int64_t i = 0; i < n; ++i, ++k) {
      const unsigned char* r = p + i * rec;
      int label = r[label_byte];
      KILN_CHECK(label < num_classes, "CIFAR: ", files[fi], " record ", i, " has label ", label, " (expected 0..",
                 num_classes - 1, "): corrupt file");
      lp[k] = label;
      std::memcpy(ip + k * kPixels, r + label_bytes, kPixels);
    }
  }
}

Example CIFAR::get(int64_t index) const {
  KILN_CHECK(index >= 0 && index < size(), "CIFAR: index ", index, " out of range [0, ", size(), ")");
  return Example{images_.select(0, index), labels_.select(0, index)};
}

CIFAR10::CIFAR10(const std::string& root, Split split) {
  std::string dir =
      resolve(root, "cifar-10-batches-bin", split == Split::Train ? "data_batch_1.bin" : "test_batch.bin", "CIFAR10");
  std::vector<std::string> files;
  if (split == Split::Train) {
    for (int i = 1; i <= 5; ++i) files.push_back(dir + "/data_batch_" + std::to_string(i) + ".bin");
  } else {
    files.push_back(dir + "/test_batch.bin");
  }
  num_classes_ = 10;
  read_records(files, 1, 0, 10, &images_, &labels_);
}

CIFAR100::CIFAR100(const std::string& root, Split split, bool fine) {
  std::string file = split == Split::Train ? "train.bin" : "test.bin";
  std::string dir = resolve(root, "cifar-100-binary", file, "CIFAR100");
  num_classes_ = fine ? 100 : 20;
  read_records({dir + "/" + file}, 2, fine ? 1 : 0, num_classes_, &images_, &labels_);
}

}  // namespace kiln::data
