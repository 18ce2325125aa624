#!/usr/bin/env bash
# kiln's f32 GEMM (bench_matmul) beside PyTorch's (matmul_pytorch.py) on this machine, at one CPU
# level for both sides, in alternating rounds; prints each round and the median ratio per size.
#   bench/cpu/compare_matmul.sh [BUILD_DIR] [PYTHON]        (defaults: build, python3)
#   ISA=avx2|avx512 (default: the machine's best; avx2 also restricts PyTorch to AVX2)  ROUNDS=N (default 3)  SIZES="512 1024 2048"
# Not a test: a measurement for bench/results (docs/kernels.md, "The CPU GEMM").
set -euo pipefail
build="${1:-build}"
py="${2:-python3}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
rounds="${ROUNDS:-3}"
sizes="${SIZES:-512 1024 2048}"
threads=$(nproc)
isa="${ISA:-}"
if [[ -z "$isa" ]]; then  # the machine's best level, on both sides
  if grep -q -m1 avx512f /proc/cpuinfo; then isa=avx512; else isa=avx2; fi
fi
[[ "$isa" == avx2 || "$isa" == avx512 ]] || { echo "compare_matmul.sh: ISA must be avx2 or avx512, got '$isa'" >&2; exit 2; }
torch_env=(OMP_NUM_THREADS="$threads")
[[ "$isa" == avx2 ]] && torch_env+=(ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2)
level="$isa"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs), $threads threads; level $level"
for ((r = 1; r <= rounds; r++)); do
  # kiln: only the requested level's rows ("auto": the best level the machine has)
  KILN_CPU_ISA="$level" OMP_NUM_THREADS="$threads" "$build/bin/bench_matmul" $sizes | tee -a "$log" |
    sed "s/^/round $r kiln: /"
  env "${torch_env[@]}" "$py" "$here/matmul_pytorch.py" --threads "$threads" $sizes | tee -a "$log" |
    sed "s/^/round $r torch: /"
done
python3 - "$log" <<'PY'
import re, statistics, sys
kiln, torch, best = {}, {}, {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) >= 4 and f[0] == "torch" and f[1].isdigit():
        torch.setdefault(int(f[1]), []).append(float(f[3]))
    elif len(f) >= 7 and f[0] in ("avx2", "avx512", "baseline") and f[1].isdigit():
        level = f[0]
        best[level] = True
        kiln.setdefault((level, int(f[1])), []).append((float(f[3]), float(f[4].rstrip("%"))))
print("\n| level | n | kiln GFLOP/s (median, min-max) | of peak | PyTorch GFLOP/s (median, min-max) | kiln / PyTorch |")
print("|---|---|---|---|---|---|")
for (level, n), runs in sorted(kiln.items()):
    if level == "baseline" and len(best) > 1:
        continue
    g = [r[0] for r in runs]
    p = [r[1] for r in runs]
    t = torch.get(n, [])
    ratio = f"**{statistics.median(g) / statistics.median(t):.2f}x**" if t else "-"
    tt = f"{statistics.median(t):.1f} ({min(t):.1f}-{max(t):.1f})" if t else "-"
    print(f"| {level} | {n} | {statistics.median(g):.1f} ({min(g):.1f}-{max(g):.1f}) | {statistics.median(p):.0f}% | {tt} | {ratio} |")
PY
