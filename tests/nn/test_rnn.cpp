// nn::LSTM, nn::GRU, nn::RNN and their cells: outputs, final states and gradients against PyTorch's (torch 2.x,
// float64, every parameter set to a fixed sequence; in torch_reference/rnn.json), consistency between the cell,
// the layer, batch_first and unbatched inputs, f64 gradchecks, dropout between layers, parameter
// names and initialisation, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/nn/torch_reference.h"
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

// PyTorch's values for these tests (tests/nn/torch_reference/rnn.json, tests/nn/torch_reference.h)
const std::vector<double>& torch_ref(const char* name) { return torch_reference("rnn", name); }

using namespace kiln::nn;  // LSTM, GRU, RNN, their cells and options, LSTMState

Tensor input() { return sin_seq(18, 0.29, 0.2).view({2, 3, 3}); }  // [B=2, T=3, I=3] (batch_first)
Tensor h0() { return sin_seq(16, 0.43, 0.5).view({4, 2, 2}) * 0.3; }
Tensor c0() { return sin_seq(16, 0.17, 0.9).view({4, 2, 2}) * 0.3; }

LSTMOptions ref_options() { return LSTMOptions(3, 2).num_layers(2).bidirectional(true).batch_first(true); }

// f64 gradcheck of lstm's output and final (h, c) with respect to the input and (h0, c0), in = {x, h0, c0}.
bool lstm_gradcheck(LSTM& lstm, const TL& in) {
  return kiln::gradcheck(
      [&](const TL& i) {
        auto [out, st] = lstm(i[0], LSTMState{i[1], i[2]});
        return kiln::cat({out.flatten(), std::get<0>(st).flatten(), std::get<1>(st).flatten()});
      },
      in);
}

// An LSTM with proj_size 2 (hidden 4, 2 layers, bidirectional, batch_first), c0 [4, 2, 4].

}  // namespace

TEST_CASE("LSTM: 2 layers, bidirectional, batch_first match PyTorch", "[rnn]") {
  LSTM lstm(ref_options());
  set_params_to_sequence(lstm);
  auto [out, state] = lstm(input(), LSTMState{h0(), c0()});
  CHECK(out.sizes() == IntList{2, 3, 4});
  CHECK(std::get<0>(state).sizes() == IntList{4, 2, 2});
  check_close(out, torch_ref("k_lstm_out"), 0, 1e-13, "output");
  check_close(std::get<0>(state), torch_ref("k_lstm_hn"), 0, 1e-13, "h_n");
  check_close(std::get<1>(state), torch_ref("k_lstm_cn"), 0, 1e-13, "c_n");
  // no initial state: zeros
  auto [out0, state0] = lstm(input(), {});
  check_close(out0, torch_ref("k_lstm_out_zero"), 0, 1e-13, "output, zero state");
  check_close(std::get<0>(state0), torch_ref("k_lstm_hn_zero"), 0, 1e-13, "h_n, zero state");
  check_close(lstm(input()), torch_ref("k_lstm_out_zero"), 0, 1e-13, "single-input forward");
  CHECK(lstm.extra_repr() == "3, 2, num_layers=2, batch_first=True, bidirectional=True");
}

TEST_CASE("LSTM: gradients match PyTorch", "[rnn]") {
  LSTM lstm(ref_options());
  set_params_to_sequence(lstm);
  Tensor x = input().requires_grad_();
  auto [out, state] = lstm(x, LSTMState{h0(), c0()});
  auto [hn, cn] = state;
  Tensor loss = weighted_sum(out, 0.21, 0.3) + weighted_sum(hn, 0.13, 0.4) + weighted_sum(cn, 0.11, 0.8);
  loss.backward();
  check_close(x.grad(), torch_ref("k_lstm_grad_x"), 0, 1e-12, "d input");
  check_close(lstm.weights[0].w_ih.grad(), torch_ref("k_lstm_grad_weight_ih_l0"), 0, 1e-12, "d weight_ih_l0");
  check_close(lstm.weights[3].b_hh.grad(), torch_ref("k_lstm_grad_bias_hh_l1_reverse"), 0, 1e-12,
              "d bias_hh_l1_reverse");
}

