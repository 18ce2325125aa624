// kiln-run end to end: it starts ranks of kiln-dist-worker (tests/distributed/worker/launcher.cpp)
// or of sh, and each test checks what the ranks saw and how kiln-run ended. Every run has a
// deadline; one that passes it kills kiln-run and fails the test instead of hanging it.
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

// The environment of the test, with `set` added or replaced and `unset` removed.
std::vector<std::string> test_env(const std::map<std::string, std::string>& set,
                                  const std::vector<std::string>& unset) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    bool drop = set.count(name) > 0;
    for (const auto& u : unset) drop = drop || u == name;
    if (!drop) env.push_back(kv);
  }
  for (const auto& [k, v] : set) env.push_back(k + "=" + v);
  return env;
}

// One run of kiln-run with its stdout and stderr captured apart.
class KilnRun {
 public:
  explicit KilnRun(const std::vector<std::string>& args, const std::vector<std::string>& env = test_env({}, {}))
      : start_(Clock::now()) {
    int out[2], err[2];
    REQUIRE(::pipe(out) == 0);
    REQUIRE(::pipe(err) == 0);
    // every end close-on-exec: kiln-run gets the write ends as 1 and 2 only, so that the ranks
    // (which inherit kiln-run's other descriptors) cannot hold the test's pipes open
    for (int fd : {out[0], out[1], err[0], err[1]}) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    for (int fd : {out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    std::vector<std::string> argv_s = {KILN_RUN};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s = env;
    std::vector<char*> argv, envp;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    for (auto& s : env_s) envp.push_back(s.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_adddup2(&actions, err[1], 2);
    const int rc = ::posix_spawn(&pid_, argv[0], &actions, nullptr, argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    REQUIRE(rc == 0);
  }

  ~KilnRun() {
    if (pid_ > 0) {  // a test that stopped early (a failed REQUIRE): leave nothing running
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      kill_rank_pids();
    }
    if (out_fd_ >= 0) ::close(out_fd_);
    if (err_fd_ >= 0) ::close(err_fd_);
  }

  // Reads output until `count` lines of stdout contain `text` (true) or `seconds` pass (false).
  bool wait_for_lines(const std::string& text, int count, double seconds) {
    const auto until = Clock::now() + std::chrono::duration<double>(seconds);
    while (Clock::now() < until) {
      if (count_occurrences(out, text) >= count) return true;
      pump(20);
    }
    return false;
  }

  void send(int sig) { REQUIRE(::kill(pid_, sig) == 0); }

  // Waits for kiln-run to end and its output to close, at most `seconds`; then it is killed
  // (with every rank whose "pid=" it printed) and `timed_out` is set.
  void finish(double seconds) {
    const auto until = start_ + std::chrono::duration<double>(seconds);
    int status = 0;
    for (;;) {
      pump(20);
      if (pid_ > 0 && ::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        ended_ = Clock::now();
        if (WIFEXITED(status)) exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) signal = WTERMSIG(status);
      }
      if (pid_ < 0 && out_fd_ < 0 && err_fd_ < 0) break;
      if (Clock::now() > until) {
        timed_out = true;
        if (pid_ > 0) {
          ::kill(pid_, SIGKILL);
          ::waitpid(pid_, nullptr, 0);
          pid_ = -1;
          ended_ = Clock::now();
        }
        kill_rank_pids();
        break;
      }
    }
    seconds_taken = std::chrono::duration<double>(ended_ - start_).count();
  }

  // The pids the ranks printed ("pid=P").
  std::vector<pid_t> rank_pids() const {
    std::vector<pid_t> pids;
    std::regex re("pid=([0-9]+)");
    for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
      pids.push_back(static_cast<pid_t>(std::stol((*it)[1])));
    }
    return pids;
  }

  std::string describe() const {
    std::ostringstream os;
    os << "exit " << exit_code << ", signal " << signal << (timed_out ? " (timed out)" : "") << ", " << seconds_taken
       << " s\n--- stdout\n"
       << out << "--- stderr\n"
       << err;
    return os.str();
  }

  static int count_occurrences(const std::string& s, const std::string& text) {
    int n = 0;
    for (auto p = s.find(text); p != std::string::npos; p = s.find(text, p + text.size())) ++n;
    return n;
  }

  int exit_code = -1;
  int signal = 0;
  bool timed_out = false;
  double seconds_taken = 0;
  std::string out, err;

 private:
  void pump(int timeout_ms) {
    std::vector<pollfd> fds;
    if (out_fd_ >= 0) fds.push_back({out_fd_, POLLIN, 0});
    if (err_fd_ >= 0) fds.push_back({err_fd_, POLLIN, 0});
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      return;
    }
    ::poll(fds.data(), fds.size(), timeout_ms);
    read_some(out_fd_, out);
    read_some(err_fd_, err);
  }

  static void read_some(int& fd, std::string& into) {
    char buf[65536];
    while (fd >= 0) {
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n > 0) {
        into.append(buf, static_cast<size_t>(n));
      } else if (n < 0 && errno == EINTR) {
        continue;
      } else if (n < 0 && errno == EAGAIN) {
        return;
      } else {
        ::close(fd);
        fd = -1;
      }
    }
  }

