#include "kiln/data/loader.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <map>
#include <optional>
#include <mutex>
#include <thread>

#include "kiln/cuda/cuda.h"
#include "kiln/core/generator.h"
#include "kiln/core/profiler.h"
#include "kiln/cuda/stream.h"
#include "kiln/data/staging.h"

namespace kiln::data {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A batch built by a worker (or its failure).
struct Built {
  Batch batch;
  std::exception_ptr error;
  std::shared_ptr<cuda::Event> copied;  // set once its device copy has been issued
};
}  // namespace

struct DataLoader::Impl {
  std::shared_ptr<const Dataset> owned;
  const Dataset* ds = nullptr;
  LoaderOptions opt;
  uint64_t seed = 0;
  std::shared_ptr<const BatchSampler> batcher;
  size_t prefix = 0;  // transforms run per sample; the rest is fused into collation
  CollateOptions collate_opt;
  std::unique_ptr<StagingPool> pool;
  int prefetch = 1;

  // CUDA path (device().is_cuda() && pin_memory)
  std::optional<Stream> copy_stream;

  // epoch state
  int64_t next_epoch = 0;
  int64_t epoch = -1;
  bool running = false;
  std::vector<std::vector<int64_t>> batches;
  int64_t cached_epoch = -1;
  std::vector<std::vector<int64_t>> cached;
  Clock::time_point epoch_start;
  LoaderStats stats;
  std::vector<LoaderStats> history;

  // shared with the workers
  std::mutex mu;
  std::condition_variable cv_work, cv_ready;
  std::map<int64_t, Built> ready;
  int64_t claim = 0, deliver = 0;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  std::unique_ptr<Built> ahead;  // batch `deliver` with its device copy already issued

  Impl(const Dataset& d, LoaderOptions o) : ds(&d), opt(std::move(o)) {
    const char* op = "DataLoader";
    KILN_CHECK(opt.batch_size() >= 1, op, ": batch_size must be >= 1, got ", opt.batch_size());
    KILN_CHECK(opt.workers() >= 0, op, ": workers must be >= 0, got ", opt.workers());
    KILN_CHECK(opt.prefetch() >= 0, op, ": prefetch must be >= 0, got ", opt.prefetch());
    KILN_CHECK(opt.timeout() >= 0, op, ": timeout must be >= 0 ms, got ", opt.timeout());
    KILN_CHECK(ds->size() >= 0, op, ": dataset size is negative");
    if (opt.device().is_cuda()) cuda::check_device(opt.device(), "DataLoader");
    seed = opt.seed() ? *opt.seed() : default_generator(Device::cpu()).seed();
    if (opt.batch_sampler()) {
      batcher = opt.batch_sampler();
    } else {
      std::shared_ptr<const Sampler> s = opt.sampler();
      if (!s) {
        if (opt.shuffle()) s = std::make_shared<RandomSampler>(ds->size(), seed);
        else s = std::make_shared<SequentialSampler>(ds->size());
      }
      batcher = std::make_shared<FixedBatchSampler>(s, opt.batch_size(), opt.drop_last());
    }
    Conversion fused_conversion;
    prefix = opt.transform().split_fused(&fused_conversion);
    collate_opt.conversion(fused_conversion)
        .pad_value(opt.pad_value())
        .target_pad_value(opt.target_pad_value())
        .always_mask(opt.padding_mask());
    prefetch = opt.prefetch() > 0 ? opt.prefetch() : std::max(2 * opt.workers(), 1);
    pool = std::make_unique<StagingPool>(opt.pin_memory());
    if (opt.device().is_cuda() && opt.pin_memory()) copy_stream = cuda::get_stream_from_pool(opt.device().index);
  }

  ~Impl() { stop_workers(); }

  const std::vector<std::vector<int64_t>>& batches_for(int64_t e) {
    if (cached_epoch != e) {
      cached = batcher->batches(e);
      cached_epoch = e;
    }
    return cached;
  }

