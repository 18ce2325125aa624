// The "nccl" process group (process_group.h, docs/distributed.md): one non-blocking NCCL
// communicator per group, created eagerly at construction on the current CUDA device, and its own
// stream. A collective waits (on the device) for the work queued so far on the current stream,
// runs on the NCCL stream, and returns a Work whose end event later work can wait for. The
// watchdog (nccl_watchdog.cpp) completes Works and fails them when NCCL reports an error or one
// takes longer than the group's timeout.
#include "kiln/config.h"
#include "kiln/core/error.h"
#include "kiln/distributed/backends/process_group.h"

#if KILN_WITH_NCCL
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <thread>

#include "kiln/cuda/cuda.h"
#include "kiln/cuda/check.h"
#include "kiln/cuda/stream.h"
#include "kiln/core/dtype.h"
#include "kiln/core/tensor.h"
#include "kiln/distributed/backends/process_group_nccl.h"
#include "kiln/distributed/store/store.h"
#endif

namespace kiln::distributed {

#if KILN_WITH_NCCL

namespace nccl {
namespace {

using Clock = std::chrono::steady_clock;
using ::kiln::detail::concat;

// The calls of one collective, made between ncclGroupStart and ncclGroupEnd; returns the first
// failing result.
using Launch = std::function<ncclResult_t(ncclComm_t, cudaStream_t)>;
// Work queued on the NCCL stream before the NCCL calls (packing a list into one buffer).
using Prepare = std::function<void(cudaStream_t)>;

bool launched(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

ncclDataType_t nccl_dtype(DType t, const std::string& what) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::F64: return ncclFloat64;
    case DType::F16: return ncclFloat16;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
    case DType::I64: return ncclInt64;
    case DType::U8: return ncclUint8;
    default:
      KILN_FAIL(what, ": NCCL has no dtype ", dtype_name(t),
                " (float32, float64, float16, bfloat16, int32, int64 and uint8 are supported)");
  }
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Avg: return ncclAvg;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Product: return ncclProd;
  }
  KILN_FAIL("nccl: unknown ReduceOp ", static_cast<int>(op));
}

// Polls a non-blocking communicator until its pending call finished. Returns the final state,
// or ncclInProgress when `deadline` passed or `give_up()` returned true first.
ncclResult_t wait_ready(ncclComm_t comm, Clock::time_point deadline, const std::function<bool()>& give_up) {
  auto nap = std::chrono::microseconds(20);
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline || give_up()) return ncclInProgress;
    std::this_thread::sleep_for(nap);
    nap = std::min(nap * 2, std::chrono::microseconds(1000));
  }
}

std::string plural(size_t n, const char* word) { return concat(n, " ", word, n == 1 ? "" : "s"); }

int64_t total_numel(const std::vector<Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

class ProcessGroupNCCL final : public ProcessGroup {
 public:
  ProcessGroupNCCL(const std::shared_ptr<Store>& store, int rank, int size, const ProcessGroupOptions& options);
  ~ProcessGroupNCCL() override;

  std::string backend_name() const override { return "nccl"; }
  std::chrono::milliseconds timeout() const override { return timeout_; }

  std::shared_ptr<Work> all_reduce(std::vector<Tensor> tensors, ReduceOp op) override;
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root) override;
  std::shared_ptr<Work> all_gather(std::vector<Tensor> outputs, Tensor input) override;
  std::shared_ptr<Work> all_gather_into_tensor(Tensor output, Tensor input) override;
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) override;
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor output, Tensor input, ReduceOp op) override;
  std::shared_ptr<Work> barrier() override;
  void abort() override;

 private:
  std::string where() const { return concat("rank ", rank(), " of ", size(), " on cuda:", device_); }
  // Throws unless `t` is a contiguous CUDA tensor of `dtype` on the communicator's device.
  void check_tensor(const Tensor& t, const char* op, const std::string& what, DType dtype) const;
  // Issues one collective: the NCCL stream waits for the current stream, every tensor of `keep`
  // is recorded on the NCCL stream and kept alive by the Work until it completes.
  std::shared_ptr<Work> issue(const char* op, const std::string& detail, std::vector<Tensor> keep, const Launch& launch,
                              const Prepare& prepare = {}, bool host_wait = false);
  // ncclGroupStart, the calls, ncclGroupEnd and the wait for a non-blocking launch. Returns ""
  // or what failed. comm_mu held.
  std::string launch_group(ncclComm_t comm, cudaStream_t stream, const Launch& launch, const std::string& desc);

  std::chrono::milliseconds timeout_;
  int device_ = -1;
  std::shared_ptr<NcclComm> comm_;
  std::unique_ptr<Watchdog> watchdog_;
};

