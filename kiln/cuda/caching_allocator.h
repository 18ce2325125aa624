#pragma once
// A caching device allocator (docs/guide.md, speed-up 21), PyTorch-style, written against an abstract backend
// so its bookkeeping runs and is tested on the CPU (tests/core/test_caching_allocator.cpp uses a
// malloc-based fake; kiln/cuda/runtime.cpp plugs in cudaMalloc/cudaFree/events).
//
// - Requests are rounded up to 512 B. Requests of at most 1 MiB come from the small pool, carved
//   out of 2 MiB segments; larger ones from the large pool, whose segments are the request rounded
//   up to 2 MiB (exactly the rounded request above 10 MiB).
// - Free blocks live in a size-ordered set per pool keyed by (stream, size, address): an
//   allocation takes the best fit on its own stream. A block larger than needed is split when the
//   remainder is >= 512 B (small) or > 1 MiB (large); a freed block merges with free neighbours of
//   the same segment. Fully free segments go back to the backend only on empty_cache() or when a
//   backend allocation fails (then the allocation is retried once before an out-of-memory Error
//   naming the request and carrying summary()).
// - Blocks belong to the stream they were allocated on. record_stream(ptr, s) marks use on another
//   stream; on free the block waits, off the free lists, until the backend reports that every such
//   stream has passed the point of the free (process_events(), also run by every allocate()).
// - begin_private_pool(id) routes the calling thread's allocations to a separate pool (used while
//   capturing a CUDA graph); its blocks are never handed to other allocations, and its segments
//   are returned only after release_pool(id).
// - Optional history (record_history(true)): every alloc/free/segment alloc/segment free with a
//   time stamp, stream and the thread's MemoryLabel (history()), which kiln/utils/memory_timeline.h
//   writes as a Chrome trace (counter tracks "allocated" and "reserved") or as an HTML timeline.
// All public members are thread-safe (one mutex).
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace kiln {

// What the caching allocator needs from the device runtime. Streams and events are opaque
// handles (a cudaStream_t / cudaEvent_t for CUDA; nullptr is the default stream).
class AllocatorBackend {
 public:
  virtual ~AllocatorBackend() = default;
  // Fresh device memory, or nullptr when the device is out of memory (other failures throw).
  virtual void* raw_alloc(size_t nbytes) = 0;
  // Must not throw: it may run from destructors and after the runtime shut down.
  virtual void raw_free(void* ptr) = 0;
  // Blocks until all work queued so far on `stream` has finished.
  virtual void synchronize_stream(void* stream) = 0;
  // True when all work queued so far on `stream` has finished (used by the default event hooks).
  virtual bool stream_done(void* stream) = 0;
  // Marks the current point of `stream`; the default uses the stream itself as the marker (the
  // point is passed when the whole stream is idle), CUDA records a real event.
  virtual void* record_event(void* stream) { return stream; }
  virtual bool event_done(void* event) { return stream_done(event); }
  virtual void synchronize_event(void* event) { synchronize_stream(event); }
  virtual void release_event(void* /*event*/) {}
  // Extra lines for the out-of-memory message (e.g. the device's free/total memory).
  virtual std::string oom_details() { return {}; }
};

struct AllocatorStats {
  size_t allocated_bytes = 0;       // bytes in blocks handed out (rounded sizes)
  size_t requested_bytes = 0;       // bytes asked for by the live allocations
  size_t reserved_bytes = 0;        // bytes held from the backend (all segments)
  size_t peak_allocated_bytes = 0;  // since construction or reset_peak_stats()
  size_t peak_reserved_bytes = 0;
  size_t num_segments = 0;  // live backend allocations
  uint64_t num_allocs = 0;  // allocate() calls that returned memory
  uint64_t num_frees = 0;
  uint64_t num_backend_allocs = 0;  // real cudaMalloc calls that succeeded
  uint64_t num_backend_frees = 0;
  uint64_t num_ooms = 0;  // out-of-memory errors thrown
};

enum class MemoryAction { Alloc, Free, SegmentAlloc, SegmentFree };
const char* to_string(MemoryAction a);

struct MemoryEvent {
  double time_us = 0;  // since the allocator was created
  MemoryAction action = MemoryAction::Alloc;
  uintptr_t ptr = 0;
  size_t size = 0;  // block size (rounded) for alloc/free, segment size for segment events
  uintptr_t stream = 0;
  std::string label;     // the innermost MemoryLabel of the thread, "" when none
  size_t allocated = 0;  // allocator totals right after the event
  size_t reserved = 0;
};

// RAII: labels the allocations the current thread makes while it lives (nestable; the innermost
// label wins). Labels show in the recorded history and its exports.
class MemoryLabel {
 public:
  explicit MemoryLabel(std::string label);
  ~MemoryLabel();
  MemoryLabel(const MemoryLabel&) = delete;
  MemoryLabel& operator=(const MemoryLabel&) = delete;
};
const std::string& current_memory_label();

class CachingAllocator {
 public:
  static constexpr size_t kMinBlockSize = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;       // small pool: requests <= 1 MiB
  static constexpr size_t kSmallBuffer = size_t{2} << 20;     // small-pool segment size
  static constexpr size_t kRoundLarge = size_t{2} << 20;      // large segments: multiple of 2 MiB
  static constexpr size_t kMinLargeAlloc = size_t{10} << 20;  // above: segment = request

  // `name` appears in messages ("cuda:0"). The backend must outlive the allocator.
  CachingAllocator(AllocatorBackend* backend, std::string name);
  ~CachingAllocator();  // returns every segment to the backend
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nullptr for 0 bytes. Throws kiln::Error when the backend is out of memory even after the
  // cache was emptied.
  void* allocate(size_t nbytes, void* stream = nullptr);
  // Returns the block; nullptr is ignored. Throws kiln::Error for a pointer it does not own.
  void free(void* ptr);
  // Like free() but returns false instead of throwing for a pointer this allocator does not own
  // (lets a per-device front end find the owner). Never throws.
  bool try_free(void* ptr);
  bool owns(void* ptr) const;
  // `ptr` (a live allocation) is also used on `stream`: after free it is not reused until the
  // work queued on `stream` up to the free has finished.
  void record_stream(void* ptr, void* stream);
  // Moves blocks whose cross-stream uses have finished back to the free lists.
  void process_events();
  // Waits for pending cross-stream frees and returns every fully free segment of the normal
  // pools (and of released private pools) to the backend.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak_stats();
  std::string summary() const;  // multi-line, human-readable
  // Caps what this allocator reserves from the backend at `bytes` (0: no cap), as PyTorch's
  // set_per_process_memory_fraction does: past it an allocation fails (after the cache is given
  // back) with the usual out-of-memory error, which names the cap.
  void set_memory_limit(size_t bytes);
  size_t memory_limit() const;

  void begin_private_pool(uint64_t id);  // routes this thread's allocations to pool `id`
  void end_private_pool();               // back to the normal pools
  // The pool's blocks may be reused by nobody anymore: free segments go back now, the others as
  // soon as all their blocks are freed.
  void release_pool(uint64_t id);

  void record_history(bool enabled, size_t max_entries = size_t{1} << 20);
  bool recording_history() const;
  std::vector<MemoryEvent> history() const;
  void clear_history();

  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Pool;
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    void* stream = nullptr;
    Pool* pool = nullptr;
    bool allocated = false;
    int event_count = 0;    // cross-stream uses still running after free
    Block* prev = nullptr;  // neighbours within the segment
    Block* next = nullptr;
    std::set<void*> stream_uses;
  };
  struct BlockLess {
    bool operator()(const Block* a, const Block* b) const;
  };
  struct Pool {
    bool small = false;
    uint64_t private_id = 0;
    bool is_private = false;
    std::set<Block*, BlockLess> blocks;  // free blocks
  };
  struct PrivatePool {
    Pool small, large;
    bool released = false;
    size_t segments = 0;  // segments still owned
  };

  void* allocate_locked(size_t nbytes, void* stream);
  void free_locked(Block* b);
  void record_stream_events_locked(Block* b);  // events on the streams that used b, then pending
  void free_block(Block* b);                   // back to its pool's free list, merged with neighbours
  bool try_merge(Block* dst, Block* src);
  Block* alloc_segment(Pool& pool, size_t size, void* stream);
  void release_segment(Block* b);
  void release_cached_locked();  // sync pending events, free all fully free releasable segments
  void release_pool_segments(Pool& pool);
  void process_events_locked();
  void synchronize_events_locked();
  void maybe_delete_private_pool(uint64_t id);
  Pool& pool_for(size_t rounded);
  void record(MemoryAction a, const void* ptr, size_t size, void* stream);
  std::string summary_locked() const;
  static std::string human(size_t bytes);

  AllocatorBackend* backend_;
  std::string name_;
  mutable std::mutex mu_;
  Pool small_, large_;
  std::map<uint64_t, std::unique_ptr<PrivatePool>> private_pools_;
  std::unordered_map<std::thread::id, uint64_t> thread_pool_;  // threads routed to a private pool
  std::unordered_map<void*, Block*> allocated_;
  std::map<void*, std::pair<size_t, Pool*>> segments_;  // base -> (size, pool) of live segments
  std::vector<std::pair<void*, Block*>> pending_;       // (event, block) of cross-stream frees
  std::vector<Block*> deferred_until_no_capture_;       // cross-stream frees made during a capture
  AllocatorStats stats_;
  size_t memory_limit_ = 0;  // 0: none
  bool history_on_ = false;
  size_t history_max_ = 0;
  std::deque<MemoryEvent> history_;
  double t0_us_ = 0;
};

}  // namespace kiln
