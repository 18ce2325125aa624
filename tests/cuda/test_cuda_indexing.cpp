// CUDA indexing kernels (kernels/cuda/indexing.cu) vs the CPU: index_select, gather, index_add,
// scatter_add, embedding forward/backward, one_hot, index_min_max, on random inputs with repeated
// indices, int64 and int32 indices, transposed/sliced operands and every dtype. Gathers move bits
// (compared exactly). Atomic scatters add in an unspecified order (f32 compared to 1e-5); with
// kiln::set_deterministic_algorithms(true) the scatters are ordered, bitwise equal to the CPU and
// reproducible from run to run. Out-of-range indices throw before anything is written.
#include <catch2/catch.hpp>

#include <cmath>

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

double tol(DType dt) {
  return dt == DType::BF16 ? 5e-2 : dt == DType::F16 ? 5e-3 : dt == DType::F64 ? 1e-12 : 1e-5;
}

Tensor values_of(DType dt, const kiln::IntList& sizes) {
  if (dt == DType::U8) return kiln::randint(0, 8, sizes).to(DType::U8);
  if (dt == DType::I32 || dt == DType::I64) return kiln::randint(-50, 50, sizes, dt);
  return kiln::randn(sizes).to(dt);
}

// Runs body() with the deterministic switch set to `on`, restoring it afterwards.
template <class F>
void with_determinism(bool on, F&& body) {
  kiln::DeterministicGuard g(on);
  body();
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
        Tensor cpu = out.clone();
        kiln::kernels::index_add(cpu, dim, idx, src);
        Tensor gpu_atomic = out.to(kGpu);
        with_determinism(false, [&] { kiln::kernels::index_add(gpu_atomic, dim, idx.to(kGpu), src.to(kGpu)); });
        if (kiln::is_floating(dt)) require_close(gpu_atomic, cpu, tol(dt) * 4, "index_add atomic");
        else require_equal(gpu_atomic, cpu, "index_add atomic (integers are exact)");
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
        Tensor cpu = out.clone();
        kiln::kernels::scatter_add(cpu, dim, idx, src);
        Tensor gpu_atomic = out.to(kGpu);
        with_determinism(false, [&] { kiln::kernels::scatter_add(gpu_atomic, dim, idx.to(kGpu), src.to(kGpu)); });
        if (kiln::is_floating(dt)) require_close(gpu_atomic, cpu, tol(dt) * 4, "scatter_add atomic");
        else require_equal(gpu_atomic, cpu, "scatter_add atomic");
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

TEST_CASE("out-of-range indices throw before anything is written; index_min_max", "[cuda][indexing]") {
  kiln::manual_seed(63);
  Tensor x = kiln::randn({10, 4}).to(kGpu);
  Tensor bad = kiln::tensor(std::vector<int64_t>{1, 2, 10, 3}).to(kGpu);
  try {
    (void)x.index_select(0, bad);
    FAIL("no error");
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    INFO(msg);
    REQUIRE(msg.find("index_select") != std::string::npos);
    REQUIRE(msg.find("10") != std::string::npos);
    REQUIRE(msg.find("size 10") != std::string::npos);
  }
  Tensor neg = kiln::tensor(std::vector<int32_t>{0, -3}).to(kGpu);
  REQUIRE_THROWS_WITH(x.index_select(0, neg), Catch::Contains("-3"));
  Tensor target = kiln::zeros({10, 4}).to(kGpu);
  REQUIRE_THROWS_AS(kiln::kernels::index_add(target, 0, bad, kiln::ones({4, 4}).to(kGpu)), kiln::Error);
  REQUIRE(target.abs().sum().cpu().item<double>() == 0.0);  // untouched
  REQUIRE_THROWS_AS(kiln::kernels::scatter_add(target, 1, kiln::full({2, 2}, 4.0, DType::I64).to(kGpu),
                                               kiln::ones({2, 2}).to(kGpu)),
                    kiln::Error);
  REQUIRE(target.abs().sum().cpu().item<double>() == 0.0);
  REQUIRE_THROWS_AS(kiln::embedding(x, kiln::tensor(std::vector<int64_t>{11}).to(kGpu)), kiln::Error);
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
