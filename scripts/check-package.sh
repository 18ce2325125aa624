#!/usr/bin/env bash
# Usage: scripts/check-package.sh BUILD_DIR
# Installs an already-built kiln into a temporary prefix, runs the installed executables (they
# must find the installed libkiln through their RPATH, with no LD_LIBRARY_PATH), then builds and
# runs tests/package, a separate CMake project that does find_package(kiln) +
# target_link_libraries(app kiln::kiln).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ $# -lt 1 ]]; then
  echo "usage: $0 BUILD_DIR" >&2
  exit 2
fi
BUILD_DIR="$1"

if [[ -d /usr/local/cuda/bin ]]; then
  export PATH="/usr/local/cuda/bin:$PATH"
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/kiln-package.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
PREFIX="$TMP/prefix"
CONSUMER_BUILD="$TMP/build"

echo "+ cmake --install $BUILD_DIR --prefix $PREFIX"
cmake --install "$BUILD_DIR" --prefix "$PREFIX" >"$TMP/install.log" || {
  cat "$TMP/install.log" >&2
  echo "check-package: install failed" >&2
  exit 1
}
# Only the public headers are installed (cmake/kiln_public_headers.cmake and config.h).
echo "installed $(find "$PREFIX/include/kiln" -name '*.h' | wc -l) headers under $PREFIX/include/kiln"

# The installed binaries load the installed library (tools/CMakeLists.txt sets their RPATH).
if [[ -x "$PREFIX/bin/kiln-train" ]]; then
  echo "+ $PREFIX/bin/kiln-train --help"
  env -u LD_LIBRARY_PATH "$PREFIX/bin/kiln-train" --help >"$TMP/help.log" 2>&1 || {
    cat "$TMP/help.log" >&2
    echo "check-package: the installed kiln-train does not run" >&2
    exit 1
  }
  grep -q -- "--lr" "$TMP/help.log" || { cat "$TMP/help.log" >&2; echo "check-package: no --help from kiln-train" >&2; exit 1; }
  # (ldd to a file first: grep -q stops reading at the first match, and under pipefail ldd's
  # SIGPIPE would fail the check)
  ldd "$PREFIX/bin/kiln-train" >"$TMP/ldd.log"
  if grep -q "libkiln.so.0 => $PREFIX/" "$TMP/ldd.log"; then
    echo "kiln-train loads $PREFIX's libkiln.so.0"
  else
    cat "$TMP/ldd.log" >&2
    echo "check-package: the installed kiln-train does not load the installed libkiln" >&2
    exit 1
  fi
fi

gen=()
if command -v ninja >/dev/null 2>&1; then
  gen=(-G Ninja)
fi
echo "+ configure + build tests/package against $PREFIX"
cmake -S "$ROOT/tests/package" -B "$CONSUMER_BUILD" "${gen[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$PREFIX"
cmake --build "$CONSUMER_BUILD" -j"$(nproc)"

echo "+ $CONSUMER_BUILD/app"
"$CONSUMER_BUILD/app"
