#pragma once
// The one global switch for deterministic algorithms (PyTorch's
// torch.use_deterministic_algorithms): when on, kernels that would otherwise accumulate with
// atomics in an unspecified order (index_add / scatter_add on CUDA, ...) use an ordered algorithm
// instead, so two runs on the same device give bitwise identical results. Off by default (the
// atomic versions are faster). CPU kernels are deterministic either way.
//
// Read it where the choice is made (a launcher), never cache it: it may be flipped at any time.
namespace kiln {

void set_deterministic_algorithms(bool on);
bool deterministic_algorithms();

// RAII: sets the switch for a scope and restores the previous value.
class DeterministicGuard {
 public:
  explicit DeterministicGuard(bool on) : prev_(deterministic_algorithms()) { set_deterministic_algorithms(on); }
  ~DeterministicGuard() { set_deterministic_algorithms(prev_); }
  DeterministicGuard(const DeterministicGuard&) = delete;
  DeterministicGuard& operator=(const DeterministicGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace kiln
