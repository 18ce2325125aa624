// DataLoader on a CUDA device: pinned + asynchronous copies on the copy stream give the same
// tensors as pageable synchronous ones, and pinned staging blocks are recycled.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include <kiln/data/data.h>
#include <kiln/kiln.h>

namespace D = kiln::data;

namespace {
class Images : public D::Dataset {
 public:
  explicit Images(int64_t n) : x_(kiln::randint(0, 256, {n, 3, 16, 16}).to(kiln::DType::U8)) {}
  int64_t size() const override { return x_.size(0); }
  D::Example get(int64_t i) const override {
    return {x_.select(0, i), kiln::scalar_tensor(double(i % 10), kiln::DType::I64)};
  }

 private:
  kiln::Tensor x_;
};
}  // namespace

TEST_CASE("pinned asynchronous loader copies equal pageable synchronous ones", "[cuda][data]") {
  kiln::manual_seed(11);
  Images ds(300);
  auto tf = D::Compose(D::RandomCrop(14, 2), D::RandomHorizontalFlip(), D::ToFloat(),
                       D::Normalize({0.5, 0.5, 0.5}, {0.25, 0.25, 0.25}));
  auto base = D::LoaderOptions().batch_size(32).shuffle(true).seed(5).transform(tf);
  D::DataLoader cpu(ds, base);
  D::DataLoader sync(ds, D::LoaderOptions(base).device(kiln::Device::cuda(0)).workers(2));
  D::DataLoader async(ds, D::LoaderOptions(base).device(kiln::Device::cuda(0)).workers(4).pin_memory(true));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<kiln::Tensor> want;
    for (auto& b : cpu) {
      want.push_back(b.input.clone());
      want.push_back(b.target.clone());
    }
    size_t k = 0;
    auto it_s = sync.begin();
    for (auto& b : async) {
      REQUIRE(b.input.device() == kiln::Device::cuda(0));
      REQUIRE(b.target.device() == kiln::Device::cuda(0));
      REQUIRE(kiln::equal(b.input.cpu(), want[k]));
      REQUIRE(kiln::equal(b.target.cpu(), want[k + 1]));
      REQUIRE(kiln::equal(it_s->input.cpu(), want[k]));
      ++it_s;
      k += 2;
    }
    REQUIRE(k == want.size());
  }
  // Pinned staging blocks are recycled once their copies completed.
  REQUIRE(async.stats().staging_allocations <= 3 * (8 + 3));
}

TEST_CASE("pinned loader keeps batches intact while the user holds them", "[cuda][data]") {
  kiln::manual_seed(12);
  Images ds(128);
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(16).workers(2).pin_memory(true).device(kiln::Device::cuda(0)));
  std::vector<kiln::Tensor> held;
  for (auto& b : loader) held.push_back(b.target);
  kiln::cuda::synchronize();
  for (size_t k = 0; k < held.size(); ++k)
    for (int64_t r = 0; r < 16; ++r) REQUIRE(held[k].cpu()[r].item<int64_t>() == (int64_t(k) * 16 + r) % 10);
}

namespace {
using kiln::Tensor;

// Samples of 3 x 256 x 256 floats (768 KiB) filled with the sample's index: batches of 16 take
// about a millisecond to copy to the device.
class Planes : public D::Dataset {
 public:
  int64_t size() const override { return 64; }
  D::Example get(int64_t i) const override {
    return {kiln::full({3, 256, 256}, double(i) + 0.5), kiln::scalar_tensor(double(i), kiln::DType::I64)};
  }
};
}  // namespace

TEST_CASE("a prefetched batch dropped mid-copy is not reused before its copy ends", "[cuda][data]") {
  // The loader issues batch 1's copy (on its copy stream, after the compute stream's queued work)
  // when it delivers batch 0. Cutting the epoch short frees batch 1's device buffers while that
  // copy may not even have started; memory allocated next on the compute stream must not be
  // those buffers, or the late copy would overwrite what the compute stream writes there.
  Planes ds;
  D::DataLoader loader(
      ds, D::LoaderOptions().batch_size(16).workers(2).prefetch(2).pin_memory(true).device(kiln::Device::cuda(0)));
  loader.start_epoch();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // batches 0 and 1 are built
  // Keep the compute stream busy, so that batch 1's copy waits behind this work.
  Tensor m = kiln::randn({4096, 4096}).to(kiln::Device::cuda(0)) * (1.0 / 64.0);
  Tensor busy = m;
  for (int i = 0; i < 30; ++i) busy = kiln::mm(busy, m);
  D::Batch b0;
  REQUIRE(loader.next(&b0));
  REQUIRE(b0.index == 0);
  b0 = D::Batch{};
  loader.start_epoch();  // drops the prefetched batch 1 with its copy in flight
  std::vector<Tensor> fresh;
  for (int i = 0; i < 4; ++i)
    fresh.push_back(kiln::full({16, 3, 256, 256}, -7.0, kiln::TensorOptions().device(kiln::Device::cuda(0))));
  kiln::cuda::synchronize();
  for (const Tensor& f : fresh) REQUIRE(kiln::equal(f.cpu(), kiln::full({16, 3, 256, 256}, -7.0)));
  // The loader still delivers correct batches afterwards.
  D::Batch b;
  REQUIRE(loader.next(&b));
  REQUIRE(b.input.cpu().select(0, 0).max().item<double>() == double(b.indices[0]) + 0.5);
}
