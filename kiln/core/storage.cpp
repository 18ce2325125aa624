#include "kiln/core/storage.h"

#include <cstdlib>
#include <cstring>

#include "kiln/core/error.h"

namespace kiln {

namespace {

class AlignedCpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (nbytes == 0) return nullptr;
    size_t rounded = (nbytes + 63) / 64 * 64;  // aligned_alloc needs a multiple of the alignment
    void* p = std::aligned_alloc(64, rounded);
    KILN_CHECK(p != nullptr, "CPU allocator: out of memory allocating ", nbytes, " bytes");
    return p;
  }
  void deallocate(void* ptr) override { std::free(ptr); }
};

Allocator* g_allocators[2] = {nullptr, nullptr};
Allocator* g_pinned = nullptr;

}  // namespace

Allocator* cpu_allocator() {
  static AlignedCpuAllocator a;
  return &a;
}

void register_allocator(DeviceType type, Allocator* a) { g_allocators[static_cast<int>(type)] = a; }
void register_pinned_allocator(Allocator* a) { g_pinned = a; }

Allocator* allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  Allocator* a = g_allocators[static_cast<int>(device.type)];
  KILN_CHECK(a != nullptr, "no allocator for device ", device,
             ": kiln was built without CUDA support (configure with -DKILN_CUDA=ON)");
  return a;
}

Allocator* pinned_allocator() { return g_pinned ? g_pinned : cpu_allocator(); }

Storage::Storage(size_t nbytes, Device device, Allocator* alloc)
    : nbytes_(nbytes), device_(device), alloc_(alloc) {
  data_ = alloc_->allocate(nbytes);
  pinned_ = device.is_cpu() && alloc == g_pinned && g_pinned != nullptr;
}

Storage::Storage(void* data, size_t nbytes, Device device, Deleter deleter)
    : data_(data), nbytes_(nbytes), device_(device), deleter_(std::move(deleter)) {}

Storage::~Storage() {
  if (alloc_) {
    if (data_) alloc_->deallocate(data_);
  } else if (deleter_) {
    deleter_(data_);
  }
}

}  // namespace kiln
