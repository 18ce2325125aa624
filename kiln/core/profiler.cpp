// The profiler's recording, its summary table and its Chrome trace (kiln/core/profiler.h;
// docs/profiling.md).
#include "kiln/core/profiler.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "kiln/core/error.h"
#include "kiln/core/escape.h"
#include "kiln/core/tensor.h"
#include "kiln/config.h"

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include "kiln/cuda/cuda.h"
#endif

namespace kiln::profiler {

namespace detail {
std::atomic<bool> g_enabled{false};
}

namespace {

using Clock = std::chrono::steady_clock;

// A CUDA op's two timing events, resolved at stop().
struct PendingDeviceTime {
  size_t event;  // index into Session::events
  void* begin;
  void* end;
};

// What one active Profiler collects; guarded by mu.
struct Session {
  std::mutex mu;
  bool active = false;
  ProfilerOptions options;
  Clock::time_point start;
  std::vector<Event> events;
  std::vector<std::string> thread_names;
  std::vector<PendingDeviceTime> pending;
  void* device_origin = nullptr;  // a CUDA event recorded at the start
  int generation = 0;             // which session a thread's index belongs to
};

Session& session() {
  static auto* s = new Session();  // never destroyed: threads may record during exit
  return *s;
}

struct ThreadState {
  int generation = -1;
  int index = 0;
  std::string name;                   // set_thread_name before or during a session
  const std::string* node = nullptr;  // the autograd node running on this thread
  bool backward = false;
};
thread_local ThreadState t_state;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - session().start).count();
}

// This thread's index in the session (registered under the session's lock on first use).
int thread_index_locked(Session& s) {
  if (t_state.generation != s.generation) {
    t_state.generation = s.generation;
    t_state.index = static_cast<int>(s.thread_names.size());
    std::string name = t_state.name;
    if (name.empty()) name = s.thread_names.empty() ? "main" : "thread " + std::to_string(s.thread_names.size());
    s.thread_names.push_back(name);
  }
  return t_state.index;
}

constexpr size_t kDropped = ~size_t{0};

// Appends e (thread and phase filled in here); returns its index, or kDropped when the session
// ended while e was running.
size_t push(Event e) {
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.active) return kDropped;
  e.thread = thread_index_locked(s);
  e.backward = t_state.backward;
  s.events.push_back(std::move(e));
  return s.events.size() - 1;
}

#if KILN_WITH_CUDA
void* record_device_event(Device device) {
  cudaEvent_t ev = nullptr;
  if (cudaEventCreate(&ev) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  if (cudaEventRecord(ev, static_cast<cudaStream_t>(cuda::current_stream(device.index).handle)) != cudaSuccess) {
    cudaGetLastError();
    cudaEventDestroy(ev);
    return nullptr;
  }
  return ev;
}
double elapsed_ms(void* a, void* b) {
  float ms = -1;
  if (cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(a), static_cast<cudaEvent_t>(b)) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return ms;
}
void destroy_device_event(void* ev) {
  if (ev) cudaEventDestroy(static_cast<cudaEvent_t>(ev));
}
#else
void* record_device_event(Device) { return nullptr; }
[[maybe_unused]] double elapsed_ms(void*, void*) { return -1; }
void destroy_device_event(void*) {}
#endif

bool device_timing(Device device) {
  return device.is_cuda() && session().options.cuda_events && session().device_origin != nullptr;
}

std::string shape_text(const Tensor& t) {
  std::string s = "[";
  const auto& sizes = t.sizes();
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

}  // namespace

// ---------------------------------------------------------------- recording

Profiler::Profiler(ProfilerOptions options) {
  Session& s = session();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    KILN_CHECK(!s.active, "profiler: another Profiler is already recording (one at a time)");
    s.active = true;
    s.options = options;
    s.events.clear();
    s.thread_names.clear();
    s.pending.clear();
    ++s.generation;
    s.start = Clock::now();
    s.device_origin = nullptr;
#if KILN_WITH_CUDA
    if (options.cuda_events && cuda::is_available())
      s.device_origin = record_device_event(Device::cuda(cuda::current_device()));
#endif
    thread_index_locked(s);  // the thread that profiles is the first track
  }
  detail::g_enabled.store(true, std::memory_order_release);
}

