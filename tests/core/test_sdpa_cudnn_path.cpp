// The choice between cuDNN's fused attention and kiln's kernel, and the cuDNN graph cache's key,
// as pure functions (kiln/cuda/cudnn_graph.h), in every build and without a GPU; plus the
// attention settings and counters of kiln/cuda/cudnn.h. The GPU side is
// tests/cuda/test_cuda_sdpa_cudnn.cpp.
#include <catch2/catch.hpp>

#include <set>
#include <string>

#include <kiln/kiln.h>

#include "kiln/cuda/cudnn_graph.h"

namespace cg = kiln::cudnn::graph;
using kiln::DType;
using kiln::cudnn::SdpaBackend;

namespace {

// A case the cuDNN path takes: bf16 GPT-2 heads on an sm_90 GPU.
cg::SdpaCase good_case() {
  cg::SdpaCase c;
  c.built = true;
  c.backend = SdpaBackend::Cudnn;
  c.cuda = true;
  c.sm = 90;
  c.dtype = DType::BF16;
  c.B = 4, c.H = 12, c.Tq = 1023, c.Tk = 1023, c.D = 64, c.Dv = 64;
  return c;
}

cg::SdpaOperand contiguous(int64_t B, int64_t H, int64_t T, int64_t D, uintptr_t addr = 4096) {
  cg::SdpaOperand o;
  o.data = reinterpret_cast<const void*>(addr);
  const int64_t s[4] = {B, H, T, D};
  for (int d = 0; d < 4; ++d) o.size[d] = s[d];
  o.stride[3] = 1;
  for (int d = 2; d >= 0; --d) o.stride[d] = o.stride[d + 1] * o.size[d + 1];
  return o;
}

struct BackendGuard {
  SdpaBackend prev = kiln::cudnn::sdpa_backend();
  ~BackendGuard() { kiln::cudnn::set_sdpa_backend(prev); }
};

}  // namespace

TEST_CASE("sdpa path: cuDNN takes f16/bf16 CUDA attention with head dims multiple of 8", "[cudnn][sdpa]") {
  REQUIRE(cg::sdpa_refusal(good_case()) == cg::SdpaRefusal::None);
  cg::SdpaCase c = good_case();
  c.dtype = DType::F16;
  REQUIRE(cg::sdpa_refusal(c) == cg::SdpaRefusal::None);
  for (int64_t d : {8, 16, 64, 72, 128, 256}) {
    c.D = c.Dv = d;
    INFO("head dim " << d);
    REQUIRE(cg::sdpa_refusal(c) == cg::SdpaRefusal::None);
  }
  c = good_case();
  c.Tq = 1, c.Tk = 7;  // odd and unequal lengths are cuDNN's to check
  REQUIRE(cg::sdpa_refusal(c) == cg::SdpaRefusal::None);
  c.sm = cg::kSmUnknown;  // the nn layer's pre-check, before the device is asked
  REQUIRE(cg::sdpa_refusal(c) == cg::SdpaRefusal::None);
  c.sm = 80;
  REQUIRE(cg::sdpa_refusal(c) == cg::SdpaRefusal::None);
}

