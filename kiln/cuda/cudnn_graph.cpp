// The runtime half of kiln/cuda/cudnn_graph.h: the one translation unit that includes
// cudnn-frontend. Per call: look the graph up by its key (building it once: validate, operation
// graph, heuristics' plans, support check, plans; a refusal is remembered as well), take a cuDNN
// handle of the device from a pool and point it at the caller's stream, take a workspace from
// kiln's caching allocator, execute. Compiled in every build; empty without the frontend.
#include "kiln/config.h"

#if KILN_WITH_CUDNN_FRONTEND

#include "kiln/cuda/cudnn_graph.h"

#include <cuda_runtime.h>
#include <cudnn.h>
#include <cudnn_frontend.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/core/tensor.h"
#include "kiln/cuda/check.h"
#include "kiln/cuda/cudnn.h"

namespace kiln::cudnn::graph {

namespace {

namespace fe = cudnn_frontend;

constexpr int kMaxDevices = 64;

// Tensor uids of the graphs' operands (the variant packs name tensors by them).
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kScale, kDO, kDQ, kDK, kDV };

std::string shapes_text(const SdpaOperand* ops, const char* const* names, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    s += ::kiln::detail::concat(i ? ", " : "", names[i], " [", ops[i].size[0], ", ", ops[i].size[1], ", ",
                                ops[i].size[2], ", ", ops[i].size[3], "] strides [", ops[i].stride[0], ", ",
                                ops[i].stride[1], ", ", ops[i].stride[2], ", ", ops[i].stride[3], "]");
  }
  return s;
}

std::string status_text(cudnnStatus_t st) {
  std::string s = cudnnGetErrorString(st);
  char buf[512] = {0};
  cudnnGetLastErrorString(buf, sizeof(buf));
  if (buf[0]) s += ::kiln::detail::concat(" (", buf, ")");
  return s;
}

#define KILN_CUDNN_GRAPH_CHECK(call, what)                                                                             \
  do {                                                                                                                 \
    cudnnStatus_t kiln_st_ = (call);                                                                                   \
    if (kiln_st_ != CUDNN_STATUS_SUCCESS)                                                                              \
      throw ::kiln::Error(::kiln::detail::concat(what, ": ", #call, ": ", status_text(kiln_st_)), __FILE__, __LINE__); \
  } while (0)

// ------------------------------------------------------------------------------- handles

// cuDNN handles belong to the device current at creation and serve one thread at a time: a
// per-device pool lends one per call. Never destroyed (calls may run during static teardown).
class HandlePool {
 public:
  static HandlePool& get() {
    static HandlePool* p = new HandlePool();
    return *p;
  }
  cudnnHandle_t acquire(int device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto& v = free_[device];
      if (!v.empty()) {
        cudnnHandle_t h = v.back();
        v.pop_back();
        return h;
      }
    }
    cudnnHandle_t h = nullptr;
    KILN_CUDNN_GRAPH_CHECK(cudnnCreate(&h), "scaled_dot_product_attention (cuDNN)");  // device is current
    return h;
  }
  void release(int device, cudnnHandle_t h) {
    std::lock_guard<std::mutex> lock(mu_);
    free_[device].push_back(h);
  }

 private:
  std::mutex mu_;
  std::vector<cudnnHandle_t> free_[kMaxDevices];
};

struct Handle {
  int device;
  cudnnHandle_t h;
  Handle(int dev, void* stream, const char* op) : device(dev), h(HandlePool::get().acquire(dev)) {
    const cudnnStatus_t st = cudnnSetStream(h, static_cast<cudaStream_t>(stream));
    if (st != CUDNN_STATUS_SUCCESS) {
      HandlePool::get().release(device, h);
      KILN_CUDNN_GRAPH_CHECK(st, op);
    }
  }
  ~Handle() { HandlePool::get().release(device, h); }
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
};

// --------------------------------------------------------------------------- graph cache

// A built graph, or the refusal of its case. `mu` serialises executions of one graph.
struct Entry {
  std::shared_ptr<fe::graph::Graph> graph;
  int64_t workspace = 0;
  std::string refusal;  // non-empty: cuDNN does not take this case
  std::mutex mu;
};

class GraphCache {
 public:
  static GraphCache& get() {
    static GraphCache* c = new GraphCache();  // never destroyed, as the handle pool
    return *c;
  }
  std::shared_ptr<Entry> find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    return it == map_.end() ? nullptr : it->second;
  }
  // Keeps the first entry stored under `key` (two threads may build the same graph).
  std::shared_ptr<Entry> store(const std::string& key, std::shared_ptr<Entry> e) {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.emplace(key, std::move(e)).first->second;
  }

 private:
  std::mutex mu_;
  std::unordered_map<std::string, std::shared_ptr<Entry>> map_;
};

