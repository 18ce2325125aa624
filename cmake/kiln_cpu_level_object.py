#!/usr/bin/env python3
"""Makes one object of kiln's CPU kernels compiled for one CPU level (cmake/kiln_cpu_levels.cmake).

The kernel files are compiled once per level with that level's -march, and all copies go into
one library. Inline functions and templates from headers (the standard library, Eigen, kiln's
own) are emitted in every copy under the same names, and the linker would keep one of them for
all callers: baseline code could end up calling an AVX-512 copy of std::vector::push_back and die
on an AVX2 processor. So the copies of one level are linked into one relocatable object and every
function defined there (and every vtable, which points at functions) gets the level's suffix:
`_ZN...E` becomes `_ZN...E.avx2`, a name no other copy shares, and so does every COMDAT group
that holds code. Data keeps its name, so state
shared through headers (kernel registries, static locals of inline functions) stays one object.

Fails when a copy defines non-inline data of its own (two copies would define one name: put it in
a file outside the per-level set) or when it holds per-copy mutable state that callers outside
would not see (file-static variables).

usage: kiln_cpu_level_object.py --suffix avx2 --out kiln_cpu_avx2.o [--ld ld] [--objcopy objcopy]
           [--nm nm] [--readelf readelf] OBJ...
"""
import argparse
import subprocess
import sys

# Data that may exist once per copy: each copy's registration flags, its typeinfo and vtables,
# OpenMP's internals, and scratch buffers (names with "scratch" or "_buf": memory, not settings).
PER_COPY_OK = ("kiln_kernel_registered_", "_ZTI", "_ZTS", "__omp", ".omp", "_ZTV", "_ZTT", "_ZTC",
               "scratch", "_buf")


def symbols(nm, obj):
    out = subprocess.run([nm, "--defined-only", obj], check=True, capture_output=True, text=True).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3:
            yield parts[1], parts[2]


def code_groups(readelf, obj):
    """Signatures of the COMDAT groups that hold code. The final link keeps one group per
    signature, so a group of this copy that shares its signature with another copy's (a
    destructor's D5 group, say) must be renamed too, or its functions would be dropped."""
    out = subprocess.run([readelf, "-g", "-W", obj], check=True, capture_output=True, text=True).stdout
    sig, groups = None, set()
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("COMDAT group section"):
            sig = line[line.index("[", line.index("`.group'")) + 1:line.rindex("]")]
        elif sig and line.startswith("[") and "]   .text" in line:
            groups.add(sig)
    return groups


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--suffix", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ld", default="ld")
    ap.add_argument("--objcopy", default="objcopy")
    ap.add_argument("--nm", default="nm")
    ap.add_argument("--readelf", default="readelf")
    ap.add_argument("objects", nargs="+")
    a = ap.parse_args()

    combined = a.out + ".combined.o"
    subprocess.run([a.ld, "-r", "-o", combined] + a.objects, check=True)

    renames, clashes, state = [], [], []
    for kind, name in symbols(a.nm, combined):
        vtable = name.startswith(("_ZTV", "_ZTT", "_ZTC",
               "scratch", "_buf"))
        # local functions too, so that every function of a copy carries its level's name
        # (tests/check_baseline_isa.py relies on it)
        if kind in "TWit" or (vtable and kind.isupper()):
            renames.append(name)
        elif kind in "DBR" and not vtable:
            clashes.append(name)
        elif kind in "bd" and not any(p in name for p in PER_COPY_OK):
            state.append(name)
    if clashes or state:
        for n in clashes:
            print(f"kiln_cpu_level_object: {n}: data defined in every copy of the CPU kernels "
                  "(define it in a file outside kiln/kernels/cpu)", file=sys.stderr)
        for n in state:
            print(f"kiln_cpu_level_object: {n}: mutable state of its own in each copy of the CPU "
                  "kernels (move it outside kiln/kernels/cpu)", file=sys.stderr)
        sys.exit(1)

    renames = sorted(set(renames) | code_groups(a.readelf, combined))
    mapping = a.out + ".renames"
    with open(mapping, "w") as f:
        for n in renames:
            f.write(f"{n} {n}.{a.suffix}\n")
    subprocess.run([a.objcopy, f"--redefine-syms={mapping}", combined, a.out], check=True)


if __name__ == "__main__":
    main()
