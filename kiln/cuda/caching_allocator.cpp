#include "kiln/cuda/caching_allocator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>

#include "kiln/core/error.h"

namespace kiln {

namespace {

double now_us() {
  using namespace std::chrono;
  return duration<double, std::micro>(steady_clock::now().time_since_epoch()).count();
}

thread_local std::vector<std::string> t_labels;

}  // namespace

const char* to_string(MemoryAction a) {
  switch (a) {
    case MemoryAction::Alloc: return "alloc";
    case MemoryAction::Free: return "free";
    case MemoryAction::SegmentAlloc: return "segment_alloc";
    case MemoryAction::SegmentFree: return "segment_free";
  }
  return "?";
}

MemoryLabel::MemoryLabel(std::string label) { t_labels.push_back(std::move(label)); }
MemoryLabel::~MemoryLabel() { t_labels.pop_back(); }

const std::string& current_memory_label() {
  static const std::string empty;
  return t_labels.empty() ? empty : t_labels.back();
}

// ------------------------------------------------------------------------------ bookkeeping

bool CachingAllocator::BlockLess::operator()(const Block* a, const Block* b) const {
  if (a->stream != b->stream) return reinterpret_cast<uintptr_t>(a->stream) < reinterpret_cast<uintptr_t>(b->stream);
  if (a->size != b->size) return a->size < b->size;
  return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
}

CachingAllocator::CachingAllocator(AllocatorBackend* backend, std::string name)
    : backend_(backend), name_(std::move(name)), t0_us_(now_us()) {
  KILN_CHECK(backend_ != nullptr, "CachingAllocator: null backend");
  small_.small = true;
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mu_);
  // Every block of every segment, live or not: the memory goes back to the backend.
  std::set<Block*> all;
  auto collect = [&](Pool& p) { all.insert(p.blocks.begin(), p.blocks.end()); };
  collect(small_);
  collect(large_);
  for (auto& [id, pp] : private_pools_) {
    collect(pp->small);
    collect(pp->large);
  }
  for (auto& [p, b] : allocated_) all.insert(b);
  for (auto& [e, b] : pending_) {
    backend_->release_event(e);
    all.insert(b);
  }
  for (auto& [base, info] : segments_) backend_->raw_free(base);
  for (Block* b : all) delete b;
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kMinBlockSize) return kMinBlockSize;
  return (nbytes + kMinBlockSize - 1) / kMinBlockSize * kMinBlockSize;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
  return rounded;
}

std::string CachingAllocator::human(size_t bytes) {
  char buf[64];
  if (bytes >= (size_t{1} << 30)) std::snprintf(buf, sizeof(buf), "%.2f GiB", bytes / double(size_t{1} << 30));
  else if (bytes >= (size_t{1} << 20)) std::snprintf(buf, sizeof(buf), "%.2f MiB", bytes / double(size_t{1} << 20));
  else if (bytes >= 1024) std::snprintf(buf, sizeof(buf), "%.2f KiB", bytes / 1024.0);
  else std::snprintf(buf, sizeof(buf), "%zu B", bytes);
  return buf;
}

CachingAllocator::Pool& CachingAllocator::pool_for(size_t rounded) {
  bool small = rounded <= kSmallSize;
  auto it = thread_pool_.find(std::this_thread::get_id());
  if (it != thread_pool_.end()) {
    PrivatePool& pp = *private_pools_.at(it->second);
    return small ? pp.small : pp.large;
  }
  return small ? small_ : large_;
}

void CachingAllocator::record(MemoryAction a, const void* ptr, size_t size, void* stream) {
  if (!history_on_) return;
  MemoryEvent e;
  e.time_us = now_us() - t0_us_;
  e.action = a;
  e.ptr = reinterpret_cast<uintptr_t>(ptr);
  e.size = size;
  e.stream = reinterpret_cast<uintptr_t>(stream);
  e.label = current_memory_label();
  e.allocated = stats_.allocated_bytes;
  e.reserved = stats_.reserved_bytes;
  history_.push_back(std::move(e));
  while (history_.size() > history_max_) history_.pop_front();
}

CachingAllocator::Block* CachingAllocator::alloc_segment(Pool& pool, size_t size, void* stream) {
  if (memory_limit_ && size > memory_limit_ - std::min(memory_limit_, stats_.reserved_bytes)) return nullptr;
  void* p = backend_->raw_alloc(size);
  if (!p) return nullptr;
  auto* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = size;
  b->stream = stream;
  b->pool = &pool;
  segments_[p] = {size, &pool};
  if (pool.is_private) private_pools_.at(pool.private_id)->segments++;
  stats_.num_backend_allocs++;
  stats_.num_segments++;
  stats_.reserved_bytes += size;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  record(MemoryAction::SegmentAlloc, p, size, stream);
  return b;
}

