// bench_dist_ddp_overlap: how much of DDP's gradient all-reduce hides behind backward, and
// weak scaling (docs/distributed.md, "What is measured").
//
//   build-db/bin/bench_dist_ddp_overlap [--ranks 1,2,4] [--rounds 3] [--inner 3] [--iters 5]
//       [--layers 8] [--params 1048576] [--sleep-ms 10] [--bucket-mb 4] [--bucket-view 0|1]
//
// The model is K layers of P parameters whose backward is a sleep of S ms plus writing a
// P-element gradient: the backward "compute" takes no CPU, so on a 2-core machine the
// measurement is of the communication and its overlap, not of two ranks fighting for cores.
// Per job of N ranks, in alternating inner rounds (medians of `iters` iterations each):
//   (a) forward + backward of the plain model (no DDP, no communication)
//   (b) one all-reduce (Avg) of all gradients packed in one buffer (the naive approach, after
//       backward), timed alone
//   (c) forward + backward of the DDP-wrapped model (buckets all-reduced during backward)
// hidden fraction = 1 - (c - a) / b; weak scaling = c at N=1 / c at N (same per-rank work).
#include <cmath>
#include <sstream>
#include <thread>

#include <kiln/kiln.h>

#include "bench/distributed/dist_bench_util.h"

namespace dist = kiln::distributed;
using namespace kiln::bench::dist;
using kiln::Tensor;

