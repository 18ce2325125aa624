// KILN_DISTRIBUTED_DEBUG=1 (docs/distributed.md, "Debugging"): before each collective every rank
// writes a fingerprint of it (sequence number, collective, reduction or root, dtype, sizes) to the
// store and reads everyone else's; a difference is an Error naming the ranks and what each
// called, instead of a hang or a silently wrong result. It costs a store round trip per
// collective, so it is off by default.
#include <map>
#include <algorithm>
#include <sstream>
#include <thread>

#include "kiln/core/error.h"
#include "kiln/distributed/backends/process_group.h"
#include "kiln/distributed/store/store.h"

namespace kiln::distributed {
namespace {

class DebugProcessGroup final : public ProcessGroup {
 public:
  DebugProcessGroup(std::shared_ptr<ProcessGroup> inner, std::shared_ptr<Store> store)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)), store_(std::move(store)) {}

  std::string backend_name() const override { return inner_->backend_name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }

  std::shared_ptr<Work> all_reduce(std::vector<Tensor> tensors, ReduceOp op) override {
    check(std::string("all_reduce(") + reduce_op_name(op) + ") " + describe_tensors(tensors));
    return inner_->all_reduce(std::move(tensors), op);
  }
  std::shared_ptr<Work> broadcast(std::vector<Tensor> tensors, int root) override {
    check("broadcast(root " + std::to_string(root) + ") " + describe_tensors(tensors));
    return inner_->broadcast(std::move(tensors), root);
  }
  std::shared_ptr<Work> all_gather(std::vector<Tensor> outputs, Tensor input) override {
    check("all_gather " + describe_tensors({input}));
    return inner_->all_gather(std::move(outputs), std::move(input));
  }
  std::shared_ptr<Work> all_gather_into_tensor(Tensor output, Tensor input) override {
    check("all_gather_into_tensor " + describe_tensors({input}));
    return inner_->all_gather_into_tensor(std::move(output), std::move(input));
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) override {
    check(std::string("reduce_scatter(") + reduce_op_name(op) + ") " + describe_tensors({output}));
    return inner_->reduce_scatter(std::move(output), std::move(inputs), op);
  }
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor output, Tensor input, ReduceOp op) override {
    check(std::string("reduce_scatter_tensor(") + reduce_op_name(op) + ") " + describe_tensors({input}));
    return inner_->reduce_scatter_tensor(std::move(output), std::move(input), op);
  }
  std::shared_ptr<Work> barrier() override {
    check("barrier");
    return inner_->barrier();
  }
  void abort() override { inner_->abort(); }

 private:
  static std::string key(uint64_t seq, int rank) {
    return "fingerprint/" + std::to_string(seq) + "/" + std::to_string(rank);
  }

  void check(const std::string& fingerprint) {
    const uint64_t seq = next_sequence_number();
    store_->set(key(seq, rank()), fingerprint);
    std::vector<std::string> keys;
    for (int r = 0; r < size(); ++r) keys.push_back(key(seq, r));
    try {
      store_->wait(keys, timeout());
    } catch (const Error&) {
      std::vector<int> missing;
      for (int r = 0; r < size(); ++r) {
        if (!store_->check({key(seq, r)})) missing.push_back(r);
      }
      KILN_FAIL("KILN_DISTRIBUTED_DEBUG: rank ", rank(), " called collective #", seq, " (", fingerprint, ") but ranks ",
                missing, " did not reach a collective #", seq, " within ", timeout().count(),
                " ms (they may have exited, or skipped a collective)");
    }
    std::map<std::string, std::vector<int>> by_fingerprint;
    for (int r = 0; r < size(); ++r) by_fingerprint[store_->get_string(key(seq, r))].push_back(r);
    // Every rank has read the keys of seq - 1 before writing those of seq, so seq - 2 is free.
    if (seq >= 2) store_->delete_key(key(seq - 2, rank()));
    if (by_fingerprint.size() > 1) {
      // Every rank reports the mismatch itself: rank 0, which hosts the job's store, waits
      // (bounded) until all have read the fingerprints before it throws and takes the store
      // with it.
      const std::string read_key = "fingerprint/" + std::to_string(seq) + "/read";
      store_->add(read_key, 1);
      const auto deadline = std::chrono::steady_clock::now() + std::min(timeout(), std::chrono::milliseconds(10000));
      while (rank() == 0 && store_->add(read_key, 0) < size() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::ostringstream os;
      os << "KILN_DISTRIBUTED_DEBUG: collective #" << seq << " differs across ranks:";
      for (const auto& [what, ranks] : by_fingerprint) {
        os << (ranks.size() == 1 ? " rank " : " ranks ");
        for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
        os << " called " << what << ";";
      }
      os << " every rank must issue the same collectives, with the same shapes, in the same order";
      throw Error(os.str());
    }
  }

  std::shared_ptr<ProcessGroup> inner_;
  std::shared_ptr<Store> store_;
};

}  // namespace

std::shared_ptr<ProcessGroup> make_debug_process_group(std::shared_ptr<ProcessGroup> group,
                                                       std::shared_ptr<Store> store) {
  return std::make_shared<DebugProcessGroup>(std::move(group), std::move(store));
}

}  // namespace kiln::distributed
