#!/usr/bin/env bash
# Usage: scripts/gpu-suite.sh STAGE OUTDIR
#   build-test  build for sm_90, run test_cuda one test file at a time (a sticky CUDA error in one
#               group cannot hide the others), then compute-sanitizer memcheck and racecheck over
#               a fast subset
#   bench       the GPU benches, each beside its peer in the same run (cuBLAS, the device copy,
#               PyTorch on the same GPU), and the kiln / PyTorch ratio table
#   train       kiln-train on the GPU (CNN, ResNet-18, char GPT, GPT-2 124M-shaped steps), the
#               GPU rows of bench/train/speedups.sh, and the PyTorch peer of the GPT-2 run
#   rehearse    on a machine without a GPU: every stage above from the bundle alone, with
#               Debian's -dev packages, the data packages and the toolkit's cuDNN/NCCL hidden
#               (root, private mount namespace); GPU-only commands are expected to skip
# OUTDIR receives four files: summary.md (a row per step), env.txt (the machine), results.md (the
# stage's tables) and logs.tar.gz (every log); rehearse writes them into OUTDIR/<stage>/, plus
# OUTDIR/hidden.txt (what it hid).
# Each stage fits one 10-minute device command: every step runs under `timeout`, the stage
# stops starting steps after KILN_STAGE_SECONDS (default 520), and a failing step never stops
# the others. The bundle (scripts/gpu-pack.sh, default .gpu) must travel with the source tree;
# docs/gpu.md gives the exact device commands.
set -uo pipefail

stage="${1:?usage: scripts/gpu-suite.sh build-test|bench|train|rehearse OUTDIR}"
out="${2:?usage: scripts/gpu-suite.sh STAGE OUTDIR}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
BUNDLE="$(cd "${KILN_GPU_BUNDLE:-$ROOT/.gpu}" 2>/dev/null && pwd || echo "${KILN_GPU_BUNDLE:-$ROOT/.gpu}")"
BUILD="${KILN_GPU_BUILD:-$ROOT/build-gpu}"
PY="${PYTHON:-python3}"
REHEARSE="${KILN_REHEARSE:-0}"   # 1 inside `rehearse`: no GPU here, GPU commands skip
STAGE_SECONDS="${KILN_STAGE_SECONDS:-520}"
# The build step's limit fits the GPU machine's 16 cores. The rehearsal runs on the 2-core CI
# machine, where a cold build of kiln + test_cuda takes several times longer: it gets its own
# limit (and the stage the difference), since what it checks is that the bundle builds at all.
BUILD_SECONDS=330
if [[ "$REHEARSE" == 1 ]]; then
  BUILD_SECONDS="${KILN_REHEARSE_BUILD_SECONDS:-1500}"
  STAGE_SECONDS=$(( STAGE_SECONDS + BUILD_SECONDS - 330 ))
fi
export PATH="/usr/local/cuda/bin:$PATH"

# ---------------------------------------------------------------- rehearse: hide, then re-enter
if [[ "$stage" == rehearse ]]; then
  [[ $(id -u) -eq 0 ]] || { echo "rehearse: needs root (private mount namespace)" >&2; exit 2; }
  [[ -f "$BUNDLE/MANIFEST" ]] || bash "$ROOT/scripts/gpu-pack.sh" "$BUNDLE" || exit 1
  exec unshare --mount --propagation private bash "$ROOT/scripts/gpu-rehearse.sh" "$out"
fi

case "$stage" in build-test|bench|train) ;; *) echo "unknown stage '$stage'" >&2; exit 2 ;; esac

logs="$out/logs-$stage"
mkdir -p "$logs"
summary="$out/summary.md"
results="$out/results.md"
start_all=$(date +%s)
failures=0

