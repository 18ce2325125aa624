// F::pad, F::interpolate (every mode) and nn::Upsample: forward values and input gradients against PyTorch's
// (computed with torch 2.x in float64 and pasted below), f64 gradchecks, non-contiguous and
// channels-last inputs, the error messages.
#include <catch2/catch.hpp>

#include <cmath>
#include <string>
#include <vector>

#include <kiln/kiln.h>
#include "tests/test_util.h"

using namespace kiln_test;

namespace {

namespace F = kiln::nn::functional;
using kiln::nn::functional::InterpolateOptions;
using O = InterpolateOptions;

// The inputs the PyTorch references were computed from.
Tensor seq(int64_t n, double a = 0.37, double b = 0.1) { return sin_seq(n, a, b); }

// seq(24) as PyTorch computes it (float64): the values of image() and, its first 18, of the pad tests' input.
const std::vector<double> k_seq = {0.09983341664682815, 0.4528862853790683,   0.7446431199708593,  0.9356160015533859,
                                   0.9999576464987401,  0.9289597150038692,   0.7322314440302514,  0.4363990821601263,
                                   0.08150215176026912, -0.28442571253646254, -0.6118578909427193, -0.8564779741650012,
                                   -0.9851777815038593, -0.980538397794069,   -0.8431877418564172, -0.59171558063101,
                                   -0.2601574914304689, 0.10661169378122266,  0.4589514863776903,  0.7491743483316894,
                                   0.9379999767747389,  0.999871708718139,    0.9264154954967662,  0.7275732909714597};

// Nearest-neighbour resampling and every pad mode only pick input values: their PyTorch outputs
// are k_seq read as `planes` planes of [H, W], element [p, i, j] of the output being plane p's
// (rows[i], cols[j]), or `fill` where rows[i] or cols[j] is -1 (a padded element).
std::vector<double> pick(int64_t planes, int64_t H, int64_t W, const std::vector<int64_t>& rows,
                         const std::vector<int64_t>& cols, double fill = 0) {
  std::vector<double> out;
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i : rows)
      for (int64_t j : cols) out.push_back(i < 0 || j < 0 ? fill : k_seq.at((p * H + i) * W + j));
  return out;
}

// Reference values (PyTorch, float64), row-major; the comment gives the sizes.
// [2, 1, 5, 7]
const std::vector<double> k_bilinear_5x7_ac = {
    0.09983341664682815,  0.27635985101294824,  0.4528862853790683,   0.5987647026749638,  0.7446431199708593,
    0.8401295607621226,   0.9356160015533859,   0.5498955315727841,   0.6204092658821264,  0.6909230001914688,
    0.7146801410960121,   0.7384372820005554,   0.7122224119286558,   0.686007541856756,   0.9999576464987401,
    0.9644586807513047,   0.9289597150038692,   0.8305955795170603,   0.7322314440302514,  0.5843152630951889,
    0.4363990821601263,   0.5407298991295046,   0.43149845018160404,  0.32226700123370333, 0.19122688888873474,
    0.060186776543766085, -0.07492633472933566, -0.21003944600243743, 0.08150215176026912, -0.10146178038809671,
    -0.28442571253646254, -0.4481418017395909,  -0.6118578909427193,  -0.7341679325538601, -0.8564779741650012,
    -0.9851777815038593,  -0.9828580896489642,  -0.980538397794069,   -0.9118630698252431, -0.8431877418564172,
    -0.7174516612437136,  -0.59171558063101,    -0.622667636467164,   -0.5298154942367936, -0.43696335200642317,
    -0.3145407398728933,  -0.19211812773936346, -0.05669437194451191, 0.07872938385033967, -0.2601574914304689,
    -0.07677289882462313, 0.10661169378122266,  0.28278159007945647,  0.4589514863776903,  0.6040629173546899,
    0.7491743483316894,   0.33892124267213497,  0.4460814719609079,   0.5532417012496809,  0.6229625960934545,
    0.6926834909372283,   0.7155286552944015,   0.7383738196515746,   0.9379999767747389,  0.968935842746439,
    0.999871708718139,    0.9631436021074526,   0.9264154954967662,   0.826994393234113,   0.7275732909714597};
