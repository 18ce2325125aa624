// Fuzz target: safetensors checkpoints (kiln::load), header and data.
#include <kiln/kiln.h>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln_fuzz::write_input("input.safetensors", data, size);
  kiln_fuzz::expect_clean(path, [&] {
    kiln::Metadata meta;
    kiln::nn::StateDict d = kiln::load(path, &meta);
    for (const auto& [name, t] : d) (void)t.sum().item<double>();  // the loaded bytes are readable
  });
  return 0;
}
