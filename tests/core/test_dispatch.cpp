// The dispatch mechanism (kiln/kernels/dispatch.h): a kernel runs its operands' backend, two
// devices among the operands or a device without an implementation are one kiln::Error each,
// undefined operands are skipped, and families with an op enum name the op. CUDA "tensors" here
// are host memory labelled cuda:0 through from_blob: the check throws before any kernel touches
// them, so this runs without a GPU.
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "kiln/kernels/dispatch.h"
#include "kiln/kernels/pointwise.h"

namespace K = kiln::kernels;
using kiln::Device;
using kiln::Tensor;

namespace {

// A family of this test only, implemented on the CPU alone: out = x + y (f32, contiguous).
inline K::Kernel<void(const Tensor& out, const Tensor& x, const Tensor& y)> test_add{"test_add"};
void test_add_cpu(const Tensor& out, const Tensor& x, const Tensor& y) {
  for (int64_t i = 0; i < out.numel(); ++i)
    out.data_ptr<float>()[i] = x.data_ptr<float>()[i] + (y.defined() ? y.data_ptr<float>()[i] : 0.f);
}
KILN_REGISTER_KERNEL(test_add, CPU, test_add_cpu);

// Host memory that says it is on cuda:0 (never dereferenced as such).
Tensor labelled_cuda(std::vector<float>& host) {
  return kiln::from_blob(
      host.data(), {static_cast<int64_t>(host.size())}, [](void*) {}, kiln::TensorOptions().device(Device::cuda(0)));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("dispatch runs the CPU implementation for CPU operands", "[dispatch]") {
  Tensor x = kiln::tensor(std::vector<float>{1.f, 2.f, 3.f});
  Tensor y = kiln::tensor(std::vector<float>{10.f, 20.f, 30.f});
  Tensor out = kiln::zeros({3});
  test_add(out, x, y);
  CHECK(out.data_ptr<float>()[0] == 11.f);
  CHECK(out.data_ptr<float>()[2] == 33.f);
  SECTION("an undefined operand is optional and skipped by the device check") {
    test_add(out, x, Tensor());
    CHECK(out.data_ptr<float>()[1] == 2.f);
  }
  CHECK(test_add.has(K::Backend::CPU));
  CHECK_FALSE(test_add.has(K::Backend::CUDA));
}

TEST_CASE("dispatch errors: two devices, no operand, no backend", "[dispatch][errors]") {
  std::vector<float> host{1.f, 2.f, 3.f};
  Tensor on_gpu = labelled_cuda(host);
  Tensor x = kiln::ones({3}), out = kiln::zeros({3});

  const std::string mixed = error_of([&] { test_add(out, x, on_gpu); });
  CHECK_THAT(mixed, Catch::Contains("test_add: expected all tensors on one device") &&
                        Catch::Contains("cpu (sizes [3])") && Catch::Contains("cuda:0 (sizes [3])"));

  const std::string none = error_of([&] { test_add(Tensor(), Tensor(), Tensor()); });
  CHECK_THAT(none, Catch::Contains("test_add: every tensor operand is undefined"));

  const std::string missing = error_of([&] { test_add(on_gpu, on_gpu, on_gpu); });
  CHECK_THAT(missing, Catch::Contains("test_add: ") && Catch::Contains("cuda:0"));
  if (kiln::cuda::built_with_cuda())
    CHECK_THAT(missing, Catch::Contains("no kernel for tensors on cuda:0 in this build"));
  else CHECK_THAT(missing, Catch::Contains("kiln was built without CUDA"));
  CHECK(out.data_ptr<float>()[0] == 0.f);  // nothing ran
}

TEST_CASE("dispatch names the op of an op-enum family", "[dispatch][errors]") {
  std::vector<float> host{1.f, 2.f, 3.f};
  Tensor on_gpu = labelled_cuda(host);
  Tensor out = kiln::zeros({3});
  const std::string relu = error_of([&] { K::unary(K::UnaryOp::Relu, out, on_gpu, 0.0, 0.0); });
  CHECK_THAT(relu, Catch::Contains("relu: expected all tensors on one device"));
  const std::string add = error_of([&] { K::binary(K::BinaryOp::Add, out, out, on_gpu, 1.0, 0.0); });
  CHECK_THAT(add, Catch::Contains("add: expected all tensors on one device"));
}
