// Rank programs for the collectives' tests (tests/distributed/test_collectives.cpp). Every rank
// computes what each collective must give from its rank alone and compares exactly.
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "kiln/distributed/distributed.h"
#include "kiln/kiln.h"
#include "tests/distributed/worker/scenario.h"

namespace dist = kiln::distributed;

namespace {

int arg_int(const std::vector<std::string>& args, size_t i, int fallback) {
  return i < args.size() ? std::stoi(args[i]) : fallback;
}

// [r + 0, r + 1, ...] * scale, n elements, as dtype.
kiln::Tensor ramp(int64_t n, double start, kiln::DType dtype = kiln::DType::F32) {
  return (kiln::arange(n, kiln::TensorOptions().dtype(kiln::DType::F64)) + start).to(dtype);
}

void expect_equal(const kiln::Tensor& got, const kiln::Tensor& want, const std::string& what) {
  auto g = got.to(kiln::DType::F64).contiguous();
  auto w = want.to(kiln::DType::F64).contiguous();
  KILN_EXPECT(g.sizes() == w.sizes(), what, ": sizes ", g.sizes(), " vs ", w.sizes());
  const double* gp = g.data_ptr<double>();
  const double* wp = w.data_ptr<double>();
  for (int64_t i = 0; i < g.numel(); ++i) {
    KILN_EXPECT(gp[i] == wp[i] || (gp[i] != gp[i] && wp[i] != wp[i]), what, ": element ", i, " is ", gp[i],
                ", expected ", wp[i]);
  }
}

}  // namespace

