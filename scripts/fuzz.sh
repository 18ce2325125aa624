#!/usr/bin/env bash
# Usage: scripts/fuzz.sh [SECONDS | --runs N] [--build BUILD_DIR] [--only T1,T2] [--seeds]
# Builds the fuzz targets of tests/fuzz as libFuzzer fuzzers (clang, AddressSanitizer, UBSan) and
# runs each for SECONDS (default 20) on top of its committed corpus (docs/robustness.md).
#   --runs N      instead of a time, N inputs from a fixed random seed, so every run (and every
#                 machine) tries the same inputs: CI's mode, whose verdict does not depend on luck
#   --build DIR   the built kiln tree whose libkiln.so the fuzzers link (default: build)
#   --only LIST   these targets alone (comma-separated; default: every target)
#   --seeds       first rewrite the seed corpus with kiln-fuzz-seeds from DIR (then commit it)
# Inputs that find something are copied into tests/fuzz/corpus/<target>/regression-<hash>, so
# the replay tests of CTest run them from then on; the script exits non-zero. New inputs that only
# add coverage stay in DIR-fuzz/new-corpus/<target> (merge the useful ones by hand).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SECONDS_EACH=20
RUNS=0
BUILD=build
ONLY=""
SEEDS=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build) BUILD="$2"; shift 2 ;;
    --runs) RUNS="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --seeds) SEEDS=1; shift ;;
    [0-9]*) SECONDS_EACH="$1"; shift ;;
    *) echo "fuzz.sh: unknown argument '$1' (usage: scripts/fuzz.sh [SECONDS] [--build DIR] [--only T1,T2] [--seeds])" >&2; exit 2 ;;
  esac
done
[[ "$BUILD" = /* ]] || BUILD="$ROOT/$BUILD"
TARGETS=(safetensors npy idx cifar text checkpoint store_message)
[[ -n "$ONLY" ]] && IFS=, read -r -a TARGETS <<<"$ONLY"

if [[ ! -f "$BUILD/include/kiln/config.h" ]] || ! ls "$BUILD"/lib/libkiln.so* >/dev/null 2>&1; then
  echo "fuzz.sh: $BUILD is not a built kiln tree; build it first (scripts/build.sh $BUILD)" >&2
  exit 2
fi
bash "$ROOT/scripts/setup-deps.sh" --fuzz
CLANG=$(command -v clang++ || command -v clang++-14 || true)
if [[ -z "$CLANG" ]]; then
  echo "fuzz.sh: clang++ not found; scripts/setup-deps.sh installs it (clang, libclang-rt-14-dev)" >&2
  exit 2
fi

if [[ $SEEDS -eq 1 ]]; then
  cmake --build "$BUILD" --target kiln-fuzz-seeds
  "$BUILD/bin/kiln-fuzz-seeds" "$ROOT/tests/fuzz/corpus"
fi

OUT="$BUILD-fuzz"
gen=()
[[ ! -f "$OUT/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
cmake -S "$ROOT/tests/fuzz" -B "$OUT" "${gen[@]}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$CLANG" \
  -DKILN_BUILD_DIR="$BUILD" >/dev/null
cmake --build "$OUT" -j"$(nproc)" --target $(printf 'fuzz_%s ' "${TARGETS[@]}")

# A forged length must not turn into a large allocation: 256 MB of memory in all, and no single
# allocation over it. A hang is an input that runs over 10 s.
# (A small quarantine: ASan's default 256 MB of freed memory would count against the limit.)
export ASAN_OPTIONS="detect_odr_violation=0:detect_leaks=0:quarantine_size_mb=32"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
failed=()
for t in "${TARGETS[@]}"; do
  corpus="$ROOT/tests/fuzz/corpus/$t"
  new="$OUT/new-corpus/$t"
  art="$OUT/findings/$t"
  mkdir -p "$new" "$art"
  if [[ $RUNS -gt 0 ]]; then
    # a fresh folder for new inputs: what earlier runs found must not change which inputs this one tries
    rm -rf "$new" && mkdir -p "$new"
    budget=(-runs="$RUNS" -seed=1)
    echo "== fuzz_$t: $RUNS inputs (seed 1) on $(ls "$corpus" | wc -l) committed inputs"
  else
    budget=(-max_total_time="$SECONDS_EACH")
    echo "== fuzz_$t: ${SECONDS_EACH}s on $(ls "$corpus" | wc -l) committed inputs"
  fi
  log="$OUT/fuzz_$t.log"
  if "$OUT/fuzz_$t" "$new" "$corpus" "${budget[@]}" -rss_limit_mb=256 -malloc_limit_mb=256 \
      -timeout=10 -max_len=16384 -print_final_stats=1 -artifact_prefix="$art/" >"$log" 2>&1; then
    grep -E '^stat::number_of_executed_units|^#[0-9]+.*DONE' "$log" | tail -2 | sed 's/^/   /'
  else
    echo "   FINDING (log: $log):"
    grep -E 'FINDING|ERROR: |SUMMARY|out-of-memory|timeout' "$log" | head -5 | sed 's/^/   /'
    for f in "$art"/*; do
      [[ -f "$f" ]] || continue
      h=$(sha1sum "$f" | cut -c1-12)
      cp "$f" "$corpus/regression-$h"
      echo "   kept as tests/fuzz/corpus/$t/regression-$h (fix the reader, then commit it)"
    done
    failed+=("$t")
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzz.sh: findings in ${failed[*]}" >&2
  exit 1
fi
if [[ $RUNS -gt 0 ]]; then
  echo "fuzz.sh: ${#TARGETS[@]} targets, $RUNS inputs each (seed 1): no findings"
else
  echo "fuzz.sh: ${#TARGETS[@]} targets, ${SECONDS_EACH}s each: no findings"
fi
