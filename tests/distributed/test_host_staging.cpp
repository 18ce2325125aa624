// HostStaging, the gloo group's path for CUDA tensors, on CPU tensors (its copies without the
// events; the CUDA side runs in the GPU verdict's two-rank job on one GPU).
#include <catch2/catch.hpp>

#include <kiln/kiln.h>

#include "kiln/distributed/backends/host_staging.h"

using kiln::Tensor;
using kiln::distributed::HostStaging;

TEST_CASE("host staging: CPU tensors run in place unless copies are asked for", "[distributed][staging]") {
  Tensor a = kiln::randn({3, 4}), b = kiln::randn({5});
  HostStaging in_place({a, b});
  CHECK_FALSE(in_place.staged());
  REQUIRE(in_place.host().size() == 2);
  CHECK(in_place.host()[0].data_ptr() == a.data_ptr());
  in_place.to_host();  // no-ops
  in_place.to_device();
  CHECK(in_place.host()[1].data_ptr() == b.data_ptr());
}

TEST_CASE("host staging: copies in, the collective's writes back, nothing else", "[distributed][staging]") {
  kiln::manual_seed(3);
  Tensor a = kiln::randn({3, 4}), b = kiln::randint(0, 100, {7}, kiln::DType::I32);
  const Tensor a0 = a.clone(), b0 = b.clone();
  HostStaging st({a, b}, /*copy_cpu=*/true);
  REQUIRE(st.staged());
  REQUIRE(st.host().size() == 2);
  CHECK(st.host()[0].data_ptr() != a.data_ptr());
  CHECK(st.host()[0].sizes() == a.sizes());
  CHECK(st.host()[1].dtype() == kiln::DType::I32);
  st.to_host();
  CHECK(kiln::equal(st.host()[0], a0));
  CHECK(kiln::equal(st.host()[1], b0));
  // what a collective does: it writes the host buffers; the tensors change only at to_device
  Tensor h0 = st.host()[0], h1 = st.host()[1];  // handles on the staged buffers
  h0.mul_(2.0);
  h1.add_(1.0);
  CHECK(kiln::equal(a, a0));
  st.to_device();
  Tensor a2 = a0.clone(), b1 = b0.clone();
  a2.mul_(2.0);
  b1.add_(1.0);
  CHECK(kiln::equal(a, a2));
  CHECK(kiln::equal(b, b1));
}

TEST_CASE("host staging: a tensor that requires grad is staged without autograd", "[distributed][staging]") {
  Tensor w = kiln::randn({6}).requires_grad_(true);
  const Tensor w0 = w.detach().clone();
  HostStaging st({w}, true);
  st.to_host();
  Tensor h = st.host()[0];
  h.fill_(1.5);
  st.to_device();  // an in-place copy into a leaf that requires grad: allowed under no_grad
  CHECK(kiln::equal(w.detach(), kiln::full({6}, 1.5)));
  CHECK_FALSE(kiln::equal(w.detach(), w0));
}