// Every collective and reduction, sync and async, odd sizes, several dtypes.
KILN_SCENARIO("collectives") {
  dist::init_process_group("gloo", std::chrono::seconds(30));
  const int r = dist::rank(), w = dist::world_size();
  KILN_EXPECT(dist::is_initialized(), "");
  KILN_EXPECT(dist::backend_name() == "gloo", dist::backend_name());
  const int64_t n = 1031;  // odd, not a multiple of anything

  // all_reduce Sum / Avg / Max / Min / Product
  for (auto dtype : {kiln::DType::F32, kiln::DType::F64, kiln::DType::I64, kiln::DType::I32, kiln::DType::F16,
                     kiln::DType::BF16, kiln::DType::U8}) {
    // 16-bit floats: values whose sums stay exact (bf16 holds integers up to 256 exactly).
    const bool half = dtype == kiln::DType::F16 || dtype == kiln::DType::BF16;
    const int64_t m = half ? 61 : n;
    auto t = ramp(m, r, dtype);
    if (dtype == kiln::DType::U8) t = kiln::full({m}, r + 1).to(dtype);
    dist::all_reduce(t);
    kiln::Tensor want = dtype == kiln::DType::U8 ? kiln::full({m}, w * (w + 1) / 2)
                                                 : ramp(m, 0, kiln::DType::F64) * w + w * (w - 1) / 2.0;
    if (dtype == kiln::DType::F16 || dtype == kiln::DType::BF16) want = want.to(dtype);
    expect_equal(t, want, std::string("all_reduce Sum ") + kiln::dtype_name(dtype));
  }
  {
    auto t = ramp(n, r, kiln::DType::F64);
    dist::all_reduce(t, dist::ReduceOp::Avg);
    expect_equal(t, ramp(n, (w - 1) / 2.0, kiln::DType::F64), "all_reduce Avg");
    auto mx = kiln::full({n}, double(r));
    dist::all_reduce(mx, dist::ReduceOp::Max);
    expect_equal(mx, kiln::full({n}, double(w - 1)), "all_reduce Max");
    auto mn = kiln::full({n}, double(r + 3));
    dist::all_reduce(mn, dist::ReduceOp::Min);
    expect_equal(mn, kiln::full({n}, 3.0), "all_reduce Min");
    auto pr = kiln::full({5}, double(r + 1));
    dist::all_reduce(pr, dist::ReduceOp::Product);
    double fact = 1;
    for (int k = 1; k <= w; ++k) fact *= k;
    expect_equal(pr, kiln::full({5}, fact), "all_reduce Product");
    // NaN from one rank propagates through Max, as PyTorch's max does.
    auto nan = kiln::full({3}, r == 0 ? std::nan("") : 1.0);
    dist::all_reduce(nan, dist::ReduceOp::Max);
    KILN_EXPECT(std::isnan(nan.data_ptr<float>()[0]), "Max with a NaN on rank 0");
  }
  // Random data: every rank ends bitwise identical, and equal to the serial reduction of all
  // ranks' inputs (each rank can make every rank's input: the seed is the rank) within rounding.
  for (int64_t m : {int64_t(0), int64_t(1), int64_t(w - 1), int64_t(1000003)}) {
    auto input_of = [&](int q) {
      kiln::manual_seed(1000 + q);
      return kiln::randn({m});
    };
    auto t = input_of(r);
    dist::all_reduce(t);
    auto serial = kiln::zeros({m}, kiln::TensorOptions().dtype(kiln::DType::F64));
    for (int q = 0; q < w; ++q) serial = serial + input_of(q).to(kiln::DType::F64);
    auto diff = m ? (t.to(kiln::DType::F64) - serial).abs().max().item<double>() : 0.0;
    KILN_EXPECT(diff <= 1e-5 * w, "random all_reduce of ", m, " elements is off the serial sum by ", diff);
    std::vector<kiln::Tensor> everyone;
    dist::all_gather(everyone, t);
    for (int q = 0; q < w; ++q) {
      KILN_EXPECT(std::memcmp(everyone[q].data_ptr(), t.data_ptr(), t.nbytes()) == 0, "rank ", q,
                  "'s all_reduce result differs bitwise from rank ", r, "'s (", m, " elements)");
    }
    // Sizes smaller than the world and empty ones through the sliced collectives too.
    auto out = kiln::empty({m});
    auto in = kiln::cat(std::vector<kiln::Tensor>(w, kiln::full({m}, double(r + 1))), 0);
    dist::reduce_scatter_tensor(out, in);
    expect_equal(out, kiln::full({m}, w * (w + 1) / 2.0), "reduce_scatter_tensor of " + std::to_string(m));
    auto gathered = kiln::empty({w * m});
    dist::all_gather_into_tensor(gathered, kiln::full({m}, double(r)));
    for (int q = 0; q < w && m > 0; ++q)
      expect_equal(gathered.narrow(0, q * m, m), kiln::full({m}, double(q)), "all_gather_into_tensor slot");
    auto b = r == 0 ? kiln::full({m}, 5.0) : kiln::zeros({m});
    dist::broadcast(b, 0);
    expect_equal(b, kiln::full({m}, 5.0), "broadcast of " + std::to_string(m));
  }
  // Coalesced, async
  {
    std::vector<kiln::Tensor> ts = {ramp(7, r), ramp(1, 10 * r), kiln::full({3, 5}, double(r))};
    auto work = dist::all_reduce_coalesced(ts, dist::ReduceOp::Sum, /*async_op=*/true);
    work->wait();
    KILN_EXPECT(work->is_completed() && work->is_success(), work->description());
    expect_equal(ts[0], ramp(7, 0, kiln::DType::F64) * w + w * (w - 1) / 2.0, "coalesced 0");
    expect_equal(ts[1], kiln::full({1}, 10.0 * w * (w - 1) / 2), "coalesced 1");
    expect_equal(ts[2], kiln::full({3, 5}, w * (w - 1) / 2.0), "coalesced 2");
  }
  // Several async collectives in flight at once finish in order, each right.
  {
    std::vector<kiln::Tensor> ts;
    std::vector<std::shared_ptr<dist::Work>> works;
    for (int k = 0; k < 8; ++k) {
      ts.push_back(kiln::full({100 + k}, double(r + k)));
      works.push_back(dist::all_reduce(ts.back(), dist::ReduceOp::Sum, true));
    }
    for (int k = 0; k < 8; ++k) {
      works[k]->wait();
      expect_equal(ts[k], kiln::full({100 + k}, double(w * (w - 1) / 2 + w * k)), "in flight");
    }
  }
  // broadcast from every root
  for (int root = 0; root < w; ++root) {
    auto t = r == root ? ramp(n, 100 * root) : kiln::zeros({n});
    dist::broadcast(t, root);
    expect_equal(t, ramp(n, 100 * root), "broadcast from " + std::to_string(root));
  }
  // all_gather (list and into one tensor)
  {
    std::vector<kiln::Tensor> outs;
    dist::all_gather(outs, ramp(13, r * 1000));
    KILN_EXPECT(static_cast<int>(outs.size()) == w, outs.size());
    for (int q = 0; q < w; ++q) expect_equal(outs[q], ramp(13, q * 1000), "all_gather slot");
    auto flat = kiln::empty({w * 13});
    dist::all_gather_into_tensor(flat, ramp(13, r * 1000));
    for (int q = 0; q < w; ++q)
      expect_equal(flat.narrow(0, q * 13, 13), ramp(13, q * 1000), "all_gather_into_tensor slot");
  }
  // reduce_scatter (list and from one tensor)
  {
    std::vector<kiln::Tensor> ins;
    for (int q = 0; q < w; ++q) ins.push_back(kiln::full({9}, double(r + 10 * q)));
    auto out = kiln::empty({9});
    dist::reduce_scatter(out, ins);
    expect_equal(out, kiln::full({9}, double(w * (w - 1) / 2 + 10 * r * w)), "reduce_scatter");
    auto in = ramp(w * 11, r);
    auto out2 = kiln::empty({11});
    dist::reduce_scatter_tensor(out2, in, dist::ReduceOp::Avg);
    expect_equal(out2, ramp(11, r * 11 + (w - 1) / 2.0, kiln::DType::F64), "reduce_scatter_tensor Avg");
  }
  dist::barrier();
  dist::destroy_process_group();
  KILN_EXPECT(!dist::is_initialized(), "");
}

