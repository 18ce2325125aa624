#pragma once
// What every fuzz target checks (docs/robustness.md): a reader given any bytes returns a valid
// result or throws a kiln::Error that names the file; never another exception, a crash, a hang
// or an allocation sized by a forged field. The last three are found by the engine (libFuzzer's
// timeout and malloc limit, AddressSanitizer, UBSan); the first by fuzz_expect_clean, which
// aborts (a finding) on anything else.
//
// Each target defines LLVMFuzzerTestOneInput. Built with clang's -fsanitize=fuzzer it is a fuzzer
// (scripts/fuzz.sh); built with replay_main.cpp it replays files and deterministic mutations of
// them, which CTest runs with any compiler.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <functional>
#include <string>

#include <kiln/core/error.h>

namespace kiln_fuzz {

// A private scratch folder for the inputs written as files, removed at exit.
inline const std::string& scratch_dir() {
  static const std::string dir = [] {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/kiln-fuzz-XXXXXX";
    if (!::mkdtemp(tmpl.data())) {
      std::perror("kiln-fuzz: mkdtemp");
      std::abort();
    }
    static const std::string removed = tmpl;
    std::atexit([] { std::system(("rm -rf '" + removed + "'").c_str()); });
    return tmpl;
  }();
  return dir;
}

// Writes the input to scratch_dir()/name and returns the path.
inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  std::string path = scratch_dir() + "/" + name;
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  if (!f) {
    std::fprintf(stderr, "kiln-fuzz: cannot write %s\n", path.c_str());
    std::abort();
  }
  return path;
}

[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "kiln-fuzz: FINDING: %s\n", what.c_str());
  std::abort();
}

// Counts kept for the replay driver's summary.
struct Tally {
  long accepted = 0, errors = 0;
};
inline Tally& tally() {
  static Tally t;
  return t;
}

// Runs `read`; a kiln::Error must contain `must_name` (the path) unless it is empty.
inline void expect_clean(const std::string& must_name, const std::function<void()>& read) {
  try {
    read();
  } catch (const kiln::Error& e) {
    const std::string msg = e.what();
    if (!must_name.empty() && msg.find(must_name) == std::string::npos)
      finding("kiln::Error without the file's name '" + must_name + "': " + msg);
    ++tally().errors;
    return;
  } catch (const std::exception& e) {
    finding(std::string("an exception other than kiln::Error: ") + e.what());
  } catch (...) {
    finding("a thrown value that is not an exception");
  }
  ++tally().accepted;
}

}  // namespace kiln_fuzz
