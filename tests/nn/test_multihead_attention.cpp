// nn::MultiheadAttention (torch's form): outputs, attention weights and gradients against PyTorch's
// (the values pasted below; inputs in transformer_test_util.h), the projection and mask routes
// against each other, batch_first and unbatched layouts, fully masked rows, dropout, f64
// gradchecks, parameter names, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/nn/transformer_test_util.h"

using namespace kiln_test;
using namespace kiln_test::transformer;

namespace {

// Reference values (PyTorch, float64), row-major; the comment gives the sizes.
// [3, 2, 4]
const std::vector<double> k_mha_out = {
    -0.6031306562410188, -0.519209678329436, -0.2935341205320714,  0.03362382889212001, 1.3322486940618952,
    1.2457310659308947,  1.0223226816942386, 0.692651833079835,    1.3823154380664573,  1.290764786943563,
    1.0552135453688307,  0.7082070952466326, -0.12048813507567652, -0.0681902109933083, 0.05465623610111758,
    0.2240134735215603,  0.8276946891168627, 0.7809422820409806,   0.6706790480571985,  0.509670147504712,
    0.475799300288844,   0.4652609174912046, 0.4410508540444095,   0.40234836679747443};
// [2, 3, 5]
const std::vector<double> k_mha_weights = {0.7170905637888491,
                                           0.0,
                                           0.04743396673895954,
                                           0.2354754694721914,
                                           0.0,
                                           0.0,
                                           0.29498290423210005,
                                           0.38417033797885936,
                                           0.3208467577890406,
                                           0.0,
                                           0.5294760137755843,
                                           0.39303624053596276,
                                           0.07748774568845301,
                                           0.0,
                                           0.0,
                                           0.4820510378166837,
                                           0.0,
                                           0.019138367282654972,
                                           0.352971497283808,
                                           0.14583909761685337,
                                           0.0,
                                           0.0,
                                           0.7528939360516842,
                                           0.24710606394831575,
                                           0.0,
                                           0.779228052065928,
                                           0.0,
                                           0.020089579085865544,
                                           0.0,
                                           0.20068236884820642};
// [3, 2, 4]
const std::vector<double> k_mha_grad_query = {
    -0.11483340477975008,  -0.13208684296616824,  -0.14802051307977374,  -0.16247521115576244, -0.022175631975458108,
    -0.023799621078544657, -0.025185812234923166, -0.02632035508077297,  0.2537611591975215,   0.3040242389665873,
    0.351249609036951,     0.39496540912150124,   0.9006875507499195,    1.1001852109612582,   1.2886901842175518,
    1.4643189911374819,    -0.19574998432665153,  -0.2354178968047518,   -0.27273359147678955, -0.3073242222565302,
    -0.03740789377083027,  -0.04265017039871775,  -0.047466300622253155, -0.05180816326024392};
// [5, 2, 4]
const std::vector<double> k_mha_grad_key = {-0.9171085032729425,
                                            -0.8054550412670315,
                                            -0.6857537387368184,
                                            -0.5592006115291952,
                                            -0.8351032417166872,
                                            -0.7198913930005818,
                                            -0.5974866274500712,
                                            -0.4691119730208994,
                                            0.6267627917926885,
                                            0.5593786978726542,
                                            0.48640547690949004,
                                            0.40857225320532,
                                            0.0,
                                            0.0,
                                            0.0,
                                            0.0,
                                            0.09280822569284704,
                                            0.07871605929221398,
                                            0.06383738804720288,
                                            0.048320874722659043,
                                            0.3789857714568545,
                                            0.3191821379929867,
                                            0.2561893421138802,
                                            0.19063678701330905,
                                            0.19753748578740718,
                                            0.16736028410216353,
                                            0.13551087378012572,
                                            0.1023074836012162,
                                            0.24342666744671554,
                                            0.22123691626311437,
                                            0.19683663894341358,
                                            0.1704696349929324,
                                            0.0,
                                            0.0,
                                            0.0,
                                            0.0,
                                            0.21269080281311686,
                                            0.17947233874448063,
                                            0.14446064639277711,
                                            0.10800555101465785};
// [5, 2, 4]
const std::vector<double> k_mha_grad_value = {-1.1044207954938283,
                                              -1.2627578938172497,
                                              -1.4084779326779124,
                                              -1.540124925616161,
                                              -1.1734943562935813,
                                              -1.332741946783346,
                                              -1.4786732202867667,
                                              -1.6098300797574634,
                                              -0.9363088489385315,
                                              -1.0658461703368896,
                                              -1.184733909123143,
                                              -1.2917841783104007,
                                              0.0,
                                              0.0,
                                              0.0,
                                              0.0,
                                              -0.778356942781667,
                                              -0.8669564809737311,
                                              -0.9468936765856166,
                                              -1.0173698235824937,
                                              -1.2806210296099785,
                                              -1.4338725088410214,
                                              -1.5727972079389594,
                                              -1.696007037232806,
                                              -0.6358732204850208,
                                              -0.7221767067204301,
                                              -0.8012644420221695,
                                              -0.8723462078820333,
                                              -0.7290183819477194,
                                              -0.8453974132018027,
                                              -0.9533295129544045,
                                              -1.0517362593424053,
                                              0.0,
                                              0.0,
                                              0.0,
                                              0.0,
                                              -0.34916501929998245,
                                              -0.3914209074790519,
                                              -0.4297658473371402,
                                              -0.46381670891033744};
// [12, 4]
const std::vector<double> k_mha_grad_in_proj_weight = {
    -1.6469272334358005, -1.9532558658964465, -1.9952204800455002, -1.767141362222791,   -1.4097235599146507,
    -1.6680888351574559, -1.7006861119201744, -1.5031035017137107, -1.1559545234379718,  -1.4569035756175506,
    -1.5606675634809308, -1.4532025180496762, -0.4191999091638956, -0.5125589335532273,  -0.5365455108087849,
    -0.4879131702251489, 0.12321828127614524, 0.03681257089983048, -0.05153195487830972, -0.13716243636771738,
    -0.564864848722222,  -0.6603230170708825, -0.7210038144187347, -0.7437113524695455,  -1.509588589304489,
    -1.7567332560937081, -1.9113556835891399, -1.9653123399328354, -1.8848068229750417,  -2.1471643580222297,
    -2.2964367369440266, -2.3247622000141637, 2.6547346318430747,  2.3464427710398144,   1.814457809510671,
    1.109495395236805,   2.5195036817636702,  2.2261859305092973,  1.7206395070988652,   1.051059598054418,
    2.3152046683280565,  2.265503844517692,   1.9998260593506276,  1.543499135986032,    2.134348983178903,
    2.0880235576003585,  1.8426408740511309,  1.4215939656045322};
// [2, 2, 3, 5]
const std::vector<double> k_mha_weights_per_head = {0.7560745534937143,
                                                    0.0,
                                                    0.02982089149712163,
                                                    0.21410455500916406,
                                                    0.0,
                                                    0.0,
                                                    0.33257578622744643,
                                                    0.33336662569281283,
                                                    0.3340575880797408,
                                                    0.0,
                                                    0.5737794753874308,
                                                    0.37868862421368976,
                                                    0.04753190039887949,
                                                    0.0,
                                                    0.0,
                                                    0.6781065740839838,
                                                    0.0,
                                                    0.06504704198079746,
                                                    0.25684638393521875,
                                                    0.0,
                                                    0.0,
                                                    0.2573900222367537,
                                                    0.4349740502649058,
                                                    0.30763592749834046,
                                                    0.0,
                                                    0.48517255216373767,
                                                    0.40738385685823575,
                                                    0.10744359097802653,
                                                    0.0,
                                                    0.0,
                                                    0.48832315692983025,
                                                    0.0,
                                                    0.016375208685641202,
                                                    0.36475995922404414,
                                                    0.13054167516048445,
                                                    0.0,
                                                    0.0,
                                                    0.6640660790202347,
                                                    0.3359339209797652,
                                                    0.0,
                                                    0.8031313959912443,
                                                    0.0,
                                                    0.017060980041306534,
                                                    0.0,
                                                    0.17980762396744907,
                                                    0.47577891870353717,
                                                    0.0,
                                                    0.02190152587966874,
                                                    0.34118303534357186,
                                                    0.16113652007322232,
                                                    0.0,
                                                    0.0,
                                                    0.8417217930831337,
                                                    0.15827820691686628,
                                                    0.0,
                                                    0.7553247081406118,
                                                    0.0,
                                                    0.023118178130424553,
                                                    0.0,
                                                    0.22155711372896378};
// [2, 3, 4]
const std::vector<double> k_mha_self_out = {
    -0.14098086453758057, -0.09934450326743982, 0.01775895874408573, 0.18719847987875607,  0.6886482933741702,
    0.6436472211381912,   0.5568111932662714,   0.43720672937008637, 2.1304665479398492,   1.9598985380524452,
    1.539688431329891,    0.9315351842032079,   0.41170274462930256, 0.40122735950724675,  0.3871897845714598,
    0.3671632644078053,   -0.32500679455095466, -0.2653327147376232, -0.10398564534151666, 0.1289182792417941,
    0.6721342198481295,   0.6390547263461912,   0.5648653311561671,  0.45663592866349356};
// [2, 3, 4]
const std::vector<double> k_mha_self_grad_x = {
    -3.41051331616877,   -3.711171438263541,  -3.974748762097359,  -4.1986117101775555, -1.4444069006706401,
    -1.9022058679199993, -2.3409986229227626, -2.756400893516543,  -2.73854384553062,   -3.0827025100253236,
    -3.3960598300458233, -3.675484842832632,  -1.0625132229452918, -1.3733480932424253, -1.6704609233604033,
    -1.950883060113131,  -4.309773244978505,  -4.578271998548373,  -4.80102617168426,   -4.975810078320931,
    -0.9659221205593557, -1.2971022906917327, -1.6153222435005294, -1.9174024304068111};

}  // namespace

