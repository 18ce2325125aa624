#!/usr/bin/env bash
# Usage: [ROUNDS=N] [RESNET_STEPS=N] bench/train/compare_pytorch.sh [KILN_TRAIN] [PYTHON] [MODEL...]
# kiln-train's default CPU runs and their PyTorch peers (bench/train/pytorch_peer.py: same model,
# data, batch, optimizer, schedule, steps and thread count) back to back on this machine's CPU,
# then the throughput ratios. MODEL is cnn, resnet18 or gpt (default: all three, in that order).
# PYTHON must have torch and numpy (e.g. a venv: pip install torch numpy).
#   cnn       2 epochs, batch 128; PyTorch both as it comes and with denormals flushed
#   resnet18  RESNET_STEPS steps (default 30; a whole epoch takes ~10 minutes on 2 cores), batch 128,
#             then the whole test set evaluated (outside the timing, as kiln-train does)
#   gpt       the char GPT, 300 steps of batch 32 x 128 tokens (kiln-train's default)
# kiln-train flushes denormals by default (--flush-denormal true), so every model's PyTorch run
# does too (torch.set_flush_denormal(True)); the CNN also keeps the as-it-comes PyTorch run.
# ROUNDS (default 1) repeats every model's runs in turn, so that a shared VM whose speed drifts
# by 10-20% over minutes weighs on both sides alike; per model it prints each round, the median
# and spread (min-max) of each side, the ratio of the medians and the peak resident memory.
# The load average is printed at the start, after each round and at the end.
# On a busy machine, shorter runs (same models, both sides alike; the defaults are kiln-train's):
#   CNN_STEPS=N  the CNN stops after N steps (default 0: its 2 epochs)
#   GPT_STEPS=N  the GPT runs N steps (default 300)
#   TEST_IMAGES=N  evaluate on the first N test images (outside the timing; ResNet-18's
#                evaluation of all 10,000 takes about as long as its 30 steps)
# CPU levels (kiln/core/cpu_isa.h): ISA=avx2 restricts both sides to AVX2 on an AVX-512 machine
# (kiln: KILN_CPU_ISA=avx2; PyTorch: ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
# MKL_ENABLE_INSTRUCTIONS=AVX2), so either kind of machine measures both rows; ISA=avx512 or
# auto (the default) leaves both at their best.
# COMPILE=1 adds PyTorch with torch.compile and the fused AdamW (pytorch_peer.py --compile).
# FASHION_MNIST=dir and GPT_DATA=path replace the installed datasets (kiln-train's defaults).
# JSON=path also writes the report as JSON (bench/train/compare_report.py), the input of
# scripts/performance_page.py.
# Not a test: a measurement for bench/results and kiln-train's target of 2x PyTorch's speed
# (docs/guide.md, "kiln-train on the CPU").
set -euo pipefail
bin="${1:-build/bin/kiln-train}"
py="${2:-python3}"
if (($# > 2)); then models=("${@:3}"); else models=(cnn resnet18 gpt); fi
rounds="${ROUNDS:-1}"
resnet_steps="${RESNET_STEPS:-30}"
cnn_steps="${CNN_STEPS:-0}"
gpt_steps="${GPT_STEPS:-300}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
threads=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for m in "${models[@]}"; do
  case "$m" in cnn | resnet18 | gpt) ;; *) echo "compare_pytorch.sh: unknown model '$m' (cnn, resnet18, gpt)" >&2; exit 2 ;; esac
done

# The same step limit on both sides (0: none, the CNN's 2 epochs).
steps_args() {
  case "$1" in cnn) echo "--max-steps $cnn_steps" ;; resnet18) echo "--max-steps $resnet_steps" ;; gpt) echo "--max-steps $gpt_steps" ;; esac
}

