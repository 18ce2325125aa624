#!/usr/bin/env bash
# Usage: scripts/gpu-deps.sh DIR
# Lays out the header-only dependencies that the GPU machine lacks (it has no Debian -dev
# packages) as an install prefix: Eigen's headers, Catch2 v2, CLI11, nlohmann-json, stb's image
# reader and writer, zlib's header (the machine has libz.so.1), with their CMake package files.
# Configure with -DKILN_DEPS_DIR=DIR to build from it. scripts/gpu-pack.sh carries it (as
# deps.tar.xz) for the fallback build on the device, scripts/gpu-suite.sh.
set -euo pipefail

DIR="${1:?usage: scripts/gpu-deps.sh DIR}"
rm -rf "$DIR"
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"

# copy_pkg PACKAGE [DROP_REGEX]: the package's headers, CMake package files and the library its
# CMake files name (Catch2's), with the /usr prefix dropped (the CMake files find their prefix
# relative to themselves, so the copy works from any folder). $KEEP_REGEX, if set, narrows them.
copy_pkg() {
  local pkg="$1" drop="${2:-^$}" n=0 f
  while IFS= read -r f; do
    [[ -f "$f" && ! -L "$f" ]] || continue
    [[ "$f" =~ ^/usr/(include/|share/[^/]+/cmake/|share/cmake/|lib/cmake/|lib/libCatch2) ]] || continue
    [[ "$f" =~ $drop ]] && continue
    [[ "$f" =~ ${KEEP_REGEX:-.} ]] || continue
    mkdir -p "$DIR/$(dirname "${f#/usr/}")"
    cp "$f" "$DIR/${f#/usr/}"
    n=$((n + 1))
  done < <(dpkg -L "$pkg")
  [[ $n -gt 0 ]] || { echo "gpu-deps: nothing copied from $pkg" >&2; exit 1; }
  printf '%-22s %-28s %5d files\n' "$pkg" "$(dpkg-query -W -f='${Version}' "$pkg")" "$n" >> "$DIR/MANIFEST"
}

echo "# kiln's header-only dependencies, made by scripts/gpu-deps.sh on $(date -u +%Y-%m-%d)" > "$DIR/MANIFEST"
copy_pkg libeigen3-dev '/eigen3/unsupported/'     # kiln uses Eigen/Core only
copy_pkg catch2
copy_pkg libcli11-dev
copy_pkg nlohmann-json3-dev
KEEP_REGEX='/stb_image(_write)?\.h$' copy_pkg libstb-dev  # the PNG writer (plots), the reader (its test)
copy_pkg zlib1g-dev                               # the header; the GPU machine has libz.so.1
echo "gpu-deps: $DIR ($(du -sh "$DIR" | cut -f1))"
