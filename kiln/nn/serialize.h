#pragma once
// Checkpoints in the safetensors format (readable by the safetensors Python package and
// PyTorch) and single tensors as .npy. Files are written atomically: a temporary file in the
// same directory, fsync, rename. Loading validates everything and names the path and the reason.
//
// safetensors layout: 8-byte little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the tensors' bytes, offsets relative to the end of the header, with no holes.
#include <map>
#include <string>

#include "kiln/nn/module.h"

namespace kiln {

using Metadata = std::map<std::string, std::string>;

void save(const nn::StateDict& tensors, const std::string& path, const Metadata& metadata = {});
void save(const nn::Module& module, const std::string& path, const Metadata& metadata = {});
// All tensors of a safetensors file, on the CPU. `metadata`, when given, receives __metadata__.
nn::StateDict load(const std::string& path, Metadata* metadata = nullptr);
// Loads into an existing module (see Module::load_state_dict for strict).
void load(nn::Module& module, const std::string& path, bool strict = true);

// NumPy .npy (format 1.0), C order, little-endian; the dtypes kiln has (bf16 is not a NumPy type
// and is refused).
void save_npy(const Tensor& tensor, const std::string& path);
Tensor load_npy(const std::string& path);

// Writes `bytes` to `path` atomically (temporary file + fsync + rename): a crash leaves either the
// old file or the new one, never a torn one. Shared by checkpoint writers.
void write_file_atomic(const std::string& path, const std::string& bytes);

}  // namespace kiln
