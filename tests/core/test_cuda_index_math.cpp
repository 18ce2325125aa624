// The index arithmetic of the CUDA strided pointwise kernel (kernels/cuda/index_math.h), run on
// the host: the same FastDivmod and OffsetCalc32 code a GPU thread runs, against plain 64-bit
// division and the 64-bit offsets of the fallback kernel.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <kiln/kernels/cuda/index_math.h>
#include <kiln/kiln.h>

namespace kc = kiln::kernels::cuda;
using kiln::kernels::PointwiseIter;

namespace {

void require_divides(uint32_t d, uint32_t n) {
  const kc::FastDivmod f(d);
  uint32_t q = 0, r = 0;
  f.divmod(n, q, r);
  if (q != n / d || r != n % d) {
    INFO("d = " << d << ", n = " << n << ": got q = " << q << ", r = " << r);
    REQUIRE(q == n / d);
    REQUIRE(r == n % d);
  }
}

// Numerators where a wrong magic number or shift shows first: around multiples of d, and the
// ends of the domain [0, 2^31).
std::vector<uint32_t> numerators_for(uint32_t d, std::mt19937& rng) {
  constexpr uint32_t kTop = std::numeric_limits<int32_t>::max();
  std::vector<uint32_t> n = {0, 1, kTop, kTop - 1, kTop - d + 1};
  for (uint64_t k : {uint64_t{1}, uint64_t{2}, uint64_t{3}, uint64_t{kTop} / d}) {
    const uint64_t m = k * d;
    for (int64_t delta = -1; delta <= 1; ++delta)
      if (m + delta <= kTop) n.push_back(static_cast<uint32_t>(m + delta));
  }
  std::uniform_int_distribution<uint32_t> any(0, kTop);
  for (int i = 0; i < 200; ++i) n.push_back(any(rng));
  return n;
}

// The fallback kernel's offsets (launch.cuh, offsets_of): outermost dimension first, int64.
std::vector<int64_t> offsets_64(const PointwiseIter& it, int64_t linear) {
  std::vector<int64_t> o(it.noperands, 0);
  for (int d = it.ndim - 1; d >= 0; --d) {
    const int64_t i = linear % it.sizes[d];
    linear /= it.sizes[d];
    for (int k = 0; k < it.noperands; ++k) o[k] += i * it.strides[k][d];
  }
  return o;
}

template <int N> void require_offsets_match(const PointwiseIter& it) {
  REQUIRE(it.noperands == N);
  REQUIRE(kc::fits_32bit_indexing(it));
  const kc::OffsetCalc32<N> calc(it);
  for (int64_t i = 0; i < it.numel; ++i) {
    uint32_t off[N];
    calc.get(static_cast<uint32_t>(i), off);
    const std::vector<int64_t> want = offsets_64(it, i);
    for (int k = 0; k < N; ++k) {
      if (off[k] != want[k]) {
        INFO("element " << i << ", operand " << k);
        REQUIRE(off[k] == want[k]);
      }
    }
  }
}

}  // namespace

TEST_CASE("FastDivmod divides like / and % for every divisor shape", "[core][cuda]") {
  std::mt19937 rng(12345);
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 1100; ++d) divisors.push_back(d);
  for (int s = 1; s <= 31; ++s) {
    const uint64_t p = uint64_t{1} << s;
    for (int64_t delta = -1; delta <= 1; ++delta)
      if (p + delta <= uint64_t{std::numeric_limits<int32_t>::max()})
        divisors.push_back(static_cast<uint32_t>(p + delta));
  }
  for (uint32_t d : {768u, 3072u, 50257u, 50304u, 1000003u, 2147483647u}) divisors.push_back(d);
  std::uniform_int_distribution<uint32_t> any_divisor(1, std::numeric_limits<int32_t>::max());
  for (int i = 0; i < 300; ++i) divisors.push_back(any_divisor(rng));
  for (uint32_t d : divisors)
    for (uint32_t n : numerators_for(d, rng)) require_divides(d, n);
  // every numerator below 2^16 for a few small divisors
  for (uint32_t d : {3u, 7u, 12u, 641u})
    for (uint32_t n = 0; n < (1u << 16); ++n) require_divides(d, n);
}

