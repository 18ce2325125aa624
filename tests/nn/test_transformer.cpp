// The Transformer family (encoder and decoder layers and stacks, nn::Transformer): outputs and
// gradients against PyTorch's (the values pasted below; inputs in transformer_test_util.h),
// dropout, f64 gradchecks, initialisation, parameter names, errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "tests/nn/transformer_test_util.h"

using namespace kiln_test;
using namespace kiln_test::transformer;

namespace {

// [3, 2, 4]
const std::vector<double> k_layer_post_relu_out = {
    0.4973201936068624,  0.09868425255047288,   0.2995884072504865,    1.1720064540014492, 0.45642183583226864,
    0.11289759461893413, 0.31899862669654444,   1.1875670760444577,    0.2348993698896359, 0.22595198264762228,
    0.44659431482326534, 1.2057021438247708,    0.0007317052138066052, 0.4184035100471974, 0.713080920130965,
    0.9987533872938307,  -0.029770878257140726, 0.48313489796421966,   0.7310046810287077, 0.9435141438155581,
    0.06785079973424384, 0.31997257856114103,   0.661505817085588,     1.0819675692054742};
// [3, 2, 4]
const std::vector<double> k_layer_post_relu_grad_src = {
    0.15469951093055823,   -0.16692561595680838,  -0.14138527232322437,  0.09712801837523623,  0.21374801344118527,
    -0.12200993063422005,  -0.10637604251499691,  0.138340933645806,     0.38532384925435764,  -0.22406609181382553,
    -0.3147930642204547,   0.0646583697983314,    -0.00830312339300815,  -0.04680727977676839, 0.017164752542734574,
    0.08731588474017124,   0.058317022331572904,  -0.068851512331838,    0.06305643838599574,  -0.05334166709133659,
    0.0013922315169345241, -0.003120596648654384, 0.0007927531958117429, 0.0013729786672386514};
// [6, 4]
const std::vector<double> k_layer_post_relu_grad_linear1_weight = {0.033517442224223974,
                                                                   0.00508494366318754,
                                                                   -0.006521885371373019,
                                                                   -0.00687250115131246,
                                                                   0.05114749493327783,
                                                                   0.01564802259623204,
                                                                   -0.004965167334984134,
                                                                   -0.012467387745430908,
                                                                   0.06826649878007245,
                                                                   0.02605475166004363,
                                                                   -0.0033588389878501696,
                                                                   -0.01793770432236751,
                                                                   0.0030685155680175045,
                                                                   -0.0013268364285064726,
                                                                   -0.002051639800260612,
                                                                   -0.0010086211636602751,
                                                                   0.0,
                                                                   0.0,
                                                                   0.0,
                                                                   0.0,
                                                                   0.0,
                                                                   0.0,
                                                                   0.0,
                                                                   0.0};
// [3, 2, 4]
const std::vector<double> k_layer_pre_gelu_out = {
    0.6781520347253616,   0.7229324244969839,    0.798846011334586,   0.889726691873979,   1.1773622894399969,
    1.1103050184642889,   1.0720150525376004,    1.0472034287285417,  1.1879095440795033,  0.9810065525150675,
    0.809813302590364,    0.6631778955246066,    0.7017364597214821,  0.3982045062577366,  0.15065867964171198,
    -0.04910597324901311, -0.046682938189058776, -0.347346950086427,  -0.5641743430823043, -0.7067641838771779,
    -0.6152304058328233,  -0.8185522994741112,   -0.9220989192677265, -0.9392569951894869};
// [3, 2, 4]
const std::vector<double> k_layer_pre_gelu_grad_src = {
    -0.4796101399158864,  0.8878285995888852,  1.367113294940226,    1.0500488952813,     0.6687539920124326,
    1.9054913744772652,   1.5623637659370833,  -0.3075180680247731,  0.8797818448723901,  1.0741791376250005,
    1.0489048557828302,   0.8176708446659728,  0.774203109020356,    0.8063798819466947,  0.714517731781412,
    0.5068782330950086,   0.44099136078081674, 0.3295481563682695,   0.20361898232951942, 0.06852697544343926,
    -0.05218840761178633, -0.1930489294706475, -0.31789929639801934, -0.4291174153457188};
// [6, 4]
const std::vector<double> k_layer_pre_gelu_grad_linear1_weight = {
    -3.4513137063931683, -3.4807995523472446, -2.10856177348731,   0.7018681151934784,   -3.80931026417836,
    -3.82679032539487,   -2.312882251182746,  0.7705308724703953,  -2.8374035145318754,  -2.830278635300132,
    -1.7033810739968696, 0.5690739737059443,  -0.2511256408318622, -0.24167596384406628, -0.14220168196270513,
    0.0485627935912928,  0.3802307650087621,  0.3759864031387605,  0.2251311355575326,   -0.07530482037891717,
    0.26543372607307764, 0.2604090274234183,  0.15518536997014165, -0.05202802084904219};
// [2, 3, 4]
const std::vector<double> k_encoder_out = {
    -1.0571827749416218,  -0.7728495155144297,  -0.09198397170267292, 0.14084875229810515, -0.9018063457367065,
    -0.9471472360224992,  -0.13449148239370856, 0.19669354092271893,  -0.5194518513534493, -1.181329552473105,
    -0.28951834807051274, 0.1794807717078391,   0.22085554690994594,  -0.7804322328668774, -0.9377185535544359,
    -0.40243418826028293, 0.219996907528704,    -0.7704445176715295,  -0.9457902829090383, -0.40379846315371465,
    0.21875292106361874,  -0.7585046906866943,  -0.9553220321030551,  -0.40530859572083106};
// [2, 3, 4]
const std::vector<double> k_encoder_grad_src = {
    -0.043536690793168985, 0.06683769472286005,    -0.018475432541284528, -0.007767116961633748, -0.10050213726594658,
    0.14704947976733054,   -0.0021749760486786075, -0.01482300933976444,  -0.4043974246777319,   0.3811383492097144,
    0.09125472881543502,   -0.04280358237937915,   0.00854897439436324,   -0.012171135506164832, 0.003980336892092749,
    0.0015840647179667633, 0.005220850677924514,   -0.007420686132503521, 0.0022334544127540932, 0.0006097790067896181,
    0.004228479485143792,  -0.005922976140097707,  0.0016869026622594885, 0.0002245323569718665};

// TransformerDecoderLayer: tgt [3, 2, 4], memory [5, 2, 4], a causal tgt_mask, a memory key padding mask.
// [3, 2, 4]
const std::vector<double> k_dec_post_relu_out = {
    -0.6169636403296412, -0.7134095079133795,  -0.2656873576904723, 0.5435435590075942,  -0.5988025792872084,
    -0.7235174771121752, -0.27328746287727423, 0.5438192410025611,  -0.469046857515497,  -0.7637849176807316,
    -0.3568463959496942, 0.5443309308101166,   0.2735489809138459,  -0.7204792594665302, -0.6986651203517525,
    0.16616485532672748, 0.48902619958601673,  -0.5064329390775332, -0.703481506092521,  -0.21831886885635834,
    0.5068760177840417,  -0.45962863004261284, -0.6812579983720864, -0.29839048798969253};
// [3, 2, 4]
const std::vector<double> k_dec_post_relu_grad_tgt = {
    -0.04943858215498603, 0.02234988465902288,  0.02674079333608198, -0.04721904125978062, -0.26321802195776534,
    -0.26191926318431624, -0.26923738484349136, -0.2911747985723088, 0.17734631480954466,  -0.10684279800198127,
    -0.1513739132354613,  0.026294621446631604, 0.12615834288340463, 0.4652900015141658,   -0.09956500834255053,
    -1.1135912141266577,  -0.13538479788912447, 0.08678973142653124, 0.1099034556522436,   -0.11547637508745719,
    -0.05356706520862033, 0.032316917638082594, 0.04674900522790394, -0.03433119459381485};
// [5, 2, 4]
const std::vector<double> k_dec_post_relu_grad_memory = {-0.009274694324426298,
                                                         -0.01038730969011012,
                                                         -0.01139613849095844,
                                                         -0.012291100843067643,
                                                         -0.007010505776474311,
                                                         -0.008132857518946667,
                                                         -0.00917394843745498,
                                                         -0.010123376295680414,
                                                         9.504147659274284e-05,
                                                         -0.0007932153455876257,
                                                         -0.001673546622237016,
                                                         -0.002537156374237978,
                                                         0.0005070255438922942,
                                                         -0.00030268729348210716,
                                                         -0.0011093757794751514,
                                                         -0.001904979749390558,
                                                         -0.00021965738409697694,
                                                         -0.001089426103657392,
                                                         -0.0019483096377064556,
                                                         -0.0027877263058810973,
                                                         -0.00760366649094708,
                                                         -0.008682815421710535,
                                                         -0.009675208530937441,
                                                         -0.010570930154721946,
                                                         0.0,
                                                         0.0,
                                                         0.0,
                                                         0.0,
                                                         -0.005367746717002789,
                                                         -0.006477330873126468,
                                                         -0.007522195680286786,
                                                         -0.008491901194716982,
                                                         0.0,
                                                         0.0,
                                                         0.0,
                                                         0.0,
                                                         0.00044175261028087326,
                                                         -0.000370712915943112,
                                                         -0.0011794744012523924,
                                                         -0.00197645096822676};
// [3, 2, 4]
const std::vector<double> k_dec_pre_gelu_out = {
    3.3041762040114904, 3.7178767247379527, 3.510970349995376,  2.7419923013704803, 4.098402814352259,
    4.419328222726598,  4.054965443890255,  3.0741874741878887, 3.8604877560833586, 4.037814194755747,
    3.5736508444755186, 2.536227705997207,  3.6465377479356933, 3.737484904791017,  3.1619347738988255,
    1.9966920449923329, 2.634190274998008,  2.719740236217688,  2.2093454188515866, 1.1730124689492223,
    2.334914566324721,  2.5258565547416882, 2.093877822354219,  1.110609590640581};
// [3, 2, 4]
const std::vector<double> k_dec_pre_gelu_grad_tgt = {
    0.17944805217509296,  0.6034960375320543,  0.9042157631463337,  1.1382207970410474,  0.8923355285355268,
    0.8798191273871372,   0.9448284982945143,  1.1121079101848224,  1.1626895203866194,  0.8704492490856109,
    0.8098316229170069,   0.9775662905569569,  0.8909689707915435,  0.7116447834057384,  0.6105312564399588,
    0.5888339452062308,   0.47285574863511504, 0.3050241000172726,  0.17656745050661315, 0.08823817576304424,
    -0.08406674238515488, -0.168251449917192,  -0.2902131725024283, -0.4497226840213971};
// [5, 2, 4]
const std::vector<double> k_dec_pre_gelu_grad_memory = {-0.004122427674143725,
                                                        -0.2707067205700056,
                                                        -0.5345862013976772,
                                                        -0.7931242736116872,
                                                        -0.0512854205896872,
                                                        -0.15436098781749577,
                                                        -0.25589423107999076,
                                                        -0.3548706637729211,
                                                        -0.9324126814023256,
                                                        -1.0787605932559274,
                                                        -1.2143298858525586,
                                                        -1.337765995633843,
                                                        -0.5911438537912831,
                                                        -0.6476563270436876,
                                                        -0.69769763236299,
                                                        -0.7407677735678956,
                                                        -0.9090447494427181,
                                                        -1.065501772449021,
                                                        -1.2113126539530725,
                                                        -1.3450204998255528,
                                                        -0.06235986564515515,
                                                        -0.17023505039408038,
                                                        -0.2764093027916943,
                                                        -0.3798217648045813,
                                                        0.0,
                                                        0.0,
                                                        0.0,
                                                        0.0,
                                                        -0.0864598857818856,
                                                        -0.18255026551769654,
                                                        -0.2768166633435499,
                                                        -0.36831720057269757,
                                                        0.0,
                                                        0.0,
                                                        0.0,
                                                        0.0,
                                                        -0.5787881005883906,
                                                        -0.6363653600974255,
                                                        -0.6875842672827879,
                                                        -0.7319330597546008};
// nn::Transformer(4, 2, 2, 1, 6, batch_first): src [2, 5, 4], tgt [2, 3, 4].
// [2, 3, 4]
const std::vector<double> k_transformer_out = {
    -0.4476270411283719,  0.17387923123374077, 0.3202275357357183,   0.26030833950974996, 0.4739881130079463,
    0.1688222603518671,   -0.0668329939470127, 0.06548729949827892,  0.43169340115798965, 0.2313108773054392,
    -0.07517646038829577, 0.05529531220351422, -0.44599955128759733, 0.16492018295018995, 0.3232709400404092,
    0.2627349967470347,   -0.4423555287709609, 0.14832046176686756,  0.32888713113374374, 0.26691068938682,
    -0.4469476944668279,  0.2939331075445597,  0.26890592020219306,  0.22380056125607928};
// [2, 5, 4]
const std::vector<double> k_transformer_grad_src = {-1.1699421290499103e-05,
                                                    -9.924831999257708e-05,
                                                    9.659652336098744e-06,
                                                    -7.386570872835102e-05,
                                                    -3.836382975275996e-05,
                                                    -0.0003933371123383769,
                                                    -7.987519173098667e-05,
                                                    -0.00017118618584710687,
                                                    0.002044798346365057,
                                                    -0.001366992965672343,
                                                    -0.0009447431012796598,
                                                    -0.00021964241629615234,
                                                    -4.021407216890196e-05,
                                                    0.00015301722167276264,
                                                    -5.143421900224225e-05,
                                                    -6.0467246326509255e-05,
                                                    0.0,
                                                    0.0,
                                                    0.0,
                                                    0.0,
                                                    4.179476989292086e-05,
                                                    -6.740287472446776e-05,
                                                    1.3950170004581857e-05,
                                                    -1.270927411315864e-07,
                                                    0.00014010509765751474,
                                                    -0.00019241126523016931,
                                                    4.333731367459546e-05,
                                                    -2.906977701710848e-05,
                                                    0.00012108647461754656,
                                                    -8.019832611456529e-05,
                                                    -0.00012713334840733543,
                                                    0.00012125696102069174,
                                                    -4.866137973214965e-05,
                                                    0.0001569036239047202,
                                                    -0.00014456829425471847,
                                                    5.437008256328908e-05,
                                                    -0.0011236170663765951,
                                                    0.001433171759177258,
                                                    -0.00018639124335612944,
                                                    -9.738104910879611e-05};
// [2, 3, 4]
const std::vector<double> k_transformer_grad_tgt = {
    -0.02877802568809303, 0.07496004987564717,   -0.028169563721113434, -0.031088514832835694, -0.039991321080083964,
    0.029359301518424405, 0.02998487776224332,   -0.019509346151074615, 0.028762792700618985,  -0.06398677226765116,
    0.055631891927873746, -0.017473974975850976, -0.05357428461105887,  0.0717063038541767,    -0.03884244775856895,
    -0.04086176498227438, -0.022042005613642033, 0.036588414314246996,  -0.00998326190865207,  -0.012784391238859983,
    0.27556944440679904,  0.5990144834935296,    -0.5944260072552201,   -0.28337316594134965};

// bias=False: an encoder layer (pre-norm, GELU) and a decoder layer (post-norm, ReLU), causal tgt mask.
// [3, 2, 4]
const std::vector<double> k_nobias_enc_out = {
    0.46367863841514245,  0.6491280461318665,  0.8032252175676329,   0.9185703283035417,  0.968983877550599,
    1.0456336002772666,   1.078872167937983,   1.0647869757917325,   0.9601349705933615,  0.8754783128910605,
    0.7535463208107365,   0.6016935941114208,  0.45672215798097565,  0.2734767416760198,  0.07603294346984235,
    -0.12524320580444404, -0.3018251348494111, -0.48772966033453097, -0.6575692781514834, -0.8017701835585426,
    -0.8826845653889369,  -0.9725854268175008, -1.0281086160465882,  -1.0434245487475085};
// [3, 2, 4]
const std::vector<double> k_nobias_enc_grad_src = {
    0.6936739761448294,   0.5208350951235172,   0.6210714491559093, 0.9898001294702741,  1.0962236053936312,
    -1.6620323817049827,  -0.4072750039303876,  4.8021748446436785, 1.0069179884838118,  0.9720445238272946,
    0.9378911705090991,   0.9036830001259896,   0.8466039075586921, 0.7374408255621783,  0.6456079875211593,
    0.5723262352014415,   0.45554954627786465,  0.314174930557561,  0.18948601589739816, 0.08347498218922107,
    -0.08524199657438448, -0.12907090571143534, -0.270793806597339, -0.5071473399430136};
// [3, 2, 4]
const std::vector<double> k_nobias_dec_out = {
    0.008951268201437707, 0.2928393671551032,   0.12075529845853308,  -0.30129352717367547, -0.3317462371187787,
    0.2681407974911761,   0.2379793900604455,   -0.17707506068975642, -0.5222921412002783,  0.025352563128098374,
    0.2109917808855861,   0.12233214881092962,  -0.5245287516382942,  0.03571665535073429,  0.21381411826929675,
    0.11434912170245146,  -0.42701453168872955, -0.12317828104350982, 0.11206477331089877,  0.24635356664664665,
    0.42297975480564953,  -0.22311160350075684, -0.2563798074724006,  0.10727632384970132};
// [5, 2, 4]
const std::vector<double> k_nobias_dec_grad_memory = {
    -0.007911812734749848, -0.007435681921144919,  -0.0068852562316935656, -0.006266035337938243,
    -0.04247077729670999,  -0.03992444352438646,   -0.03697919790963366,   -0.03366446837306545,
    -0.007356234136253489, -0.006935226230988287,  -0.0064449238377040485, -0.005890225895842049,
    -0.04065026252584499,  -0.03827719609938704,   -0.03552167658226284,   -0.03241123621463381,
    -0.00735293496986212,  -0.006928500894882244,  -0.0064348395292186025, -0.005876883374054157,
    -0.04247448322823828,  -0.03991711783557897,   -0.036960913796351406,  -0.03363540852412443,
    -0.007911475174892497, -0.00743576550821525,   -0.006885760130517203,  -0.0062669545137247085,
    -0.04224992775848793,  -0.039724183580927885,  -0.036801528492096496,  -0.03351116469554002,
    -0.007305492688925767, -0.0068900850215416224, -0.006405833902181531,  -0.005857577807958006,
    -0.04066989789620476,  -0.03829337292416419,   -0.03553423322797152,   -0.03242004721942079};
// [6, 4]
const std::vector<double> k_nobias_dec_grad_linear1_weight = {
    -0.006639534981220618, 0.011604850562733436,   0.009334539250839366,   -0.013628470275735449,
    0.003874334575195047,  0.007306570653535555,   0.0018704024408069482,  -0.01200028245726471,
    0.014349493061220015,  0.0029352859055987134,  -0.00561242281214111,   -0.01025219178324696,
    0.024681276155889054,  -0.0014653272488303472, -0.013039170591570583,  -0.008401664597855052,
    0.004459091471454659,  -0.0038074469951545706, -0.004194059778863484,  0.003500189232256112,
    0.0004084231157351244, -0.0031534909910264962, -0.0017764292439179565, 0.004233185783334913};

// A layer's options and its PyTorch references: the output and the gradients of two inputs or parameters.
template <class Options> struct LayerCase {
  const char* name;
  Options options;
  const std::vector<double>& out;
  const std::vector<double>& grad_a;
  const std::vector<double>& grad_b;
};

// The reference script's layer: set_params_to_sequence, then linear1's bias sin(0.9 i + 0.3) (about
// half the ReLU inputs > 0); in eval mode.
template <class Layer> void set_reference_params(Layer& layer) {
  set_params_to_sequence(layer);
  {
    kiln::NoGradGuard ng;
    layer.linear1.bias.copy_(sin_seq(6, 0.9, 0.3));
  }
  layer.eval();
}

}  // namespace