TEST_CASE("LSTMCell matches PyTorch and one LSTM layer", "[rnn]") {
  LSTMCell cell(3, 2);
  set_params_to_sequence(cell);
  auto [h, c] = cell(input().select(1, 0), LSTMState{h0()[0], c0()[0]});
  check_close(h, torch_ref("k_cell_h"), 0, 1e-14, "h'");
  check_close(c, torch_ref("k_cell_c"), 0, 1e-14, "c'");
  CHECK(cell.str().rfind("LSTMCell(3, 2)", 0) == 0);

  // a one-layer LSTM with the cell's weights is the cell unrolled
  LSTM lstm(3, 2);
  set_params_to_sequence(lstm);
  Tensor x = input().transpose(0, 1);  // [T, B, I], non-contiguous
  auto [out, state] = lstm(x, LSTMState{h0()[0].unsqueeze(0), c0()[0].unsqueeze(0)});
  Tensor hs = h0()[0], cs = c0()[0];
  for (int64_t t = 0; t < 3; ++t) {
    std::tie(hs, cs) = cell(x[t], LSTMState{hs, cs});
    check_close(out[t], values(hs), 0, 1e-14, "step " + std::to_string(t));
  }
  check_close(std::get<1>(state)[0], values(cs), 0, 1e-14, "c_n");
  // unbatched input: [I] for the cell, [T, I] for the layer
  auto [h1, c1] = cell(x[0][1], LSTMState{h0()[0][1], c0()[0][1]});
  CHECK(h1.sizes() == IntList{2});
  check_close(h1, values(std::get<0>(cell(x[0], LSTMState{h0()[0], c0()[0]}))[1]), 0, 1e-15);
  auto [ou, su] = lstm(x.select(1, 1), {});
  CHECK(ou.sizes() == IntList{3, 2});
  CHECK(std::get<0>(su).sizes() == IntList{1, 2});
  check_close(ou, values(lstm(x).select(1, 1)), 0, 1e-15, "unbatched");
}

TEST_CASE("LSTM: batch_first is a transpose of the sequence-first layout", "[rnn]") {
  kiln::manual_seed(1);
  LSTM seq_first(LSTMOptions(3, 4).num_layers(2));
  LSTM batch_first(LSTMOptions(3, 4).num_layers(2).batch_first(true));
  batch_first.load_state_dict(seq_first.state_dict());
  Tensor x = kiln::randn({5, 2, 3});
  auto [a, sa] = seq_first(x, {});
  auto [b, sb] = batch_first(x.transpose(0, 1), {});
  CHECK(b.sizes() == IntList{2, 5, 4});
  check_close(b.transpose(0, 1), values(a), 0, 1e-6);
  check_close(std::get<0>(sb), values(std::get<0>(sa)), 0, 1e-6);
}

TEST_CASE("LSTM and LSTMCell: gradcheck", "[rnn]") {
  kiln::manual_seed(2);
  LSTM lstm(LSTMOptions(2, 3).num_layers(2).bidirectional(true));
  lstm.to(DType::F64);
  Tensor x = kiln::randn({3, 2, 2}, f64(true));
  Tensor h = kiln::randn({4, 2, 3}, f64(true)), c = kiln::randn({4, 2, 3}, f64(true));
  CHECK(lstm_gradcheck(lstm, {x, h, c}));
  LSTMCell cell(2, 3, /*bias=*/false);
  cell.to(DType::F64);
  CHECK(cell.parameters().size() == 2);
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        auto [h2, c2] = cell(in[0], LSTMState{in[1], in[2]});
        return kiln::cat({h2.flatten(), c2.flatten()});
      },
      {kiln::randn({2, 2}, f64(true)), kiln::randn({2, 3}, f64(true)), kiln::randn({2, 3}, f64(true))}));
}