TEST_CASE("OffsetCalc32 gives the 64-bit kernel's byte offsets", "[core][cuda]") {
  using kiln::Tensor;
  const auto f32 = kiln::TensorOptions().dtype(kiln::DType::F32);
  const auto bf16 = kiln::TensorOptions().dtype(kiln::DType::BF16);
  SECTION("broadcast bias over rows and a size-1 middle dimension") {
    Tensor out = kiln::empty({5, 7, 3}, f32), x = kiln::empty({5, 7, 3}, f32), b = kiln::empty({7, 1}, f32);
    const PointwiseIter it = kiln::kernels::make_pointwise_iter(out, {&x, &b}, "test");
    REQUIRE(it.ndim == 3);
    require_offsets_match<3>(it);
  }
  SECTION("a transposed input and a column slice, into bf16") {
    Tensor base = kiln::empty({11, 13}, f32);
    Tensor xt = base.t();                                   // [13, 11], strides (1, 13)
    Tensor y = kiln::empty({13, 20}, f32).slice(1, 3, 14);  // [13, 11], strides (20, 1), offset 3
    Tensor out = kiln::empty({13, 11}, bf16);
    const PointwiseIter it = kiln::kernels::make_pointwise_iter(out, {&xt, &y}, "test");
    REQUIRE(it.ndim == 2);
    require_offsets_match<3>(it);
  }
  SECTION("the where kernel's four operands, one broadcast from a scalar") {
    Tensor out = kiln::empty({4, 6, 9}, f32), c = kiln::empty({6, 9}, kiln::TensorOptions().dtype(kiln::DType::Bool));
    Tensor x = kiln::empty({4, 1, 9}, f32), y = kiln::empty({}, f32);
    const PointwiseIter it = kiln::kernels::make_pointwise_iter(out, {&c, &x, &y}, "test");
    require_offsets_match<4>(it);
  }
  SECTION("one element and a flat contiguous space") {
    Tensor s = kiln::empty({}, f32);
    require_offsets_match<2>(kiln::kernels::make_pointwise_iter(s, {&s}, "test"));
    Tensor v = kiln::empty({1000}, f32), w = kiln::empty({2000}, f32).slice(0, 1, 1001);
    require_offsets_match<2>(kiln::kernels::make_pointwise_iter(v, {&w}, "test"));
  }
}

TEST_CASE("fits_32bit_indexing: the element count and every operand's last byte below 2^31", "[core][cuda]") {
  constexpr int64_t kTop = std::numeric_limits<int32_t>::max();
  PointwiseIter it;
  it.ndim = 1;
  it.noperands = 2;
  it.elem_size[0] = it.elem_size[1] = 1;
  it.strides[0][0] = it.strides[1][0] = 1;
  it.sizes[0] = it.numel = kTop;  // bytes 0 .. 2^31 - 2, last byte ends at 2^31 - 1
  REQUIRE(kc::fits_32bit_indexing(it));
  it.sizes[0] = it.numel = kTop + 1;
  REQUIRE_FALSE(kc::fits_32bit_indexing(it));

  // few elements, far apart: [1024, 2] with the input's rows 4 MiB apart ends past 2^31
  it.ndim = 2;
  it.sizes[0] = 1024;
  it.sizes[1] = 2;
  it.numel = 2048;
  it.elem_size[0] = it.elem_size[1] = 4;
  it.strides[0][0] = 8;
  it.strides[0][1] = 4;
  it.strides[1][0] = int64_t{1} << 22;
  it.strides[1][1] = 4;
  REQUIRE_FALSE(kc::fits_32bit_indexing(it));
  it.strides[1][0] = (int64_t{1} << 21);  // last byte 1023 * 2^21 + 8 < 2^31
  REQUIRE(kc::fits_32bit_indexing(it));
  it.strides[1][1] = -4;
  REQUIRE_FALSE(kc::fits_32bit_indexing(it));
  it.strides[1][1] = int64_t{1} << 40;  // a stride alone past 2^31 (no overflow on the way)
  REQUIRE_FALSE(kc::fits_32bit_indexing(it));
}
