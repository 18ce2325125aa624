// Fuzz target: kiln-train's checkpoint reader (--resume): a safetensors file whose metadata holds
// the run's identity, position, schedule and RNG state, restored into a small model with SGD,
// a OneCycle schedule and an EMA. A checkpoint written by the seed maker for this same setup
// resumes; anything else must be a kiln::Error naming the file.
#include <kiln/kiln.h>

#include "tests/fuzz/checkpoint_setup.h"
#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln_fuzz::write_input("checkpoint.safetensors", data, size);
  kiln_fuzz::CheckpointSetup s;
  kiln_fuzz::expect_clean(path, [&] {
    kiln_train::load_checkpoint(path, s.options, s.model, *s.optimizer, s.scheduler.get(), s.ema.get());
  });
  return 0;
}
