// LSTMCell and LSTM: the gate arithmetic of one step is shared; LSTM projects a whole layer's
// input through W_ih in one GEMM, then runs the recurrence step by step (W_hh), so autograd sees
// ordinary linear / sigmoid / tanh / chunk nodes.
#include "kiln/nn/rnn.h"

#include <cmath>

#include "kiln/core/error.h"
#include "kiln/nn/functional.h"
#include "kiln/nn/init.h"

namespace kiln::nn {

namespace F = functional;

namespace {

// gx: the input's projection x W_ih^T + b_ih for this step, [B, 4H].
LSTMState lstm_step(const Tensor& gx, const Tensor& h, const Tensor& c, const Tensor& w_hh, const Tensor& b_hh) {
  std::vector<Tensor> g = (gx + F::linear(h, w_hh, b_hh)).chunk(4, -1);
  Tensor c2 = kiln::sigmoid(g[1]) * c + kiln::sigmoid(g[0]) * kiln::tanh(g[2]);
  Tensor h2 = kiln::sigmoid(g[3]) * kiln::tanh(c2);
  return {h2, c2};
}

void check_sizes(int64_t input_size, int64_t hidden_size, const char* what) {
  KILN_CHECK(input_size > 0 && hidden_size > 0, what, ": input_size and hidden_size must be positive, got ",
             input_size, " and ", hidden_size);
}

// An initial state tensor: zeros of `want` when undefined, else checked against `want`.
Tensor state_or_zeros(const Tensor& t, const IntList& want, const Tensor& like, const char* what, int which) {
  if (!t.defined()) return zeros(want, like.options());
  KILN_CHECK(t.sizes() == want, what, ": expected hidden[", which, "] of sizes ", want, ", got ", t.sizes());
  return t;
}

void check_state_pair(const LSTMState& s, const char* what) {
  KILN_CHECK(std::get<0>(s).defined() == std::get<1>(s).defined(), what,
             ": give both h and c of the initial state, or neither");
}

void uniform_all(const std::vector<Tensor>& params, int64_t hidden_size) {
  const double stdv = 1.0 / std::sqrt(static_cast<double>(hidden_size));
  for (Tensor t : params)
    if (t.defined()) init::uniform_(t, -stdv, stdv);
}

}  // namespace

// ---------------------------------------------------------------- LSTMCell

LSTMCell::LSTMCell(int64_t input_size, int64_t hidden_size, bool bias)
    : Module("LSTMCell"), input_size(input_size), hidden_size(hidden_size), bias(bias) {
  check_sizes(input_size, hidden_size, "LSTMCell");
  weight_ih = register_parameter("weight_ih", empty({4 * hidden_size, input_size}));
  weight_hh = register_parameter("weight_hh", empty({4 * hidden_size, hidden_size}));
  if (bias) {
    bias_ih = register_parameter("bias_ih", empty({4 * hidden_size}));
    bias_hh = register_parameter("bias_hh", empty({4 * hidden_size}));
  }
  reset_parameters();
}

void LSTMCell::reset_parameters() { uniform_all({weight_ih, weight_hh, bias_ih, bias_hh}, hidden_size); }

LSTMState LSTMCell::forward(const Tensor& input, const LSTMState& state) {
  KILN_CHECK(input.defined(), "LSTMCell: input is undefined");
  KILN_CHECK(input.dim() == 1 || input.dim() == 2, "LSTMCell: expected input to be 1-D or 2-D, got sizes ",
             input.sizes());
  KILN_CHECK(input.size(-1) == input_size, "LSTMCell: input has inconsistent input_size: got ", input.size(-1),
             " expected ", input_size);
  check_state_pair(state, "LSTMCell");
  const bool unbatched = input.dim() == 1;
  Tensor x = unbatched ? input.unsqueeze(0) : input;
  const IntList want = unbatched ? IntList{hidden_size} : IntList{x.size(0), hidden_size};
  Tensor h = state_or_zeros(std::get<0>(state), want, x, "LSTMCell", 0);
  Tensor c = state_or_zeros(std::get<1>(state), want, x, "LSTMCell", 1);
  if (unbatched) h = h.unsqueeze(0), c = c.unsqueeze(0);
  auto [h2, c2] = lstm_step(F::linear(x, weight_ih, bias_ih), h, c, weight_hh, bias_hh);
  if (unbatched) return {h2.squeeze(0), c2.squeeze(0)};
  return {h2, c2};
}

std::string LSTMCell::extra_repr() const {
  return std::to_string(input_size) + ", " + std::to_string(hidden_size) + (bias ? "" : ", bias=False");
}

// ---------------------------------------------------------------- LSTM

LSTM::LSTM(const LSTMOptions& o) : Module("LSTM"), options(o) {
  check_sizes(o.input_size(), o.hidden_size(), "LSTM");
  KILN_CHECK(o.num_layers() >= 1, "LSTM: num_layers must be at least 1, got ", o.num_layers());
  KILN_CHECK(o.dropout() >= 0.0 && o.dropout() <= 1.0,
             "LSTM: dropout must be a probability in [0, 1], got ", o.dropout());
  const int64_t H = o.hidden_size(), D = o.bidirectional() ? 2 : 1;
  for (int64_t l = 0; l < o.num_layers(); ++l) {
    for (int64_t d = 0; d < D; ++d) {
      const std::string sfx = "_l" + std::to_string(l) + (d ? "_reverse" : "");
      const int64_t in = l == 0 ? o.input_size() : D * H;
      Weights w;
      w.w_ih = register_parameter("weight_ih" + sfx, empty({4 * H, in}));
      w.w_hh = register_parameter("weight_hh" + sfx, empty({4 * H, H}));
      if (o.bias()) {
        w.b_ih = register_parameter("bias_ih" + sfx, empty({4 * H}));
        w.b_hh = register_parameter("bias_hh" + sfx, empty({4 * H}));
      }
      weights.push_back(w);
    }
  }
  reset_parameters();
}

void LSTM::reset_parameters() {
  for (const Weights& w : weights) uniform_all({w.w_ih, w.w_hh, w.b_ih, w.b_hh}, options.hidden_size());
}

Tensor LSTM::forward(const Tensor& input) { return std::get<0>(forward(input, LSTMState{})); }

std::tuple<Tensor, LSTMState> LSTM::forward(const Tensor& input, const LSTMState& state) {
  KILN_CHECK(input.defined(), "LSTM: input is undefined");
  KILN_CHECK(input.dim() == 2 || input.dim() == 3, "LSTM: expected input to be 2-D or 3-D, got sizes ",
             input.sizes());
  KILN_CHECK(input.size(-1) == options.input_size(), "LSTM: input.size(-1) must be equal to input_size. Expected ",
             options.input_size(), ", got ", input.size(-1));
  check_state_pair(state, "LSTM");
  const bool unbatched = input.dim() == 2;
  Tensor x = unbatched ? input.unsqueeze(1) : (options.batch_first() ? input.transpose(0, 1) : input);  // [T, B, I]
  const int64_t T = x.size(0), B = x.size(1), H = options.hidden_size();
  const int64_t D = options.bidirectional() ? 2 : 1, L = options.num_layers();
  KILN_CHECK(T > 0, "LSTM: the input sequence is empty (sizes ", input.sizes(), ")");
  const IntList want = unbatched ? IntList{L * D, H} : IntList{L * D, B, H};
  Tensor h0 = state_or_zeros(std::get<0>(state), want, x, "LSTM", 0);
  Tensor c0 = state_or_zeros(std::get<1>(state), want, x, "LSTM", 1);
  if (unbatched) h0 = h0.unsqueeze(1), c0 = c0.unsqueeze(1);

  std::vector<Tensor> hn, cn;
  Tensor layer_in = x;
  for (int64_t l = 0; l < L; ++l) {
    std::vector<Tensor> outs;
    for (int64_t d = 0; d < D; ++d) {
      const Weights& w = weights[static_cast<size_t>(l * D + d)];
      Tensor gx = F::linear(layer_in, w.w_ih, w.b_ih);  // [T, B, 4H]: every step's input projection
      Tensor h = h0.select(0, l * D + d), c = c0.select(0, l * D + d);
      std::vector<Tensor> ys(static_cast<size_t>(T));
      for (int64_t s = 0; s < T; ++s) {
        const int64_t t = d == 0 ? s : T - 1 - s;
        std::tie(h, c) = lstm_step(gx.select(0, t), h, c, w.w_hh, w.b_hh);
        ys[static_cast<size_t>(t)] = h;
      }
      hn.push_back(h);
      cn.push_back(c);
      outs.push_back(stack(ys, 0));
    }
    layer_in = D == 1 ? outs[0] : cat(outs, 2);
    if (l + 1 < L && options.dropout() > 0.0 && is_training())
      layer_in = F::dropout(layer_in, options.dropout(), true);
  }
  Tensor out = layer_in, h_n = stack(hn, 0), c_n = stack(cn, 0);
  if (unbatched) return {out.squeeze(1), {h_n.squeeze(1), c_n.squeeze(1)}};
  if (options.batch_first()) out = out.transpose(0, 1);
  return {out, {h_n, c_n}};
}

std::string LSTM::extra_repr() const {
  std::string s = std::to_string(options.input_size()) + ", " + std::to_string(options.hidden_size());
  if (options.num_layers() != 1) s += ", num_layers=" + std::to_string(options.num_layers());
  if (!options.bias()) s += ", bias=False";
  if (options.batch_first()) s += ", batch_first=True";
  if (options.dropout() != 0.0) s += ", dropout=" + float_repr(options.dropout());
  if (options.bidirectional()) s += ", bidirectional=True";
  return s;
}

}  // namespace kiln::nn