TEST_CASE("MultiheadAttention: cross-attention with both masks matches PyTorch, with gradients", "[transformer]") {
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2));
  set_params_to_sequence(mha);
  Tensor q = mha_query().requires_grad_(), k = mha_key().requires_grad_(), v = mha_value().requires_grad_();
  auto args = MultiheadAttentionArgs().attn_mask(mha_attn_mask()).key_padding_mask(mha_key_padding_mask());
  auto [out, weights] = mha(q, k, v, args);
  CHECK(out.sizes() == IntList{3, 2, 4});
  CHECK(weights.sizes() == IntList{2, 3, 5});
  check_close(out, k_mha_out, 0, 1e-13, "output");
  check_close(weights, k_mha_weights, 0, 1e-13, "weights averaged over heads");
  weighted_sum(out, 0.11, 0.3).backward();
  check_close(q.grad(), k_mha_grad_query, 0, 1e-13, "query gradient");
  check_close(k.grad(), k_mha_grad_key, 0, 1e-13, "key gradient");
  check_close(v.grad(), k_mha_grad_value, 0, 1e-13, "value gradient");
  check_close(mha.in_proj_weight.grad(), k_mha_grad_in_proj_weight, 0, 1e-13, "in_proj_weight gradient");
  auto [out2, per_head] = mha(q, k, v, MultiheadAttentionArgs(args).average_attn_weights(false));
  CHECK(per_head.sizes() == IntList{2, 2, 3, 5});
  check_close(per_head, k_mha_weights_per_head, 0, 1e-13, "weights per head");
  check_close(out2, k_mha_out, 0, 1e-13, "output with weights per head");
}

