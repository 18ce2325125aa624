#!/usr/bin/env bash
# kiln-train data-parallel on the CPU, 2 ranks over loopback (CTest runs this with the binaries):
#   ddp-resume   under kiln-run: 2 epochs straight == epoch-1 checkpoint + resume, bitwise; the
#                JSON summary says world_size 2 and its steady-state rate is the job's; the ranks'
#                replicas stay identical
#   zero-resume  the same with --zero (each rank resumes its own optimizer shard)
#   kill         ranks started by hand (no launcher): rank 1 killed with SIGKILL mid-training;
#                rank 0 must fail with an Error naming the collective and rank 1 within
#                --dist-timeout plus a few seconds, never hang; under kiln-run the job exits 137
#   errors       a global batch that does not divide among the ranks: every rank exits 2 naming it;
#                --auto-lr (each rank would pick its own LR) is refused
#   one-rank     kiln-run with one rank trains under DDP (world_size 1) to the same weights, bit for
#                bit, as kiln-train alone; --zero trains as well
#   sigint       SIGINT to kiln-run: every rank stops at the same step, rank 0 checkpoints,
#                exit 130, and the run resumes from that checkpoint
set -euo pipefail
train="$1"
run="$2"
what="$3"
tmp=$(mktemp -d)
trap 'kill -9 $(jobs -p) 2>/dev/null || true; rm -rf "$tmp"' EXIT
common=(--device cpu --model mlp --workers 2 --seed 7)
# Below Linux's ephemeral range (32768-60999), which the ranks' own connections (Gloo's pairs, the
# other test CTest runs beside this one) draw from: a port there can be taken by one of them.
port=$((20000 + RANDOM % 12000))

fail() { echo "FAIL: $*"; exit 1; }
json_of() { grep '^\[rank 0\] {' "$1" | tail -n 1 | sed 's/^\[rank 0\] //'; }
# Waits up to 30 s for the log $1 to show training (a throughput line).
wait_for_training() {
  for _ in $(seq 1 300); do grep -q "samples/s" "$1" 2>/dev/null && break; sleep 0.1; done
}
# Waits up to 30 s for the background process $1 to end and sets rc to its exit status; a deadline
# of our own, so that a process that hangs fails the test ("$2 still running 30 s after $3")
# instead of blocking it.
wait_exit() {
  for _ in $(seq 1 300); do kill -0 "$1" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$1" 2>/dev/null; then kill -9 "$1"; fail "$2 still running 30 s after $3"; fi
  set +e
  wait "$1"; rc=$?
  set -e
}

case "$what" in
ddp-resume | zero-resume)
  extra=()
  [ "$what" = zero-resume ] && extra=(--zero)
  timeout 300 "$run" --nproc-per-node 2 --master-port "$port" "$train" "${common[@]}" "${extra[@]}" --log-every 100 --epochs 2 \
    --out "$tmp/a" > "$tmp/a.log" 2>&1 || { cat "$tmp/a.log"; fail "the 2-rank run failed"; }
  timeout 300 "$run" --nproc-per-node 2 --master-port $((port + 1)) "$train" "${common[@]}" "${extra[@]}" --log-every 100 --epochs 2 \
    --out "$tmp/b" --resume "$tmp/a/checkpoint-epoch1.safetensors" > "$tmp/b.log" 2>&1 \
    || { cat "$tmp/b.log"; fail "the resumed 2-rank run failed"; }
  grep -q "resumed from" "$tmp/b.log" || fail "no resume message"
  cmp "$tmp/a/model.safetensors" "$tmp/b/model.safetensors" || fail "final weights differ after resume"
  json_of "$tmp/a.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); assert d["world_size"]==2 and 0.8 < d["test_accuracy"] <= 1, d' \
    || fail "the JSON summary lacks world_size 2 or a trained accuracy: $(json_of "$tmp/a.log")"
  # the job's steady-state rate: rank 0's window times the world size, 128 samples (the global
  # batch) per step after the 5 warm-up steps
  json_of "$tmp/a.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); n=d["steady_steps"]; assert d["warmup_steps"]==5 and n==d["steps"]-5 and abs(d["steady_samples_per_second"]*d["steady_seconds"]-128*n) < 1e-6*128*n, d' \
    || fail "the JSON summary's steady-state rate is not the job's: $(json_of "$tmp/a.log")"
  [ "$(grep -c '^\[rank 1\] {' "$tmp/a.log" || true)" = 0 ] || fail "rank 1 printed a summary; only rank 0 reports"
  if [ "$what" = zero-resume ]; then
    [ -s "$tmp/a/checkpoint.rank1.safetensors" ] || fail "rank 1 wrote no checkpoint of its optimizer shard"
  fi
  echo "$what: identical weights after resume, world_size 2"
  ;;
