#pragma once
// StagingPool: recycled host buffers that the DataLoader collates batches into.
//
// Each block is a Storage (pinned when asked for and a CUDA device exists). acquire() hands out
// a tensor viewing a free block; a block is free again once no tensor views it any more (the
// pool holds the only reference) and, for a block whose bytes are being copied to the device,
// once the copy's event has completed. In steady state every batch reuses a block: the pool
// stops allocating after the first prefetch-depth batches (stats below).
#include <memory>
#include <mutex>
#include <vector>

#include "kiln/cuda/stream.h"
#include "kiln/core/tensor.h"

namespace kiln::data {

class StagingPool {
 public:
  explicit StagingPool(bool pinned) : pinned_(pinned) {}
  ~StagingPool();
  StagingPool(const StagingPool&) = delete;
  StagingPool& operator=(const StagingPool&) = delete;

  // A tensor with these sizes, strides (in elements; a dense layout) and dtype over a free block.
  Tensor acquire(const IntList& sizes, const IntList& strides, DType dtype);
  // The block under `t` stays busy until `ev` completes (an asynchronous copy reads it).
  void set_pending(const Tensor& t, std::shared_ptr<cuda::Event> ev);
  // Frees unused blocks beyond the `keep` largest.
  void trim(size_t keep);

  bool pinned() const { return pinned_; }
  int64_t allocations() const;  // blocks allocated since construction
  int64_t blocks() const;       // blocks held now
  size_t bytes() const;         // bytes held now

 private:
  struct Block {
    std::shared_ptr<Storage> storage;
    std::shared_ptr<cuda::Event> pending;
  };
  bool pinned_;
  mutable std::mutex mu_;
  std::vector<Block> blocks_;
  int64_t allocations_ = 0;
};

// A tensor over `storage` (offset 0) with the given layout: how the loader makes views of
// staging blocks and device buffers without copying.
Tensor make_tensor(std::shared_ptr<Storage> storage, const IntList& sizes, const IntList& strides, DType dtype);
IntList contiguous_strides(const IntList& sizes);
// [N, C, H, W] strides of the channels-last (NHWC) memory format.
IntList channels_last_strides(const IntList& sizes);

}  // namespace kiln::data
