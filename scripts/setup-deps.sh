#!/usr/bin/env bash
# Installs the Debian 12 packages kiln needs to build, test and run its examples.
# Idempotent: when every package is already installed it does nothing (and needs no network).
# Where the CUDA toolkit is present it also installs NVIDIA's header-only cudnn-frontend (the C++
# graph API over cuDNN 9 that kiln's fused attention uses) from its pip wheel, pinned, into the
# python3 on PATH, unless CMake would already find its headers (cmake/kiln_cuda_libraries.cmake).
#   --fuzz   also clang and its libFuzzer runtime, for scripts/fuzz.sh (libclang-rt-14-dev is only
#            a Recommends of clang, so it is named)
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache
  libeigen3-dev catch2 zlib1g-dev nlohmann-json3-dev libcli11-dev libfmt-dev libstb-dev
  libgloo-dev  # the CPU process group of kiln/distributed
  dataset-fashion-mnist fortunes
  python3  # the kiln-train end-to-end test reads its JSON summary with it
)
if [[ "${1:-}" == "--fuzz" ]]; then
  PACKAGES=(clang libclang-rt-14-dev)
fi

missing=()
for pkg in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$pkg")
  fi
done

# cudnn-frontend: header-only (include/cudnn_frontend*.h in the wheel); --no-deps, since kiln
# needs only the headers and not the wheel's Python side. Skipped without the CUDA toolkit, when
# CUDNN_FRONTEND_ROOT names a folder with its headers, or when the wheel's headers are already
# installed; a failed install (no network) only warns: kiln then builds attention without cuDNN.
CUDNN_FRONTEND_PIN="1.32.0"
frontend_headers() {
  if [[ -n "${CUDNN_FRONTEND_ROOT:-}" && -f "$CUDNN_FRONTEND_ROOT/include/cudnn_frontend.h" ]]; then
    return 0
  fi
  command -v python3 >/dev/null 2>&1 || return 1
  python3 - <<'PY' 2>/dev/null
import os, site, sys, sysconfig
p = sysconfig.get_paths()
dirs = dict.fromkeys([p["purelib"], p["platlib"]] + site.getsitepackages())
sys.exit(0 if any(os.path.isfile(os.path.join(d, "include", "cudnn_frontend.h")) for d in dirs) else 1)
PY
}
install_frontend() {
  [[ "${1:-}" == "--fuzz" ]] && return 0
  command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]] || return 0
  frontend_headers && return 0
  echo "setup-deps: installing nvidia-cudnn-frontend==$CUDNN_FRONTEND_PIN (headers) with pip"
  python3 -m pip install --quiet --no-deps "nvidia-cudnn-frontend==$CUDNN_FRONTEND_PIN" ||
    echo "setup-deps: could not install nvidia-cudnn-frontend; CUDA attention will not use cuDNN" >&2
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages already installed"
  install_frontend "${1:-}"
  exit 0
fi

echo "setup-deps: installing ${missing[*]}"
SUDO=()
if [[ $(id -u) -ne 0 ]]; then
  if command -v sudo >/dev/null 2>&1; then
    SUDO=(sudo)
  else
    echo "setup-deps: not root and sudo is not available; install these packages as root: ${missing[*]}" >&2
    exit 1
  fi
fi

export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
install_frontend "${1:-}"
