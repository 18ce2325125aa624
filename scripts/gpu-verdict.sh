#!/usr/bin/env bash
# Usage: scripts/gpu-verdict.sh [--rehearse] [--only REGEX] [--guide ARGS] [--seconds N] OUT
# The whole GPU verdict in one device command, from the pack that scripts/gpu-pack.sh made here
# (.gpu/, carried with the tree): no compilation on the GPU machine. In order of what a verdict
# needs most:
#   1. env.txt: GPU, driver, CPU, the CUDA libraries found and what the loader resolved
#   2. test_cuda, one process per test file (several at once), with the failing cases named;
#      compute-sanitizer memcheck over a fast subset and racecheck over the [racecheck] cases
#   3. the GPU benches one after another, then PyTorch on the same cases, and the ratio table
#   4. kiln-train on the GPU: the CNN to 93% test accuracy, AMP / channels_last / CUDA-graph
#      rows, GPT-2 124M-shaped steps beside PyTorch eager and torch.compile (the same step count,
#      steady-state rates after the same warm-up rule), a profiled step with sync-debug counting
#      (the profiler's CUDA event timing), the slow side of the guides' small habits, one-rank DDP
#      and ZeRO-1 over NCCL, and two ranks sharing the GPU over gloo (pinned host staging)
# OUT receives at most 8 files: summary.md (a row per step), results.md (the tables), env.txt,
# logs.tar.gz (every log) and bench.jsonl (every bench row, kiln's and PyTorch's).
#   --rehearse     run here without a GPU from the pack alone: GPU binaries must skip (exit 77),
#                  kiln-train runs three CPU steps, the PyTorch peers only check their arguments
#   --only REGEX   run only the steps whose names match (the rerun after a fix)
#   --guide ARGS   also run kiln-guide --device cuda ARGS (e.g. "--quick") after everything else,
#                  its reports in OUT/guide-N.tar.gz (docs/guide.md's GPU rows); --only guide runs
#                  it alone; given twice, two reports one after the other (a short one first).
#                  After the whole verdict it gets what the budget leaves: raise --seconds
#   --seconds N    the wall-time budget (default 450); each phase has its share, a step that no
#                  longer fits is reported NOT RUN, and every step runs under `timeout`
#   --archive F    the pack's binaries from .gpu/F instead of kiln.tar.xz (asan.tar.xz: the
#                  AddressSanitizer build, for host memory errors)
#   --bin-dir D    the binaries of the build folder D instead (scripts/gpu-suite.sh)
# docs/gpu.md gives the device commands and their measured budget.
set -uo pipefail

REHEARSE=0 ONLY="" GUIDE=() BUDGET=450 ARCHIVE=kiln.tar.xz BIN_DIR=""
while [[ $# -gt 1 ]]; do
  case "$1" in
    --rehearse) REHEARSE=1; shift ;;
    --only) ONLY="$2"; shift 2 ;;
    --guide) GUIDE+=("$2"); shift 2 ;;
    --seconds) BUDGET="$2"; shift 2 ;;
    --archive) ARCHIVE="$2"; shift 2 ;;
    --bin-dir) BIN_DIR="$2"; shift 2 ;;
    *) echo "gpu-verdict: unknown option $1" >&2; exit 2 ;;
  esac
done
out="${1:?usage: scripts/gpu-verdict.sh [--rehearse] [--only REGEX] [--guide ARGS] [--seconds N] OUT}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PACK="$(cd "${KILN_GPU_PACK:-$ROOT/.gpu}" 2>/dev/null && pwd)" || { echo "gpu-verdict: no pack at ${KILN_GPU_PACK:-$ROOT/.gpu}: run scripts/gpu-pack.sh and carry .gpu" >&2; exit 2; }
PY="${PYTHON:-python3}"
work=$(mktemp -d /tmp/kiln-verdict.XXXXXX)
trap 'rm -rf "$work"' EXIT
if [[ -n "$BIN_DIR" ]]; then  # a build folder (scripts/gpu-suite.sh): its bin/ and lib/
  ln -s "$(cd "$BIN_DIR" && pwd)/bin" "$work/bin"
  ln -s "$(cd "$BIN_DIR" && pwd)/lib" "$work/lib"
