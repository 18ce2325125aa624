#pragma once
// Recurrent layers, as torch.nn's LSTM, GRU and RNN and their cells: the same parameter names,
// shapes, gate order (LSTM: input, forget, cell, output; GRU: reset, update, new) and
// initialisation (every weight and bias U(-1/sqrt(hidden), 1/sqrt(hidden))), so a PyTorch
// state_dict maps key for key. Built from linear, sigmoid, tanh, relu and chunk, so
// differentiable on every device.
#include <string>
#include <tuple>
#include <vector>

#include "kiln/nn/module.h"
#include "kiln/nn/options.h"

namespace kiln::nn {

// (h, c). An undefined tensor in an initial state stands for zeros.
using LSTMState = std::tuple<Tensor, Tensor>;

struct RNNOptions {
  RNNOptions(int64_t input_size, int64_t hidden_size) : input_size_(input_size), hidden_size_(hidden_size) {}
  KILN_ARG(int64_t, input_size);
  KILN_ARG(int64_t, hidden_size);
  KILN_ARG(int64_t, num_layers) = 1;
  KILN_ARG(bool, bias) = true;
  // input and output [B, T, F] instead of [T, B, F] (the state stays [layers * directions, B, H])
  KILN_ARG(bool, batch_first) = false;
  // dropout on the outputs of every layer but the last, in training mode
  KILN_ARG(double, dropout) = 0.0;
  KILN_ARG(bool, bidirectional) = false;
  // nn::RNN only: "tanh" or "relu"
  KILN_ARG(std::string, nonlinearity) = "tanh";
  // nn::LSTM only: > 0 projects each step's h to this many features (weight_hr_l{k} [P, H]),
  // which become the hidden state and the output; must be below hidden_size
  KILN_ARG(int64_t, proj_size) = 0;
};
using LSTMOptions = RNNOptions;
using GRUOptions = RNNOptions;

namespace detail {

enum class Recurrence { LSTM, GRU, Tanh, ReLU };

// One cell's parameters and step; LSTMCell, GRUCell and RNNCell add their call forms.
class RNNCellBase : public Module {
 public:
  std::string extra_repr() const override;
  void reset_parameters();

  int64_t input_size, hidden_size;
  bool bias;
  Tensor weight_ih, weight_hh, bias_ih, bias_hh;  // [G H, I], [G H, H], [G H], [G H]; G gates

 protected:
  RNNCellBase(const char* type_name, Recurrence kind, int64_t input_size, int64_t hidden_size, bool bias,
              const std::string& nonlinearity = "tanh");
  // input [B, I] or [I] and the state (c only for the LSTM) -> the next (h, c)
  LSTMState step(const Tensor& input, const Tensor& h, const Tensor& c);
  Recurrence kind;
};

// A stack of recurrent layers; LSTM, GRU and RNN add their call forms.
class RNNLayersBase : public Module {
 public:
  // The output alone, from a zero state (so that the layer can sit in a Sequential).
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  void reset_parameters();

  RNNOptions options;
  // Per layer and direction (index layer * D + direction): weight_ih, weight_hh, bias_ih, bias_hh
  // (the biases undefined without bias) and the LSTM's weight_hr (undefined without proj_size).
  struct Weights {
    Tensor w_ih, w_hh, b_ih, b_hh, w_hr;
  };
  std::vector<Weights> weights;

 protected:
  RNNLayersBase(const char* type_name, Recurrence kind, const RNNOptions& options);
  // h's features: proj_size when set, else hidden_size
  int64_t state_size() const { return options.proj_size() > 0 ? options.proj_size() : options.hidden_size(); }
  // (output, h_n, c_n); c_n is undefined but for the LSTM
  std::tuple<Tensor, Tensor, Tensor> run(const Tensor& input, const Tensor& h0, const Tensor& c0);
  Recurrence kind;
};

}  // namespace detail

// One step: input [B, input_size] (or [input_size], unbatched) and state (h, c), each
// [B, hidden_size] (or [hidden_size]), -> the next (h, c).
//   i, f, g, o = (input W_ih^T + b_ih + h W_hh^T + b_hh).chunk(4)
//   c' = sigmoid(f) c + sigmoid(i) tanh(g),  h' = sigmoid(o) tanh(c')
class LSTMCell : public detail::RNNCellBase {
 public:
  LSTMCell(int64_t input_size, int64_t hidden_size, bool bias = true);
  using Module::forward;  // the single-input form is not defined for an LSTM cell (it throws)
  using Module::operator();
  LSTMState forward(const Tensor& input, const LSTMState& state);
  LSTMState operator()(const Tensor& input, const LSTMState& state) { return forward(input, state); }
};

namespace detail {
// A cell whose state is h alone: cell(x, h) -> h' (h undefined: zeros); cell(x) starts from zeros.
class HiddenStateCell : public RNNCellBase {
 public:
  Tensor forward(const Tensor& input) override { return forward(input, Tensor()); }
  using Module::operator();
  Tensor forward(const Tensor& input, const Tensor& h);
  Tensor operator()(const Tensor& input, const Tensor& h) { return forward(input, h); }

