#!/usr/bin/env bash
# End-to-end checks of kiln-train on the CPU (CTest runs this with the binary's path):
#   resume   2 epochs straight == epoch-1 checkpoint + resume, bitwise (fixed worker count)
#   errors   missing dataset, invalid flag combination, corrupt and mismatched checkpoints
#   sigint   Ctrl-C writes a checkpoint and exits with 130; the run then resumes
#   sigterm  the same for SIGTERM (what a job scheduler sends), exit 143
#   nan      an absurd --lr makes the loss non-finite: stops with the step named, exit 3 (nan-cuda:
#            the same on the GPU under fp16 loss scaling, which skips overflowing steps but cannot
#            mend a non-finite loss)
#   oom      running out of memory mid-run (--memory-fraction from a step on): a checkpoint as of
#            that step's start and exit 5; resuming it ends with the weights of a run that never
#            stopped, bitwise (oom-cuda: the same on the GPU, for the GPU verdict)
#   switches the guide's switches change what runs: host reads per step (--sync-every-step), the
#            inputs' statistics (--normalize-inputs), evaluations (--eval-every), the LR
#            (--auto-lr) and the steps' peak memory (batch, --checkpoint-activations)
#   habits   the small habits' switches change what runs: the kernel calls of a profiled step
#            (--fused-optimizer, --zero-grad, --detect-anomaly), the parameters (--conv-bias) and
#            evaluation's memory (--eval-no-grad)
#   rates    the JSON summary's steady-state rate beside the whole run's: the warm-up rule
#            (--warmup-steps; 5, at most a fifth of the run's steps), the steps after it, a resumed
#            run counting its own steps, and none (with a line saying why) for a run too short
set -euo pipefail
bin="$1"
what="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--device cpu --model mlp --workers 2 --seed 7 --log-every 100)

fail() { echo "FAIL: $*"; exit 1; }

# refused CODE PATTERN WHAT ARGS...: kiln-train with ARGS exits with CODE (2, or "any" non-zero)
# and says PATTERN.
refused() {
  local code=$1 pattern=$2 what=$3 out rc
  shift 3
  set +e
  out=$("$bin" "$@" --out "$tmp/x" 2>&1); rc=$?
  set -e
  if [ "$code" = any ]; then [ $rc -ne 0 ]; else [ $rc -eq "$code" ]; fi && grep -q -- "$pattern" <<< "$out" ||
    fail "$what: rc=$rc: $out"
}

case "$what" in
resume)
  "$bin" "${common[@]}" --epochs 2 --out "$tmp/a" > "$tmp/a.log"
  "$bin" "${common[@]}" --epochs 2 --out "$tmp/b" --resume "$tmp/a/checkpoint-epoch1.safetensors" > "$tmp/b.log"
  grep -q "resumed from" "$tmp/b.log" || fail "no resume message"
  cmp "$tmp/a/model.safetensors" "$tmp/b/model.safetensors" || fail "final weights differ after resume"
  tail -n 1 "$tmp/a.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); assert d["model"]=="mlp" and d["epochs"]==2 and 0.5 < d["test_accuracy"] <= 1, d' \
    || fail "last line is not the JSON summary"
  for f in metrics.csv plot.png model.safetensors checkpoint.safetensors; do [ -s "$tmp/a/$f" ] || fail "missing $f"; done
  ls "$tmp/a"/events.out.tfevents.* > /dev/null || fail "no TensorBoard event file"
  echo "resume: identical weights"
  ;;
