#!/usr/bin/env bash
# Usage: bench/train/compare_pytorch.sh [KILN_TRAIN] [PYTHON]
# kiln-train's default CNN run and its PyTorch peer (bench/train/pytorch_peer.py: same model,
# batch, optimizer, schedule and thread count) back to back on this machine's CPU, PyTorch both
# as it comes and with denormals flushed, then the throughput ratios. PYTHON must have torch and numpy (e.g. a venv: pip install torch numpy).
# Not a test: a measurement for bench/results and the kiln-train issue's "2x PyTorch" target.
set -euo pipefail
bin="${1:-build/bin/kiln-train}"
py="${2:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
threads=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kiln=$("$bin" --device cpu --threads "$threads" --out "$tmp/kiln" | tail -n 1)
# PyTorch as it comes, and with torch.set_flush_denormal(True), the counterpart of kiln-train's
# default --flush-denormal true (late in training the CNN's gradients go denormal)
torch=$("$py" "$here/pytorch_peer.py" /usr/share/datasets/fashion-mnist "$threads" | tail -n 1)
torch_flush=$("$py" "$here/pytorch_peer.py" /usr/share/datasets/fashion-mnist "$threads" flush | tail -n 1)
echo "kiln:                    $kiln"
echo "pytorch:                 $torch"
echo "pytorch (flush denormal): $torch_flush"
python3 - "$kiln" "$torch" "$torch_flush" <<'PY'
import json, sys
k = json.loads(sys.argv[1])
for arg in sys.argv[2:]:
    t = json.loads(arg)
    mode = "flush denormal" if t.get("flush_denormal") else "default"
    print(f"throughput kiln / PyTorch ({t['framework']}, {mode}, {t['threads']} threads): "
          f"{k['samples_per_second']:.0f} / {t['samples_per_second']:.0f} images/s = "
          f"{k['samples_per_second'] / t['samples_per_second']:.2f}x; test accuracy "
          f"{100 * k['test_accuracy']:.2f}% / {100 * t['test_accuracy']:.2f}%")
PY
