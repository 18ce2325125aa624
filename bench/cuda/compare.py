#!/usr/bin/env python3
"""The GPU benches' comparison table: kiln beside its peers, one Markdown table per bench.

Usage: compare.py [--out results.md] FILE.jsonl...

Reads the JSON lines the GPU benches write through $KILN_BENCH_JSON (cuda_bench_util.h's record())
and those of pytorch_peer.py; missing or empty files are skipped. Each row is
{"bench", "case", "impl", "ms", optional "bytes" or "flops", "gpu", ...}. Per bench, a row per case:
kiln's ms, then each peer's ms and the ratio peer ms / kiln ms (> 1: kiln is faster), with GB/s
or TFLOP/s where the rows carry bytes or flops and, for memory-bound rows, the fraction of the
device copy bandwidth measured in the same run (the "copy" rows, cudaMemcpyAsync of >= 256 MiB;
small buffers that fit in L2 can exceed 100%). A case measured more than once (the copy ceiling
is measured by several benches) keeps its fastest time. Without any rows (a rehearsal on a
machine without a GPU) it prints "no GPU results" and exits 0. Standard library only.
"""
import argparse
import json
import math
import os
import sys

BENCH_ORDER = ["matmul", "attention", "conv", "softmax_xent", "norm", "optim", "fused", "elementwise", "reduce",
               "copy", "transfer", "allocator"]
# Benches whose GB/s is not device-memory traffic: no fraction of the copy bandwidth.
NO_COPY_FRACTION = {"transfer", "allocator"}
CEILING_MIN_BYTES = 2 * 256 * 2**20  # copy rows count read + written bytes


def read_rows(paths):
    rows, meta, bad = [], [], 0
    for path in paths:
        if not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except ValueError:
                    bad += 1  # e.g. the last line of a bench killed mid-write
                    continue
                if not isinstance(r, dict):
                    bad += 1
                    continue
                if str(r.get("bench", "")).startswith("_"):
                    meta.append(r)
                    continue
                ms = r.get("ms")
                if not all(isinstance(r.get(k), str) for k in ("bench", "case", "impl")) or \
                        not isinstance(ms, (int, float)) or isinstance(ms, bool) or not math.isfinite(ms) or ms <= 0:
                    bad += 1
                    continue
                rows.append(r)
    return rows, meta, bad


def positive(r, key):
    v = r.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None


def merge(rows):
    """(bench, case, impl) -> the fastest row; benches -> cases and impls in first-seen order."""
    best, cases, impls = {}, {}, {}
    for r in rows:
        key = (r["bench"], r["case"], r["impl"])
        if key not in best or r["ms"] < best[key]["ms"]:
            best[key] = r
        cases.setdefault(r["bench"], {}).setdefault(r["case"], None)
        impls.setdefault(r["bench"], {}).setdefault(r["impl"], None)
    return best, {b: list(c) for b, c in cases.items()}, {b: list(i) for b, i in impls.items()}


def base_impl(impls):
    """kiln when the bench has it; otherwise the first impl that is not PyTorch's."""
    if "kiln" in impls:
        return "kiln"
    for i in impls:
        if not i.startswith("pytorch"):
            return i
    return impls[0]


def ordered_impls(impls, base):
    rest = [i for i in impls if i != base]
    py = [i for i in rest if i.startswith("pytorch")]
    return [base] + py + [i for i in rest if i not in py]


def gbs(r):
    b = positive(r, "bytes")
    return b / (r["ms"] * 1e-3) / 1e9 if b else None


def tflops(r):
    f = positive(r, "flops")
    return f / (r["ms"] * 1e-3) / 1e12 if f else None


def copy_ceiling(best):
    """The device copy bandwidth (GB/s): the best cudaMemcpyAsync copy of >= 256 MiB, else the best
    large copy of any impl, else None."""
    large = [r for (b, _, _), r in best.items() if b == "copy" and (positive(r, "bytes") or 0) >= CEILING_MIN_BYTES]
    for pick in ([r for r in large if r["impl"] == "cudaMemcpyAsync"], large):
        vals = [gbs(r) for r in pick if gbs(r)]
        if vals:
            return max(vals)
    return None


