#pragma once
// Default random generators: one per device, each a (seed, offset) pair over the Philox stream.
// A draw of n numbers reserves offsets [offset, offset + n); kernels compute element i from
// (seed, offset + i), so results do not depend on the backend or the thread count.
#include <cstdint>
#include <mutex>
#include <utility>

#include "kiln/core/device.h"

namespace kiln {

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ull) : seed_(seed) {}
  void manual_seed(uint64_t seed) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = 0;
  }
  // Returns (seed, first offset) for a draw of n elements and advances the offset.
  std::pair<uint64_t, uint64_t> reserve(uint64_t n) {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t off = offset_;
    offset_ += n;
    return {seed_, off};
  }
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }
  // For checkpoints: the whole state is these two numbers.
  void set_state(uint64_t seed, uint64_t offset) {
    std::lock_guard<std::mutex> lock(mu_);
    seed_ = seed;
    offset_ = offset;
  }

 private:
  std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator(Device device);

}  // namespace kiln