# ---------------------------------------------------------------- steps
# step NAME SECONDS COMMAND...: runs COMMAND under timeout with its log in logs/NAME.log and adds a
# row to the summary. Exit 77 is "skipped" (no device); on a GPU machine that is a failure, since
# the GPU was expected. A step that no longer fits the stage's time is not started.
step() {
  local name="$1" secs="$2"; shift 2
  local log="$logs/$name.log" t0 rc result left
  left=$(( STAGE_SECONDS - ($(date +%s) - start_all) ))
  if (( left < 15 )); then
    echo "| $name | NOT RUN (stage time used up) | 0 | |" >> "$summary"
    failures=$((failures + 1))
    return 1
  fi
  (( secs > left - 5 )) && secs=$(( left - 5 ))
  t0=$(date +%s)
  echo "+ $*" > "$log"
  timeout --kill-after=10 "$secs" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) result=ok ;;
    77) if [[ "$REHEARSE" == 1 ]]; then result="skipped (no GPU here)"; rc=0; else result="FAILED (77: no GPU found)"; fi ;;
    124|137) result="TIMEOUT (${secs} s)" ;;
    *) result="FAILED ($rc)" ;;
  esac
  (( rc == 0 )) || failures=$((failures + 1))
  echo "| $name | $result | $(( $(date +%s) - t0 )) | logs-$stage/$name.log |" >> "$summary"
  echo "[$(date -u +%H:%M:%S)] $name: $result" >&2
  return $rc
}

# train NAME SECONDS KILN-TRAIN-ARGS...: a kiln-train step on the GPU; in a rehearsal on the CPU
# for three steps (its own --max-steps dropped), so the data paths and flags are checked there.
train() {
  local name="$1" secs="$2" a=() x skip=0
  shift 2
  for x in "$@"; do
    if (( skip )); then skip=0; continue; fi
    if [[ "$REHEARSE" == 1 && "$x" == --max-steps ]]; then skip=1; continue; fi
    a+=("$x")
  done
  if [[ "$REHEARSE" == 1 ]]; then a=(--device cpu --max-steps 3 --threads 2 "${a[@]}"); else a=(--device cuda "${a[@]}"); fi
  step "$name" "$secs" "$BUILD/bin/kiln-train" "${a[@]}"
}

# train_one_rank NAME SECONDS KILN-TRAIN-ARGS...: kiln-train as the only rank of a kiln-run job on
# the GPU, so DDP (or ZeRO-1 with --zero) runs over the nccl group. The rehearsal skips it: the
# GPU machine's build, and so the rehearsal's, has no Gloo for a CPU run of the same command.
train_one_rank() {
  local name="$1" secs="$2"
  shift 2
  if [[ "$REHEARSE" == 1 ]]; then
    step "$name" 5 bash -c 'echo "needs NCCL and a GPU (no Gloo in this build for a CPU run)"; exit 77'
    return
  fi
  step "$name" "$secs" "$BUILD/bin/kiln-run" --nproc-per-node 1 --master-port $((20000 + RANDOM % 20000)) \
    "$BUILD/bin/kiln-train" --device cuda "$@"
}

# ---------------------------------------------------------------- environment (every stage)
nvidia_lib_dirs() {  # the cuDNN and NCCL pip wheels' lib folders of the python3 on PATH
  "$PY" - <<'PY' 2>/dev/null
import glob, os, site, sysconfig
roots = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]] + site.getsitepackages())
for r in roots:
    for name in ("cudnn", "nccl"):
        d = os.path.join(r, "nvidia", name, "lib")
        if os.path.isdir(d):
            print(d)
PY
}
for d in ${KILN_EXTRA_LIB_DIRS:-} $(nvidia_lib_dirs); do
  export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done

find_sanitizer() {
  command -v compute-sanitizer && return
  local c
  for c in /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
           /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [[ -x "$c" ]] && { echo "$c"; return; }
  done
}

