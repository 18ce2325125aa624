// Fuzz target: IDX files (kiln::data::read_idx), raw or gzip, as Fashion-MNIST ships them.
#include <kiln/kiln.h>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln_fuzz::write_input("input-idx3-ubyte", data, size);
  kiln_fuzz::expect_clean(path, [&] {
    kiln::Tensor t = kiln::data::read_idx(path);
    (void)t.numel();
  });
  return 0;
}