// new_group: a subgroup of ranks {0, 2} of 3, and a non-member's errors.
KILN_SCENARIO("new_group") {
  dist::init_process_group("gloo", std::chrono::seconds(30));
  const int r = dist::rank();
  auto g = dist::new_group({0, 2});
  if (r == 1) {
    KILN_EXPECT(dist::rank(g) == -1, dist::rank(g));
    bool threw = false;
    try {
      auto t = kiln::ones({2});
      dist::all_reduce(t, dist::ReduceOp::Sum, false, g);
    } catch (const kiln::Error& e) {
      threw = std::string(e.what()).find("not a member") != std::string::npos;
    }
    KILN_EXPECT(threw, "a non-member's collective must throw");
  } else {
    KILN_EXPECT(dist::world_size(g) == 2, dist::world_size(g));
    KILN_EXPECT(dist::rank(g) == (r == 0 ? 0 : 1), dist::rank(g));
    auto t = kiln::full({4}, double(r));
    dist::all_reduce(t, dist::ReduceOp::Sum, false, g);
    expect_equal(t, kiln::full({4}, 2.0), "subgroup sum");
    auto b = r == 2 ? kiln::full({3}, 7.0) : kiln::zeros({3});
    dist::broadcast(b, /*src, a global rank=*/2, false, g);
    expect_equal(b, kiln::full({3}, 7.0), "subgroup broadcast from global rank 2");
  }
  auto t = kiln::ones({1});
  dist::all_reduce(t);  // the default group still works after the subgroup
  expect_equal(t, kiln::full({1}, 3.0), "default group after new_group");
  dist::destroy_process_group();
}

