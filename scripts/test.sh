#!/usr/bin/env bash
# Usage: scripts/test.sh [BUILD_DIR]   (default: build)
# The one test command: installs the dependencies, builds, runs every test with CTest
# (GPU tests are reported as skipped on a machine without a GPU), then checks that the
# installed CMake package works for a separate consumer project.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${1:-build}"

# Everything, whatever an earlier scripts/train.sh configured in the same folder (it builds the
# main job alone): tests, benches, examples, and CUDA when nvcc is found (CI: sm_90 only).
arch=""
[[ -z "${CI:-}" ]] && arch='-DCMAKE_CUDA_ARCHITECTURES=80;90'
KILN_CMAKE_ARGS="-DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON -DKILN_BUILD_EXAMPLES=ON -DKILN_CUDA=AUTO $arch ${KILN_CMAKE_ARGS:-}" \
  bash "$ROOT/scripts/build.sh" "$BUILD_DIR"

echo "+ ctest --test-dir $BUILD_DIR --output-on-failure -j2"
rc=0
ctest --test-dir "$BUILD_DIR" --output-on-failure -j2 || rc=$?
if [[ $rc -ne 0 ]]; then
  echo "test.sh: ctest failed (exit code $rc)" >&2
  exit "$rc"
fi

bash "$ROOT/scripts/check-package.sh" "$BUILD_DIR"
echo "test.sh: all tests passed"
