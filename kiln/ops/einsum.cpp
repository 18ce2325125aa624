// einsum, composed of permutes, reshapes, sums and matmul, on every device.
#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <string>

#include "kiln/core/autograd.h"
#include "kiln/core/shape.h"
#include "kiln/core/tensor.h"

namespace kiln {

// ---------------------------------------------------------------- einsum

namespace {

struct Operand {
  Tensor t;
  std::string labels;  // one letter per dim, no repeats
};

// Sums out the labels of `a` not in `keep`.
Operand sum_out(Operand a, const std::string& keep) {
  IntList dims;
  std::string rest;
  for (size_t i = 0; i < a.labels.size(); ++i) {
    if (keep.find(a.labels[i]) == std::string::npos) dims.push_back(static_cast<int64_t>(i));
    else rest.push_back(a.labels[i]);
  }
  if (dims.empty()) return a;
  return {sum(a.t, dims, false), rest};
}

Operand permute_to(const Operand& a, const std::string& order) {
  IntList perm;
  for (char c : order) perm.push_back(static_cast<int64_t>(a.labels.find(c)));
  bool identity = true;
  for (size_t i = 0; i < perm.size(); ++i) identity = identity && perm[i] == static_cast<int64_t>(i);
  return {identity ? a.t : a.t.permute(perm), order};
}

// a and b (labels distinct within each) -> the labels in `keep`, in the order
// [shared kept (batch), a-only, b-only].
Operand contract(Operand a, Operand b, const std::string& keep_all) {
  // labels only one side uses and nobody needs are summed out first
  std::string keep_a = keep_all + b.labels, keep_b = keep_all + a.labels;
  a = sum_out(a, keep_a);
  b = sum_out(b, keep_b);
  std::string batch, contracted, a_only, b_only;
  std::map<char, int64_t> size;
  for (size_t i = 0; i < a.labels.size(); ++i) size[a.labels[i]] = a.t.size(static_cast<int64_t>(i));
  for (size_t i = 0; i < b.labels.size(); ++i) size[b.labels[i]] = b.t.size(static_cast<int64_t>(i));
  for (char c : a.labels) {
    if (b.labels.find(c) == std::string::npos) a_only.push_back(c);
    else if (keep_all.find(c) != std::string::npos) batch.push_back(c);
    else contracted.push_back(c);
  }
  for (char c : b.labels)
    if (a.labels.find(c) == std::string::npos) b_only.push_back(c);
  auto prod = [&](const std::string& ls) {
    int64_t p = 1;
    for (char c : ls) p *= size[c];
    return p;
  };
  const int64_t B = prod(batch), M = prod(a_only), K = prod(contracted), N = prod(b_only);
  Tensor am = permute_to(a, batch + a_only + contracted).t.reshape({B, M, K});
  Tensor bm = permute_to(b, batch + contracted + b_only).t.reshape({B, K, N});
  IntList out_sizes;
  for (char c : batch + a_only + b_only) out_sizes.push_back(size[c]);
  return {matmul(am, bm).reshape(out_sizes), batch + a_only + b_only};
}

}  // namespace

Tensor einsum(const std::string& equation, const std::vector<Tensor>& tensors) {
  std::string eq;
  for (char c : equation)
    if (c != ' ') eq.push_back(c);
  KILN_CHECK(eq.find("...") == std::string::npos, "einsum: \"...\" (ellipsis) is not supported: ", equation);
  const size_t arrow = eq.find("->");
  std::string lhs = eq.substr(0, arrow);
  std::vector<std::string> specs;
  size_t start = 0;
  while (true) {
    size_t comma = lhs.find(',', start);
    specs.push_back(lhs.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  KILN_CHECK(specs.size() == tensors.size(), "einsum: the equation \"", equation, "\" names ", specs.size(),
             " operands but ", tensors.size(), " tensors were given");
  std::map<char, int> count;
  std::map<char, int64_t> size;
  std::vector<Operand> ops;
  for (size_t k = 0; k < specs.size(); ++k) {
    const std::string& s = specs[k];
    const Tensor& t = tensors[k];
    KILN_CHECK(t.defined(), "einsum: operand ", k, " is undefined");
    for (char c : s)
      KILN_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: invalid subscript '", c, "' in \"", equation,
                 "\" (letters, ',' and '->' only)");
    KILN_CHECK(static_cast<int64_t>(s.size()) == t.dim(), "einsum: operand ", k, " has ", t.dim(), " dims (sizes ",
               t.sizes(), ") but its subscripts \"", s, "\" name ", s.size());
    Operand op{t, s};
    std::set<char> distinct(s.begin(), s.end());
    if (distinct.size() != s.size()) {
      // a repeated label: only a square matrix's diagonal ("ii") is supported
      KILN_CHECK(s.size() == 2 && s[0] == s[1] && t.size(0) == t.size(1),
                 "einsum: repeated "
                 "subscripts within an operand are supported only as \"ii\" on a square matrix, got \"",
                 s, "\" with sizes ", t.sizes());
      Tensor idx = arange(static_cast<double>(t.size(0)), TensorOptions().dtype(DType::I64).device(t.device()));
      Tensor eye = (idx.unsqueeze(1) == idx.unsqueeze(0)).to(t.dtype());
      op = {sum(t * eye, {1}, false), std::string(1, s[0])};
    }
    for (size_t i = 0; i < op.labels.size(); ++i) {
      char c = op.labels[i];
      int64_t n = op.t.size(static_cast<int64_t>(i));
      auto it = size.find(c);
      KILN_CHECK(it == size.end() || it->second == n, "einsum: subscript '", c, "' has size ", n, " for operand ", k,
                 " but size ", it == size.end() ? 0 : it->second, " elsewhere (no broadcasting)");
      size[c] = n;
      ++count[c];
    }
    ops.push_back(std::move(op));
  }
  std::string out;
  if (arrow != std::string::npos) {
    out = eq.substr(arrow + 2);
    std::set<char> seen;
    for (char c : out) {
      KILN_CHECK(std::isalpha(static_cast<unsigned char>(c)), "einsum: invalid output subscript '", c, "' in \"",
                 equation, "\"");
      KILN_CHECK(size.count(c), "einsum: output subscript '", c, "' does not appear in the inputs");
      KILN_CHECK(seen.insert(c).second, "einsum: output subscript '", c, "' appears twice");
    }
  } else {  // implicit: the labels used once, in alphabetical order
    for (auto& [c, n] : count)
      if (n == 1) out.push_back(c);
  }
  // Fold left: keep what later operands or the output need.
  Operand acc = ops[0];
  for (size_t k = 1; k < ops.size(); ++k) {
    std::string keep = out;
    for (size_t j = k + 1; j < ops.size(); ++j) keep += ops[j].labels;
    acc = contract(acc, ops[k], keep);
  }
  acc = sum_out(acc, out);
  return permute_to(acc, out).t;
}

}  // namespace kiln
