// Fuzz target: CIFAR binary batches (kiln::data::CIFAR10 and CIFAR100, the test split), the same
// bytes read as both layouts.
#include <kiln/kiln.h>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string ten = kiln_fuzz::write_input("test_batch.bin", data, size);
  const std::string hundred = kiln_fuzz::write_input("test.bin", data, size);
  const std::string dir = kiln_fuzz::scratch_dir();
  kiln_fuzz::expect_clean(ten, [&] {
    kiln::data::CIFAR10 d(dir, kiln::data::Split::Test);
    if (d.size() > 0) (void)d.get(d.size() - 1);
  });
  kiln_fuzz::expect_clean(hundred, [&] {
    kiln::data::CIFAR100 d(dir, kiln::data::Split::Test, /*fine=*/true);
    if (d.size() > 0) (void)d.get(0);
  });
  return 0;
}