// `b` is free, in its pool's set, and spans a whole segment.
void CachingAllocator::release_segment(Block* b) {
  Pool* pool = b->pool;
  pool->blocks.erase(b);
  segments_.erase(b->ptr);
  stats_.num_backend_frees++;
  stats_.num_segments--;
  stats_.reserved_bytes -= b->size;
  record(MemoryAction::SegmentFree, b->ptr, b->size, b->stream);
  backend_->raw_free(b->ptr);
  if (pool->is_private) {
    uint64_t id = pool->private_id;
    private_pools_.at(id)->segments--;
    delete b;
    maybe_delete_private_pool(id);
    return;
  }
  delete b;
}

void CachingAllocator::maybe_delete_private_pool(uint64_t id) {
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) return;
  if (it->second->released && it->second->segments == 0) {
    for (auto& [tid, pid] : thread_pool_)
      if (pid == id) return;  // a thread still routes to it
    private_pools_.erase(it);
  }
}

void CachingAllocator::release_pool_segments(Pool& pool) {
  std::vector<Block*> whole;
  for (Block* b : pool.blocks)
    if (!b->prev && !b->next) whole.push_back(b);
  for (Block* b : whole) release_segment(b);  // may delete `pool` (private) on the last one
}

void* CachingAllocator::allocate(size_t nbytes, void* stream) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mu_);
  return allocate_locked(nbytes, stream);
}

void* CachingAllocator::allocate_locked(size_t nbytes, void* stream) {
  process_events_locked();
  const size_t size = round_size(nbytes);
  Pool& pool = pool_for(size);

  // Best fit on this stream.
  Block key;
  key.stream = stream;
  key.size = size;
  key.ptr = nullptr;
  Block* b = nullptr;
  auto it = pool.blocks.lower_bound(&key);
  if (it != pool.blocks.end() && (*it)->stream == stream) {
    b = *it;
    pool.blocks.erase(it);
  }

  if (!b) {
    const size_t seg = segment_size(size);
    b = alloc_segment(pool, seg, stream);
    if (!b) {
      // Out of memory: give the cache back and try once more.
      release_cached_locked();
      b = alloc_segment(pool, seg, stream);
    }
    if (!b) {
      stats_.num_ooms++;
      std::string details = backend_->oom_details();
      if (memory_limit_)
        details += detail::concat(details.empty() ? "" : "\n", "  this process may reserve at most ", memory_limit_,
                                  " bytes (", human(memory_limit_), ") on ", name_,
                                  " (set_per_process_memory_fraction); ", stats_.reserved_bytes, " are reserved");
      KILN_FAIL_OUT_OF_MEMORY("out of memory on ", name_, ": tried to allocate ", nbytes, " bytes (", human(nbytes),
                              "; a ", human(seg), " segment)", details.empty() ? "" : "\n", details, "\n",
                              summary_locked());
    }
  }

  // Split off the remainder when it is worth keeping.
  const size_t remaining = b->size - size;
  const bool split = pool.small ? remaining >= kMinBlockSize : remaining > kSmallSize;
  if (split) {
    auto* rest = new Block;
    rest->ptr = b->ptr + size;
    rest->size = remaining;
    rest->stream = stream;
    rest->pool = &pool;
    rest->prev = b;
    rest->next = b->next;
    if (b->next) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool.blocks.insert(rest);
  }

  b->allocated = true;
  b->requested = nbytes;
  allocated_[b->ptr] = b;
  stats_.num_allocs++;
  stats_.allocated_bytes += b->size;
  stats_.requested_bytes += nbytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  record(MemoryAction::Alloc, b->ptr, b->size, stream);
  return b->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  KILN_CHECK(it != allocated_.end(), "CachingAllocator(", name_, ")::free: pointer ", ptr,
             " was not allocated by this allocator (or was already freed)");
  Block* b = it->second;
  allocated_.erase(it);
  free_locked(b);
}

bool CachingAllocator::try_free(void* ptr) {
  if (!ptr) return true;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  if (it == allocated_.end()) return false;
  Block* b = it->second;
  allocated_.erase(it);
  try {
    free_locked(b);
  } catch (...) {
    // A failing event record (runtime shut down): keep the block out of circulation.
  }
  return true;
}

