// Fuzz target: the text corpus readers: token shards (kiln::data::read_token_shard,
// TokenShardDataset) and character corpora (CharDataset::from_files), raw or gzip.
#include <kiln/kiln.h>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kiln_fuzz::write_input("input.ktok", data, size);
  kiln_fuzz::expect_clean(path, [&] {
    kiln::data::TokenShardDataset d({path}, 4);
    (void)d.get(d.size() - 1);
  });
  kiln_fuzz::expect_clean(path, [&] {
    auto d = kiln::data::CharDataset::from_files({path}, 8);
    (void)d.decode(d.get(0).input);
  });
  return 0;
}
