#!/usr/bin/env bash
# Usage: scripts/gpu-suite.sh rehearse OUT [verdict options]   (this file is its second half)
# The GPU suite's rehearsal on a machine without a GPU, inside a private mount namespace (root):
#   1. hides what the GPU machine lacks: every file of Debian's -dev and data packages that kiln
#      uses, and the CUDA toolkit's own cuDNN and NCCL (overlay whiteouts, visible to this
#      process tree only);
#   2. lays out cuDNN and NCCL as NVIDIA's pip wheels do (site-packages/nvidia/{cudnn,nccl}) in a
#      throwaway venv whose python3 comes first on PATH, as the GPU machine's PyTorch venv does;
#   3. runs scripts/gpu-suite.sh: the same build as on the GPU machine from the pack's deps alone,
#      then the verdict's rehearsal on it (GPU binaries must skip with 77, kiln-train runs three
#      CPU steps from the pack's data, the PyTorch peers check their arguments).
# A missing header, data file, library or a script error shows here, not in GPU time.
set -uo pipefail

out="${1:?usage: scripts/gpu-suite.sh rehearse OUT [verdict options]}"
shift
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
work=$(mktemp -d /tmp/kiln-rehearse.XXXXXX)
cleanup() {  # the bind mounts below live in this namespace: undo them before removing the folder
  findmnt -rn -o TARGET | grep "^$work/" | sort -r | xargs -r umount 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$out"

# ---------------------------------------------------------------- 2 (before hiding): the wheels
site_layout() {  # site_layout NAME HEADER_GLOB LIB_GLOB
  local name="$1" hdr="$2" lib="$3" f
  mkdir -p "$site/nvidia/$name/include" "$site/nvidia/$name/lib"
  for f in $(ls /usr/local/cuda/include/$hdr 2>/dev/null); do cp -L "$f" "$site/nvidia/$name/include/"; done
  # the wheels ship versioned libraries only (libcudnn.so.9): bind the real one in under that name
  for f in $(ls /usr/local/cuda/lib*/$lib 2>/dev/null); do
    [[ -L "$f" ]] && continue
    touch "$site/nvidia/$name/lib/$(basename "$f")"
    mount --bind "$(readlink -f "$f")" "$site/nvidia/$name/lib/$(basename "$f")"
  done
}
python3 -m venv --without-pip "$work/venv" || { echo "rehearse: python3 -m venv failed" >&2; exit 1; }
site=$("$work/venv/bin/python3" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
site_layout cudnn 'cudnn*.h' 'libcudnn.so.9'
site_layout nccl 'nccl*.h' 'libnccl.so.2'
export PATH="$work/venv/bin:/usr/local/cuda/bin:$PATH"

# ---------------------------------------------------------------- 1: hide
python3 - "$work/hide.txt" <<'PY'
import glob, os, subprocess, sys
packages = ["libeigen3-dev", "catch2", "libcli11-dev", "nlohmann-json3-dev", "libstb-dev", "zlib1g-dev",
            "libfmt-dev", "libgloo-dev", "dataset-fashion-mnist", "fortunes", "fortunes-min"]
hidden = set()
for p in packages:
    r = subprocess.run(["dpkg", "-L", p], capture_output=True, text=True)
    for f in r.stdout.split("\n"):
        if f.startswith("/usr/") and not f.startswith(("/usr/share/doc/", "/usr/share/man/")) \
                and (os.path.isfile(f) or os.path.islink(f)):
            hidden.add(f)
# the CUDA toolkit's cuDNN and NCCL (and the links to them), so only the wheel layout is left
for pattern in ["/usr/local/cuda*/include/cudnn*.h", "/usr/local/cuda*/include/nccl*.h",
                "/usr/local/cuda*/lib*/libcudnn*", "/usr/local/cuda*/lib*/libnccl*",
                "/usr/local/include/cudnn*.h", "/usr/local/include/nccl*.h",
                "/usr/include/cudnn*.h", "/usr/include/nccl*.h",
                "/usr/lib/x86_64-linux-gnu/libcudnn*", "/usr/lib/x86_64-linux-gnu/libnccl*"]:
    for f in glob.glob(pattern):
        hidden.add(f)
hidden = {os.path.join(os.path.realpath(os.path.dirname(f)), os.path.basename(f)) for f in hidden}

def fully_hidden(d):
    for dirpath, _, files in os.walk(d):
        for name in files:
            if os.path.join(dirpath, name) not in hidden:
                return False
    return True

# the highest folders holding nothing else, then the remaining single files
items = set()
for f in sorted(hidden):
    top, d = None, os.path.dirname(f)
    while d not in ("/", "/usr", "/usr/include", "/usr/lib", "/usr/share", "/usr/local") and fully_hidden(d):
        top, d = d, os.path.dirname(d)
    items.add(top or f)
items = {i for i in items if not any(i.startswith(o + "/") for o in items)}
with open(sys.argv[1], "w") as out:
    for i in sorted(items):
        out.write(i + "\n")
PY
# Whiteouts (0/0 character devices) in the upper layer of one overlay per top folder: an overlay
# merges folders recursively, so a whiteout at up/a/b hides <top>/a/b. Overlays are not nested
# (the kernel allows only two levels of stacking, and / may already be one).
tops=$(xargs -n1 dirname < "$work/hide.txt" | sort -u | awk 'NR == 1 || index($0, top "/") != 1 { top = $0; print }')
n=0
for top in $tops; do
  n=$((n + 1))
  mkdir -p "$work/ov$n/up" "$work/ov$n/work"
  while IFS= read -r item; do
    [[ "$item" == "$top"/* ]] || continue
    rel="${item#"$top"/}"
    mkdir -p "$work/ov$n/up/$(dirname "$rel")"
    mknod "$work/ov$n/up/$rel" c 0 0
  done < "$work/hide.txt"
  mount -t overlay overlay -o "lowerdir=$top,upperdir=$work/ov$n/up,workdir=$work/ov$n/work" "$top" ||
    { echo "rehearse: could not hide entries of $top" >&2; exit 1; }
done
echo "rehearse: hid $(wc -l < "$work/hide.txt") files and folders (list: hidden.txt in the output) through $n overlays: $tops"; cp "$work/hide.txt" "$out/hidden.txt"
for f in /usr/include/eigen3/Eigen/Core /usr/include/catch2/catch.hpp /usr/include/zlib.h \
         /usr/share/datasets/fashion-mnist /usr/local/cuda/include/cudnn.h /usr/local/include/nccl.h; do
  [[ -e "$f" ]] && { echo "rehearse: $f is still visible" >&2; exit 1; }
done

# ---------------------------------------------------------------- 3: the build and the verdict
rc=0
export KILN_GPU_BUILD="${KILN_GPU_BUILD:-$ROOT/build-rehearse}"
# configured afresh each time: an earlier rehearsal's cache names its own (deleted) venv and
# library paths; the objects stay for ccache and ninja
rm -f "$KILN_GPU_BUILD/CMakeCache.txt" "$KILN_GPU_BUILD/build.ninja"
export KILN_GPU_BUILD_SECONDS="${KILN_GPU_BUILD_SECONDS:-1500}"   # 2 cores build slower than 16
bash "$ROOT/scripts/gpu-suite.sh" "$out" --rehearse "$@" || rc=1
# the build must have taken cuDNN from the wheel layout and the header-only libraries from the pack
cache="$KILN_GPU_BUILD/CMakeCache.txt"
grep -q "^Eigen3_DIR:PATH=$KILN_GPU_BUILD-deps/deps/" "$cache" || { echo "rehearse: Eigen did not come from the pack's deps" >&2; rc=1; }
grep -q "^KILN_PYTHON_SITE_DIRS:INTERNAL=.*$work/venv" "$cache" || { echo "rehearse: the venv's site-packages were not searched" >&2; rc=1; }
grep -q "kiln: CUDNN ON: $site/nvidia/cudnn/lib/libcudnn.so.9 (from the cudnn pip wheel)" "$out/build.log" ||
  { echo "rehearse: cuDNN was not found in the pip-wheel layout" >&2; rc=1; }
echo "rehearse: $([[ $rc -eq 0 ]] && echo passed || echo FAILED)"
exit $rc