// [2, 1, 5, 7]
const std::vector<double> k_bilinear_5x7 = {
    0.09983341664682815,  0.22592372690834245,  0.42766822332676535,  0.5987647026749638,   0.7582840400838968,
    0.8674114009881978,   0.9356160015533859,   0.4598831085875929,   0.525394733102377,    0.6302133323260318,
    0.6914970534118023,   0.7394106484661495,   0.7372682394384158,   0.735929233796082,    0.9999576464987401,
    0.974601242393429,    0.9340309958249314,   0.8305955795170603,   0.7111005610395282,   0.5420534971137424,
    0.4363990821601263,   0.44888434965565766,  0.3603286742356621,   0.21863959356366944,  0.06335315076306978,
    -0.09315822800220354, -0.24464679639158593, -0.33932715163495003, 0.08150215176026912,  -0.04918637120284931,
    -0.2582880079438388,  -0.44814180173959095, -0.6293307540300251,  -0.7691136587284719,  -0.8564779741650012,
    -0.9851777815038593,  -0.9835208587503628,  -0.9808697823447683,  -0.9118630698252431,  -0.8252254446260311,
    -0.6815270667829412,  -0.59171558063101,    -0.6951696654745032,  -0.6417799139350208,  -0.556356311471849,
    -0.4340052058633633,  -0.3032625904544283,  -0.15070690958766036, -0.05535960904593033, -0.2601574914304689,
    -0.12916849671200764, 0.08041389483753038,  0.28278159007945647,  0.47968169080297585,  0.6455233262052611,
    0.7491743483316894,   0.4587369894926556,   0.5243908156536259,   0.6294369375111782,   0.690998797296254,
    0.7392001648538797,   0.7373623488918316,   0.7362137139155516,   0.9379999767747389,   0.9600970238973818,
    0.9954522992936103,   0.9631436021074525,   0.9122124808878158,   0.798588364016212,    0.7275732909714597};
// [2, 1, 4, 6]
const std::vector<double> k_bilinear_sf15 = {
    0.09983341664682815,  0.2763598510129482,   0.5015124244777001,   0.6960169808722274,   0.8401295607621226,
    0.9356160015533859,   0.549895531572784,    0.6204092658821263,   0.6988420471596498,   0.7305182350323741,
    0.7122224119286558,   0.686007541856756,    0.8468817307089951,   0.7868052705614046,   0.6903101011561934,
    0.5446352641257106,   0.36456806382034757,  0.2209195727726052,   0.23457806755001434,  0.07619162980180359,
    -0.13313617358543214, -0.3369016361415323,  -0.5144207332790186,  -0.6409984647774799,  -0.9851777815038593,
    -0.982858089648964,   -0.9576466218044605,  -0.8660795178460259,  -0.7174516612437136,  -0.59171558063101,
    -0.622667636467164,   -0.5298154942367935,  -0.39615581462857996, -0.23292566511720678, -0.05669437194451193,
    0.07872938385033962,  -0.06046458006293445, 0.09751189143722037,  0.30238399487517975,  0.4899665226263982,
    0.6412181633345936,   0.7455741721049843,   0.7383070654072041,   0.7946510524845951,   0.8505800041866974,
    0.8489198626855423,   0.7898391472542091,   0.7311734671981648};
// [2, 1, 2, 3]
const std::vector<double> k_bilinear_down_2x3 = {0.3660378355557165,  0.6567224218854879,  0.7992665099185103,
                                                 0.2624167952621758,  -0.1284574564254281, -0.49035485126967876,
                                                 -0.7880607366379673, -0.6132019048490682, -0.30001973779159447,
                                                 0.6614766256001825,  0.7930530991004535,  0.7457362116290972};
// [1, 2, 8]
const std::vector<double> k_linear_8 = {
    0.09983341664682815, 0.2542940467171832,  0.4711210875410552,   0.6534691091609246,
    0.8043221454653989,  0.923680196454478,   0.9718081768351475,   0.9999576464987401,
    0.9289597150038692,  0.8428910964529114,  0.7137419214133686,   0.5288466952445404,
    0.32549379141017093, 0.10368320991026019, -0.12433227190664244, -0.28442571253646254};
