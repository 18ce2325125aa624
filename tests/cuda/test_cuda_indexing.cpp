// CUDA indexing kernels (kernels/cuda/indexing.cu) vs the CPU: index_select, gather, index_add,
// scatter_add, embedding forward/backward, one_hot, index_min_max, on random inputs with repeated
// indices, int64 and int32 indices, transposed/sliced operands and every dtype. Gathers move bits
// (compared exactly). Atomic scatters add in an unspecified order (f32 compared to 1e-5); with
// kiln::set_deterministic_algorithms(true) the scatters are ordered, bitwise equal to the CPU and
// reproducible from run to run. Out-of-range indices are skipped by the kernels and reported at the
// next synchronisation (docs/kernels.md, "Index bounds on the GPU").
#include <catch2/catch.hpp>

#include <cmath>

#include <string>
#include <vector>

#include <kiln/cuda/device_error.h>
#include <kiln/kiln.h>
#include <kiln/kernels/indexing.h>

using kiln::DType;
using kiln::Tensor;

namespace {
const kiln::Device kGpu = kiln::Device::cuda(0);

void require_equal(const Tensor& gpu, const Tensor& cpu, const std::string& what) {
  INFO(what << " sizes " << kiln::detail::concat(cpu.sizes()) << " dtype " << kiln::dtype_name(cpu.dtype()));
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(gpu.sizes() == cpu.sizes());
  REQUIRE(kiln::equal(gpu.cpu(), cpu));
}

void require_close(const Tensor& gpu, const Tensor& cpu, double tol, const std::string& what) {
  INFO(what << " sizes " << kiln::detail::concat(cpu.sizes()) << " dtype " << kiln::dtype_name(cpu.dtype()));
  REQUIRE(gpu.device() == kGpu);
  REQUIRE(kiln::allclose(gpu.cpu().to(DType::F64), cpu.to(DType::F64), tol, tol));
}

double tol(DType dt) { return dt == DType::BF16 ? 5e-2 : dt == DType::F16 ? 5e-3 : dt == DType::F64 ? 1e-12 : 1e-5; }

Tensor values_of(DType dt, const kiln::IntList& sizes) {
  if (dt == DType::U8) return kiln::randint(0, 8, sizes).to(DType::U8);
  if (dt == DType::I32 || dt == DType::I64) return kiln::randint(-50, 50, sizes, dt);
  return kiln::randn(sizes).to(dt);
}

// Runs body() with the deterministic switch set to `on`, restoring it afterwards.
template <class F> void with_determinism(bool on, F&& body) {
  kiln::DeterministicGuard g(on);
  body();
}

// An accumulating kernel: kiln::kernels::index_add or scatter_add.
using Accumulate = void (*)(const Tensor&, int64_t, const Tensor&, const Tensor&, const char*);

// op (named name) into a copy of out along dim on the CPU and, with the atomic (non-deterministic)
// kernel, on the GPU: floating results agree within 4 tol(dtype), integer ones exactly. Returns
// the CPU result.
Tensor check_atomic(Accumulate op, const char* name, const Tensor& out, int64_t dim, const Tensor& idx,
                    const Tensor& src) {
  Tensor cpu = out.clone();
  op(cpu, dim, idx, src, name);
  Tensor gpu_atomic = out.to(kGpu);
  with_determinism(false, [&] { op(gpu_atomic, dim, idx.to(kGpu), src.to(kGpu), name); });
  const std::string what = std::string(name) + " atomic";
  if (kiln::is_floating(out.dtype())) require_close(gpu_atomic, cpu, tol(out.dtype()) * 4, what);
  else require_equal(gpu_atomic, cpu, what + " (integers are exact)");
  return cpu;
}
}  // namespace

