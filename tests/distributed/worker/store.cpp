// Store scenarios: every rank a separate process, rank 0 hosting the TCPStore server as
// init_process_group does, each reading its place in the job from the environment.
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "kiln/core/error.h"
#include "kiln/distributed/store/launch_env.h"
#include "kiln/distributed/store/store.h"
#include "tests/distributed/worker/scenario.h"

namespace kd = kiln::distributed;

namespace {

kd::TCPStoreOptions options_for(const kd::LaunchEnv& env, std::chrono::milliseconds timeout) {
  kd::TCPStoreOptions o;
  o.is_server = env.rank == 0;
  o.world_size = env.world_size;
  o.timeout = timeout;
  return o;
}

std::vector<std::string> keys_of_all(const std::string& what, int world_size) {
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(what + "/" + std::to_string(r));
  return keys;
}

}  // namespace

// kiln-dist-worker store_add N: every rank adds 1 N times and rank+1 once, then checks the sum.
KILN_SCENARIO("store_add") {
  const int adds = args.empty() ? 100 : std::stoi(args[0]);
  kd::LaunchEnv env = kd::read_launch_env();
  KILN_EXPECT(env.source == "torchrun", "source ", env.source);
  kd::TCPStore store(env.master_addr, env.master_port, options_for(env, std::chrono::seconds(30)));
  for (int i = 0; i < adds; ++i) store.add("counter", 1);
  store.add("ranks", env.rank + 1);
  store.set("done/" + std::to_string(env.rank), std::to_string(env.rank));
  store.wait(keys_of_all("done", env.world_size));
  const int64_t w = env.world_size;
  KILN_EXPECT(store.get_string("counter") == std::to_string(adds * w), "counter ", store.get_string("counter"));
  KILN_EXPECT(store.add("ranks", 0) == w * (w + 1) / 2, "ranks ", store.get_string("ranks"));
  const int next = (env.rank + 1) % env.world_size;
  KILN_EXPECT(store.get_string("done/" + std::to_string(next)) == std::to_string(next), "peer");
  // rank 0 hosts the server: it leaves after everyone else is done with it
  if (env.rank != 0) {
    store.set("left/" + std::to_string(env.rank), std::string("1"));
  } else {
    auto left = keys_of_all("left", env.world_size);
    left.erase(left.begin());
    store.wait(left);
  }
}

// kiln-dist-worker store_server_dies: rank 0's process ends without any cleanup once rank 1
// blocked on a key that never comes; rank 1 must get the lost-connection error quickly.
KILN_SCENARIO("store_server_dies") {
  kd::LaunchEnv env = kd::read_launch_env();
  kd::TCPStore store(env.master_addr, env.master_port, options_for(env, std::chrono::seconds(30)));
  if (env.rank == 0) {
    store.wait({"blocking/1"});
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::cout << "rank 0: exiting without destructors" << std::endl;
    ::_exit(0);
  }
  store.set("blocking/1", std::string("1"));
  auto start = std::chrono::steady_clock::now();
  try {
    store.get("never");
  } catch (const kiln::Error& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cout << "rank 1: " << e.what() << " after " << s << " s" << std::endl;
    KILN_EXPECT(std::string(e.what()).find("lost the connection") != std::string::npos, "");
    KILN_EXPECT(s < 10, "took ", s, " s");
    return;
  }
  throw std::runtime_error("rank 1: get of a key nobody sets returned");
}