  void kill_rank_pids() {
    for (pid_t p : rank_pids()) ::kill(p, SIGKILL);
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1;
  Clock::time_point start_, ended_;
};

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

bool process_gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

// REQUIREs that run ended before finish()'s deadline, then CHECKs its exit code and that it took
// less than max_seconds.
void check_ended(const KilnRun& run, int exit_code, double max_seconds) {
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.exit_code == exit_code);
  CHECK(run.seconds_taken < max_seconds);
}

// CHECKs that every rank that printed its pid is gone (reaped, not a zombie), after REQUIRing that
// there were `ranks` of them (any number where ranks < 0).
void check_ranks_gone(const KilnRun& run, int ranks = -1) {
  const auto pids = run.rank_pids();
  if (ranks >= 0) REQUIRE(pids.size() == static_cast<size_t>(ranks));
  for (pid_t p : pids) CHECK(process_gone(p));
}

const std::string kWorker = KILN_DIST_WORKER;

}  // namespace

TEST_CASE("kiln-run gives each of 3 ranks its place in the job", "[distributed][kiln-run]") {
  const auto env = test_env({{"PMI_RANK", "5"},
                             {"OMPI_COMM_WORLD_RANK", "6"},
                             {"SLURM_PROCID", "7"},
                             {"RANK", "9"},
                             {"KILN_TEST_KEPT", "yes"}},
                            {"OMP_NUM_THREADS"});
  KilnRun run({"--nproc-per-node", "3", "--master-port=23456", kWorker, "launcher_env"}, env);
  run.finish(60);
  INFO(run.describe());
  REQUIRE(run.exit_code == 0);
  const int hw = static_cast<int>(std::thread::hardware_concurrency());
  for (int r = 0; r < 3; ++r) {
    const std::string p = "[rank " + std::to_string(r) + "] ";
    const std::string all = "\n" + run.out;
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "RANK=" + std::to_string(r) + "\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "WORLD_SIZE=3\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "LOCAL_RANK=" + std::to_string(r) + "\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "LOCAL_WORLD_SIZE=3\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "GROUP_RANK=0\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "MASTER_ADDR=127.0.0.1\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "MASTER_PORT=23456\n") == 1);
    // another launcher's idea of the rank is gone; unrelated variables stay
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "PMI_RANK unset\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "OMPI_COMM_WORLD_RANK unset\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "SLURM_PROCID unset\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "KILN_TEST_KEPT=yes\n") == 1);
    CHECK(KilnRun::count_occurrences(all, "\n" + p + "OWN_PROCESS_GROUP=1\n") == 1);
    // the cores shared among the 3 ranks, at least 1 each
    std::smatch m;
    const std::regex omp("\\n" + std::regex_replace(p, std::regex("[\\[\\]]"), "\\$&") + "OMP_NUM_THREADS=([0-9]+)\\n");
    REQUIRE(std::regex_search(all, m, omp));
    const int threads = std::stoi(m[1]);
    CHECK(threads >= 1);
    CHECK(threads <= std::max(1, hw / 3));
  }
}

