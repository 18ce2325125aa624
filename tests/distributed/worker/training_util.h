#pragma once
// What the DDP and ZeRO rank programs share: a small configurable network, a global batch every
// rank can regenerate, key=value arguments, closeness checks that throw with the worst element,
// the message of an expected Error, and a process group wrapper that records the collectives
// issued through it.
#include <kiln/kiln.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/distributed/distributed.h"
#include "kiln/distributed/backends/process_group.h"
#include "tests/error_of.h"  // error_of

namespace kiln_test {

// The kiln name the rank programs use most, in scope wherever `using namespace kiln_test;` is.
using kiln::Tensor;

// key=value arguments of a scenario.
class Args {
 public:
  explicit Args(const std::vector<std::string>& args) {
    for (const auto& a : args) {
      auto eq = a.find('=');
      if (eq == std::string::npos) throw std::runtime_error("argument without '=': " + a);
      values_[a.substr(0, eq)] = a.substr(eq + 1);
    }
  }
  std::string str(const std::string& key, const std::string& fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : it->second;
  }
  int64_t integer(const std::string& key, int64_t fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : std::stoll(it->second);
  }
  double real(const std::string& key, double fallback) const {
    auto it = values_.find(key);
    return it == values_.end() ? fallback : std::stod(it->second);
  }

