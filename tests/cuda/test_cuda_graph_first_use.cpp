// The device error record (out-of-range indices found by kernels) created by a graph capture.
// scripts/gpu-verdict.sh runs each GPU test file in its own process, so here the process's first
// bounds-checked op runs inside the capture: the record must be zeroed for real, not only as a
// captured memset, or a check before the first replay would report a bogus index.
#include <catch2/catch.hpp>

#include <kiln/kiln.h>

using kiln::Tensor;

TEST_CASE("a bounds-checked op first run inside a graph capture reports no bogus index", "[cuda][graph]") {
  const kiln::Device gpu = kiln::Device::cuda(0);
  kiln::manual_seed(5);
  Tensor src = kiln::randn({64}).to(gpu);
  Tensor idx = kiln::randint(0, 64, {33}).to(gpu);
  kiln::cuda::synchronize();
  kiln::cuda::Graph graph;
  Tensor out;
  graph.capture_begin();
  out = src.index_select(0, idx);
  graph.capture_end();
  REQUIRE_NOTHROW(kiln::cuda::synchronize());  // reads the record before any replay
  graph.replay();
  REQUIRE_NOTHROW(kiln::cuda::synchronize());
  REQUIRE(kiln::equal(out.cpu(), src.cpu().index_select(0, idx.cpu())));
  // and a real out-of-range index is still reported, after the replay that found it
  Tensor bad = kiln::full({1}, 64.0, kiln::TensorOptions().dtype(kiln::DType::I64).device(gpu));
  (void)src.index_select(0, bad);
  REQUIRE_THROWS_WITH(kiln::cuda::synchronize(), Catch::Contains("out of range"));
}