TEST_CASE("TransformerEncoderLayer: post-norm ReLU and pre-norm GELU match PyTorch, with gradients", "[transformer]") {
  // the gradients of src and linear1.weight
  const LayerCase<TransformerEncoderLayerOptions> cases[] = {
      {"post-norm, relu", TransformerEncoderLayerOptions(4, 2).dim_feedforward(6), k_layer_post_relu_out,
       k_layer_post_relu_grad_src, k_layer_post_relu_grad_linear1_weight},
      {"pre-norm, gelu", TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).norm_first(true).activation("gelu"),
       k_layer_pre_gelu_out, k_layer_pre_gelu_grad_src, k_layer_pre_gelu_grad_linear1_weight},
  };
  for (const auto& c : cases) {
    INFO(c.name);
    TransformerEncoderLayer layer(c.options);
    set_reference_params(layer);
    Tensor src = sin_seq(24, 0.19, 0.4).view({3, 2, 4}).requires_grad_();
    Tensor out = layer(src, encoder_src_mask(), encoder_key_padding_mask());
    check_close(out, c.out, 0, 1e-13, "output");
    weighted_sum(out, 0.13, 0.6).backward();
    check_close(src.grad(), c.grad_a, 0, 1e-13, "src gradient");
    check_close(layer.linear1.weight.grad(), c.grad_b, 0, 1e-13, "linear1.weight gradient");
  }
}

