#include "options.h"

#include <CLI/CLI.hpp>

#include <map>

#include <kiln/core/build_info.h>
#include <kiln/core/error.h>

namespace kiln_train {

namespace {

// The small habits of the guides, on (the fast side) by default; each can be turned to the slow
// side so that kiln-guide measures what it costs.
void add_habit_switches(CLI::App& app, Options& o) {
  app.add_option("--fused-optimizer", o.fused_optimizer,
                 "true/false: one multi-tensor step kernel per parameter group (false: one kernel call per "
                 "parameter, as a per-parameter loop)");
  app.add_option("--zero-grad", o.grad_to_none, "none or zero: what zero_grad does to the gradients after a step")
      ->transform(CLI::CheckedTransformer(std::map<std::string, bool>{{"none", true}, {"zero", false}}));
  app.add_option("--eval-no-grad", o.eval_no_grad,
                 "true/false: evaluate under NoGradGuard (false: grad mode on, so evaluation records graphs "
                 "and keeps activations, as a loop that forgets no_grad does)");
  app.add_flag("--detect-anomaly", o.detect_anomaly,
               "autograd anomaly detection on for the whole run (a debugging API: every backward node "
               "checks its gradients for NaN/Inf)");
  app.add_flag("--conv-bias", o.conv_bias,
               "cnn: give each conv before a BatchNorm a bias (a no-op the BatchNorm cancels; the fused "
               "conv-block kernels take none)");
}

}  // namespace

Options parse(int argc, char** argv) {
  Options o;
  CLI::App app{"kiln-train: train and evaluate a model with kiln, every speed-up switchable"};
  app.set_version_flag("--version", std::string("kiln-train, kiln ") + kiln::build_commit());
  app.add_option("--model", o.model, "cnn (Fashion-MNIST CNN), mlp, resnet18 (1-channel), gpt (char-level)")
      ->check(CLI::IsMember({"cnn", "mlp", "resnet18", "gpt"}));
  app.add_option("--gpt-size", o.gpt_size,
                 "gpt only: char (4 layers, d=128, T=128) or 124m (GPT-2 small: 12 layers, d=768, 12 heads, "
                 "T=1024, vocabulary padded to 50304)")
      ->check(CLI::IsMember({"char", "124m"}));
  app.add_option("--device", o.device, "auto, cpu or cuda")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  app.add_option("--epochs", o.epochs, "passes over the training set")->check(CLI::PositiveNumber);
  app.add_option("--batch-size", o.batch_size, "samples per step (before accumulation)")->check(CLI::PositiveNumber);
  app.add_option("--lr", o.lr, "learning rate (the max LR of onecycle/cyclic); default per optimizer");
  app.add_option("--weight-decay", o.weight_decay, "weight decay; default per optimizer");
  app.add_option("--schedule", o.schedule, "onecycle, cyclic, cosine or constant")
      ->check(CLI::IsMember({"onecycle", "cyclic", "cosine", "constant"}));
  app.add_option("--optimizer", o.optimizer, "adamw, adam, sgd, lamb or lars")
      ->check(CLI::IsMember({"adamw", "adam", "sgd", "lamb", "lars"}));
  app.add_option("--workers", o.workers, "data-loader worker threads (0: load on the training thread)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--pin-memory", o.pin_memory, "page-locked staging buffers (true/false)");
  app.add_option("--amp", o.amp, "mixed precision: off, fp16 or bf16")->check(CLI::IsMember({"off", "fp16", "bf16"}));
  app.add_flag("--channels-last", o.channels_last, "NHWC memory format for images and conv weights");
  app.add_flag("--cudnn-benchmark,!--no-cudnn-benchmark", o.cudnn_benchmark,
               "autotune convolution algorithms once per shape (CUDA; on by default)");
  app.add_option("--grad-accum", o.grad_accum, "micro-batches per optimizer step")->check(CLI::PositiveNumber);
  app.add_option("--clip-grad", o.clip_grad, "clip the global gradient norm to this (0: off)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--checkpoint-activations", o.checkpoint_activations, "recompute activations in backward");
  app.add_flag("--fuse,!--no-fuse", o.fuse, "run fusable layer chains as fused modules (nn::fuse; on by default)");
  app.add_option("--ema", o.ema, "evaluate an exponential moving average of the weights with this decay (0: off)")
      ->check(CLI::Range(0.0, 0.99999));
  app.add_flag("--cuda-graphs", o.cuda_graphs, "capture the training step as a CUDA graph");
  app.add_option("--memory-fraction", o.memory_fraction,
                 "cap the memory this run may hold at this fraction of the device's (GPU memory, or RAM on the "
                 "CPU); running out writes a checkpoint and exits with code 5")
      ->check(CLI::Range(1e-12, 1.0));
  app.add_option("--memory-fraction-from-step", o.memory_fraction_from_step,
                 "apply --memory-fraction from this optimizer step on (a drill: run out of memory mid-run)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--seed", o.seed, "random seed");
  app.add_option("--max-steps", o.max_steps, "stop after this many optimizer steps (0: no limit)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--data", o.data, "dataset folder (vision) or text file / folder (gpt)");
  app.add_option("--out", o.out, "output folder: metrics.csv, TensorBoard events, plot.png, model, checkpoints");
  app.add_option("--resume", o.resume, "continue from a checkpoint.safetensors written by kiln-train");
  app.add_flag("--find-lr", o.find_lr, "run the LR range test, print and plot the suggestion, and exit");
  app.add_flag("--auto-lr", o.auto_lr,
               "run the LR range test first (on a throwaway model, built alike) and "
               "train at its suggested LR, the max LR of onecycle/cyclic; its time is in the JSON summary");
  app.add_option("--log-every", o.log_every, "optimizer steps between logged metrics")->check(CLI::PositiveNumber);
  app.add_option("--eval-every", o.eval_every,
                 "also evaluate the test accuracy every N optimizer steps "
                 "(0: after each epoch only); evaluation time is not training time")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--normalize-inputs", o.normalize_inputs,
                 "vision models: normalise the pixels with Fashion-MNIST's mean and std, true/false "
                 "(false: [0, 1] pixels)");
  app.add_flag("--sync-every-step", o.sync_every_step,
               "read the loss on the host (item()) after every step, "
               "as a naive loop does, instead of every --log-every steps: a host-device sync per step on a GPU");
  app.add_option("--sync-debug", o.sync_debug,
                 "CUDA: off, warn (print each implicit host-device sync's call "
                 "site once and count them all in the JSON summary) or error (stop at the first)")
      ->check(CLI::IsMember({"off", "warn", "error"}));
  app.add_option("--profile", o.profile,
                 "profile N steps after 5 warm-up steps: OUT/trace.json (Perfetto, chrome://tracing) and "
                 "OUT/profile.txt, the top ops by self time (docs/profiling.md)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--warmup-steps", o.warmup_steps,
                 "optimizer steps left out of the steady-state rate (the JSON summary's "
                 "steady_samples_per_second; samples_per_second is the whole run's). Default: 5, or a fifth of "
                 "the steps this run takes when that is fewer, at least 1; with --cuda-graphs at least the eager "
                 "steps and the capture step (4)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o.threads, "CPU threads for the kernels (0: all cores)")->check(CLI::NonNegativeNumber);
  app.add_option("--dist-timeout", o.dist_timeout,
                 "under a launcher: seconds a collective or the rendezvous "
                 "may take before it is an error")
      ->check(CLI::PositiveNumber);
  app.add_option("--ddp-bucket-mb", o.ddp_bucket_mb, "under a launcher: DDP's gradient bucket size in MiB")
      ->check(CLI::PositiveNumber);
  app.add_flag("--zero", o.zero,
               "under a launcher: ZeRO-1, the optimizer state sharded across ranks "
               "(adamw, adam or sgd)");
  app.add_option("--flush-denormal", o.flush_denormal,
                 "CPU: flush denormal floats to zero, true/false (kiln::set_flush_denormal)");
  add_habit_switches(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    std::exit(app.exit(e));
  }
  return o;
}

void validate(Options& o, bool cuda_available) {
  if (o.device == "auto") o.device = cuda_available ? "cuda" : "cpu";
  const bool cuda = o.device == "cuda";
  KILN_CHECK(!cuda || cuda_available, "--device cuda: no CUDA device is available (kiln built ",
             "with CUDA, or a GPU present, is needed); use --device cpu");
  KILN_CHECK(!(o.amp == "fp16" && !cuda), "--amp fp16 needs a CUDA device: fp16 has no fast CPU ",
             "arithmetic and loss scaling exists for tensor-core training; use --amp off (or bf16 on a GPU)");
  KILN_CHECK(!(o.cuda_graphs && !cuda), "--cuda-graphs needs a CUDA device (graph capture is a GPU feature)");
  // A captured step replays the same kernels with the same arguments: dropout would draw the same
  // mask every step (mlp, gpt), and accumulation changes the step's shape between micro-batches.
  KILN_CHECK(!(o.cuda_graphs && (o.model == "mlp" || o.model == "gpt")), "--cuda-graphs supports --model cnn ",
             "and resnet18: ", o.model, " uses dropout, whose random masks a replayed graph would repeat");
  KILN_CHECK(!(o.cuda_graphs && o.grad_accum > 1), "--cuda-graphs captures one whole optimizer step; ",
             "it cannot be combined with --grad-accum ", o.grad_accum);
  KILN_CHECK(!(o.cuda_graphs && o.checkpoint_activations), "--cuda-graphs and --checkpoint-activations are not ",
             "supported together yet; pick one");
  KILN_CHECK(!(o.channels_last && (o.model == "mlp" || o.model == "gpt")), "--channels-last applies to ",
             "convolutional models (cnn, resnet18), not --model ", o.model);
  KILN_CHECK(o.gpt_size == "char" || o.model == "gpt", "--gpt-size applies to --model gpt, not --model ", o.model);
  KILN_CHECK(!(o.zero && o.optimizer != "adamw" && o.optimizer != "adam" && o.optimizer != "sgd"), "--zero shards ",
             "the optimizer's state as flat slices: ", o.optimizer, " computes per-parameter trust ratios, which a ",
             "slice does not have; use adamw, adam or sgd");
  KILN_CHECK(!(o.zero && o.clip_grad > 0), "--zero averages the gradients inside its step (reduce-scatter), so a ",
             "global norm for --clip-grad is not available before it; drop one of them");
  KILN_CHECK(!(o.zero && o.amp == "fp16"), "--zero with --amp fp16 is not supported (the loss scaler steps a ",
             "whole optimizer); use --amp bf16");
  KILN_CHECK(!(o.sync_debug != "off" && !cuda), "--sync-debug needs a CUDA device: on the CPU item() reads ",
             "memory that the CPU kernels have already written, so there is no host-device sync to report (the ",
             "JSON summary's host_reads_per_step counts the host reads of the training loop)");
  KILN_CHECK(o.normalize_inputs || o.model != "gpt", "--normalize-inputs applies to the vision models (cnn, mlp, ",
             "resnet18): the gpt's inputs are token ids");
  KILN_CHECK(!(o.auto_lr && o.find_lr), "--auto-lr trains after the LR range test, --find-lr only runs it; pick one");
  KILN_CHECK(!(o.auto_lr && o.lr > 0), "--auto-lr picks the learning rate itself; drop --lr ", o.lr, " or --auto-lr");
  KILN_CHECK(!(o.auto_lr && !o.resume.empty()), "--auto-lr with --resume: the checkpoint's schedule holds the LR ",
             "already; resume without --auto-lr");
  KILN_CHECK(!o.conv_bias || o.model == "cnn", "--conv-bias applies to --model cnn (its two convs feed a ",
             "BatchNorm), not --model ", o.model);
  KILN_CHECK(o.grad_to_none || !o.cuda_graphs, "--zero-grad zero with --cuda-graphs: a captured step writes its ",
             "gradients in place at every replay, so zero_grad is never called; drop one of them");
  KILN_CHECK(o.memory_fraction < 1 || o.memory_fraction_from_step == 0,
             "--memory-fraction-from-step applies --memory-fraction, which is not set");
  if (o.model == "gpt" && o.max_steps == 0) o.max_steps = 300;
  if (o.model == "gpt" && o.batch_size == 128) o.batch_size = 32;
}

}  // namespace kiln_train