// [2, 1, 3, 4]
const std::vector<double> k_bilinear_5x7_grad = {
    1.6333512751838024,  2.040381767236543,   2.145803180237645,   1.9025519216331515,  -0.35524168070634415,
    -0.973912854902636,  -1.5209099744945758, -1.7520355009385093, -1.0288170703850505, -0.3830209752507041,
    0.44241253863125685, 1.078982751418317,   1.903505920420646,   1.5798059471899164,  0.9137580608455285,
    0.20270798510689722, -1.7513822849476817, -1.9084560052001602, -1.74532748383923,   -1.3348226681245796,
    1.076917139239083,   1.6679180563759646,  2.0563612124847515,  2.068832782906445};
// [2, 1, 3, 4]
const std::vector<double> k_nearest_sf15_grad = {
    2.7638636465622586,   1.576822627253283,    3.2000575099766073,  1.4826302100747126,  0.4274391529037038,
    -0.09824859374510825, -0.7990388856252735,  -0.6656819850461189, -1.7187299524963209, -0.977530117665097,
    -1.9785232763288565,  -0.914060465507907,   -0.6643486745279317, 0.17229036256595903, 1.3159921254877616,
    1.0858794764674224,   1.9767405115655592,   0.9106183671457304,  1.4674364373747757,  0.49234159776988917,
    0.39471750463124333,  -0.11496725817687631, -0.829551233866028,  -0.6781350120941703};
// [2, 1, 5, 7]
const std::vector<double> k_bicubic_5x7 = {
    -0.025646160740780615, 0.12676690149412925, 0.369010984093901,    0.5911391473043779,    0.7750780579846283,
    0.9233703234884442,    1.0071251949309266,  0.49439915183437905,  0.5798181066023974,    0.7078085518411404,
    0.8005983259350764,    0.8416671950883884,  0.8424157416496765,   0.8348487507891507,    1.0070018108024854,
    0.9878639255727537,    0.9421091259333884,  0.8516738073647404,   0.7062179640158509,    0.5251036603750563,
    0.4070476388222471,    0.5306535233297871,  0.4257536299564172,   0.25118821407829095,   0.06634203627814717,
    -0.12279002376875442,  -0.3078994120543932, -0.4205046387745974,  0.03244563919922957,   -0.12009664588013212,
    -0.3626496740758118,   -0.5853884747190067, -0.7703095324648297,  -0.9198247181192475,   -1.0043767275279454,
    -1.0517908254598456,   -1.072222166081867,  -1.0885722886186175,  -1.0525999419751426,   -0.9486266767988735,
    -0.7976834003539763,   -0.6958599250434357, -0.806716156803187,   -0.7486615865609717,   -0.6442132287404303,
    -0.5099477961388701,   -0.3427383007852753, -0.15724215195004762, -0.039959406343135585, -0.2965470361366943,
    -0.15685142431229207,  0.06935155136510085, 0.28995780788486514,  0.49183197400100653,   0.6719509387375437,
    0.7779692368765063,    0.5048534099411094,  0.5889985448763707,   0.7148079312434268,    0.805103200497338,
    0.843386537236052,     0.8412380494182897,  0.8318740175196407,   1.0497884803175659,    1.0711630737651041,
    1.089040564221014,     1.0545577953249807,  0.951947625059862,    0.802220548037395,     0.7011129295670949};