TEST_CASE("TransformerEncoder: two layers, a final norm and a causal mask match PyTorch", "[transformer]") {
  TransformerEncoder encoder(
      TransformerEncoderOptions(TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).batch_first(true), 2)
          .final_norm(true));
  const std::vector<std::string> names = parameter_names(encoder);
  REQUIRE(names.size() == 26);
  CHECK(names[0] == "layers.0.self_attn.in_proj_weight");
  CHECK(names[4] == "layers.0.linear1.weight");
  CHECK(names[11] == "layers.0.norm2.bias");
  CHECK(names[12] == "layers.1.self_attn.in_proj_weight");
  CHECK(names[24] == "norm.weight");
  set_params_to_sequence(encoder);
  encoder.eval();
  Tensor src = sin_seq(24, 0.19, 0.4).view({2, 3, 4}).requires_grad_();
  Tensor causal = kiln::zeros({3, 3}, f64()).masked_fill(kiln::ones({3, 3}, f64()).triu(1) > 0.5, -INFINITY);
  Tensor out = encoder(src, causal, Tensor(), /*is_causal=*/true);
  check_close(out, k_encoder_out, 0, 1e-13, "output");
  out.sum().backward();
  check_close(src.grad(), k_encoder_grad_src, 0, 1e-12, "src gradient");
  // is_causal without the mask builds the same one; forward(src) runs without masks.
  check_same_tensor(encoder(src, Tensor(), Tensor(), true), out, 1e-14, "is_causal alone");
  CHECK_FALSE(kiln::allclose(encoder(src), out));
}

