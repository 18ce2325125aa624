// LSTM, GRU and Elman RNN layers and cells. One step function holds the gate arithmetic of each
// kind; the layers project a whole layer's input through W_ih in one GEMM, then run the recurrence
// step by step (W_hh), so autograd sees ordinary linear / sigmoid / tanh / chunk nodes.
#include "kiln/nn/rnn.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"

namespace kiln::nn {

namespace F = functional;
using detail::Recurrence;

namespace {

int64_t gates(Recurrence kind) { return kind == Recurrence::LSTM ? 4 : kind == Recurrence::GRU ? 3 : 1; }

Recurrence elman(const char* what, const std::string& nonlinearity) {
  KILN_CHECK(nonlinearity == "tanh" || nonlinearity == "relu", what, ": unknown nonlinearity '", nonlinearity,
             "' (expected tanh or relu)");
  return nonlinearity == "tanh" ? Recurrence::Tanh : Recurrence::ReLU;
}

// gx: the input's projection x W_ih^T + b_ih for this step, [B, G H]. Returns (h', c'); c' is
// undefined but for the LSTM.
LSTMState step(Recurrence kind, const Tensor& gx, const Tensor& h, const Tensor& c, const Tensor& w_hh,
               const Tensor& b_hh) {
  Tensor gh = F::linear(h, w_hh, b_hh);
  switch (kind) {
    case Recurrence::LSTM: {
      std::vector<Tensor> g = (gx + gh).chunk(4, -1);
      Tensor c2 = kiln::sigmoid(g[1]) * c + kiln::sigmoid(g[0]) * kiln::tanh(g[2]);
      return {kiln::sigmoid(g[3]) * kiln::tanh(c2), c2};
    }
    case Recurrence::GRU: {
      std::vector<Tensor> i = gx.chunk(3, -1), r = gh.chunk(3, -1);
      Tensor reset = kiln::sigmoid(i[0] + r[0]), update = kiln::sigmoid(i[1] + r[1]);
      Tensor n = kiln::tanh(i[2] + reset * r[2]);
      return {(1.0 - update) * n + update * h, Tensor()};
    }
    case Recurrence::Tanh: return {kiln::tanh(gx + gh), Tensor()};
    case Recurrence::ReLU: return {kiln::relu(gx + gh), Tensor()};
  }
  KILN_FAIL("unreachable");
}

void check_sizes(int64_t input_size, int64_t hidden_size, const char* what) {
  KILN_CHECK(input_size > 0 && hidden_size > 0, what, ": input_size and hidden_size must be positive, got ", input_size,
             " and ", hidden_size);
}

// An initial state tensor: zeros of `want` when undefined, else checked against `want`.
Tensor state_or_zeros(const Tensor& t, const IntList& want, const Tensor& like, const std::string& what, int which) {
  if (!t.defined()) return zeros(want, like.options());
  KILN_CHECK(t.sizes() == want, what, ": expected hidden[", which, "] of sizes ", want, ", got ", t.sizes());
  return t;
}

void check_state_pair(const LSTMState& s, const std::string& what) {
  KILN_CHECK(std::get<0>(s).defined() == std::get<1>(s).defined(), what,
             ": give both h and c of the initial state, or neither");
}

void uniform_all(const std::vector<Tensor>& params, int64_t hidden_size) {
  const double stdv = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor t : params)
    if (t.defined()) init::uniform_(t, -stdv, stdv);
}

}  // namespace

// ---------------------------------------------------------------- cells