namespace {

struct Config {
  int layers = 8;
  int64_t params = 1 << 20;
  double sleep_ms = 10;
  double bucket_mb = 4;
  bool bucket_view = false;  // gradient_as_bucket_view: no copy of the averages back into .grad
  int iters = 5, inner = 3;
};

// One layer: the identity forward, a backward that sleeps and returns a gradient for w of
// (rank + 1) * (index + 1) everywhere, so the DDP average is known: (N + 1) / 2 * (index + 1).
class SleepLayer : public kiln::nn::Module {
 public:
  SleepLayer(int64_t params, int index, int rank, double sleep_ms) : index_(index), rank_(rank), sleep_ms_(sleep_ms) {
    w_ = register_parameter("w", kiln::zeros({params}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor y;
    {
      kiln::NoGradGuard ng;
      y = x.clone();
    }
    if (kiln::autograd::any_requires_grad({&x, &w_})) {
      const int64_t n = w_.numel();
      const double value = double(rank_ + 1) * (index_ + 1);
      const double ms = sleep_ms_;
      kiln::autograd::record_function("SleepBackward", {&x, &w_}, {&y},
                                      [n, value, ms](const kiln::autograd::TensorList& g) {
                                        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(ms));
                                        return kiln::autograd::TensorList{g[0], kiln::full({n}, value)};
                                      });
    }
    return y;
  }
  int index() const { return index_; }
  const Tensor& weight() const { return w_; }

 private:
  Tensor w_;
  int index_, rank_;
  double sleep_ms_;
};

class SleepNet : public kiln::nn::Module {
 public:
  SleepNet(const Config& c, int rank) {
    for (int k = 0; k < c.layers; ++k) {
      layers_.push_back(
          register_module("l" + std::to_string(k), std::make_shared<SleepLayer>(c.params, k, rank, c.sleep_ms)));
    }
  }
  Tensor forward(const Tensor& x) override {
    Tensor y = x;
    for (auto& l : layers_) y = l->forward(y);
    return y;
  }
  std::vector<std::shared_ptr<SleepLayer>> layers_;
};

double median_of(std::vector<double> v) { return spread(std::move(v)).median; }

int rank_main(const Config& c) {
  dist::init_process_group("gloo");
  const int rank = dist::rank(), world = dist::world_size();
  auto plain = std::make_shared<SleepNet>(c, rank);
  auto net = std::make_shared<SleepNet>(c, rank);
  dist::DistributedDataParallel ddp(net, dist::DistributedDataParallelOptions()
                                             .bucket_cap_mb(c.bucket_mb)
                                             .first_bucket_mb(c.bucket_mb)
                                             .gradient_as_bucket_view(c.bucket_view));
  const Tensor x = kiln::ones({1});

  auto time_iters = [&](const std::function<void()>& fn) {
    std::vector<double> t;
    for (int i = 0; i < c.iters; ++i) {
      dist::barrier();  // start every rank together; not timed
      double a = now_s();
      fn();
      t.push_back(now_s() - a);
    }
    return median_of(t);
  };

  // One untimed DDP iteration first: the buckets are rebuilt after it (docs/data_parallel.md).
  ddp.zero_grad();
  ddp.forward(x).sum().backward();

  for (int round = 0; round < c.inner; ++round) {
    double ta = time_iters([&] {
      plain->zero_grad();
      plain->forward(x).sum().backward();
    });
    std::vector<Tensor> grads;
    for (auto& l : plain->layers_) grads.push_back(l->weight().grad());
    Tensor flat = kiln::cat(grads);
    double tb = time_iters([&] { dist::all_reduce(flat, dist::ReduceOp::Avg); });
    double tc = time_iters([&] {
      ddp.zero_grad();
      ddp.forward(x).sum().backward();
    });
    // The DDP gradients must be the average over ranks of each rank's gradient.
    for (auto& l : net->layers_) {
      const double want = (world + 1) / 2.0 * (l->index() + 1);
      double err = kiln::abs(l->weight().grad() - want).max().item<double>();
      if (!(err <= 1e-5 * want)) {
        std::fprintf(stderr, "VALIDATION FAILED: DDP gradient of layer %d off by %g (want %g)\n", l->index(), err,
                     want);
        return 1;
      }
    }
    if (rank == 0) std::printf("ROUND %d %.6f %.6f %.6f\n", world, ta, tb, tc);
  }
  dist::destroy_process_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Config c;
  std::vector<int> ranks = {1, 2, 4};
  int rounds = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--layers") c.layers = std::stoi(v);
    else if (a == "--params") c.params = std::stoll(v);
    else if (a == "--sleep-ms") c.sleep_ms = std::stod(v);
    else if (a == "--bucket-mb") c.bucket_mb = std::stod(v);
    else if (a == "--bucket-view") c.bucket_view = v == "1";
    else if (a == "--iters") c.iters = std::stoi(v);
    else if (a == "--inner") c.inner = std::stoi(v);
    else if (a == "--rounds") rounds = std::stoi(v);
    else if (a == "--ranks") {
      ranks.clear();
      std::stringstream ss(v);
      for (std::string x; std::getline(ss, x, ',');) ranks.push_back(std::stoi(x));
    } else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  if (is_rank_process()) return rank_main(c);

  std::vector<std::string> args = {
      "--layers",      std::to_string(c.layers),   "--params",    std::to_string(c.params),
      "--sleep-ms",    std::to_string(c.sleep_ms), "--bucket-mb", std::to_string(c.bucket_mb),
      "--bucket-view", c.bucket_view ? "1" : "0",  "--iters",     std::to_string(c.iters),
      "--inner",       std::to_string(c.inner)};
  std::printf(
      "DDP overlap: %d layers x %lld f32 parameters (%.1f MB of gradients), backward "
      "sleeps %.1f ms per layer, %.1f MB buckets; %d rounds over N in rotating order, "
      "%d inner a/b/c rounds each, median of %d iterations per value\n",
      c.layers, (long long)c.params, c.layers * c.params * 4.0 / (1 << 20), c.sleep_ms, c.bucket_mb, rounds, c.inner,
      c.iters);
  if (c.bucket_view) std::printf("gradient_as_bucket_view on\n");
  std::map<int, std::vector<double>> ta, tb, tc, hidden;
  for (int round = 0; round < rounds; ++round) {
    for (size_t j = 0; j < ranks.size(); ++j) {
      int n = ranks[(j + round) % ranks.size()];  // rotate so no N always runs first
      std::stringstream out(run_ranks(n, args, 600));
      for (std::string line; std::getline(out, line);) {
        int w;
        double a, b, cc;
        if (std::sscanf(line.c_str(), "ROUND %d %lf %lf %lf", &w, &a, &b, &cc) != 4) continue;
        ta[w].push_back(a);
        tb[w].push_back(b);
        tc[w].push_back(cc);
        if (w > 1) hidden[w].push_back(1 - (cc - a) / b);
      }
    }
  }
  auto show = [](const std::vector<double>& v, double scale, const char* fmt) {
    Spread s = spread(v);
    char buf[96];
    std::snprintf(buf, sizeof buf, fmt, s.median * scale, s.lo * scale, s.hi * scale);
    return std::string(buf);
  };
  std::printf("%3s %22s %22s %22s %22s\n", "N", "(a) backward ms", "(b) all-reduce ms", "(c) DDP ms",
              "hidden 1-(c-a)/b");
  for (int n : ranks) {
    std::printf("%3d %22s %22s %22s %22s\n", n, show(ta[n], 1e3, "%.1f [%.1f-%.1f]").c_str(),
                show(tb[n], 1e3, "%.1f [%.1f-%.1f]").c_str(), show(tc[n], 1e3, "%.1f [%.1f-%.1f]").c_str(),
                n > 1 ? show(hidden[n], 1, "%.2f [%.2f-%.2f]").c_str() : "-");
  }
  if (tc.count(1)) {
    const double t1 = spread(tc[1]).median;
    for (int n : ranks) {
      if (n == 1) continue;
      std::vector<double> eff;
      for (double t : tc[n]) eff.push_back(t1 / t);
      std::printf("weak scaling t_1/t_%d (DDP iteration, same per-rank work): %s\n", n,
                  show(eff, 1, "%.2f [%.2f-%.2f]").c_str());
    }
  }
  return 0;
}