TEST_CASE("LSTM: parameters, initialisation and dropout between layers", "[rnn]") {
  kiln::manual_seed(5);
  LSTM lstm(LSTMOptions(3, 4).num_layers(2).bidirectional(true).dropout(0.5));
  const std::vector<std::string> names = parameter_names(lstm);
  CHECK(names == std::vector<std::string>{"weight_ih_l0", "weight_hh_l0", "bias_ih_l0", "bias_hh_l0",
                                          "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse",
                                          "bias_hh_l0_reverse", "weight_ih_l1", "weight_hh_l1", "bias_ih_l1",
                                          "bias_hh_l1", "weight_ih_l1_reverse", "weight_hh_l1_reverse",
                                          "bias_ih_l1_reverse", "bias_hh_l1_reverse"});
  CHECK(lstm.weights[2].w_ih.sizes() == IntList{16, 8});  // layer 1 reads both directions
  for (const Tensor& p : lstm.parameters()) {
    CHECK(p.abs().max().item() <= 0.5);  // U(-1/sqrt(4), 1/sqrt(4))
    CHECK(p.abs().max().item() > 0.3);
  }
  Tensor x = kiln::randn({4, 2, 3});
  kiln::manual_seed(7);
  Tensor t1 = lstm(x);
  kiln::manual_seed(7);
  Tensor t2 = lstm(x);
  CHECK(kiln::equal(t1, t2));  // the dropout mask follows the seed
  lstm.eval();
  Tensor e = lstm(x);
  CHECK_FALSE(kiln::allclose(t1, e));
  LSTM plain(LSTMOptions(3, 4).num_layers(2).bidirectional(true));
  plain.load_state_dict(lstm.state_dict());
  CHECK(kiln::allclose(plain(x), e, 0, 0));  // no dropout in eval
}

TEST_CASE("LSTM and LSTMCell: errors", "[rnn]") {
  LSTM lstm(LSTMOptions(3, 2).num_layers(2));
  CHECK_THAT(error_of([&] {
               lstm(kiln::zeros({4, 2, 5}));
             }),
             Catch::Contains("input.size(-1) must be equal to input_size. Expected 3, got 5"));
  CHECK_THAT(error_of([&] { lstm(kiln::zeros({1, 4, 2, 3})); }), Catch::Contains("expected input to be 2-D or 3-D"));
  CHECK_THAT(error_of([&] {
               lstm(kiln::zeros({4, 2, 3}), LSTMState{kiln::zeros({1, 2, 2}), kiln::zeros({1, 2, 2})});
             }),
             Catch::Contains("expected hidden[0] of sizes [2, 2, 2], got [1, 2, 2]"));
  CHECK_THAT(error_of([&] {
               lstm(kiln::zeros({4, 2, 3}), LSTMState{kiln::zeros({2, 2, 2}), Tensor()});
             }),
             Catch::Contains("give both h and c"));
  CHECK_THAT(error_of([&] { lstm(kiln::zeros({0, 2, 3})); }), Catch::Contains("sequence is empty"));
  CHECK_THAT(error_of([&] { LSTM bad(LSTMOptions(3, 0)); }), Catch::Contains("must be positive"));
  CHECK_THAT(error_of([&] { LSTM bad(LSTMOptions(3, 2).num_layers(0)); }),
             Catch::Contains("num_layers must be at least 1"));
  CHECK_THAT(error_of([&] { LSTM bad(LSTMOptions(3, 2).dropout(1.5)); }),
             Catch::Contains("dropout must be a probability"));
  LSTMCell cell(3, 2);
  CHECK_THAT(error_of([&] {
               cell(kiln::zeros({2, 4}), {});
             }),
             Catch::Contains("inconsistent input_size: got 4 expected 3"));
  CHECK_THAT(error_of([&] {
               cell(kiln::zeros({2, 3}), LSTMState{kiln::zeros({2, 3}), kiln::zeros({2, 3})});
             }),
             Catch::Contains("expected hidden[0] of sizes [2, 2], got [2, 3]"));
  CHECK_THAT(error_of([&] { cell(kiln::zeros({2, 3})); }), Catch::Contains("no single-input forward"));
}

