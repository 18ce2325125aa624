#!/usr/bin/env bash
# Usage: scripts/gpu-pack.sh [DIR]   (default: .gpu, which git ignores)
# Builds HERE everything the GPU verdict runs and lays it out with its data, so that the GPU
# machine (nvcc, PyTorch and NVIDIA's wheels, but no network, no apt, no Debian -dev packages, no
# data) only runs it: scripts/gpu-verdict.sh, docs/gpu.md.
#   DIR/kiln.tar.xz  bin/: test_cuda, kiln-train, kiln-run, kiln-guide, every bench_cuda_* (run path
#                  $ORIGIN/../lib); lib/: libkiln (sm_90 only, a portable x86-64 CPU baseline),
#                  with Gloo and the libraries it pulls (hiredis, ibverbs, libnl), which GPU images
#                  lack; lib/fallback/ holds libgomp and libz for an image without them (the verdict
#                  puts it on the library path only then)
#   DIR/data/      Fashion-MNIST (.gz as shipped) and the fortunes text corpus
#   DIR/deps.tar.xz  the header-only dependencies as an install prefix, for the fallback build on
#                  the device (scripts/gpu-suite.sh, a second call after an edit)
#   DIR/MANIFEST   commit, build flags, package versions and the sha256 of every file
# cuDNN, NCCL, cuBLAS(Lt) and cudart are not carried: the GPU machine has them. The pack must stay
# under 60 MiB (the tree travels beside it within the 64 MiB a device call carries).
#   KILN_PACK_BUILD  the build folder (default build-pack; kept, so a rebuild after a fix only
#                    compiles what changed, through ccache when it is installed)
# scripts/gpu-pack.sh --asan [DIR] adds DIR/asan.tar.xz to an existing pack: test_cuda, kiln-train
# and kiln-run built with AddressSanitizer (host code; about 12 MB), for a host memory error seen
# on the GPU machine: scripts/gpu-verdict.sh --archive asan.tar.xz --only REGEX OUT.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ASAN=0
if [[ "${1:-}" == --asan ]]; then ASAN=1; shift; fi
DIR="${1:-$ROOT/.gpu}"
BUILD="${KILN_PACK_BUILD:-$ROOT/build-pack}"
(( ASAN )) && BUILD="${KILN_PACK_BUILD:-$ROOT/build-pack-asan}"
LIMIT_MIB=60
t_start=$(date +%s)

bash "$ROOT/scripts/setup-deps.sh" >/dev/null
export PATH="/usr/local/cuda/bin:$PATH"
command -v nvcc >/dev/null || { echo "gpu-pack: nvcc not found: the pack needs the CUDA toolkit" >&2; exit 1; }

# Gloo and what it links that a GPU image lacks, into DEST beside libkiln (the verdict puts that
# folder on the library path)
copy_gloo_libs() {
  local f
  for f in $(ldd "$BUILD"/lib/libkiln.so.0 | awk '/libgloo|libhiredis|libibverbs|libnl-/ {print $3}'); do
    cp -L "$f" "$1/"
  done
  ls "$1"/libgloo.so.* > /dev/null || { echo "gpu-pack: libkiln does not link Gloo" >&2; exit 1; }
}

# ---------------------------------------------------------------- build
flags=(-DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=ON -DKILN_CUDNN=ON -DKILN_NCCL=ON -DKILN_GLOO=ON
       -DCMAKE_CUDA_ARCHITECTURES=90 -DKILN_NATIVE_ARCH=OFF -DCMAKE_BUILD_RPATH_USE_ORIGIN=ON
       -DKILN_BUILD_TESTS=ON -DKILN_BUILD_BENCH=ON -DKILN_BUILD_EXAMPLES=ON)
if (( ASAN )); then
  flags+=("-DCMAKE_CXX_FLAGS=-fsanitize=address -fno-omit-frame-pointer"
          "-DCMAKE_CUDA_FLAGS=-Xcompiler=-fsanitize=address,-fno-omit-frame-pointer"
          -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address)
fi
# configured every time (a few seconds), so that a changed flag above reaches an existing folder
mkdir -p "$BUILD"
cmake -S "$ROOT" -B "$BUILD" -G Ninja "${flags[@]}" > "$BUILD/configure.log" 2>&1 ||
  { cat "$BUILD/configure.log" >&2; exit 1; }
