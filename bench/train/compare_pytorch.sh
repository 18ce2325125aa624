#!/usr/bin/env bash
# Usage: bench/train/compare_pytorch.sh [KILN_TRAIN] [PYTHON]
# kiln-train's default CNN run and its PyTorch peer (bench/train/pytorch_peer.py: same model,
# batch, optimizer, schedule and thread count) back to back on this machine's CPU, then the
# throughput ratio. PYTHON must have torch and numpy (e.g. a venv: pip install torch numpy).
# Not a test: a measurement for bench/results and the kiln-train issue's "2x PyTorch" target.
set -euo pipefail
bin="${1:-build/bin/kiln-train}"
py="${2:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
threads=$(nproc)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
kiln=$("$bin" --device cpu --threads "$threads" --out "$tmp/kiln" | tail -n 1)
torch=$("$py" "$here/pytorch_peer.py" /usr/share/datasets/fashion-mnist "$threads" | tail -n 1)
echo "kiln:    $kiln"
echo "pytorch: $torch"
python3 - "$kiln" "$torch" <<'PY'
import json, sys
k, t = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"throughput kiln / PyTorch ({t['framework']}, {t['threads']} threads): "
      f"{k['samples_per_second']:.0f} / {t['samples_per_second']:.0f} images/s = "
      f"{k['samples_per_second'] / t['samples_per_second']:.2f}x; test accuracy "
      f"{100 * k['test_accuracy']:.2f}% / {100 * t['test_accuracy']:.2f}%")
PY