TEST_CASE("kiln-run numbers the ranks of node 1 of 2 after node 0's", "[distributed][kiln-run]") {
  const auto env = test_env({{"OMP_NUM_THREADS", "5"}}, {});
  KilnRun run(
      {"--nnodes", "2", "--node_rank=1", "--nproc_per_node", "3", "--master-addr", "10.1.2.3", kWorker, "launcher_env"},
      env);
  run.finish(60);
  INFO(run.describe());
  REQUIRE(run.exit_code == 0);
  const std::string all = "\n" + run.out;
  for (int l = 0; l < 3; ++l) {
    const std::string p = "\n[rank " + std::to_string(3 + l) + "] ";
    CHECK(KilnRun::count_occurrences(all, p + "RANK=" + std::to_string(3 + l) + "\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "WORLD_SIZE=6\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "LOCAL_RANK=" + std::to_string(l) + "\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "LOCAL_WORLD_SIZE=3\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "GROUP_RANK=1\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "MASTER_ADDR=10.1.2.3\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "MASTER_PORT=29500\n") == 1);
    CHECK(KilnRun::count_occurrences(all, p + "OMP_NUM_THREADS=5\n") == 1);  // the user's
  }
  CHECK(run.out.find("[rank 0]") == std::string::npos);
}

TEST_CASE("kiln-run finds the program in PATH", "[distributed][kiln-run]") {
  KilnRun run({"--nproc-per-node", "2", "--", "sh", "-c", "echo rank $RANK of $WORLD_SIZE"});
  run.finish(60);
  INFO(run.describe());
  REQUIRE(run.exit_code == 0);
  CHECK(KilnRun::count_occurrences(run.out, "[rank 0] rank 0 of 2\n") == 1);
  CHECK(KilnRun::count_occurrences(run.out, "[rank 1] rank 1 of 2\n") == 1);
}

TEST_CASE("kiln-run relays every line of every rank whole and prefixed", "[distributed][kiln-run]") {
  const int kLines = 2000;
  KilnRun run({"--nproc-per-node", "3", kWorker, "launcher_lines", std::to_string(kLines)});
  run.finish(120);
  INFO(run.describe().substr(0, 4000));
  REQUIRE(run.exit_code == 0);

  // stdout: per rank, lines 0..kLines-1 in order, then the unterminated tail (given a newline)
  std::vector<int> next(3, 0);
  std::vector<bool> tail(3, false);
  const std::regex out_line(R"(\[rank ([0-9])\] out ([0-9]+) of rank ([0-9]))");
  const std::regex tail_line(R"(\[rank ([0-9])\] tail of rank ([0-9]))");
  int bad = 0;
  for (const auto& line : lines_of(run.out)) {
    std::smatch m;
    if (std::regex_match(line, m, out_line) && m[1] == m[3]) {
      const int r = std::stoi(m[1]);
      if (tail[r] || std::stoi(m[2]) != next[r]) ++bad;
      ++next[r];
    } else if (std::regex_match(line, m, tail_line) && m[1] == m[2]) {
      tail[std::stoi(m[1])] = true;
    } else {
      ++bad;
      UNSCOPED_INFO("unexpected stdout line: " << line);
    }
  }
  CHECK(bad == 0);
  CHECK(run.out.back() == '\n');
  for (int r = 0; r < 3; ++r) {
    CHECK(next[r] == kLines);
    CHECK(tail[r]);
  }

  // stderr: kLines/10 lines per rank, in order, nothing else
  std::vector<int> next_err(3, 0);
  const std::regex err_line(R"(\[rank ([0-9])\] err ([0-9]+) of rank ([0-9]))");
  int bad_err = 0;
  for (const auto& line : lines_of(run.err)) {
    std::smatch m;
    if (std::regex_match(line, m, err_line) && m[1] == m[3] && std::stoi(m[2]) == next_err[std::stoi(m[1])]) {
      ++next_err[std::stoi(m[1])];
    } else {
      ++bad_err;
    }
  }
  CHECK(bad_err == 0);
  for (int r = 0; r < 3; ++r) CHECK(next_err[r] == kLines / 10);
}