errors)
  refused 2 "dataset-fashion-mnist" "missing dataset" --data /nonexistent-dir --max-steps 1
  refused 2 "fp16 needs a CUDA device" "fp16 on cpu" --device cpu --amp fp16
  refused 2 "cuda-graphs needs a CUDA device" "graphs on cpu" --device cpu --cuda-graphs
  refused 2 "gpt-size applies to --model gpt" "gpt-size on cnn" --device cpu --model cnn --gpt-size 124m
  refused 2 "per-parameter trust ratios" "zero with lamb" --device cpu --zero --optimizer lamb
  refused 2 "drop one of them" "zero with clip-grad" --device cpu --zero --clip-grad 1
  refused 2 "sync-debug needs a CUDA device" "sync-debug on cpu" --device cpu --sync-debug warn
  refused 2 "drop --lr" "auto-lr with lr" --device cpu --auto-lr --lr 0.1
  refused 2 "which is not set" "memory-fraction-from-step alone" --device cpu --memory-fraction-from-step 3
  refused 2 "token ids" "normalize-inputs on gpt" --device cpu --model gpt --normalize-inputs false
  refused 2 "conv-bias applies to --model cnn" "conv-bias on resnet18" --device cpu --model resnet18 --conv-bias
  refused any "zero-grad" "zero-grad nothing" --device cpu --zero-grad nothing
  printf 'garbage' > "$tmp/bad.safetensors"
  refused 2 "bad.safetensors" "corrupt checkpoint" "${common[@]}" --resume "$tmp/bad.safetensors"
  "$bin" "${common[@]}" --max-steps 3 --epochs 1 --out "$tmp/c" > /dev/null
  refused 2 "model=\"mlp\"" "mismatched checkpoint" --device cpu --model cnn --workers 2 --resume "$tmp/c/checkpoint.safetensors"
  echo "errors: all explained"
  ;;
sigint|sigterm)
  sig=$(tr a-z A-Z <<< "${what#sig}")
  want_rc=$([ "$sig" = INT ] && echo 130 || echo 143)
  "$bin" "${common[@]}" --epochs 1 --out "$tmp/s" > "$tmp/s.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 100); do grep -q "samples/s" "$tmp/s.log" 2>/dev/null && break; sleep 0.1; done
  kill -"$sig" $pid
  set +e
  wait $pid; rc=$?
  set -e
  [ $rc -eq "$want_rc" ] || fail "expected exit $want_rc after SIG$sig, got $rc: $(cat "$tmp/s.log")"
  grep -q "interrupted (SIG$sig): wrote" "$tmp/s.log" || fail "no interruption message"
  "$bin" "${common[@]}" --epochs 1 --out "$tmp/s" --resume "$tmp/s/checkpoint.safetensors" > "$tmp/s2.log"
  tail -n 1 "$tmp/s2.log" | grep -q '"test_accuracy"' || fail "resume after SIG$sig did not finish"
  echo "$what: checkpointed and resumed"
  ;;
nan|nan-cuda)
  dev=(--device cpu)
  [ "$what" = nan-cuda ] && dev=(--device cuda --amp fp16)
  set +e
  out=$("$bin" "${dev[@]}" --model mlp --workers 2 --seed 7 --optimizer sgd --lr 1e30 --log-every 1 \
        --max-steps 50 ${KILN_TRAIN_DATA:+--data "$KILN_TRAIN_DATA"} --out "$tmp/n" 2>&1); rc=$?
  set -e
  [ $rc -eq 3 ] || fail "expected exit 3 on a non-finite loss, got $rc: $out"
  grep -Eq "kiln-train: the (loss|gradient norm) is (nan|inf|-inf) at step [0-9]+ \(epoch 1" <<< "$out" \
    || fail "no non-finite message: $out"
  [ ! -e "$tmp/n/model.safetensors" ] || fail "a NaN model was saved"
  echo "nan: stopped at $(grep -Eo 'step [0-9]+' <<< "$out" | head -1)"
  ;;
oom|oom-cuda)
  dev=$([ "$what" = oom ] && echo cpu || echo cuda)
  run=(--device "$dev" --model mlp --workers 2 --seed 7 --log-every 100 --epochs 1 --max-steps 40
       ${KILN_TRAIN_DATA:+--data "$KILN_TRAIN_DATA"})
  "$bin" "${run[@]}" --out "$tmp/a" > "$tmp/a.log"
  set +e
  out=$("$bin" "${run[@]}" --memory-fraction 1e-9 --memory-fraction-from-step 25 --out "$tmp/o" 2>&1); rc=$?
  set -e
  [ $rc -eq 5 ] || fail "expected exit 5 when memory runs out, got $rc: $out"
  grep -q "kiln-train: out of memory at step 25 (epoch 1, batch 25): out of memory on $dev" <<< "$out" \
    || fail "no out-of-memory message naming the step: $out"
  grep -q "wrote $tmp/o/checkpoint.safetensors as of the start of that step" <<< "$out" || fail "no checkpoint: $out"
  "$bin" "${run[@]}" --out "$tmp/o" --resume "$tmp/o/checkpoint.safetensors" > "$tmp/r.log"
  grep -q "resumed from .* at epoch 0, batch 25, step 25" "$tmp/r.log" || fail "no resume at step 25: $(cat "$tmp/r.log")"
  cmp "$tmp/a/model.safetensors" "$tmp/o/model.safetensors" || fail "weights differ after the out-of-memory resume"
  echo "$what: out of memory at step 25, checkpointed, resumed to identical weights"
  ;;
