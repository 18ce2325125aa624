#pragma once
// PyTorch's outputs and gradients that the nn tests compare against, kept as data beside the
// tests so that a test file shows its checks rather than pages of numbers:
// tests/nn/torch_reference/<file>.json maps each table's name to {"shape": [...], "values": [...]}
// (row-major, float64 as PyTorch printed them with full precision; the shape is checked against
// the count of values when the file is read).
#include <string>
#include <vector>

namespace kiln_test {

// The values of table `name` in torch_reference/<file>.json, read once per file. Throws
// std::runtime_error naming the file and the table when either is missing or malformed.
const std::vector<double>& torch_reference(const std::string& file, const std::string& name);

}  // namespace kiln_test