{
  echo "stage $stage, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$([[ "$REHEARSE" == 1 ]] && echo ', REHEARSAL (no GPU)')"
  echo "== nvidia-smi";   nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3
  echo "== nvcc";         nvcc --version 2>&1 | tail -2
  echo "== cmake/ninja";  cmake --version 2>&1 | head -1; ninja --version 2>&1
  echo "== host";         echo "$(nproc) cores, $(free -g 2>/dev/null | awk '/Mem:/{print $2}') GiB"; g++ --version 2>&1 | head -1
  echo "== python";       "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'gpu', torch.cuda.is_available())" 2>&1 | tail -1
  echo "== wheel libs";   for d in $(nvidia_lib_dirs); do echo "$d: $(ls "$d" | tr '\n' ' ')"; done
  echo "== libz";         ldconfig -p 2>/dev/null | grep -m1 'libz.so.1' || echo "libz.so.1 not in the loader cache"
  echo "== omp.h";        echo '#include <omp.h>' | g++ -fopenmp -x c++ -fsyntax-only - 2>&1 && echo found
  echo "== sanitizer";    find_sanitizer || echo "compute-sanitizer not found"
  echo "== bundle";       head -1 "$BUNDLE/MANIFEST" 2>&1; du -sh "$BUNDLE" 2>&1
  echo "== LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
} > "$out/env.txt" 2>&1

{
  echo "# GPU suite, stage \`$stage\`$([[ "$REHEARSE" == 1 ]] && echo ' (rehearsal, no GPU)')"
  echo
  echo "$(head -1 "$out/env.txt")  "
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)"
  echo
  echo "| step | result | seconds | log |"
  echo "|---|---|---|---|"
} >> "$summary"

