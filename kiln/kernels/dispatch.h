#pragma once
// The one dispatch mechanism from a kernel family to its per-device implementation.
//
// A kernel family is declared once, in its family header, as an inline `Kernel` object:
//
//   inline Kernel<void(UnaryOp, const Tensor&, const Tensor&, double, double)> unary{"unary"};
//
// Each backend defines its implementation in its own file and registers it right below it:
//
//   void unary(UnaryOp op, ...) { ... }                      // in kiln::kernels::cpu
//   KILN_REGISTER_KERNEL(kernels::unary, CPU, unary);        // kernels/cpu/pointwise.cpp
//   ... and the same with CUDA in kernels/cuda/pointwise.cu
//
// Calling `kernels::unary(op, out, in, a, b)` checks that every defined tensor operand (a
// `Tensor` or a `std::vector<Tensor>` argument) is on one device and runs that device's
// implementation. Kernels whose tensors sit inside a struct compute the device with
// `operand_device(...)` and call `kernel.on(device, args...)`. So an op reaches its CPU loop or
// CUDA kernel through three files: the op (kiln/ops or kiln/nn/functional), the family header
// here, the backend file. See docs/architecture.md, "Kernels and dispatch".
#include <array>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "kiln/core/cpu_isa_level.h"
#include "kiln/core/error.h"
#include "kiln/core/profiler.h"
#include "kiln/core/tensor.h"

namespace kiln::kernels {

// One implementation slot per kind of device.
enum class Backend : uint8_t { CPU = 0, CUDA = 1 };
inline constexpr int kNumBackends = 2;
inline constexpr int kNumCpuLevels = 3;  // kiln::kNumCpuIsas (kiln/core/cpu_isa.h)

namespace detail {

// Finds the one device of a kernel's defined tensor operands. Undefined tensors are optional
// operands (a bias, an unwanted gradient) and are skipped; non-tensor arguments are ignored.
struct OperandDevices {
  const char* op;
  const Tensor* first = nullptr;

  void add(const Tensor& t);
  void add(const std::vector<Tensor>& ts) {
    for (const Tensor& t : ts) add(t);
  }
  template <typename T, typename = std::enable_if_t<!std::is_convertible_v<const T&, const Tensor&>>>
  void add(const T&) {}
};

[[noreturn]] void no_operand(const char* op);
[[noreturn]] void no_backend(const char* op, Device device);

// A family whose first argument is an op enum with an `op_name` (UnaryOp, BinaryOp, ...) names
// itself by that op in errors ("relu: ..."), others by the family name.
template <typename A, typename = void> struct HasOpName : std::false_type {};
template <typename A> struct HasOpName<A, std::void_t<decltype(op_name(std::declval<A>()))>> : std::true_type {};

template <typename... Args> const char* display_name(const char* family, const Args&... args) {
  if constexpr (sizeof...(Args) > 0) {
    using First = std::decay_t<std::tuple_element_t<0, std::tuple<Args...>>>;
    if constexpr (std::is_enum_v<First> && HasOpName<First>::value)
      return op_name(std::get<0>(std::forward_as_tuple(args...)));
  }
  return family;
}

}  // namespace detail

// The device shared by every defined tensor operand among `args`; throws a kiln::Error naming
// `op`, both devices and both shapes when two differ, and when no operand is defined.
template <typename... Args> Device operand_device(const char* op, const Args&... args) {
  detail::OperandDevices devices{op};
  (devices.add(args), ...);
  if (!devices.first) detail::no_operand(op);
  return devices.first->device();
}

inline Backend backend_of(Device device) { return device.is_cuda() ? Backend::CUDA : Backend::CPU; }

template <typename Signature> class Kernel;

template <typename R, typename... Args> class Kernel<R(Args...)> {
 public:
  using Fn = R (*)(Args...);

  // constexpr, so every Kernel is initialised before any registration runs.
  constexpr explicit Kernel(const char* name) : name_(name), cuda_{}, cpu_{} {}
  Kernel(const Kernel&) = delete;
  Kernel& operator=(const Kernel&) = delete;

  const char* name() const { return name_; }
  bool has(Backend backend) const { return fn(backend) != nullptr; }
  // The CPU slot has one entry per CPU level (kiln/core/cpu_isa.h): the CPU kernel files are
  // compiled once per level and each copy registers itself at its own.
  void register_backend(Backend backend, Fn fn, int cpu_level = 0) {
    if (backend == Backend::CUDA) cuda_ = fn;
    else cpu_[cpu_level] = fn;
  }
  // The CPU implementation registered at `level`, or null: for tests of the dispatch.
  Fn cpu_at(int level) const { return cpu_[level]; }

  R operator()(Args... args) const {
    return on(operand_device(detail::display_name(name_, args...), args...), std::forward<Args>(args)...);
  }

  // Runs the implementation for `device` without looking at the operands.
  R on(Device device, Args... args) const {
    Fn f = fn(backend_of(device));
    if (!f) detail::no_backend(detail::display_name(name_, args...), device);
    if (profiler::detail::enabled()) {  // kiln/core/profiler.h: one op event per kernel call
      profiler::detail::OpScope scope(detail::display_name(name_, args...), device);
      (scope.add(args), ...);
      return f(std::forward<Args>(args)...);
    }
    return f(std::forward<Args>(args)...);
  }

 private:
  // CPU: the copy of the level in use, or of the highest level below it that has one (a kernel
  // registered outside kiln/kernels/cpu exists at the baseline only).
  Fn fn(Backend backend) const {
    if (backend == Backend::CUDA) return cuda_;
    for (int level = ::kiln::detail::cpu_isa_level(); level >= 0; --level)
      if (cpu_[level]) return cpu_[level];
    return nullptr;
  }

  const char* name_;
  Fn cuda_;
  std::array<Fn, kNumCpuLevels> cpu_;
};

}  // namespace kiln::kernels

#define KILN_KERNEL_CONCAT_(a, b) a##b
#define KILN_KERNEL_CONCAT(a, b) KILN_KERNEL_CONCAT_(a, b)

// Registers `fn` as `kernel`'s implementation for `backend` (CPU or CUDA) when the library loads.
// Used once per kernel and backend, in the backend's file, at namespace scope (kiln is a shared
// library, so every registration runs). A CPU kernel registers at the CPU level its file is
// compiled for (KILN_THIS_CPU_ISA).
#define KILN_REGISTER_KERNEL(kernel, backend, fn)                           \
  static const bool KILN_KERNEL_CONCAT(kiln_kernel_registered_, __LINE__) = \
      ((kernel).register_backend(::kiln::kernels::Backend::backend, (fn), KILN_THIS_CPU_ISA), true)
