// nn::LSTM, nn::GRU, nn::RNN and their cells: outputs, final states and gradients against PyTorch's (torch 2.x,
// float64, every parameter set to a fixed sequence; pasted below), consistency between the cell,
// the layer, batch_first and unbatched inputs, f64 gradchecks, dropout between layers, parameter
// names and initialisation, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

using kiln::nn::GRU;
using kiln::nn::GRUCell;
using kiln::nn::GRUOptions;
using kiln::nn::LSTM;
using kiln::nn::LSTMCell;
using kiln::nn::LSTMOptions;
using kiln::nn::LSTMState;
using kiln::nn::RNN;
using kiln::nn::RNNCell;
using kiln::nn::RNNOptions;

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

// Reference values (PyTorch, float64), row-major; the comment gives the sizes.
// [2, 3, 4]
const std::vector<double> k_lstm_out = {
    0.45180634273264736,  0.45512226762364016,   -0.10413385535905517, -0.09272992588815734, 0.7142788017813316,
    0.7531503301470668,   -0.08373302498414488,  -0.0748046930878834,  0.8253322865809908,   0.8638917380916475,
    -0.06261221076903563, -0.060499895804004715, 0.40658931323706354,  0.4013865038033589,   -0.09795444799202839,
    -0.09069756306921707, 0.6587840420430939,    0.6793839998515919,   -0.09256395386464182, -0.08769033720611948,
    0.7643408412016056,   0.7846387540928438,    -0.07070752954678187, -0.06936231537951944};
// [4, 2, 2]
const std::vector<double> k_lstm_hn = {
    0.9097690678193774,   0.8929770879699356,    0.07283818909613367,  0.014707316585418727,
    -0.06546961776396415, -0.057745791650224254, -0.05808248871353026, -0.05149530047611106,
    0.8253322865809908,   0.8638917380916475,    0.7643408412016056,   0.7846387540928438,
    -0.10413385535905517, -0.09272992588815734,  -0.09795444799202839, -0.09069756306921707};
// [4, 2, 2]
const std::vector<double> k_lstm_cn = {
    2.3111475633744285,  2.509618853437416,   0.18506605015538044,  0.03483367488616507,
    -0.3764231528287769, -0.3068358944091189, -0.21070951846468847, -0.1809477547845018,
    1.4383872247399074,  1.7729609562220854,  1.4577457435468908,   1.6199095422404448,
    -0.5636164623606319, -0.4922664456374134, -0.4800986177736314,  -0.44103752792011064};
// [2, 3, 4]
const std::vector<double> k_lstm_out_zero = {
    0.39136934946492,     0.41237680597204396,   -0.10905305276620353, -0.09791693663348074, 0.6715676567491873,
    0.7182845645310197,   -0.08677528848744934,  -0.07688348334271689, 0.8049175262028353,   0.8492916119611877,
    -0.06282804946716056, -0.057283418973025996, 0.37400988295130955,  0.388550668051942,    -0.09720001696751435,
    -0.09236743287887064, 0.6159812987283781,    0.6394958166178766,   -0.08919268626847733, -0.08575793958003597,
    0.7256882297157269,   0.7470441592861915,    -0.06774148643752297, -0.06561900949363804};
// [4, 2, 2]
const std::vector<double> k_lstm_hn_zero = {
    0.8965460872339486,   0.8815501499889284,   -0.049697267935247535, -0.08376334329873983,
    -0.0660926953885902,  -0.05819990256356007, -0.060233178693862105, -0.054186975435546264,
    0.8049175262028353,   0.8492916119611877,   0.7256882297157269,    0.7470441592861915,
    -0.10905305276620353, -0.09791693663348074, -0.09720001696751435,  -0.09236743287887064};
// [2, 2]
const std::vector<double> k_cell_h = {0.5829385175746467, 0.5814766852992458, 0.4961560027678093, 0.4835941364826771};
// [2, 2]
const std::vector<double> k_cell_c = {0.8973201911773494, 0.9515547773145463, 0.8244149226200763, 0.8259664200770924};
// [2, 3, 3]
const std::vector<double> k_lstm_grad_x = {
    0.1310022895791348,  0.16800109217272052, 0.20332128338709407, 0.06515317873083633, 0.08324451162356476,
    0.10050409287312764, 0.11839574185204008, 0.1328797639484088,  0.14603609536761508, 0.24214248740226874,
    0.26645286623520237, 0.28810093610632115, 0.7268476608711826,  0.7426894786136045,  0.7511105885862209,
    0.7759278634569535,  0.7892278991844383,  0.7946422306273301};