// [2, 1, 5, 7]
const std::vector<double> k_bicubic_5x7_ac = {
    0.09983341664682815,  0.2490076477699678,   0.4528862853790683,   0.6139597014702495,  0.7446431199708593,
    0.867481764005103,    0.9356160015533859,   0.6360007342045157,   0.7147360803829237,  0.8046778840233748,
    0.8557406494406257,   0.8644456571542714,   0.8414334402517757,   0.8072147658872368,  0.9999576464987401,
    0.9829019561550812,   0.9289597150038692,   0.8516738073647404,   0.7322314440302514,  0.5658719876914121,
    0.4363990821601263,   0.6251165456781214,   0.5248710626573899,   0.3668988852610285,  0.2183653980023185,
    0.05902318192433409,  -0.12777227232342586, -0.2568410321955555,  0.08150215176026912, -0.07076501366251015,
    -0.28442571253646254, -0.4595144062153205,  -0.6118578909427193,  -0.7648646992794468, -0.8564779741650012,
    -0.9851777815038593,  -0.995734713643119,   -0.980538397794069,   -0.9350036427173322, -0.8431877418564172,
    -0.7045750372495587,  -0.59171558063101,    -0.7349948991114024,  -0.6545472762415009, -0.5207064784067591,
    -0.3879255167068455,  -0.23594287859427676, -0.05089761032578757, 0.08075448297786121, -0.2601574914304689,
    -0.10980475438054196, 0.10661169378122266,  0.28995780788486514,  0.4589514863776903,  0.6370947729106087,
    0.7491743483316894,   0.40689189486651534,  0.516064737858567,    0.6551620223348644,  0.7536118067620854,
    0.8147590435841758,   0.8543828677801246,   0.8640822504918276,   0.9379999767747389,  0.9758223627359427,
    0.999871708718139,    0.9875855336513938,   0.9264154954967662,   0.8201078732446092,  0.7275732909714597};
// [2, 1, 4, 6]
const std::vector<double> k_bicubic_sf15 = {
    -0.012144627092897643, 0.185301544611538,    0.48931174602966876, 0.6842851341228757,   0.8936631681989999,
    0.9991964877149359,    0.6213586205049622,   0.7147360803829239,  0.828891371840101,    0.8637642569506597,
    0.8414334402517758,    0.8022468065758624,   0.959310680268922,   0.8953873367933942,   0.751839664335798,
    0.6013678433459828,    0.34870522564521567,  0.1788024238587921,  0.25767401642506055,  0.0931969294892933,
    -0.17174292810560912,  -0.3567939694218247,  -0.579115622265927,  -0.702199165506952,   -1.0457875727521744,
    -1.072638355940218,    -1.0645085165498092,  -0.9952570307244063, -0.8210394304926287,  -0.6865750896450901,
    -0.7535963245197917,   -0.654547276241501,   -0.4667344211081317, -0.30058253389993494, -0.05089761032578763,
    0.10824557339210937,   -0.05603176766152897, 0.12290648342864531, 0.4005464525925583,   0.5813603363132013,
    0.779824935183096,     0.8818629702980465,   0.7689143204198505,  0.8353954956832745,   0.9012470947320488,
    0.896220969749868,     0.8171349828638067,   0.7428434453514426};
// [2, 1, 2, 3]
const std::vector<double> k_bicubic_down_2x3 = {0.37120297691222337, 0.713913264220644,    0.859867647317862,
                                                0.28163625584532825, -0.15409119004073477, -0.5473507999207775,
                                                -0.8525489726313931, -0.6819992887992513,  -0.323489255350154,
                                                0.712121577479871,   0.8725943030301481,   0.7925783169864934};
// [2, 1, 2, 3]
const std::vector<double> k_area_2x3 = {0.6204092658821264,  0.7146801410960121,  0.7122224119286558,
                                        0.43149845018160404, 0.19122688888873474, -0.07492633472933566,
                                        -0.5298154942367936, -0.3145407398728933, -0.05669437194451191,
                                        0.4460814719609079,  0.6229625960934545,  0.7155286552944015};
// [1, 2, 3]
const std::vector<double> k_area_linear_3 = {0.27635985101294824, 0.7110484689677712,  0.967786824026063,
                                             0.8305955795170603,  0.41671089265021566, -0.10146178038809671};
// [2, 1, 3, 4]
const std::vector<double> k_bicubic_5x7_grad = {
    1.810961912566069,   2.3025660923087137,  2.414575887718287,  2.1111172494772137,  -0.3509733873934504,
    -1.158101034779579,  -1.8202683724882536, -2.125399093776919, -1.2521905204051103, -0.4587974457093046,
    0.4834042131536115,  1.2726498769916206,  2.177776880916545,  1.7688309372335957,  1.0037073356731885,
    0.12745680341553295, -2.077970598553128,  -2.279717526924706, -2.082242302970141,  -1.548791501663011,
    1.130481140713555,   1.860620702145106,   2.31135150422328,   2.338315288247764};

