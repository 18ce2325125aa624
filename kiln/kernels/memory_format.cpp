// Layout queries for 4-D image tensors (kernels/memory_format.h).
#include "kiln/kernels/memory_format.h"

namespace kiln::kernels {

bool has_layout(const Tensor& t, MemoryFormat fmt) {
  if (fmt == MemoryFormat::Contiguous) return t.is_contiguous();
  if (fmt != MemoryFormat::ChannelsLast || t.dim() != 4) return false;
  const int64_t N = t.size(0), C = t.size(1), H = t.size(2), W = t.size(3);
  return (C == 1 || t.stride(1) == 1) && (W == 1 || t.stride(3) == C) && (H == 1 || t.stride(2) == W * C) &&
         (N == 1 || t.stride(0) == H * W * C);
}

MemoryFormat memory_format(const Tensor& t) {
  if (t.dim() != 4) return MemoryFormat::Contiguous;
  const int64_t C = t.size(1), H = t.size(2), W = t.size(3);
  const IntList& st = t.strides();
  if (st[3] == 1 && st[2] == W && st[1] == H * W && st[0] == C * H * W) return MemoryFormat::Contiguous;
  if (st[1] == 1 && st[3] == C && st[2] == W * C && st[0] == H * W * C) return MemoryFormat::ChannelsLast;
  if (t.is_contiguous()) return MemoryFormat::Contiguous;
  return has_layout(t, MemoryFormat::ChannelsLast) ? MemoryFormat::ChannelsLast : MemoryFormat::Contiguous;
}

Tensor empty_4d(const IntList& s, const TensorOptions& opts, MemoryFormat fmt) {
  if (fmt != MemoryFormat::ChannelsLast) return empty(s, opts);
  return empty({s[0], s[2], s[3], s[1]}, opts).permute({0, 3, 1, 2});
}

}  // namespace kiln::kernels
