// The "nccl" process group on one GPU: a world of one rank, where every collective is the
// identity, exercises creation through a TCPStore, the stream ordering of Work::wait, the
// watchdog completing Works, argument errors, and abort. Skipped when kiln has no NCCL.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <kiln/config.h>
#include <kiln/distributed/backends/process_group.h>
#include <kiln/distributed/store/store.h>
#include <kiln/kiln.h>

#include "nccl_world.h"

namespace dist = kiln::distributed;
using kiln::DType;
using kiln::Tensor;

namespace {

const kiln::Device kGpu = kiln::Device::cuda(0);

bool same(const Tensor& a, const Tensor& b) { return kiln::equal(a.cpu(), b.cpu()); }

// The watchdog marks a finished Work completed within about 100 ms.
bool completes_within(const dist::Work& w, std::chrono::milliseconds limit) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (!w.is_completed()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace

TEST_CASE("nccl: a world of one reduces to the identity for every op and dtype", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  REQUIRE(pg->backend_name() == "nccl");
  REQUIRE(pg->rank() == 0);
  REQUIRE(pg->size() == 1);
  for (dist::ReduceOp op :
       {dist::ReduceOp::Sum, dist::ReduceOp::Avg, dist::ReduceOp::Max, dist::ReduceOp::Min, dist::ReduceOp::Product}) {
    Tensor x = kiln::randn({1000}).to(kGpu);
    Tensor expect = x.clone();
    pg->all_reduce({x}, op)->wait();
    REQUIRE(same(x, expect));
  }
  for (DType dt : {DType::F64, DType::F16, DType::BF16, DType::I32, DType::I64, DType::U8}) {
    Tensor x = kiln::randint(0, 100, {257}, DType::I64).to(kGpu, dt);
    Tensor expect = x.clone();
    pg->all_reduce({x}, dist::ReduceOp::Sum)->wait();
    REQUIRE(same(x, expect));
  }
}

TEST_CASE("nccl: coalesced lists, broadcast, gathers and scatters in a world of one", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  const uint64_t seq0 = pg->sequence_number();

  Tensor a = kiln::randn({3, 5}).to(kGpu), b = kiln::randn({7}).to(kGpu);
  Tensor a0 = a.clone(), b0 = b.clone();
  pg->all_reduce({a, b}, dist::ReduceOp::Sum)->wait();  // one NCCL group
  REQUIRE(same(a, a0));
  REQUIRE(same(b, b0));

  pg->broadcast({a, b}, /*root=*/0)->wait();
  REQUIRE(same(a, a0));

  std::vector<Tensor> outs = {kiln::zeros({3, 5}, kGpu)};
  pg->all_gather(outs, a)->wait();
  REQUIRE(same(outs[0], a0));

  Tensor flat = kiln::zeros({15}, kGpu);
  pg->all_gather_into_tensor(flat, a)->wait();
  REQUIRE(same(flat, a0.reshape({15})));

  Tensor out = kiln::zeros({3, 5}, kGpu);
  pg->reduce_scatter(out, {a}, dist::ReduceOp::Sum)->wait();
  REQUIRE(same(out, a0));

  Tensor out2 = kiln::zeros({15}, kGpu);
  pg->reduce_scatter_tensor(out2, a.reshape({15}), dist::ReduceOp::Max)->wait();
  REQUIRE(same(out2, a0.reshape({15})));

  auto w = pg->barrier();
  w->wait();  // a barrier waits on the host
  REQUIRE(w->is_completed());
  REQUIRE(w->is_success());

  REQUIRE(pg->sequence_number() == seq0 + 7);

  // Empty tensors are legal and move nothing.
  Tensor e = kiln::zeros({0}, kGpu);
  pg->all_reduce({e}, dist::ReduceOp::Sum)->wait();
}

TEST_CASE("nccl: an async Work orders the current stream after the collective", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  kiln::Stream s = kiln::cuda::get_stream_from_pool(0);
  kiln::cuda::StreamGuard guard(s);
  // Written on `s` just before the collective: the NCCL stream must wait for it.
  Tensor x = kiln::zeros({1 << 20}, kGpu);
  x.fill_(3.0);
  auto work = pg->all_reduce({x}, dist::ReduceOp::Sum);
  REQUIRE(work->description().find("all_reduce") != std::string::npos);
  work->wait();        // `s` waits on the device; the host does not
  Tensor y = x * 2.0;  // on `s`, after the collective
  kiln::cuda::synchronize_stream(s);
  REQUIRE(same(y, kiln::full({1 << 20}, 6.0)));
  REQUIRE(completes_within(*work, std::chrono::seconds(5)));
  REQUIRE(work->is_success());
  // Waiting again, or with an explicit timeout (a host wait), is fine once done.
  work->wait();
  work->wait(std::chrono::milliseconds(1000));
}

TEST_CASE("nccl: bad arguments are kiln::Errors naming the collective", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  using Catch::Matchers::Contains;
  Tensor g = kiln::ones({4}, kGpu);
  REQUIRE_THROWS_WITH(pg->all_reduce({kiln::ones({4})}, dist::ReduceOp::Sum),
                      Contains("all_reduce") && Contains("CUDA tensor"));
  REQUIRE_THROWS_WITH(pg->all_reduce({kiln::ones({4, 4}, kGpu).t()}, dist::ReduceOp::Sum), Contains("contiguous"));
  REQUIRE_THROWS_WITH(
      pg->all_reduce({g, kiln::ones({4}, kiln::TensorOptions().dtype(DType::F64).device(kGpu))}, dist::ReduceOp::Sum),
      Contains("dtype"));
  REQUIRE_THROWS_WITH(pg->all_reduce({g.to(DType::Bool)}, dist::ReduceOp::Sum), Contains("NCCL has no dtype"));
  REQUIRE_THROWS_WITH(pg->all_reduce({}, dist::ReduceOp::Sum), Contains("no tensors"));
  REQUIRE_THROWS_WITH(pg->broadcast({g}, 1), Contains("root 1"));
  std::vector<Tensor> two = {kiln::ones({4}, kGpu), kiln::ones({4}, kGpu)};
  REQUIRE_THROWS_WITH(pg->all_gather(two, g), Contains("one per rank"));
  REQUIRE_THROWS_WITH(pg->all_gather_into_tensor(kiln::ones({3}, kGpu), g), Contains("elements"));
  REQUIRE_THROWS_WITH(pg->reduce_scatter_tensor(kiln::ones({3}, kGpu), g, dist::ReduceOp::Sum), Contains("elements"));
  Tensor gi = kiln::ones({4}, kiln::TensorOptions().dtype(DType::I64).device(kGpu));
  REQUIRE_THROWS_WITH(pg->all_reduce({gi}, dist::ReduceOp::Avg), Contains("floating-point"));
  REQUIRE_THROWS_WITH(pg->reduce_scatter_tensor(kiln::zeros_like(gi), gi, dist::ReduceOp::Avg),
                      Contains("floating-point"));
  // The group is still usable after rejected calls.
  pg->all_reduce({g}, dist::ReduceOp::Sum)->wait();
  REQUIRE(same(g, kiln::ones({4})));
}

TEST_CASE("nccl: abort fails later collectives and destruction does not hang", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  Tensor x = kiln::ones({16}, kGpu);
  pg->all_reduce({x}, dist::ReduceOp::Sum)->wait();
  pg->abort();
  pg->abort();  // idempotent
  REQUIRE_THROWS_AS(pg->all_reduce({x}, dist::ReduceOp::Sum), kiln::Error);
  REQUIRE_THROWS_WITH(pg->barrier(), Catch::Matchers::Contains("aborted"));
  const auto t0 = std::chrono::steady_clock::now();
  pg.reset();
  REQUIRE(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(10));
}

TEST_CASE("nccl: a group destroyed with collectives in flight finishes them first", "[cuda][distributed][nccl]") {
  SKIP_WITHOUT_NCCL();
  auto pg = kiln_test::nccl_world_of_one();
  Tensor x = kiln::ones({1 << 22}, kGpu);
  std::shared_ptr<dist::Work> w;
  for (int i = 0; i < 8; ++i) w = pg->all_reduce({x}, dist::ReduceOp::Sum);
  pg.reset();  // waits for the pending Works (done or failed), then finalizes the communicator
  REQUIRE(w->is_completed());
  REQUIRE(w->is_success());
  REQUIRE(same(x, kiln::ones({1 << 22})));
}