// [8, 3]
const std::vector<double> k_lstm_grad_weight_ih_l0 = {
    0.2975554368262465,   0.28075464441469083,  0.24050740023799866,   0.3106570362093336,    0.30033622492905243,
    0.26493366005640295,  -0.12235345369987956, -0.17340245917783348,  -0.20997023531211925,  -0.12419365842509261,
    -0.1770409905163149,  -0.21510323132882792, -0.9314874658691737,   -1.116247042208875,    -1.2077863176424617,
    -0.8559003127065344,  -1.0374989613958259,  -1.1324537385101343,   -0.007420025704290883, -0.06065950593650833,
    -0.10883317440627953, 0.05281876853874979,  0.0009528280785641198, -0.050992685197348564};
// [8]
const std::vector<double> k_lstm_grad_bias_hh_l1_reverse = {
    -0.5296299665258181, -0.46660709254757754, -0.27644005821729006, -0.20402320898793372,
    0.4099027435365318,  0.22638535521064457,  -0.17451663445938032, -0.1270835728794538};

// [2, 3, 4]
const std::vector<double> k_gru_out = {
    -0.06448429775258155, -0.10272226266266296, -0.09027190629353292,  -0.05626953381495734, 0.048825055800888834,
    0.027687051942649532, -0.0948082120197601,  -0.061210393809618534, 0.18355601699925944,  0.17838254981495838,
    -0.19157967034310688, -0.15099144998657782, -0.021408290290659715, 0.009761866702241662, -0.42286186555115535,
    -0.4623659624085478,  0.20266576895324706,  0.2018467537312848,    -0.5717179243314464,  -0.624483518702398,
    0.34872818022324015,  0.3420408802459836,   -0.38446227805884026,  -0.3873354633375247};
// [4, 2, 2]
const std::vector<double> k_gru_hn = {
    0.43624896418964276,  0.46517927288523797,  -0.09975053280428436, -0.24467656940508492,
    -0.769697331424001,   -0.8044629913079041,  -0.4006506646818986,  -0.3999604835463038,
    0.18355601699925944,  0.17838254981495838,  0.34872818022324015,  0.3420408802459836,
    -0.09027190629353292, -0.05626953381495734, -0.42286186555115535, -0.4623659624085478};
// [2, 3, 3]
const std::vector<double> k_gru_grad_x = {
    -0.13620639646973495,  -0.14516790788195497, -0.15267894954474898, -0.016799178476608514, -0.018579994476620173,
    -0.020175165313551062, 0.010883112623761227, 0.012110376821596863, 0.013216638137389446,  -0.27067470164568674,
    -0.29438952532410395,  -0.31516290617772175, 0.4241500420480748,   0.4412782776126889,    0.45399740649460213,
    0.3792734829376152,    0.4015720935398689,   0.4198583285255577};
// [6, 2]
const std::vector<double> k_gru_grad_weight_hh_l1 = {-0.01135558695662113,  -0.01825284415940232, -0.01172057042742099,
                                                     -0.019363813701629005, 0.045192028380620405, 0.07243800521923696,
                                                     0.034835088034419315,  0.06883384930519773,  -0.1380017014276229,
                                                     -0.20570383966205671,  -0.13789431986984127, -0.21312757759285095};
// [3, 2, 2]
const std::vector<double> k_rnn_relu_out = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
// [2, 2, 2]
const std::vector<double> k_rnn_relu_hn = {
    2.5320188460542257, 3.132651170659294, 1.7813802787479749, 1.536445370746657, 0.0, 0.0, 0.0, 0.0};
// [2, 2]
const std::vector<double> k_gru_cell_h = {0.28254920797764604, 0.3514721599066448, 0.40351519250875884,
                                          0.39969052707282365};
// [2, 2]
const std::vector<double> k_rnn_cell_h = {0.8178424679447011, 0.8740731972335255, 0.8010389191080072,
                                          0.8138603036428409};