  // ---- building (workers, or the caller with workers(0))
  Built build(int64_t b) const {
    profiler::Range range("load batch");  // kiln/core/profiler.h: on the worker's own track
    Built out;
    const std::vector<int64_t>& idx = batches[static_cast<size_t>(b)];
    std::vector<Example> samples;
    samples.reserve(idx.size());
    int64_t current = -1;
    try {
      for (int64_t i : idx) {
        if (stop.load(std::memory_order_relaxed)) return out;  // shutting down: result unused
        current = i;
        KILN_CHECK(i >= 0 && i < ds->size(), "index out of range [0, ", ds->size(), ")");
        Example ex = ds->get(i);
        if (prefix > 0) {
          DataRng rng(seed, static_cast<uint64_t>(epoch), static_cast<uint64_t>(i), RngStream::Transform);
          opt.transform().apply_range(ex, rng, prefix);
        }
        samples.push_back(std::move(ex));
      }
      current = -1;
      out.batch = collate(samples, collate_opt, pool.get());
      out.batch.indices = idx;
      out.batch.index = b;
      out.batch.epoch = epoch;
    } catch (const std::exception& e) {
      std::string msg = current >= 0 ? ::kiln::detail::concat("DataLoader: loading sample ", current, " (batch ", b,
                                                              " of epoch ", epoch, ") failed: ", e.what())
                                     : ::kiln::detail::concat("DataLoader: collating batch ", b, " of epoch ", epoch,
                                                              " failed: ", e.what());
      out.error = std::make_exception_ptr(LoaderError(msg, current, b));
      out.batch = Batch{};
    } catch (...) {
      out.error =
          std::make_exception_ptr(LoaderError(::kiln::detail::concat("DataLoader: sample ", current, " (batch ", b,
                                                                     ") threw a non-standard "
                                                                     "exception"),
                                              current, b));
      out.batch = Batch{};
    }
    return out;
  }

  void worker_loop(int worker) {
    profiler::set_thread_name("loader worker " + std::to_string(worker));
    const int64_t nb = static_cast<int64_t>(batches.size());
    for (;;) {
      int64_t b;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv_work.wait(lock, [&] { return stop || claim >= nb || claim < deliver + prefetch; });
        if (stop || claim >= nb) return;
        b = claim++;
      }
      Built built = build(b);
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stop) return;
        ready.emplace(b, std::move(built));
      }
      cv_ready.notify_all();
    }
  }

  void stop_workers() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop = true;
    }
    cv_work.notify_all();
    cv_ready.notify_all();
    for (auto& t : threads)
      if (t.joinable()) t.join();
    threads.clear();
    ready.clear();
    ahead.reset();
    running = false;
  }

  void start_epoch() {
    stop_workers();
    epoch = next_epoch++;
    batches = batches_for(epoch);
    claim = deliver = 0;
    stop = false;
    stats = LoaderStats{};
    stats.epoch = epoch;
    epoch_start = Clock::now();
    running = true;
    for (int w = 0; w < opt.workers() && !batches.empty(); ++w) threads.emplace_back([this, w] { worker_loop(w); });
  }

  // Takes batch `deliver` from the queue (waiting for it); nullopt semantics via bool.
  Built take(int64_t b, bool wait) {
    if (opt.workers() == 0) return build(b);
    std::unique_lock<std::mutex> lock(mu);
    auto has = [&] { return ready.count(b) > 0; };
    if (!has()) {
      if (!wait) return Built{};
      if (opt.timeout() > 0) {
        if (!cv_ready.wait_for(lock, std::chrono::milliseconds(opt.timeout()), has))
          KILN_FAIL("DataLoader: timed out after ", opt.timeout(), " ms waiting for batch ", b, " of epoch ", epoch,
                    " (", opt.workers(),
                    " workers); a Dataset::get or "
                    "transform is stuck or too slow — raise timeout() or fix the dataset");
      } else {
        cv_ready.wait(lock, has);
      }
    }
    auto it = ready.find(b);
    Built out = std::move(it->second);
    ready.erase(it);
    return out;
  }

  // Issues the asynchronous copy of a built batch to the device (consumer thread).
  void issue_copy(Built& built) {
    if (built.error || built.copied) return;
    Batch& bt = built.batch;
    const Device dev = opt.device();
    if (!copy_stream) {  // pageable: synchronous copies on the current stream
      bt.input = bt.input.to(dev);
      if (bt.target.defined()) bt.target = bt.target.to(dev);
      if (bt.mask.defined()) bt.mask = bt.mask.to(dev);
      return;
    }
    Stream compute = cuda::current_stream(dev.index);
    Stream cs = *copy_stream;
    // The device buffers are allocated on the compute stream, which uses and frees them, so the
    // allocator recycles them in the compute stream's order. The copy must not start before the
    // work queued there so far, which may still read recycled memory.
    std::vector<Tensor*> fields{&bt.input, &bt.target, &bt.mask};
    std::vector<Tensor> hosts, devices;
    for (Tensor* t : fields) {
      if (!t->defined()) continue;
      auto st = std::make_shared<Storage>(std::max<size_t>(t->nbytes(), 1), dev, allocator_for(dev));
      devices.push_back(make_tensor(st, t->sizes(), t->strides(), t->dtype()));
    }
    cuda::stream_wait(cs, compute);
    auto ev = std::make_shared<cuda::Event>();
    {
      cuda::StreamGuard guard(cs);
      size_t k = 0;
      for (Tensor* t : fields) {
        if (!t->defined()) continue;
        const Tensor& h = *t;
        Tensor& d = devices[k++];
        cuda::memcpy(d.data_ptr(), dev, h.data_ptr(), Device::cpu(), h.nbytes(), /*non_blocking=*/true);
        // The copy stream writes a block of the compute stream: if the batch is dropped before
        // it is delivered (an epoch cut short), the block must not be reused before the copy ends.
        cuda::record_stream(d, cs);
        hosts.push_back(h);
        *t = d;
      }
    }
    // The consumer's stream waits for this event before using the batch (next()).
    ev->record(cs);
    for (const Tensor& h : hosts) pool->set_pending(h, ev);
    built.copied = ev;
  }

  bool next(Batch* out) {
    KILN_CHECK(running, "DataLoader: no epoch in progress (use begin() or start_epoch())");
    const int64_t nb = static_cast<int64_t>(batches.size());
    if (deliver >= nb) {
      finish_epoch();
      return false;
    }
    *out = Batch{};  // release the previous batch's buffers before waiting
    auto t0 = Clock::now();
    Built built;
    if (ahead) {
      built = std::move(*ahead);
      ahead.reset();
    } else {
      built = take(deliver, true);
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      ++deliver;
    }
    cv_work.notify_all();
    if (built.error) {
      stats.wait_seconds += seconds_since(t0);
      std::rethrow_exception(built.error);
    }
    if (opt.device().is_cuda()) {
      issue_copy(built);
      if (built.copied) built.copied->wait(cuda::current_stream(opt.device().index));
      // Start the next batch's copy now if it is ready, so it overlaps this batch's compute.
      if (copy_stream && deliver < nb && opt.workers() > 0) {
        Built nxt = take(deliver, false);
        if (nxt.batch.input.defined() || nxt.error) {
          issue_copy(nxt);
          ahead = std::make_unique<Built>(std::move(nxt));
        }
      }
    }
    *out = std::move(built.batch);
    stats.batches += 1;
    stats.samples += out->size();
    stats.wait_seconds += seconds_since(t0);
    stats.epoch_seconds = seconds_since(epoch_start);
    stats.staging_allocations = pool->allocations();
    stats.staging_blocks = pool->blocks();
    return true;
  }

  void finish_epoch() {
    if (!running) return;
    stats.epoch_seconds = seconds_since(epoch_start);
    history.push_back(stats);
    stop_workers();
    // Keep what a steady-state epoch uses: up to three fields for each of prefetch + 1 batches,
    // plus blocks whose device copies are in flight.
    pool->trim(static_cast<size_t>(3 * (prefetch + 3)));
  }
};

