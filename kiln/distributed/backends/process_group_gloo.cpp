// The "gloo" process group: CPU tensors over Gloo's TCP transport (docs/distributed.md, "Gloo"),
// and CUDA tensors staged through pinned host buffers (host_staging.h), so that several ranks can
// share one GPU.
//
// Collectives run in issue order on one worker thread per group, so the caller's thread (the
// backward pass, for DDP) keeps computing while the bytes move. Gloo's own timeout bounds every
// operation, a peer that dies closes its sockets and fails the operation at once, and the first
// failure breaks the group: every later collective fails with an Error that names the first.
#include "kiln/config.h"
#include "kiln/distributed/backends/process_group.h"

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <sstream>
#include <thread>

#include "kiln/core/error.h"

#if KILN_WITH_GLOO
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>
#include <signal.h>
#include <unistd.h>

#include "kiln/distributed/store/gloo_store.h"
#include "kiln/distributed/backends/host_staging.h"
#include "kiln/distributed/store/parse_int.h"
#include "kiln/distributed/store/store.h"
#endif

namespace kiln::distributed {

#if !KILN_WITH_GLOO

bool gloo_available() { return false; }

void check_gloo_environment() {}

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store>, int, int, const ProcessGroupOptions&) {
  KILN_FAIL(
      "init_process_group: kiln was built without Gloo, so the \"gloo\" backend (CPU "
      "tensors) is not available; install libgloo-dev and rebuild (docs/distributed.md)");
}

#else

bool gloo_available() { return true; }

namespace {

// Elementwise reductions in the type's arithmetic type (float for f16/bf16). Max and Min
// propagate NaN, as PyTorch's reductions do.
struct SumOp {
  template <class T> T operator()(T a, T b) const { return a + b; }
};
struct ProductOp {
  template <class T> T operator()(T a, T b) const { return a * b; }
};
struct MaxOp {
  template <class T> T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return a < b ? b : a;
  }
};
struct MinOp {
  template <class T> T operator()(T a, T b) const {
    if (a != a) return a;
    if (b != b) return b;
    return b < a ? b : a;
  }
};

template <class T, class Op> void reduce_elements(void* out, const void* a, const void* b, size_t n) {
  using M = opmath_t<T>;
  auto* o = static_cast<T*>(out);
  auto* x = static_cast<const T*>(a);
  auto* y = static_cast<const T*>(b);
  for (size_t i = 0; i < n; ++i) o[i] = T(Op{}(M(x[i]), M(y[i])));
}

template <class T>::gloo::AllreduceOptions::Func reduce_function(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return &reduce_elements<T, SumOp>;  // Avg divides afterwards
    case ReduceOp::Product: return &reduce_elements<T, ProductOp>;
    case ReduceOp::Max: return &reduce_elements<T, MaxOp>;
    case ReduceOp::Min: return &reduce_elements<T, MinOp>;
  }
  return nullptr;
}

// Avg = Sum / size, in the tensor's arithmetic type.
template <class T> void divide_elements(void* data, size_t n, int size) {
  using M = opmath_t<T>;
  auto* p = static_cast<T*>(data);
  for (size_t i = 0; i < n; ++i) p[i] = T(M(p[i]) / M(size));
}

// Gloo's ring all-reduce pipelines a large buffer in segments of at most this many bytes, two in
// flight. Gloo's own default (1 MiB) makes many small writes on a socket its event loop reads
// from at the same time; with 4 MiB, 16 MB all-reduces of 2 ranks on loopback ran 1.29x faster
// (docs/distributed.md, "What is measured"). KILN_GLOO_SEGMENT_BYTES overrides it (A/B runs);
// every rank must use the same value, which the group checks.
constexpr long long kSegmentBytes = 4ll << 20;

long long segment_bytes_from_env() {
  const char* v = std::getenv("KILN_GLOO_SEGMENT_BYTES");
  if (!v || !*v) return kSegmentBytes;
  const auto n = parse_int(v);
  KILN_CHECK(n && *n >= 1024,
             "KILN_GLOO_SEGMENT_BYTES must be a whole number of bytes, at least "
             "1024, got '",
             v, "'");
  return *n;
}

// Which address the other ranks reach this one at: GLOO_SOCKET_IFNAME (an interface, as in
// PyTorch), else loopback when the job is on loopback, else this host's name.
::gloo::transport::tcp::attr device_attr() {
  ::gloo::transport::tcp::attr attr;
  if (const char* iface = std::getenv("GLOO_SOCKET_IFNAME"); iface && *iface) {
    attr.iface = iface;
    return attr;
  }
  const char* master = std::getenv("MASTER_ADDR");
  std::string m = master ? master : "127.0.0.1";
  if (m.empty() || m == "localhost" || m.rfind("127.", 0) == 0) {
    attr.hostname = "127.0.0.1";
  } else {
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    attr.hostname = host;
  }
  return attr;
}