TEST_CASE("index_select and gather match the CPU exactly", "[cuda][indexing]") {
  kiln::manual_seed(60);
  for (DType dt : {DType::F32, DType::BF16, DType::F64, DType::I64, DType::U8, DType::Bool}) {
    Tensor x = dt == DType::Bool ? kiln::randn({37, 129}) > 0.0 : values_of(dt, {37, 129});
    for (DType it : {DType::I64, DType::I32}) {
      Tensor i0 = kiln::randint(0, 37, {300}, it), i1 = kiln::randint(0, 129, {41}, it);
      require_equal(x.to(kGpu).index_select(0, i0.to(kGpu)), x.index_select(0, i0), "index_select dim 0");
      require_equal(x.to(kGpu).index_select(1, i1.to(kGpu)), x.index_select(1, i1), "index_select dim 1");
      // transposed input, strided (sliced) index
      Tensor xt = x.t();
      Tensor is = kiln::randint(0, 129, {81}, it).slice(0, 0, 81, 2);
      require_equal(xt.to(kGpu).index_select(0, is.to(kGpu)), xt.index_select(0, is), "index_select transposed");
      // gather along each dim, index smaller than the input in the other dim
      Tensor g0 = kiln::randint(0, 37, {50, 100}, it), g1 = kiln::randint(0, 129, {30, 200}, it);
      require_equal(x.to(kGpu).gather(0, g0.to(kGpu)), x.gather(0, g0), "gather dim 0");
      require_equal(x.to(kGpu).gather(1, g1.to(kGpu)), x.gather(1, g1), "gather dim 1");
      require_equal(xt.to(kGpu).gather(1, g0.t().to(kGpu)), xt.gather(1, g0.t()), "gather transposed");
    }
  }
  Tensor x3 = kiln::randn({5, 6, 7});
  Tensor g = kiln::randint(0, 6, {5, 9, 7});
  require_equal(x3.to(kGpu).gather(1, g.to(kGpu)), x3.gather(1, g), "gather 3-d");
  Tensor s = kiln::randint(0, 5, {});
  require_equal(x3.to(kGpu).index_select(0, s.to(kGpu)), x3.index_select(0, s), "0-d index");
}

TEST_CASE("index_add and scatter_add match the CPU; deterministic mode is bitwise equal", "[cuda][indexing]") {
  kiln::manual_seed(61);
  for (DType dt : {DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8}) {
    for (DType it : {DType::I64, DType::I32}) {
      INFO(kiln::dtype_name(dt) << " index " << kiln::dtype_name(it));
      // index_add along dim 0 (embedding-backward shape) and dim 1 (outer and inner columns),
      // with many repeated indices
      for (int64_t dim : {0, 1}) {
        Tensor out = values_of(dt, {20, 17, 33});
        const int64_t n = dim == 0 ? 400 : 90;
        kiln::IntList src_sizes = {20, 17, 33};
        src_sizes[dim] = n;
        Tensor src = values_of(dt, src_sizes);
        Tensor idx = kiln::randint(0, out.size(dim), {n}, it);
        Tensor cpu = check_atomic(kiln::kernels::index_add, "index_add", out, dim, idx, src);
        Tensor gpu_a = out.to(kGpu), gpu_b = out.to(kGpu);
        with_determinism(true, [&] {
          kiln::kernels::index_add(gpu_a, dim, idx.to(kGpu), src.to(kGpu));
          kiln::kernels::index_add(gpu_b, dim, idx.to(kGpu), src.to(kGpu));
        });
        require_equal(gpu_a, cpu, "index_add deterministic == CPU");
        require_equal(gpu_b, gpu_a.cpu(), "index_add deterministic twice");
      }
      // scatter_add with a full-rank index, along dims 0 and 1, transposed source
      for (int64_t dim : {0, 1}) {
        Tensor out = values_of(dt, {20, 30});
        Tensor src = values_of(dt, {40, 60}).t();  // [60, 40], non-contiguous
        Tensor idx = kiln::randint(0, out.size(dim), dim == 0 ? kiln::IntList{50, 30} : kiln::IntList{20, 40}, it);
        Tensor cpu = check_atomic(kiln::kernels::scatter_add, "scatter_add", out, dim, idx, src);
        Tensor gpu_det = out.to(kGpu);
        with_determinism(true, [&] { kiln::kernels::scatter_add(gpu_det, dim, idx.to(kGpu), src.to(kGpu)); });
        require_equal(gpu_det, cpu, "scatter_add deterministic == CPU");
      }
    }
  }
  // a transposed destination
  Tensor out = kiln::randn({33, 20}).t();  // [20, 33]
  Tensor src = kiln::randn({64, 33});
  Tensor idx = kiln::randint(0, 20, {64});
  Tensor cpu = out.clone();
  kiln::kernels::index_add(cpu, 0, idx, src);
  Tensor gpu = kiln::randn({33, 20}).to(kGpu).t();
  gpu.copy_(out.to(kGpu));
  with_determinism(true, [&] { kiln::kernels::index_add(gpu, 0, idx.to(kGpu), src.to(kGpu)); });
  require_equal(gpu, cpu, "index_add into a transposed target");
}

