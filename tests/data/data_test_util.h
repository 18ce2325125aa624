#pragma once
// Helpers shared by the data tests: a temporary folder and small synthetic datasets.
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <kiln/data/data.h>
#include <kiln/kiln.h>

namespace kiln_test {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/kiln-data-XXXXXX";
    char* p = mkdtemp(tmpl);
    if (!p) throw std::runtime_error("mkdtemp failed");
    path = p;
  }
  ~TempDir() { std::system(("rm -rf '" + path + "'").c_str()); }
  std::string file(const std::string& name) const { return path + "/" + name; }
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw std::runtime_error("cannot write " + path);
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

inline std::string read_bytes(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) throw std::runtime_error("cannot read " + path);
  std::string s;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
  std::fclose(f);
  return s;
}

// Sample i: input [3] f32 = {i, 2i, 3i}, target int64 i. Optionally throws at one index or
// sleeps in get().
class IndexDataset : public kiln::data::Dataset {
 public:
  explicit IndexDataset(int64_t n, int64_t throw_at = -1, int sleep_ms = 0)
      : n_(n), throw_at_(throw_at), sleep_ms_(sleep_ms) {}
  int64_t size() const override { return n_; }
  kiln::data::Example get(int64_t i) const override {
    if (i == throw_at_) throw std::runtime_error("synthetic failure");
    if (sleep_ms_) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms_));
    gets.fetch_add(1);
    float v[3] = {float(i), float(2 * i), float(3 * i)};
    return {kiln::tensor(std::vector<float>(v, v + 3)), kiln::scalar_tensor(double(i), kiln::DType::I64)};
  }
  mutable std::atomic<int64_t> gets{0};

 private:
  int64_t n_, throw_at_;
  int sleep_ms_;
};

// Sample i: a deterministic uint8 image [c, h, w] and label i % 10.
class ImageDataset : public kiln::data::Dataset {
 public:
  ImageDataset(int64_t n, int64_t c, int64_t h, int64_t w) : n_(n), c_(c), h_(h), w_(w) {
    images_ = kiln::empty({n, c, h, w}, kiln::DType::U8);
    auto* p = images_.data_ptr<uint8_t>();
    for (int64_t k = 0; k < images_.numel(); ++k) p[k] = static_cast<uint8_t>((k * 2654435761u) >> 13);
  }
  int64_t size() const override { return n_; }
  kiln::data::Example get(int64_t i) const override {
    return {images_.select(0, i), kiln::scalar_tensor(double(i % 10), kiln::DType::I64)};
  }

 private:
  int64_t n_, c_, h_, w_;
  kiln::Tensor images_;
};

// Sample i: a sequence of length 1 + (i * 7) % max_len, values i*1000 + t (int64), target
// the same values.
class SeqDataset : public kiln::data::Dataset {
 public:
  SeqDataset(int64_t n, int64_t max_len) : n_(n), max_(max_len) {}
  int64_t size() const override { return n_; }
  int64_t length(int64_t i) const override { return 1 + (i * 7) % max_; }
  kiln::data::Example get(int64_t i) const override {
    std::vector<int64_t> v;
    for (int64_t t = 0; t < length(i); ++t) v.push_back(i * 1000 + t);
    auto x = kiln::tensor(v);
    return {x, x.clone()};
  }

 private:
  int64_t n_, max_;
};

}  // namespace kiln_test