// Bad input: each call must be a kiln::Error with a clear message, never a hang.
KILN_SCENARIO("bad_input") {
  dist::init_process_group("gloo", std::chrono::seconds(30));
  auto expect_error = [](const std::function<void()>& f, const std::string& needle) {
    try {
      f();
    } catch (const kiln::Error& e) {
      KILN_EXPECT(std::string(e.what()).find(needle) != std::string::npos, "message '", e.what(), "' lacks '", needle,
                  "'");
      return;
    }
    throw std::runtime_error("no error for a call that needed '" + needle + "'");
  };
  auto nc = kiln::ones({4, 6}).transpose(0, 1);
  expect_error([&] { dist::all_reduce(nc); }, "not contiguous");
  expect_error(
      [&] {
        auto t = kiln::ones({3}, kiln::TensorOptions().dtype(kiln::DType::I64));
        dist::all_reduce(t, dist::ReduceOp::Avg);
      },
      "floating-point");
  const auto i64 = kiln::TensorOptions().dtype(kiln::DType::I64);
  expect_error(
      [&] {
        auto out = kiln::zeros({3}, i64);
        dist::reduce_scatter_tensor(out, kiln::ones({3 * dist::world_size()}, i64), dist::ReduceOp::Avg);
      },
      "floating-point");
  expect_error(
      [&] {
        auto out = kiln::zeros({3}, i64);
        std::vector<kiln::Tensor> ins(dist::world_size(), kiln::ones({3}, i64));
        dist::reduce_scatter(out, ins, dist::ReduceOp::Avg);
      },
      "floating-point");
  expect_error(
      [&] {
        auto t = kiln::ones({3});
        dist::broadcast(t, 5);
      },
      "src rank 5");
  expect_error(
      [&] {
        auto out = kiln::empty({5});
        dist::all_gather_into_tensor(out, kiln::ones({3}));
      },
      "elements");
  expect_error([] { dist::init_process_group("gloo"); }, "already initialised");
  expect_error([] { dist::new_group({0, 0}); }, "duplicates");
  // Nothing above issued a collective on any rank, so they still line up.
  auto t = kiln::ones({2});
  dist::all_reduce(t);
  expect_equal(t, kiln::full({2}, double(dist::world_size())), "after the errors");
  dist::destroy_process_group();
  expect_error(
      [] {
        auto t = kiln::ones({1});
        dist::all_reduce(t);
      },
      "not initialised");
}

// A rank dies (SIGKILL, mid-training) and the others must fail with an Error, not hang.
// args: the rank that dies, the step at which it dies.
KILN_SCENARIO("peer_killed") {
  const int victim = arg_int(args, 0, 1), at_step = arg_int(args, 1, 5);
  const int timeout_s = arg_int(args, 2, 10);
  dist::init_process_group("gloo", std::chrono::seconds(timeout_s));
  auto t = kiln::ones({1 << 16});
  for (int step = 0; step < 1000; ++step) {
    if (dist::rank() == victim && step == at_step) ::raise(SIGKILL);
    try {
      dist::all_reduce(t, dist::ReduceOp::Avg);
    } catch (const kiln::Error& e) {
      std::cerr << "rank " << dist::rank() << " caught at step " << step << ": " << e.what() << std::endl;
      std::exit(3);
    }
  }
  throw std::runtime_error("the collectives kept succeeding after a rank was killed");
}

// Ranks that disagree on a collective (sizes differ on the last rank) under KILN_DISTRIBUTED_DEBUG.
KILN_SCENARIO("mismatch") {
  dist::init_process_group("gloo", std::chrono::seconds(20));
  auto ok = kiln::ones({8});
  dist::all_reduce(ok);
  const bool odd_one = dist::rank() == dist::world_size() - 1;
  auto t = kiln::ones({odd_one ? 12 : 10});
  try {
    dist::all_reduce(t);
  } catch (const kiln::Error& e) {
    std::cerr << "rank " << dist::rank() << ": " << e.what() << std::endl;
    std::exit(4);
  }
  throw std::runtime_error("mismatched collectives were not reported");
}

// Joins (or not): used with ranks that are never started. Must fail in init with their names.
KILN_SCENARIO("join") {
  try {
    dist::init_process_group("gloo", std::chrono::seconds(arg_int(args, 0, 3)));
  } catch (const kiln::Error& e) {
    std::cerr << "rank " << std::getenv("RANK") << ": " << e.what() << std::endl;
    std::exit(5);
  }
  dist::destroy_process_group();
}

// Rank 2 cuts all-reduces into other segments than ranks 0 and 1 (KILN_GLOO_SEGMENT_BYTES): it
// stops at init_process_group naming both values (exit 5); the others fail their first
// all_reduce once it is gone (exit 6). Nobody hangs.
KILN_SCENARIO("segment_mismatch") {
  const int rank = std::atoi(std::getenv("RANK"));
  ::setenv("KILN_GLOO_SEGMENT_BYTES", rank == 2 ? "2097152" : "4194304", 1);
  try {
    dist::init_process_group("gloo", std::chrono::seconds(10));
  } catch (const kiln::Error& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    std::exit(5);
  }
  try {
    kiln::Tensor t = kiln::ones({64 << 20});
    dist::all_reduce(t);
  } catch (const kiln::Error& e) {
    std::cerr << "rank " << rank << ": " << e.what() << std::endl;
    std::exit(6);
  }
  std::exit(0);
}
