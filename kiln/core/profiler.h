#pragma once
// kiln's profiler, in the manner of torch.profiler.profile (docs/profiling.md):
//
//   {
//     kiln::profiler::Profiler prof;              // records from here ...
//     for (...) {
//       kiln::profiler::Range step("step");      // a user range, nesting what runs inside it
//       ...
//     }
//     prof.stop();                                // ... to here (or the end of the scope)
//     prof.write_chrome_trace("trace.json");      // Perfetto / chrome://tracing
//     std::cout << prof.table();                  // the top ops by self time
//   }
//
// What is recorded while a Profiler is active:
// - every kernel call (every op reaches its loops through one kernel family, kiln/kernels/
//   dispatch.h): its name, its tensor operands' shapes and dtype, CPU wall time, and on CUDA the
//   device time between events recorded on the current stream around it;
// - every autograd node the backward runs (its name; the kernels it calls are attributed to it
//   and shown on the thread's backward track);
// - allocations and frees of tensor storage (bytes and device);
// - user ranges (Range), also from other threads (the DataLoader's workers name their tracks).
// Off by default, and then a kernel call pays one relaxed atomic load.
#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/core/device.h"

namespace kiln {
class Tensor;
}

namespace kiln::profiler {

enum class EventKind : uint8_t { Op, Node, Range, Memory };

struct Event {
  EventKind kind = EventKind::Op;
  std::string name;    // the kernel (op), autograd node, range, or "alloc" / "free"
  std::string shapes;  // Op: the tensor operands' sizes, "[128, 1, 28, 28], [32, 1, 3, 3]"
  std::string dtype;   // Op: the first tensor operand's dtype
  std::string node;    // Op: the autograd node whose backward called it ("" in the forward)
  Device device;
  int64_t start_ns = 0, end_ns = 0;  // since the profiler started (Memory: start == end)
  int64_t bytes = 0;                 // Memory: + allocated, - freed
  int thread = 0;                    // the recording thread's index (thread_names())
  bool backward = false;             // ran inside the autograd engine's backward
  double device_ms = -1;             // Op on CUDA: the time between its stream events
  double device_start_ms = -1;       // ... and when the first of them ran, from the profile's start

  int64_t duration_ns() const { return end_ns - start_ns; }
};

// One row of Profiler::key_averages(): every event of one name and kind together.
struct OpSummary {
  std::string name;
  EventKind kind = EventKind::Op;
  int64_t calls = 0;
  int64_t self_ns = 0;   // time not spent in events nested inside (on the same thread)
  int64_t total_ns = 0;  // wall time, nested events included
  double device_ms = 0;  // CUDA ops: their device time
};

struct ProfilerOptions {
  bool record_shapes = true;  // shapes and dtype of each op's tensor operands
  bool record_memory = true;  // allocations and frees
  bool cuda_events = true;    // device time of CUDA ops (events around each on its stream)
};

// Records while it exists (or until stop()). One Profiler at a time: a second one raises a
// kiln::Error.
class Profiler {
 public:
  explicit Profiler(ProfilerOptions options = {});
  ~Profiler();
  Profiler(const Profiler&) = delete;
  Profiler& operator=(const Profiler&) = delete;

  // Stops recording (waits for the CUDA work it timed); idempotent.
  void stop();

  const std::vector<Event>& events() const;  // sorted by start time (after stop())
  std::vector<std::string> thread_names() const;
  int64_t wall_ns() const;  // from start to stop

  // Per name, sorted by self time, largest first.
  std::vector<OpSummary> key_averages() const;
  // The top `rows` of key_averages() as a text table with each one's share of the wall time.
  std::string table(size_t rows = 25) const;
  // A Chrome trace (JSON): one track per thread and phase ("main", "main (backward)",
  // "loader worker 0", ...), ops nested in their nodes and ranges, CUDA device time on a track of
  // its own, memory as counters. Raises kiln::Error when the file cannot be written.
  void write_chrome_trace(const std::string& path) const;

 private:
  bool stopped_ = false;
  std::vector<Event> events_;
  std::vector<std::string> threads_;
  int64_t wall_ns_ = 0;
};

// A named span of time on the calling thread, shown in the trace and the table. Costs nothing
// while no Profiler is active.
class Range {
 public:
  explicit Range(const char* name);
  explicit Range(std::string name);
  ~Range();
  Range(const Range&) = delete;
  Range& operator=(const Range&) = delete;

 private:
  bool active_ = false;
  std::string name_;
  int64_t start_ = 0;
};

// Names the calling thread's track in traces (default: "main" for the first thread that
// records, "thread N" for others).
void set_thread_name(const std::string& name);

namespace detail {
extern std::atomic<bool> g_enabled;
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

// Around one kernel call (kernels/dispatch.h): add() each tensor operand, then the destructor
// records the event.
class OpScope {
 public:
  OpScope(const char* name, Device device);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;
  void add(const Tensor& t);
  void add(const std::vector<Tensor>& ts);
  template <typename T> void add(const T&) {}

 private:
  bool active_;
  Event event_;
  void* start_event_ = nullptr;  // CUDA
};

// Around one autograd node's backward (the autograd engine).
class NodeScope {
 public:
  explicit NodeScope(const std::string& name);
  ~NodeScope();
  NodeScope(const NodeScope&) = delete;
  NodeScope& operator=(const NodeScope&) = delete;

 private:
  bool active_;
  int64_t start_ = 0;
  const std::string* name_;
  const std::string* outer_node_ = nullptr;
  bool outer_backward_ = false;
};

// Storage allocations (+bytes) and frees (-bytes).
void record_memory(int64_t bytes, Device device);
}  // namespace detail

}  // namespace kiln::profiler
