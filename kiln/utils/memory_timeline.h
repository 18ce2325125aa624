#pragma once
// The caching allocator's recorded history (kiln/cuda/caching_allocator.h, MemoryEvent) as
// pictures, like PyTorch's memory snapshot tools:
//   write_memory_trace     a Chrome trace: counter tracks "allocated" and "reserved", and an
//                          instant event per alloc/free/segment event with its label
//                          (open in Perfetto or chrome://tracing)
//   write_memory_timeline  a self-contained HTML page: the two curves as SVG, and a table of
//                          allocations by MemoryLabel (count, bytes, peak live)
//
//   kiln::cuda::record_memory_history(true);
//   ... train a few steps ...
//   kiln::utils::export_cuda_memory_timeline("memory.html");  // the current device's history
#include <string>
#include <vector>

#include "kiln/cuda/caching_allocator.h"

namespace kiln::utils {

void write_memory_trace(const std::vector<MemoryEvent>& events, const std::string& path);
void write_memory_timeline(const std::vector<MemoryEvent>& events, const std::string& title, const std::string& path);

// The recorded history of CUDA device `device` (-1: the current one), written as above. Without
// CUDA they throw, as cuda::memory_history does.
void export_cuda_memory_trace(const std::string& path_json, int device = -1);
void export_cuda_memory_timeline(const std::string& path_html, int device = -1);

}  // namespace kiln::utils