Profiler::~Profiler() {
  try {
    stop();
  } catch (...) {  // a destructor must not throw; stop() only fails on a broken CUDA context
  }
}

void Profiler::stop() {
  if (stopped_) return;
  stopped_ = true;
  detail::g_enabled.store(false, std::memory_order_release);
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  wall_ns_ = now_ns();
#if KILN_WITH_CUDA
  if (s.device_origin) {
    if (cudaDeviceSynchronize() != cudaSuccess) cudaGetLastError();
    for (const auto& p : s.pending) {
      Event& e = s.events[p.event];
      e.device_ms = elapsed_ms(p.begin, p.end);
      e.device_start_ms = elapsed_ms(s.device_origin, p.begin);
    }
  }
#endif
  for (const auto& p : s.pending) {
    destroy_device_event(p.begin);
    destroy_device_event(p.end);
  }
  destroy_device_event(s.device_origin);
  s.device_origin = nullptr;
  s.pending.clear();
  events_ = std::move(s.events);
  threads_ = std::move(s.thread_names);
  s.events.clear();
  s.thread_names.clear();
  s.active = false;
  std::stable_sort(events_.begin(), events_.end(), [](const Event& a, const Event& b) {
    return a.start_ns != b.start_ns ? a.start_ns < b.start_ns : a.end_ns > b.end_ns;  // parents first
  });
}

const std::vector<Event>& Profiler::events() const { return events_; }
std::vector<std::string> Profiler::thread_names() const { return threads_; }
int64_t Profiler::wall_ns() const { return wall_ns_; }

Range::Range(const char* name) : Range(std::string(name)) {}
Range::Range(std::string name) : active_(detail::enabled()) {
  if (!active_) return;
  name_ = std::move(name);
  start_ = now_ns();
}
Range::~Range() {
  if (!active_ || !detail::enabled()) return;
  Event e;
  e.kind = EventKind::Range;
  e.name = std::move(name_);
  e.start_ns = start_;
  e.end_ns = now_ns();
  push(std::move(e));
}

void set_thread_name(const std::string& name) {
  t_state.name = name;
  Session& s = session();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.active && t_state.generation == s.generation) s.thread_names[static_cast<size_t>(t_state.index)] = name;
}

namespace detail {

OpScope::OpScope(const char* name, Device device) : active_(enabled()) {
  if (!active_) return;
  event_.kind = EventKind::Op;
  event_.name = name;
  event_.device = device;
  if (t_state.node) event_.node = *t_state.node;
  if (device_timing(device)) start_event_ = record_device_event(device);
  event_.start_ns = now_ns();
}

void OpScope::add(const Tensor& t) {
  if (!active_ || !t.defined() || !session().options.record_shapes) return;
  if (!event_.shapes.empty()) event_.shapes += ", ";
  event_.shapes += shape_text(t);
  if (event_.dtype.empty()) event_.dtype = dtype_name(t.dtype());
}

void OpScope::add(const std::vector<Tensor>& ts) {
  for (const Tensor& t : ts) add(t);
}

OpScope::~OpScope() {
  if (!active_ || !enabled()) {
    destroy_device_event(start_event_);
    return;
  }
  event_.end_ns = now_ns();
  void* end_event = start_event_ ? record_device_event(event_.device) : nullptr;
  const size_t at = push(std::move(event_));
  Session& s = session();
  std::unique_lock<std::mutex> lock(s.mu);
  if (start_event_ && end_event && at != kDropped && s.active) {
    s.pending.push_back({at, start_event_, end_event});
  } else {
    lock.unlock();
    destroy_device_event(start_event_);
    destroy_device_event(end_event);
  }
}

NodeScope::NodeScope(const std::string& name) : active_(enabled()), name_(&name) {
  outer_node_ = t_state.node;
  outer_backward_ = t_state.backward;
  t_state.node = &name;
  t_state.backward = true;
  if (active_) start_ = now_ns();
}

NodeScope::~NodeScope() {
  if (active_ && enabled()) {
    Event e;
    e.kind = EventKind::Node;
    e.name = *name_;
    e.start_ns = start_;
    e.end_ns = now_ns();
    push(std::move(e));
  }
  t_state.node = outer_node_;
  t_state.backward = outer_backward_;
}

void record_memory(int64_t bytes, Device device) {
  if (!enabled() || !session().options.record_memory) return;
  Event e;
  e.kind = EventKind::Memory;
  e.name = bytes >= 0 ? "alloc" : "free";
  e.bytes = bytes;
  e.device = device;
  e.start_ns = e.end_ns = now_ns();
  push(std::move(e));
}

}  // namespace detail