// An LSTM with proj_size 2 (hidden 4, 2 layers, bidirectional, batch_first), c0 [4, 2, 4].
// [2, 3, 4]
const std::vector<double> k_proj_out = {
    0.09108799360379866, 0.1428045489790777,  0.4605283110001771,  0.563205548072988,   0.10367133340485765,
    0.1616705614958966,  0.3206944459890126,  0.39235641322542547, 0.11982605141392108, 0.1865773845569089,
    0.09611347469334514, 0.11608032506204871, 0.08902198669887974, 0.1408835582384985,  0.47943410009223697,
    0.5846341052031346,  0.0790779551142322,  0.12276254597355672, 0.3699125859356328,  0.45044894263140367,
    0.08411453485978883, 0.12933359836518593, 0.19885841673709598, 0.24016571714517426};
// [4, 2, 2]
const std::vector<double> k_proj_hn = {
    0.11332269714925655,  -0.06612217301745019, 0.01188050782470369,   -0.08011915030768277,
    0.018295959943678452, 0.02502436224337405,  -0.035821351233018384, -0.09110884802541297,
    0.11982605141392108,  0.1865773845569089,   0.08411453485978883,   0.12933359836518593,
    0.4605283110001771,   0.563205548072988,    0.47943410009223697,   0.5846341052031346};
// [4, 2, 4]
const std::vector<double> k_proj_cn = {
    1.8142062741932317,   1.6331728966796737,   1.060508925496638,    0.1583319061431319,   -0.14010717901806036,
    0.0846454999225564,   0.27402898663590936,  0.38441346394836573,  -0.11470503201518686, -0.02387249444803713,
    0.05981433448568217,  0.1307819396490661,   -0.02899486663229795, -0.0916791983371738,  -0.17366142559223507,
    -0.23598866441071809, -0.21409832352821354, -0.34248153716935625, -0.43550460374494865, -0.49376242882630583,
    -0.1046755112475212,  -0.2047163029665302,  -0.30077865935893144, -0.3874319074184053,  0.2700325802649458,
    0.3606944011007084,   0.4569704993276743,   0.5590872478701586,   0.2487276838396895,   0.35633261221370827,
    0.47426027994392206,  0.5998130210822654};
// [2, 3, 3]
const std::vector<double> k_proj_grad_input = {
    0.06272337535737275,  0.06685567186624895, 0.07031996860138456, 0.04314514418479596, 0.03149290072701829,
    0.019525990615345195, 0.08196977290726214, 0.06452191492562823, 0.04642937529816687, 0.09429529896506565,
    0.1177468024241533,   0.14002181875533687, 0.14098187235466547, 0.15280764905241176, 0.1631066222323194,
    0.1897806388244983,   0.18496188854725926, 0.17829506021992747};
// [4, 2, 2]
const std::vector<double> k_proj_grad_h0 = {
    0.13025444035913575,  0.11513959828194421,   0.037183388019392874,  0.03611101100100259,
    -0.01927793525226734, -0.014305974165400812, -0.014225749113870837, 0.001808134260005926,
    0.05996398701733409,  0.08848277171889066,   0.06368844377436902,   0.0925800985421546,
    0.3050242063323667,   0.3855254669158125,    0.2679104002788393,    0.35695818169689075};
// [4, 2, 4]
const std::vector<double> k_proj_grad_c0 = {
    0.19207391056686018,  0.17054617351491855,  0.14086761289771407,  0.08747121115789738,  0.0883594546341238,
    0.04252769532149496,  0.003245274828006837, -0.03263133149507928, 0.012359808950703715, 0.02272142554758088,
    0.04080317116142132,  0.07431485464128315,  0.10132077212695624,  0.1275475425809094,   0.1399592187971398,
    0.14044365620023766,  -0.16896291384011838, -0.1753956497772082,  -0.177044730060659,   -0.17632743759249217,
    -0.17652237553105923, -0.1860406872029714,  -0.18914251948090113, -0.18780107246013059, 0.6260720265297155,
    0.7245856284597207,   0.8152710001403698,   0.889947084334718,    0.6341929512185386,   0.7301586074237311,
    0.8107857853201254,   0.8698283492286242};
// [2, 4]
const std::vector<double> k_proj_grad_weight_hr_l1_reverse = {
    0.9513919974669822, 1.3749366886083165, 1.8153422335294827, 2.2495435314342833,
    0.9782106014627697, 1.4162986838901452, 1.8721950173696957, 2.3220718711290034};

}  // namespace