else
  # the binaries, unpacked with Python's tarfile (every image with python3 has lzma; not every one xz)
  [[ -f "$PACK/$ARCHIVE" ]] || { echo "gpu-verdict: $PACK has no $ARCHIVE: run scripts/gpu-pack.sh" >&2; exit 2; }
  "$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$PACK/$ARCHIVE" "$work" ||
    { echo "gpu-verdict: could not unpack $PACK/$ARCHIVE" >&2; exit 2; }
fi
# an AddressSanitizer build (scripts/gpu-pack.sh --asan): CUDA needs the shadow gap unprotected
export ASAN_OPTIONS="${ASAN_OPTIONS:-protect_shadow_gap=0:detect_leaks=0}"
BIN="$work/bin"
mkdir -p "$work/runs"   # kiln-train's --out folders and the PyTorch peer's rows: not brought back
FM="$PACK/data/fashion-mnist"
TEXT="$PACK/data/fortunes"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
logs="$out/logs"
rows="$logs/.rows"
rm -rf "$logs"
mkdir -p "$rows"
START=$(date +%s)
cd "$ROOT"

# ---------------------------------------------------------------- the machine's libraries
# cuDNN, NCCL, cuBLAS(Lt) and cudart are not in the pack: they come from the GPU machine's pip
# wheels (site-packages/nvidia/*/lib) and its toolkit. The pack's fallback folder (libgomp, libz)
# comes last, for an image that lacks them.
wheel_lib_dirs() {
  "$PY" - <<'PY' 2>/dev/null
import glob, os, site, sysconfig
roots = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]] + site.getsitepackages())
for r in roots:
    for d in sorted(glob.glob(os.path.join(r, "nvidia", "*", "lib"))):
        print(d)
PY
}
lib_path=""
for d in $(wheel_lib_dirs | grep -E '/(cudnn|nccl)/lib$') /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(wheel_lib_dirs | grep -vE '/(cudnn|nccl)/lib$'); do
  [[ -d "$d" ]] && lib_path="$lib_path${lib_path:+:}$d"
done
# last: the pack's own lib/ (libkiln and the Gloo libraries a GPU image lacks)
export LD_LIBRARY_PATH="$lib_path${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$work/lib"
if grep -q 'not found' <<<"$(ldd "$work/lib/libkiln.so.0")"; then  # only then: the system's own come first
  export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$work/lib/fallback"
fi
export PATH="/usr/local/cuda/bin:$PATH"

find_sanitizer() {
  command -v compute-sanitizer && return
  local c
  for c in /usr/local/cuda*/bin/compute-sanitizer /usr/local/cuda*/compute-sanitizer/compute-sanitizer \
           /opt/nvidia/*/compute-sanitizer/compute-sanitizer; do
    [[ -x "$c" ]] && { echo "$c"; return; }
  done
}

{
  echo "gpu-verdict $(date -u +%Y-%m-%dT%H:%M:%SZ), $([[ -n "$BIN_DIR" ]] && echo "built on this machine in $BIN_DIR" || echo "pack of commit $(sed -n 's/.* from commit \([0-9a-f]*\).*/\1/p' "$PACK/MANIFEST" | head -1), $ARCHIVE")$([[ $REHEARSE == 1 ]] && echo ', REHEARSAL (no GPU)')"
  echo "== pack";        head -3 "$PACK/MANIFEST" 2>&1; du -sh "$PACK" 2>&1
  echo "== nvidia-smi";  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.sm,temperature.gpu,power.draw --format=csv 2>&1 | head -3
  echo "== cpu";         grep -m1 'model name' /proc/cpuinfo; echo "$(nproc) cores; $(grep -o -m1 -w 'avx512f' /proc/cpuinfo || grep -o -m1 -w avx2 /proc/cpuinfo || echo 'no avx2')"
  echo "== memory";      free -g 2>/dev/null | awk '/Mem:/{print $2 " GiB"}'
  echo "== python";      "$PY" -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version(), 'gpu', torch.cuda.is_available())" 2>&1 | tail -1
  echo "== nvcc";        nvcc --version 2>&1 | tail -1
  echo "== sanitizer";   find_sanitizer || echo "compute-sanitizer not found"
  echo "== LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  echo "== ldd libkiln"; ldd "$work"/lib/libkiln.so.0 2>&1 | grep -E 'cud|nccl|cublas|gomp|libz|gloo|hiredis|ibverbs|libnl|not found'
  echo "== ldd test_cuda (not found)"; ldd "$BIN/test_cuda" 2>&1 | grep 'not found' || echo "none"
} > "$out/env.txt" 2>&1