 private:
  std::map<std::string, std::string> values_;
};

struct NetConfig {
  bool batch_norm = false;  // Linear -> BatchNorm1d -> ReLU -> Linear
  bool unused = false;      // a Linear registered last and never called
  bool extra = false;       // a Linear added to the output where use_extra is set
  bool swapped = false;     // fc2 registered before fc1 (registration order != gradient order)
  int64_t in = 8, hidden = 16, out = 4;
};

class Net : public kiln::nn::Module {
 public:
  explicit Net(const NetConfig& c) : kiln::nn::Module("Net") {
    // No bias before BatchNorm: its gradient is zero up to rounding, nothing to compare.
    fc1 = std::make_shared<kiln::nn::Linear>(kiln::nn::LinearOptions(c.in, c.hidden).bias(!c.batch_norm));
    fc2 = std::make_shared<kiln::nn::Linear>(c.hidden, c.out);
    if (c.swapped) {
      register_module("fc2", fc2);
      register_module("fc1", fc1);
    } else {
      register_module("fc1", fc1);
    }
    if (c.batch_norm) bn = register_module("bn", std::make_shared<kiln::nn::BatchNorm1d>(c.hidden));
    if (!c.swapped) register_module("fc2", fc2);
    if (c.extra) extra = register_module("extra", std::make_shared<kiln::nn::Linear>(c.in, c.out));
    if (c.unused) unused = register_module("unused", std::make_shared<kiln::nn::Linear>(c.in, c.out));
  }
  kiln::Tensor forward(const kiln::Tensor& x) override {
    kiln::Tensor h = fc1->forward(x);
    if (bn) h = bn->forward(h);
    kiln::Tensor y = fc2->forward(h.relu());
    if (extra && use_extra) y = y + extra->forward(x);
    return y;
  }
  std::shared_ptr<kiln::nn::Linear> fc1, fc2, extra, unused;
  std::shared_ptr<kiln::nn::BatchNorm1d> bn;
  bool use_extra = true;
};

inline NetConfig net_config(const std::string& model) {
  NetConfig c;
  if (model == "mlp") return c;
  if (model == "bn") c.batch_norm = true;
  else if (model == "unused") c.unused = true;
  else if (model == "branch") c.extra = true;
  else if (model == "swapped") c.swapped = true;
  else throw std::runtime_error("unknown model " + model);
  return c;
}

// The same global batch on every rank: rows [n, in] and targets [n, out] from `seed`.
struct Batch {
  kiln::Tensor x, y;
  Batch rows(int64_t start, int64_t count) const {
    return {x.narrow(0, start, count).contiguous(), y.narrow(0, start, count).contiguous()};
  }
};
inline Batch global_batch(int64_t n, const NetConfig& c, uint64_t seed) {
  kiln::manual_seed(seed);
  Batch b;
  b.x = kiln::randn({n, c.in});
  b.y = kiln::randn({n, c.out});
  return b;
}

// |a - b| <= rtol * (|b| + max|b|) everywhere, i.e. relative to the element and to the tensor's
// scale (elements near zero are compared at the tensor's scale). Throws naming the worst element.
inline void expect_close(const kiln::Tensor& a, const kiln::Tensor& b, double rtol, const std::string& what) {
  kiln::NoGradGuard ng;
  if (a.sizes() != b.sizes()) throw std::runtime_error(what + ": sizes differ");
  kiln::Tensor x = a.detach().to(kiln::DType::F64).contiguous();
  kiln::Tensor y = b.detach().to(kiln::DType::F64).contiguous();
  const double* p = x.data_ptr<double>();
  const double* q = y.data_ptr<double>();
  double scale = 0;
  for (int64_t i = 0; i < y.numel(); ++i) scale = std::max(scale, std::abs(q[i]));
  double worst = 0;
  int64_t at = -1;
  for (int64_t i = 0; i < y.numel(); ++i) {
    double excess = std::abs(p[i] - q[i]) - rtol * (std::abs(q[i]) + scale);
    if (!(excess <= worst) || std::isnan(p[i])) {
      worst = excess;
      at = i;
    }
  }
  if (at >= 0) {
    std::ostringstream os;
    os.precision(10);
    os << what << ": element " << at << " is " << p[at] << ", expected " << q[at] << " (rtol " << rtol
       << ", tensor scale " << scale << ")";
    throw std::runtime_error(os.str());
  }
}

// Every parameter, flattened into one f64 vector (for comparisons across ranks).
inline kiln::Tensor flat_parameters(const kiln::nn::Module& m) {
  kiln::NoGradGuard ng;
  std::vector<kiln::Tensor> parts;
  for (const auto& p : m.parameters()) parts.push_back(p.detach().reshape({-1}).to(kiln::DType::F64));
  return kiln::cat(parts, 0);
}

// Throws unless every rank's `t` is bitwise the same as rank 0's.
inline void expect_same_on_all_ranks(const kiln::Tensor& t, const std::string& what) {
  const int world = kiln::distributed::world_size();
  kiln::Tensor all = kiln::zeros({world * t.numel()}, t.options());
  kiln::distributed::all_gather_into_tensor(all, t.contiguous());
  for (int r = 1; r < world; ++r) {
    if (!kiln::equal(all.narrow(0, r * t.numel(), t.numel()), all.narrow(0, 0, t.numel())))
      throw std::runtime_error(what + ": rank " + std::to_string(r) + " differs from rank 0");
  }
}

// A process group that forwards to another and records each collective it passes on, so tests
// can count what a code path issued (sequence_number()) and in which order.
class RecordingGroup : public kiln::distributed::ProcessGroup {
 public:
  using Work = kiln::distributed::Work;
  using ReduceOp = kiln::distributed::ReduceOp;
  struct Call {
    std::string op;
    int64_t numel;
  };
  explicit RecordingGroup(std::shared_ptr<kiln::distributed::ProcessGroup> inner)
      : ProcessGroup(inner->rank(), inner->size()), inner_(std::move(inner)) {}
  std::string backend_name() const override { return inner_->backend_name(); }
  std::chrono::milliseconds timeout() const override { return inner_->timeout(); }
  std::shared_ptr<Work> all_reduce(std::vector<kiln::Tensor> t, ReduceOp op) override {
    note("all_reduce", t);
    return inner_->all_reduce(std::move(t), op);
  }
  std::shared_ptr<Work> broadcast(std::vector<kiln::Tensor> t, int root) override {
    note("broadcast", t);
    return inner_->broadcast(std::move(t), root);
  }
  std::shared_ptr<Work> all_gather(std::vector<kiln::Tensor> out, kiln::Tensor in) override {
    note("all_gather", {in});
    return inner_->all_gather(std::move(out), std::move(in));
  }
  std::shared_ptr<Work> all_gather_into_tensor(kiln::Tensor out, kiln::Tensor in) override {
    note("all_gather_into_tensor", {in});
    return inner_->all_gather_into_tensor(std::move(out), std::move(in));
  }
  std::shared_ptr<Work> reduce_scatter(kiln::Tensor out, std::vector<kiln::Tensor> in, ReduceOp op) override {
    note("reduce_scatter", {out});
    return inner_->reduce_scatter(std::move(out), std::move(in), op);
  }
  std::shared_ptr<Work> reduce_scatter_tensor(kiln::Tensor out, kiln::Tensor in, ReduceOp op) override {
    note("reduce_scatter_tensor", {out});
    return inner_->reduce_scatter_tensor(std::move(out), std::move(in), op);
  }
  std::shared_ptr<Work> barrier() override {
    note("barrier", {});
    return inner_->barrier();
  }
  void abort() override { inner_->abort(); }

  std::vector<Call> calls;

 private:
  void note(const char* op, const std::vector<kiln::Tensor>& t) {
    next_sequence_number();
    int64_t n = 0;
    for (const auto& x : t) n += x.numel();
    calls.push_back({op, n});
  }
  std::shared_ptr<kiln::distributed::ProcessGroup> inner_;
};

}  // namespace kiln_test