TEST_CASE("GRU: 2 layers, bidirectional, batch_first match PyTorch, with gradients", "[rnn]") {
  GRU gru(GRUOptions(3, 2).num_layers(2).bidirectional(true).batch_first(true));
  set_params_to_sequence(gru);
  CHECK(gru.weights[0].w_ih.sizes() == IntList{6, 3});
  Tensor x = input().requires_grad_();
  auto [out, hn] = gru(x, h0());
  check_close(out, torch_ref("k_gru_out"), 0, 1e-13, "output");
  check_close(hn, torch_ref("k_gru_hn"), 0, 1e-13, "h_n");
  Tensor loss = weighted_sum(out, 0.21, 0.3) + weighted_sum(hn, 0.13, 0.4);
  loss.backward();
  check_close(x.grad(), torch_ref("k_gru_grad_x"), 0, 1e-12, "d input");
  check_close(gru.weights[2].w_hh.grad(), torch_ref("k_gru_grad_weight_hh_l1"), 0, 1e-12, "d weight_hh_l1");
  CHECK(kiln::equal(gru(input()), std::get<0>(gru(input(), Tensor()))));  // no state: zeros
  kiln::manual_seed(6);
  GRU small(GRUOptions(2, 3).num_layers(2));
  small.to(DType::F64);
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        auto [o, h] = small(in[0], in[1]);
        return kiln::cat({o.flatten(), h.flatten()});
      },
      {kiln::randn({3, 2, 2}, f64(true)), kiln::randn({2, 2, 3}, f64(true))}));
}

TEST_CASE("RNN (relu) and the GRU / RNN cells match PyTorch", "[rnn]") {
  RNN rnn(RNNOptions(3, 2).num_layers(2).nonlinearity("relu"));
  set_params_to_sequence(rnn);
  CHECK(rnn.extra_repr() == "3, 2, num_layers=2");  // PyTorch does not print the nonlinearity
  auto [out, hn] = rnn(input().transpose(0, 1), h0().slice(0, 0, 2));
  check_close(out, torch_ref("k_rnn_relu_out"), 0, 1e-14, "output");
  check_close(hn, torch_ref("k_rnn_relu_hn"), 0, 1e-14, "h_n");
  GRUCell gc(3, 2);
  set_params_to_sequence(gc);
  check_close(gc(input().select(1, 0), h0()[0]), torch_ref("k_gru_cell_h"), 0, 1e-14, "GRUCell");
  CHECK(kiln::equal(gc(input().select(1, 0)), gc(input().select(1, 0), kiln::zeros({2, 2}, f64()))));
  RNNCell rc(3, 2);
  set_params_to_sequence(rc);
  check_close(rc(input().select(1, 0), h0()[0]), torch_ref("k_rnn_cell_h"), 0, 1e-14, "RNNCell");
  CHECK(RNNCell(3, 2, true, "relu").extra_repr() == "3, 2, nonlinearity=relu");
  CHECK(kiln::gradcheck([&](const TL& in) { return gc(in[0], in[1]); },
                        {kiln::randn({2, 3}, f64(true)), kiln::randn({2, 2}, f64(true))}));
  CHECK(kiln::gradcheck([&](const TL& in) { return rc(in[0], in[1]); },
                        {kiln::randn({3}, f64(true)), kiln::randn({2}, f64(true))}));
  CHECK_THAT(error_of([&] { RNN bad(RNNOptions(3, 2).nonlinearity("gelu")); }),
             Catch::Contains("unknown nonlinearity 'gelu'"));
  CHECK_THAT(error_of([&] { LSTM bad(LSTMOptions(3, 2).nonlinearity("relu")); }),
             Catch::Contains("nonlinearity is an option of nn::RNN only"));
  CHECK_THAT(error_of([&] {
               rnn(kiln::zeros({4, 2, 3}, f64()), kiln::zeros({2, 3, 2}, f64()));
             }),
             Catch::Contains("RNN: expected hidden[0] of sizes [2, 2, 2], got [2, 3, 2]"));
  CHECK_THAT(error_of([&] {
               gc(kiln::zeros({2, 4}, f64()));
             }),
             Catch::Contains("GRUCell: input has inconsistent input_size"));
}