TEST_CASE("LSTM: 2 layers, bidirectional, batch_first match PyTorch", "[rnn]") {
  LSTM lstm(ref_options());
  set_params_to_sequence(lstm);
  auto [out, state] = lstm(input(), LSTMState{h0(), c0()});
  CHECK(out.sizes() == IntList{2, 3, 4});
  CHECK(std::get<0>(state).sizes() == IntList{4, 2, 2});
  check_close(out, k_lstm_out, 0, 1e-13, "output");
  check_close(std::get<0>(state), k_lstm_hn, 0, 1e-13, "h_n");
  check_close(std::get<1>(state), k_lstm_cn, 0, 1e-13, "c_n");
  // no initial state: zeros
  auto [out0, state0] = lstm(input(), {});
  check_close(out0, k_lstm_out_zero, 0, 1e-13, "output, zero state");
  check_close(std::get<0>(state0), k_lstm_hn_zero, 0, 1e-13, "h_n, zero state");
  check_close(lstm(input()), k_lstm_out_zero, 0, 1e-13, "single-input forward");
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
  check_close(x.grad(), k_lstm_grad_x, 0, 1e-12, "d input");
  check_close(lstm.weights[0].w_ih.grad(), k_lstm_grad_weight_ih_l0, 0, 1e-12, "d weight_ih_l0");
  check_close(lstm.weights[3].b_hh.grad(), k_lstm_grad_bias_hh_l1_reverse, 0, 1e-12, "d bias_hh_l1_reverse");
}

TEST_CASE("LSTMCell matches PyTorch and one LSTM layer", "[rnn]") {
  LSTMCell cell(3, 2);
  set_params_to_sequence(cell);
  auto [h, c] = cell(input().select(1, 0), LSTMState{h0()[0], c0()[0]});
  check_close(h, k_cell_h, 0, 1e-14, "h'");
  check_close(c, k_cell_c, 0, 1e-14, "c'");
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
  check_close(out, k_gru_out, 0, 1e-13, "output");
  check_close(hn, k_gru_hn, 0, 1e-13, "h_n");
  Tensor loss = weighted_sum(out, 0.21, 0.3) + weighted_sum(hn, 0.13, 0.4);
  loss.backward();
  check_close(x.grad(), k_gru_grad_x, 0, 1e-12, "d input");
  check_close(gru.weights[2].w_hh.grad(), k_gru_grad_weight_hh_l1, 0, 1e-12, "d weight_hh_l1");
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
  check_close(out, k_rnn_relu_out, 0, 1e-14, "output");
  check_close(hn, k_rnn_relu_hn, 0, 1e-14, "h_n");
  GRUCell gc(3, 2);
  set_params_to_sequence(gc);
  check_close(gc(input().select(1, 0), h0()[0]), k_gru_cell_h, 0, 1e-14, "GRUCell");
  CHECK(kiln::equal(gc(input().select(1, 0)), gc(input().select(1, 0), kiln::zeros({2, 2}, f64()))));
  RNNCell rc(3, 2);
  set_params_to_sequence(rc);
  check_close(rc(input().select(1, 0), h0()[0]), k_rnn_cell_h, 0, 1e-14, "RNNCell");
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
  const std::vector<std::string> names = parameter_names(lstm);
  REQUIRE(names.size() == 20);
  CHECK(names[4] == "weight_hr_l0");  // torch's order: after the biases
  CHECK(names[19] == "weight_hr_l1_reverse");
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
  check_close(out, k_proj_out, 0, 1e-13, "output");
  check_close(hn, k_proj_hn, 0, 1e-13, "h_n");
  check_close(cn, k_proj_cn, 0, 1e-13, "c_n");
  (out.sum() + (hn * 0.5).sum() + (cn * 0.25).sum()).backward();
  check_close(x.grad(), k_proj_grad_input, 0, 1e-13, "input gradient");
  check_close(h.grad(), k_proj_grad_h0, 0, 1e-13, "h0 gradient");
  check_close(c.grad(), k_proj_grad_c0, 0, 1e-13, "c0 gradient");
  check_close(lstm.weights[3].w_hr.grad(), k_proj_grad_weight_hr_l1_reverse, 0, 1e-13, "weight_hr_l1_reverse gradient");
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
