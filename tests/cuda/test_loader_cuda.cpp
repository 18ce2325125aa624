// DataLoader on a CUDA device: pinned + asynchronous copies on the copy stream give the same
// tensors as pageable synchronous ones, and pinned staging blocks are recycled.
#include <catch2/catch.hpp>

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
  D::DataLoader async(ds, D::LoaderOptions(base).device(kiln::Device::cuda(0)).workers(4)
                              .pin_memory(true));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<kiln::Tensor> want;
    for (auto& b : cpu) { want.push_back(b.input.clone()); want.push_back(b.target.clone()); }
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
  D::DataLoader loader(ds, D::LoaderOptions().batch_size(16).workers(2).pin_memory(true)
                               .device(kiln::Device::cuda(0)));
  std::vector<kiln::Tensor> held;
  for (auto& b : loader) held.push_back(b.target);
  kiln::cuda::synchronize();
  for (size_t k = 0; k < held.size(); ++k)
    for (int64_t r = 0; r < 16; ++r)
      REQUIRE(held[k].cpu()[r].item<int64_t>() == (int64_t(k) * 16 + r) % 10);
}
