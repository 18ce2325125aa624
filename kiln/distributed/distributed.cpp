// init_process_group and the collectives' free functions (docs/distributed.md).
#include "kiln/distributed/distributed.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "kiln/cuda/cuda.h"
#include "kiln/core/error.h"
#include "kiln/distributed/store/launch_env.h"
#include "kiln/distributed/store/store.h"

namespace kiln::distributed {
namespace {

// "auto": CPU tensors go to gloo, CUDA tensors to nccl; one sequence of collectives per backend.
class DeviceRoutedProcessGroup final : public ProcessGroup {
 public:
  DeviceRoutedProcessGroup(std::shared_ptr<ProcessGroup> cpu, std::shared_ptr<ProcessGroup> cuda)
      : ProcessGroup(cpu->rank(), cpu->size()), cpu_(std::move(cpu)), cuda_(std::move(cuda)) {}

  std::string backend_name() const override { return "gloo,nccl"; }
  std::chrono::milliseconds timeout() const override { return cpu_->timeout(); }

  std::shared_ptr<Work> all_reduce(std::vector<Tensor> t, ReduceOp op) override {
    return pick(t).all_reduce(std::move(t), op);
  }
  std::shared_ptr<Work> broadcast(std::vector<Tensor> t, int root) override {
    return pick(t).broadcast(std::move(t), root);
  }
  std::shared_ptr<Work> all_gather(std::vector<Tensor> outputs, Tensor input) override {
    return pick({input}).all_gather(std::move(outputs), std::move(input));
  }
  std::shared_ptr<Work> all_gather_into_tensor(Tensor output, Tensor input) override {
    return pick({input}).all_gather_into_tensor(std::move(output), std::move(input));
  }
  std::shared_ptr<Work> reduce_scatter(Tensor output, std::vector<Tensor> inputs, ReduceOp op) override {
    return pick({output}).reduce_scatter(std::move(output), std::move(inputs), op);
  }
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor output, Tensor input, ReduceOp op) override {
    return pick({input}).reduce_scatter_tensor(std::move(output), std::move(input), op);
  }
  std::shared_ptr<Work> barrier() override { return cpu_->barrier(); }
  void abort() override {
    cpu_->abort();
    cuda_->abort();
  }

 private:
  ProcessGroup& pick(const std::vector<Tensor>& tensors) {
    const bool cuda = !tensors.empty() && tensors[0].defined() && tensors[0].is_cuda();
    return cuda ? *cuda_ : *cpu_;
  }
  std::shared_ptr<ProcessGroup> cpu_, cuda_;
};

// What a rank outside new_group(ranks) gets, as PyTorch's GroupMember.NON_GROUP_MEMBER.
class NonMemberGroup final : public ProcessGroup {
 public:
  NonMemberGroup(int size, std::vector<int> ranks) : ProcessGroup(-1, size), ranks_(std::move(ranks)) {}
  std::string backend_name() const override { return "none"; }
  std::chrono::milliseconds timeout() const override { return {}; }
  std::shared_ptr<Work> all_reduce(std::vector<Tensor>, ReduceOp) override { fail("all_reduce"); }
  std::shared_ptr<Work> broadcast(std::vector<Tensor>, int) override { fail("broadcast"); }
  std::shared_ptr<Work> all_gather(std::vector<Tensor>, Tensor) override { fail("all_gather"); }
  std::shared_ptr<Work> all_gather_into_tensor(Tensor, Tensor) override { fail("all_gather_into_tensor"); }
  std::shared_ptr<Work> reduce_scatter(Tensor, std::vector<Tensor>, ReduceOp) override { fail("reduce_scatter"); }
  std::shared_ptr<Work> reduce_scatter_tensor(Tensor, Tensor, ReduceOp) override { fail("reduce_scatter_tensor"); }
  std::shared_ptr<Work> barrier() override { fail("barrier"); }
  void abort() override {}