TEST_CASE("sdpa path: every refusal, and the first reason wins", "[cudnn][sdpa]") {
  auto with = [](auto change) {
    cg::SdpaCase c = good_case();
    change(c);
    return cg::sdpa_refusal(c);
  };
  REQUIRE(with([](cg::SdpaCase& c) { c.built = false; }) == cg::SdpaRefusal::NotBuilt);
  REQUIRE(with([](cg::SdpaCase& c) { c.backend = SdpaBackend::Kiln; }) == cg::SdpaRefusal::Disabled);
  REQUIRE(with([](cg::SdpaCase& c) { c.cuda = false; }) == cg::SdpaRefusal::NotCuda);
  for (DType dt : {DType::F32, DType::F64}) {
    REQUIRE(with([dt](cg::SdpaCase& c) { c.dtype = dt; }) == cg::SdpaRefusal::DType);
  }
  REQUIRE(with([](cg::SdpaCase& c) { c.mask = true; }) == cg::SdpaRefusal::Mask);
  REQUIRE(with([](cg::SdpaCase& c) { c.dropout = 0.1; }) == cg::SdpaRefusal::Dropout);
  REQUIRE(with([](cg::SdpaCase& c) { c.sm = 75; }) == cg::SdpaRefusal::OldGpu);
  REQUIRE(with([](cg::SdpaCase& c) { c.Tk = 0; }) == cg::SdpaRefusal::Empty);
  REQUIRE(with([](cg::SdpaCase& c) { c.B = 0; }) == cg::SdpaRefusal::Empty);
  for (int64_t d : {0, 4, 20, 63, 264, 512}) {
    INFO("head dim " << d);
    REQUIRE(with([d](cg::SdpaCase& c) { c.D = d; }) == cg::SdpaRefusal::HeadDim);
    REQUIRE(with([d](cg::SdpaCase& c) { c.Dv = d; }) == cg::SdpaRefusal::HeadDim);
  }
  // order: a CPU f32 tensor is refused for being on the CPU; f32 with a mask for its dtype
  REQUIRE(with([](cg::SdpaCase& c) {
            c.cuda = false;
            c.dtype = DType::F32;
          }) == cg::SdpaRefusal::NotCuda);
  REQUIRE(with([](cg::SdpaCase& c) {
            c.dtype = DType::F32;
            c.mask = true;
          }) == cg::SdpaRefusal::DType);
  for (auto r : {cg::SdpaRefusal::None, cg::SdpaRefusal::NotBuilt, cg::SdpaRefusal::Disabled, cg::SdpaRefusal::NotCuda,
                 cg::SdpaRefusal::DType, cg::SdpaRefusal::OldGpu, cg::SdpaRefusal::HeadDim, cg::SdpaRefusal::Empty,
                 cg::SdpaRefusal::Mask, cg::SdpaRefusal::Dropout, cg::SdpaRefusal::Unsupported})
    REQUIRE(std::string(cg::to_string(r)) != "?");
}

TEST_CASE("sdpa path: operands cuDNN reads by strides", "[cudnn][sdpa]") {
  const int64_t B = 2, T = 67, H = 12, D = 64;
  // contiguous [B, H, T, D]
  REQUIRE(cg::sdpa_operand_ok(contiguous(B, H, T, D)));
  // q of a fused [B, T, 3, H, D] projection viewed as [B, H, T, D]: strides (3 T H D, D, 3 H D, 1),
  // k one H * D further
  cg::SdpaOperand q;
  q.data = reinterpret_cast<const void*>(uintptr_t{1} << 20);
  const int64_t sizes[4] = {B, H, T, D}, strides[4] = {3 * T * H * D, D, 3 * H * D, 1};
  for (int d = 0; d < 4; ++d) q.size[d] = sizes[d], q.stride[d] = strides[d];
  REQUIRE(cg::sdpa_operand_ok(q));
  cg::SdpaOperand k = q;
  k.data = static_cast<const char*>(q.data) + H * D * 2;  // 2-byte elements
  REQUIRE(cg::sdpa_operand_ok(k));
  // out laid out [B, T, H, D]
  cg::SdpaOperand o = contiguous(B, H, T, D);
  o.stride[1] = D, o.stride[2] = H * D;
  REQUIRE(cg::sdpa_operand_ok(o));

  cg::SdpaOperand bad = contiguous(B, H, T, D, 4098);  // not 16-byte aligned
  REQUIRE_FALSE(cg::sdpa_operand_ok(bad));
  bad = contiguous(B, H, T, D);
  bad.stride[3] = 2;  // D not unit-stride
  REQUIRE_FALSE(cg::sdpa_operand_ok(bad));
  bad = contiguous(B, H, T, 20);  // rows of 20 elements: 40 bytes, not a 16-byte multiple
  REQUIRE_FALSE(cg::sdpa_operand_ok(bad));
  bad = contiguous(B, H, T, D);
  bad.stride[0] = 0;  // a broadcast batch
  REQUIRE_FALSE(cg::sdpa_operand_ok(bad));

  // size-1 dims take any stride, and canonical strides for the key
  cg::SdpaOperand one = contiguous(B, 1, T, D);
  one.stride[1] = 12345;
  REQUIRE(cg::sdpa_operand_ok(one));
  cg::SdpaOperand canon = cg::sdpa_canonical(one);
  REQUIRE(canon.stride[1] == T * D);
  REQUIRE(canon.stride[0] == one.stride[0]);
  cg::SdpaOperand row = contiguous(1, 1, 1, D);
  row.stride[0] = row.stride[1] = row.stride[2] = 7;
  canon = cg::sdpa_canonical(row);
  REQUIRE(canon.stride[2] == D);
  REQUIRE(canon.stride[1] == D);
  REQUIRE(canon.stride[0] == D);
}