fe::DataType_t fe_dtype(DType dt) { return dt == DType::BF16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF; }

std::vector<int64_t> dims(const SdpaOperand& o) { return {o.size[0], o.size[1], o.size[2], o.size[3]}; }
std::vector<int64_t> strides(const SdpaOperand& o) { return {o.stride[0], o.stride[1], o.stride[2], o.stride[3]}; }

std::shared_ptr<fe::graph::Tensor_attributes> input(fe::graph::Graph& g, const char* name, int64_t uid,
                                                    const SdpaOperand& o) {
  return g.tensor(fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims(o)).set_stride(strides(o)));
}

void output(const std::shared_ptr<fe::graph::Tensor_attributes>& t, int64_t uid, const SdpaOperand& o) {
  t->set_output(true).set_uid(uid).set_dim(dims(o)).set_stride(strides(o));
}

std::shared_ptr<fe::graph::Tensor_attributes> scale_tensor(fe::graph::Graph& g) {
  return g.tensor(fe::graph::Tensor_attributes()
                      .set_name("attn_scale")
                      .set_uid(kScale)
                      .set_dim({1, 1, 1, 1})
                      .set_stride({1, 1, 1, 1})
                      .set_is_pass_by_value(true)
                      .set_data_type(fe::DataType_t::FLOAT));
}

template <class Attributes> void set_causal(Attributes& a, bool causal) {
  if (!causal) return;
  a.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
}

std::shared_ptr<fe::graph::Graph> new_graph(DType dt) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe_dtype(dt))
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

