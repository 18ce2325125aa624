#!/usr/bin/env bash
# Usage: scripts/gpu-suite.sh OUTDIR
# The one command to run on a machine with a GPU (DESIGN.md §4): builds for sm_90, runs every
# test including the GPU binaries, then the benches and the main job, and writes each log plus a
# summary table into OUTDIR. Copy the summary into bench/results/<date>-<gpu>.md afterwards.
set -uo pipefail

out="${1:?usage: scripts/gpu-suite.sh OUTDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mkdir -p "$out"
build=build-gpu
summary="$out/summary.md"

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
{
  echo "# GPU suite, $(date -u +%Y-%m-%dT%H:%MZ)"
  echo
  echo "GPU: ${gpu:-none found}  |  host: $(nproc) cores  |  commit: $(git rev-parse --short HEAD 2>/dev/null)"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
} > "$summary"

step() {  # step NAME COMMAND...
  local name="$1"; shift
  local log="$out/$name.log" start rc
  start=$(date +%s)
  "$@" > "$log" 2>&1
  rc=$?
  echo "| $name | $([ $rc -eq 0 ] && echo ok || echo "FAILED ($rc)") | $(( $(date +%s) - start )) | $name.log |" >> "$summary"
  return $rc
}

export PATH="/usr/local/cuda/bin:$PATH"
KILN_CMAKE_ARGS="-DKILN_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 ${KILN_CMAKE_ARGS:-}" \
  step build bash scripts/build.sh "$build" || { cat "$summary"; exit 1; }
step tests ctest --test-dir "$build" --output-on-failure -j4
step gpu-tests "$build/bin/test_cuda"
for b in "$build"/bin/bench_*; do
  step "$(basename "$b")" "$b"
done
step kiln-train "$build/bin/kiln-train" --out "$out/kiln-train"
step kiln-train-speedups bash bench/train/speedups.sh "$build/bin/kiln-train" 300
echo >> "$summary"
echo "Last line of kiln-train: \`$(tail -n 1 "$out/kiln-train.log" 2>/dev/null)\`" >> "$summary"
cat "$summary"