 private:
  [[noreturn]] void fail(const char* collective) const {
    KILN_FAIL(collective, ": this rank is not a member of the group of ranks ", ranks_,
              " (new_group gives non-members a group they cannot use)");
  }
  std::vector<int> ranks_;
};

struct State {
  std::mutex mu;
  bool initialized = false;
  std::shared_ptr<Store> store;
  Group default_group;
  std::vector<std::string> backends;  // of the default group
  std::chrono::milliseconds timeout{};
  int rank = 0, world_size = 1;
  int groups_created = 0;
  // Global ranks of each group (for translating a broadcast's src).
  std::map<const ProcessGroup*, std::vector<int>> global_ranks;
  std::vector<Group> groups;  // every group made by new_group, torn down with the default one
};

// Never destroyed: process groups own threads that must not be joined during static
// destruction (an exit() after a failed collective would otherwise wait on them).
State& state() {
  static State* s = new State;
  return *s;
}

bool debug_enabled() {
  const char* v = std::getenv("KILN_DISTRIBUTED_DEBUG");
  return v && std::string(v) != "0" && std::string(v) != "";
}

std::vector<std::string> parse_backends(const std::string& backend) {
  std::vector<std::string> out;
  if (backend == "auto" || backend.empty()) {
    // CUDA tensors go to nccl when every rank of this node has a GPU of its own; when several
    // share one (NCCL refuses that), gloo takes them through pinned host buffers
    // (docs/distributed.md, "Several ranks on one GPU").
    const int gpus = cuda::device_count();
    const bool own_gpu = gpus > 0 && read_launch_env().local_world_size <= gpus;
    if (gloo_available()) out.push_back("gloo");
    if (nccl_available() && gpus > 0 && (own_gpu || !gloo_available())) out.push_back("nccl");
    KILN_CHECK(!out.empty(),
               "init_process_group: backend \"auto\" found no usable backend: this "
               "kiln was built without Gloo",
               (nccl_available() ? " and no GPU is present" : " and without NCCL"),
               " (docs/distributed.md, \"Backends\")");
    return out;
  }
  std::stringstream ss(backend);
  std::string item;
  while (std::getline(ss, item, ',')) {
    // torch's "cpu:gloo,cuda:nccl" spelling too.
    if (auto colon = item.find(':'); colon != std::string::npos) item = item.substr(colon + 1);
    KILN_CHECK(item == "gloo" || item == "nccl", "init_process_group: unknown backend \"", item, "\" in \"", backend,
               "\"; expected \"auto\", \"gloo\", \"nccl\" or \"gloo,nccl\"");
    if (std::find(out.begin(), out.end(), item) == out.end()) out.push_back(item);
  }
  return out;
}

// One process group over `store` (a namespace of its own) with the chosen backends.
Group make_group(const std::vector<std::string>& backends, const std::shared_ptr<Store>& store, int rank, int size,
                 std::chrono::milliseconds timeout, std::function<std::vector<int>()> exited_ranks) {
  ProcessGroupOptions options;
  options.timeout = timeout;
  options.exited_ranks = std::move(exited_ranks);
  std::shared_ptr<ProcessGroup> cpu, cuda;
  for (const auto& b : backends) {
    auto ns = std::make_shared<PrefixStore>(b, store);
    if (b == "gloo") cpu = make_gloo_process_group(ns, rank, size, options);
    if (b == "nccl") cuda = make_nccl_process_group(ns, rank, size, options);
  }
  Group group;
  if (cpu && cuda) {
    group = std::make_shared<DeviceRoutedProcessGroup>(cpu, cuda);
  } else {
    group = cpu ? cpu : cuda;
  }
  if (debug_enabled()) group = make_debug_process_group(group, std::make_shared<PrefixStore>("debug", store));
  return group;
}

std::string exited_key(int global_rank) { return "exited/" + std::to_string(global_rank); }

// Called by a group whose collective failed: which members (as group ranks) the job's store saw
// exit without having reported a failed collective themselves, i.e. the ranks that died rather
// than the ranks that gave up because of them. The store's server lives in rank 0: when it is
// gone, rank 0 is what exited.
std::function<std::vector<int>()> exited_members(std::shared_ptr<Store> job_store, std::vector<int> members, int self) {
  std::weak_ptr<Store> weak = job_store;
  return [weak, members, self] {
    std::vector<int> exited;
    auto store = weak.lock();
    if (!store) return exited;
    for (size_t i = 0; i < members.size(); ++i) {
      try {
        if (members[i] == self) {
          store->set("failed/" + std::to_string(self), std::string("1"));
          continue;
        }
        if (store->check({exited_key(members[i])}) && !store->check({"failed/" + std::to_string(members[i])}))
          exited.push_back(static_cast<int>(i));
      } catch (const Error&) {
        auto zero = std::find(members.begin(), members.end(), 0);
        if (zero != members.end()) return std::vector<int>{static_cast<int>(zero - members.begin())};
        return exited;
      }
    }
    return exited;
  };
}

// At exit, rank 0 (which hosts the store) keeps it up a few seconds more, until the other ranks
// are gone too: a rank whose collective failed because a peer died asks the store which rank it
// was, and must not find the store gone merely because rank 0 reached exit() first.
void keep_store_for_peers_at_exit() {
  State& s = state();
  std::shared_ptr<Store> store;
  int world_size = 1;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    store = s.store;
    world_size = s.world_size;
  }
  if (!store || world_size <= 1) return;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  std::vector<std::string> others;
  for (int r = 1; r < world_size; ++r) others.push_back(exited_key(r));
  try {
    while (!store->check(others) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } catch (const Error&) {
  }
}

// Every rank announces itself; an Error names the ranks that did not within the timeout.
void rendezvous(Store& store, int rank, int world_size, std::chrono::milliseconds timeout, const std::string& where) {
  auto key = [](int r) { return "joined/" + std::to_string(r); };
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  store.set(key(rank), std::string(host) + " pid " + std::to_string(::getpid()));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(key(r));
  // Rank 0 hosts the store and gives up last, so every other rank can still read which ranks
  // are missing when its own wait ends.
  const auto wait_for = rank == 0 ? timeout + std::chrono::seconds(2) : timeout;
  try {
    store.wait(keys, wait_for);
  } catch (const Error&) {
    std::vector<int> missing;
    for (int r = 0; r < world_size; ++r) {
      if (!store.check({key(r)})) missing.push_back(r);
    }
    if (missing.empty()) throw;
    KILN_FAIL("init_process_group: rank ", rank, " waited ", wait_for.count(), " ms at ", where, " but ranks ", missing,
              " of ", world_size,
              " never joined (not started, crashed "
              "before init_process_group, or given another MASTER_ADDR/MASTER_PORT)");
  }
}

Group resolve(const Group& group) {
  if (group) return group;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  KILN_CHECK(s.initialized,
             "kiln::distributed: the default process group is not initialised; "
             "call kiln::distributed::init_process_group() first");
  return s.default_group;
}

std::shared_ptr<Work> finish(std::shared_ptr<Work> work, bool async_op) {
  if (!async_op) work->wait();
  return work;
}

}  // namespace