# ---------------------------------------------------------------- steps
# step NAME SECONDS DEADLINE COMMAND...: COMMAND under `timeout` (at most SECONDS, never past the
# phase's DEADLINE, seconds since the start), its log in logs/NAME.log, a row in the summary.
# Exit 77 is "skipped, no device": expected in a rehearsal, a failure on the GPU machine.
n_step=0
step() {
  local name="$1" secs="$2" deadline="$3"; shift 3
  n_step=$((n_step + 1))
  local row="$rows/$(printf '%03d' $n_step)" log="$logs/$name.log" t0 rc result left
  if [[ -n "$ONLY" && ! "$name" =~ $ONLY ]]; then return 0; fi
  left=$(( deadline - ($(date +%s) - START) ))
  if (( left < 8 )); then
    echo "| $name | NOT RUN (phase time used up) | 0 |" > "$row"
    return 1
  fi
  (( secs > left )) && secs=$left
  t0=$(date +%s)
  echo "+ $*" > "$log"
  timeout --kill-after=5 "$secs" "$@" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) result=ok ;;
    77) if [[ $REHEARSE == 1 ]]; then result="skipped (no GPU here)"; rc=0; else result="FAILED (77: no GPU found)"; fi ;;
    124|137) result="TIMEOUT (${secs} s)" ;;
    *) result="FAILED ($rc)" ;;
  esac
  echo "| $name | $result$(failed_cases "$log") | $(( $(date +%s) - t0 )) |" > "$row"
  echo "[$(( $(date +%s) - START )) s] $name: $result" >&2
  return $rc
}

# ": n of m cases failed: first, second" from a Catch2 console log, nothing for other logs
failed_cases() {
  "$PY" - "$1" <<'PY' 2>/dev/null
import re, sys
text = open(sys.argv[1], errors="replace").read()
m = re.search(r"test cases:\s*(\d+)\s*\|\s*(\d+) passed\s*\|\s*(\d+) failed", text)
if not m:
    sys.exit()
names, lines = [], text.split("\n")
for i, l in enumerate(lines[:-2]):
    # a failure block: a rule of dashes, the case name, ..., a rule, the location, dots, FAILED
    if re.fullmatch(r"-{70,}", l) and i + 1 < len(lines) and not re.fullmatch(r"-{70,}", lines[i + 1]):
        block = "\n".join(lines[i + 1:i + 40])
        if "FAILED" in block.split("\n" + "-" * 79 + "\n" + "-" * 79)[0] and lines[i + 1] not in names:
            if i > 0 and re.fullmatch(r"-{70,}", lines[i - 1]) is None and not lines[i + 1].startswith(("/", " ")):
                names.append(lines[i + 1])
print(f": {m.group(3)} of {m.group(1)} cases failed" + (": " + "; ".join(names[:6]) if names else ""), end="")
PY
}

# pool DEADLINE WIDTH JOB...: runs the jobs ("NAME SECONDS COMMAND...", expanded by eval) WIDTH
# at a time. For correctness steps only: a timing never runs beside another process.
pool() {
  local deadline="$1" width="$2"; shift 2
  local running=0 job name secs cmd
  for job in "$@"; do
    read -r name secs cmd <<<"$job"
    n_step=$((n_step + 1))  # each background step numbers its row from here: unique, in order
    eval "step $name $secs $deadline $cmd" &
    running=$((running + 1))
    if (( running >= width )); then wait -n; running=$((running - 1)); fi
  done
  wait
  n_step=$((n_step + 1))  # the last job's row number, taken in its subshell: not the next step's
}