benches=$(cd "$ROOT/bench/cuda" && ls ./*.cpp ./*.cu | sed 's|^\./|bench_cuda_|; s|\.[a-z]*$||')
# the kernel lab's CUDA programs (bench/lab, docs/lab.md): lab_layernorm_cuda, ...
benches="$benches $(cd "$ROOT/bench/lab" && ls ./*_cuda.cu | sed 's|^\./|lab_|; s|\.cu$||')"
(( ASAN )) && benches=""
# shellcheck disable=SC2086
cmake --build "$BUILD" -j"$(nproc)" --target kiln test_cuda test_core bench_matmul kiln-train kiln-run kiln-guide $benches
t_built=$(date +%s)

if (( ASAN )); then
  [[ -f "$DIR/kiln.tar.xz" ]] || { echo "gpu-pack --asan: $DIR is not a pack: run scripts/gpu-pack.sh first" >&2; exit 1; }
  stage=$(mktemp -d)
  trap 'rm -rf "$stage"' EXIT
  mkdir -p "$stage/bin" "$stage/lib"
  cp "$BUILD"/bin/{test_cuda,kiln-train,kiln-run} "$stage/bin/"
  cp -P "$BUILD"/lib/libkiln.so* "$stage/lib/"
  # the sanitizer's runtime travels too (found through the binaries' $ORIGIN/../lib run path)
  cp -L "$(ldconfig -p | awk '$1 == "libasan.so.8" && /x86-64/ {print $NF; exit}')" "$stage/lib/"
  copy_gloo_libs "$stage/lib"
  strip --strip-debug "$stage"/bin/* "$stage"/lib/libkiln.so.*.*
  tar -C "$stage" -cf - bin lib | xz -T"$(nproc)" -6 > "$DIR/asan.tar.xz"
  echo "gpu-pack: $DIR/asan.tar.xz ready ($(( $(stat -c %s "$DIR/asan.tar.xz") / 1048576 )) MiB; build $(( t_built - t_start )) s)"
  exit 0
fi

# ---------------------------------------------------------------- lay out
rm -rf "$DIR/data" "$DIR/kiln.tar.xz" "$DIR/deps.tar.xz" "$DIR/MANIFEST"
rm -f "$DIR/asan.tar.xz"  # built from an older tree: stale once the pack is rebuilt
mkdir -p "$DIR/data/fashion-mnist" "$DIR/data/fortunes"
DIR="$(cd "$DIR" && pwd)"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib/fallback"
for b in test_cuda test_core bench_matmul kiln-train kiln-run kiln-guide $benches; do
  cp "$BUILD/bin/$b" "$stage/bin/"
done
cp -P "$BUILD"/lib/libkiln.so* "$stage/lib/"
# keep the dynamic symbols (error call stacks name functions through them), drop the rest
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/libkiln.so.*.*
for f in libgomp.so.1 libz.so.1; do cp -L "$(ldconfig -p | awk -v f="$f" '$1 == f && /x86-64/ {print $NF; exit}')" "$stage/lib/fallback/"; done
copy_gloo_libs "$stage/lib"
# every binary must find libkiln through its own folder, never through this build folder
for b in "$stage"/bin/*; do
  grep -q 'NEEDED.*libkiln' <<<"$(readelf -d "$b")" || continue
  rp=$(readelf -d "$b" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p')
  [[ "$rp" != *"$BUILD"* && "$rp" == *'$ORIGIN'* ]] || { echo "gpu-pack: $b has run path '$rp'" >&2; exit 1; }
done
if grep -q "$BUILD" <<<"$(readelf -d "$stage"/lib/libkiln.so.*.*)"; then
  echo "gpu-pack: libkiln's run path names $BUILD" >&2; exit 1
fi
# the portable baseline: AVX only in the per-level copies of the CPU kernels, which run after the
# run-time check (kiln/core/cpu_isa.h); checked before stripping, which drops their local names
python3 "$ROOT/tests/check_baseline_isa.py" "$BUILD/lib/libkiln.so.0" > /dev/null ||
  { echo "gpu-pack: libkiln's baseline code holds AVX: the pack must run on any x86-64" >&2; exit 1; }

cp /usr/share/datasets/fashion-mnist/*-ubyte.gz "$DIR/data/fashion-mnist/"
find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -exec cp {} "$DIR/data/fortunes/" \;

# xz: 30 MB of binaries (mostly sm_90 code) travel as 6
tar -C "$stage" -cf - bin lib | xz -T"$(nproc)" -6 > "$DIR/kiln.tar.xz"
# header-only dependencies for the fallback build on the device (scripts/gpu-suite.sh)
bash "$ROOT/scripts/gpu-deps.sh" "$stage/deps" > /dev/null
tar -C "$stage" -cJf "$DIR/deps.tar.xz" deps

{
  echo "# kiln GPU pack, made by scripts/gpu-pack.sh on $(date -u +%Y-%m-%dT%H:%M:%SZ) from commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "# built on: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nvcc --version | tail -1)"
  echo "# cmake ${flags[*]}"
  printf '%-24s %s\n' dataset-fashion-mnist "$(dpkg-query -W -f='${Version}' dataset-fashion-mnist)" \
    fortunes "$(dpkg-query -W -f='${Version}' fortunes)"
  echo "# sha256 of every file:"
  (cd "$DIR" && find . -type f ! -name MANIFEST -print0 | sort -z | xargs -0 sha256sum)
} > "$DIR/MANIFEST"

mib=$(( $(du -sb "$DIR" | cut -f1) / 1048576 ))
if (( mib >= LIMIT_MIB )); then
  echo "gpu-pack: $DIR is $mib MiB, over the $LIMIT_MIB MiB that may travel with the source tree" >&2
  exit 1
fi
echo "gpu-pack: $DIR ready ($mib MiB; build $(( t_built - t_start )) s, layout $(( $(date +%s) - t_built )) s; MANIFEST lists its files)"
