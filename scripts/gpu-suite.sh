#!/usr/bin/env bash
# Usage: scripts/gpu-suite.sh [rehearse] OUT [gpu-verdict options: --only REGEX, --seconds N]
# The fallback to the pack: builds kiln ON THE GPU MACHINE from the source tree and the pack's
# header-only dependencies (.gpu/deps.tar.xz), then runs scripts/gpu-verdict.sh on that build.
# For the second call of a window in which an edit must be rebuilt there and no fixed pack could
# be made here (docs/gpu.md); otherwise carry a fresh pack, which needs no compilation.
#   - the build: sm_90 only, this machine's CPU flags, cuDNN/NCCL from the pip wheels of the
#     python3 on PATH (cmake/kiln_cuda_libraries.cmake), no Gloo; about 3 minutes on 16 cores,
#     the step's limit KILN_GPU_BUILD_SECONDS (default 330). An existing build folder (a warm
#     machine) is reused, so only what changed is compiled.
#   - `rehearse`: on a machine without a GPU, as root, in a private mount namespace: Debian's -dev
#     and data packages and the toolkit's cuDNN/NCCL hidden, the wheels' layout faked
#     (scripts/gpu-rehearse.sh), the same build, then the verdict's rehearsal. CI runs it.
# OUT receives the verdict's files plus build.log.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ "${1:-}" == rehearse ]]; then
  shift
  out="${1:?usage: scripts/gpu-suite.sh [rehearse] OUT [verdict options]}"
  [[ $(id -u) -eq 0 ]] || { echo "gpu-suite rehearse: needs root (private mount namespace)" >&2; exit 2; }
  [[ -f "$ROOT/.gpu/deps.tar.xz" ]] || bash "$ROOT/scripts/gpu-pack.sh" || exit 1
  exec unshare --mount --propagation private bash "$ROOT/scripts/gpu-rehearse.sh" "$@"
fi
out="${1:?usage: scripts/gpu-suite.sh [rehearse] OUT [verdict options]}"
shift
mkdir -p "$out"
out="$(cd "$out" && pwd)"
PACK="${KILN_GPU_PACK:-$ROOT/.gpu}"
BUILD="${KILN_GPU_BUILD:-$ROOT/build-gpu}"
DEPS="$BUILD-deps"
PY="${PYTHON:-python3}"
export PATH="/usr/local/cuda/bin:$PATH"
[[ -f "$PACK/deps.tar.xz" ]] || { echo "gpu-suite: no pack at $PACK: run scripts/gpu-pack.sh here and carry .gpu" >&2; exit 2; }

build() {
  if [[ ! -f "$DEPS/deps/MANIFEST" ]]; then
    mkdir -p "$DEPS"
    "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$PACK/deps.tar.xz" "$DEPS" || return 1
  fi
  if [[ ! -f "$BUILD/build.ninja" ]]; then
    cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDNN=AUTO \
          -DKILN_GLOO=OFF -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_DEPS_DIR="$DEPS/deps" ${KILN_CMAKE_ARGS:-} || return 1
  fi
  local benches
  benches=$(cd "$ROOT/bench/cuda" && ls ./*.cpp ./*.cu | sed 's|^\./|bench_cuda_|; s|\.[a-z]*$||')
  # shellcheck disable=SC2086
  cmake --build "$BUILD" -j"$(nproc)" --target kiln test_cuda test_core bench_matmul kiln-train kiln-run $benches
}

export BUILD DEPS PACK PY ROOT
t0=$(date +%s)
timeout --kill-after=10 "${KILN_GPU_BUILD_SECONDS:-330}" bash -c "$(declare -f build); build" > "$out/build.log" 2>&1
rc=$?
echo "gpu-suite: build $([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)") in $(( $(date +%s) - t0 )) s (build.log)" >&2
if [[ $rc -ne 0 ]]; then
  tail -30 "$out/build.log" >&2
  exit 1
fi
exec bash "$ROOT/scripts/gpu-verdict.sh" --bin-dir "$BUILD" "$@" "$out"
