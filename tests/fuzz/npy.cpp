// Fuzz target: NumPy .npy files (kiln::load_npy), versions 1 to 3.
#include <kiln/kiln.h>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln_fuzz::write_input("input.npy", data, size);
  kiln_fuzz::expect_clean(path, [&] {
    kiln::Tensor t = kiln::load_npy(path);
    if (t.dtype() != kiln::DType::Bool) (void)t.to(kiln::DType::F64).sum().item<double>();
  });
  return 0;
}