DataLoader::DataLoader(const Dataset& dataset, LoaderOptions options)
    : impl_(std::make_unique<Impl>(dataset, std::move(options))) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, LoaderOptions options) {
  KILN_CHECK(dataset != nullptr, "DataLoader: null dataset");
  impl_ = std::make_unique<Impl>(*dataset, std::move(options));
  impl_->owned = std::move(dataset);
}

DataLoader::~DataLoader() = default;

DataLoader::Iterator DataLoader::begin() {
  start_epoch();
  Iterator it(this, false);
  if (!next(&it.batch_)) it.done_ = true;
  return it;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (!loader_->next(&batch_)) done_ = true;
  return *this;
}

void DataLoader::start_epoch() { impl_->start_epoch(); }
bool DataLoader::next(Batch* out) { return impl_->next(out); }

int64_t DataLoader::size() const {
  int64_t e = impl_->running ? impl_->epoch : impl_->next_epoch;
  if (impl_->running) return static_cast<int64_t>(impl_->batches.size());
  return static_cast<int64_t>(impl_->batches_for(e).size());
}

void DataLoader::set_epoch(int64_t epoch) {
  KILN_CHECK(epoch >= 0, "DataLoader::set_epoch: negative epoch ", epoch);
  impl_->next_epoch = epoch;
}
int64_t DataLoader::epoch() const { return impl_->epoch; }
const LoaderStats& DataLoader::stats() const { return impl_->stats; }
const std::vector<LoaderStats>& DataLoader::history() const { return impl_->history; }
const LoaderOptions& DataLoader::options() const { return impl_->opt; }
const Dataset& DataLoader::dataset() const { return *impl_->ds; }

}  // namespace kiln::data
