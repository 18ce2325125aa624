#pragma once
// Recurrent layers, as torch.nn.LSTMCell and torch.nn.LSTM: the same parameter names, shapes,
// gate order (input, forget, cell, output) and initialisation (every weight and bias
// U(-1/sqrt(hidden), 1/sqrt(hidden))), so a PyTorch state_dict maps key for key. Built from
// linear, sigmoid, tanh and chunk, so differentiable on every device.
#include <tuple>

#include "kiln/nn/module.h"
#include "kiln/nn/options.h"

namespace kiln::nn {

// (h, c). An undefined tensor in an initial state stands for zeros.
using LSTMState = std::tuple<Tensor, Tensor>;

// One step: input [B, input_size] (or [input_size], unbatched) and state (h, c), each
// [B, hidden_size] (or [hidden_size]), -> the next (h, c).
//   i, f, g, o = (input W_ih^T + b_ih + h W_hh^T + b_hh).chunk(4)
//   c' = sigmoid(f) c + sigmoid(i) tanh(g),  h' = sigmoid(o) tanh(c')
class LSTMCell : public Module {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  using Module::forward;  // the single-input form is not defined for a cell (it throws)
  using Module::operator();
  LSTMState forward(const Tensor& input, const LSTMState& state);
  LSTMState operator()(const Tensor& input, const LSTMState& state) { return forward(input, state); }
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t input_size, hidden_size;
  bool bias;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;  // [4H, I], [4H, H], [4H], [4H]
};

struct LSTMOptions {
  LSTMOptions(int64_t input_size, int64_t hidden_size) : input_size_(input_size), hidden_size_(hidden_size) {}
  KILN_ARG(int64_t, input_size);
  KILN_ARG(int64_t, hidden_size);
  KILN_ARG(int64_t, num_layers) = 1;
  KILN_ARG(bool, bias) = true;
  // input and output [B, T, F] instead of [T, B, F] (the state stays [layers * directions, B, H])
  KILN_ARG(bool, batch_first) = false;
  // dropout on the outputs of every layer but the last, in training mode
  KILN_ARG(double, dropout) = 0.0;
  KILN_ARG(bool, bidirectional) = false;
};

// A stack of LSTM layers over a sequence. input [T, B, input_size] ([B, T, ...] with
// batch_first; [T, input_size] unbatched), state (h_0, c_0) each [num_layers * D, B, H]
// ([num_layers * D, H] unbatched; D = 2 when bidirectional) -> (output [T, B, D * H], (h_n, c_n)).
// Parameters weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k} (+ "_reverse" for the
// backward direction), as PyTorch's.
class LSTM : public Module {
 public:
  explicit LSTM(const LSTMOptions& options);
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1)
      : LSTM(LSTMOptions(input_size, hidden_size).num_layers(num_layers)) {}
  // The output alone, from a zero state (so that an LSTM can sit in a Sequential).
  Tensor forward(const Tensor& input) override;
  using Module::operator();
  std::tuple<Tensor, LSTMState> forward(const Tensor& input, const LSTMState& state);
  std::tuple<Tensor, LSTMState> operator()(const Tensor& input, const LSTMState& state) {
    return forward(input, state);
  }
  std::string extra_repr() const override;
  void reset_parameters();

  LSTMOptions options;
  // Per layer and direction (index layer * D + direction): weight_ih, weight_hh, bias_ih, bias_hh
  // (the biases undefined without bias).
  struct Weights {
    Tensor w_ih, w_hh, b_ih, b_hh;
  };
  std::vector<Weights> weights;
};

}  // namespace kiln::nn
