#pragma once
// Streams beyond the default one, and events (docs/gpu.md). Like the rest of kiln/cuda/cuda.h
// these exist in every build; without CUDA they throw a clear Error.
//
// Streams come from a per-device pool of non-blocking streams created on first use and never
// destroyed (as PyTorch's stream pool does), so a `Stream` stays a cheap value that can be copied
// into guards, loaders and graphs without ownership questions.
//
// Memory and streams: a tensor's memory belongs to the stream that was current when it was
// allocated. Using it on another stream is safe while the tensor lives, but before it is freed the
// allocator must know about the other stream, or the block may be handed out again while that
// stream still reads it. Tensor::record_stream(s) tells it (PyTorch's record_stream); the data
// loader and the graph capture call it for the tensors they move across streams.
#include <cstdint>

#include "kiln/core/device.h"

namespace kiln {
class Tensor;
}

namespace kiln::cuda {

// A stream of the pool of `device` (-1: the current device), handed out round robin.
Stream get_stream_from_pool(int device = -1);
// `waiter` waits (on the device, not the host) for the work queued on `other` so far.
void stream_wait(const Stream& waiter, const Stream& other);
// The host waits for the work queued on `s` so far.
void synchronize_stream(const Stream& s);
// True when all work queued on `s` so far has finished.
bool stream_query(const Stream& s);
// True while `s` is being captured into a CUDA graph (operations that would synchronise the host
// are illegal then; kiln::cuda::Graph reports them).
bool is_capturing(const Stream& s);
bool current_stream_is_capturing();

// Marks that `t`'s memory is used on stream `s` (see above). A no-op for CPU tensors and when `s`
// is the stream the memory was allocated on.
void record_stream(const Tensor& t, const Stream& s);

// A CUDA event: a point in a stream's work that other streams or the host can wait for.
// Created lazily on the device of the first record(). Move-only.
class Event {
 public:
  explicit Event(bool enable_timing = false);
  ~Event();
  Event(Event&& o) noexcept;
  Event& operator=(Event&& o) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const Stream& s);  // marks the current end of s's queue
  void record();                 // on the current stream of the current device
  bool recorded() const { return event_ != nullptr; }
  bool query() const;                // the recorded work has finished (true if never recorded)
  void synchronize() const;          // the host waits for the recorded work
  void wait(const Stream& s) const;  // s waits for the recorded work (no host sync)
  // Milliseconds between this event and `end` (both recorded with enable_timing, end completed).
  float elapsed_ms(const Event& end) const;

 private:
  void* event_ = nullptr;  // cudaEvent_t
  int device_ = -1;
  bool timing_ = false;
};

}  // namespace kiln::cuda
