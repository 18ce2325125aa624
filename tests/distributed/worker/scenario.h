#pragma once
// The rank program of the multi-process tests (kiln-dist-worker SCENARIO [ARGS...]). Each
// scenario is a function run by every rank; a rank that finds a wrong value throws, and the
// worker's main turns an exception into exit code 1 with the message on stderr. Scenarios live
// in one file per subject (collectives, ddp, zero, failures) and register themselves.
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace kiln_test {

using Scenario = std::function<void(const std::vector<std::string>& args)>;
std::map<std::string, Scenario>& scenarios();

struct RegisterScenario {
  RegisterScenario(const char* name, Scenario fn) { scenarios()[name] = std::move(fn); }
};

}  // namespace kiln_test

#define KILN_SCENARIO_CAT2(a, b) a##b
#define KILN_SCENARIO_CAT(a, b) KILN_SCENARIO_CAT2(a, b)
// KILN_SCENARIO("all_reduce_sum") { ... uses `args` ... }
#define KILN_SCENARIO(name)                                                                    \
  static void KILN_SCENARIO_CAT(scenario_fn_, __LINE__)(const std::vector<std::string>& args); \
  static ::kiln_test::RegisterScenario KILN_SCENARIO_CAT(scenario_reg_, __LINE__)(             \
      name, KILN_SCENARIO_CAT(scenario_fn_, __LINE__));                                        \
  static void KILN_SCENARIO_CAT(scenario_fn_, __LINE__)(const std::vector<std::string>& args)

// Throws std::runtime_error with the message when `cond` is false.
#define KILN_EXPECT(cond, ...)                                                                              \
  do {                                                                                                      \
    if (!(cond)) throw std::runtime_error(::kiln::detail::concat("check failed: " #cond " ", __VA_ARGS__)); \
  } while (0)