ProcessGroupNCCL::ProcessGroupNCCL(const std::shared_ptr<Store>& store, int rank, int size,
                                   const ProcessGroupOptions& options)
    : ProcessGroup(rank, size), timeout_(options.timeout) {
  device_ = cuda::current_device();
  cuda::internal::DeviceGuard guard(device_);

  // The unique id travels through the store. A group re-created on the same store namespace gets
  // a fresh key: every rank adds 1 to a counter, so the n-th creation reads generation n's id.
  const int64_t joined = store->add("nccl/members", 1);
  const std::string key = concat("nccl/unique_id/", (joined - 1) / size);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    KILN_CHECK(r == ncclSuccess, "nccl process group: ncclGetUniqueId failed on ", where(), ": ",
               nccl_error_text(r, nullptr));
    const auto* p = reinterpret_cast<const uint8_t*>(&id);
    store->set(key, Bytes(p, p + sizeof(id)));
  } else {
    Bytes b = store->get(key);
    KILN_CHECK(b.size() == sizeof(id), "nccl process group: the unique id under store key '", key, "' has ", b.size(),
               " bytes, expected ", sizeof(id), " (", where(), ")");
    std::memcpy(&id, b.data(), sizeof(id));
  }

  // The stream first, so that its failure leaves no communicator to undo. It is never destroyed
  // (nor when creation fails below): the caching allocator keeps it for blocks recorded on it
  // (record_stream), and those may outlive this group.
  cudaStream_t stream = nullptr;
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));

  // Non-blocking creation: it returns at once (or ncclInProgress) and is done when the
  // communicator's state leaves ncclInProgress, so a rank that never joins ends in a timeout.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  if (launched(r) && comm) r = wait_ready(comm, Clock::now() + timeout_, [] { return false; });
  if (r != ncclSuccess || !comm) {
    std::string why = r == ncclInProgress ? concat("not done after ", timeout_.count(),
                                                   " ms (a rank did not join, or cannot reach this one)")
                                          : concat(nccl_error_text(r == ncclSuccess ? ncclInternalError : r, comm));
    if (comm) (void)ncclCommAbort(comm);
    KILN_FAIL("nccl process group: creating the communicator failed on ", where(), ": ", why);
  }
  comm_ = std::make_shared<NcclComm>(comm, rank, size, device_, Stream{Device::cuda(device_), stream}, timeout_,
                                     options.exited_ranks);
  watchdog_ = std::make_unique<Watchdog>(comm_);
}

ProcessGroupNCCL::~ProcessGroupNCCL() {
  watchdog_.reset();  // joins the thread: shutdown below is then the only one polling
  comm_->shutdown();
}

void ProcessGroupNCCL::abort() { comm_->abort(concat("the process group was aborted (abort() on ", where(), ")")); }