# ---------------------------------------------------------------- build
# Only the targets a stage needs, for sm_90 with this machine's CPU flags, dependencies from the
# bundle. cuDNN is AUTO so that a machine without it still runs everything else; the
# `cudnn-found` step fails visibly instead. An existing build folder (a warm machine) is reused.
configure() {
  [[ -f "$BUNDLE/MANIFEST" ]] || { echo "no bundle at $BUNDLE: run scripts/gpu-pack.sh here and carry .gpu" >&2; return 1; }
  [[ -f "$BUILD/build.ninja" ]] && return 0
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDNN=AUTO \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_DEPS_DIR="$BUNDLE" ${KILN_CMAKE_ARGS:-}
}
build() {  # build TARGET...
  configure && cmake --build "$BUILD" -j"$(nproc)" --target "$@"
}
export -f configure build
export ROOT BUNDLE BUILD
bench_targets() {
  local f
  for f in "$ROOT"/bench/cuda/*.cpp "$ROOT"/bench/cuda/*.cu; do echo "bench_cuda_$(basename "${f%.*}")"; done
}

# ---------------------------------------------------------------- stages
case "$stage" in
build-test)
  step build "$BUILD_SECONDS" bash -c 'build "$@"' build kiln test_cuda || true
  step cudnn-found 5 grep -q "KILN_WITH_CUDNN 1" "$BUILD/include/kiln/config.h" || true
  # one group per test file: Catch2 tags each case with its file ([#test_cuda_ops] ...)
  for f in "$ROOT"/tests/cuda/test_*.cpp; do
    g=$(basename "$f" .cpp)
    step "$g" 90 "$BUILD/bin/test_cuda" --filenames-as-tags "[#$g]" --durations yes || true
  done
  sanitizer=$(find_sanitizer)
  if [[ -z "$sanitizer" ]]; then
    if [[ "$REHEARSE" == 1 ]]; then
      echo "| compute-sanitizer | skipped (not installed here) | 0 | |" >> "$summary"
    else
      echo "| compute-sanitizer | FAILED (not found) | 0 | |" >> "$summary"; failures=$((failures + 1))
    fi
  else
    # fast groups whose kernels index global memory by hand (memcheck) or share memory (racecheck)
    for g in test_cuda_ops test_cuda_indexing test_cuda_xent; do
      step "memcheck-$g" 120 "$sanitizer" --tool memcheck --error-exitcode 3 \
        "$BUILD/bin/test_cuda" --filenames-as-tags "[#$g]" || true
    done
    for g in test_cuda_norm test_cuda_attention; do
      step "racecheck-$g" 120 "$sanitizer" --tool racecheck --racecheck-report hazard --error-exitcode 3 \
        "$BUILD/bin/test_cuda" --filenames-as-tags "[#$g]" || true
    done
  fi
  ;;

bench)
  # shellcheck disable=SC2046
  step build "$BUILD_SECONDS" bash -c 'build "$@"' build kiln $(bench_targets) || true
  for t in $(bench_targets); do
    step "$t" 90 env KILN_BENCH_JSON="$logs/$t.jsonl" "$BUILD/bin/$t" || true
  done
  step pytorch-peer 150 "$PY" "$ROOT/bench/cuda/pytorch_peer.py" --out "$logs/pytorch.jsonl" \
    $([[ "$REHEARSE" == 1 ]] && echo --list) || true
  step compare 30 "$PY" "$ROOT/bench/cuda/compare.py" --out "$results" "$logs"/*.jsonl || true
  ;;

train)
  step build "$BUILD_SECONDS" bash -c 'build "$@"' build kiln kiln-train kiln-run || true
  fm="$BUNDLE/data/fashion-mnist"
  text="$BUNDLE/data/fortunes"
  {
    train train-cnn 90 --data "$fm" --out "$logs/cnn" || true
    train_one_rank train-cnn-ddp-1gpu 45 --data "$fm" --max-steps 100 --out "$logs/cnn-ddp" || true
    train_one_rank train-cnn-zero-1gpu 45 --data "$fm" --max-steps 100 --zero --out "$logs/cnn-zero" || true
    train train-cnn-10-epochs 120 --data "$fm" --epochs 10 --batch-size 256 --amp bf16 --out "$logs/cnn10" || true
    train train-resnet18 120 --model resnet18 --data "$fm" --max-steps 300 --amp bf16 --channels-last \
      --out "$logs/resnet18" || true
    train train-gpt-char 90 --model gpt --data "$text" --out "$logs/gpt" || true
    # GPT-2 124M's shapes need a GPU: a rehearsal checks the same command with the char model
    train train-gpt2-124m 120 --model gpt \
      --gpt-size "$([[ "$REHEARSE" == 1 ]] && echo char || echo 124m)" \
      --batch-size 16 --amp bf16 --max-steps 30 --log-every 10 --data "$text" --out "$logs/gpt2" || true
    step pytorch-gpt2-124m 120 "$PY" "$ROOT/bench/train/pytorch_gpt_peer.py" --data "$text" --batch-size 16 \
      --steps 30 $([[ "$REHEARSE" == 1 ]] && echo --list) || true
    if [[ "$REHEARSE" == 1 ]]; then
      step speedups 150 env KILN_TRAIN_ARGS="--data $fm --threads 2" bash "$ROOT/bench/train/speedups.sh" \
        "$BUILD/bin/kiln-train" 2 || true
    else
      step speedups 240 env KILN_TRAIN_ARGS="--data $fm" bash "$ROOT/bench/train/speedups.sh" \
        "$BUILD/bin/kiln-train" 300 || true
    fi
  }
  {
    echo "## kiln-train, last line of each run"
    echo
    for r in train-cnn train-cnn-ddp-1gpu train-cnn-zero-1gpu train-cnn-10-epochs train-resnet18 train-gpt-char train-gpt2-124m pytorch-gpt2-124m; do
      echo "- $r: \`$(grep -E '^(\[rank 0\] )?\{' "$logs/$r.log" 2>/dev/null | tail -n 1)\`"
    done
    echo
    echo "## speed-ups (bench/train/speedups.sh)"
    echo
    grep '^|\|^kiln-train' "$logs/speedups.log" 2>/dev/null
  } > "$results"
  ;;
esac

# ---------------------------------------------------------------- wrap up
{
  echo
  echo "$failures step(s) failed; $(( $(date +%s) - start_all )) s in all."
} >> "$summary"
tar -czf "$out/logs.tar.gz" -C "$out" "logs-$stage" 2>/dev/null && rm -rf "$logs"
cat "$summary"
[[ -f "$results" ]] && cat "$results"
exit $(( failures > 0 ))