namespace detail {

RNNCellBase::RNNCellBase(const char* type_name, Recurrence kind, int64_t input_size, int64_t hidden_size, bool bias,
                         const std::string& nonlinearity)
    : Module(type_name), input_size(input_size), hidden_size(hidden_size), bias(bias), kind(kind) {
  check_sizes(input_size, hidden_size, type_name);
  if (kind == Recurrence::Tanh || kind == Recurrence::ReLU) this->kind = elman(type_name, nonlinearity);
  const int64_t G = gates(kind);
  weight_ih = register_parameter("weight_ih", empty({G * hidden_size, input_size}));
  weight_hh = register_parameter("weight_hh", empty({G * hidden_size, hidden_size}));
  if (bias) {
    bias_ih = register_parameter("bias_ih", empty({G * hidden_size}));
    bias_hh = register_parameter("bias_hh", empty({G * hidden_size}));
  }
  reset_parameters();
}

void RNNCellBase::reset_parameters() { uniform_all({weight_ih, weight_hh, bias_ih, bias_hh}, hidden_size); }

LSTMState RNNCellBase::step(const Tensor& input, const Tensor& h0, const Tensor& c0) {
  const std::string& what = type_name();
  KILN_CHECK(input.defined(), what, ": input is undefined");
  KILN_CHECK(input.dim() == 1 || input.dim() == 2, what, ": expected input to be 1-D or 2-D, got sizes ",
             input.sizes());
  KILN_CHECK(input.size(-1) == input_size, what, ": input has inconsistent input_size: got ", input.size(-1),
             " expected ", input_size);
  const bool unbatched = input.dim() == 1;
  Tensor x = unbatched ? input.unsqueeze(0) : input;
  const IntList want = unbatched ? IntList{hidden_size} : IntList{x.size(0), hidden_size};
  Tensor h = state_or_zeros(h0, want, x, what, 0);
  Tensor c = kind == Recurrence::LSTM ? state_or_zeros(c0, want, x, what, 1) : Tensor();
  if (unbatched) {
    h = h.unsqueeze(0);
    if (c.defined()) c = c.unsqueeze(0);
  }
  auto [h2, c2] = nn::step(kind, F::linear(x, weight_ih, bias_ih), h, c, weight_hh, bias_hh);
  if (unbatched) return {h2.squeeze(0), c2.defined() ? c2.squeeze(0) : c2};
  return {h2, c2};
}

std::string RNNCellBase::extra_repr() const {
  std::string s = std::to_string(input_size) + ", " + std::to_string(hidden_size) + (bias ? "" : ", bias=False");
  if (kind == Recurrence::ReLU) s += ", nonlinearity=relu";  // as PyTorch prints it
  return s;
}

}  // namespace detail

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, bool bias)
    : RNNCellBase("LSTMCell", Recurrence::LSTM, input_size, hidden_size, bias) {}

LSTMState LSTMCell::forward(const Tensor& input, const LSTMState& state) {
  check_state_pair(state, type_name());
  return step(input, std::get<0>(state), std::get<1>(state));
}

Tensor detail::HiddenStateCell::forward(const Tensor& input, const Tensor& h) {
  return std::get<0>(step(input, h, Tensor()));
}

GRUCell::GRUCell(int64_t input_size, int64_t hidden_size, bool bias)
    : HiddenStateCell("GRUCell", Recurrence::GRU, input_size, hidden_size, bias) {}

RNNCell::RNNCell(int64_t input_size, int64_t hidden_size, bool bias, const std::string& nonlinearity)
    : HiddenStateCell("RNNCell", Recurrence::Tanh, input_size, hidden_size, bias, nonlinearity) {}

// ---------------------------------------------------------------- layers

namespace detail {

RNNLayersBase::RNNLayersBase(const char* type_name, Recurrence kind, const RNNOptions& o)
    : Module(type_name), options(o), kind(kind) {
  check_sizes(o.input_size(), o.hidden_size(), type_name);
  KILN_CHECK(o.num_layers() >= 1, type_name, ": num_layers must be at least 1, got ", o.num_layers());
  KILN_CHECK(o.dropout() >= 0.0 && o.dropout() <= 1.0, type_name, ": dropout must be a probability in [0, 1], got ",
             o.dropout());
  if (kind == Recurrence::Tanh || kind == Recurrence::ReLU) this->kind = elman(type_name, o.nonlinearity());
  else
    KILN_CHECK(o.nonlinearity() == "tanh", type_name, ": nonlinearity is an option of nn::RNN only, got '",
               o.nonlinearity(), "'");
  KILN_CHECK(o.proj_size() == 0 || kind == Recurrence::LSTM, type_name,
             ": proj_size is an option of nn::LSTM only, got ", o.proj_size());
  KILN_CHECK(o.proj_size() >= 0 && o.proj_size() < o.hidden_size(), type_name,
             ": proj_size must be >= 0 and smaller than hidden_size (", o.hidden_size(), "), got ", o.proj_size());
  const int64_t H = o.hidden_size(), R = state_size(), D = o.bidirectional() ? 2 : 1, G = gates(kind);
  for (int64_t l = 0; l < o.num_layers(); ++l) {
    for (int64_t d = 0; d < D; ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      const int64_t in = l == 0 ? o.input_size() : D * R;
      Weights w;
      w.w_ih = register_parameter("weight_ih" + sfx, empty({G * H, in}));
      w.w_hh = register_parameter("weight_hh" + sfx, empty({G * H, R}));
      if (o.bias()) {
        w.b_ih = register_parameter("bias_ih" + sfx, empty({G * H}));
        w.b_hh = register_parameter("bias_hh" + sfx, empty({G * H}));
      }
      if (o.proj_size() > 0) w.w_hr = register_parameter("weight_hr" + sfx, empty({R, H}));
      weights.push_back(w);
    }
  }
  reset_parameters();
}

void RNNLayersBase::reset_parameters() {
  for (const Weights& w : weights) uniform_all({w.w_ih, w.w_hh, w.b_ih, w.b_hh, w.w_hr}, options.hidden_size());
}

Tensor RNNLayersBase::forward(const Tensor& input) { return std::get<0>(run(input, Tensor(), Tensor())); }

std::tuple<Tensor, Tensor, Tensor> RNNLayersBase::run(const Tensor& input, const Tensor& h0_in, const Tensor& c0_in) {
  const std::string& what = type_name();
  KILN_CHECK(input.defined(), what, ": input is undefined");
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, what, ": expected input to be 2-D or 3-D, got sizes ",
             input.sizes());
  KILN_CHECK(input.size(-1) == options.input_size(), what, ": input.size(-1) must be equal to input_size. Expected ",
             options.input_size(), ", got ", input.size(-1));
  const bool unbatched = input.dim() == 2, lstm = kind == Recurrence::LSTM;
  Tensor x = unbatched ? input.unsqueeze(1) : (options.batch_first() ? input.transpose(0, 1) : input);  // [T, B, I]
  const int64_t T = x.size(0), B = x.size(1), H = options.hidden_size(), R = state_size();
  const int64_t D = options.bidirectional() ? 2 : 1, L = options.num_layers();
  KILN_CHECK(T > 0, what, ": the input sequence is empty (sizes ", input.sizes(), ")");
  auto state_sizes = [&](int64_t features) {
    return unbatched ? IntList{L * D, features} : IntList{L * D, B, features};
  };
  Tensor h0 = state_or_zeros(h0_in, state_sizes(R), x, what, 0);
  Tensor c0 = lstm ? state_or_zeros(c0_in, state_sizes(H), x, what, 1) : Tensor();
  if (unbatched) {
    h0 = h0.unsqueeze(1);
    if (lstm) c0 = c0.unsqueeze(1);
  }

