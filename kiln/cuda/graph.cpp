// kiln::cuda::Graph (cuda_graph.h): stream capture into a cudaGraph_t, instantiation, replay,
// with the caching allocator's private pool for the memory allocated while capturing.
#include "kiln/cuda/graph.h"

#include <atomic>

#include "kiln/config.h"
#include "kiln/cuda/cuda.h"
#include "kiln/cuda/stream.h"
#include "kiln/core/error.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/cuda/check.h"
#include "kiln/cuda/device_error.h"
#endif

namespace kiln::cuda {

namespace {
// Private pool ids: one per capture, never reused, so a pool released by one graph cannot be
// mixed up with another's.
uint64_t next_pool_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1);
}
}  // namespace

Graph::Graph() : pool_id_(next_pool_id()) {}

Graph::~Graph() {
  try {
    if (capturing_) abort_capture();
    reset();
  } catch (...) {
    // destructors must not throw; the driver may already be shut down at exit
  }
}

void Graph::capture(const std::function<void()>& region) {
  capture_begin();
  try {
    region();
  } catch (const std::exception& e) {
    abort_capture();
    throw Error(std::string("CUDA graph capture failed inside the captured region (nothing was recorded): ") +
                e.what());
  }
  capture_end();
}

#if KILN_WITH_CUDA

void Graph::capture_begin() {
  KILN_CHECK(!capturing_, "Graph::capture_begin: a capture is already in progress");
  KILN_CHECK(!captured(), "Graph::capture_begin: this graph already holds a capture; call reset() first");
  KILN_CHECK(is_available(), "Graph::capture_begin: no CUDA device is available");
  device_ = current_device();
  internal::device_error_record(device_);  // created and zeroed outside the capture
  prev_stream_ = current_stream(device_);
  capture_stream_ = get_stream_from_pool(device_);
  // Work queued before the region (e.g. the static inputs' copies) happens before it.
  stream_wait(capture_stream_, prev_stream_);
  set_current_stream(capture_stream_);
  begin_private_pool(pool_id_, device_);
  pool_used_ = true;
  // Relaxed: the allocator may still call cudaMalloc / query events of finished work from this
  // thread while the region runs; host syncs on the capturing stream remain errors.
  cudaError_t e =
      cudaStreamBeginCapture(static_cast<cudaStream_t>(capture_stream_.handle), cudaStreamCaptureModeRelaxed);
  if (e != cudaSuccess) {
    cudaGetLastError();
    end_private_pool(device_);
    set_current_stream(prev_stream_);
    KILN_FAIL("Graph::capture_begin: cudaStreamBeginCapture failed: ", cudaGetErrorString(e));
  }
  capturing_ = true;
}

void Graph::capture_end() {
  KILN_CHECK(capturing_, "Graph::capture_end: no capture in progress");
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(static_cast<cudaStream_t>(capture_stream_.handle), &g);
  capturing_ = false;
  end_private_pool(device_);
  set_current_stream(prev_stream_);
  if (e != cudaSuccess || g == nullptr) {
    cudaGetLastError();
    if (g) cudaGraphDestroy(g);
    KILN_FAIL("Graph::capture_end: the capture was invalidated (", cudaGetErrorString(e),
              "); usually an operation inside the region synchronised with the host or used "
              "another stream without waiting for it");
  }
  graph_ = g;
  size_t n = 0;
  KILN_CUDA_CHECK(cudaGraphGetNodes(g, nullptr, &n));
  num_nodes_ = static_cast<int64_t>(n);
  cudaGraphExec_t exec = nullptr;
  e = cudaGraphInstantiate(&exec, g, 0);
  if (e != cudaSuccess) {
    cudaGetLastError();
    cudaGraphDestroy(g);
    graph_ = nullptr;
    KILN_FAIL("Graph::capture_end: cudaGraphInstantiate failed: ", cudaGetErrorString(e));
  }
  exec_ = exec;
}

void Graph::abort_capture() {
  if (!capturing_) return;
  cudaGraph_t g = nullptr;
  cudaStreamEndCapture(static_cast<cudaStream_t>(capture_stream_.handle), &g);
  if (g) cudaGraphDestroy(g);
  cudaGetLastError();  // the failure that aborted the capture is reported by the caller
  capturing_ = false;
  end_private_pool(device_);
  set_current_stream(prev_stream_);
}

void Graph::replay() {
  KILN_CHECK(captured(), "Graph::replay: nothing has been captured");
  KILN_CUDA_CHECK(
      cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(current_stream(device_).handle)));
}

void Graph::reset() {
  KILN_CHECK(!capturing_, "Graph::reset: a capture is in progress");
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
  num_nodes_ = 0;
  if (pool_used_) {
    release_private_pool(pool_id_, device_);
    pool_used_ = false;
    pool_id_ = next_pool_id();
  }
}

#else  // !KILN_WITH_CUDA

void Graph::capture_begin() {
  KILN_FAIL("Graph::capture_begin: kiln was built without CUDA support (configure with -DKILN_CUDA=ON)");
}
void Graph::capture_end() { KILN_FAIL("Graph::capture_end: no capture in progress"); }
void Graph::abort_capture() {}
void Graph::replay() { KILN_FAIL("Graph::replay: nothing has been captured"); }
void Graph::reset() {}

#endif

}  // namespace kiln::cuda
