#include "tips.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace kiln_guide {
namespace {

// The guides the claims come from (docs/guide.md, "The speed-ups and where they live").
const char* const kKuhn = "Kuhn, Faster Deep Learning Training with PyTorch (2021 guide)";
const char* const kTuning = "PyTorch Performance Tuning Guide (Migacz)";
const char* const kKuhnTuning = "Kuhn 2021 guide, from the PyTorch Performance Tuning Guide";
const char* const kKiln = "kiln's own measurement (docs/guide.md, speed-up 27), not a guide";

// Budgets: throughput runs are cut at a step count, convergence runs train whole epochs.
constexpr Budget kCnnSpeed{1, 200}, kCnnSpeedFull{1, 600};
constexpr Budget kCnnConverge{3, 0}, kCnnConvergeFull{5, 0};
constexpr Budget kGptMemory{1, 5}, kGptMemoryFull{1, 12};
constexpr Budget kCnnEval{1, 40}, kCnnEvalFull{1, 80};
// CNN test accuracy every run should reach in the convergence budget (kiln-train's defaults
// reach about 91% after 2 epochs, docs/guide.md, speed-up 1; a constant LR about 90% after 2-3).
constexpr double kCnnTarget = 0.90;

Tip measured(int n, const char* key, const char* name, const char* model, MetricKind m,
             std::vector<std::string> baseline, std::vector<std::string> with) {
  Tip t;
  t.number = n, t.key = key, t.name = name, t.model = model, t.metric = m;
  t.baseline = std::move(baseline), t.with = std::move(with);
  const bool speed = m == MetricKind::Throughput;
  t.quick = speed ? kCnnSpeed : kCnnConverge;
  t.full = speed ? kCnnSpeedFull : kCnnConvergeFull;
  if (m == MetricKind::Convergence) t.target_accuracy = kCnnTarget;
  return t;
}

Tip unmeasured(int n, const char* key, const char* name, const char* claim, const char* source, const char* why) {
  Tip t;
  t.number = n, t.key = key, t.name = name, t.claim = claim, t.source = source, t.not_measured = why;
  t.explanation = why;
  return t;
}

void claim(Tip& t, const char* text, double ratio, const char* source, const char* why) {
  t.claim = text, t.claimed_ratio = ratio, t.source = source, t.explanation = why;
}

// Why kiln's number may differ where the row trains on a GPU, when the CPU's reason does not hold
// there.
void on_gpu(Tip& t, const char* why) { t.gpu_explanation = why; }

const double kNone = std::nan("");

// Tips 1-6: schedules, loading, batch size, precision, optimizers, cuDNN.
void add_first(std::vector<Tip>& v) {
  Tip t = measured(1, "1cycle", "1cycle / cyclical LR", "cnn", MetricKind::Convergence, {"--schedule", "constant"},
                   {"--schedule", "onecycle"});
  claim(t, "super-convergence: ~10x fewer iterations for ResNet-56 (best case)", 10, kKuhn,
        "a small CNN on Fashion-MNIST for a few epochs, not ResNet-56 on CIFAR-10; 10x is a best case, "
        "and accuracy is evaluated every third of an epoch, so time-to-target moves in steps of about a "
        "third of an epoch's training time");
  v.push_back(t);

  t = measured(1, "lr-pick", "1cycle: the LR range test's pick vs the default max LR", "cnn", MetricKind::Convergence,
               {}, {"--auto-lr"});
  t.metric_note = "the with side's time includes its LR range test";
  claim(t, "the LR range test finds 1cycle's max LR in one short run instead of a search", kNone, kKuhn,
        "kiln-train's default max LR (5e-3) was tuned by hand for this CNN; the range test's pick is the "
        "steepest descent of its smoothed loss, which --find-lr itself calls a lower bound for 1cycle's max LR "
        "(it suggests up to ~10x it); runs/*.json hold the picked LR (max_lr)");
  v.push_back(t);

  t = measured(2, "workers", "loader workers + pinned memory: workers 0 vs 2", "cnn", MetricKind::Throughput,
               {"--workers", "0"}, {"--workers", "2"});
  claim(t, "~2x for one epoch with 4 workers + pinned memory; 4 workers per GPU as a rule of thumb", 2, kKuhn,
        "Fashion-MNIST batches need no decoding or augmentation, so loading is a small share of a step; "
        "on the CPU the workers compete with the kernels' threads for the same cores");
  on_gpu(t,
         "Fashion-MNIST batches need no decoding or augmentation; on a GPU the workers assemble the next "
         "batches while the training thread queues kernels, and the CNN's steps take a few milliseconds, so "
         "a batch assembled on the training thread is a visible share of one");
  v.push_back(t);

  t = measured(2, "pinned", "loader workers + pinned memory: pinned memory", "cnn", MetricKind::Throughput,
               {"--pin-memory", "false"}, {"--pin-memory", "true"});
  t.needs_gpu = true;
  claim(t, "page-locked buffers make host-to-device copies fast and asynchronous (part of the ~2x above)", kNone,
        kKuhnTuning,
        "a 100 KB Fashion-MNIST batch copies in microseconds either way, so copies are a small share of a step");
  v.push_back(t);

  t = measured(3, "batch", "big batches: 64 vs 512, LR scaled by sqrt(8)", "cnn", MetricKind::Convergence,
               {"--batch-size", "64", "--lr", "0.0035"}, {"--batch-size", "512", "--lr", "0.01"});
  t.cost = 0.9;
  claim(t, "4x faster going from batch 64 to 512 (with 1cycle)", 4, kKuhn,
        "the 4x is GPU utilisation; CPU cores are busy at batch 64 already, and 8x fewer steps per epoch "
        "need more epochs to reach the same accuracy");
  on_gpu(t,
         "the small CNN's GPU steps are bound by kernel launches, so a batch of 512 costs little more per step "
         "than one of 64; 8x fewer steps per epoch need more epochs to reach the same accuracy");
  v.push_back(t);

  t = measured(4, "bf16", "AMP: bf16 autocast", "cnn", MetricKind::Throughput, {"--amp", "off"}, {"--amp", "bf16"});
  t.cost = 1.7;
  claim(t, "~2x typical, up to 5.5x on a V100 (f16); up to 3x on Volta and newer", 2, kKuhnTuning,
        "on the CPU kiln has no fast bf16 kernels and autocast turns the fused f32 conv blocks off, so bf16 "
        "is slower there; the gain needs tensor cores");
  on_gpu(t,
         "the small CNN's GPU steps are bound by kernel launches, not arithmetic, and autocast adds a cast "
         "kernel for each weight and activation it converts, so tensor cores have little to gain here");
  v.push_back(t);

  t = measured(4, "fp16", "AMP: fp16 + loss scaling", "cnn", MetricKind::Throughput, {"--amp", "off"},
               {"--amp", "fp16"});
  t.needs_gpu = true;
  claim(t, "~2x typical, up to 5.5x on a V100; up to 3x on Volta and newer", 2, kKuhnTuning,
        "the small CNN keeps a big GPU busy launching kernels more than computing, so tensor cores gain less");
  v.push_back(t);

  t = measured(5, "adamw", "AdamW / fused optimizers: AdamW vs SGD", "cnn", MetricKind::Convergence,
               {"--optimizer", "sgd"}, {"--optimizer", "adamw"});
  claim(t, "AdamW's decoupled weight decay beats Adam's L2; a fused Adam gains ~5% end to end (apex)", kNone, kKuhn,
        "this row compares AdamW with SGD + Nesterov, each at kiln-train's default LR with 1cycle; the "
        "fused step against a kernel per parameter is the next row");
  v.push_back(t);

  t = measured(5, "fused-optimizer", "AdamW / fused optimizers: one multi-tensor step vs a kernel per parameter", "cnn",
               MetricKind::Throughput, {"--fused-optimizer", "false"}, {});
  claim(t, "a fused Adam gains ~5% end to end (apex)", 1.05, kKuhn,
        "the CNN has 10 parameter tensors, so the per-parameter side makes 10 step-kernel calls where the fused "
        "one makes 1, and each call pays the launcher's set-up (the step's scalars, the chunk table, a parallel "
        "region over the cores): on this 2-core VM about 0.1 ms a call against a step of about 10 ms. On a GPU "
        "each call is a kernel launch, and models have hundreds of tensors");
  on_gpu(t,
         "the CNN has 10 parameter tensors, so the per-parameter side launches 10 step kernels where the fused "
         "one launches 1, each costing microseconds of host time in a step of a few milliseconds; models with "
         "hundreds of tensors gain more");
  v.push_back(t);

  t = measured(6, "cudnn", "cuDNN autotuner", "resnet18", MetricKind::Throughput, {"--no-cudnn-benchmark"},
               {"--cudnn-benchmark"});
  t.needs_gpu = true;
  t.quick = {1, 100}, t.full = {1, 300};
  claim(t, "+70% convolution forward, +27% forward + backward", 1.27, kKuhnTuning,
        "the +27% is one convolution; a ResNet-18 step also runs BatchNorm, pooling and the optimizer, and "
        "cuDNN's heuristic often picks the fastest algorithm already");
  v.push_back(t);
}

// Tips 7-17: syncs, memory, data parallelism, small habits.
void add_middle(std::vector<Tip>& v) {
  Tip t = measured(7, "syncs", "fewer host-device syncs: the loss read every step vs every 50 steps", "cnn",
                   MetricKind::HostSyncs, {"--sync-every-step"}, {});
  t.quick = t.full = {1, 100};             // a count, exact after a few log intervals
  t.cuda_both = {"--sync-debug", "warn"};  // on a GPU the runtime counts the syncs it sees
  claim(t, "avoids stalls; keeps the GPU queue full", kNone, kKuhnTuning,
        "the count is exact, not a speed: on the CPU every op has finished when it returns, so a host read "
        "waits for nothing; what the reads cost is the throughput row below (GPU)");
  on_gpu(t, "the count is sync-debug's, exact; what the syncs cost is the throughput row below");
  v.push_back(t);

  t = measured(7, "syncs-speed", "fewer host-device syncs: throughput", "cnn", MetricKind::Throughput,
               {"--sync-every-step"}, {});
  t.needs_gpu = true;
  claim(t, "avoids stalls; keeps the GPU queue full", kNone, kKuhnTuning,
        "a sync per step costs the time the host needs to queue the next step's kernels, large only when the "
        "GPU steps are as short as the CNN's");
  v.push_back(t);

  t = measured(8, "checkpointing", "activation checkpointing", "gpt", MetricKind::PeakMemory, {},
               {"--checkpoint-activations"});
  t.quick = kGptMemory, t.full = kGptMemoryFull;
  claim(t, "large memory savings for modest extra time, so bigger batches fit", kNone, kKuhnTuning,
        "on the CPU the peak is the whole process's resident set (corpus, weights, optimizer state, "
        "allocator cache), of which the activations are only a part");
  on_gpu(t,
         "on a GPU the peak is the device memory the caching allocator reserved: weights, optimizer state and "
         "cached blocks as well as the activations");
  v.push_back(t);

  t = measured(8, "checkpointing-batch", "activation checkpointing: the batch it allows", "gpt", MetricKind::BatchFit,
               {}, {"--checkpoint-activations"});
  t.quick = kGptMemory, t.full = kGptMemoryFull;
  t.baseline_probe_batch = 8, t.with_probe_batch = 8;
  claim(t, "large memory savings for modest extra time, so bigger batches fit", kNone, kKuhnTuning,
        "a straight line through two runs per side, extrapolated past the batches measured; the peak counts "
        "live tensors, not the blocks the allocator caches nor the rest of the process, so a run at that batch "
        "needs somewhat more than the baseline's peak memory row shows");
  v.push_back(t);

  t = measured(9, "grad-accum", "gradient accumulation: batch 32 vs 4 x 8", "gpt", MetricKind::PeakMemory, {},
               {"--batch-size", "8", "--grad-accum", "4"});
  t.quick = kGptMemory, t.full = kGptMemoryFull;
  claim(t, "a larger effective batch in fixed memory", kNone, kKuhn,
        "only the activations shrink with the micro-batch; the resident set also holds the corpus, weights "
        "and optimizer state");
  on_gpu(t,
         "only the activations shrink with the micro-batch; the reserved device memory also holds the weights, "
         "optimizer state and the allocator's cached blocks");
  v.push_back(t);

  t = measured(9, "grad-accum-batch", "gradient accumulation: the batch it allows (4 micro-batches)", "gpt",
               MetricKind::BatchFit, {}, {"--batch-size", "8", "--grad-accum", "4"});
  t.quick = kGptMemory, t.full = kGptMemoryFull;
  t.baseline_probe_batch = 8, t.with_probe_batch = 16;
  t.metric_note = "with: micro-batches of that size, 4 per step";
  claim(t, "a larger effective batch in fixed memory", kNone, kKuhn,
        "accumulation allows any effective batch, given steps enough; this is the largest with 4 micro-batches "
        "a step, from a straight line through two runs per side of their live tensors' peak, extrapolated on "
        "the with side");
  v.push_back(t);

  t = measured(10, "ddp", "DDP: 1 vs 2 ranks, same work per rank", "cnn", MetricKind::Throughput,
               {"--threads", "1", "--batch-size", "128"}, {"--threads", "1", "--batch-size", "256"});
  t.launcher = true;
  t.cost = 1.2;
  claim(t, "near-linear multi-GPU scaling; much faster than single-process DataParallel", kNone, kKuhnTuning,
        "without 2 GPUs the ranks are CPU cores (one thread each) that share memory bandwidth and exchange "
        "gradients over Gloo's TCP; near-linear scaling is for one GPU per rank over NCCL");
  v.push_back(t);

  t = measured(11, "grad-none", "gradients to none: zero_grad filling zeros vs dropping the gradients", "cnn",
               MetricKind::Throughput, {"--zero-grad", "zero"}, {});
  claim(t, "a modest speed-up: no memset per parameter, and backward assigns instead of accumulating", kNone,
        kKuhnTuning,
        "zeroing costs a fill of the CNN's 1.7 MB of gradients (mostly fc1's) and makes backward add into "
        "them instead of adopting its buffers: about 0.3 ms of a 10 ms step on this 2-core VM");
  on_gpu(t,
         "zeroing launches a fill per gradient and makes backward add into them instead of adopting its "
         "buffers: more kernel launches in a step bound by them");
  v.push_back(t);
  v.push_back(unmeasured(12, "zero-copy", "zero-copy tensors", "avoids a copy", kKuhn,
                         "a library API (kiln::from_blob); the datasets hand out views; nothing to switch"));
  t = measured(13, "debug-off", "debug APIs off: anomaly detection on vs off", "cnn", MetricKind::Throughput,
               {"--detect-anomaly"}, {});
  claim(t, "turn debugging APIs (anomaly detection, profilers) off for training", kNone, kKuhnTuning,
        "kiln's anomaly detection checks every gradient a backward node produces for NaN/Inf, a read of each "
        "gradient, and keeps each node's creating op for the message; PyTorch's also records a Python stack "
        "trace per op, which C++ has no need of, so kiln's costs less");
  on_gpu(t,
         "kiln's anomaly detection checks every gradient a backward node produces for NaN/Inf and reads the "
         "verdict on the host: on a GPU a device synchronisation per gradient, which empties the launch queue");
  v.push_back(t);

  t = measured(14, "clip", "gradient clipping", "cnn", MetricKind::Convergence, {}, {"--clip-grad", "1.0"});
  claim(t, "faster, more stable convergence (RNNs, Transformers, ResNets)", kNone, kKuhn,
        "a CNN with BatchNorm under AdamW + 1cycle rarely has exploding gradients, so there is little to clip");
  v.push_back(t);

  t = measured(15, "no-bias-bn", "no bias before BatchNorm: the CNN's convs with a bias vs without", "cnn",
               MetricKind::Throughput, {"--conv-bias"}, {});
  claim(t, "fewer parameters and a small speed-up: BatchNorm's shift makes the bias a no-op", kNone, kKuhnTuning,
        "besides the bias add and its gradient, kiln's fused conv + BatchNorm + ReLU + pool kernels take no conv "
        "bias, so with one the blocks fall back to the general path: the gap is larger than the bias alone");
  on_gpu(t,
         "on a GPU both sides run cuDNN's convolutions (the fused conv blocks are CPU kernels); the bias is "
         "added by a broadcast-add kernel after each convolution and its gradient summed by a reduction, "
         "kernels of their own in a step bound by launches");
  v.push_back(t);

  t = measured(16, "no-grad-eval", "no_grad in validation: evaluation with grad mode on vs off", "cnn",
               MetricKind::EvalThroughput, {"--eval-no-grad", "false"}, {});
  t.quick = kCnnEval, t.full = kCnnEvalFull;
  claim(t, "faster and less memory: no graph is recorded and no activation is kept", kNone, kKuhnTuning,
        "evaluation runs in eval mode either way; with grad on, each op also records its backward node and keeps "
        "the tensors backward would need until the batch's outputs are dropped");
  v.push_back(t);
  t = measured(17, "normalisation", "input normalisation: [0, 1] pixels vs normalised", "cnn", MetricKind::Convergence,
               {"--normalize-inputs", "false"}, {"--normalize-inputs", "true"});
  claim(t, "faster convergence", kNone, kKuhn,
        "the CNN's first convolution feeds a BatchNorm, which re-centres and re-scales its features whatever "
        "the inputs' range, so [0, 1] pixels cost it little; BatchNorm itself has no switch (the models are "
        "built with it)");
  v.push_back(t);
}

// Tips 18-27: fusion, layouts, graphs, averaging, and kiln's own.
void add_last(std::vector<Tip>& v) {
  Tip t =
      measured(18, "fuse", "fused pointwise ops (nn::fuse)", "cnn", MetricKind::Throughput, {"--no-fuse"}, {"--fuse"});
  t.cost = 1.2;
  claim(t, "a fused GELU ~5x its unfused ops", 5, kTuning,
        "the 5x is one GELU against its chain of ops; this is whole CNN steps with fused "
        "conv + BatchNorm + ReLU + pool blocks against the layers one by one");
  on_gpu(t,
         "the 5x is one GELU against its chain of ops; on a GPU each fused block runs cuDNN's convolution, the "
         "BatchNorm kernel with the ReLU inside it (its backward recomputing the mask) and the pool: a kernel "
         "and a saved activation fewer per block than the layers one by one");
  v.push_back(t);

  t = measured(19, "channels-last", "channels_last", "cnn", MetricKind::Throughput, {}, {"--channels-last"});
  t.cuda_both = {"--amp", "bf16"};  // the guides pair it with AMP for tensor-core convolutions
  claim(t, "large convolution speed-ups on tensor cores (with AMP)", kNone, kTuning,
        "kiln's fused conv blocks and Winograd convolutions are NCHW only on the CPU, so NHWC gives them up "
        "there; the gain is for tensor-core convolutions");
  on_gpu(t,
         "both sides run cuDNN's bf16 convolutions; the guide's gain is for tensor-core convolutions larger "
         "than the small CNN's");
  v.push_back(t);

  v.push_back(unmeasured(20, "tc-sizes", "tensor-core friendly sizes", "enables tensor cores", kTuning,
                         "GPT-2's vocabulary is always padded to 50304 (--gpt-size 124m); no unpadded switch"));
  v.push_back(unmeasured(21, "pre-allocate", "pre-allocate for variable lengths",
                         "avoids re-allocation and fragmentation OOMs", kTuning,
                         "kiln-train's inputs have one size; the caching allocators are always on "
                         "(bench_cuda_allocator)"));

  t = measured(22, "cuda-graphs", "CUDA graphs", "cnn", MetricKind::Throughput, {}, {"--cuda-graphs"});
  t.needs_gpu = true;
  claim(t, "large latency and memory reductions", kNone, kTuning,
        "the gain is the launch overhead saved, large for a small model like the CNN only when the GPU "
        "waits for launches");
  v.push_back(t);

  v.push_back(unmeasured(23, "profiling", "profiling, memory timeline", "find where time and memory go", kTuning,
                         "a diagnostic, not a speed-up (kiln-train --profile N)"));

  t = measured(24, "ema", "EMA of weights", "cnn", MetricKind::Convergence, {}, {"--ema", "0.999"});
  claim(t, "often better accuracy", kNone, "blog guides on faster PyTorch training",
        "a few epochs under 1cycle end with small steps already, leaving the average little noise to smooth");
  v.push_back(t);

  v.push_back(unmeasured(25, "retain-graph", "don't retain graphs by accident", "avoids memory blow-up", kKuhn,
                         "kiln frees saved tensors as backward passes each node; no switch"));
  v.push_back(unmeasured(26, "zero", "model parallel / sharded state", "train models that don't fit one GPU",
                         "blog guides on faster PyTorch training",
                         "--zero under kiln-run shards the optimizer state, but kiln-train's models hold a few "
                         "MB of it, too little to show in peak memory; the tests check 1/N of it per rank"));

  t = measured(27, "denormals", "denormals flushed to zero (CPU)", "cnn", MetricKind::LateThroughput,
               {"--flush-denormal", "false"}, {"--flush-denormal", "true"});
  t.cpu_only = true;
  t.quick = {2, 0}, t.full = {2, 0};
  t.cost = 1.15;
  claim(t, "none in the guides; kiln measured ~4,700-5,200 vs 3,400-4,000 images/s late in epoch 2", kNone, kKiln,
        "denormals appear once the model is confident, late in training; processors differ in what "
        "they cost");
  v.push_back(t);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

const char* metric_word(const Tip& t) {
  if (!t.not_measured.empty()) return "-";
  switch (t.metric) {
    case MetricKind::Throughput: return "throughput";
    case MetricKind::LateThroughput: return "late throughput";
    case MetricKind::PeakMemory: return "peak memory";
    case MetricKind::Convergence: return "time to accuracy";
    case MetricKind::HostSyncs: return "host syncs per step";
    case MetricKind::BatchFit: return "batch that fits";
    case MetricKind::EvalThroughput: return "evaluation throughput";
  }
  return "?";
}

}  // namespace

const std::vector<Tip>& tips() {
  static const std::vector<Tip> table = [] {
    std::vector<Tip> v;
    add_first(v);
    add_middle(v);
    add_last(v);
    return v;
  }();
  return table;
}

std::vector<const Tip*> select_tips(const std::string& only) {
  std::vector<const Tip*> out;
  auto add = [&out](const Tip* t) {
    if (std::find(out.begin(), out.end(), t) == out.end()) out.push_back(t);
  };
  if (trim(only).empty()) {
    for (const Tip& t : tips()) add(&t);
    return out;
  }
  std::stringstream ss(only);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::string want = lower(trim(item));
    if (want.empty()) continue;
    const bool number = std::all_of(want.begin(), want.end(), [](unsigned char c) { return std::isdigit(c); });
    bool found = false;
    for (const Tip& t : tips())
      if (number ? std::to_string(t.number) == want : (lower(t.key) == want || lower(t.name) == want))
        add(&t), found = true;
    if (!found) throw UsageError("--only: no tip '" + trim(item) + "' (kiln-guide --list shows the numbers and keys)");
  }
  // the report keeps docs/guide.md's order whatever order --only named them in (the table is
  // one vector, so its addresses are in that order)
  std::sort(out.begin(), out.end(), [](const Tip* a, const Tip* b) { return a < b; });
  return out;
}

std::string flags_text(const std::vector<std::string>& flags) {
  if (flags.empty()) return "(defaults)";
  std::string s;
  for (const auto& f : flags) s += (s.empty() ? "" : " ") + f;
  return s;
}

std::string list_text(const std::vector<const Tip*>& rows) {
  std::ostringstream os;
  for (const Tip* tp : rows) {
    const Tip& t = *tp;
    os << t.number << "  " << t.key << ": " << t.name;
    if (!t.not_measured.empty()) {
      os << "\n      not measured by kiln-guide: " << t.not_measured << "\n";
      continue;
    }
    os << "\n      " << t.model << ", " << metric_word(t) << "; baseline " << flags_text(t.baseline) << ", with "
       << (t.launcher ? "kiln-run 2 ranks, " : "") << flags_text(t.with) << (t.needs_gpu ? " (needs a GPU)" : "")
       << (t.cpu_only ? " (on the CPU)" : "");
    if (t.metric == MetricKind::BatchFit)
      os << "; each side also at batch " << t.baseline_probe_batch << " / " << t.with_probe_batch << " for the fit";
    os << "\n";
  }
  return os.str();
}

}  // namespace kiln_guide