 protected:
  using RNNCellBase::RNNCellBase;
};
}  // namespace detail

// One GRU step: h' = (1 - z) n + z h with r, z = sigmoid(x W_i{r,z}^T + b_i{r,z} + h W_h{r,z}^T +
// b_h{r,z}) and n = tanh(x W_in^T + b_in + r (h W_hn^T + b_hn)). Shapes as LSTMCell.
class GRUCell : public detail::HiddenStateCell {
 public:
  GRUCell(int64_t input_size, int64_t hidden_size, bool bias = true);
};

// One Elman step: h' = act(x W_ih^T + b_ih + h W_hh^T + b_hh), act "tanh" or "relu".
class RNNCell : public detail::HiddenStateCell {
 public:
  RNNCell(int64_t input_size, int64_t hidden_size, bool bias = true, const std::string& nonlinearity = "tanh");
};

// Stacks of recurrent layers over a sequence. input [T, B, input_size] ([B, T, ...] with
// batch_first; [T, input_size] unbatched), initial state each [num_layers * D, B, H]
// ([num_layers * D, H] unbatched; D = 2 when bidirectional) -> (output [T, B, D * H], final state).
// Parameters weight_ih_l{k}, weight_hh_l{k}, bias_ih_l{k}, bias_hh_l{k} (+ "_reverse" for the
// backward direction), as PyTorch's. An LSTM with proj_size P adds weight_hr_l{k} [P, H] and
// h' = (sigmoid(o) tanh(c')) W_hr^T: h, h_0 / h_n and the output have P features in place of H
// (c keeps H), and weight_hh is [4 H, P].
class LSTM : public detail::RNNLayersBase {
 public:
  explicit LSTM(const LSTMOptions& options);
  LSTM(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1)
      : LSTM(LSTMOptions(input_size, hidden_size).num_layers(num_layers)) {}
  using RNNLayersBase::forward;
  using Module::operator();
  // -> (output, (h_n, c_n))
  std::tuple<Tensor, LSTMState> forward(const Tensor& input, const LSTMState& state);
  std::tuple<Tensor, LSTMState> operator()(const Tensor& input, const LSTMState& state) {
    return forward(input, state);
  }
};

namespace detail {
// Layers whose state is h alone: layers(x, h0) -> (output, h_n).
class HiddenStateLayers : public RNNLayersBase {
 public:
  using RNNLayersBase::forward;
  using Module::operator();
  std::tuple<Tensor, Tensor> forward(const Tensor& input, const Tensor& h0);  // h0 undefined: zeros
  std::tuple<Tensor, Tensor> operator()(const Tensor& input, const Tensor& h0) { return forward(input, h0); }

 protected:
  using RNNLayersBase::RNNLayersBase;
};
}  // namespace detail

class GRU : public detail::HiddenStateLayers {
 public:
  explicit GRU(const GRUOptions& options);
  GRU(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1)
      : GRU(GRUOptions(input_size, hidden_size).num_layers(num_layers)) {}
};

// Elman RNN layers (options.nonlinearity() "tanh" or "relu").
class RNN : public detail::HiddenStateLayers {
 public:
  explicit RNN(const RNNOptions& options);
  RNN(int64_t input_size, int64_t hidden_size, int64_t num_layers = 1)
      : RNN(RNNOptions(input_size, hidden_size).num_layers(num_layers)) {}
};

}  // namespace kiln::nn