TEST_CASE("TransformerEncoderLayer: dropout in training, gradcheck, errors", "[transformer]") {
  kiln::manual_seed(10);
  TransformerEncoderLayer layer(TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(0.3));
  layer.to(DType::F64);
  Tensor src = kiln::randn({3, 2, 4}, f64());
  kiln::manual_seed(11);
  Tensor t1 = layer(src);
  kiln::manual_seed(11);
  CHECK(kiln::equal(layer(src), t1));  // the masks follow the seed
  layer.eval();
  Tensor e = layer(src);
  CHECK_FALSE(kiln::allclose(t1, e));
  TransformerEncoderLayer no_dropout(TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(0.0));
  no_dropout.load_state_dict(layer.state_dict());
  no_dropout.to(DType::F64);
  check_same_tensor(no_dropout(src), e, 1e-14, "eval is the layer without dropout");
  // p = 1 drops every branch: post-norm leaves norm2(norm1(x)), pre-norm leaves x.
  for (bool norm_first : {false, true}) {
    INFO("norm_first " << norm_first);
    TransformerEncoderLayer all(
        TransformerEncoderLayerOptions(4, 2).dim_feedforward(8).dropout(1.0).norm_first(norm_first));
    all.to(DType::F64);
    Tensor want = norm_first ? src : all.norm2(all.norm1(src));
    check_same_tensor(all(src), want, 1e-14, "every dropout at p = 1");
    all.dropout2.eval();  // each Dropout has its own mode, as in torch
    CHECK_FALSE(kiln::allclose(all(src), want));
  }
  for (bool norm_first : {false, true}) {
    TransformerEncoderLayer l(
        TransformerEncoderLayerOptions(4, 2).dim_feedforward(5).dropout(0.0).norm_first(norm_first).activation("gelu"));
    l.to(DType::F64);
    Tensor padding = bool_tensor({false, true, false, false}, {2, 2});
    CHECK(kiln::gradcheck([&](const TL& in) { return l(in[0], Tensor(), padding); },
                          {kiln::randn({2, 2, 4}, f64(true))}));
  }
  CHECK_THAT(error_of([&] { TransformerEncoderLayer bad(TransformerEncoderLayerOptions(4, 2).activation("tanh")); }),
             Catch::Contains("activation must be \"relu\" or \"gelu\", got \"tanh\""));
  CHECK_THAT(
      error_of([&] { TransformerEncoder bad(TransformerEncoderOptions(TransformerEncoderLayerOptions(4, 2), -1)); }),
      Catch::Contains("num_layers must be >= 0"));
  CHECK_THAT(error_of([&] { layer(kiln::zeros({3, 2, 5}, f64())); }), Catch::Contains("embed_dim = 4 features"));
}