bool CachingAllocator::owns(void* ptr) const {
  std::lock_guard<std::mutex> lock(mu_);
  return allocated_.count(ptr) != 0;
}

void CachingAllocator::free_locked(Block* b) {
  b->allocated = false;
  stats_.num_frees++;
  stats_.allocated_bytes -= b->size;
  stats_.requested_bytes -= b->requested;
  record(MemoryAction::Free, b->ptr, b->size, b->stream);
  if (b->stream_uses.empty()) {
    free_block(b);
    return;
  }
  if (!thread_pool_.empty()) {
    // A capture is underway (its thread allocates from a private pool): an event recorded on a
    // capturing stream would only be captured, and querying it fails. The events are recorded
    // when the last capture ends; until then the extra count keeps the block from reuse and merging.
    b->event_count++;
    deferred_until_no_capture_.push_back(b);
    return;
  }
  record_stream_events_locked(b);
}

// Cross-stream use: the block waits until every other stream has passed this point.
void CachingAllocator::record_stream_events_locked(Block* b) {
  std::set<void*> uses;
  uses.swap(b->stream_uses);
  for (void* s : uses) {
    void* e = backend_->record_event(s);
    b->event_count++;
    pending_.emplace_back(e, b);
  }
}

bool CachingAllocator::try_merge(Block* dst, Block* src) {
  if (!src || src->allocated || src->event_count > 0) return false;
  Pool* pool = dst->pool;
  // Only a block on its pool's free list: a neighbour whose last event completed in the same
  // process_events() pass is not on it yet, and merging it would delete a block still to be freed.
  if (pool->blocks.erase(src) == 0) return false;
  if (dst->prev == src) {  // src precedes dst
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
  } else {  // src follows dst
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  dst->size += src->size;
  delete src;
  return true;
}

void CachingAllocator::free_block(Block* b) {
  try_merge(b, b->prev);
  try_merge(b, b->next);
  Pool* pool = b->pool;
  pool->blocks.insert(b);
  // A released private pool gives each segment back as soon as it is whole again.
  if (pool->is_private && !b->prev && !b->next && private_pools_.at(pool->private_id)->released) release_segment(b);
}

void CachingAllocator::record_stream(void* ptr, void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocated_.find(ptr);
  KILN_CHECK(it != allocated_.end(), "CachingAllocator(", name_, ")::record_stream: pointer ", ptr,
             " is not a live allocation of this allocator");
  Block* b = it->second;
  if (stream != b->stream) b->stream_uses.insert(stream);
}

void CachingAllocator::process_events() {
  std::lock_guard<std::mutex> lock(mu_);
  process_events_locked();
}

void CachingAllocator::process_events_locked() {
  if (pending_.empty()) return;
  std::vector<std::pair<void*, Block*>> still;
  std::vector<Block*> ready;
  for (auto& [e, b] : pending_) {
    if (backend_->event_done(e)) {
      backend_->release_event(e);
      if (--b->event_count == 0) ready.push_back(b);
    } else {
      still.emplace_back(e, b);
    }
  }
  pending_.swap(still);
  for (Block* b : ready) free_block(b);
}

void CachingAllocator::synchronize_events_locked() {
  std::vector<std::pair<void*, Block*>> pending;
  pending.swap(pending_);
  std::vector<Block*> ready;
  for (auto& [e, b] : pending) {
    backend_->synchronize_event(e);
    backend_->release_event(e);
    if (--b->event_count == 0) ready.push_back(b);
  }
  for (Block* b : ready) free_block(b);
}

void CachingAllocator::release_cached_locked() {
  synchronize_events_locked();
  release_pool_segments(small_);
  release_pool_segments(large_);
  std::vector<uint64_t> released;
  for (auto& [id, pp] : private_pools_)
    if (pp->released) released.push_back(id);
  for (uint64_t id : released) {
    auto it = private_pools_.find(id);
    if (it == private_pools_.end()) continue;
    PrivatePool* pp = it->second.get();
    release_pool_segments(pp->small);
    if (private_pools_.count(id) && private_pools_.at(id).get() == pp) release_pool_segments(pp->large);
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached_locked();
}

// ---------------------------------------------------------------------------- private pools

void CachingAllocator::begin_private_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& pp = private_pools_[id];
  if (!pp) {
    pp = std::make_unique<PrivatePool>();
    pp->small.small = true;
    pp->small.is_private = pp->large.is_private = true;
    pp->small.private_id = pp->large.private_id = id;
  }
  KILN_CHECK(!pp->released, "CachingAllocator(", name_, ")::begin_private_pool: pool ", id, " was released");
  thread_pool_[std::this_thread::get_id()] = id;
}

void CachingAllocator::end_private_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = thread_pool_.find(std::this_thread::get_id());
  if (it == thread_pool_.end()) return;
  uint64_t id = it->second;
  thread_pool_.erase(it);
  if (thread_pool_.empty()) {  // no capture left: record the events of the frees it deferred
    std::vector<Block*> deferred;
    deferred.swap(deferred_until_no_capture_);
    for (Block* b : deferred) {
      b->event_count--;
      record_stream_events_locked(b);
      if (b->event_count == 0) free_block(b);
    }
  }
  maybe_delete_private_pool(id);
}