TEST_CASE("embedding forward and backward on the GPU; deterministic backward is reproducible", "[cuda][indexing]") {
  kiln::manual_seed(62);
  Tensor w = kiln::randn({1000, 64});
  Tensor idx = kiln::randint(0, 50, {8, 128});  // 1024 lookups of 50 rows: heavy repetition
  Tensor gout = kiln::randn({8, 128, 64});
  auto grad_of = [&](kiln::Device dev) {
    Tensor wd = w.to(dev).detach().requires_grad_(true);
    Tensor y = kiln::embedding(wd, idx.to(dev));
    (y * gout.to(dev)).sum().backward();
    return std::make_pair(y.detach(), wd.grad());
  };
  auto [y_cpu, g_cpu] = grad_of(kiln::Device::cpu());
  auto [y_gpu, g_gpu] = grad_of(kGpu);
  require_equal(y_gpu, y_cpu, "embedding forward");
  require_close(g_gpu, g_cpu, 1e-4, "embedding backward (atomic)");
  Tensor g1, g2;
  with_determinism(true, [&] {
    g1 = grad_of(kGpu).second;
    g2 = grad_of(kGpu).second;
  });
  require_equal(g1, g_cpu, "embedding backward deterministic == CPU");
  require_equal(g2, g1.cpu(), "embedding backward deterministic, second run");
  // one_hot (a scatter on the device)
  Tensor labels = kiln::randint(0, 10, {37});
  require_equal(kiln::one_hot(labels.to(kGpu), 10), kiln::one_hot(labels, 10), "one_hot");
}

// Runs `region`, expecting no error from it, then requires the next synchronisation to throw a
// kiln::Error whose text contains every string of `parts`.
template <class F> void require_error_at_sync(F&& region, const std::vector<std::string>& parts) {
  REQUIRE_NOTHROW(region());
  try {
    kiln::cuda::synchronize();
    FAIL("no error at the synchronisation");
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    for (const auto& p : parts) REQUIRE(msg.find(p) != std::string::npos);
  }
  REQUIRE_NOTHROW(kiln::cuda::synchronize());  // reported once
}

TEST_CASE("out-of-range indices: reported at the next synchronisation, nothing written out of bounds",
          "[cuda][indexing]") {
  kiln::manual_seed(63);
  Tensor x = kiln::randn({10, 4}).to(kGpu);
  Tensor bad = kiln::tensor(std::vector<int64_t>{1, 2, 10, 3}).to(kGpu);
  Tensor y;
  require_error_at_sync([&] { y = x.index_select(0, bad); }, {"index_select", "index 10", "size 10"});
  // The valid positions are gathered; the bad one reads as 0.
  Tensor yc = y.cpu(), xc = x.cpu();
  REQUIRE(kiln::equal(yc.select(0, 0), xc.select(0, 1)));
  REQUIRE(kiln::equal(yc.select(0, 3), xc.select(0, 3)));
  REQUIRE(kiln::equal(yc.select(0, 2), kiln::zeros({4})));
  // A negative index, found by a blocking copy (to(cpu)) rather than synchronize().
  Tensor neg = kiln::tensor(std::vector<int32_t>{0, -3}).to(kGpu);
  REQUIRE_THROWS_WITH(x.index_select(0, neg).cpu(), Catch::Contains("-3") && Catch::Contains("negative"));
  // Scatters into the first 10 rows of a 12-row buffer: rows 10 and 11 must stay untouched.
  for (bool deterministic : {false, true}) {
    kiln::DeterministicGuard g(deterministic);
    Tensor big = kiln::zeros({12, 4}).to(kGpu);
    Tensor target = big.slice(0, 0, 10);
    require_error_at_sync(
        [&] {
          kiln::kernels::index_add(target, 0, bad, kiln::ones({4, 4}).to(kGpu));
        },
        {"index_add", "index 10"});
    Tensor bc = big.cpu();
    INFO("deterministic " << deterministic);
    REQUIRE(bc.slice(0, 10, 12).abs().sum().item<double>() == 0.0);
    REQUIRE(bc.sum().item<double>() == 12.0);  // the three valid rows got their adds
    // scatter_add along dim 1 with index 4 into the first 4 of 6 columns
    Tensor wide = kiln::zeros({2, 6}).to(kGpu);
    Tensor cols = wide.slice(1, 0, 4);
    Tensor idx = kiln::tensor(std::vector<int64_t>{0, 4, 2, 1}).view({2, 2}).to(kGpu);
    require_error_at_sync(
        [&] {
          kiln::kernels::scatter_add(cols, 1, idx, kiln::ones({2, 2}).to(kGpu));
        },
        {"scatter_add", "index 4", "size 4"});
    Tensor wc = wide.cpu();
    REQUIRE(wc.slice(1, 4, 6).abs().sum().item<double>() == 0.0);
    REQUIRE(wc.sum().item<double>() == 3.0);
  }
  // gather along dim 1
  Tensor gidx = kiln::tensor(std::vector<int64_t>{0, 3, 7, 1}).view({2, 2}).to(kGpu);
  require_error_at_sync([&] { (void)x.gather(1, gidx); }, {"gather", "index 7", "size 4"});
  // embedding: the op is named, whether it checks on the host or on the device.
  try {
    (void)kiln::embedding(x, kiln::tensor(std::vector<int64_t>{11}).to(kGpu));
    kiln::cuda::synchronize();
    FAIL("no error");
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("embedding") != std::string::npos);
    REQUIRE(msg.find("11") != std::string::npos);
  }
  // The CUDA context is still usable.
  REQUIRE(kiln::allclose((x * 2.0).cpu(), xc * 2.0, 1e-6, 1e-6));
  REQUIRE_NOTHROW(kiln::cuda::check_device_errors());
}

