// bench_dist_allreduce: kiln's gloo all_reduce (f32, Sum) against a raw TCP ring pass-through
// between the same processes (docs/distributed.md, "What is measured").
//
//   build-db/bin/bench_dist_allreduce [--ranks 2,3,4] [--rounds 5] [--max-mb 64]
//   build-db/bin/kiln-run --nproc-per-node 2 build-db/bin/bench_dist_allreduce   # one run of N
//
// The peer moves exactly the bytes a ring all-reduce must (2(N-1) steps of bytes/N to the next
// rank while receiving from the previous) with plain sockets and no reduction arithmetic: an
// upper bound for any ring on this transport. busbw = algbw * 2(N-1)/N as in nccl-tests.
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include <kiln/kiln.h>

#include "bench/distributed/dist_bench_util.h"
#include "kiln/distributed/store/store.h"

namespace dist = kiln::distributed;
using namespace kiln::bench::dist;

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "%s: %s\n", what, std::strerror(errno));
  std::exit(1);
}

// Two one-way connections: to the next rank (send) and from the previous one (receive).
struct Ring {
  int to_next = -1, from_prev = -1;
};

Ring connect_ring(int rank, int world) {
  int lfd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof a) || ::listen(lfd, 4)) die("listen");
  socklen_t len = sizeof a;
  ::getsockname(lfd, reinterpret_cast<sockaddr*>(&a), &len);
  auto store = dist::default_store();
  store->set("rawring/" + std::to_string(rank), std::to_string(ntohs(a.sin_port)));
  int next = (rank + 1) % world;
  std::string key = "rawring/" + std::to_string(next);
  store->wait({key}, std::chrono::seconds(60));
  sockaddr_in b = a;
  b.sin_port = htons(uint16_t(std::stoi(store->get_string(key))));
  Ring ring;
  ring.to_next = ::socket(AF_INET, SOCK_STREAM, 0);
  // connect completes from the listen backlog, so connecting before accepting cannot deadlock.
  if (::connect(ring.to_next, reinterpret_cast<sockaddr*>(&b), sizeof b)) die("connect");
  ring.from_prev = ::accept(lfd, nullptr, nullptr);
  if (ring.from_prev < 0) die("accept");
  ::close(lfd);
  int one = 1;
  for (int fd : {ring.to_next, ring.from_prev}) {
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  }
  return ring;
}

// Sends `sn` bytes to the next rank while receiving `rn` from the previous one (one thread,
// poll), as one ring step does.
void exchange(const Ring& ring, const char* sbuf, size_t sn, char* rbuf, size_t rn) {
  size_t sent = 0, got = 0;
  while (sent < sn || got < rn) {
    pollfd p[2] = {{ring.to_next, short(sent < sn ? POLLOUT : 0), 0},
                   {ring.from_prev, short(got < rn ? POLLIN : 0), 0}};
    if (::poll(p, 2, 60000) <= 0) die("poll");
    if (p[0].revents & (POLLOUT | POLLERR)) {
      ssize_t k = ::send(ring.to_next, sbuf + sent, sn - sent, MSG_NOSIGNAL);
      if (k < 0 && errno != EAGAIN) die("send");
      if (k > 0) sent += size_t(k);
    }
    if (p[1].revents & (POLLIN | POLLERR | POLLHUP)) {
      ssize_t k = ::recv(ring.from_prev, rbuf + got, rn - got, 0);
      if (k == 0) die("peer closed");
      if (k < 0 && errno != EAGAIN) die("recv");
      if (k > 0) got += size_t(k);
    }
  }
}

// 2(N-1) ring steps of the chunks a ring all-reduce moves; received chunks land in rbuf and are
// not reduced. Returns the chunk index received last (for the check).
int ring_pass(const Ring& ring, const char* buf, char* rbuf, size_t bytes, int rank, int world) {
  size_t chunk = (bytes + world - 1) / world;
  auto off = [&](int i) { return std::min(bytes, size_t(i) * chunk); };
  auto len = [&](int i) { return std::min(bytes, off(i) + chunk) - off(i); };
  int last = 0;
  for (int s = 0; s < 2 * (world - 1); ++s) {
    int si = ((rank - s) % world + world) % world;
    int ri = ((rank - s - 1) % world + world) % world;
    exchange(ring, buf + off(si), len(si), rbuf + off(ri), len(ri));
    last = ri;
  }
  return last;
}

// Values that stay exact-ish under repeated Sum: rank r holds (r+1)*(1 + i%13).
void fill(float* x, int64_t n, int rank) {
  for (int64_t i = 0; i < n; ++i) x[i] = float((rank + 1) * (1 + i % 13));
}