# train NAME SECONDS DEADLINE KILN-TRAIN-ARGS...: kiln-train on the GPU, its output lines stamped
# with seconds since the start (time to an accuracy); in a rehearsal three CPU steps on 2 threads.
train() {
  local name="$1" secs="$2" deadline="$3" a=() x skip=0
  shift 3
  for x in "$@"; do
    if (( skip )); then skip=0; continue; fi
    if [[ $REHEARSE == 1 && ( "$x" == --max-steps || "$x" == --epochs ) ]]; then skip=1; continue; fi
    a+=("$x")
  done
  if [[ $REHEARSE == 1 && " $* " == *" --cuda-graphs "* ]]; then
    step "$name" 5 "$deadline" bash -c 'echo "--cuda-graphs needs a GPU"; exit 77'
    return
  fi
  if [[ $REHEARSE == 1 ]]; then a=(--device cpu --max-steps 3 --threads 2 "${a[@]}"); else a=(--device cuda "${a[@]}"); fi
  step "$name" "$secs" "$deadline" bash -c 'set -o pipefail; "$@" 2>&1 | stamp' kiln-train "$BIN/kiln-train" "${a[@]}"
}
stamp() {  # prefixes each line with [seconds since this call]
  local t0=${EPOCHREALTIME/./} l now
  while IFS= read -r l; do
    now=${EPOCHREALTIME/./}
    printf '[%7.2f] %s\n' "$(( (now - t0) / 10000 ))e-2" "$l"
  done
}
export -f stamp

# train_ranks NAME SECONDS DEADLINE NPROC ARGS...: kiln-train as NPROC ranks of a kiln-run job on
# the GPU: one rank runs DDP (or ZeRO-1 with --zero) over NCCL; two share the one GPU and run over
# gloo through pinned host memory. A rehearsal runs the same job on the CPU for three steps, over
# gloo, or skips it when the build has no Gloo.
train_ranks() {
  local name="$1" secs="$2" deadline="$3" nproc="$4" a=() x skip=0
  shift 4
  for x in "$@"; do
    if (( skip )); then skip=0; continue; fi
    if [[ $REHEARSE == 1 && "$x" == --max-steps ]]; then skip=1; continue; fi
    a+=("$x")
  done
  if [[ $REHEARSE == 1 ]]; then
    if ! grep -q libgloo <<<"$(ldd "$work/lib/libkiln.so.0")"; then
      step "$name" 5 "$deadline" bash -c 'echo "this build has no Gloo: a CPU job cannot run"; exit 77'
      return
    fi
    a=(--device cpu --max-steps 3 --threads 1 "${a[@]}")
  else
    a=(--device cuda "${a[@]}")
  fi
  step "$name" "$secs" "$deadline" "$BIN/kiln-run" --nproc-per-node "$nproc" --master-port $((20000 + RANDOM % 20000)) \
    "$BIN/kiln-train" "${a[@]}"
}

# ---------------------------------------------------------------- phases
B=$BUDGET
T_TESTS=$(( B * 36 / 100 )) T_BENCH=$(( B * 64 / 100 )) T_TRAIN=$(( B - 12 ))

# 1-2. correctness: every test file in its own process, and the sanitizers, six at a time
export OMP_NUM_THREADS=3   # the CPU references of six processes share the 16 cores
sanitizer=$(find_sanitizer)
jobs=()
for f in "$ROOT"/tests/cuda/test_*.cpp; do
  g=$(basename "$f" .cpp)
  jobs+=("$g 120 \"\$BIN/test_cuda\" --filenames-as-tags '[#$g]' --durations yes")
done
if [[ -n "$sanitizer" ]]; then
  jobs=("memcheck 150 \"$sanitizer\" --tool memcheck --leak-check no --error-exitcode 3 \"\$BIN/test_cuda\" --filenames-as-tags '[#test_cuda_ops],[#test_cuda_indexing],[#test_cuda_xent]'"
        "racecheck 150 \"$sanitizer\" --tool racecheck --racecheck-report hazard --error-exitcode 3 \"\$BIN/test_cuda\" '[racecheck]'"
        "${jobs[@]}")
elif [[ $REHEARSE == 0 ]]; then
  echo "| compute-sanitizer | FAILED (not found) | 0 |" > "$rows/000"
fi
# the CPU levels on this host's processor (kiln/core/cpu_isa.h): each level's GEMM and kernels
jobs+=("cpu-levels 60 \"\$BIN/test_core\" '[cpu_isa],[gemm]'")
pool "$T_TESTS" 6 "${jobs[@]}"