Tensor image() { return seq(24).view({2, 1, 3, 4}); }

// An output against PyTorch's: its sizes, then every element within tol (absolute).
void check_parity(const std::string& what, const Tensor& got, const IntList& sizes, const std::vector<double>& want,
                  double tol) {
  INFO(what);
  CHECK(got.sizes() == sizes);
  check_close(got, want, 0, tol, what);
}

// The gradient of image() through weighted_sum(interpolate(image(), o), 0.21, 0.3), the loss of
// the PyTorch script.
Tensor image_grad(const InterpolateOptions& o) {
  Tensor x = image().requires_grad_();
  weighted_sum(F::interpolate(x, o), 0.21, 0.3).backward();
  return x.grad();
}

// f64 gradcheck of interpolate(., o) at x.
bool interpolate_gradcheck(const Tensor& x, const InterpolateOptions& o) {
  return kiln::gradcheck([o](const TL& in) { return F::interpolate(in[0], o); }, {x});
}

}  // namespace

// ------------------------------------------------------------------------------ interpolate

TEST_CASE("interpolate: nearest and nearest-exact match PyTorch", "[resample]") {
  Tensor x = image();
  check_parity("nearest 5x7", F::interpolate(x, O().size({5, 7})), {2, 1, 5, 7},
               pick(2, 3, 4, {0, 0, 1, 1, 2}, {0, 0, 1, 1, 2, 2, 3}), 1e-15);
  check_parity("nearest-exact 5x7", F::interpolate(x, O().size({5, 7}).mode("nearest-exact")), {2, 1, 5, 7},
               pick(2, 3, 4, {0, 0, 1, 2, 2}, {0, 0, 1, 2, 2, 3, 3}), 1e-15);
  check_parity("nearest x1.5", F::interpolate(x, O().scale_factor({1.5})), {2, 1, 4, 6},
               pick(2, 3, 4, {0, 0, 1, 2}, {0, 0, 1, 2, 2, 3}), 1e-15);
  // scale 2 is pixel doubling; the same size is the identity
  Tensor d = F::interpolate(x, O().scale_factor({2.0}));
  CHECK(kiln::equal(d.slice(2, 0, 6, 2).slice(3, 0, 8, 2), x));
  CHECK(kiln::equal(d.slice(2, 1, 6, 2).slice(3, 1, 8, 2), x));
  CHECK(kiln::equal(F::interpolate(x, O().size({3, 4})), x));
}

TEST_CASE("interpolate: bilinear and linear match PyTorch", "[resample]") {
  Tensor x = image();
  check_parity("bilinear 5x7 align_corners", F::interpolate(x, O().size({5, 7}).mode("bilinear").align_corners(true)),
               {2, 1, 5, 7}, k_bilinear_5x7_ac, 1e-14);
  check_parity("bilinear 5x7", F::interpolate(x, O().size({5, 7}).mode("bilinear")), {2, 1, 5, 7}, k_bilinear_5x7,
               1e-14);
  check_parity("bilinear x1.5", F::interpolate(x, O().scale_factor({1.5}).mode("bilinear")), {2, 1, 4, 6},
               k_bilinear_sf15, 1e-14);
  check_parity("bilinear 2x3", F::interpolate(x, O().size({2, 3}).mode("bilinear")), {2, 1, 2, 3}, k_bilinear_down_2x3,
               1e-14);
  check_parity("linear 8", F::interpolate(seq(10).view({1, 2, 5}), O().size({8}).mode("linear")), {1, 2, 8}, k_linear_8,
               1e-14);
  // f32 follows the f64 values to float rounding
  check_parity("bilinear 5x7 f32", F::interpolate(x.to(DType::F32), O().size({5, 7}).mode("bilinear")), {2, 1, 5, 7},
               k_bilinear_5x7, 1e-6);
  // align_corners keeps the corner pixels exactly
  Tensor ac = F::interpolate(x, O().size({6, 9}).mode("bilinear").align_corners(true));
  CHECK(kiln::equal(ac.slice(2, 0, 6, 5).slice(3, 0, 9, 8), x.slice(2, 0, 3, 2).slice(3, 0, 4, 3)));
}