TEST_CASE("kiln-run --no-prefix passes the lines through as they are", "[distributed][kiln-run]") {
  KilnRun run({"--no-prefix", "--nproc-per-node=2", kWorker, "launcher_lines", "50"});
  run.finish(60);
  INFO(run.describe());
  REQUIRE(run.exit_code == 0);
  CHECK(run.out.find("[rank") == std::string::npos);
  const auto lines = lines_of(run.out);
  CHECK(lines.size() == 2 * 50 + 2);
  for (int r = 0; r < 2; ++r) {
    CHECK(KilnRun::count_occurrences(run.out, "tail of rank " + std::to_string(r) + "\n") == 1);
    CHECK(KilnRun::count_occurrences(run.out, "out 49 of rank " + std::to_string(r) + "\n") == 1);
  }
}

TEST_CASE("kiln-run stops the other ranks when one exits with 3 and exits with 3", "[distributed][kiln-run]") {
  // a kill timeout longer than the test's bound: the sleeping rank must end by SIGTERM
  KilnRun run({"--nproc-per-node", "2", "--kill-timeout", "50", kWorker, "launcher_fail", "0", "3", "300"});
  run.finish(60);
  INFO(run.describe());
  check_ended(run, 3, 30);
  CHECK(run.err.find("kiln-run: rank 0 exited with status 3; stopping the other ranks") != std::string::npos);
  CHECK(run.out.find("[rank 1] rank 1 got SIGTERM") != std::string::npos);
  CHECK(run.err.find("SIGKILL") == std::string::npos);
  check_ranks_gone(run, 1);
}

TEST_CASE("kiln-run SIGKILLs a rank that ignores SIGTERM after the kill timeout", "[distributed][kiln-run]") {
  KilnRun run(
      {"--nproc-per-node", "3", "--kill-timeout", "1", kWorker, "launcher_fail", "2", "3", "300", "ignore_term"});
  run.finish(60);
  INFO(run.describe());
  check_ended(run, 3, 30);
  CHECK(run.err.find("sending SIGKILL to rank(s) 0, 1 still running") != std::string::npos);
  check_ranks_gone(run, 2);
}

TEST_CASE("kiln-run exits with 137 when a rank is killed by SIGKILL", "[distributed][kiln-run]") {
  KilnRun run({"--nproc-per-node", "2", kWorker, "launcher_fail", "1", "-9", "300"});
  run.finish(60);
  INFO(run.describe());
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.exit_code == 137);
  CHECK(run.err.find("kiln-run: rank 1 was killed by signal SIGKILL; stopping the other ranks") != std::string::npos);
  CHECK(run.out.find("[rank 0] rank 0 got SIGTERM") != std::string::npos);
}

TEST_CASE("kiln-run forwards SIGTERM and SIGINT to every rank", "[distributed][kiln-run]") {
  for (int sig : {SIGTERM, SIGINT}) {
    const std::string name = sig == SIGTERM ? "SIGTERM" : "SIGINT";
    SECTION(name) {
      KilnRun run({"--nproc-per-node", "3", kWorker, "launcher_wait_signal"});
      const bool ready = run.wait_for_lines(" ready pid=", 3, 60);
      if (ready) run.send(sig);
      run.finish(60);
      INFO(run.describe());
      REQUIRE(ready);
      REQUIRE_FALSE(run.timed_out);
      for (int r = 0; r < 3; ++r) {
        const std::string rs = std::to_string(r);
        CHECK(run.out.find("[rank " + rs + "] rank " + rs + " got " + name + "\n") != std::string::npos);
      }
      // kiln-run ends by the signal it was sent, as a program that did not catch it would
      CHECK(run.signal == sig);
      CHECK(run.err.find("kiln-run: got " + name + "; forwarding it to the ranks") != std::string::npos);
      check_ranks_gone(run);
    }
  }
}

