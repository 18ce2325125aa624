// The acceptance check of the CMake package: a separate project finds the installed kiln with
// find_package(kiln), links kiln::kiln, and differentiates x*x + 3x, whose gradient is 2x + 3.
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <exception>

int main() {
  try {
    auto x = kiln::randn({3, 4}, kiln::TensorOptions().requires_grad(true));
    (x * x + x * 3.0).sum().backward();

    if (!x.grad().defined()) {
      std::printf("package consumer: FAILED: x.grad() is undefined after backward()\n");
      return 1;
    }
    if (x.grad().numel() != x.numel()) {
      std::printf("package consumer: FAILED: x.grad() has %lld elements, x has %lld\n",
                  static_cast<long long>(x.grad().numel()), static_cast<long long>(x.numel()));
      return 1;
    }
    const kiln::Tensor xc = x.contiguous();
    const kiln::Tensor gc = x.grad().contiguous();
    const float* xv = xc.data_ptr<float>();
    const float* gv = gc.data_ptr<float>();
    int bad = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float want = 2.0f * xv[i] + 3.0f;
      if (!(std::fabs(gv[i] - want) <= 1e-5f)) {
        std::printf("package consumer: mismatch at %lld: x=%.8g grad=%.8g expected 2x+3=%.8g\n",
                    static_cast<long long>(i), xv[i], gv[i], want);
        ++bad;
      }
    }
    if (bad) {
      std::printf("package consumer: FAILED (%d of %lld gradients wrong)\n", bad, static_cast<long long>(x.numel()));
      return 1;
    }
    std::printf("package consumer: OK\n");
    return 0;
  } catch (const std::exception& e) {
    std::printf("package consumer: FAILED with exception: %s\n", e.what());
    return 1;
  }
}
