// DataLoader: determinism across worker counts, epochs, drop_last, errors, timeouts, shutdown,
// staging reuse, fused transforms and padded batches.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <set>

#include "data_test_util.h"

namespace D = kiln::data;
using kiln_test::ImageDataset;
using kiln_test::IndexDataset;
using kiln_test::SeqDataset;

namespace {
std::vector<std::vector<int64_t>> epoch_indices(D::DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (auto& b : loader) out.push_back(b.indices);
  return out;
}
}  // namespace

TEST_CASE("identical batches for a fixed seed with 0, 1 and 4 workers", "[data][loader]") {
  ImageDataset ds(70, 3, 12, 12);
  auto tf = D::Compose(D::RandomCrop(10, 2), D::RandomHorizontalFlip(), D::ToFloat(),
                       D::Normalize({0.5, 0.4, 0.3}, {0.2, 0.25, 0.3}));
  std::vector<std::vector<kiln::Tensor>> runs;
  for (int w : {0, 1, 4}) {
    D::DataLoader loader(ds, D::LoaderOptions().batch_size(8).shuffle(true).seed(7).workers(w).transform(tf));
    std::vector<kiln::Tensor> got;
    for (int e = 0; e < 2; ++e)
      for (auto& b : loader) {
        got.push_back(b.input.clone());
        got.push_back(b.target.clone());
      }
    runs.push_back(got);
  }
  REQUIRE(runs[0].size() == 2 * 2 * 9);
  for (size_t r = 1; r < runs.size(); ++r)
    for (size_t k = 0; k < runs[0].size(); ++k) REQUIRE(kiln::equal(runs[0][k], runs[r][k]));
}

TEST_CASE("every sample once per epoch, reshuffled per epoch", "[data][loader]") {
  IndexDataset ds(103);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(10).shuffle(true).seed(1).workers(2));
  REQUIRE(loader.size() == 11);
  auto e0 = epoch_indices(loader);
  auto e1 = epoch_indices(loader);
  for (auto* e : {&e0, &e1}) {
    std::vector<int64_t> all;
    for (auto& b : *e) all.insert(all.end(), b.begin(), b.end());
    std::sort(all.begin(), all.end());
    REQUIRE(all.size() == 103);
    for (int64_t i = 0; i < 103; ++i) REQUIRE(all[static_cast<size_t>(i)] == i);
  }
  REQUIRE(e0 != e1);
  REQUIRE(loader.history().size() == 2);
  REQUIRE(loader.history()[1].epoch == 1);
  REQUIRE(loader.history()[1].samples == 103);
  // Replaying epoch 0 gives epoch 0's order again.
  loader.set_epoch(0);
  REQUIRE(epoch_indices(loader) == e0);
}

TEST_CASE("batch contents follow the indices; sequential order without shuffle", "[data][loader]") {
  IndexDataset ds(10);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(4).workers(1));
  int64_t k = 0;
  for (auto& b : loader) {
    REQUIRE(b.input.dim() == 2);
    REQUIRE(b.input.size(1) == 3);
    REQUIRE(b.target.dtype() == kiln::DType::I64);
    for (int64_t r = 0; r < b.size(); ++r, ++k) {
      REQUIRE(b.indices[static_cast<size_t>(r)] == k);
      REQUIRE(b.target[r].item<int64_t>() == k);
      REQUIRE(b.input[r][2].item<float>() == 3.0f * float(k));
    }
  }
  REQUIRE(k == 10);
}

TEST_CASE("drop_last", "[data][loader]") {
  IndexDataset ds(10);
  D::DataLoader keep(ds, D::LoaderOptions().batch_size(4));
  D::DataLoader drop(ds, D::LoaderOptions().batch_size(4).drop_last(true).workers(2));
  REQUIRE(keep.size() == 3);
  REQUIRE(drop.size() == 2);
  auto k = epoch_indices(keep);
  auto d = epoch_indices(drop);
  REQUIRE(k.size() == 3);
  REQUIRE(k.back().size() == 2);
  REQUIRE(d.size() == 2);
  for (auto& b : d) REQUIRE(b.size() == 4);
}

