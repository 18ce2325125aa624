#!/usr/bin/env bash
# Usage: scripts/train.sh [kiln-train ARGS...]
# Installs the dependencies, builds kiln into build/, and runs the main job, kiln-train (by
# default: the Fashion-MNIST CNN, 2 epochs, outputs in kiln-train-out/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/build.sh build
exec build/bin/kiln-train "$@"