# 3. benches, one at a time (timings), the headline ones first; then PyTorch on the same cases
export OMP_NUM_THREADS=16
export KILN_BENCH_JSON="$out/bench.jsonl"
rm -f "$KILN_BENCH_JSON"
for b in transfer elementwise optim norm softmax_xent matmul attention fused reduce conv allocator; do
  [[ -x "$BIN/bench_cuda_$b" ]] && step "bench_cuda_$b" 45 "$T_BENCH" "$BIN/bench_cuda_$b"
done
# the kernel lab's CUDA programs: every version validated against its reference (docs/lab.md)
for l in layernorm softmax_xent adamw; do
  [[ -x "$BIN/lab_${l}_cuda" ]] && step "lab_${l}_cuda" 30 "$T_BENCH" "$BIN/lab_${l}_cuda" all --repeats 5
done
# attention (forward, tensor cores from version 3) at small sizes: a few seconds each
[[ -x "$BIN/lab_attention_cuda" ]] && step lab_attention_cuda 12 "$T_BENCH" "$BIN/lab_attention_cuda" all \
  --size 4,8,1024,64 --repeats 3
[[ -x "$BIN/lab_attention_cuda" ]] && step lab_attention_cuda-causal 12 "$T_BENCH" "$BIN/lab_attention_cuda" all \
  --size 2,8,1024,128 --causal --repeats 3
peer_left=$(( T_BENCH - ($(date +%s) - START) ))
step pytorch-peer 90 "$T_BENCH" "$PY" "$ROOT/bench/cuda/pytorch_peer.py" --out "$work/runs/pytorch.jsonl" \
  --seconds $(( peer_left > 30 ? peer_left - 20 : 10 )) $([[ $REHEARSE == 1 ]] && echo --list)
[[ -f "$work/runs/pytorch.jsonl" ]] && cat "$work/runs/pytorch.jsonl" >> "$KILN_BENCH_JSON"
unset KILN_BENCH_JSON

# 4. kiln-train
train train-cnn-to-93 60 "$T_TRAIN" --data "$FM" --epochs 20 --batch-size 256 --amp bf16 --out "$work/runs/cnn93"
train train-cnn-f32 25 "$T_TRAIN" --data "$FM" --max-steps 400 --out "$work/runs/cnn-f32"
train train-cnn-bf16 25 "$T_TRAIN" --data "$FM" --max-steps 400 --amp bf16 --out "$work/runs/cnn-bf16"
train train-cnn-bf16-cl 25 "$T_TRAIN" --data "$FM" --max-steps 400 --amp bf16 --channels-last --out "$work/runs/cnn-bf16-cl"
train train-cnn-graphs 25 "$T_TRAIN" --data "$FM" --max-steps 400 --amp bf16 --cuda-graphs --out "$work/runs/cnn-graphs"
# GPT-2 124M: kiln and its PyTorch peers (eager here, torch.compile last) run the same steps, and
# each reports its steady-state rate after the same warm-up rule (5 steps; results.md compares those)
GPT_STEPS=40
train train-gpt2-124m 60 "$T_TRAIN" --model gpt --gpt-size "$([[ $REHEARSE == 1 ]] && echo char || echo 124m)" \
  --batch-size 16 --amp bf16 --max-steps "$GPT_STEPS" --log-every 10 --data "$TEXT" --out "$work/runs/gpt2"
gpt_peer() {  # gpt_peer NAME SECONDS [ARGS...]: bench/train/pytorch_gpt_peer.py beside kiln's GPT-2 run
  local name="$1" secs="$2"
  shift 2
  step "$name" "$secs" "$T_TRAIN" "$PY" "$ROOT/bench/train/pytorch_gpt_peer.py" --data "$TEXT" --batch-size 16 \
    --steps "$GPT_STEPS" "$@" $([[ $REHEARSE == 1 ]] && echo --list)
}
gpt_peer pytorch-gpt2-124m 60
# out of GPU memory mid-run (--memory-fraction from step 25): a checkpoint, exit 5, and a resume to
# the weights of a run that never stopped (docs/robustness.md); a rehearsal runs it on the CPU
step train-oom 60 "$T_TRAIN" env KILN_TRAIN_DATA="$FM" bash "$ROOT/tests/train/test_kiln_train.sh" "$BIN/kiln-train" \
  "$([[ $REHEARSE == 1 ]] && echo oom || echo oom-cuda)"