void init_process_group(const InitOptions& options) {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    KILN_CHECK(!s.initialized,
               "init_process_group: already initialised; call "
               "destroy_process_group() first");
  }
  KILN_CHECK(options.timeout.count() > 0, "init_process_group: the timeout must be positive");
  const auto backends = parse_backends(options.backend);
  if (std::find(backends.begin(), backends.end(), "gloo") != backends.end()) check_gloo_environment();
  int rank = options.rank, world_size = options.world_size;
  LaunchEnv env;
  if (rank < 0 || world_size < 0) env = read_launch_env();
  if (rank < 0) rank = env.rank;
  if (world_size < 0) world_size = env.world_size;
  KILN_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "init_process_group: rank ", rank,
             " is outside a world of ", world_size);

  std::shared_ptr<Store> store = options.store;
  std::string where = "the given store";
  if (!store) {
    TCPStoreOptions so;
    so.is_server = rank == 0;
    so.timeout = options.timeout;
    auto tcp = std::make_shared<TCPStore>(env.master_addr, env.master_port, so);
    tcp->set_on_disconnect(exited_key(rank));
    static bool registered = false;
    if (rank == 0 && !registered) {
      registered = true;
      std::atexit(keep_store_for_peers_at_exit);
    }
    store = tcp;
    where = "the store on " + env.master_addr + ":" + std::to_string(env.master_port);
  }
  store->set_timeout(options.timeout);
  rendezvous(*store, rank, world_size, options.timeout, where);
  std::vector<int> all(world_size);
  for (int r = 0; r < world_size; ++r) all[r] = r;
  Group group = make_group(backends, std::make_shared<PrefixStore>("default", store), rank, world_size, options.timeout,
                           exited_members(store, all, rank));

  std::lock_guard<std::mutex> lock(s.mu);
  s.store = store;
  s.default_group = group;
  s.backends = backends;
  s.timeout = options.timeout;
  s.rank = rank;
  s.world_size = world_size;
  s.groups_created = 0;
  s.global_ranks[group.get()] = all;
  s.initialized = true;
}

