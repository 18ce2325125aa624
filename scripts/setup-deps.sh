#!/usr/bin/env bash
# Installs the Debian 12 packages kiln needs to build, test and run its examples.
# Idempotent: when every package is already installed it does nothing (and needs no network).
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

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup-deps: all ${#PACKAGES[@]} packages already installed"
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