TEST_CASE("kiln-run SIGKILLs the ranks at a second SIGTERM", "[distributed][kiln-run]") {
  // no rank fails (there is no rank 99) and every one ignores SIGTERM
  KilnRun run(
      {"--nproc-per-node", "2", "--kill-timeout", "50", kWorker, "launcher_fail", "99", "0", "0", "ignore_term"});
  const bool ready = run.wait_for_lines(" ready pid=", 2, 60);
  if (ready) {
    run.send(SIGTERM);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    run.send(SIGTERM);
  }
  run.finish(40);
  INFO(run.describe());
  REQUIRE(ready);
  REQUIRE_FALSE(run.timed_out);
  CHECK(run.signal == SIGTERM);
  CHECK(run.err.find("kiln-run: got SIGTERM again; killing the ranks") != std::string::npos);
  check_ranks_gone(run);
}

TEST_CASE("kiln-run splits a line longer than 64 KiB into prefixed pieces", "[distributed][kiln-run]") {
  // 150000 bytes in one line, then a line of exactly 64 KiB, which stays whole
  KilnRun run({"sh", "-c",
               "head -c 150000 /dev/zero | tr '\\0' x; echo; echo after; "
               "head -c 65536 /dev/zero | tr '\\0' y; echo"});
  run.finish(60);
  INFO(run.describe().substr(0, 2000));
  REQUIRE(run.exit_code == 0);
  const auto lines = lines_of(run.out);
  REQUIRE(lines.size() == 5);
  CHECK(lines[0] == "[rank 0] " + std::string(65536, 'x'));
  CHECK(lines[1] == "[rank 0] " + std::string(65536, 'x'));
  CHECK(lines[2] == "[rank 0] " + std::string(150000 - 2 * 65536, 'x'));
  CHECK(lines[3] == "[rank 0] after");
  CHECK(lines[4] == "[rank 0] " + std::string(65536, 'y'));
}

TEST_CASE("kiln-run does not wait long for output a rank's leftover process holds open", "[distributed][kiln-run]") {
  // the background sleep keeps the rank's stdout pipe open after the rank itself exited
  KilnRun run({"sh", "-c", "sleep 20 & echo started"});
  run.finish(60);
  INFO(run.describe());
  check_ended(run, 0, 15);
  CHECK(run.out == "[rank 0] started\n");
}

TEST_CASE("kiln-run exits with 127 when the program cannot be run", "[distributed][kiln-run]") {
  KilnRun run({"--nproc-per-node", "2", "/nonexistent/kiln-program", "x"});
  run.finish(60);
  INFO(run.describe());
  CHECK(run.exit_code == 127);
  CHECK(run.err.find("cannot run '/nonexistent/kiln-program'") != std::string::npos);
  CHECK(run.err.find("exited with status 127") != std::string::npos);
}

TEST_CASE("kiln-run rejects a bad command line with status 2", "[distributed][kiln-run]") {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nproc-per-node", "0", "prog"}, "--nproc-per-node must be in 1.."},
      {{"--nproc-per-node=abc", "prog"}, "--nproc-per-node needs an integer, got 'abc'"},
      {{"--nnodes", "2", "--node-rank", "2", "prog"}, "--node-rank 2 is not below --nnodes 2"},
      {{"--master-port", "70000", "prog"}, "--master-port must be in 1..65535"},
      {{"--master_port=0", "prog"}, "--master-port must be in 1..65535"},
      {{"--nproc-per-node", "2"}, "no program to run"},
      {{}, "no program to run"},
      {{"--frobnicate", "prog"}, "unknown option '--frobnicate'"},
      {{"--nnodes"}, "--nnodes needs a value"},
  };
  for (const auto& [args, message] : cases) {
    KilnRun run(args);
    run.finish(30);
    INFO(run.describe());
    CHECK(run.exit_code == 2);
    CHECK(run.err.find("kiln-run: " + message) != std::string::npos);
  }
  KilnRun help({"--help"});
  help.finish(30);
  INFO(help.describe());
  CHECK(help.exit_code == 0);
  CHECK(help.out.find("usage: kiln-run") != std::string::npos);
}