TEST_CASE("a worker exception is rethrown with the sample index", "[data][loader]") {
  IndexDataset ds(40, /*throw_at=*/13);
  for (int w : {0, 3}) {
    D::DataLoader loader(ds, D::LoaderOptions().batch_size(4).workers(w));
    int64_t seen = 0;
    try {
      for (auto& b : loader) seen += b.size();
      FAIL("no exception");
    } catch (const D::LoaderError& e) {
      REQUIRE(e.sample_index() == 13);
      REQUIRE(e.batch_index() == 3);
      REQUIRE_THAT(e.what(), Catch::Contains("sample 13") && Catch::Contains("synthetic failure"));
    }
    REQUIRE(seen == 12);  // batches before the failing one were delivered, in order
  }
}

TEST_CASE("the timeout fires instead of hanging", "[data][loader]") {
  IndexDataset ds(8, -1, /*sleep_ms=*/150);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(4).workers(1).timeout(20));
  auto t0 = std::chrono::steady_clock::now();
  REQUIRE_THROWS_WITH(loader.begin(), Catch::Contains("timed out"));
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(s < 0.5);
}

TEST_CASE("destroying a loader mid-epoch stops the workers", "[data][loader]") {
  IndexDataset ds(2000, -1, /*sleep_ms=*/1);
  auto t0 = std::chrono::steady_clock::now();
  {
    D::DataLoader loader(ds, D::LoaderOptions().batch_size(16).workers(4).prefetch(4));
    auto it = loader.begin();
    ++it;
    REQUIRE(it->size() == 16);
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  REQUIRE(s < 1.0);
  // Workers built at most the prefetch window beyond the consumer.
  REQUIRE(ds.gets.load() <= 16 * (2 + 4 + 4));
  // Abandoning an epoch by starting another also works.
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(16).workers(2));
  (void)loader.begin();
  (void)loader.begin();
  REQUIRE(loader.epoch() == 1);
}

TEST_CASE("staging buffers are recycled: no allocation per batch in steady state", "[data][loader]") {
  ImageDataset ds(256, 1, 8, 8);
  for (bool pin : {false, true}) {
    D::DataLoader loader(ds, D::LoaderOptions().batch_size(8).workers(2).prefetch(3).pin_memory(pin).transform(
                                 D::Compose(D::ToFloat())));
    for (int e = 0; e < 6; ++e)
      for (auto& b : loader) (void)b;
    // 192 batches of (input, target); blocks are bounded by the prefetch window, not the batch
    // count: (prefetch + in hand + the worker that just finished) x 2 fields.
    REQUIRE(loader.stats().staging_allocations <= 2 * (3 + 3));
    REQUIRE(loader.stats().batches == 32);
    REQUIRE(loader.stats().wait_seconds >= 0.0);
    REQUIRE(loader.stats().wait_seconds <= loader.stats().epoch_seconds + 1e-3);
  }
}

TEST_CASE("a batch the user keeps is not overwritten", "[data][loader]") {
  IndexDataset ds(64);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(4).workers(2));
  std::vector<kiln::Tensor> kept;
  for (auto& b : loader) kept.push_back(b.target);
  for (size_t k = 0; k < kept.size(); ++k)
    for (int64_t r = 0; r < 4; ++r) REQUIRE(kept[k][r].item<int64_t>() == int64_t(k) * 4 + r);
}

