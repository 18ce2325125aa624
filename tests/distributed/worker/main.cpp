// kiln-dist-worker: runs one scenario as one rank (tests/distributed/worker/scenario.h).
#include <cstdio>
#include <exception>
#include <iostream>

#include "tests/distributed/worker/scenario.h"

namespace kiln_test {
std::map<std::string, Scenario>& scenarios() {
  static std::map<std::string, Scenario> all;
  return all;
}
}  // namespace kiln_test

int main(int argc, char** argv) {
  if (argc < 2 || !kiln_test::scenarios().count(argv[1])) {
    std::cerr << "usage: kiln-dist-worker SCENARIO [ARGS...]; scenarios:";
    for (const auto& [name, fn] : kiln_test::scenarios()) std::cerr << ' ' << name;
    std::cerr << '\n';
    return 2;
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    kiln_test::scenarios()[argv[1]](args);
  } catch (const std::exception& e) {
    std::cerr << "kiln-dist-worker " << argv[1] << ": " << e.what() << std::endl;
    return 1;
  }
  std::cout << "kiln-dist-worker " << argv[1] << ": ok" << std::endl;
  return 0;
}
