#include "kiln/data/staging.h"

#include <algorithm>
#include <atomic>

#include "kiln/core/error.h"

namespace kiln::data {

IntList contiguous_strides(const IntList& sizes) {
  IntList st(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    st[i] = s;
    s *= std::max<int64_t>(sizes[i], 1);
  }
  return st;
}

IntList channels_last_strides(const IntList& sz) {
  KILN_CHECK(sz.size() == 4, "channels_last: expects [N, C, H, W], got ", sz);
  int64_t c = sz[1], h = sz[2], w = sz[3];
  return {h * w * c, 1, w * c, c};
}

Tensor make_tensor(std::shared_ptr<Storage> storage, const IntList& sizes, const IntList& strides, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->sizes = sizes;
  impl->strides = strides;
  impl->offset = 0;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

namespace {
size_t span_bytes(const IntList& sizes, const IntList& strides, DType dtype) {
  int64_t last = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) return 0;
    last += (sizes[i] - 1) * strides[i];
  }
  return static_cast<size_t>(last + 1) * element_size(dtype);
}
// Rounds allocations up (to 1/8 of the next power of two, at least 4 KiB) so that batches of
// slightly different padded lengths reuse each other's blocks.
size_t round_up(size_t n) {
  size_t p = 4096;
  while (p < n) p <<= 1;
  size_t q = std::max<size_t>(4096, p / 8);
  return (n + q - 1) / q * q;
}
}  // namespace

StagingPool::~StagingPool() {
  // Copies may still read blocks: wait for them before the memory goes back.
  for (auto& b : blocks_)
    if (b.pending) b.pending->synchronize();
}

Tensor StagingPool::acquire(const IntList& sizes, const IntList& strides, DType dtype) {
  size_t need = std::max<size_t>(span_bytes(sizes, strides, dtype), 1);
  std::lock_guard<std::mutex> lock(mu_);
  Block* best = nullptr;
  for (auto& b : blocks_) {
    if (b.storage.use_count() != 1 || b.storage->nbytes() < need) continue;
    if (b.pending) {
      if (!b.pending->query()) continue;
      b.pending.reset();
    }
    if (!best || b.storage->nbytes() < best->storage->nbytes()) best = &b;
  }
  // The last user released the block on another thread: order our writes after its reads.
  std::atomic_thread_fence(std::memory_order_acquire);
  if (!best) {
    Allocator* alloc = pinned_ ? pinned_allocator() : cpu_allocator();
    blocks_.push_back(Block{std::make_shared<Storage>(round_up(need), Device::cpu(), alloc), nullptr});
    ++allocations_;
    best = &blocks_.back();
  }
  return make_tensor(best->storage, sizes, strides, dtype);
}

void StagingPool::set_pending(const Tensor& t, std::shared_ptr<cuda::Event> ev) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& b : blocks_)
    if (b.storage == t.storage()) {
      b.pending = std::move(ev);
      return;
    }
}

void StagingPool::trim(size_t keep) {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Block> busy, idle;
  for (auto& b : blocks_) {
    bool free = b.storage.use_count() == 1 && (!b.pending || b.pending->query());
    (free ? idle : busy).push_back(std::move(b));
  }
  std::sort(idle.begin(), idle.end(),
            [](const Block& a, const Block& b) { return a.storage->nbytes() > b.storage->nbytes(); });
  if (idle.size() > keep) idle.resize(keep);
  blocks_ = std::move(busy);
  for (auto& b : idle) blocks_.push_back(std::move(b));
}

int64_t StagingPool::allocations() const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocations_;
}
int64_t StagingPool::blocks() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(blocks_.size());
}
size_t StagingPool::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& b : blocks_) n += b.storage->nbytes();
  return n;
}

}  // namespace kiln::data
