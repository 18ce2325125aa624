#pragma once
// Runs several ranks of a program as separate processes over loopback, as a launcher would, but
// without kiln-run: each child gets RANK / WORLD_SIZE / LOCAL_RANK / LOCAL_WORLD_SIZE /
// MASTER_ADDR / MASTER_PORT in its environment. The parent waits with a deadline and kills every
// child still running when it passes, so a test that would hang fails instead.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace kiln_test {

struct RankResult {
  int exit_code = -1;  // exit status, or -1 when killed by a signal
  int signal = 0;      // the signal that ended it, 0 when it exited
  bool killed_at_deadline = false;
  double seconds = 0;  // from the spawn of all ranks to this rank's end
  std::string output;  // stdout and stderr together
};

// A TCP port free on loopback right now (the kernel picks it; the socket is closed again).
inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

struct SpawnOptions {
  int world_size = 2;
  std::vector<int> ranks;  // which ranks to start (empty: all); the others never join
  double deadline_seconds = 60;
  std::map<std::string, std::string> env;  // extra variables for every rank
  int port = 0;                            // 0: a free one
};

// Starts `argv` once per rank and waits for all of them (or the deadline).
inline std::vector<RankResult> spawn_ranks(const std::vector<std::string>& argv, const SpawnOptions& opt) {
  using clock = std::chrono::steady_clock;
  const int port = opt.port ? opt.port : free_port();
  std::vector<int> ranks = opt.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < opt.world_size; ++r) ranks.push_back(r);
  }
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  std::vector<RankResult> results(ranks.size());
  const auto start = clock::now();
  for (int r : ranks) {
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      auto eq = kv.find('=');
      if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const char* k : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}) env.erase(k);
    env["RANK"] = std::to_string(r);
    env["WORLD_SIZE"] = std::to_string(opt.world_size);
    env["LOCAL_RANK"] = std::to_string(r);
    env["LOCAL_WORLD_SIZE"] = std::to_string(opt.world_size);
    env["MASTER_ADDR"] = "127.0.0.1";
    env["MASTER_PORT"] = std::to_string(port);
    env["OMP_NUM_THREADS"] = "1";  // several ranks share the 2-core machine
    for (const auto& [k, v] : opt.env) env[k] = v;
    std::vector<std::string> env_strings;
    for (const auto& [k, v] : env) env_strings.push_back(k + "=" + v);
    std::vector<char*> envp, args;
    for (auto& s : env_strings) envp.push_back(s.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv_copy = argv;
    for (auto& s : argv_copy) args.push_back(s.data());
    args.push_back(nullptr);

    char log_template[] = "/tmp/kiln-rank-XXXXXX";
    int fd = ::mkstemp(log_template);
    logs.push_back(log_template);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fd, 1);
    posix_spawn_file_actions_adddup2(&actions, fd, 2);
    pid_t pid = -1;
    int rc = posix_spawn(&pid, args[0], &actions, nullptr, args.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(fd);
    if (rc != 0) pid = -1;
    pids.push_back(pid);
  }

  size_t running = 0;
  for (pid_t p : pids) running += p > 0;
  const auto deadline = start + std::chrono::duration<double>(opt.deadline_seconds);
  while (running > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (pids[i] <= 0) continue;
      int status = 0;
      pid_t done = ::waitpid(pids[i], &status, WNOHANG);
      if (done == pids[i]) {
        results[i].seconds = std::chrono::duration<double>(clock::now() - start).count();
        if (WIFEXITED(status)) results[i].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[i].signal = WTERMSIG(status);
        pids[i] = 0;
        --running;
      }
    }
    if (running == 0) break;
    if (clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i) {
        if (pids[i] <= 0) continue;
        ::kill(pids[i], SIGKILL);
        int status = 0;
        ::waitpid(pids[i], &status, 0);
        results[i].killed_at_deadline = true;
        results[i].signal = SIGKILL;
        results[i].seconds = opt.deadline_seconds;
        pids[i] = 0;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (size_t i = 0; i < logs.size(); ++i) {
    std::ifstream in(logs[i]);
    std::stringstream ss;
    ss << in.rdbuf();
    results[i].output = ss.str();
    std::remove(logs[i].c_str());
  }
  return results;
}

// Every rank's output, each line prefixed with its rank (for failure messages).
inline std::string describe(const std::vector<RankResult>& results) {
  std::ostringstream os;
  for (size_t i = 0; i < results.size(); ++i) {
    os << "--- rank index " << i << ": exit " << results[i].exit_code << ", signal " << results[i].signal
       << (results[i].killed_at_deadline ? " (killed at the deadline)" : "") << ", " << results[i].seconds << " s\n"
       << results[i].output << "\n";
  }
  return os.str();
}

}  // namespace kiln_test
