// main() for the GPU test binary: exits with CTest's skip code (77) when there is no CUDA
// device, so CTest reports these tests as skipped rather than passed.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include <kiln/kiln.h>

int main(int argc, char** argv) {
  if (!kiln::cuda::is_available()) {
    std::printf("no CUDA device%s: skipping the GPU tests\n",
                kiln::cuda::built_with_cuda() ? "" : " (kiln built without CUDA)");
    return 77;
  }
  return Catch::Session().run(argc, argv);
}
