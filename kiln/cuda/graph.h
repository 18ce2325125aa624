#pragma once
// CUDA graphs (docs/guide.md, speed-up 22): record the kernels of a region once,
// then replay them with one launch, removing the per-kernel CPU launch cost - what makes small,
// launch-bound training steps fast.
//
//   kiln::cuda::Graph graph;
//   for (int i = 0; i < 3; ++i) step();            // warm up: optimizer state, cuBLAS handles...
//   graph.capture([&] { step(); });                // records, does not run the kernels
//   for (...) { static_x.copy_(next_x); graph.replay(); }
//
// Rules, as with torch.cuda.graphs:
// - Capture runs on a side stream (the default stream cannot be captured); the current stream
//   is switched for the region and restored after it. Work queued before is waited for.
// - Memory allocated during capture comes from the graph's private pool of the caching
//   allocator and is reused only by this graph's replays: tensors created inside the region
//   (outputs, gradients) keep their addresses, so read them after replay() and feed new inputs by
//   copying into tensors that existed before capture ("static" inputs).
// - Host synchronisation is illegal inside the region (item(), to(cpu), a blocking copy): the
//   capture fails with a kiln::Error naming the failing call; the graph stays empty.
// - Host-side values are frozen at capture: per-step scalars must live in device tensors (kiln's
//   optimizers read lr and step counts from the device for this reason). Random ops inside the
//   region draw the same numbers on every replay.
#include <cstdint>
#include <functional>

#include "kiln/core/device.h"

namespace kiln::cuda {

class Graph {
 public:
  Graph();
  ~Graph();
  Graph(const Graph&) = delete;
  Graph& operator=(const Graph&) = delete;

  // Records everything `region` queues on the current device. Throws (and leaves the graph empty)
  // if the region throws or capture fails.
  void capture(const std::function<void()>& region);
  // Lower-level halves of capture(), for regions that do not fit a lambda.
  void capture_begin();
  void capture_end();
  // Launches the recorded work on the current stream.
  void replay();
  // Frees the recorded graph and its private memory pool.
  void reset();
  bool captured() const { return exec_ != nullptr; }
  uint64_t pool_id() const { return pool_id_; }
  int64_t num_nodes() const { return num_nodes_; }

 private:
  void abort_capture();

  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
  uint64_t pool_id_ = 0;
  int device_ = -1;
  bool capturing_ = false;
  bool pool_used_ = false;
  Stream capture_stream_{};
  Stream prev_stream_{};
  int64_t num_nodes_ = 0;
};

}  // namespace kiln::cuda