int rank_main(int rounds, double max_mb) {
  dist::init_process_group("gloo");
  const int rank = dist::rank(), world = dist::world_size();
  Ring ring = connect_ring(rank, world);
  const double bus = 2.0 * (world - 1) / world;
  const double sum_ranks = world * (world + 1) / 2.0;
  std::vector<size_t> sizes = {4, 64, 512, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20};
  if (rank == 0) {
    std::printf(
        "all_reduce f32 Sum, gloo, %d ranks on loopback, %d alternating rounds "
        "(median [min-max] of the per-round means)\n",
        world, rounds);
    std::printf("%8s %24s %24s %20s %20s %14s\n", "size", "kiln us", "raw ring us", "kiln busbw GB/s", "raw busbw GB/s",
                "kiln/raw");
  }
  for (size_t bytes : sizes) {
    if (bytes > max_mb * (1 << 20)) break;
    const int64_t n = int64_t(bytes / 4);
    const int iters = bytes >= (64u << 20) ? 4 : bytes >= (16u << 20) ? 8 : 30;
    kiln::Tensor t = kiln::empty({n});
    std::vector<char> buf(bytes, char(rank + 1)), rbuf(bytes);
    std::vector<double> tk, tr;
    for (int round = 0; round < rounds; ++round) {
      // kiln: fill, time `iters` all-reduces, then check the result of all of them.
      fill(t.data_ptr<float>(), n, rank);
      dist::barrier();
      double a = now_s();
      for (int i = 0; i < iters; ++i) dist::all_reduce(t);
      tk.push_back((now_s() - a) / iters);
      const float* x = t.data_ptr<float>();
      const double growth = sum_ranks * std::pow(double(world), iters - 1);
      for (int64_t i = 0; i < n; ++i) {
        double want = growth * (1 + i % 13);
        if (std::fabs(x[i] - want) > 1e-4 * want) {
          std::fprintf(stderr, "VALIDATION FAILED: all_reduce of %zu bytes, element %lld = %g, want %g\n", bytes,
                       (long long)i, double(x[i]), want);
          return 1;
        }
      }
      // raw ring: same bytes, same processes.
      dist::barrier();
      a = now_s();
      int last = 0;
      for (int i = 0; i < iters; ++i) last = ring_pass(ring, buf.data(), rbuf.data(), bytes, rank, world);
      tr.push_back((now_s() - a) / iters);
      size_t chunk = (bytes + world - 1) / world, o = std::min(bytes, size_t(last) * chunk);
      char want = char((rank + world - 1) % world + 1);
      if (o < bytes && rbuf[o] != want) {
        std::fprintf(stderr, "VALIDATION FAILED: raw ring received %d, want %d\n", rbuf[o], want);
        return 1;
      }
    }
    if (rank == 0) {
      Spread k = spread(tk), r = spread(tr);
      auto bw = [&](double s) { return bytes / s * bus / 1e9; };
      std::vector<double> ratio;
      for (int i = 0; i < rounds; ++i) ratio.push_back(tr[i] / tk[i]);
      Spread q = spread(ratio);
      char c1[64], c2[64], c3[64], c4[64], c5[64];
      std::snprintf(c1, 64, "%.0f [%.0f-%.0f]", k.median * 1e6, k.lo * 1e6, k.hi * 1e6);
      std::snprintf(c2, 64, "%.0f [%.0f-%.0f]", r.median * 1e6, r.lo * 1e6, r.hi * 1e6);
      std::snprintf(c3, 64, "%.3f [%.3f-%.3f]", bw(k.median), bw(k.hi), bw(k.lo));
      std::snprintf(c4, 64, "%.3f [%.3f-%.3f]", bw(r.median), bw(r.hi), bw(r.lo));
      std::snprintf(c5, 64, "%.2f [%.2f-%.2f]", q.median, q.lo, q.hi);
      std::printf("%8s %24s %24s %20s %20s %14s\n", human_bytes(double(bytes)).c_str(), c1, c2, c3, c4, c5);
      std::fflush(stdout);
    }
  }
  ::close(ring.to_next);
  ::close(ring.from_prev);
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> ranks = {2, 3, 4};
  int rounds = 5;
  double max_mb = 64;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--rounds") rounds = std::atoi(argv[i + 1]);
    else if (a == "--max-mb") max_mb = std::atof(argv[i + 1]);
    else if (a == "--ranks") {
      ranks.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string x; std::getline(ss, x, ',');) ranks.push_back(std::stoi(x));
    } else {
      std::fprintf(stderr, "usage: %s [--ranks 2,3,4] [--rounds 5] [--max-mb 64]\n", argv[0]);
      return 2;
    }
  }
  if (is_rank_process()) return rank_main(rounds, max_mb);
  std::vector<std::string> args = {"--rounds", std::to_string(rounds), "--max-mb", std::to_string(max_mb)};
  for (int n : ranks) {
    std::printf("%s\n", run_ranks(n, args, 1200).c_str());
    std::fflush(stdout);
  }
  return 0;
}