TEST_CASE("interpolate: bicubic and area match PyTorch", "[resample]") {
  Tensor x = image();
  check_parity("bicubic 5x7", F::interpolate(x, O().size({5, 7}).mode("bicubic")), {2, 1, 5, 7}, k_bicubic_5x7, 1e-14);
  check_parity("bicubic 5x7 align_corners", F::interpolate(x, O().size({5, 7}).mode("bicubic").align_corners(true)),
               {2, 1, 5, 7}, k_bicubic_5x7_ac, 1e-14);
  check_parity("bicubic x1.5", F::interpolate(x, O().scale_factor({1.5}).mode("bicubic")), {2, 1, 4, 6}, k_bicubic_sf15,
               1e-14);
  check_parity("bicubic 2x3", F::interpolate(x, O().size({2, 3}).mode("bicubic")), {2, 1, 2, 3}, k_bicubic_down_2x3,
               1e-14);
  check_parity("area 2x3", F::interpolate(x, O().size({2, 3}).mode("area")), {2, 1, 2, 3}, k_area_2x3, 1e-15);
  check_parity("area 3", F::interpolate(seq(10).view({1, 2, 5}), O().size({3}).mode("area")), {1, 2, 3},
               k_area_linear_3, 1e-15);
  CHECK(kiln::equal(F::interpolate(x, O().size({3, 4}).mode("bicubic")), x));  // same size: the identity
  check_close(image_grad(O().size({5, 7}).mode("bicubic")), k_bicubic_5x7_grad, 0, 1e-13);
  Tensor g = kiln::randn({1, 2, 3, 4}, f64(true));
  for (bool ac : {false, true}) CHECK(interpolate_gradcheck(g, O().size({5, 3}).mode("bicubic").align_corners(ac)));
  CHECK(interpolate_gradcheck(g, O().size({2, 3}).mode("area")));
}

TEST_CASE("interpolate: gradients match PyTorch and gradcheck", "[resample]") {
  check_close(image_grad(O().size({5, 7}).mode("bilinear")), k_bilinear_5x7_grad, 0, 1e-13);
  check_close(image_grad(O().scale_factor({1.5})), k_nearest_sf15_grad, 0, 1e-13);
  Tensor g = kiln::randn({1, 2, 3, 3}, f64(true));
  for (bool ac : {false, true}) CHECK(interpolate_gradcheck(g, O().size({4, 5}).mode("bilinear").align_corners(ac)));
  CHECK(interpolate_gradcheck(g, O().size({2, 5})));
  CHECK(interpolate_gradcheck(kiln::randn({2, 1, 4}, f64(true)), O().size({7}).mode("linear").align_corners(true)));
}

TEST_CASE("interpolate: non-contiguous and channels-last inputs", "[resample]") {
  kiln::manual_seed(3);
  Tensor x = kiln::randn({2, 3, 5, 4}, f64());
  for (const std::string mode : {"nearest", "bilinear"}) {
    InterpolateOptions o = InterpolateOptions().size({7, 6}).mode(mode);
    Tensor want = F::interpolate(x, o);
    check_close(F::interpolate(channels_last(x), o), values(want), 0, 1e-15, mode + " channels-last");
    Tensor t = x.transpose(2, 3).contiguous().transpose(2, 3);  // H and W strides swapped
    check_close(F::interpolate(t, o), values(want), 0, 1e-15, mode + " transposed");
    Tensor wide = kiln::randn({2, 3, 5, 8}, f64());
    check_close(F::interpolate(wide.slice(3, 0, 8, 2), o),
                values(F::interpolate(wide.slice(3, 0, 8, 2).contiguous(), o)), 0, 1e-15, mode + " strided");
  }
}

