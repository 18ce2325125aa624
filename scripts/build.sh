#!/usr/bin/env bash
# Usage: scripts/build.sh [BUILD_DIR]   (default: build)
# Installs the dependencies, configures kiln (Release) and builds it with every core.
#   KILN_CMAKE_ARGS  extra arguments for the CMake configure step, e.g. "-DKILN_CUDA=OFF"
#   KILN_TARGETS     build only these targets (space-separated), e.g. "kiln-train"
#   CI               when set, CUDA code is compiled for sm_90 only (faster CI builds) and the
#                    Gloo process group is required
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:-build}"

bash "$ROOT/scripts/setup-deps.sh"

# nvcc is usually not on PATH on a fresh machine.
if [[ -d /usr/local/cuda/bin ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi
export CCACHE_DIR="${CCACHE_DIR:-$HOME/.cache/ccache}"
# Paths under the checkout are hashed relative to it, so another clone on the same machine (CI's
# fresh clone) reuses what this one compiled.
export CCACHE_BASEDIR="${CCACHE_BASEDIR:-$ROOT}"

args=(-S "$ROOT" -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release)
# Keep the generator of an existing build directory (CMake refuses to switch it).
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
  args+=(-G Ninja)
fi
if command -v ccache >/dev/null 2>&1; then
  args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
if [[ -n "${CI:-}" ]]; then
  # CI builds every distributed backend it can: Gloo is required there (docs/distributed.md).
  args+=(-DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_GLOO=ON)
fi
if [[ -n "${KILN_CMAKE_ARGS:-}" ]]; then
  # Word-split on purpose: KILN_CMAKE_ARGS holds several arguments.
  read -r -a extra <<<"$KILN_CMAKE_ARGS"
  args+=("${extra[@]}")
fi

echo "+ cmake ${args[*]}"
cmake "${args[@]}"
targets=()
if [[ -n "${KILN_TARGETS:-}" ]]; then
  read -r -a names <<<"$KILN_TARGETS"
  targets=(--target "${names[@]}")
fi
echo "+ cmake --build $BUILD_DIR -j$(nproc) ${targets[*]}"
cmake --build "$BUILD_DIR" -j"$(nproc)" "${targets[@]}"
