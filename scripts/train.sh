#!/usr/bin/env bash
# Usage: scripts/train.sh [ARGS...]
# Installs the dependencies, builds kiln into build/, and runs the main job. Until the
# kiln-train program exists it runs the autograd example instead (ARGS are then ignored).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

bash scripts/build.sh build

if [[ -x build/bin/kiln-train ]]; then
  exec build/bin/kiln-train "$@"
fi
echo "train.sh: build/bin/kiln-train does not exist yet; running build/bin/kiln-example-autograd"
exec build/bin/kiln-example-autograd