TEST_CASE("sdpa graph key: everything a graph depends on, never the data", "[cudnn][sdpa]") {
  using cg::SdpaOp;
  const cg::SdpaOperand base[4] = {contiguous(2, 4, 33, 64), contiguous(2, 4, 40, 64), contiguous(2, 4, 40, 64),
                                   contiguous(2, 4, 33, 64)};
  const std::string k0 = cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, false, 0, base, 4);
  // the same case with other data pointers: the same key
  cg::SdpaOperand moved[4] = {base[0], base[1], base[2], base[3]};
  for (auto& o : moved) o.data = reinterpret_cast<const void*>(uintptr_t{1} << 30);
  REQUIRE(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, false, 0, moved, 4) == k0);

  std::set<std::string> keys = {k0};
  auto differs = [&](const std::string& key) {
    REQUIRE(keys.count(key) == 0);
    keys.insert(key);
  };
  differs(cg::sdpa_graph_key(SdpaOp::Backward, DType::BF16, true, false, 0, base, 4));
  differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::F16, true, false, 0, base, 4));
  differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, false, false, 0, base, 4));
  differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, true, 0, base, 4));
  differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, false, 1, base, 4));
  differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, false, 0, base, 3));
  for (int i = 0; i < 4; ++i)
    for (int d = 0; d < 4; ++d) {
      INFO("operand " << i << " dim " << d);
      cg::SdpaOperand ops[4] = {base[0], base[1], base[2], base[3]};
      ops[i].size[d] += 1;
      differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, false, 0, ops, 4));
      ops[i].size[d] -= 1;
      ops[i].stride[d] += 8;
      differs(cg::sdpa_graph_key(SdpaOp::Forward, DType::BF16, true, false, 0, ops, 4));
    }
}

TEST_CASE("sdpa settings: backend switch, build flag and counters", "[cudnn][sdpa]") {
  BackendGuard guard;
  REQUIRE(kiln::cudnn::built_with_frontend() == (KILN_WITH_CUDNN_FRONTEND != 0));
  if (KILN_WITH_CUDNN_FRONTEND) REQUIRE(KILN_WITH_CUDNN);
  kiln::cudnn::set_sdpa_backend(SdpaBackend::Kiln);
  REQUIRE(kiln::cudnn::sdpa_backend() == SdpaBackend::Kiln);
  kiln::cudnn::set_sdpa_backend(SdpaBackend::Cudnn);
  REQUIRE(kiln::cudnn::sdpa_backend() == SdpaBackend::Cudnn);

  // CPU attention, with and without a mask, counts nothing (the counters are about CUDA paths)
  kiln::cudnn::reset_sdpa_counts();
  kiln::Tensor q = kiln::randn({2, 3, 9, 16}).to(DType::BF16).requires_grad_(true);
  kiln::Tensor out = kiln::nn::functional::scaled_dot_product_attention(q, q, q, true);
  out.sum().backward();
  const kiln::cudnn::SdpaCounts c = kiln::cudnn::sdpa_counts();
  REQUIRE(c.cudnn_forward + c.cudnn_backward + c.kiln_forward + c.kiln_backward + c.graphs_built + c.refused == 0);
  kiln::cudnn::detail::count_sdpa(kiln::cudnn::detail::SdpaEvent::Refused);
  REQUIRE(kiln::cudnn::sdpa_counts().refused == 1);
  kiln::cudnn::reset_sdpa_counts();
  REQUIRE(kiln::cudnn::sdpa_counts().refused == 0);
}