TEST_CASE("interpolate: errors", "[resample]") {
  Tensor x = image();
  const struct {
    Tensor x;
    InterpolateOptions o;
    const char* message;
  } cases[] = {
      {x, O(), "either size or scale_factor should be given"},
      {x, O().size({4, 4}).scale_factor({2}), "only one of size or scale_factor"},
      {x, O().size({4, 4}).mode("trilinear"), "unknown mode 'trilinear'"},
      {x, O().size({4, 4}).align_corners(true), "align_corners can only be set with the interpolating modes"},
      {x, O().size({4, 4}).mode("area").align_corners(true), "align_corners can only be set"},
      {x.select(1, 0), O().size({4}).mode("bicubic"), "mode 'bicubic' needs a 4-D input"},
      {x, O().size({4}).mode("linear"), "mode 'linear' needs a 3-D input"},
      {x.view({2, 12}), O().size({4}), "expected a 3-D [N, C, W] or 4-D [N, C, H, W] input"},
      {x, O().size({4, 4, 4}), "size must have 1 or 2 values"},
      {x, O().scale_factor({0.1}), "sizes should be greater than 0"},
      {x, O().scale_factor({-2}), "scale_factor must be positive"},
      {kiln::ones({1, 1, 2, 2}, DType::I64), O().size({4}), "floating-point"},
  };
  for (const auto& c : cases) CHECK_THAT(error_of([&] { F::interpolate(c.x, c.o); }), Catch::Contains(c.message));
}

TEST_CASE("nn::Upsample runs interpolate and prints as PyTorch", "[resample]") {
  kiln::nn::Upsample up(O().scale_factor({2}).mode("bilinear").align_corners(true));
  Tensor x = image();
  CHECK(kiln::equal(up(x), F::interpolate(x, up.options)));
  CHECK(up.str() == "Upsample(scale_factor=2.0, mode='bilinear')");
  kiln::nn::Upsample sized(O().size({4, 6}));
  CHECK(sized.extra_repr() == "size=(4, 6), mode='nearest'");
  CHECK(sized(x).sizes() == IntList{2, 1, 4, 6});
}

// ------------------------------------------------------------------------------ pad

TEST_CASE("pad: constant, reflect, replicate and circular match PyTorch", "[resample]") {
  Tensor p = seq(18).view({1, 2, 3, 3});
  check_parity("constant", F::pad(p, {1, 2, 0, 1}, "constant", -1.5), {1, 2, 4, 6},
               pick(2, 3, 3, {0, 1, 2, -1}, {-1, 0, 1, 2, -1, -1}, -1.5), 0);
  check_parity("constant, negative (a crop)", F::pad(p, {-1, 1, 1, -2}), {1, 2, 2, 3},
               pick(2, 3, 3, {-1, 0}, {1, 2, -1}), 0);
  check_parity("reflect", F::pad(p, {2, 1, 1, 2}, "reflect"), {1, 2, 6, 6},
               pick(2, 3, 3, {1, 0, 1, 2, 1, 0}, {2, 1, 0, 1, 2, 1}), 0);
  check_parity("replicate", F::pad(p, {2, 1, 1, 2}, "replicate"), {1, 2, 6, 6},
               pick(2, 3, 3, {0, 0, 1, 2, 2, 2}, {0, 0, 0, 1, 2, 2}), 0);
  check_parity("circular", F::pad(p, {2, 1, 1, 3}, "circular"), {1, 2, 7, 6},
               pick(2, 3, 3, {2, 0, 1, 2, 0, 1, 2}, {1, 2, 0, 1, 2, 0}), 0);
  // constant padding of every dim, and of a non-contiguous view
  Tensor all = F::pad(kiln::ones({2, 2}), {1, 0, 0, 1});
  CHECK(values(all) == std::vector<double>{0, 1, 1, 0, 1, 1, 0, 0, 0});
  Tensor t = p.transpose(2, 3);
  check_close(F::pad(t, {2, 1, 1, 2}, "reflect"), values(F::pad(t.contiguous(), {2, 1, 1, 2}, "reflect")), 0, 0);
  check_close(F::pad(t, {1, 1}, "constant", 3.0), values(F::pad(t.contiguous(), {1, 1}, "constant", 3.0)), 0, 0);
  // integer tensors pad too
  CHECK(values(F::pad(kiln::tensor({1, 2}), {1, 1}, "constant", 7)) == std::vector<double>{7, 1, 2, 7});
}

