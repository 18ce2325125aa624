#!/usr/bin/env bash
# Usage: scripts/format.sh           formats every C++/CUDA file git tracks with .clang-format
#        scripts/format.sh --check   lists the files that do not follow it; exit 1 if any
# Uses clang-format (CLANG_FORMAT=... picks another binary). With --check and no clang-format
# installed it exits 77 (CTest's skip code), so the test shows as skipped, not failed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
CF="${CLANG_FORMAT:-clang-format}"
if ! command -v "$CF" >/dev/null 2>&1; then
  echo "format.sh: $CF not found (apt-get install clang-format)" >&2
  exit 77
fi
mapfile -t files < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh' | grep -v '^tests/package/build')
if [[ "${1:-}" != "--check" ]]; then
  "$CF" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$CF" --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "format.sh: $f does not follow .clang-format (run scripts/format.sh)"
    bad=1
  fi
done
exit "$bad"
