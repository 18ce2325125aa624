#pragma once
// Gloo's rendezvous reads and writes through kiln's Store (docs/distributed.md, "Rendezvous").
#include "kiln/config.h"
#if KILN_WITH_GLOO
#include <gloo/rendezvous/store.h>

#include <memory>

#include "kiln/distributed/store.h"

namespace kiln::distributed {

class GlooStoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  explicit GlooStoreAdapter(std::shared_ptr<kiln::distributed::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  std::shared_ptr<kiln::distributed::Store> store_;  // not gloo::rendezvous::Store (the base)
};

}  // namespace kiln::distributed
#endif
