#!/usr/bin/env bash
# Usage: [ROUNDS=N] bench/train/compare_pytorch.sh [KILN_TRAIN] [PYTHON]
# kiln-train's default CNN run and its PyTorch peer (bench/train/pytorch_peer.py: same model,
# batch, optimizer, schedule and thread count) back to back on this machine's CPU, PyTorch both
# as it comes and with denormals flushed, then the throughput ratios. PYTHON must have torch and numpy (e.g. a venv: pip install torch numpy).
# ROUNDS (default 1) repeats the three runs in turn and also reports the median of each, so that
# a shared VM whose speed drifts by 10-20% over minutes weighs on all three alike.
# Not a test: a measurement for bench/results and kiln-train's target of 2x PyTorch's speed (docs/guide.md, "kiln-train on the CPU").
set -euo pipefail
bin="${1:-build/bin/kiln-train}"
py="${2:-python3}"
rounds="${ROUNDS:-1}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
threads=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
runs=()
for ((r = 1; r <= rounds; r++)); do
  kiln=$("$bin" --device cpu --threads "$threads" --out "$tmp/kiln" | tail -n 1)
  # PyTorch as it comes, and with torch.set_flush_denormal(True), the counterpart of kiln-train's
  # default --flush-denormal true (late in training the CNN's gradients go denormal)
  torch=$("$py" "$here/pytorch_peer.py" /usr/share/datasets/fashion-mnist "$threads" | tail -n 1)
  torch_flush=$("$py" "$here/pytorch_peer.py" /usr/share/datasets/fashion-mnist "$threads" flush | tail -n 1)
  echo "round $r kiln:                     $kiln"
  echo "round $r pytorch:                  $torch"
  echo "round $r pytorch (flush denormal): $torch_flush"
  runs+=("$kiln" "$torch" "$torch_flush")
done
python3 - "${runs[@]}" <<'PY'
import json, statistics, sys
runs = [json.loads(a) for a in sys.argv[1:]]
kiln, torch, flush = runs[0::3], runs[1::3], runs[2::3]
def report(k, t, label):
    mode = "flush denormal" if t.get("flush_denormal") else "default"
    print(f"{label}throughput kiln / PyTorch ({t['framework']}, {mode}, {t['threads']} threads): "
          f"{k['samples_per_second']:.0f} / {t['samples_per_second']:.0f} images/s = "
          f"{k['samples_per_second'] / t['samples_per_second']:.2f}x; test accuracy "
          f"{100 * k['test_accuracy']:.2f}% / {100 * t['test_accuracy']:.2f}%")
for i, k in enumerate(kiln):
    label = f"round {i + 1}: " if len(kiln) > 1 else ""
    report(k, torch[i], label)
    report(k, flush[i], label)
if len(kiln) > 1:
    def med(rs):
        m = dict(rs[0])
        m["samples_per_second"] = statistics.median(r["samples_per_second"] for r in rs)
        return m
    report(med(kiln), med(torch), f"median of {len(kiln)}: ")
    report(med(kiln), med(flush), f"median of {len(kiln)}: ")
PY