TEST_CASE("LSTM with proj_size matches PyTorch, with gradients", "[rnn]") {
  LSTM lstm(ref_options().hidden_size(4).proj_size(2));
  check_parameter_names(lstm, 20, {{4, "weight_hr_l0"}, {19, "weight_hr_l1_reverse"}});  // after the biases
  CHECK(lstm.weights[0].w_hh.sizes() == IntList{16, 2});
  CHECK(lstm.weights[0].w_hr.sizes() == IntList{2, 4});
  CHECK(lstm.weights[2].w_ih.sizes() == IntList{16, 4});  // layer 1 reads both directions' projections
  set_params_to_sequence(lstm);
  Tensor x = input().requires_grad_();
  Tensor h = h0().requires_grad_(), c = (sin_seq(32, 0.17, 0.9).view({4, 2, 4}) * 0.3).requires_grad_();
  auto [out, state] = lstm(x, LSTMState{h, c});
  auto [hn, cn] = state;
  CHECK(out.sizes() == IntList{2, 3, 4});
  CHECK(hn.sizes() == IntList{4, 2, 2});
  CHECK(cn.sizes() == IntList{4, 2, 4});
  check_close(out, torch_ref("k_proj_out"), 0, 1e-13, "output");
  check_close(hn, torch_ref("k_proj_hn"), 0, 1e-13, "h_n");
  check_close(cn, torch_ref("k_proj_cn"), 0, 1e-13, "c_n");
  (out.sum() + (hn * 0.5).sum() + (cn * 0.25).sum()).backward();
  check_close(x.grad(), torch_ref("k_proj_grad_input"), 0, 1e-13, "input gradient");
  check_close(h.grad(), torch_ref("k_proj_grad_h0"), 0, 1e-13, "h0 gradient");
  check_close(c.grad(), torch_ref("k_proj_grad_c0"), 0, 1e-13, "c0 gradient");
  check_close(lstm.weights[3].w_hr.grad(), torch_ref("k_proj_grad_weight_hr_l1_reverse"), 0, 1e-13,
              "weight_hr_l1_reverse gradient");
  // unbatched, a gradcheck, the printed options, errors
  auto [u_out, u_state] = lstm(x.select(0, 1), LSTMState{h.select(1, 1), c.select(1, 1)});
  check_same_tensor(u_out, out.select(0, 1), 1e-14, "unbatched");
  CHECK(lstm.extra_repr() == "3, 4, num_layers=2, batch_first=True, bidirectional=True, proj_size=2");
  kiln::manual_seed(12);
  LSTM small(LSTMOptions(2, 3).proj_size(1).num_layers(2));
  small.to(DType::F64);
  CHECK(lstm_gradcheck(small, {kiln::randn({3, 2, 2}, f64(true)), kiln::randn({2, 2, 1}, f64(true)),
                               kiln::randn({2, 2, 3}, f64(true))}));
  CHECK_THAT(error_of([&] {
               lstm(x, LSTMState{kiln::zeros({4, 2, 4}, f64()), c});
             }),
             Catch::Contains("expected hidden[0] of sizes [4, 2, 2], got [4, 2, 4]"));
  CHECK_THAT(error_of([&] { LSTM bad(LSTMOptions(3, 4).proj_size(4)); }),
             Catch::Contains("proj_size must be >= 0 and smaller than hidden_size (4), got 4"));
  CHECK_THAT(error_of([&] { LSTM bad(LSTMOptions(3, 4).proj_size(-1)); }), Catch::Contains("proj_size must be >= 0"));
  CHECK_THAT(error_of([&] { GRU bad(GRUOptions(3, 4).proj_size(2)); }),
             Catch::Contains("proj_size is an option of nn::LSTM only"));
}
