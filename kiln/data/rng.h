#pragma once
// Random numbers for data pipelines: a pure function of (seed, epoch, stream, index), drawn from
// the counter-based Philox generator. Shuffles and random transforms use them, so a sample's
// crop, flip and position in the epoch depend only on the seed, the epoch and the sample index —
// never on which worker thread built it or how many there are.
#include <cstdint>

#include "kiln/core/philox.h"

namespace kiln::data {

// Streams keep the uses of one (seed, epoch) apart.
enum class RngStream : uint32_t { Shuffle = 1, Transform = 2, Bucket = 3, Distributed = 4 };

class DataRng {
 public:
  DataRng(uint64_t seed, uint64_t epoch, uint64_t index, RngStream stream)
      : seed_(seed), index_(index), hi_((epoch << 24) ^ (static_cast<uint64_t>(stream) << 12)) {}
  uint32_t next_u32() {
    if (used_ == 4) {
      blk_ = philox::block(seed_, index_, hi_ + counter_++);
      used_ = 0;
    }
    return blk_.v[used_++];
  }
  uint64_t next_u64() { return (static_cast<uint64_t>(next_u32()) << 32) | next_u32(); }
  float uniform() { return philox::to_unit_float(next_u32()); }  // [0, 1)
  // Uniform integer in [0, n) (Lemire's multiply-shift on 64 bits; bias < n / 2^64).
  int64_t randint(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next_u64()) * static_cast<uint64_t>(n)) >> 64);
  }
  bool bernoulli(double p) { return uniform() < p; }

 private:
  uint64_t seed_, index_, hi_;
  uint64_t counter_ = 0;
  philox::U32x4 blk_{};
  int used_ = 4;
};

// Uniform integer in [0, n) for position i of a (seed, epoch, stream) draw, one Philox block per
// position: what Fisher-Yates shuffles use so that any position can be computed on its own.
inline int64_t randint_at(uint64_t seed, uint64_t epoch, RngStream stream, uint64_t i, int64_t n) {
  philox::U32x4 b = philox::block(seed, i, (epoch << 24) ^ (static_cast<uint64_t>(stream) << 12) ^ 0xfff);
  uint64_t x = (static_cast<uint64_t>(b.v[0]) << 32) | b.v[1];
  return static_cast<int64_t>((static_cast<unsigned __int128>(x) * static_cast<uint64_t>(n)) >> 64);
}

}  // namespace kiln::data
