#!/usr/bin/env python3
"""Checks that libkiln's baseline code uses no AVX: only the functions of the per-level copies of
the CPU kernels (named ...avx2 / ...avx512, cmake/kiln_cpu_level_object.py) may touch ymm/zmm
or AVX-512 mask registers. A baseline function that does would die with SIGILL on a processor
without them; that is what an inline function shared between copies would cause.

usage: check_baseline_isa.py LIBKILN [OBJDUMP]
"""
import re
import subprocess
import sys

lib = sys.argv[1]
objdump = sys.argv[2] if len(sys.argv) > 2 else "objdump"
wide = re.compile(r"%[yz]mm\d|%k[1-7]\b")
label = re.compile(r"^[0-9a-f]+ <(.+)>:$")
bad, func, copies = {}, None, 0
proc = subprocess.Popen([objdump, "-d", "--no-show-raw-insn", lib], stdout=subprocess.PIPE, text=True)
for line in proc.stdout:
    m = label.match(line)
    if m:
        func = m.group(1)
        if func.endswith((".avx2", ".avx512")):
            copies += 1
        continue
    if func and wide.search(line) and not func.endswith((".avx2", ".avx512")) and not func.endswith("@plt"):
        bad.setdefault(func, line.strip())
proc.wait()
if proc.returncode:
    sys.exit(f"check_baseline_isa: {objdump} failed")
for f, insn in sorted(bad.items())[:40]:
    print(f"baseline function uses AVX: {f}: {insn}")
if bad:
    sys.exit(f"check_baseline_isa: {len(bad)} baseline function(s) of {lib} use AVX registers")
if copies == 0:
    sys.exit(f"check_baseline_isa: no per-level kernel copies in {lib} (expected names ending .avx2/.avx512)")
print(f"check_baseline_isa: no AVX in the baseline code of {lib}; {copies} functions in the per-level copies")