TEST_CASE("TransformerDecoderLayer: post-norm ReLU and pre-norm GELU match PyTorch, with gradients", "[transformer]") {
  // the gradients of tgt and memory
  const LayerCase<TransformerDecoderLayerOptions> cases[] = {
      {"post-norm, relu", TransformerDecoderLayerOptions(4, 2).dim_feedforward(6), k_dec_post_relu_out,
       k_dec_post_relu_grad_tgt, k_dec_post_relu_grad_memory},
      {"pre-norm, gelu", TransformerDecoderLayerOptions(4, 2).dim_feedforward(6).norm_first(true).activation("gelu"),
       k_dec_pre_gelu_out, k_dec_pre_gelu_grad_tgt, k_dec_pre_gelu_grad_memory},
  };
  Tensor memory_padding = bool_tensor({false, false, false, true, true, false, false, false, false, false}, {2, 5});
  for (const auto& c : cases) {
    INFO(c.name);
    TransformerDecoderLayer layer(c.options);
    const std::vector<std::string> names = parameter_names(layer);
    REQUIRE(names.size() == 18);
    CHECK(names[4] == "multihead_attn.in_proj_weight");
    CHECK(names[17] == "norm3.bias");
    set_reference_params(layer);
    Tensor tgt = sin_seq(24, 0.19, 0.4).view({3, 2, 4}).requires_grad_();
    Tensor memory = sin_seq(40, 0.27, 1.1).view({5, 2, 4}).requires_grad_();
    Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
    Tensor out = layer(tgt, memory, causal, Tensor(), Tensor(), memory_padding, /*tgt_is_causal=*/true);
    check_close(out, c.out, 0, 1e-13, "output");
    weighted_sum(out, 0.13, 0.6).backward();
    check_close(tgt.grad(), c.grad_a, 0, 1e-13, "tgt gradient");
    check_close(memory.grad(), c.grad_b, 0, 1e-13, "memory gradient");
  }
}