switches)
  # the JSON summary's field $2 of the run whose output is $1
  field() { tail -n 1 "$1" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$2'])"; }
  short=(--device cpu --model mlp --workers 2 --seed 7 --epochs 1 --max-steps 20 --log-every 10)
  "$bin" "${short[@]}" --out "$tmp/r0" > "$tmp/r0.log"
  "$bin" "${short[@]}" --sync-every-step --out "$tmp/r1" > "$tmp/r1.log"
  [ "$(field "$tmp/r0.log" host_reads_per_step)" = 0.1 ] || fail "loss read every 10 steps: $(tail -n 1 "$tmp/r0.log")"
  [ "$(field "$tmp/r1.log" host_reads_per_step)" = 1.0 ] || fail "--sync-every-step: $(tail -n 1 "$tmp/r1.log")"
  # normalised inputs have mean ~0 and std ~1; [0, 1] pixels Fashion-MNIST's 0.286 and 0.353
  "$bin" "${short[@]}" --normalize-inputs false --out "$tmp/r2" > "$tmp/r2.log"
  python3 - "$(field "$tmp/r0.log" input_mean)" "$(field "$tmp/r0.log" input_std)" \
    "$(field "$tmp/r2.log" input_mean)" "$(field "$tmp/r2.log" input_std)" <<'PY' || fail "input statistics"
import sys
m, s, m_raw, s_raw = map(float, sys.argv[1:])
assert abs(m) < 0.1 and 0.9 < s < 1.1, (m, s)
assert 0.2 < m_raw < 0.4 and 0.3 < s_raw < 0.4, (m_raw, s_raw)
assert abs(m - (m_raw - 0.2860) / 0.3530) < 1e-4 and abs(s - s_raw / 0.3530) < 1e-4, (m, s, m_raw, s_raw)
PY
  # --eval-every 6: test accuracy at steps 6, 12, 18 and at the end (20), once each
  "$bin" "${short[@]}" --eval-every 6 --out "$tmp/r3" > "$tmp/r3.log"
  evals=$(awk -F, 'NR > 1 && $7 != "" { printf "%s ", $1 }' "$tmp/r3/metrics.csv")
  [ "$evals" = "6 12 18 20 " ] || fail "--eval-every 6 evaluated at steps: $evals"
  # --auto-lr: the range test's pick is the LR trained at, and its time is reported
  "$bin" "${short[@]}" --auto-lr --out "$tmp/r4" > "$tmp/r4.log"
  picked=$(grep -Eo 'training at its suggestion, lr = [0-9.e+-]+' "$tmp/r4.log" | awk '{print $NF}')
  python3 -c "import sys; p, m, t = map(float, sys.argv[1:]); assert abs(m - p) <= 0.005 * p and m != 0.005 and t > 0" \
    "$picked" "$(field "$tmp/r4.log" max_lr)" "$(field "$tmp/r4.log" lr_find_seconds)" || fail "--auto-lr: $(tail -n 2 "$tmp/r4.log")"
  [ "$(field "$tmp/r0.log" max_lr)" = 0.005 ] || fail "default max LR"
  # the steps' peak of live tensors grows with the batch and shrinks with checkpointing (the char
  # GPT's: the MLP's activations are too small to show, and the CNN's peak is in its first block,
  # which checkpointing recomputes whole)
  gpt=(--device cpu --model gpt --workers 2 --seed 7 --epochs 1 --max-steps 2 --log-every 2)
  "$bin" "${gpt[@]}" --batch-size 8 --out "$tmp/r5" > "$tmp/r5.log"
  "$bin" "${gpt[@]}" --batch-size 32 --out "$tmp/r6" > "$tmp/r6.log"
  "$bin" "${gpt[@]}" --batch-size 32 --checkpoint-activations --out "$tmp/r7" > "$tmp/r7.log"
  python3 -c "import sys; a, b, c = map(int, sys.argv[1:]); assert a < 0.6 * b and c < 0.8 * b, (a, b, c)" \
    "$(field "$tmp/r5.log" train_peak_allocated_bytes)" "$(field "$tmp/r6.log" train_peak_allocated_bytes)" \
    "$(field "$tmp/r7.log" train_peak_allocated_bytes)" || fail "peak memory of the steps"
  echo "switches: each changes what runs"
  ;;
habits)
  field() { tail -n 1 "$1" | python3 -c "import json,sys; print(json.loads(sys.stdin.read())['$2'])"; }
  # calls of kernel $2 in the profile table $1 (0 when absent)
  calls() { awk -v k="$2" '$1 == k && $2 == "op" { n = $3 } END { print n + 0 }' "$1"; }
  # the MLP has 6 parameter tensors in one group
  prof=(--device cpu --model mlp --workers 0 --seed 7 --epochs 1 --max-steps 8 --log-every 4 --profile 1)
  "$bin" "${prof[@]}" --out "$tmp/p0" > "$tmp/p0.log"
  "$bin" "${prof[@]}" --fused-optimizer false --out "$tmp/p1" > "$tmp/p1.log"
  "$bin" "${prof[@]}" --zero-grad zero --out "$tmp/p2" > "$tmp/p2.log"
  "$bin" "${prof[@]}" --detect-anomaly --out "$tmp/p3" > "$tmp/p3.log"
  [ "$(calls "$tmp/p0/profile.txt" adamw_step)" = 1 ] || fail "fused: $(cat "$tmp/p0/profile.txt")"
  [ "$(calls "$tmp/p1/profile.txt" adamw_step)" = 6 ] || fail "--fused-optimizer false: $(cat "$tmp/p1/profile.txt")"
  # to zero: a fill per parameter, and backward adds into the zeros instead of assigning
  fills=$(( $(calls "$tmp/p2/profile.txt" fill_) - $(calls "$tmp/p0/profile.txt" fill_) ))
  adds=$(( $(calls "$tmp/p2/profile.txt" add) - $(calls "$tmp/p0/profile.txt" add) ))
  [ "$fills" = 6 ] && [ "$adds" = 6 ] || fail "--zero-grad zero: $fills more fills, $adds more adds"
  # anomaly detection checks every gradient a node returns; off, nothing is checked
  [ "$(calls "$tmp/p0/profile.txt" isfinite)" = 0 ] || fail "isfinite without --detect-anomaly"
  [ "$(calls "$tmp/p3/profile.txt" isfinite)" -ge 6 ] || fail "--detect-anomaly: $(cat "$tmp/p3/profile.txt")"
  grep -q "debug switches on (slower training): anomaly detection" "$tmp/p3.log" || fail "no debug warning"
  # a bias in both convs: 32 + 64 more parameters, and lint names them
  cnn=(--device cpu --model cnn --workers 0 --seed 7 --epochs 1 --max-steps 2 --log-every 2)
  "$bin" "${cnn[@]}" --out "$tmp/c0" > "$tmp/c0.log"
  "$bin" "${cnn[@]}" --conv-bias --out "$tmp/c1" > "$tmp/c1.log"
  count() { grep -Eo '[0-9]+ parameters' "$1" | awk '{ print $1 }'; }
  [ $(( $(count "$tmp/c1.log") - $(count "$tmp/c0.log") )) = 96 ] || fail "--conv-bias: $(head -n 3 "$tmp/c1.log")"
  [ "$(grep -c 'has a bias but feeds' "$tmp/c1.log")" = 2 ] || fail "--conv-bias: no lint warnings"
  # grad mode on in evaluation keeps what backward would need: at least fc1's input of a 256-image
  # test batch (256 x 3136 floats) more at the peak
  "$bin" "${cnn[@]}" --eval-no-grad false --out "$tmp/c2" > "$tmp/c2.log"
  python3 -c "import sys; a, b = map(int, sys.argv[1:]); assert b - a >= 256 * 3136 * 4, (a, b)" \
    "$(field "$tmp/c0.log" eval_peak_growth_bytes)" "$(field "$tmp/c2.log" eval_peak_growth_bytes)" \
    || fail "--eval-no-grad false: evaluation's peak"
  echo "habits: each changes what runs"
  ;;
