#!/usr/bin/env bash
# End-to-end checks of kiln-train on the CPU (CTest runs this with the binary's path):
#   resume   2 epochs straight == epoch-1 checkpoint + resume, bitwise (fixed worker count)
#   errors   missing dataset, invalid flag combination, corrupt and mismatched checkpoints
#   sigint   Ctrl-C writes a checkpoint and exits with 130; the run then resumes
#   sigterm  the same for SIGTERM (what a job scheduler sends), exit 143
#   nan      an absurd --lr makes the loss non-finite: stops with the step named, exit 3
set -euo pipefail
bin="$1"
what="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(--device cpu --model mlp --workers 2 --seed 7 --log-every 100)

fail() { echo "FAIL: $*"; exit 1; }

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
  set +e
  out=$("$bin" --data /nonexistent-dir --max-steps 1 --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "dataset-fashion-mnist" <<< "$out" || fail "missing dataset: rc=$rc: $out"
  set +e
  out=$("$bin" --device cpu --amp fp16 --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "fp16 needs a CUDA device" <<< "$out" || fail "fp16 on cpu: rc=$rc: $out"
  set +e
  out=$("$bin" --device cpu --cuda-graphs --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "cuda-graphs needs a CUDA device" <<< "$out" || fail "graphs on cpu: rc=$rc: $out"
  set +e
  out=$("$bin" --device cpu --model cnn --gpt-size 124m --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "gpt-size applies to --model gpt" <<< "$out" || fail "gpt-size on cnn: rc=$rc: $out"
  set +e
  out=$("$bin" --device cpu --zero --optimizer lamb --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "per-parameter trust ratios" <<< "$out" || fail "zero with lamb: rc=$rc: $out"
  set +e
  out=$("$bin" --device cpu --zero --clip-grad 1 --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "drop one of them" <<< "$out" || fail "zero with clip-grad: rc=$rc: $out"
  printf 'garbage' > "$tmp/bad.safetensors"
  set +e
  out=$("$bin" "${common[@]}" --resume "$tmp/bad.safetensors" --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "bad.safetensors" <<< "$out" || fail "corrupt checkpoint: rc=$rc: $out"
  "$bin" "${common[@]}" --max-steps 3 --epochs 1 --out "$tmp/c" > /dev/null
  set +e
  out=$("$bin" --device cpu --model cnn --workers 2 --resume "$tmp/c/checkpoint.safetensors" --out "$tmp/x" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "model=\"mlp\"" <<< "$out" || fail "mismatched checkpoint: rc=$rc: $out"
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
nan)
  set +e
  out=$("$bin" --device cpu --model mlp --workers 2 --seed 7 --optimizer sgd --lr 1e30 --log-every 1 \
        --max-steps 50 --out "$tmp/n" 2>&1); rc=$?
  set -e
  [ $rc -eq 3 ] || fail "expected exit 3 on a non-finite loss, got $rc: $out"
  grep -Eq "kiln-train: the (loss|gradient norm) is (nan|inf|-inf) at step [0-9]+ \(epoch 1" <<< "$out" \
    || fail "no non-finite message: $out"
  [ ! -e "$tmp/n/model.safetensors" ] || fail "a NaN model was saved"
  echo "nan: stopped at $(grep -Eo 'step [0-9]+' <<< "$out" | head -1)"
  ;;
*) fail "unknown check $what" ;;
esac