// ---------------------------------------------------------------- summaries

std::vector<OpSummary> Profiler::key_averages() const {
  // Self time: each event's duration less that of the events directly inside it on its thread
  // (events_ is sorted by start, parents first).
  std::vector<int64_t> child_ns(events_.size(), 0);
  std::map<int, std::vector<size_t>> open;  // per thread, the stack of enclosing events
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    if (e.kind == EventKind::Memory) continue;
    auto& stack = open[e.thread];
    while (!stack.empty() && events_[stack.back()].end_ns <= e.start_ns) stack.pop_back();
    if (!stack.empty()) child_ns[stack.back()] += e.duration_ns();
    stack.push_back(i);
  }
  std::map<std::pair<int, std::string>, OpSummary> by_name;
  for (size_t i = 0; i < events_.size(); ++i) {
    const Event& e = events_[i];
    if (e.kind == EventKind::Memory) continue;
    OpSummary& s = by_name[{static_cast<int>(e.kind), e.name}];
    s.name = e.name;
    s.kind = e.kind;
    ++s.calls;
    s.total_ns += e.duration_ns();
    s.self_ns += std::max<int64_t>(e.duration_ns() - child_ns[i], 0);
    if (e.device_ms > 0) s.device_ms += e.device_ms;
  }
  std::vector<OpSummary> rows;
  for (auto& [key, s] : by_name) rows.push_back(s);
  std::stable_sort(rows.begin(), rows.end(),
                   [](const OpSummary& a, const OpSummary& b) { return a.self_ns > b.self_ns; });
  return rows;
}

std::string Profiler::table(size_t rows) const {
  const auto all = key_averages();
  bool device = false;
  for (const auto& r : all) device = device || r.device_ms > 0;
  const double wall = std::max<double>(static_cast<double>(wall_ns_), 1.0);
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  const char* kinds[] = {"op", "node", "range", "memory"};
  std::ostringstream out;
  char line[320];
  std::snprintf(line, sizeof line, "%-40s %-5s %8s %11s %7s %11s %7s%s\n", "name", "kind", "calls", "self ms", "self %",
                "total ms", "total %", device ? "   CUDA ms" : "");
  out << line << std::string(device ? 104 : 94, '-') << "\n";
  for (size_t i = 0; i < std::min(rows, all.size()); ++i) {
    const auto& r = all[i];
    std::string name = r.name.size() > 40 ? r.name.substr(0, 37) + "..." : r.name;
    std::snprintf(line, sizeof line, "%-40s %-5s %8lld %11.3f %6.1f%% %11.3f %6.1f%%", name.c_str(),
                  kinds[static_cast<int>(r.kind)], static_cast<long long>(r.calls), ms(r.self_ns),
                  100.0 * static_cast<double>(r.self_ns) / wall, ms(r.total_ns),
                  100.0 * static_cast<double>(r.total_ns) / wall);
    out << line;
    if (device) {
      std::snprintf(line, sizeof line, " %10.3f", r.device_ms);
      out << line;
    }
    out << "\n";
  }
  std::snprintf(line, sizeof line, "wall time %.3f ms, %zu events, %zu of %zu names shown (%% of the wall time)\n",
                ms(wall_ns_), events_.size(), std::min(rows, all.size()), all.size());
  out << line;
  return out.str();
}

