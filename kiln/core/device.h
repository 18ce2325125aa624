#pragma once
// Where a tensor lives. Streams are per device; on the CPU there is one implicit stream.
#include <cstdint>
#include <ostream>
#include <string>

namespace kiln {

enum class DeviceType : uint8_t { CPU, CUDA };

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(t == DeviceType::CPU ? 0 : i) {}
  static constexpr Device cpu() { return Device(DeviceType::CPU, 0); }
  static constexpr Device cuda(int i = 0) { return Device(DeviceType::CUDA, i); }
  // Parses "cpu", "cuda", "cuda:1".
  static Device parse(const std::string& s);

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

inline std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

// A queue of work on a device. `handle` is the native stream (cudaStream_t) or null for the
// default stream / the CPU. Stream objects are cheap values; ownership of native streams stays
// with the backend that created them.
struct Stream {
  Device device;
  void* handle = nullptr;
  bool operator==(const Stream& o) const { return device == o.device && handle == o.handle; }
};

}  // namespace kiln