TEST_CASE("MultiheadAttention: batch_first self-attention with a 3-D float mask matches PyTorch", "[transformer]") {
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2).batch_first(true));
  set_params_to_sequence(mha);
  Tensor x = sin_seq(24, 0.41, 0.7).view({2, 3, 4}).requires_grad_();
  Tensor mask = sin_seq(36, 0.53, 0.2).view({4, 3, 3});
  auto [y, w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(mask).need_weights(false));
  CHECK_FALSE(w.defined());
  check_close(y, k_mha_self_out, 0, 1e-13, "output");
  y.sum().backward();
  check_close(x.grad(), k_mha_self_grad_x, 0, 1e-13, "input gradient");
}

TEST_CASE("MultiheadAttention: the projection routes, mask forms and layouts agree", "[transformer]") {
  kiln::manual_seed(3);
  MultiheadAttention mha(MultiheadAttentionOptions(6, 3));
  mha.to(DType::F64);
  Tensor x = kiln::randn({4, 2, 6}, f64());
  Tensor kv = kiln::randn({5, 2, 6}, f64());
  // One GEMM for self-attention, the row blocks of in_proj_weight for separate tensors: the same result.
  auto [self_out, self_w] = mha(x, x, x);
  auto [copies_out, copies_w] = mha(x, x.clone(), x.clone());
  check_same_tensor(copies_out, self_out, 1e-14, "self-attention through separate key and value");
  check_same_tensor(copies_w, self_w, 1e-14, "its weights");
  auto [kv_out, kv_w] = mha(x, kv, kv);
  auto [kv2_out, kv2_w] = mha(x, kv, kv.clone());
  check_same_tensor(kv2_out, kv_out, 1e-14, "key is value against separate key and value");
  // need_weights only adds the weights; forward(x) is self-attention without them.
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().need_weights(false))), self_out, 1e-14,
                    "need_weights=false");
  check_same_tensor(mha(x), self_out, 1e-14, "forward(x)");
  // A bool mask (true: masked) equals the float mask with -inf there; the masked weights are 0.
  Tensor bool_mask = kiln::rand({4, 5}, f64()) < 0.3;
  bool_mask.select(1, 0).fill_(0.0);  // every query keeps key 0
  Tensor float_mask = kiln::zeros({4, 5}, f64()).masked_fill(bool_mask, -INFINITY);
  Tensor padding = kiln::zeros({2, 5}, kiln::TensorOptions().dtype(DType::Bool));
  padding.select(0, 1).narrow(0, 3, 2).fill_(1.0);
  auto [b_out, b_w] = mha(x, kv, kv, MultiheadAttentionArgs().attn_mask(bool_mask).key_padding_mask(padding));
  auto [f_out, f_w] = mha(x, kv, kv, MultiheadAttentionArgs().attn_mask(float_mask).key_padding_mask(padding));
  check_same_tensor(f_out, b_out, 1e-14, "float mask against bool mask");
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t l = 0; l < 4; ++l)
      for (int64_t s = 0; s < 5; ++s) {
        const bool masked = bool_mask.select(0, l).select(0, s).item() != 0 || (n == 1 && s >= 3);
        if (masked) CHECK(b_w.select(0, n).select(0, l).select(0, s).item() == 0.0);
        else CHECK(b_w.select(0, n).select(0, l).select(0, s).item() > 0.0);
      }
  // is_causal without a mask, the causal option and an explicit causal mask agree.
  Tensor later = kiln::ones({4, 4}, f64()).triu(1) > 0.5;
  auto [c_out, c_w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(later));
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().is_causal(true))), c_out, 1e-14, "is_causal");
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().is_causal(true).need_weights(false))), c_out,
                    1e-14, "is_causal, blocked kernel");
  // torch's hint: is_causal with a mask runs the causal kernel in the mask's place when no padding
  // mask and no weights are asked for (so a wrong hint shows), and uses the mask otherwise.
  Tensor not_causal = kiln::zeros({4, 4}, kiln::TensorOptions().dtype(DType::Bool));
  not_causal.select(1, 2).fill_(1.0);
  auto [nc_out, nc_w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(not_causal));
  check_same_tensor(
      std::get<0>(mha(x, x, x, MultiheadAttentionArgs().attn_mask(not_causal).is_causal(true).need_weights(false))),
      c_out, 1e-12, "is_causal hint without weights: the causal kernel");
  check_same_tensor(std::get<0>(mha(x, x, x, MultiheadAttentionArgs().attn_mask(not_causal).is_causal(true))), nc_out,
                    1e-14, "is_causal hint with weights: the mask");
  MultiheadAttention causal(MultiheadAttentionOptions(6, 3).causal(true));
  causal.load_state_dict(mha.state_dict());
  causal.to(DType::F64);
  check_same_tensor(std::get<0>(causal(x, x, x)), c_out, 1e-14, "causal option");
  check_same_tensor(causal(x), c_out, 1e-14, "causal option, forward(x)");
  // causal and a padding mask together: both apply.
  Tensor pad_self = kiln::zeros({2, 4}, kiln::TensorOptions().dtype(DType::Bool));
  pad_self.select(0, 0).select(0, 3).fill_(1.0);
  auto [cp_out, cp_w] = causal(x, x, x, MultiheadAttentionArgs().key_padding_mask(pad_self));
  auto [mp_out, mp_w] = mha(x, x, x, MultiheadAttentionArgs().attn_mask(later).key_padding_mask(pad_self));
  check_same_tensor(cp_out, mp_out, 1e-14, "causal option with a padding mask");
  // batch_first is the transposed layout; an unbatched input is a batch of one.
  MultiheadAttention bf(MultiheadAttentionOptions(6, 3).batch_first(true));
  bf.load_state_dict(mha.state_dict());
  bf.to(DType::F64);
  auto [bf_out, bf_w] = bf(x.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1));
  check_same_tensor(bf_out.transpose(0, 1), kv_out, 1e-14, "batch_first");
  check_same_tensor(bf_w, kv_w, 1e-14, "batch_first weights");
  check_same_tensor(bf(x.transpose(0, 1)).transpose(0, 1), self_out, 1e-14, "batch_first forward(x)");
  Tensor x1 = x.select(1, 1), kv1 = kv.select(1, 1);
  auto [u_out, u_w] = mha(x1, kv1, kv1, MultiheadAttentionArgs().key_padding_mask(padding.select(0, 1)));
  CHECK(u_out.sizes() == IntList{4, 6});
  CHECK(u_w.sizes() == IntList{4, 5});
  auto [n_out, n_w] = mha(x, kv, kv, MultiheadAttentionArgs().key_padding_mask(padding));
  check_same_tensor(u_out, n_out.select(1, 1), 1e-14, "unbatched");
  check_same_tensor(u_w, n_w.select(0, 1), 1e-14, "unbatched weights");
}

