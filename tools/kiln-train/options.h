#pragma once
// kiln-train's command line: one flag per speed-up, defaulting to the fast setting.
#include <cstdint>
#include <string>

namespace kiln_train {

struct Options {
  std::string model = "cnn";      // cnn | mlp | resnet18 | gpt
  std::string gpt_size = "char";  // gpt: char (4 layers, d=128, T=128) | 124m (GPT-2 small's shapes)
  std::string device = "auto";    // auto | cpu | cuda
  int64_t epochs = 2;
  int64_t batch_size = 128;
  double lr = -1;                     // <= 0: the optimizer's default max LR
  double weight_decay = -1;           // < 0: the optimizer's default
  std::string schedule = "onecycle";  // onecycle | cyclic | cosine | constant
  std::string optimizer = "adamw";    // adamw | adam | sgd | lamb | lars
  int workers = 2;
  bool pin_memory = true;
  std::string amp = "off";  // off | fp16 | bf16
  bool channels_last = false;
  bool cudnn_benchmark = true;  // CUDA: autotune conv algorithms (--no-cudnn-benchmark: off)
  int64_t grad_accum = 1;
  double clip_grad = 0;  // 0: off
  bool checkpoint_activations = false;
  bool fuse = true;  // nn::fuse the model (--no-fuse: run the layers one by one)
  double ema = 0;    // 0: off, else the decay
  bool cuda_graphs = false;
  uint64_t seed = 0;
  int64_t max_steps = 0;  // 0: no limit (gpt defaults to 300)
  std::string data;       // dataset folder (vision) or text file/folder (gpt)
  std::string out = "kiln-train-out";
  std::string resume;
  bool find_lr = false;
  bool auto_lr = false;            // run the LR range test first and train at its suggested LR
  int64_t eval_every = 0;          // also evaluate every N optimizer steps (0: after each epoch only)
  bool normalize_inputs = true;    // vision: (x - mean) / std with Fashion-MNIST's pixel statistics
  bool sync_every_step = false;    // read the loss on the host every step, as a naive loop does
  std::string sync_debug = "off";  // CUDA: off | warn | error, kiln's sync-debug mode
  int64_t log_every = 50;          // optimizer steps between metric rows
  int64_t profile = 0;             // profile this many steps after kProfileWarmup (0: off)
  int threads = 0;                 // OpenMP threads for the kernels; 0: all cores
  bool flush_denormal = true;      // CPU: denormal floats read and written as 0 (FTZ/DAZ)
  // Optimizer steps before the steady-state rate's window; -1: kSteadyWarmup, or a fifth of the
  // steps the run takes when that is fewer, at least 1 (Trainer: steady_warmup).
  int64_t warmup_steps = -1;
  // Cap the memory the run may hold at this fraction of the device's (the GPU's memory, or the
  // machine's RAM for the CPU) from optimizer step memory_fraction_from_step on; 1: no cap.
  double memory_fraction = 1;
  int64_t memory_fraction_from_step = 0;
  // The guides' small habits, each switchable to its slow side to measure it (docs/guide.md,
  // speed-ups 5, 11, 13, 15 and 16).
  bool fused_optimizer = true;  // one multi-tensor step kernel per group (false: one per parameter)
  bool grad_to_none = true;     // zero_grad drops the gradients (false: --zero-grad zero, a fill each)
  bool eval_no_grad = true;     // evaluate under NoGradGuard (false: graphs recorded, activations kept)
  bool detect_anomaly = false;  // autograd anomaly detection for the whole run
  bool conv_bias = false;       // cnn: a bias in each conv before a BatchNorm
  // Data parallelism, when a launcher (kiln-run, torchrun, mpirun, srun) started several ranks
  // (docs/distributed.md, "kiln-train on several processes").
  double dist_timeout = 300;  // seconds a collective or the rendezvous may take
  double ddp_bucket_mb = 25;  // DDP's gradient bucket cap
  bool zero = false;          // ZeRO-1: optimizer state sharded across ranks
  // Set by kiln-train, not flags: whether a launcher started it (then it trains under DDP or
  // ZeRO-1 even as the only rank, as a torchrun script does), this rank's place and its GPU.
  bool distributed = false;
  int rank = 0;
  int world_size = 1;
  int cuda_device = 0;
  double lr_find_seconds = 0;  // --auto-lr: how long the LR range test took
};

// --profile starts after this many optimizer steps (first-call allocations, autotuning).
inline constexpr int64_t kProfileWarmup = 5;
// --warmup-steps' default: the steady-state rate leaves out this many steps, at most a fifth of the run's.
inline constexpr int64_t kSteadyWarmup = 5;

// Parses argv (exits on --help / bad syntax, like every CLI11 program) and validates the
// combination: an invalid one throws kiln::Error explaining why.
Options parse(int argc, char** argv);
void validate(Options& o, bool cuda_available);

}  // namespace kiln_train