// Builds `g` for the handle's device; the refusal text when cuDNN does not take it.
std::string build(fe::graph::Graph& g, cudnnHandle_t h, int64_t* workspace) {
  auto step = [](const char* what, fe::error_object e) {
    return e.is_good() ? std::string() : ::kiln::detail::concat(what, ": ", e.get_message());
  };
  std::string why = step("validate", g.validate());
  if (why.empty()) why = step("build_operation_graph", g.build_operation_graph(h));
  if (why.empty()) why = step("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}));
  if (why.empty()) why = step("check_support", g.check_support(h));
  if (why.empty()) why = step("build_plans", g.build_plans(h));
  if (why.empty()) why = step("get_workspace_size", g.get_workspace_size(*workspace));
  return why;
}

// The cached entry for `key`, built by `make` (which returns the graph to build) on a miss.
template <class Make>
std::shared_ptr<Entry> entry_for(const std::string& key, const Handle& h, const std::string& what, Make&& make) {
  if (auto e = GraphCache::get().find(key)) return e;
  auto e = std::make_shared<Entry>();
  e->graph = make();
  const std::string why = build(*e->graph, h.h, &e->workspace);
  if (!why.empty()) {
    e->graph.reset();
    e->refusal = ::kiln::detail::concat(what, ": ", why);
    detail::set_sdpa_last_refusal(e->refusal);
    detail::count_sdpa(detail::SdpaEvent::Refused);
  } else {
    detail::count_sdpa(detail::SdpaEvent::GraphBuilt);
  }
  return GraphCache::get().store(key, std::move(e));
}

void execute(Entry& e, const Handle& h, int device, std::unordered_map<int64_t, void*>& pack, const char* op,
             const std::string& shapes) {
  Tensor ws;
  if (e.workspace > 0) ws = empty({e.workspace}, TensorOptions().dtype(DType::U8).device(Device::cuda(device)));
  std::lock_guard<std::mutex> lock(e.mu);
  fe::error_object r = e.graph->execute(h.h, pack, ws.defined() ? ws.data_ptr() : nullptr);
  KILN_CHECK(r.is_good(), op, ": cuDNN failed to execute the graph for ", shapes, ": ", r.get_message());
  KILN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

int device_sm(int device) {
  static std::atomic<int> cache[kMaxDevices] = {};
  KILN_CHECK(device >= 0 && device < kMaxDevices, "cuDNN attention: device index ", device, " out of range");
  int sm = cache[device].load();
  if (sm > 0) return sm;
  int major = 0, minor = 0;
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  KILN_CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
  sm = major * 10 + minor;
  cache[device] = sm;
  return sm;
}

bool sdpa_forward(const SdpaForwardArgs& a) {
  const char* op = "scaled_dot_product_attention (cuDNN)";
  KILN_CHECK(a.device >= 0 && a.device < kMaxDevices, op, ": device index ", a.device, " out of range");
  const SdpaOperand ops[4] = {a.q, a.k, a.v, a.out};
  const char* names[4] = {"q", "k", "v", "out"};
  const std::string shapes =
      ::kiln::detail::concat(shapes_text(ops, names, 4), ", ", dtype_name(a.dtype), a.causal ? ", causal" : "");
  const std::string key = sdpa_graph_key(SdpaOp::Forward, a.dtype, a.causal, false, a.device, ops, 4);
  Handle h(a.device, a.stream, op);
  auto e = entry_for(key, h, ::kiln::detail::concat(op, " for ", shapes), [&] {
    auto g = new_graph(a.dtype);
    auto Q = input(*g, "Q", kQ, a.q), K = input(*g, "K", kK, a.k), V = input(*g, "V", kV, a.v);
    auto opts = fe::graph::SDPA_attributes().set_name("sdpa").set_generate_stats(true).set_attn_scale(scale_tensor(*g));
    set_causal(opts, a.causal);
    auto [O, stats] = g->sdpa(Q, K, V, opts);
    output(O, kO, a.out);
    const int64_t B = a.q.size[0], H = a.q.size[1], T = a.q.size[2];
    stats->set_output(true)
        .set_uid(kStats)
        .set_data_type(fe::DataType_t::FLOAT)
        .set_dim({B, H, T, 1})
        .set_stride({H * T, T, 1, 1});
    return g;
  });
  if (!e->graph) return false;
  float scale = static_cast<float>(a.scale);
  std::unordered_map<int64_t, void*> pack = {{kQ, const_cast<void*>(a.q.data)},
                                             {kK, const_cast<void*>(a.k.data)},
                                             {kV, const_cast<void*>(a.v.data)},
                                             {kO, const_cast<void*>(a.out.data)},
                                             {kStats, a.stats},
                                             {kScale, &scale}};
  execute(*e, h, a.device, pack, op, shapes);
  detail::count_sdpa(detail::SdpaEvent::CudnnForward);
  return true;
}

bool sdpa_backward(const SdpaBackwardArgs& a) {
  const char* op = "scaled_dot_product_attention_backward (cuDNN)";
  KILN_CHECK(a.device >= 0 && a.device < kMaxDevices, op, ": device index ", a.device, " out of range");
  const SdpaOperand ops[8] = {a.q, a.k, a.v, a.out, a.dout, a.dq, a.dk, a.dv};
  const char* names[8] = {"q", "k", "v", "out", "g", "dq", "dk", "dv"};
  const std::string shapes =
      ::kiln::detail::concat(shapes_text(ops, names, 8), ", ", dtype_name(a.dtype), a.causal ? ", causal" : "",
                             a.deterministic ? ", deterministic" : "");
  const std::string key = sdpa_graph_key(SdpaOp::Backward, a.dtype, a.causal, a.deterministic, a.device, ops, 8);
  Handle h(a.device, a.stream, op);
  auto e = entry_for(key, h, ::kiln::detail::concat(op, " for ", shapes), [&] {
    auto g = new_graph(a.dtype);
    auto Q = input(*g, "Q", kQ, a.q), K = input(*g, "K", kK, a.k), V = input(*g, "V", kV, a.v);
    auto O = input(*g, "O", kO, a.out), dO = input(*g, "dO", kDO, a.dout);
    const int64_t B = a.q.size[0], H = a.q.size[1], T = a.q.size[2];
    auto stats = g->tensor(fe::graph::Tensor_attributes()
                               .set_name("stats")
                               .set_uid(kStats)
                               .set_dim({B, H, T, 1})
                               .set_stride({H * T, T, 1, 1})
                               .set_data_type(fe::DataType_t::FLOAT));
    auto opts = fe::graph::SDPA_backward_attributes()
                    .set_name("sdpa_backward")
                    .set_attn_scale(scale_tensor(*g))
                    .set_deterministic_algorithm(a.deterministic);
    set_causal(opts, a.causal);
    auto [dQ, dK, dV] = g->sdpa_backward(Q, K, V, O, dO, stats, opts);
    output(dQ, kDQ, a.dq);
    output(dK, kDK, a.dk);
    output(dV, kDV, a.dv);
    return g;
  });
  if (!e->graph) return false;
  float scale = static_cast<float>(a.scale);
  std::unordered_map<int64_t, void*> pack = {
      {kQ, const_cast<void*>(a.q.data)},     {kK, const_cast<void*>(a.k.data)},
      {kV, const_cast<void*>(a.v.data)},     {kO, const_cast<void*>(a.out.data)},
      {kDO, const_cast<void*>(a.dout.data)}, {kStats, const_cast<float*>(a.stats)},
      {kDQ, const_cast<void*>(a.dq.data)},   {kDK, const_cast<void*>(a.dk.data)},
      {kDV, const_cast<void*>(a.dv.data)},   {kScale, &scale}};
  execute(*e, h, a.device, pack, op, shapes);
  detail::count_sdpa(detail::SdpaEvent::CudnnBackward);
  return true;
}

}  // namespace kiln::cudnn::graph

#endif  // KILN_WITH_CUDNN_FRONTEND