TEST_CASE("MultiheadAttention: a query with every key masked, as in PyTorch", "[transformer]") {
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2));
  set_params_to_sequence(mha);
  Tensor padding = bool_tensor({true, true, true, true, true, false, false, false, false, false}, {2, 5});
  Tensor q = mha_query().requires_grad_(), k = mha_key(), v = mha_value();
  // With the weights: a plain softmax, NaN for sample 0 (torch's need_weights=True path).
  auto [out, w] = mha(q, k, v, MultiheadAttentionArgs().key_padding_mask(padding));
  for (double x : values(out.select(1, 0))) CHECK(std::isnan(x));
  for (double x : values(w.select(0, 0))) CHECK(std::isnan(x));
  for (double x : values(out.select(1, 1))) CHECK(std::isfinite(x));
  // Without: the query attends to nothing, so its output is out_proj's bias, and gradients stay finite.
  auto [out2, none] = mha(q, k, v, MultiheadAttentionArgs().key_padding_mask(padding).need_weights(false));
  check_same_tensor(out2.select(1, 0), mha.out_proj.bias.view({1, 4}).expand({3, 4}), 0, "output of the masked sample");
  check_same_tensor(out2.select(1, 1), out.select(1, 1), 1e-14, "the other sample");
  out2.sum().backward();
  for (double x : values(q.grad())) CHECK(std::isfinite(x));
  for (double x : values(mha.in_proj_weight.grad())) CHECK(std::isfinite(x));
  CHECK(values(q.grad().select(1, 0)) == std::vector<double>(12, 0.0));
}

