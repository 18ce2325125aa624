#pragma once
// What the GPU tests of the "nccl" group share: a group of one rank on cuda:0 (NCCL allows one
// rank per GPU, and the GPU machine has one), rendezvoused through a TCPStore on loopback, and
// the skip for builds without NCCL.
#include <catch2/catch.hpp>

#include <chrono>
#include <memory>

#include <kiln/config.h>
#include <kiln/distributed/backends/process_group.h>
#include <kiln/distributed/store/store.h>
#include <kiln/kiln.h>

namespace kiln_test {

inline std::shared_ptr<kiln::distributed::ProcessGroup> nccl_world_of_one(
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  namespace dist = kiln::distributed;
  dist::TCPStoreOptions so;
  so.world_size = 1;
  so.is_server = true;
  so.timeout = std::chrono::seconds(30);
  auto store = std::make_shared<dist::TCPStore>("127.0.0.1", 0, so);
  dist::ProcessGroupOptions po;
  po.timeout = timeout;
  kiln::cuda::set_device(0);
  return dist::make_nccl_process_group(store, /*rank=*/0, /*size=*/1, po);
}

}  // namespace kiln_test

#define SKIP_WITHOUT_NCCL()                                      \
  do {                                                           \
    if (!KILN_WITH_NCCL) {                                       \
      WARN("kiln was built without NCCL: nothing to test here"); \
      return;                                                    \
    }                                                            \
  } while (0)
