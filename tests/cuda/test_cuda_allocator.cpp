// The caching device allocator on a real GPU: reuse, stats, the out-of-memory message, history.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <kiln/kiln.h>

namespace {
constexpr size_t MiB = 1024 * 1024;
}

TEST_CASE("caching allocator reuses device memory", "[cuda][allocator]") {
  auto dev = kiln::Device::cuda(0);
  kiln::cuda::synchronize();
  { auto warm = kiln::empty({1024, 1024}, kiln::TensorOptions().device(dev)); }
  auto before = kiln::cuda::memory_stats(0);
  for (int i = 0; i < 50; ++i) {
    auto t = kiln::empty({1024, 1024}, kiln::TensorOptions().device(dev));
    auto u = kiln::empty({1000}, kiln::TensorOptions().device(dev));
  }
  auto after = kiln::cuda::memory_stats(0);
  CHECK(after.num_allocs >= before.num_allocs + 100);
  CHECK(after.num_backend_allocs <= before.num_backend_allocs + 1);  // the small pool, once
  CHECK(after.allocated_bytes == before.allocated_bytes);
}

TEST_CASE("memory_stats reflects a 4 MiB tensor", "[cuda][allocator]") {
  auto dev = kiln::Device::cuda(0);
  auto before = kiln::cuda::memory_stats(0);
  kiln::cuda::reset_peak_memory_stats(0);
  {
    auto t = kiln::zeros({1024 * 1024}, kiln::TensorOptions().device(dev));  // f32: 4 MiB
    auto s = kiln::cuda::memory_stats(0);
    CHECK(s.allocated_bytes == before.allocated_bytes + 4 * MiB);
    CHECK(s.reserved_bytes >= s.allocated_bytes);
    CHECK(s.peak_allocated_bytes >= before.allocated_bytes + 4 * MiB);
    CHECK(kiln::cuda::memory_summary(0).find("allocated:") != std::string::npos);
  }
  kiln::cuda::synchronize();
  CHECK(kiln::cuda::memory_stats(0).allocated_bytes == before.allocated_bytes);
  kiln::cuda::empty_cache();
  CHECK(kiln::cuda::memory_stats(0).reserved_bytes <= before.reserved_bytes);
}

TEST_CASE("an impossible device allocation throws with the allocator summary", "[cuda][allocator]") {
  auto dev = kiln::Device::cuda(0);
  auto ooms = kiln::cuda::memory_stats(0).num_ooms;
  try {
    auto t = kiln::empty({int64_t{1} << 40}, kiln::TensorOptions().device(dev));  // 4 TiB
    FAIL("expected an out-of-memory error");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    CHECK(msg.find("out of memory") != std::string::npos);
    CHECK(msg.find(std::to_string(size_t{4} << 40)) != std::string::npos);
    CHECK(msg.find("reserved:") != std::string::npos);
    CHECK(msg.find("largest free block:") != std::string::npos);
  }
  CHECK(kiln::cuda::memory_stats(0).num_ooms == ooms + 1);
  auto t = kiln::ones({16}, kiln::TensorOptions().device(dev));  // still usable
  CHECK(t.sum().item<float>() == 16.0f);
}

TEST_CASE("device memory history exports", "[cuda][allocator]") {
  auto dev = kiln::Device::cuda(0);
  kiln::cuda::record_memory_history(true);
  {
    kiln::MemoryLabel label("gpu-test");
    auto t = kiln::empty({256, 1024}, kiln::TensorOptions().device(dev));
  }
  kiln::cuda::record_memory_history(false);
  std::string json = "/tmp/kiln_cuda_mem_trace.json", html = "/tmp/kiln_cuda_mem.html";
  kiln::utils::export_cuda_memory_trace(json, 0);
  kiln::utils::export_cuda_memory_timeline(html, 0);
  std::ifstream fj(json), fh(html);
  std::stringstream sj, sh;
  sj << fj.rdbuf();
  sh << fh.rdbuf();
  CHECK(sj.str().find("\"ph\":\"C\"") != std::string::npos);
  CHECK(sj.str().find("gpu-test") != std::string::npos);
  CHECK(sh.str().find("<svg") != std::string::npos);
  std::remove(json.c_str());
  std::remove(html.c_str());
}

TEST_CASE("set_per_process_memory_fraction caps the allocator; the next step trains", "[cuda][allocator]") {
  auto dev = kiln::Device::cuda(0);
  kiln::cuda::synchronize();
  kiln::cuda::empty_cache();
  CHECK_THROWS_AS(kiln::cuda::set_per_process_memory_fraction(0.0), kiln::Error);
  CHECK_THROWS_AS(kiln::cuda::set_per_process_memory_fraction(1.5), kiln::Error);
  // 1% of an H200 is about 1.4 GB: a 4 GB tensor is refused, with the cap in the message.
  kiln::cuda::set_per_process_memory_fraction(0.01);
  try {
    auto t = kiln::empty({int64_t{1} << 30}, kiln::TensorOptions().device(dev));
    FAIL("expected an out-of-memory error at the cap");
  } catch (const kiln::Error& e) {
    std::string msg = e.what();
    CHECK(msg.find("out of memory") != std::string::npos);
    CHECK(msg.find("set_per_process_memory_fraction") != std::string::npos);
    CHECK(msg.find("bytes free of") != std::string::npos);  // the device's own figures
  }
  {  // a small training step still runs under the cap
    kiln::nn::Linear fc(64, 8);
    fc.to(dev);
    kiln::optim::SGD opt(fc.parameters(), kiln::optim::SGDOptions(0.1));
    auto x = kiln::randn({32, 64}).to(dev);
    auto loss = fc.forward(x).pow(2).mean();
    loss.backward();
    opt.step();
    CHECK(std::isfinite(loss.item<float>()));
  }
  kiln::cuda::set_per_process_memory_fraction(1.0);
  auto big = kiln::empty({int64_t{1} << 30}, kiln::TensorOptions().device(dev));  // 4 GB fits again
  CHECK(big.numel() == int64_t{1} << 30);
}