TEST_CASE("TransformerEncoder: left padding under a causal mask stays finite, as in PyTorch", "[transformer]") {
  // Sample 0's first two positions are padding, so its first query sees no key at all; torch's
  // encoder (scaled_dot_product_attention inside) gives that row 0, and nothing turns NaN in the
  // next layer or in the gradients.
  kiln::manual_seed(13);
  TransformerEncoder encoder(TransformerEncoderOptions(
      TransformerEncoderLayerOptions(8, 2).dim_feedforward(16).dropout(0.0).batch_first(true), 2));
  encoder.to(DType::F64);
  Tensor src = kiln::randn({2, 5, 8}, f64(true));
  Tensor padding = bool_tensor({true, true, false, false, false, false, false, false, false, false}, {2, 5});
  Tensor out = encoder(src, Tensor(), padding, /*is_causal=*/true);
  out.narrow(1, 2, 3).sum().backward();
  for (double x : values(out)) CHECK(std::isfinite(x));
  for (double x : values(src.grad())) CHECK(std::isfinite(x));
  for (const Tensor& p : encoder.parameters())
    for (double x : values(p.grad())) CHECK(std::isfinite(x));
}

TEST_CASE("MultiheadAttention: dropout on the attention probabilities in training only", "[transformer]") {
  kiln::manual_seed(4);
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2).dropout(1.0));
  set_params_to_sequence(mha);
  Tensor q = mha_query(), k = mha_key(), v = mha_value();
  // p = 1 drops every probability: the weights are 0 and the output is out_proj's bias.
  auto [out, w] = mha(q, k, v);
  CHECK(values(w) == std::vector<double>(30, 0.0));
  check_same_tensor(out, mha.out_proj.bias.view({1, 1, 4}).expand({3, 2, 4}), 0, "output under full dropout");
  CHECK(kiln::equal(mha(q), mha.out_proj.bias.view({1, 1, 4}).expand({3, 2, 4})));
  mha.eval();
  MultiheadAttention plain(MultiheadAttentionOptions(4, 2));
  set_params_to_sequence(plain);
  check_same_tensor(std::get<0>(mha(q, k, v)), std::get<0>(plain(q, k, v)), 0, "eval: no dropout");
  // 0 < p < 1: the kept probabilities are scaled by 1 / (1 - p), the mask follows the seed.
  MultiheadAttention half(MultiheadAttentionOptions(4, 2).dropout(0.5));
  set_params_to_sequence(half);
  kiln::manual_seed(9);
  auto [o1, w1] = half(q, k, v, MultiheadAttentionArgs().average_attn_weights(false));
  kiln::manual_seed(9);
  auto [o2, w2] = half(q, k, v, MultiheadAttentionArgs().average_attn_weights(false));
  CHECK(kiln::equal(o1, o2));
  half.eval();
  auto [oe, we] = half(q, k, v, MultiheadAttentionArgs().average_attn_weights(false));
  const auto a = values(w1), b = values(we);
  int kept = 0, dropped = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] == 0.0) ++dropped;
    else {
      ++kept;
      CHECK(std::abs(a[i] - 2.0 * b[i]) <= 1e-14);
    }
  }
  CHECK(kept > 10);
  CHECK(dropped > 10);
}

