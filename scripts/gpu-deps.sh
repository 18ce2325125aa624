#!/usr/bin/env bash
# Usage: scripts/gpu-deps.sh DIR
# Lays out the header-only dependencies that the GPU machine lacks (it has no Debian -dev
# packages) as an install prefix: Eigen's headers, Catch2 v2, CLI11, nlohmann-json, stb's image
# reader and writer, zlib's header (the machine has libz.so.1), with their CMake package files,
# and NVIDIA's header-only cudnn-frontend when this machine has it.
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
# NVIDIA's cudnn-frontend (header-only; the nvidia-cudnn-frontend pip wheel that
# scripts/setup-deps.sh installs): the fallback build's fused attention. The GPU machine's wheels
# may lack it. Without it here the fallback build runs attention on kiln's kernel (a warning).
fe_inc=$(python3 - <<'PY' 2>/dev/null || true
import os, site, sys, sysconfig
root = os.environ.get("CUDNN_FRONTEND_ROOT")
p = sysconfig.get_paths()
dirs = ([root] if root else []) + list(dict.fromkeys([p["purelib"], p["platlib"]] + site.getsitepackages()))
for d in dirs:
    if os.path.isfile(os.path.join(d, "include", "cudnn_frontend.h")):
        print(os.path.join(d, "include"))
        break
PY
)
if [[ -n "$fe_inc" ]]; then
  mkdir -p "$DIR/include"
  cp -r "$fe_inc"/cudnn_frontend "$fe_inc"/cudnn_frontend*.h "$fe_inc"/cudnn_backend_base.h "$DIR/include/"
  fe_ver=$(sed -n 's/#define CUDNN_FRONTEND_\(MAJOR\|MINOR\|PATCH\)_VERSION \([0-9]*\).*/\2/p' \
    "$fe_inc/cudnn_frontend_version.h" | paste -sd.)
  printf '%-22s %-28s %5d files\n' cudnn-frontend "$fe_ver" \
    "$(find "$DIR/include/cudnn_frontend" "$DIR"/include/cudnn_frontend*.h "$DIR/include/cudnn_backend_base.h" -type f | wc -l)" \
    >> "$DIR/MANIFEST"
else
  echo "gpu-deps: cudnn-frontend not found (scripts/setup-deps.sh installs it): the fallback build's attention will not use cuDNN" >&2
fi
echo "gpu-deps: $DIR ($(du -sh "$DIR" | cut -f1))"
