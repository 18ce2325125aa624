#pragma once
// kiln-guide's command line.
#include <cstdint>
#include <string>

namespace kiln_guide {

struct Options {
  std::string device = "auto";  // auto | cpu | cuda
  std::string label;            // the machine as the report names it beside the CPU model
  bool quick = false;           // the default mode: one round per side, short runs
  bool full = false;            // 3 rounds per side, longer runs
  std::string only;             // tip numbers or keys, comma-separated; empty: all
  int repeats = 0;              // rounds per side; 0: the mode's (quick 1, full 3)
  std::string out;              // the report folder
  std::string kiln_train;       // empty: the kiln-train next to kiln-guide
  std::string data;             // Fashion-MNIST folder for the vision models
  std::string gpt_data;         // text file or folder for the GPT
  bool list = false;            // print the tips and exit
  int64_t steps = 0;            // advanced: every run trains this many steps
};

// Parses argv. --help prints the usage and exits 0; a syntax error prints CLI11's message and
// exits non-zero (as every CLI11 program does).
Options parse_options(int argc, char** argv);

}  // namespace kiln_guide