kill)
  # By hand, as a cluster scheduler without kiln-run would start them.
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port OMP_NUM_THREADS=1 \
      "$train" "${common[@]}" --log-every 100 --epochs 3 --dist-timeout 20 --out "$tmp/k" > "$tmp/k$r.log" 2>&1 &
    eval "pid$r=$!"
  done
  wait_for_training "$tmp/k0.log"
  grep -q "samples/s" "$tmp/k0.log" || { cat "$tmp/k0.log"; fail "rank 0 did not start training"; }
  start=$(date +%s)
  kill -9 "$pid1"
  wait_exit "$pid0" "rank 0" "rank 1 was killed"
  elapsed=$(( $(date +%s) - start ))
  [ $rc -ne 0 ] || fail "rank 0 exited 0 after its peer died"
  grep -q "all_reduce #" "$tmp/k0.log" || { cat "$tmp/k0.log"; fail "the error does not name the collective"; }
  grep -q "Rank 1 has exited" "$tmp/k0.log" || { cat "$tmp/k0.log"; fail "the error does not name rank 1"; }
  [ $elapsed -le 25 ] || fail "rank 0 took $elapsed s to fail (timeout 20 s)"
  echo "kill: rank 0 failed in ${elapsed}s: $(grep -o 'all_reduce #[0-9]*' "$tmp/k0.log" | head -1)"
  # Under kiln-run: the job ends with the killed rank's status.
  "$run" --nproc-per-node 2 --master-port $((port + 2)) "$train" "${common[@]}" --log-every 100 --epochs 3 --dist-timeout 20 \
    --out "$tmp/k2" > "$tmp/kr.log" 2>&1 &
  runpid=$!
  wait_for_training "$tmp/kr.log"
  victim=$(pgrep -f -- "--out $tmp/k2" | while read -r p; do
    if tr '\0' '\n' < /proc/$p/environ 2>/dev/null | grep -qx RANK=1; then echo "$p"; fi; done | head -1)
  [ -n "$victim" ] || fail "could not find rank 1 of the kiln-run job"
  kill -9 "$victim"
  wait_exit "$runpid" "kiln-run" "rank 1 was killed"
  [ $rc -eq 137 ] || { cat "$tmp/kr.log"; fail "kiln-run exited $rc, expected 137 (rank 1 killed by SIGKILL)"; }
  echo "kill: kiln-run exited 137"
  ;;
sigint)
  "$run" --nproc-per-node 2 --master-port "$port" "$train" "${common[@]}" --epochs 1 --log-every 20 \
    --out "$tmp/s" > "$tmp/s.log" 2>&1 &
  runpid=$!
  wait_for_training "$tmp/s.log"
  kill -0 "$runpid" 2>/dev/null || { cat "$tmp/s.log"; fail "the job ended before it could be interrupted"; }
  kill -INT "$runpid"
  wait_exit "$runpid" "kiln-run" "SIGINT"
  # kiln-run ends by the signal it got (130 in a shell) or with the ranks' status 130.
  [ $rc -eq 130 ] || { cat "$tmp/s.log"; fail "exit code $rc, expected 130"; }
  grep -q "interrupted" "$tmp/s.log" || { cat "$tmp/s.log"; fail "no interrupted message"; }
  [ -s "$tmp/s/checkpoint.safetensors" ] || fail "no checkpoint written"
  timeout 300 "$run" --nproc-per-node 2 --master-port $((port + 1)) "$train" "${common[@]}" --epochs 1 --log-every 20 \
    --out "$tmp/s2" --resume "$tmp/s/checkpoint.safetensors" > "$tmp/s2.log" 2>&1 || { cat "$tmp/s2.log"; fail "resume failed"; }
  grep -q "resumed from" "$tmp/s2.log" || fail "no resume message"
  echo "sigint: both ranks stopped, checkpoint written, resumed"
  ;;
errors)
  set +e
  out=$(timeout 120 "$run" --nproc-per-node 2 --master-port "$port" "$train" "${common[@]}" --batch-size 127 \
    --out "$tmp/e" 2>&1); rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "global batch; it must divide among the 2 ranks" <<< "$out" \
    || fail "indivisible batch: rc=$rc: $out"
  port=$((port + 1))
  set +e
  out=$(timeout 120 "$run" --nproc-per-node 2 --master-port "$port" "$train" "${common[@]}" --auto-lr \
    --out "$tmp/e" 2>&1); rc=$?
  set -e
  [ $rc -ne 0 ] && grep -q "auto-lr under a launcher" <<< "$out" || fail "auto-lr under kiln-run: rc=$rc: $out"
  echo "errors: explained"
  ;;
one-rank)
  few=(--threads 2 --epochs 1 --max-steps 60 --log-every 20)
  timeout 300 "$train" "${common[@]}" "${few[@]}" --out "$tmp/p" > "$tmp/p.log" 2>&1 \
    || { cat "$tmp/p.log"; fail "the plain run failed"; }
  for mode in ddp zero; do
    extra=()
    [ $mode = zero ] && extra=(--zero)
    timeout 300 "$run" --nproc-per-node 1 --master-port "$port" "$train" "${common[@]}" "${few[@]}" "${extra[@]}" \
      --out "$tmp/$mode" > "$tmp/$mode.log" 2>&1 || { cat "$tmp/$mode.log"; fail "the one-rank $mode run failed"; }
    port=$((port + 1))
    json_of "$tmp/$mode.log" | python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); assert d["world_size"]==1 and 0.5 < d["test_accuracy"] <= 1, d' \
      || fail "one-rank $mode: the JSON summary lacks world_size 1 or a trained accuracy: $(json_of "$tmp/$mode.log")"
  done
  grep -qF "[on]  data parallel over 1 rank: DDP" "$tmp/ddp.log" || { cat "$tmp/ddp.log"; fail "the one-rank run did not train under DDP"; }
  grep -qF "[on]  data parallel over 1 rank: ZeRO-1" "$tmp/zero.log" || { cat "$tmp/zero.log"; fail "the one-rank --zero run did not use ZeRO-1"; }
  cmp "$tmp/p/model.safetensors" "$tmp/ddp/model.safetensors" || fail "DDP over one rank changed the weights"
  echo "one-rank: DDP over one rank equals kiln-train alone bit for bit; --zero trains"
  ;;
*)
  fail "unknown check '$what'"
  ;;
esac