def fmt(v, digits=3):
    """digits decimals, fewer for large values, three significant digits below 0.1."""
    if v is None:
        return "–"
    if v >= 1000:
        return f"{v:.0f}"
    if v >= 100:
        return f"{v:.1f}"
    if v < 0.1:
        return f"{v:.3g}"
    return f"{v:.{digits}f}"


def table(bench, cases, impls, best, ceiling):
    base = base_impl(impls)
    order = ordered_impls(impls, base)
    rows_of = {c: {i: best.get((bench, c, i)) for i in order} for c in cases}
    has_flops = {i: any(rows_of[c][i] and tflops(rows_of[c][i]) for c in cases) for i in order}
    has_bytes = {i: any(rows_of[c][i] and gbs(rows_of[c][i]) for c in cases) for i in order}
    show_frac = ceiling is not None and bench not in NO_COPY_FRACTION
    head = ["case"]
    for i in order:
        head.append(f"{i} ms")
        if i != base:
            head.append(f"{i} / {base}")
        if has_flops[i]:
            head.append(f"{i} TFLOP/s")
        elif has_bytes[i]:
            head.append(f"{i} GB/s")
            if show_frac:
                head.append(f"{i} % of copy")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    ratios = {i: [] for i in order if i != base}
    for c in cases:
        cells = [c.replace("|", "\\|")]
        kb = rows_of[c][base]
        for i in order:
            r = rows_of[c][i]
            cells.append(fmt(r["ms"]) if r else "–")
            if i != base:
                if r and kb:
                    ratio = r["ms"] / kb["ms"]
                    ratios[i].append(ratio)
                    cells.append(f"{ratio:.2f}x")
                else:
                    cells.append("–")
            if has_flops[i]:
                cells.append(fmt(tflops(r), 1) if r else "–")
            elif has_bytes[i]:
                bw = gbs(r) if r else None
                cells.append(fmt(bw, 1))
                if show_frac:
                    cells.append(f"{100.0 * bw / ceiling:.0f}%" if bw else "–")
        lines.append("| " + " | ".join(cells) + " |")
    notes = []
    for i, rs in ratios.items():
        if rs:
            g = math.exp(sum(math.log(x) for x in rs) / len(rs))
            notes.append(f"{i} / {base}: geometric mean {g:.2f}x over {len(rs)} case(s), "
                         f"range {min(rs):.2f}x .. {max(rs):.2f}x")
    return lines, notes


def render(rows, meta, bad):
    best, cases, impls = merge(rows)
    ceiling = copy_ceiling(best)
    gpus = sorted({str(r["gpu"]) for r in rows + meta if r.get("gpu")})
    torchs = sorted({str(r["torch"]) for r in rows + meta if r.get("torch")})
    out = ["# kiln on the GPU beside its peers", ""]
    out.append(f"GPU: {', '.join(gpus) if gpus else '?'}" + (f"; PyTorch {', '.join(torchs)}" if torchs else
                                                                "; no PyTorch rows") + "  ")
    if ceiling:
        out.append(f"device copy bandwidth (read + write, the best cudaMemcpyAsync of >= 256 MiB): "
                   f"{ceiling:.0f} GB/s  ")
    out.append("ratio = peer ms / kiln ms: > 1 means kiln is faster. Medians of CUDA-event timings; "
               "GB/s counts the minimal traffic each bench states, TFLOP/s its FLOP count.")
    if bad:
        out.append(f"\n({bad} unreadable line(s) skipped)")
    benches = [b for b in BENCH_ORDER if b in cases] + sorted(b for b in cases if b not in BENCH_ORDER)
    for b in benches:
        lines, notes = table(b, cases[b], impls[b], best, ceiling)
        out += ["", f"## {b}", ""] + lines
        if notes:
            out += [""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="also write the Markdown here")
    ap.add_argument("files", nargs="*", help="JSON-lines files (missing or empty ones are fine)")
    args = ap.parse_args(argv)
    rows, meta, bad = read_rows(args.files)
    if rows:
        text = render(rows, meta, bad)
    else:
        text = "no GPU results\n" + (f"({bad} unreadable line(s) skipped)\n" if bad else "")
    sys.stdout.write(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