# a non-finite loss under fp16 loss scaling stops the run with its step (exit 3)
step train-nan 30 "$T_TRAIN" env KILN_TRAIN_DATA="$FM" bash "$ROOT/tests/train/test_kiln_train.sh" "$BIN/kiln-train" \
  "$([[ $REHEARSE == 1 ]] && echo nan || echo nan-cuda)"
# the profiler's CUDA event timing and sync-debug's count (kiln-guide's tip 7 on a GPU); sync-debug
# is refused on the CPU, so a rehearsal profiles without it
train train-cnn-profile 20 "$T_TRAIN" --data "$FM" --max-steps 12 --profile 4 --log-every 4 \
  $([[ $REHEARSE == 1 ]] || echo --sync-debug warn) --out "$work/runs/cnn-profile"
# the slow side of every small habit kiln-guide switches (per-parameter optimizer, gradients to
# zero, anomaly detection, grad mode in evaluation, conv biases before BatchNorm), on CUDA at once
train train-cnn-habits 20 "$T_TRAIN" --data "$FM" --max-steps 60 --eval-every 30 --fused-optimizer false \
  --zero-grad zero --detect-anomaly --eval-no-grad false --conv-bias --out "$work/runs/cnn-habits"
train_ranks train-cnn-ddp-1rank 30 "$T_TRAIN" 1 --data "$FM" --max-steps 100 --out "$work/runs/cnn-ddp"
train_ranks train-cnn-zero-1rank 30 "$T_TRAIN" 1 --data "$FM" --max-steps 100 --zero --out "$work/runs/cnn-zero"
train_ranks train-cnn-ddp-2ranks-1gpu 45 "$T_TRAIN" 2 --data "$FM" --max-steps 100 --out "$work/runs/cnn-ddp2"
# last of the phase: torch.compile spends about a minute compiling, which must not push the checks
# above out of the phase's time
gpt_peer pytorch-gpt2-124m-compile 150 --compile

# 5. kiln-guide's report on this GPU, only when asked for (minutes): its reports come back in
# guide-N.tar.gz, the kiln-train runs it made stay behind
g=0
for args in "${GUIDE[@]}"; do
  g=$((g + 1))
  # shellcheck disable=SC2086
  step "guide-$g" "$(( B - 12 ))" "$(( B - 12 ))" "$BIN/kiln-guide" --device "$([[ $REHEARSE == 1 ]] && echo cpu || echo cuda)" \
    $args --data "$FM" --gpt-data "$TEXT" --out "$work/runs/guide-$g"
  if [[ -f "$work/runs/guide-$g/report.md" ]]; then
    tar -czf "$out/guide-$g.tar.gz" -C "$work/runs/guide-$g" $(cd "$work/runs/guide-$g" && ls report.* 2>/dev/null)
  fi
done

# ---------------------------------------------------------------- report
failures=$(cat "$rows"/* 2>/dev/null | grep -c -E '\| (FAILED|TIMEOUT|NOT RUN)')
{
  echo "# GPU verdict$([[ $REHEARSE == 1 ]] && echo ' (rehearsal, no GPU)')"
  echo
  echo "$(head -1 "$out/env.txt")  "
  echo "GPU: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)  "
  echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo
  echo "| step | result | seconds |"
  echo "|---|---|---|"
  cat "$rows"/* 2>/dev/null
  echo
  echo "$failures step(s) failed; $(( $(date +%s) - START )) s in all (budget $BUDGET s)."
} > "$out/summary.md"
"$PY" "$ROOT/scripts/gpu_verdict_report.py" --logs "$logs" --bench "$out/bench.jsonl" --out "$out/results.md" \
  --summary "$out/summary.md" \
  >> "$logs/report.log" 2>&1 || echo "(results.md: the report failed, see logs/report.log)" >> "$out/summary.md"
rm -rf "$rows"
tar -czf "$out/logs.tar.gz" -C "$out" logs && rm -rf "$logs"
cat "$out/summary.md"
[[ -f "$out/results.md" ]] && cat "$out/results.md"
exit $(( failures > 0 ))