rates)
  # checks the summary (the last line of $1): warm-up $2 and steady steps $3 of batch 128, or none
  rates_of() {
    tail -n 1 "$1" | python3 -c '
import json, sys
d, warmup, steady = json.loads(sys.stdin.read()), int(sys.argv[1]), sys.argv[2]
assert d["warmup_steps"] == warmup, d
assert d["samples_per_second"] > 0, d
if steady == "none":
    assert d["steady_steps"] is None and d["steady_seconds"] is None and d["steady_samples_per_second"] is None, d
    sys.exit()
steady = int(steady)
assert d["steady_steps"] == steady, d
assert 0 < d["steady_seconds"] < d["train_seconds"], d
assert d["steady_samples_per_second"] > 0, d
# the rate counts exactly the steps after the warm-up: 128 samples each
assert abs(d["steady_samples_per_second"] * d["steady_seconds"] - 128 * steady) < 1e-6 * 128 * steady, d
' "$2" "$3"
  }
  short=(--device cpu --model mlp --workers 2 --seed 7 --epochs 1 --log-every 10)
  # the rule: 5 steps, or a fifth of the run's steps when fewer, at least 1
  "$bin" "${short[@]}" --max-steps 40 --eval-every 15 --out "$tmp/t0" > "$tmp/t0.log"
  rates_of "$tmp/t0.log" 5 35 || fail "40 steps: $(tail -n 1 "$tmp/t0.log")"
  grep -Eq "^throughput: [0-9.]+ samples/s steady \(the last 35 steps, after 5 warm-up steps\), [0-9.]+ over the whole run" \
    "$tmp/t0.log" || fail "no throughput line: $(tail -n 2 "$tmp/t0.log")"
  "$bin" "${short[@]}" --max-steps 12 --out "$tmp/t1" > "$tmp/t1.log"
  rates_of "$tmp/t1.log" 2 10 || fail "12 steps: $(tail -n 1 "$tmp/t1.log")"
  "$bin" "${short[@]}" --max-steps 12 --warmup-steps 7 --out "$tmp/t2" > "$tmp/t2.log"
  rates_of "$tmp/t2.log" 7 5 || fail "--warmup-steps 7: $(tail -n 1 "$tmp/t2.log")"
  # too short: no step after the warm-up, so no steady rate, and a line says why
  "$bin" "${short[@]}" --max-steps 3 --warmup-steps 3 --out "$tmp/t3" > "$tmp/t3.log"
  rates_of "$tmp/t3.log" 3 none || fail "3 steps, 3 of warm-up: $(tail -n 1 "$tmp/t3.log")"
  grep -q "no steady-state rate: the run took 3 steps, none after its 3 warm-up steps" "$tmp/t3.log" \
    || fail "no line saying why there is no steady rate: $(tail -n 2 "$tmp/t3.log")"
  "$bin" "${short[@]}" --max-steps 1 --out "$tmp/t4" > "$tmp/t4.log"
  rates_of "$tmp/t4.log" 1 none || fail "1 step: $(tail -n 1 "$tmp/t4.log")"
  # resumed at step 10 (the out-of-memory drill's checkpoint) to step 40: this run's 30 steps
  set +e
  "$bin" "${short[@]}" --max-steps 40 --memory-fraction 1e-9 --memory-fraction-from-step 10 --out "$tmp/t5" \
    > "$tmp/t5.log" 2>&1; rc=$?
  set -e
  [ $rc -eq 5 ] || fail "the drill should stop at step 10 with exit 5, got $rc: $(tail -n 3 "$tmp/t5.log")"
  "$bin" "${short[@]}" --max-steps 40 --resume "$tmp/t5/checkpoint.safetensors" --out "$tmp/t5" > "$tmp/t6.log"
  rates_of "$tmp/t6.log" 5 25 || fail "resumed at step 10: $(tail -n 1 "$tmp/t6.log")"
  echo "rates: steady-state rates after the warm-up, none for a run too short"
  ;;
*) fail "unknown check $what" ;;
esac