TEST_CASE("Transformer: encoder and decoder with masks match PyTorch", "[transformer]") {
  Transformer model(TransformerOptions()
                        .d_model(4)
                        .nhead(2)
                        .num_encoder_layers(2)
                        .num_decoder_layers(1)
                        .dim_feedforward(6)
                        .batch_first(true));
  const std::vector<std::string> names = parameter_names(model);
  REQUIRE(names.size() == 46);  // torch's count and order
  CHECK(names[24] == "encoder.norm.weight");
  CHECK(names[26] == "decoder.layers.0.self_attn.in_proj_weight");
  CHECK(names[45] == "decoder.norm.bias");
  set_params_to_sequence(model);
  model.eval();
  Tensor src = sin_seq(40, 0.21, 0.3).view({2, 5, 4}).requires_grad_();
  Tensor tgt = sin_seq(24, 0.33, 0.8).view({2, 3, 4}).requires_grad_();
  Tensor padding = bool_tensor({false, false, false, false, true, false, false, false, false, false}, {2, 5});
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  Tensor out = model(src, tgt, Tensor(), causal, Tensor(), padding, Tensor(), padding, false, /*tgt_is_causal=*/true);
  check_close(out, k_transformer_out, 0, 1e-13, "output");
  out.sum().backward();
  check_close(src.grad(), k_transformer_grad_src, 0, 1e-12, "src gradient");
  check_close(tgt.grad(), k_transformer_grad_tgt, 0, 1e-12, "tgt gradient");
}