void init_process_group(const std::string& backend, std::chrono::milliseconds timeout) {
  InitOptions options;
  options.backend = backend;
  options.timeout = timeout;
  init_process_group(options);
}

void destroy_process_group() {
  State& s = state();
  std::shared_ptr<Store> store;
  int rank = 0, world_size = 1;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.initialized) return;
    store = s.store;
    rank = s.rank;
    world_size = s.world_size;
    // Dropping the groups drains their queues: in-flight collectives finish (or fail) first.
    s.groups.clear();
    s.global_ranks.clear();
    s.default_group.reset();
    s.initialized = false;
  }
  // Rank 0 hosts the store: it waits (briefly) for the others to be done with it, so that a
  // peer still reading a key does not see the server vanish.
  try {
    store->add("destroyed", 1);
    if (rank == 0 && world_size > 1) {
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (std::chrono::steady_clock::now() < deadline && store->add("destroyed", 0) < world_size)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const Error&) {
    // A peer or the server is gone already; nothing is left to protect.
  }
  std::lock_guard<std::mutex> lock(s.mu);
  s.store.reset();
}

bool is_initialized() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.initialized;
}

int rank(const Group& group) { return resolve(group)->rank(); }
int world_size(const Group& group) { return resolve(group)->size(); }
std::string backend_name(const Group& group) { return resolve(group)->backend_name(); }
Group default_group() { return resolve(nullptr); }

std::shared_ptr<Store> default_store() {
  resolve(nullptr);
  std::lock_guard<std::mutex> lock(state().mu);
  return state().store;
}

