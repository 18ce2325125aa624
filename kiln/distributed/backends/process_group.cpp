#include "kiln/distributed/backends/process_group.h"

#include <sstream>
#include <thread>

#include "kiln/core/error.h"

namespace kiln::distributed {

const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "Sum";
    case ReduceOp::Avg: return "Avg";
    case ReduceOp::Max: return "Max";
    case ReduceOp::Min: return "Min";
    case ReduceOp::Product: return "Product";
  }
  return "?";
}

std::string describe_tensors(const std::vector<Tensor>& tensors) {
  std::ostringstream os;
  if (!tensors.empty() && tensors[0].defined()) os << dtype_name(tensors[0].dtype()) << ' ';
  os << '[';
  for (size_t i = 0; i < tensors.size(); ++i) {
    os << (i ? ", " : "");
    if (tensors[i].defined()) {
      os << '[';
      const auto& sizes = tensors[i].sizes();
      for (size_t d = 0; d < sizes.size(); ++d) os << (d ? ", " : "") << sizes[d];
      os << ']';
    } else {
      os << "undefined";
    }
  }
  os << ']';
  return os.str();
}

void check_collective_tensors(const char* collective, const std::vector<Tensor>& tensors, DeviceType device_type,
                              const std::string& backend) {
  KILN_CHECK(!tensors.empty(), collective, ": got no tensors");
  const Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    KILN_CHECK(t.defined(), collective, ": tensor ", i, " is undefined");
    KILN_CHECK(t.device().type == device_type, collective, ": the ", backend, " process group takes ",
               (device_type == DeviceType::CPU ? "CPU" : "CUDA"), " tensors, got one on ", t.device(),
               (device_type == DeviceType::CPU ? " (use the nccl backend, or \"auto\", for CUDA tensors)"
                                               : " (use the gloo backend, or \"auto\", for CPU tensors)"));
    KILN_CHECK(t.is_contiguous(), collective, ": tensor ", i, " (sizes ", t.sizes(),
               ") is not contiguous; call .contiguous() first (collectives write in place)");
    KILN_CHECK(t.dtype() == first.dtype(), collective, ": tensors have different dtypes (", dtype_name(first.dtype()),
               " and ", dtype_name(t.dtype()), ")");
    KILN_CHECK(t.device() == first.device(), collective, ": tensors are on different devices (", first.device(),
               " and ", t.device(), ")");
    KILN_CHECK(t.dtype() != DType::Bool, collective,
               ": bool tensors are not supported; "
               "convert to uint8 first");
  }
}

void check_reduce_op(const char* collective, ReduceOp op, DType dtype) {
  KILN_CHECK(op != ReduceOp::Avg || is_floating(dtype), collective,
             ": ReduceOp::Avg needs a "
             "floating-point tensor, got ",
             dtype_name(dtype), " (use Sum and divide)");
}

std::string exited_ranks_hint(const std::function<std::vector<int>()>& exited_ranks, std::chrono::milliseconds wait) {
  if (!exited_ranks) return "";
  const auto until = std::chrono::steady_clock::now() + wait;
  do {
    std::vector<int> exited = exited_ranks();
    if (!exited.empty()) {
      std::string list;
      for (size_t i = 0; i < exited.size(); ++i) list += (i ? ", " : "") + std::to_string(exited[i]);
      return detail::concat(". Rank", exited.size() > 1 ? "s " : " ", list, exited.size() > 1 ? " have" : " has",
                            " exited (or been killed) in the meantime");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  } while (std::chrono::steady_clock::now() < until);
  return "";
}

}  // namespace kiln::distributed
