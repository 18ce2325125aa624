// The options idiom (kiln/core/arg.h) on TensorOptions and the data and utils options: each
// default is stated once, each getter reads what its setter wrote, and setters chain.
#include <catch2/catch.hpp>

#include <type_traits>

#include <kiln/kiln.h>

using kiln::Device;
using kiln::DType;
using kiln::TensorOptions;
namespace data = kiln::data;
namespace utils = kiln::utils;

static_assert(std::is_same_v<decltype(TensorOptions().dtype(DType::F64)), TensorOptions&>,
              "setters return the options for chaining");
static_assert(std::is_same_v<decltype(std::declval<const TensorOptions&>().device()), const Device&>,
              "getters read without copying");
// dtype() is written by hand (it also records that a dtype was named: has_dtype()) and returns
// the one-byte enum by value.
static_assert(std::is_same_v<decltype(std::declval<const TensorOptions&>().dtype()), DType>,
              "dtype() returns the enum");

TEST_CASE("TensorOptions: defaults, setters, implicit construction", "[options]") {
  const TensorOptions defaults;
  CHECK(defaults.dtype() == DType::F32);
  CHECK(defaults.device() == Device::cpu());
  CHECK_FALSE(defaults.requires_grad());
  CHECK_FALSE(defaults.pinned_memory());

  const TensorOptions chained = TensorOptions().dtype(DType::F64).requires_grad(true).pinned_memory(true);
  CHECK(chained.dtype() == DType::F64);
  CHECK(chained.requires_grad());
  CHECK(chained.pinned_memory());
  CHECK(chained.device() == Device::cpu());

  const TensorOptions from_dtype = DType::I64;  // implicit, as in libtorch
  CHECK(from_dtype.dtype() == DType::I64);
  CHECK(from_dtype.device() == Device::cpu());
  const TensorOptions from_device = Device::cpu();
  CHECK(from_device.dtype() == DType::F32);

  // the factories read the getters
  auto x = kiln::zeros({2, 3}, TensorOptions().dtype(DType::F64).requires_grad(true));
  CHECK(x.dtype() == DType::F64);
  CHECK(x.requires_grad());
}

TEST_CASE("data options: defaults and chained setters", "[options]") {
  const data::LoaderOptions loader;
  CHECK(loader.batch_size() == 1);
  CHECK_FALSE(loader.shuffle());
  CHECK(loader.workers() == 0);
  CHECK(loader.prefetch() == 0);
  CHECK_FALSE(loader.seed().has_value());
  CHECK(loader.timeout() == 0);
  CHECK(loader.pad_value() == 0.0);
  CHECK(loader.target_pad_value() == -100.0);
  CHECK(loader.sampler() == nullptr);

  const data::LoaderOptions set =
      data::LoaderOptions().batch_size(64).shuffle(true).workers(2).seed(7).timeout(250).padding_mask(true);
  CHECK(set.batch_size() == 64);
  CHECK(set.shuffle());
  CHECK(set.workers() == 2);
  REQUIRE(set.seed().has_value());
  CHECK(*set.seed() == 7u);
  CHECK(set.timeout() == 250);
  CHECK(set.padding_mask());

  const data::CollateOptions collate = data::CollateOptions().pad_value(-1.0).always_mask(true);
  CHECK(collate.pad_value() == -1.0);
  CHECK(collate.target_pad_value() == -100.0);
  CHECK(collate.always_mask());
  CHECK_FALSE(collate.conversion().active);

  const data::BucketOptions bucket = data::BucketOptions(512).max_batch_size(8).distributed(1, 4);
  CHECK(bucket.max_tokens() == 512);
  CHECK(bucket.max_batch_size() == 8);
  CHECK(bucket.shuffle());
  CHECK(bucket.pool() == 64);
  CHECK(bucket.rank() == 1);
  CHECK(bucket.world_size() == 4);
  CHECK(data::BucketOptions().max_tokens() == 4096);
}

TEST_CASE("utils options: defaults and chained setters", "[options]") {
  const utils::PlotOptions plot = utils::PlotOptions().width(640).x_label("epoch");
  CHECK(plot.width() == 640);
  CHECK(plot.panel_height() == 240);
  CHECK(plot.text_scale() == 2);
  CHECK(plot.x_label() == "epoch");

  const utils::ProgressOptions progress = utils::ProgressOptions().max_lines(5).clock([] { return 3.5; });
  CHECK(progress.bar_width() == 24);
  CHECK(progress.percent_interval() == 10.0);
  CHECK(progress.max_lines() == 5);
  CHECK(progress.max_width() == -1);
  REQUIRE(progress.clock());
  CHECK(progress.clock()() == 3.5);
}
