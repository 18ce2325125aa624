#include "kiln/core/generator.h"

#include <deque>

#include "kiln/core/tensor.h"

namespace kiln {

namespace {
std::mutex g_mu;
std::deque<Generator>& cuda_generators() {
  static std::deque<Generator> gens;  // deque: references stay valid as it grows
  return gens;
}
}  // namespace

Generator& default_generator(Device device) {
  static Generator cpu;
  if (device.is_cpu()) return cpu;
  std::lock_guard<std::mutex> lock(g_mu);
  auto& gens = cuda_generators();
  while (static_cast<int>(gens.size()) <= device.index) gens.emplace_back(cpu.seed());
  return gens[device.index];
}

void manual_seed(uint64_t seed) {
  default_generator(Device::cpu()).manual_seed(seed);
  // Generators for devices not used yet are created later from the CPU seed, offset 0.
  std::lock_guard<std::mutex> lock(g_mu);
  for (auto& g : cuda_generators()) g.manual_seed(seed);
}

}  // namespace kiln