  std::vector<Tensor> hn, cn;
  Tensor layer_in = x;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < D; ++d) {
      const Weights& w = weights[static_cast<size_t>(l * D + d)];
      Tensor gx = F::linear(layer_in, w.w_ih, w.b_ih);  // [T, B, G H]: every step's input projection
      Tensor h = h0.select(0, l * D + d), c = lstm ? c0.select(0, l * D + d) : Tensor();
      std::vector<Tensor> ys(static_cast<size_t>(T));
      for (int64_t s = 0; s < T; ++s) {
        const int64_t t = d == 0 ? s : T - 1 - s;
        std::tie(h, c) = nn::step(kind, gx.select(0, t), h, c, w.w_hh, w.b_hh);
        if (w.w_hr.defined()) h = F::linear(h, w.w_hr);  // proj_size
        ys[static_cast<size_t>(t)] = h;
      }
      hn.push_back(h);
      if (lstm) cn.push_back(c);
      outs.push_back(stack(ys, 0));
    }
    layer_in = D == 1 ? outs[0] : cat(outs, 2);
    if (l + 1 < L && options.dropout() > 0.0 && is_training()) layer_in = F::dropout(layer_in, options.dropout(), true);
  }
  Tensor out = layer_in, h_n = stack(hn, 0), c_n = lstm ? stack(cn, 0) : Tensor();
  if (unbatched) return {out.squeeze(1), h_n.squeeze(1), lstm ? c_n.squeeze(1) : c_n};
  if (options.batch_first()) out = out.transpose(0, 1);
  return {out, h_n, c_n};
}

std::string RNNLayersBase::extra_repr() const {
  std::string s = std::to_string(options.input_size()) + ", " + std::to_string(options.hidden_size());
  if (options.num_layers() != 1) s += ", num_layers=" + std::to_string(options.num_layers());
  if (!options.bias()) s += ", bias=False";
  if (options.batch_first()) s += ", batch_first=True";
  if (options.dropout() != 0.0) s += ", dropout=" + float_repr(options.dropout());
  if (options.bidirectional()) s += ", bidirectional=True";
  if (options.proj_size() > 0) s += ", proj_size=" + std::to_string(options.proj_size());
  return s;
}

}  // namespace detail

LSTM::LSTM(const LSTMOptions& options) : RNNLayersBase("LSTM", Recurrence::LSTM, options) {}

std::tuple<Tensor, LSTMState> LSTM::forward(const Tensor& input, const LSTMState& state) {
  check_state_pair(state, type_name());
  auto [out, h_n, c_n] = run(input, std::get<0>(state), std::get<1>(state));
  return {out, {h_n, c_n}};
}

std::tuple<Tensor, Tensor> detail::HiddenStateLayers::forward(const Tensor& input, const Tensor& h0) {
  auto [out, h_n, c_n] = run(input, h0, Tensor());
  return {out, h_n};
}

GRU::GRU(const GRUOptions& options) : HiddenStateLayers("GRU", Recurrence::GRU, options) {}

RNN::RNN(const RNNOptions& options) : HiddenStateLayers("RNN", Recurrence::Tanh, options) {}

}  // namespace kiln::nn
