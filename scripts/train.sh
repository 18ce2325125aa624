#!/usr/bin/env bash
# Usage: scripts/train.sh [kiln-train ARGS...]
# Installs the dependencies, builds kiln into build/, and runs the main job, kiln-train (by
# default: the Fashion-MNIST CNN, 2 epochs, outputs in kiln-train-out/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

# Only what the main job needs: the library and kiln-train; CUDA only when a GPU is present, and
# then for that GPU's architecture alone (scripts/test.sh builds everything in the same folder).
args="-DKILN_BUILD_TESTS=OFF -DKILN_BUILD_BENCH=OFF"
cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d ' .' || true)
if [[ "$cc" =~ ^[0-9]+$ ]]; then
  args+=" -DKILN_CUDA=AUTO -DCMAKE_CUDA_ARCHITECTURES=$cc"
else
  args+=" -DKILN_CUDA=OFF"
fi
KILN_CMAKE_ARGS="$args ${KILN_CMAKE_ARGS:-}" KILN_TARGETS="kiln-train" bash scripts/build.sh build
exec build/bin/kiln-train "$@"