Group new_group(const std::vector<int>& ranks, const std::string& backend, std::chrono::milliseconds timeout) {
  resolve(nullptr);
  State& s = state();
  std::unique_lock<std::mutex> lock(s.mu);
  std::vector<int> members = ranks;
  if (members.empty()) {
    for (int r = 0; r < s.world_size; ++r) members.push_back(r);
  }
  std::sort(members.begin(), members.end());
  KILN_CHECK(std::adjacent_find(members.begin(), members.end()) == members.end(), "new_group: ranks ", ranks,
             " has duplicates");
  for (int r : members) {
    KILN_CHECK(r >= 0 && r < s.world_size, "new_group: rank ", r, " is not in the world of ", s.world_size);
  }
  // Every rank calls new_group in the same order, so the counter names the same group everywhere.
  const int id = ++s.groups_created;
  const auto backends = backend.empty() ? s.backends : parse_backends(backend);
  const auto group_timeout = timeout.count() > 0 ? timeout : s.timeout;
  auto store = std::make_shared<PrefixStore>("group" + std::to_string(id), s.store);
  const auto it = std::find(members.begin(), members.end(), s.rank);
  Group group;
  if (it == members.end()) {
    group = std::make_shared<NonMemberGroup>(static_cast<int>(members.size()), members);
  } else {
    const int group_rank = static_cast<int>(it - members.begin());
    lock.unlock();  // connecting waits on the other members
    group = make_group(backends, store, group_rank, static_cast<int>(members.size()), group_timeout,
                       exited_members(s.store, members, s.rank));
    lock.lock();
  }
  s.global_ranks[group.get()] = members;
  s.groups.push_back(group);
  return group;
}

// ---- collectives

std::shared_ptr<Work> all_reduce(const Tensor& tensor, ReduceOp op, bool async_op, const Group& group) {
  return finish(resolve(group)->all_reduce({tensor}, op), async_op);
}

std::shared_ptr<Work> all_reduce_coalesced(const std::vector<Tensor>& tensors, ReduceOp op, bool async_op,
                                           const Group& group) {
  return finish(resolve(group)->all_reduce(tensors, op), async_op);
}

namespace {
// torch.distributed's src is a global rank; process groups number their own members.
int group_rank_of(const Group& g, int global_rank, const char* collective) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.global_ranks.find(g.get());
  if (it == s.global_ranks.end()) return global_rank;  // a group made outside new_group
  const auto& members = it->second;
  auto pos = std::find(members.begin(), members.end(), global_rank);
  KILN_CHECK(pos != members.end(), collective, ": src rank ", global_rank, " is not a member of this group (ranks ",
             members, ")");
  return static_cast<int>(pos - members.begin());
}
}  // namespace

std::shared_ptr<Work> broadcast(const Tensor& tensor, int src, bool async_op, const Group& group) {
  Group g = resolve(group);
  return finish(g->broadcast({tensor}, group_rank_of(g, src, "broadcast")), async_op);
}

std::shared_ptr<Work> broadcast_coalesced(const std::vector<Tensor>& tensors, int src, bool async_op,
                                          const Group& group) {
  Group g = resolve(group);
  return finish(g->broadcast(tensors, group_rank_of(g, src, "broadcast")), async_op);
}

std::shared_ptr<Work> all_gather(std::vector<Tensor>& outputs, const Tensor& input, bool async_op, const Group& group) {
  Group g = resolve(group);
  if (outputs.empty()) {
    KILN_CHECK(input.defined(), "all_gather: the input is undefined");
    for (int r = 0; r < g->size(); ++r)
      outputs.push_back(empty(input.sizes(), TensorOptions().dtype(input.dtype()).device(input.device())));
  }
  return finish(g->all_gather(outputs, input), async_op);
}

std::shared_ptr<Work> all_gather_into_tensor(const Tensor& output, const Tensor& input, bool async_op,
                                             const Group& group) {
  return finish(resolve(group)->all_gather_into_tensor(output, input), async_op);
}

std::shared_ptr<Work> reduce_scatter(const Tensor& output, const std::vector<Tensor>& inputs, ReduceOp op,
                                     bool async_op, const Group& group) {
  return finish(resolve(group)->reduce_scatter(output, inputs, op), async_op);
}

std::shared_ptr<Work> reduce_scatter_tensor(const Tensor& output, const Tensor& input, ReduceOp op, bool async_op,
                                            const Group& group) {
  return finish(resolve(group)->reduce_scatter_tensor(output, input, op), async_op);
}

std::shared_ptr<Work> barrier(bool async_op, const Group& group) { return finish(resolve(group)->barrier(), async_op); }

}  // namespace kiln::distributed
