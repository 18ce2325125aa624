#!/usr/bin/env bash
# Usage: scripts/gpu-pack.sh [DIR]   (default: .gpu, which git ignores)
# Makes the bundle the GPU machine needs and lacks (it has nvcc, cmake, ninja and a PyTorch venv,
# but no network, no apt and none of Debian's -dev packages): the header-only dependencies laid
# out as an install prefix (include/, their CMake package files), zlib's header, the
# Fashion-MNIST files and a text corpus. Configure with -DKILN_DEPS_DIR=DIR to build from it;
# scripts/gpu-suite.sh does. Runs here, where scripts/setup-deps.sh installed the packages.
# The bundle stays under 48 MiB so that it travels with the source tree (docs/gpu.md).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${1:-$ROOT/.gpu}"
LIMIT_MIB=48

bash "$ROOT/scripts/setup-deps.sh" >/dev/null

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
  [[ $n -gt 0 ]] || { echo "gpu-pack: nothing copied from $pkg" >&2; exit 1; }
  printf '%-22s %-28s %5d files\n' "$pkg" "$(dpkg-query -W -f='${Version}' "$pkg")" "$n" >> "$DIR/MANIFEST"
}

{
  echo "# kiln GPU bundle, made by scripts/gpu-pack.sh on $(date -u +%Y-%m-%d) from commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')"
  echo "# Debian package, version and files taken (headers and CMake package files only):"
} > "$DIR/MANIFEST"

copy_pkg libeigen3-dev '/eigen3/unsupported/'     # kiln uses Eigen/Core only
copy_pkg catch2
copy_pkg libcli11-dev
copy_pkg nlohmann-json3-dev
KEEP_REGEX='/stb_image(_write)?\.h$' copy_pkg libstb-dev  # the PNG writer (plots), the reader (its test)
copy_pkg zlib1g-dev                               # the header; the GPU machine has libz.so.1

# Data: Fashion-MNIST (the CNN and ResNet runs) and the fortunes corpus (the char GPT).
mkdir -p "$DIR/data/fashion-mnist" "$DIR/data/fortunes"
cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$DIR/data/fashion-mnist/"
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' \
  -exec cp {} "$DIR/data/fortunes/" \;
{
  printf '%-22s %-28s %5d files\n' dataset-fashion-mnist "$(dpkg-query -W -f='${Version}' dataset-fashion-mnist)" \
    "$(find "$DIR/data/fashion-mnist" -type f | wc -l)"
  printf '%-22s %-28s %5d files\n' fortunes "$(dpkg-query -W -f='${Version}' fortunes)" \
    "$(find "$DIR/data/fortunes" -type f | wc -l)"
  echo "# sha256 of every file:"
  (cd "$DIR" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum)
} >> "$DIR/MANIFEST"

mib=$(( $(du -sb "$DIR" | cut -f1) / 1048576 ))
if (( mib >= LIMIT_MIB )); then
  echo "gpu-pack: $DIR is $mib MiB, over the $LIMIT_MIB MiB that may travel with the source tree" >&2
  exit 1
fi
echo "gpu-pack: $DIR ready ($mib MiB; MANIFEST lists its files)"