void ProcessGroupNCCL::check_tensor(const Tensor& t, const char* op, const std::string& what, DType dtype) const {
  KILN_CHECK(t.defined(), "nccl ", op, ": ", what, " is an undefined tensor");
  KILN_CHECK(t.is_cuda() && t.device().index == device_, "nccl ", op, ": ", what,
             " must be a CUDA tensor on cuda:", device_, " (the device of ", where(), "), got one on ", t.device());
  KILN_CHECK(t.is_contiguous(), "nccl ", op, ": ", what, " must be contiguous (sizes ", t.sizes(), ", strides ",
             t.strides(), ")");
  KILN_CHECK(t.dtype() == dtype, "nccl ", op, ": ", what, " has dtype ", dtype_name(t.dtype()), ", expected ",
             dtype_name(dtype), " as the call's other tensors");
}

std::string ProcessGroupNCCL::launch_group(ncclComm_t comm, cudaStream_t stream, const Launch& launch,
                                           const std::string& desc) {
  const std::string aborted = "; the communicator was aborted";
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess)
    return concat(desc, ": ncclGroupStart failed on ", where(), ": ", nccl_error_text(r, comm), aborted);
  ncclResult_t calls = launch(comm, stream);
  r = ncclGroupEnd();  // closes the group even when a call failed
  if (!launched(calls))
    return concat(desc, ": an NCCL call failed on ", where(), ": ", nccl_error_text(calls, comm), aborted);
  // Non-blocking: the kernels are queued once the state leaves ncclInProgress, and no other call
  // may be made on the communicator before.
  if (r == ncclInProgress) r = wait_ready(comm, Clock::now() + timeout_, [this] { return comm_->aborted(); });
  if (r == ncclInProgress) {
    if (comm_->aborted()) return concat(desc, " failed: ", comm_->abort_reason());
    return concat(desc, ": NCCL had not launched it after ", timeout_.count(), " ms on ", where(),
                  " (a peer may have died)", aborted, comm_->exited_hint());
  }
  if (r != ncclSuccess)
    return concat(desc, ": ncclGroupEnd failed on ", where(), ": ", nccl_error_text(r, comm), aborted);
  return {};
}

std::shared_ptr<Work> ProcessGroupNCCL::issue(const char* op, const std::string& detail, std::vector<Tensor> keep,
                                              const Launch& launch, const Prepare& prepare, bool host_wait) {
  const uint64_t seq = next_sequence_number();
  const std::string desc = concat(op, " #", seq, " (", detail, ") on nccl group of ", size(), " ranks");
  KILN_CHECK(!comm_->aborted(), desc, ": the process group was aborted earlier (", comm_->abort_reason(),
             "); create a new one");
  cuda::internal::DeviceGuard guard(device_);
  const Stream compute = cuda::current_stream(device_);
  // The watchdog queries events on its own thread, which a capture forbids.
  KILN_CHECK(!cuda::is_capturing(compute), desc, ": NCCL collectives cannot be captured into a CUDA graph");

  // The inputs were written on the current stream: the NCCL stream waits for it (on the device).
  cuda::stream_wait(comm_->stream, compute);
  for (const auto& t : keep) cuda::record_stream(t, comm_->stream);

  auto work = std::make_shared<NcclWork>(desc, comm_, host_wait);
  std::string failure;
  {
    std::lock_guard<std::mutex> lk(comm_->comm_mu);
    ncclComm_t comm = comm_->handle_locked();
    KILN_CHECK(comm && !comm_->aborted(), desc, ": the process group was aborted (", comm_->abort_reason(), ")");
    cudaStream_t stream = native(comm_->stream);
    if (prepare) prepare(stream);
    failure = launch_group(comm, stream, launch, desc);
    if (failure.empty()) {
      try {
        work->end.record(comm_->stream);
      } catch (const std::exception& e) {
        failure = concat(desc, ": recording its end event failed on ", where(), ": ", e.what());
      }
    }
    if (failure.empty()) {
      work->started = Clock::now();
      work->tensors = std::move(keep);
      comm_->add_pending(work);
    }
  }
  // A half-issued collective leaves the ranks out of step: no later one can be trusted.
  if (!failure.empty()) {
    comm_->abort(failure);
    KILN_FAIL(failure);
  }
  return work;
}