TEST_CASE("Transformer: initialisation, the subsequent mask, gradcheck, errors", "[transformer]") {
  kiln::manual_seed(14);
  Transformer model(
      TransformerOptions().d_model(8).nhead(2).num_encoder_layers(1).num_decoder_layers(1).dim_feedforward(16));
  // Every matrix xavier_uniform_ (torch's _reset_parameters); the LayerNorms keep 1 and 0.
  for (auto& [name, p] : model.named_parameters()) {
    INFO(name);
    if (p.dim() > 1) {
      const double bound = std::sqrt(6.0 / static_cast<double>(p.size(0) + p.size(1)));
      CHECK(p.abs().max().item() <= bound);
      CHECK(p.abs().max().item() > 0.7 * bound);
    }
  }
  CHECK(model.encoder.norm != nullptr);
  CHECK(model.decoder.norm != nullptr);
  Tensor m = Transformer::generate_square_subsequent_mask(3);
  CHECK(m.dtype() == DType::F32);
  CHECK(values(m) == std::vector<double>{0, -INFINITY, -INFINITY, 0, 0, -INFINITY, 0, 0, 0});
  CHECK_THAT(error_of([&] { Transformer::generate_square_subsequent_mask(-1); }), Catch::Contains("size must be >= 0"));

  TransformerDecoder decoder(
      TransformerDecoderOptions(TransformerDecoderLayerOptions(4, 2).dim_feedforward(5).dropout(0.0).activation("gelu"),
                                2)
          .final_norm(true));
  decoder.to(DType::F64);
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  CHECK(kiln::gradcheck([&](const TL& in) { return decoder(in[0], in[1], causal); },
                        {kiln::randn({3, 2, 4}, f64(true)), kiln::randn({4, 2, 4}, f64(true))}));
  // An unbatched pair is a batch of one.
  Tensor tgt = kiln::randn({3, 2, 4}, f64()), memory = kiln::randn({4, 2, 4}, f64());
  check_same_tensor(decoder(tgt.select(1, 1), memory.select(1, 1), causal), decoder(tgt, memory, causal).select(1, 1),
                    1e-14, "unbatched");

  Tensor src = kiln::zeros({5, 2, 8}), bad_tgt = kiln::zeros({3, 4, 8});
  CHECK_THAT(error_of([&] { model(src, bad_tgt); }), Catch::Contains("the batch number of src and tgt must be equal"));
  CHECK_THAT(error_of([&] {
               model(src, kiln::zeros({3, 2, 6}));
             }),
             Catch::Contains("the feature number of src and tgt must be equal to d_model (8)"));
  CHECK_THAT(error_of([&] { model(src, kiln::zeros({3, 8})); }), Catch::Contains("must both be 3-D"));
  CHECK_THAT(error_of([&] { model(src); }), Catch::Contains("no single-input forward"));
  CHECK_THAT(error_of([&] { decoder(tgt, Tensor()); }), Catch::Contains("memory (the encoder's output) is undefined"));
  CHECK_THAT(error_of([&] { TransformerDecoderLayer bad(TransformerDecoderLayerOptions(4, 2).activation("silu")); }),
             Catch::Contains("activation must be \"relu\" or \"gelu\""));
}