// ---------------------------------------------------------------- Chrome trace

namespace {

// s as a quoted JSON string.
std::string json_string(const std::string& s) { return "\"" + ::kiln::detail::json_escape(s) + "\""; }

// Track ids: thread i's forward track is 2 i, its backward track 2 i + 1; device tracks after.
constexpr int kDeviceTrack = 1000000;

std::string us(int64_t ns) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(ns) / 1e3);
  return buf;
}

}  // namespace

void Profiler::write_chrome_trace(const std::string& path) const {
  std::ofstream f(path);
  KILN_CHECK(f.good(), "profiler: cannot write the trace to ", path);
  const char* cats[] = {"op", "node", "range", "memory"};
  f << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto sep = [&]() -> std::ofstream& {
    if (!first) f << ",\n";
    first = false;
    return f;
  };
  auto name_track = [&](int tid, const std::string& name) {
    sep() << "{\"ph\": \"M\", \"pid\": 1, \"tid\": " << tid
          << ", \"name\": \"thread_name\", \"args\": {\"name\": " << json_string(name) << "}}";
    sep() << "{\"ph\": \"M\", \"pid\": 1, \"tid\": " << tid
          << ", \"name\": \"thread_sort_index\", \"args\": {\"sort_index\": " << tid << "}}";
  };
  sep() << "{\"ph\": \"M\", \"pid\": 1, \"name\": \"process_name\", \"args\": {\"name\": \"kiln\"}}";
  for (size_t t = 0; t < threads_.size(); ++t) {
    name_track(static_cast<int>(2 * t), threads_[t]);
    name_track(static_cast<int>(2 * t + 1), threads_[t] + " (backward)");
  }
  std::map<int, bool> device_tracks;
  std::map<std::string, int64_t> in_use;  // bytes allocated since the start, per device
  for (const Event& e : events_) {
    if (e.kind == EventKind::Memory) {
      const std::string dev = e.device.str();
      in_use[dev] += e.bytes;
      sep() << "{\"ph\": \"C\", \"pid\": 1, \"name\": " << json_string("memory " + dev)
            << ", \"ts\": " << us(e.start_ns)
            << ", \"args\": {\"MB allocated since the start\": " << static_cast<double>(in_use[dev]) / 1e6 << "}}";
      continue;
    }
    const int tid = 2 * e.thread + (e.backward ? 1 : 0);
    sep() << "{\"ph\": \"X\", \"pid\": 1, \"tid\": " << tid << ", \"cat\": \"" << cats[static_cast<int>(e.kind)]
          << "\", \"name\": " << json_string(e.name) << ", \"ts\": " << us(e.start_ns)
          << ", \"dur\": " << us(e.duration_ns());
    if (e.kind == EventKind::Op) {
      f << ", \"args\": {\"device\": " << json_string(e.device.str());
      if (!e.shapes.empty()) f << ", \"shapes\": " << json_string(e.shapes) << ", \"dtype\": " << json_string(e.dtype);
      if (!e.node.empty()) f << ", \"autograd node\": " << json_string(e.node);
      if (e.device_ms >= 0) f << ", \"device ms\": " << e.device_ms;
      f << "}";
    }
    f << "}";
    if (e.device_ms >= 0 && e.device_start_ms >= 0) {  // the device's own time line, from the start
      const int dtid = kDeviceTrack + e.device.index;
      if (!device_tracks[dtid]) {
        device_tracks[dtid] = true;
        name_track(dtid, e.device.str() + " (device time)");
      }
      sep() << "{\"ph\": \"X\", \"pid\": 1, \"tid\": " << dtid
            << ", \"cat\": \"device\", \"name\": " << json_string(e.name) << ", \"ts\": " << e.device_start_ms * 1e3
            << ", \"dur\": " << e.device_ms * 1e3 << "}";
    }
  }
  f << "\n]}\n";
  f.close();
  KILN_CHECK(!f.fail(), "profiler: writing the trace to ", path, " failed");
}

}  // namespace kiln::profiler
