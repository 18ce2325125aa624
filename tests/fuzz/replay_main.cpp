// The replay driver of a fuzz target (fuzz_target.h), for CTest with any compiler: runs the target
// on every file given (folders: every file inside), then, with --mutate N, on N deterministic
// mutations of each: truncations, flipped bytes, forged little- and big-endian lengths, a broken
// header byte and trailing junk. Prints how many inputs were accepted and how many ended in a
// kiln::Error; a contract violation aborts (fuzz_target.h).
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;

void collect(const std::string& path, std::vector<std::string>& out) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "replay: %s: no such file or folder\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    out.push_back(path);
    return;
  }
  std::vector<std::string> names;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') names.emplace_back(e->d_name);
    ::closedir(d);
  }
  std::sort(names.begin(), names.end());
  for (const auto& n : names) collect(path + "/" + n, out);
}

Bytes read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  return Bytes(s.begin(), s.end());
}

// A small deterministic generator (splitmix64), so every machine replays the same mutations.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t below(size_t n) { return n ? static_cast<size_t>(next() % n) : 0; }
};

// Mutation k of `seed`: the kinds cycle so each appears N/6 times.
Bytes mutate(const Bytes& seed, int k, Rng& rng) {
  Bytes b = seed;
  switch (k % 6) {
    case 0:  // truncated anywhere, the header included
      b.resize(rng.below(b.size() + 1));
      break;
    case 1:  // a few flipped bits
      for (int i = 0, n = 1 + static_cast<int>(rng.below(4)); i < n && !b.empty(); ++i)
        b[rng.below(b.size())] ^= static_cast<uint8_t>(1u << rng.below(8));
      break;
    case 2:    // a forged length: 4 or 8 bytes somewhere in the first 64 set to a huge value
    case 3: {  // the same, big-endian (IDX headers)
      static const uint64_t forged[] = {0xFFFFFFFFull,         0x7FFFFFFFull,     0x80000000ull,
                                        0xFFFFFFFFFFFFFFFFull, uint64_t(1) << 40, 0x40000000ull};
      const uint64_t v = forged[rng.below(6)];
      const size_t width = rng.below(2) ? 8 : 4;
      if (b.size() < width) break;
      const size_t at = rng.below(std::min<size_t>(b.size() - width, 64) + 1);
      for (size_t i = 0; i < width; ++i) {
        const size_t shift = k % 6 == 2 ? 8 * i : 8 * (width - 1 - i);
        b[at + i] = static_cast<uint8_t>(v >> shift);
      }
      break;
    }
    case 4: {  // a broken header: a byte of the first 128 replaced by a structural character
      static const char chars[] = "{}[]:,\"'()0-9 \n\x00\xff";
      if (!b.empty())
        b[rng.below(std::min<size_t>(b.size(), 128))] = static_cast<uint8_t>(chars[rng.below(sizeof chars - 1)]);
      break;
    }
    case 5:  // trailing junk
      for (size_t i = 0, n = 1 + rng.below(64); i < n; ++i) b.push_back(static_cast<uint8_t>(rng.next()));
      break;
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) {
  int mutations = 0;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mutate") == 0 && i + 1 < argc) mutations = std::atoi(argv[++i]);
    else collect(argv[i], files);
  }
  if (files.empty()) {
    std::fprintf(stderr, "usage: %s [--mutate N] FILE_OR_FOLDER...\n", argv[0]);
    return 2;
  }
  long inputs = 0;
  for (const auto& f : files) {
    const Bytes seed = read_bytes(f);
    LLVMFuzzerTestOneInput(seed.data(), seed.size());
    ++inputs;
    uint64_t h = 1469598103934665603ull;  // FNV-1a of the file name: the same mutations on every machine
    for (char c : f.substr(f.rfind('/') + 1)) h = (h ^ static_cast<uint8_t>(c)) * 1099511628211ull;
    Rng rng{h};
    for (int k = 0; k < mutations; ++k) {
      const Bytes m = mutate(seed, k, rng);
      LLVMFuzzerTestOneInput(m.data(), m.size());
      ++inputs;
    }
  }
  const auto& t = kiln_fuzz::tally();
  std::printf("replay: %ld inputs from %zu files: %ld accepted, %ld clear kiln::Error, 0 other outcomes\n", inputs,
              files.size(), t.accepted, t.errors);
  return 0;
}
