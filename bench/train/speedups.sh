#!/usr/bin/env bash
# Usage: bench/train/speedups.sh [KILN_TRAIN] [STEPS]
# Training throughput of kiln-train with each speed-up switched on or off, one run per row, all
# in one invocation so the rows are comparable (same machine, same minute). Prints a Markdown
# table: images/s, the ratio to the baseline row, and the test accuracy after STEPS steps.
# KILN_TRAIN_ARGS is added to every run (e.g. "--data DIR" on a machine without the data package).
set -euo pipefail
bin="${1:-build/bin/kiln-train}"
steps="${2:-150}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

run() {  # run LABEL ARGS...
  local label="$1"; shift
  local line
  # shellcheck disable=SC2086
  line=$("$bin" --epochs 1 --max-steps "$steps" --log-every 1000 --out "$tmp/run" ${KILN_TRAIN_ARGS:-} "$@" 2>/dev/null | tail -n 1)
  python3 - "$label" "$line" "$*" <<'PY'
import json, sys
label, line, args = sys.argv[1], sys.argv[2], sys.argv[3]
d = json.loads(line)
print(f"{label}\t{d['samples_per_second']:.0f}\t{d['test_accuracy']:.4f}\t{args}")
PY
}

{
  run "baseline (defaults: 2 workers, AdamW fused, onecycle)"
  run "workers 0 (load on the training thread)" --workers 0
  run "channels_last" --channels-last
  run "gradient accumulation x2 (batch 64 x 2)" --batch-size 64 --grad-accum 2
  run "activation checkpointing" --checkpoint-activations
  run "AMP bf16 (slow on a CPU: no fast bf16 arithmetic)" --amp bf16
  run "gradient clipping 1.0" --clip-grad 1.0
  run "EMA 0.999" --ema 0.999
  run "SGD + nesterov instead of AdamW" --optimizer sgd
  run "batch 256" --batch-size 256
  run "denormals not flushed (matters late in training: see docs/guide.md)" --flush-denormal false
  run "layers one by one (no nn::fuse)" --no-fuse
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    # GPU-only speed-ups (the default device is then the GPU): the guide's claims to reproduce
    run "pageable memory (no pinned staging)" --pin-memory false
    run "workers 4" --workers 4
    run "cuDNN autotuning off" --no-cudnn-benchmark
    run "AMP fp16 + loss scaling" --amp fp16
    run "AMP bf16 + channels_last" --amp bf16 --channels-last
    run "CUDA graphs" --cuda-graphs
    run "CUDA graphs + AMP bf16 + channels_last" --cuda-graphs --amp bf16 --channels-last
  fi
} > "$tmp/rows.tsv"

python3 - "$tmp/rows.tsv" "$steps" <<'PY'
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1])]
base = float(rows[0][1])
print(f"kiln-train --model cnn, {sys.argv[2]} steps per row, throughput over the training steps")
print()
print("| configuration | images/s | vs baseline | test accuracy | flags |")
print("|---|---|---|---|---|")
for label, sps, acc, args in rows:
    print(f"| {label} | {float(sps):,.0f} | {float(sps)/base:.2f}x | {float(acc)*100:.2f}% | `{args or '-'}` |")
PY