void CachingAllocator::release_pool(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = private_pools_.find(id);
  if (it == private_pools_.end()) return;
  PrivatePool* pp = it->second.get();
  pp->released = true;
  if (pp->segments == 0) {
    maybe_delete_private_pool(id);
    return;
  }
  release_pool_segments(pp->small);
  if (private_pools_.count(id) && private_pools_.at(id).get() == pp) release_pool_segments(pp->large);
}

// -------------------------------------------------------------------------- stats, summary

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

std::string CachingAllocator::summary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return summary_locked();
}

void CachingAllocator::set_memory_limit(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  memory_limit_ = bytes;
}

size_t CachingAllocator::memory_limit() const {
  std::lock_guard<std::mutex> lock(mu_);
  return memory_limit_;
}

std::string CachingAllocator::summary_locked() const {
  size_t small_segs = 0, large_segs = 0, private_segs = 0;
  for (auto& [base, info] : segments_) {
    if (info.second->is_private) private_segs++;
    else if (info.second->small) small_segs++;
    else large_segs++;
  }
  size_t largest_free = 0, free_bytes = 0, free_blocks = 0;
  auto scan = [&](const Pool& p) {
    for (const Block* b : p.blocks) {
      largest_free = std::max(largest_free, b->size);
      free_bytes += b->size;
      free_blocks++;
    }
  };
  scan(small_);
  scan(large_);
  for (auto& [id, pp] : private_pools_) {
    scan(pp->small);
    scan(pp->large);
  }
  size_t pending_bytes = 0;
  std::set<Block*> pend;
  for (auto& [e, b] : pending_) pend.insert(b);
  for (Block* b : pend) pending_bytes += b->size;

  const AllocatorStats& s = stats_;
  std::ostringstream os;
  os << "caching allocator " << name_ << ":\n"
     << "  allocated:          " << s.allocated_bytes << " bytes (" << human(s.allocated_bytes) << ") in "
     << allocated_.size() << " blocks; requested " << human(s.requested_bytes) << "\n"
     << "  reserved:           " << s.reserved_bytes << " bytes (" << human(s.reserved_bytes) << ")\n"
     << "  peak allocated:     " << s.peak_allocated_bytes << " bytes (" << human(s.peak_allocated_bytes)
     << "); peak reserved " << human(s.peak_reserved_bytes) << "\n"
     << "  segments:           " << segments_.size() << " (" << small_segs << " small, " << large_segs << " large, "
     << private_segs << " in " << private_pools_.size() << " private pools)\n"
     << "  cached free:        " << free_bytes << " bytes (" << human(free_bytes) << ") in " << free_blocks
     << " blocks; waiting on other streams: " << human(pending_bytes) << "\n"
     << "  largest free block: " << largest_free << " bytes (" << human(largest_free) << ")\n"
     << "  calls:              " << s.num_allocs << " allocs, " << s.num_frees << " frees, " << s.num_backend_allocs
     << " backend allocs, " << s.num_backend_frees << " backend frees, " << s.num_ooms << " out-of-memory errors";
  return os.str();
}

// --------------------------------------------------------------------------------- history

void CachingAllocator::record_history(bool enabled, size_t max_entries) {
  std::lock_guard<std::mutex> lock(mu_);
  history_on_ = enabled;
  history_max_ = std::max<size_t>(max_entries, 1);
  while (history_.size() > history_max_) history_.pop_front();
}

bool CachingAllocator::recording_history() const {
  std::lock_guard<std::mutex> lock(mu_);
  return history_on_;
}

std::vector<MemoryEvent> CachingAllocator::history() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {history_.begin(), history_.end()};
}

void CachingAllocator::clear_history() {
  std::lock_guard<std::mutex> lock(mu_);
  history_.clear();
}

}  // namespace kiln