TEST_CASE("Transformer layers with bias=false match PyTorch", "[transformer]") {
  TransformerEncoderLayer enc(
      TransformerEncoderLayerOptions(4, 2).dim_feedforward(6).bias(false).norm_first(true).activation("gelu"));
  const std::vector<std::string> names = parameter_names(enc);
  CHECK(names == std::vector<std::string>{"self_attn.in_proj_weight", "self_attn.out_proj.weight", "linear1.weight",
                                          "linear2.weight", "norm1.weight", "norm2.weight"});
  set_params_to_sequence(enc);
  enc.eval();
  Tensor causal = Transformer::generate_square_subsequent_mask(3, f64());
  Tensor src = sin_seq(24, 0.19, 0.4).view({3, 2, 4}).requires_grad_();
  Tensor out = enc(src, causal, Tensor(), true);
  check_close(out, k_nobias_enc_out, 0, 1e-13, "encoder layer output");
  weighted_sum(out, 0.13, 0.6).backward();
  check_close(src.grad(), k_nobias_enc_grad_src, 0, 1e-13, "encoder layer src gradient");

  TransformerDecoderLayer dec(TransformerDecoderLayerOptions(4, 2).dim_feedforward(6).bias(false));
  CHECK(dec.parameters().size() == 9);
  set_params_to_sequence(dec);
  dec.eval();
  Tensor tgt = sin_seq(24, 0.19, 0.4).view({3, 2, 4});
  Tensor memory = sin_seq(40, 0.27, 1.1).view({5, 2, 4}).requires_grad_();
  Tensor y = dec(tgt, memory, causal, Tensor(), Tensor(), Tensor(), true);
  check_close(y, k_nobias_dec_out, 0, 1e-13, "decoder layer output");
  weighted_sum(y, 0.13, 0.6).backward();
  check_close(memory.grad(), k_nobias_dec_grad_memory, 0, 1e-13, "decoder layer memory gradient");
  check_close(dec.linear1.weight.grad(), k_nobias_dec_grad_linear1_weight, 0, 1e-13, "linear1.weight gradient");

  // nn::LayerNorm(bias=false), as torch's: a weight only, the same as an undefined bias.
  nn::LayerNorm ln(nn::LayerNormOptions({4}).bias(false));
  CHECK(ln.parameters().size() == 1);
  CHECK_FALSE(ln.bias.defined());
  Tensor x = kiln::randn({3, 4});
  CHECK(kiln::equal(ln(x), F::layer_norm(x, {4}, ln.weight, Tensor())));
}