TEST_CASE("pad: gradcheck", "[resample]") {
  kiln::manual_seed(4);
  Tensor x = kiln::randn({1, 2, 3, 4}, f64(true));
  for (const std::string mode : {"constant", "reflect", "replicate", "circular"})
    CHECK(kiln::gradcheck([mode](const TL& in) { return F::pad(in[0], {2, 1, 1, 2}, mode); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::pad(in[0], {-1, 2, 1, -1}, "constant", 0.5); }, {x}));
  CHECK(kiln::gradcheck([](const TL& in) { return F::pad(in[0].transpose(2, 3), {1, 1, 0, 0}, "reflect"); }, {x}));
}

TEST_CASE("pad: errors", "[resample]") {
  Tensor x = kiln::zeros({1, 1, 3, 3});
  const struct {
    IntList pad;
    const char* mode;
    double value;
    const char* message;
  } cases[] = {
      {{1, 2, 3}, "constant", 0, "divisible by 2"},
      {{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, "constant", 0, "too large"},
      {{-2, -2}, "constant", 0, "negative output size"},
      {{-4, 2}, "constant", 0, "crops more than its size 3"},
      {{3, 0, 0, 0}, "reflect", 0, "must be smaller than the size 3"},
      {{0, 0, 0, 4}, "circular", 0, "at most the size 3"},
      {{-1, 0, 0, 0}, "replicate", 0, "non-negative padding"},
      {{1, 1}, "reflect", 0, "2-D or 3-D input"},
      {{1, 1}, "mirror", 0, "unknown mode 'mirror'"},
      {{1, 1, 1, 1}, "reflect", 2.0, "only used by mode 'constant'"},
  };
  for (const auto& c : cases)
    CHECK_THAT(error_of([&] { F::pad(x, c.pad, c.mode, c.value); }), Catch::Contains(c.message));
}

// ------------------------------------------------------------------------------ unflatten

TEST_CASE("unflatten and nn::Unflatten", "[resample]") {
  Tensor x = kiln::arange(24.0, f64()).view({2, 12});
  Tensor u = x.unflatten(1, {3, 4});
  CHECK(u.sizes() == IntList{2, 3, 4});
  CHECK(values(u) == values(x));
  CHECK(x.unflatten(-1, {2, -1, 2}).sizes() == IntList{2, 2, 3, 2});
  CHECK(x.unflatten(0, {1, 2}).sizes() == IntList{1, 2, 12});
  // a view, also of a transposed tensor, and differentiable
  Tensor t = x.t();  // [12, 2]
  Tensor tu = t.unflatten(0, {4, 3});
  CHECK(tu.storage() == x.storage());
  CHECK(values(tu.select(0, 1).select(0, 2)) == std::vector<double>{5, 17});
  CHECK(kiln::gradcheck(
      [](const TL& in) {
        return in[0].t().unflatten(0, {2, 3}) * 2.0;
      },
      {kiln::randn({2, 6}, f64(true))}));
  kiln::nn::Unflatten m(1, {3, 2, 2});
  CHECK(m(x).sizes() == IntList{2, 3, 2, 2});
  CHECK(m.str() == "Unflatten(dim=1, unflattened_size=(3, 2, 2))");
  CHECK_THAT(error_of([&] { x.unflatten(1, {5, 2}); }), Catch::Contains("don't multiply up to the size of dim 1 (12)"));
  CHECK_THAT(error_of([&] { x.unflatten(1, {-1, -1}); }), Catch::Contains("only one dimension can be inferred"));
  CHECK_THAT(error_of([&] { x.unflatten(1, {5, -1}); }), Catch::Contains("cannot be inferred"));
  CHECK_THAT(error_of([&] { x.unflatten(1, {}); }), Catch::Contains("sizes must be non-empty"));
  CHECK_THAT(error_of([&] { x.unflatten(2, {2, 6}); }), Catch::Contains("unflatten"));
}