// ---------------------------------------------------------------- the collectives
// Tensors without elements are checked but skipped: every rank has the same sizes, so every rank
// skips them.

std::shared_ptr<Work> ProcessGroupNCCL::all_reduce(std::vector<Tensor> tensors, ReduceOp op) {
  KILN_CHECK(!tensors.empty(), "nccl all_reduce: no tensors given");
  const DType dtype = tensors[0].dtype();
  for (size_t i = 0; i < tensors.size(); ++i) check_tensor(tensors[i], "all_reduce", concat("tensor ", i), dtype);
  check_reduce_op("nccl all_reduce", op, dtype);
  const ncclDataType_t type = nccl_dtype(dtype, "nccl all_reduce");
  const ncclRedOp_t red = nccl_op(op);
  const std::string detail = concat(reduce_op_name(op), ", ", dtype_name(dtype), ", ", plural(tensors.size(), "tensor"),
                                    ", ", total_numel(tensors), " elements");
  std::vector<Tensor> ts = tensors;
  return issue("all_reduce", detail, std::move(tensors), [ts, type, red](ncclComm_t comm, cudaStream_t s) {
    for (const auto& t : ts) {
      if (t.numel() == 0) continue;
      ncclResult_t r = ncclAllReduce(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type, red, comm, s);
      if (!launched(r)) return r;
    }
    return ncclSuccess;
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::broadcast(std::vector<Tensor> tensors, int root) {
  KILN_CHECK(!tensors.empty(), "nccl broadcast: no tensors given");
  KILN_CHECK(root >= 0 && root < size(), "nccl broadcast: root ", root, " is not a rank of the group (size ", size(),
             ")");
  const DType dtype = tensors[0].dtype();
  for (size_t i = 0; i < tensors.size(); ++i) check_tensor(tensors[i], "broadcast", concat("tensor ", i), dtype);
  const ncclDataType_t type = nccl_dtype(dtype, "nccl broadcast");
  const std::string detail = concat("root ", root, ", ", dtype_name(dtype), ", ", plural(tensors.size(), "tensor"),
                                    ", ", total_numel(tensors), " elements");
  std::vector<Tensor> ts = tensors;
  return issue("broadcast", detail, std::move(tensors), [ts, type, root](ncclComm_t comm, cudaStream_t s) {
    for (const auto& t : ts) {
      if (t.numel() == 0) continue;
      ncclResult_t r = ncclBroadcast(t.data_ptr(), t.data_ptr(), static_cast<size_t>(t.numel()), type, root, comm, s);
      if (!launched(r)) return r;
    }
    return ncclSuccess;
  });
}

// One broadcast per rank in one NCCL group: rank r's input lands in outputs[r] everywhere,
// without a gathered buffer to copy out of.
std::shared_ptr<Work> ProcessGroupNCCL::all_gather(std::vector<Tensor> outputs, Tensor input) {
  KILN_CHECK(input.defined(), "nccl all_gather: the input is an undefined tensor");
  const DType dtype = input.dtype();
  check_tensor(input, "all_gather", "the input", dtype);
  KILN_CHECK(static_cast<int>(outputs.size()) == size(), "nccl all_gather: ", outputs.size(),
             " outputs given, expected one per rank (", size(), ")");
  for (size_t i = 0; i < outputs.size(); ++i) {
    check_tensor(outputs[i], "all_gather", concat("output ", i), dtype);
    KILN_CHECK(outputs[i].sizes() == input.sizes(), "nccl all_gather: output ", i, " has sizes ", outputs[i].sizes(),
               ", expected the input's ", input.sizes());
  }
  const ncclDataType_t type = nccl_dtype(dtype, "nccl all_gather");
  const size_t count = static_cast<size_t>(input.numel());
  const std::string detail = concat(dtype_name(dtype), ", ", input.numel(), " elements per rank");
  std::vector<Tensor> keep = outputs;
  keep.push_back(input);
  return issue("all_gather", detail, std::move(keep), [outputs, input, type, count](ncclComm_t comm, cudaStream_t s) {
    if (count == 0) return ncclSuccess;
    for (size_t r = 0; r < outputs.size(); ++r) {
      // sendbuff is read on the root only
      ncclResult_t res =
          ncclBroadcast(input.data_ptr(), outputs[r].data_ptr(), count, type, static_cast<int>(r), comm, s);
      if (!launched(res)) return res;
    }
    return ncclSuccess;
  });
}

std::shared_ptr<Work> ProcessGroupNCCL::all_gather_into_tensor(Tensor output, Tensor input) {
  KILN_CHECK(input.defined(), "nccl all_gather_into_tensor: the input is an undefined tensor");
  const DType dtype = input.dtype();
  check_tensor(input, "all_gather_into_tensor", "the input", dtype);
  check_tensor(output, "all_gather_into_tensor", "the output", dtype);
  KILN_CHECK(output.numel() == input.numel() * size(), "nccl all_gather_into_tensor: the output has ", output.numel(),
             " elements, expected ", size(), " x the input's ", input.numel());
  const ncclDataType_t type = nccl_dtype(dtype, "nccl all_gather_into_tensor");
  const size_t count = static_cast<size_t>(input.numel());
  const std::string detail = concat(dtype_name(dtype), ", ", input.numel(), " elements per rank");
  return issue("all_gather_into_tensor", detail, {output, input},
               [output, input, type, count](ncclComm_t comm, cudaStream_t s) {
                 if (count == 0) return ncclSuccess;
                 return ncclAllGather(input.data_ptr(), output.data_ptr(), count, type, comm, s);
               });
}

// The inputs are packed (in rank order) into one buffer on the NCCL stream, then reduce-scattered.
std::shared_ptr<Work> ProcessGroupNCCL::reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) {
  KILN_CHECK(output.defined(), "nccl reduce_scatter: the output is an undefined tensor");
  const DType dtype = output.dtype();
  check_tensor(output, "reduce_scatter", "the output", dtype);
  KILN_CHECK(static_cast<int>(inputs.size()) == size(), "nccl reduce_scatter: ", inputs.size(),
             " inputs given, expected one per rank (", size(), ")");
  for (size_t i = 0; i < inputs.size(); ++i) {
    check_tensor(inputs[i], "reduce_scatter", concat("input ", i), dtype);
    KILN_CHECK(inputs[i].sizes() == output.sizes(), "nccl reduce_scatter: input ", i, " has sizes ", inputs[i].sizes(),
               ", expected the output's ", output.sizes());
  }
  check_reduce_op("nccl reduce_scatter", op, dtype);
  const ncclDataType_t type = nccl_dtype(dtype, "nccl reduce_scatter");
  const ncclRedOp_t red = nccl_op(op);
  const size_t count = static_cast<size_t>(output.numel());
  const std::string detail =
      concat(reduce_op_name(op), ", ", dtype_name(dtype), ", ", output.numel(), " elements per rank");
  // Allocated on the current stream, recorded on the NCCL stream by issue().
  Tensor packed = kiln::empty({output.numel() * size()}, TensorOptions().dtype(dtype).device(Device::cuda(device_)));
  const size_t nbytes = output.nbytes();
  std::vector<Tensor> keep = inputs;
  keep.push_back(output);
  keep.push_back(packed);
  return issue(
      "reduce_scatter", detail, std::move(keep),
      [output, packed, type, red, count](ncclComm_t comm, cudaStream_t s) {
        if (count == 0) return ncclSuccess;
        return ncclReduceScatter(packed.data_ptr(), output.data_ptr(), count, type, red, comm, s);
      },
      [inputs, packed, nbytes](cudaStream_t s) {
        if (nbytes == 0) return;
        auto* dst = static_cast<char*>(packed.data_ptr());
        for (size_t r = 0; r < inputs.size(); ++r)
          KILN_CUDA_CHECK(cudaMemcpyAsync(dst + r * nbytes, inputs[r].data_ptr(), nbytes, cudaMemcpyDeviceToDevice, s));
      });
}

std::shared_ptr<Work> ProcessGroupNCCL::reduce_scatter_tensor(Tensor output, Tensor input, ReduceOp op) {
  KILN_CHECK(output.defined(), "nccl reduce_scatter_tensor: the output is an undefined tensor");
  const DType dtype = output.dtype();
  check_tensor(output, "reduce_scatter_tensor", "the output", dtype);
  check_tensor(input, "reduce_scatter_tensor", "the input", dtype);
  KILN_CHECK(input.numel() == output.numel() * size(), "nccl reduce_scatter_tensor: the input has ", input.numel(),
             " elements, expected ", size(), " x the output's ", output.numel());
  check_reduce_op("nccl reduce_scatter_tensor", op, dtype);
  const ncclDataType_t type = nccl_dtype(dtype, "nccl reduce_scatter_tensor");
  const ncclRedOp_t red = nccl_op(op);
  const size_t count = static_cast<size_t>(output.numel());
  const std::string detail =
      concat(reduce_op_name(op), ", ", dtype_name(dtype), ", ", output.numel(), " elements per rank");
  return issue("reduce_scatter_tensor", detail, {output, input},
               [output, input, type, red, count](ncclComm_t comm, cudaStream_t s) {
                 if (count == 0) return ncclSuccess;
                 return ncclReduceScatter(input.data_ptr(), output.data_ptr(), count, type, red, comm, s);
               });
}

// A one-element all_reduce whose Work waits on the host: every rank has reached it once it is done.
std::shared_ptr<Work> ProcessGroupNCCL::barrier() {
  Tensor token = kiln::zeros({1}, TensorOptions().dtype(DType::F32).device(Device::cuda(device_)));
  return issue(
      "barrier", "1-element all_reduce", {token},
      [token](ncclComm_t comm, cudaStream_t s) {
        return ncclAllReduce(token.data_ptr(), token.data_ptr(), 1, ncclFloat32, ncclSum, comm, s);
      },
      {}, /*host_wait=*/true);
}

}  // namespace
}  // namespace nccl

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store> store, int rank, int size,
                                                      const ProcessGroupOptions& options) {
  KILN_CHECK(store, "make_nccl_process_group: the store is null");
  KILN_CHECK(size >= 1, "make_nccl_process_group: size must be at least 1, got ", size);
  KILN_CHECK(rank >= 0 && rank < size, "make_nccl_process_group: rank ", rank, " is not in [0, ", size, ")");
  KILN_CHECK(options.timeout.count() > 0, "make_nccl_process_group: the timeout must be positive, got ",
             options.timeout.count(), " ms");
  KILN_CHECK(cuda::is_available(), "make_nccl_process_group: rank ", rank, " of ", size,
             " sees no CUDA device; the nccl backend needs one GPU per rank (use gloo for CPU "
             "tensors)");
  return std::make_shared<nccl::ProcessGroupNCCL>(store, rank, size, options);
}

bool nccl_available() { return true; }

#else  // !KILN_WITH_NCCL

std::shared_ptr<ProcessGroup> make_nccl_process_group(std::shared_ptr<Store>, int, int, const ProcessGroupOptions&) {
  KILN_FAIL(
      "make_nccl_process_group: kiln was built without NCCL (configure with -DKILN_CUDA=ON "
      "where NCCL is found, or -DKILN_NCCL=ON to require it); use the gloo backend for CPU "
      "tensors");
}

bool nccl_available() { return false; }

#endif  // KILN_WITH_NCCL

}  // namespace kiln::distributed