TEST_CASE("fused ToFloat/Normalize/ChannelsLast equals the transforms run one by one", "[data][loader]") {
  ImageDataset ds(20, 3, 10, 10);
  auto tf = D::Compose(D::RandomCrop(8, 1), D::RandomHorizontalFlip(), D::ToFloat(),
                       D::Normalize({0.5, 0.4, 0.3}, {0.2, 0.25, 0.3}), D::ChannelsLast());
  size_t run_per_sample = 0;
  D::Conversion conv;
  run_per_sample = tf.split_fused(&conv);
  REQUIRE(run_per_sample == 2);
  REQUIRE(conv.active);
  REQUIRE(conv.channels_last);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(5).seed(3).workers(2).transform(tf));
  for (auto& b : loader) {
    REQUIRE(b.input.sizes() == kiln::IntList{5, 3, 8, 8});
    REQUIRE(b.input.strides() == kiln::IntList{192, 1, 24, 3});  // NHWC memory
    for (int64_t r = 0; r < 5; ++r) {
      int64_t i = b.indices[static_cast<size_t>(r)];
      D::Example ex = ds.get(i);
      D::DataRng rng(3, 0, static_cast<uint64_t>(i), D::RngStream::Transform);
      tf.apply(ex, rng);  // unfused
      REQUIRE(ex.input.strides() == kiln::IntList{1, 24, 3});
      REQUIRE(kiln::allclose(b.input[r], ex.input, 1e-5, 1e-5));
    }
  }
  // f16 output
  D::DataLoader half(ds, D::LoaderOptions().batch_size(4).transform(
                             D::Compose(D::ToFloat(kiln::DType::F16), D::Normalize({0.5}, {0.5}))));
  auto b = *half.begin();
  REQUIRE(b.input.dtype() == kiln::DType::F16);
  auto ref = (ds.get(0).input.to(kiln::DType::F32) / 255.0 - 0.5) / 0.5;
  REQUIRE(kiln::allclose(b.input[0].to(kiln::DType::F32), ref, 1e-3, 1e-3));
}

TEST_CASE("variable-length samples are padded with a mask", "[data][loader]") {
  SeqDataset ds(50, 12);
  auto bucket = std::make_shared<D::BucketBatchSampler>(D::lengths_of(ds), D::BucketOptions(40).seed(5));
  D::DataLoader loader(ds, D::LoaderOptions().batch_sampler(bucket).workers(2).padding_mask(true));
  int64_t rows = 0;
  for (auto& b : loader) {
    REQUIRE(b.mask.defined());
    REQUIRE(b.mask.dtype() == kiln::DType::Bool);
    REQUIRE(b.input.numel() <= 40);
    for (int64_t r = 0; r < b.size(); ++r, ++rows) {
      int64_t i = b.indices[static_cast<size_t>(r)];
      int64_t len = ds.length(i);
      for (int64_t t = 0; t < b.input.size(1); ++t) {
        bool real = t < len;
        REQUIRE(b.mask[r][t].item<bool>() == real);
        REQUIRE(b.input[r][t].item<int64_t>() == (real ? i * 1000 + t : 0));
        REQUIRE(b.target[r][t].item<int64_t>() == (real ? i * 1000 + t : -100));
      }
    }
  }
  REQUIRE(rows == 50);
  // Without padding_mask, batches whose rows all have one length come without a mask.
  D::DataLoader plain(ds, D::LoaderOptions().batch_size(1));
  REQUIRE(!(*plain.begin()).mask.defined());
  D::DataLoader two(ds, D::LoaderOptions().batch_size(2));
  REQUIRE((*two.begin()).mask.defined());
}

TEST_CASE("TensorDataset is zero-copy and the loader stacks its rows", "[data][loader]") {
  auto x = kiln::arange(24, kiln::DType::F32).reshape({6, 4});
  auto y = kiln::arange(6, kiln::DType::I64);
  D::TensorDataset ds(x, y);
  REQUIRE(ds.size() == 6);
  REQUIRE(ds.get(2).input.data_ptr<float>() == x.data_ptr<float>() + 8);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(3));
  auto b = *loader.begin();
  REQUIRE(kiln::equal(b.input, x.slice(0, 0, 3)));
  REQUIRE(kiln::equal(b.target, y.slice(0, 0, 3)));
  REQUIRE_THROWS_WITH(D::TensorDataset(x, kiln::arange(5, kiln::DType::I64)), Catch::Contains("same first dimension"));
}

TEST_CASE("bad loader options and devices are refused", "[data][loader]") {
  IndexDataset ds(4);
  REQUIRE_THROWS_AS(D::DataLoader(ds, D::LoaderOptions().batch_size(0)), kiln::Error);
  REQUIRE_THROWS_AS(D::DataLoader(ds, D::LoaderOptions().workers(-1)), kiln::Error);
  if (!kiln::cuda::is_available())
    REQUIRE_THROWS_AS(D::DataLoader(ds, D::LoaderOptions().device(kiln::Device::cuda(0))), kiln::Error);
}