TEST_CASE("MultiheadAttention: gradcheck", "[transformer]") {
  kiln::manual_seed(6);
  MultiheadAttention mha(MultiheadAttentionOptions(4, 2));
  mha.to(DType::F64);
  Tensor padding = bool_tensor({false, false, true, false, false, false}, {2, 3});
  Tensor fmask = kiln::randn({2, 3}, f64());
  CHECK(kiln::gradcheck(
      [&](const TL& in) {
        auto [out, w] = mha(in[0], in[1], in[2], MultiheadAttentionArgs().attn_mask(fmask).key_padding_mask(padding));
        return kiln::cat({out.flatten(), w.flatten()});
      },
      {kiln::randn({2, 2, 4}, f64(true)), kiln::randn({3, 2, 4}, f64(true)), kiln::randn({3, 2, 4}, f64(true))}));
  CHECK(kiln::gradcheck(
      [&](const TL& in) { return std::get<0>(mha(in[0], in[0], in[0], MultiheadAttentionArgs().is_causal(true))); },
      {kiln::randn({3, 2, 4}, f64(true))}));
}

TEST_CASE("MultiheadAttention: torch's initialisation, the GPT constructor, names, errors", "[transformer]") {
  kiln::manual_seed(8);
  MultiheadAttention mha(MultiheadAttentionOptions(8, 2));
  const std::vector<std::string> names = parameter_names(mha);
  CHECK(names == std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"});
  const double xavier = std::sqrt(6.0 / (8 + 24));  // xavier_uniform_ of [24, 8]
  CHECK(mha.in_proj_weight.abs().max().item() <= xavier);
  CHECK(mha.in_proj_weight.abs().max().item() > 0.8 * xavier);
  CHECK(mha.in_proj_bias.abs().max().item() == 0.0);
  CHECK(mha.out_proj.bias.abs().max().item() == 0.0);
  CHECK(mha.out_proj.weight.abs().max().item() <= 1.0 / std::sqrt(8.0));
  // The GPT constructor: batch first, its dropout after the projection, Linear's initialisation.
  MultiheadAttention gpt(8, 2, /*causal=*/true, /*bias=*/true, /*dropout=*/0.25);
  CHECK(gpt.options.batch_first());
  CHECK(gpt.options.output_dropout() == 0.25);
  CHECK(gpt.options.dropout() == 0.0);
  CHECK(gpt.in_proj_bias.abs().max().item() > 0.0);

  Tensor x = kiln::zeros({3, 2, 8});
  CHECK_THAT(error_of([&] { MultiheadAttention bad(MultiheadAttentionOptions(6, 4)); }),
             Catch::Contains("embed_dim (6) must be positive and divisible by num_heads (4)"));
  CHECK_THAT(error_of([&] { MultiheadAttention bad(MultiheadAttentionOptions(8, 2).dropout(1.5)); }),
             Catch::Contains("dropout must be in [0, 1], got 1.5"));
  CHECK_THAT(error_of([&] {
               mha(kiln::zeros({3, 2, 2, 8}));
             }),
             Catch::Contains("must all be 3-D ([L, N, E]) or all 2-D"));
  CHECK_THAT(error_of([&] {
               mha(x, kiln::zeros({5, 2, 6}), kiln::zeros({5, 2, 6}));
             }),
             Catch::Contains("a kdim or vdim of its own is not supported"));
  CHECK_THAT(error_of([&] {
               mha(x, kiln::zeros({5, 2, 8}), kiln::zeros({4, 2, 8}));
             }),
             Catch::Contains("key and value must hold the same keys"));
  CHECK_THAT(
      error_of([&] {
        mha(x, x, x, MultiheadAttentionArgs().attn_mask(kiln::zeros({3, 4})));
      }),
      Catch::Contains("attn_mask must be [L, S] = [3, 3] or [N * num_heads, L, S] = [4, 3, 3], got sizes [3, 4]"));
  CHECK_THAT(error_of([&] {
               mha(x, x, x, MultiheadAttentionArgs().key_padding_mask(kiln::zeros({3, 2})));
             }),
             Catch::Contains("key_padding_mask must be [N, S] = [2, 3], got sizes [3, 2]"));
  CHECK_THAT(error_of([&] { mha(x, Tensor(), x); }), Catch::Contains("query, key and value must be defined"));
  CHECK_THAT(error_of([&] {
               mha(x, x, x, MultiheadAttentionArgs().attn_mask(kiln::zeros({8, 3, 3})));
             }),
             Catch::Contains("got sizes [8, 3, 3]"));
  CHECK_THAT(
      error_of([&] {
        mha(x, x, x, MultiheadAttentionArgs().attn_mask(kiln::zeros({3, 3}, kiln::TensorOptions().dtype(DType::I64))));
      }),
      Catch::Contains("attn_mask must be bool (true: not attended to) or floating"));
}