# Fashion-MNIST for both sides: the installed one, or with TEST_IMAGES its first N test images.
data="${FASHION_MNIST:-/usr/share/datasets/fashion-mnist}"
[[ -d "$data" ]] && data="$(cd "$data" && pwd)"  # absolute: TEST_IMAGES links to it from elsewhere
if [[ -n "${TEST_IMAGES:-}" ]]; then
  mkdir "$tmp/fashion-mnist"
  ln -s "$data"/train-* "$tmp/fashion-mnist/"
  python3 - "$data" "$tmp/fashion-mnist" "$TEST_IMAGES" <<'PY'
import gzip, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, header, item in (("t10k-images-idx3-ubyte.gz", 16, 784), ("t10k-labels-idx1-ubyte.gz", 8, 1)):
    raw = gzip.open(f"{src}/{name}").read()
    head = raw[:4] + n.to_bytes(4, "big") + raw[8:header]  # the idx header with the new count
    gzip.open(f"{dst}/{name}", "wb").write(head + raw[header:header + n * item])
PY
  data="$tmp/fashion-mnist"
fi
data_args() {
  if [[ "$1" != gpt ]]; then echo "--data $data"; elif [[ -n "${GPT_DATA:-}" ]]; then echo "--data $GPT_DATA"; fi
}

isa="${ISA:-auto}"
case "$isa" in
  avx2) export KILN_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 ;;
  avx512) export KILN_CPU_ISA=avx512 ;;
  auto) ;;
  *) echo "compare_pytorch.sh: ISA must be auto, avx2 or avx512 (got '$isa')" >&2; exit 2 ;;
esac
log="$tmp/runs.log"
exec > >(tee "$log")  # the report below reads the run lines back from this log
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; ISA=$isa"
echo "start: $(uptime)"
for ((r = 1; r <= rounds; r++)); do
  round_start=$SECONDS
  for m in "${models[@]}"; do
    # shellcheck disable=SC2046
    kiln=$("$bin" --model "$m" --device cpu --threads "$threads" $(steps_args "$m") $(data_args "$m") --out "$tmp/kiln" | tail -n 1)
    echo "round $r $m kiln:                     $kiln"
    if [[ "$m" == cnn ]]; then  # PyTorch as it comes, as this script has always run it
      # shellcheck disable=SC2046
      torch=$("$py" "$here/pytorch_peer.py" --model "$m" --threads "$threads" $(steps_args "$m") $(data_args "$m") | tail -n 1)
      echo "round $r $m pytorch:                  $torch"
    fi
    # shellcheck disable=SC2046
    torch=$("$py" "$here/pytorch_peer.py" --model "$m" --threads "$threads" --flush-denormal $(steps_args "$m") $(data_args "$m") \
      | tail -n 1)
    echo "round $r $m pytorch (flush denormal): $torch"
    if [[ "${COMPILE:-0}" == 1 ]]; then
      # shellcheck disable=SC2046
      # a failure of the compiled run is reported and the comparison goes on (PyTorch 2.15's
      # compiled CNN aborts with a corrupted heap at AVX-512 on Zen 5: bench/results)
      if torch=$("$py" "$here/pytorch_peer.py" --model "$m" --threads "$threads" --flush-denormal --compile \
        $(steps_args "$m") $(data_args "$m") 2> "$tmp/compile.err" | tail -n 1) && [[ "$torch" == "{"* ]]; then
        echo "round $r $m pytorch (compile):         $torch"
      else
        echo "round $r $m pytorch (compile):         FAILED: $(grep -v '^W[0-9]' "$tmp/compile.err" | tail -n 1)"
      fi
    fi
  done
  echo "after round $r ($((SECONDS - round_start)) s): $(uptime)"
done

tested=""
[[ -n "${TEST_IMAGES:-}" ]] && tested=", tested on $TEST_IMAGES images"
cnn_what="$([[ "$cnn_steps" != 0 ]] && echo "$cnn_steps steps" || echo "2 epochs (936 steps)") of batch 128$tested"
python3 "$here/compare_report.py" "$log" ${JSON:+--json "$JSON"} --what-cnn "$cnn_what" \
  --what-resnet18 "$resnet_steps steps of batch 128$tested" --what-gpt "$gpt_steps steps of batch 32 x 128 tokens"
echo
echo "end: $(uptime)"