// Gloo writes to its sockets without MSG_NOSIGNAL: a peer that died would kill this process with
// SIGPIPE instead of failing the collective with an error. Ignored only where nobody installed a
// handler (a write to a closed pipe then fails with EPIPE instead).
void ignore_sigpipe() {
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
}

class GlooProcessGroup;

class GlooWork final : public Work {
 public:
  GlooWork(std::string description, std::weak_ptr<GlooProcessGroup> group, std::chrono::milliseconds timeout)
      : Work(std::move(description)), group_(std::move(group)), timeout_(timeout) {}

 protected:
  void on_timeout() override;
  std::chrono::milliseconds default_timeout() const override {
    // A little beyond Gloo's own timeout, so Gloo's error (naming the operation) wins.
    return timeout_ + std::chrono::seconds(5);
  }

 private:
  std::weak_ptr<GlooProcessGroup> group_;
  std::chrono::milliseconds timeout_;
};

class GlooProcessGroup final : public ProcessGroup, public std::enable_shared_from_this<GlooProcessGroup> {
 public:
  GlooProcessGroup(std::shared_ptr<Store> store, int rank, int size, const ProcessGroupOptions& options)
      : ProcessGroup(rank, size),
        store_(std::move(store)),
        timeout_(options.timeout),
        exited_ranks_(options.exited_ranks),
        segment_bytes_(segment_bytes_from_env()) {
    KILN_CHECK(size >= 1 && rank >= 0 && rank < size, "gloo process group: rank ", rank, " is outside a group of ",
               size);
    ignore_sigpipe();
    auto device = ::gloo::transport::tcp::CreateDevice(device_attr());
    context_ = std::make_shared< ::gloo::rendezvous::Context>(rank, size);
    context_->setTimeout(timeout_);
    GlooStoreAdapter adapter(store_);
    try {
      context_->connectFullMesh(adapter, device);
    } catch (const kiln::Error& e) {
      KILN_FAIL("gloo process group: rank ", rank, " of ", size, " could not connect to its peers: ", e.what());
    } catch (const std::exception& e) {
      KILN_FAIL("gloo process group: rank ", rank, " of ", size, " could not connect to its peers: ", e.what());
    }
    learn_peer_addresses();
    check_same_segment_bytes();
    worker_ = std::thread([this] { run_worker(); });
  }

