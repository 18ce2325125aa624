// DataLoader throughput (docs/guide.md, speed-up 2): images per second for workers 0, 1, 2, 4 with pinned
// staging on and off, on Fashion-MNIST (ToFloat + Normalize, fused into collation) and on a
// heavier synthetic CIFAR-like set (random crop with padding + horizontal flip on 3x32x32, then
// ToFloat + Normalize). Prints each ratio against workers(0) measured in the same run.
// No training step runs here: this is the loader alone, i.e. the most it can deliver.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include <kiln/data/data.h>
#include <kiln/kiln.h>

namespace D = kiln::data;

namespace {

// n random 3x32x32 uint8 images, image i labelled i % 10: a CIFAR-like set held in memory.
D::TensorDataset synthetic(int64_t n) {
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels[static_cast<size_t>(i)] = i % 10;
  return D::TensorDataset(kiln::randint(0, 256, {n, 3, 32, 32}).to(kiln::DType::U8), kiln::tensor(labels));
}

// Images per second over `epochs` epochs (after one warm-up epoch), and the consumer wait share.
std::pair<double, double> measure(const D::Dataset& ds, D::LoaderOptions opt, int epochs) {
  D::DataLoader loader(ds, opt);
  double check = 0;
  for (auto& b : loader) check += b.input.numel();  // warm-up: staging pool, page faults
  auto t0 = std::chrono::steady_clock::now();
  int64_t n = 0;
  double wait = 0, total = 0;
  for (int e = 0; e < epochs; ++e) {
    for (auto& b : loader) n += b.size();
    wait += loader.stats().wait_seconds;
    total += loader.stats().epoch_seconds;
  }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (check <= 0) std::exit(1);
  return {double(n) / s, total > 0 ? wait / total : 0.0};
}

void run(const char* title, const D::Dataset& ds, const D::Compose& tf, int64_t batch, int epochs) {
  std::printf("\n%s: %lld samples, batch %lld, %d timed epochs, %s\n", title, static_cast<long long>(ds.size()),
              static_cast<long long>(batch), epochs, tf.str().c_str());
  std::printf("  %-8s %-6s %14s %10s\n", "workers", "pinned", "images/s", "vs w=0");
  for (bool pin : {false, true}) {
    double base = 0;
    for (int w : {0, 1, 2, 4}) {
      auto opt = D::LoaderOptions().batch_size(batch).shuffle(true).seed(1).workers(w).pin_memory(pin).transform(tf);
      auto [ips, wait] = measure(ds, opt, epochs);
      if (w == 0) base = ips;
      std::printf("  %-8d %-6s %14.0f %9.2fx\n", w, pin ? "yes" : "no", ips, ips / base);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int epochs = argc > 1 ? std::atoi(argv[1]) : 2;
  std::printf(
      "bench_loader: %u hardware threads; CUDA %s (pinned = page-locked only with a "
      "device)\n",
      std::thread::hardware_concurrency(), kiln::cuda::is_available() ? "available" : "not available");
  // Correctness before speed: a fused batch equals the transforms run one by one.
  {
    const D::TensorDataset small = synthetic(8);
    auto tf = D::Compose(D::RandomCrop(32, 4), D::RandomHorizontalFlip(), D::ToFloat(),
                         D::Normalize({0.49, 0.48, 0.45}, {0.25, 0.24, 0.26}));
    D::DataLoader l(small, D::LoaderOptions().batch_size(8).seed(3).workers(2).transform(tf));
    auto b = *l.begin();
    double err = 0;
    for (int64_t r = 0; r < 8; ++r) {
      D::Example ex = small.get(b.indices[static_cast<size_t>(r)]);
      D::DataRng rng(3, 0, static_cast<uint64_t>(b.indices[static_cast<size_t>(r)]), D::RngStream::Transform);
      tf.apply(ex, rng);
      err = std::max(err, (b.input[r] - ex.input).abs().max().item());
    }
    if (err > 1e-4) {
      std::fprintf(stderr, "VALIDATION FAILED: fused collation differs (max error %g)\n", err);
      return 1;
    }
  }
  try {
    D::FashionMNIST fm;
    run("Fashion-MNIST train", fm, D::Compose(D::ToFloat(), D::Normalize({0.2860}, {0.3530})), 256, epochs);
  } catch (const kiln::Error& e) {
    std::printf("\nFashion-MNIST skipped: %s\n", e.what());
  }
  kiln::manual_seed(0);
  const D::TensorDataset syn = synthetic(20000);
  run("synthetic 3x32x32 (CIFAR-like)", syn,
      D::Compose(D::RandomCrop(32, 4), D::RandomHorizontalFlip(), D::ToFloat(),
                 D::Normalize({0.49, 0.48, 0.45}, {0.25, 0.24, 0.26})),
      256, epochs);
  return 0;
}