TEST_CASE("in-range index ops do not synchronise: sync-debug is silent and a CUDA graph captures them",
          "[cuda][indexing]") {
  kiln::manual_seed(64);
  struct ModeRestore {
    kiln::cuda::SyncDebugMode saved = kiln::cuda::sync_debug_mode();
    ~ModeRestore() { kiln::cuda::set_sync_debug_mode(saved); }
  } restore;
  Tensor w = kiln::randn({50, 16}).to(kGpu);
  Tensor idx = kiln::randint(0, 50, {64}).to(kGpu);
  Tensor gidx = kiln::randint(0, 16, {50, 3}).to(kGpu);
  Tensor target = kiln::zeros({50, 16}).to(kGpu), src = kiln::randn({64, 16}).to(kGpu);
  Tensor ones = kiln::ones({50, 3}).to(kGpu);
  kiln::cuda::synchronize();
  kiln::cuda::set_sync_debug_mode(kiln::cuda::SyncDebugMode::Error);
  Tensor y, g;
  REQUIRE_NOTHROW(y = w.index_select(0, idx));
  REQUIRE_NOTHROW(g = w.gather(1, gidx));
  REQUIRE_NOTHROW(kiln::kernels::index_add(target, 0, idx, src));
  REQUIRE_NOTHROW(kiln::kernels::scatter_add(target, 1, gidx, ones));
  kiln::cuda::set_sync_debug_mode(kiln::cuda::SyncDebugMode::Off);
  REQUIRE(kiln::equal(y.cpu(), w.cpu().index_select(0, idx.cpu())));
  REQUIRE(kiln::equal(g.cpu(), w.cpu().gather(1, gidx.cpu())));
  // Inside a graph capture (a host sync there would fail the capture).
  kiln::cuda::Graph graph;
  Tensor out;
  REQUIRE_NOTHROW(graph.capture([&] { out = w.index_select(0, idx); }));
  w.copy_(kiln::randn({50, 16}).to(kGpu));
  graph.replay();
  REQUIRE(kiln::equal(out.cpu(), w.cpu().index_select(0, idx.cpu())));
}

TEST_CASE("index_min_max on the GPU", "[cuda][indexing]") {
  // index_min_max on a strided device index, both dtypes, sizes around the block count
  for (int64_t n : {1, 255, 256 * 256 + 7, 1 << 20}) {
    for (DType it : {DType::I64, DType::I32}) {
      Tensor i = kiln::randint(-1000, 100000, {n, 2}, it).t();  // [2, n], non-contiguous
      auto cpu = kiln::kernels::index_min_max(i, "test");
      auto gpu = kiln::kernels::index_min_max(i.to(kGpu).t().contiguous().t(), "test");
      INFO("n = " << n);
      REQUIRE(gpu == cpu);
    }
  }
}