  ~GlooProcessGroup() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (worker_.joinable()) worker_.join();
  }

  std::string backend_name() const override { return "gloo"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> all_reduce(std::vector<Tensor> tensors, ReduceOp op) override {
    check_collective_tensors("all_reduce", tensors, device_type_of(tensors), "gloo");
    const DType dtype = tensors[0].dtype();
    check_reduce_op("all_reduce", op, dtype);
    auto staging = stage(tensors);
    return enqueue("all_reduce", std::string("(") + reduce_op_name(op) + ") " + describe_tensors(tensors),
                   [this, staging, op, dtype](uint32_t tag) {
                     staging->to_host();
                     const std::vector<Tensor>& tensors = staging->host();
                     // A list is one operation on a packed buffer (fewer rounds of messages than one each).
                     const bool packed = tensors.size() > 1;
                     size_t bytes = 0;
                     for (const auto& t : tensors) bytes += t.nbytes();
                     std::vector<uint8_t> flat;
                     uint8_t* data = static_cast<uint8_t*>(tensors[0].data_ptr());
                     if (packed) {
                       flat.resize(bytes);
                       size_t at = 0;
                       for (const auto& t : tensors) {
                         std::memcpy(flat.data() + at, t.data_ptr(), t.nbytes());
                         at += t.nbytes();
                       }
                       data = flat.data();
                     }
                     const size_t n = bytes / element_size(dtype);
                     if (n == 0) return;  // every rank has the same sizes: nothing to exchange
                     dispatch_numeric(dtype, "all_reduce", [&](auto tag_type) {
                       using T = typename decltype(tag_type)::type;
                       all_reduce_in_place(reinterpret_cast<T*>(data), n, op, tag);
                       if (op == ReduceOp::Avg) divide_elements<T>(data, n, size());
                     });
                     if (packed) {
                       size_t at = 0;
                       for (const auto& t : tensors) {
                         std::memcpy(t.data_ptr(), flat.data() + at, t.nbytes());
                         at += t.nbytes();
                       }
                     }
                     staging->to_device();
                   });
  }

  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root) override {
    check_collective_tensors("broadcast", tensors, device_type_of(tensors), "gloo");
    check_root("broadcast", root);
    auto staging = stage(tensors);
    return enqueue("broadcast", "(root " + std::to_string(root) + ") " + describe_tensors(tensors),
                   [this, staging, root](uint32_t tag) {
                     staging->to_host();
                     for (const auto& t : staging->host()) {
                       if (t.numel() == 0) continue;
                       ::gloo::BroadcastOptions opts(context_);
                       opts.setOutput(static_cast<uint8_t*>(t.data_ptr()), t.nbytes());
                       opts.setRoot(root);
                       opts.setTag(tag);
                       opts.setTimeout(timeout_);
                       ::gloo::broadcast(opts);
                     }
                     staging->to_device();
                   });
  }

  std::shared_ptr<Work> all_gather(std::vector<Tensor> outputs, Tensor input) override {
    check_collective_tensors("all_gather", {input}, device_type_of({input}), "gloo");
    check_one_per_rank("all_gather", outputs, "output", input, "input");
    auto in = stage({input}), out = stage(outputs);
    return enqueue("all_gather", describe_tensors({input}), [this, in, out](uint32_t tag) {
      in->to_host();
      const Tensor& input = in->host()[0];
      std::vector<uint8_t> flat(input.nbytes() * size());
      gather_bytes(flat.data(), input, tag);
      for (size_t r = 0; r < out->host().size(); ++r)
        std::memcpy(out->host()[r].data_ptr(), flat.data() + r * input.nbytes(), input.nbytes());
      out->to_device();
    });
  }

  std::shared_ptr<Work> all_gather_into_tensor(Tensor output, Tensor input) override {
    check_collective_tensors("all_gather_into_tensor", {output, input}, device_type_of({input}), "gloo");
    KILN_CHECK(output.numel() == input.numel() * size(),
               "all_gather_into_tensor: the output "
               "needs world_size x ",
               input.numel(), " = ", input.numel() * size(), " elements, got ", output.numel());
    auto in = stage({input}), out = stage({output});
    return enqueue("all_gather_into_tensor", describe_tensors({input}), [this, in, out](uint32_t tag) {
      in->to_host();
      gather_bytes(static_cast<uint8_t*>(out->host()[0].data_ptr()), in->host()[0], tag);
      out->to_device();
    });
  }

  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) override {
    check_one_per_rank("reduce_scatter", inputs, "input", output, "output");
    check_reduce_op("reduce_scatter", op, output.dtype());
    auto in = stage(inputs), out = stage({output});
    return enqueue("reduce_scatter", std::string("(") + reduce_op_name(op) + ") " + describe_tensors({output}),
                   [this, in, out, op](uint32_t tag) {
                     in->to_host();
                     const Tensor& output = out->host()[0];
                     std::vector<uint8_t> flat(output.nbytes() * size());
                     for (size_t r = 0; r < in->host().size(); ++r)
                       std::memcpy(flat.data() + r * output.nbytes(), in->host()[r].data_ptr(), output.nbytes());
                     reduce_slice(flat, output, op, tag);
                     out->to_device();
                   });
  }

  std::shared_ptr<Work> reduce_scatter_tensor(Tensor output, Tensor input, ReduceOp op) override {
    check_collective_tensors("reduce_scatter_tensor", {output, input}, device_type_of({input}), "gloo");
    KILN_CHECK(input.numel() == output.numel() * size(),
               "reduce_scatter_tensor: the input "
               "needs world_size x ",
               output.numel(), " = ", output.numel() * size(), " elements, got ", input.numel());
    check_reduce_op("reduce_scatter_tensor", op, output.dtype());
    auto in = stage({input}), out = stage({output});
    return enqueue("reduce_scatter_tensor", std::string("(") + reduce_op_name(op) + ") " + describe_tensors({input}),
                   [this, in, out, op](uint32_t tag) {
                     in->to_host();
                     const Tensor& input = in->host()[0];
                     std::vector<uint8_t> flat(input.nbytes());
                     std::memcpy(flat.data(), input.data_ptr(), input.nbytes());
                     reduce_slice(flat, out->host()[0], op, tag);
                     out->to_device();
                   });
  }

  std::shared_ptr<Work> barrier() override {
    return enqueue("barrier", "", [this](uint32_t tag) {
      ::gloo::BarrierOptions opts(context_);
      opts.setTag(tag);
      opts.setTimeout(timeout_);
      ::gloo::barrier(opts);
    });
  }

  void abort() override {
    std::deque<Task> dropped;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (broken_.empty()) broken_ = "the process group was aborted";
      dropped.swap(queue_);
    }
    for (auto& task : dropped) task.work->mark_failed(broken_error(task.work->description()));
    // Unblocks an operation that is waiting on a peer (it fails with Gloo's error).
    try {
      context_->closeConnections();
    } catch (...) {
    }
  }

 private:
  struct Task {
    std::shared_ptr<Work> work;
    uint32_t tag;
    std::function<void(uint32_t)> run;
  };

  // CPU tensors run in place; CUDA tensors (and CPU ones under KILN_GLOO_STAGE_CPU_TENSORS=1)
  // through host buffers. Made on the caller's thread: it marks the point in the caller's stream
  // where the tensors are ready.
  static std::shared_ptr<HostStaging> stage(const std::vector<Tensor>& tensors) {
    return std::make_shared<HostStaging>(tensors, stage_cpu_tensors_for_testing());
  }

  // The device type a collective's tensors must share: the first one's (CPU or CUDA).
  static DeviceType device_type_of(const std::vector<Tensor>& tensors) {
    return !tensors.empty() && tensors[0].defined() && tensors[0].is_cuda() ? DeviceType::CUDA : DeviceType::CPU;
  }

  // The list side of all_gather (outputs) and reduce_scatter (inputs): one tensor per rank, each
  // with as many elements as `single`, the tensor on the other side.
  void check_one_per_rank(const char* collective, const std::vector<Tensor>& per_rank, const char* per_rank_kind,
                          const Tensor& single, const char* single_kind) const {
    KILN_CHECK(static_cast<int>(per_rank.size()) == size(), collective, ": expected ", size(), " ", per_rank_kind,
               " tensors (one per rank), got ", per_rank.size());
    std::vector<Tensor> all = per_rank;
    all.push_back(single);
    check_collective_tensors(collective, all, device_type_of(all), "gloo");
    for (size_t r = 0; r < per_rank.size(); ++r) {
      KILN_CHECK(per_rank[r].numel() == single.numel(), collective, ": ", per_rank_kind, " ", r, " has ",
                 per_rank[r].numel(), " elements, the ", single_kind, " ", single.numel());
    }
  }

  void check_root(const char* collective, int root) const {
    KILN_CHECK(root >= 0 && root < size(), collective, ": root ", root,
               " is not a rank of this "
               "group of ",
               size());
  }

  std::exception_ptr broken_error(const std::string& description) const {
    return std::make_exception_ptr(
        Error(detail::concat(description, ": not run, because the process group failed earlier (", broken_,
                             "); destroy it and initialise a new one")));
  }

  // Gloo's errors name a socket address ("Read error [10.0.0.2]:41234: Connection reset by
  // peer"). Each rank publishes the addresses of its pairs, so a failure can name the peer rank.
  void learn_peer_addresses() {
    std::string mine;
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      mine += context_->getPair(r)->address().str() + "\n";
    }
    store_->set("pair_addresses/" + std::to_string(rank()), mine);
    for (int r = 0; r < size(); ++r) {
      if (r == rank()) continue;
      std::stringstream lines(store_->get_string("pair_addresses/" + std::to_string(r)));
      std::string address;
      while (std::getline(lines, address)) {
        if (!address.empty()) peer_by_address_[address] = r;
      }
    }
  }

  // Ranks that cut the ring into different segments would exchange mismatched pieces: rank 0's
  // value is the group's, and a rank with another stops here, naming both.
  void check_same_segment_bytes() {
    const std::string key = "segment_bytes";
    if (rank() == 0) store_->set(key, std::to_string(segment_bytes_));
    const std::string zeros = store_->get_string(key);
    KILN_CHECK(zeros == std::to_string(segment_bytes_), "gloo process group: rank ", rank(),
               " cuts all-reduces into segments of ", segment_bytes_, " bytes but rank 0 into ", zeros,
               " (KILN_GLOO_SEGMENT_BYTES must be the same on every rank)");
  }

  // ". Rank 2 has exited" when the store saw a rank's process go away (its connection to the
  // store closes a moment after its sockets to us, hence the short wait), else the rank whose
  // address the error names.
  std::string peer_hint(const std::string& what) const {
    if (std::string hint = exited_ranks_hint(exited_ranks_); !hint.empty()) return hint;
    for (const auto& [address, r] : peer_by_address_) {
      if (what.find(address) != std::string::npos) {
        return detail::concat(". The peer is rank ", r, ": it has probably exited or been killed");
      }
    }
    return "";
  }

  // Gloo's allgather: every rank's bytes of `input`, in rank order, into `out`.
  void gather_bytes(uint8_t* out, const Tensor& input, uint32_t tag) {
    if (input.nbytes() == 0) return;
    ::gloo::AllgatherOptions opts(context_);
    opts.setInput(static_cast<uint8_t*>(input.data_ptr()), input.nbytes());
    opts.setOutput(out, input.nbytes() * size());
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    ::gloo::allgather(opts);
  }

  // Gloo's ring all-reduce of n elements at `data` (Avg sums; the caller divides).
  template <class T> void all_reduce_in_place(T* data, size_t n, ReduceOp op, uint32_t tag) {
    ::gloo::AllreduceOptions opts(context_);
    opts.setOutput(data, n);
    opts.setReduceFunction(reduce_function<T>(op));
    opts.setTag(tag);
    opts.setTimeout(timeout_);
    opts.setMaxSegmentSize(static_cast<size_t>(segment_bytes_));
    ::gloo::allreduce(opts);
  }

  // Reduces the whole packed buffer over ranks, then keeps this rank's slice. Gloo has no
  // reduce-scatter with a reduction function of ours; an all-reduce moves twice the bytes of a
  // ring reduce-scatter (docs/distributed.md says so).
  void reduce_slice(std::vector<uint8_t>& flat, const Tensor& output, ReduceOp op, uint32_t tag) {
    const DType dtype = output.dtype();
    const size_t n = flat.size() / element_size(dtype);
    if (n == 0) return;
    dispatch_numeric(dtype, "reduce_scatter", [&](auto tag_type) {
      using T = typename decltype(tag_type)::type;
      all_reduce_in_place(reinterpret_cast<T*>(flat.data()), n, op, tag);
    });
    uint8_t* mine = flat.data() + static_cast<size_t>(rank()) * output.nbytes();
    if (op == ReduceOp::Avg) {
      dispatch_floating(dtype, "reduce_scatter (Avg)", [&](auto tag_type) {
        using T = typename decltype(tag_type)::type;
        divide_elements<T>(mine, static_cast<size_t>(output.numel()), size());
      });
    }
    std::memcpy(output.data_ptr(), mine, output.nbytes());
  }

  std::shared_ptr<Work> enqueue(const char* collective, const std::string& what, std::function<void(uint32_t)> run) {
    const uint64_t seq = next_sequence_number();
    std::string description =
        detail::concat(collective, " #", seq, " ", what, " on rank ", rank(), " of a gloo group of ", size());
    auto work = std::make_shared<GlooWork>(description, weak_from_this(), timeout_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!broken_.empty()) {
        work->mark_failed(broken_error(description));
        return work;
      }
      queue_.push_back({work, static_cast<uint32_t>(seq), std::move(run)});
    }
    cv_.notify_all();
    return work;
  }

  void run_worker() {
    for (;;) {
      Task task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        task = std::move(queue_.front());
        queue_.pop_front();
        if (!broken_.empty()) {
          task.work->mark_failed(broken_error(task.work->description()));
          continue;
        }
      }
      try {
        task.run(task.tag);
        task.work->mark_completed();
      } catch (const std::exception& e) {
        std::string hint = peer_hint(e.what());
        if (hint.empty()) {
          hint = detail::concat(
              ". A peer process has probably exited or been killed (its "
              "connection closed), or did not reach this collective within the "
              "timeout of ",
              timeout_.count(), " ms");
        }
        std::string message = detail::concat(task.work->description(), " failed: ", e.what(), hint);
        {
          std::lock_guard<std::mutex> lock(mu_);
          if (broken_.empty()) broken_ = message;
        }
        task.work->mark_failed(std::make_exception_ptr(Error(message)));
      }
    }
  }

  std::shared_ptr<Store> store_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr< ::gloo::rendezvous::Context> context_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> queue_;
  bool stop_ = false;
  std::string broken_;  // the first failure; non-empty: every later collective fails
  std::map<std::string, int> peer_by_address_;
  std::function<std::vector<int>()> exited_ranks_;
  long long segment_bytes_;  // the all-reduce's largest segment (kSegmentBytes)
  std::thread worker_;
};

void GlooWork::on_timeout() {
  if (auto group = group_.lock()) group->abort();
}

}  // namespace

std::shared_ptr<ProcessGroup> make_gloo_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options) {
  return std::make_shared<GlooProcessGroup>(std::move(store), rank, size, options);
}

void check_gloo_environment() { segment_bytes_from_env(); }

#endif  // KILN_WITH_GLOO

}  // namespace kiln::distributed
