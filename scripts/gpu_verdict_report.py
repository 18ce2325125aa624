#!/usr/bin/env python3
"""results.md of scripts/gpu-verdict.sh: the kiln-train rows, then the benches beside PyTorch.

Usage: gpu_verdict_report.py --logs DIR --bench bench.jsonl --out results.md

kiln-train rows come from the verdict's logs (DIR/train-*.log): the last JSON line of each run
(samples/s over the whole run and in the steady state after the warm-up, test accuracy, peak
memory) and, from the lines gpu-verdict.sh stamped with seconds since the run began, the first
epoch whose test accuracy reached 93%. The PyTorch GPT-2 peers' JSON lines (eager and
torch.compile) sit beside kiln's GPT-2 run, compared by their steady-state rates over equal step
counts. The bench tables are bench/cuda/compare.py's. Standard library only.
"""
import argparse
import glob
import json
import math
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench", "cuda"))
import compare  # noqa: E402


def last_json(path):
    found = None
    for line in open(path, errors="replace"):
        line = re.sub(r"^\[\s*[\d.]+\] ", "", line.strip())
        line = re.sub(r"^\[rank \d+\] ", "", line)
        if line.startswith("{") and line.endswith("}"):
            try:
                found = json.loads(line)
            except ValueError:
                pass
    return found


def time_to(path, target):
    """(seconds since the run began, epoch) of the first epoch at or above `target` test accuracy."""
    for line in open(path, errors="replace"):
        m = re.match(r"\[\s*([\d.]+)\] epoch (\d+): test accuracy ([\d.]+)%", line.strip())
        if m and float(m.group(3)) >= target:
            return float(m.group(1)), int(m.group(2))
    return None


GPT_PEERS = (("pytorch-gpt2-124m", "PyTorch eager", 1.0), ("pytorch-gpt2-124m-compile", "torch.compile", 0.9))


def steady_text(d):
    """'rate (S steps after W)' of a summary's steady-state rate, '-' when it has none."""
    if d.get("steady_samples_per_second") is None:
        return "-"
    return f"{d['steady_samples_per_second']:,.1f} ({d['steady_steps']} steps after {d['warmup_steps']})"


def compare_gpt(k, p):
    """kiln's GPT-2 summary against a peer's: (steady-state ratio or None, what was compared). The
    steady-state rates compare only over equal step counts and warm-ups; the whole-run ratio is
    given beside them."""
    whole_text = f"whole run {k['samples_per_second'] / p['samples_per_second']:.2f}x"
    counts = [(d.get("steps"), d.get("warmup_steps"), d.get("steady_steps")) for d in (k, p)]
    if counts[0] != counts[1]:
        return None, (f"unequal steps: kiln {counts[0][0]} ({counts[0][1]} warm-up), PyTorch {counts[1][0]} "
                      f"({counts[1][1]} warm-up); {whole_text}")
    if not (k.get("steady_samples_per_second") and p.get("steady_samples_per_second")):
        why = f"{counts[0][0]} steps, {counts[0][1]} warm-up" if counts[0][1] is not None else "summaries without one"
        return None, f"no steady-state rate ({why}); {whole_text}"
    r = k["steady_samples_per_second"] / p["steady_samples_per_second"]
    return r, f"**{r:.2f}x** steady ({counts[0][2]} steps after {counts[0][1]} warm-up, each side); {whole_text}"


def train_table(logs):
    out = ["## kiln-train on the GPU", "",
           "| run | samples/s (whole run) | steady samples/s (steps after warm-up) | test accuracy | peak memory (GiB) | note |",
           "|---|---|---|---|---|---|"]
    rates, summaries = {}, {}
    for path in sorted(glob.glob(os.path.join(logs, "train-*.log")) + glob.glob(os.path.join(logs, "pytorch-gpt2*.log"))):
        name = os.path.basename(path)[:-4]
        d = last_json(path)
        if not d:
            out.append(f"| {name} | - | - | - | - | no summary line (see its log) |")
            continue
        sps = d.get("samples_per_second", 0.0)
        rates[name], summaries[name] = sps, d
        note = ""
        if "to-93" in name:
            t = time_to(path, 93.0)
            note = f"93% after epoch {t[1]}, {t[0]:.1f} s after start" if t else "93% not reached"
        if "gpt" in name:
            note = "samples are tokens"  # kiln-train's GPT counts tokens, as its PyTorch peer does
        acc = d.get("test_accuracy")
        mem = d.get("peak_memory_bytes")
        out.append(f"| {name} | {sps:,.1f} | {steady_text(d)} | {'-' if acc is None else f'{100 * acc:.2f}%'} | "
                   f"{'-' if mem is None else f'{mem / 2**30:.2f}'} | {note} |")
    k = summaries.get("train-gpt2-124m")
    for peer, label, _ in GPT_PEERS:
        if k and summaries.get(peer, {}).get("samples_per_second"):  # not a rehearsal's plan
            r, text = compare_gpt(k, summaries[peer])
            out += ["", f"GPT-2 124M, B=16 T=1024 bf16, kiln / {label} tokens/s: {text}"]
    base = rates.get("train-cnn-f32")
    if base:
        out += ["", "CNN, 400 steps each, ratio to f32: " + ", ".join(
            f"{n[len('train-cnn-'):]} {rates[n] / base:.2f}x" for n in sorted(rates) if n.startswith("train-cnn-") and n != "train-cnn-to-93")]
    return out


MEMORY_BOUND = ("elementwise", "fused", "norm", "optim", "softmax_xent", "reduce")


def geomean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def targets_table(logs, summary_rows, bench_rows):
    """The verdict's bars (docs/gpu.md): each measured here, met or not."""
    best, _, _ = compare.merge(bench_rows) if bench_rows else ({}, {}, {})
    ceiling = compare.copy_ceiling(best) if best else None
    out = ["## Targets", "", "| target | measured | met |", "|---|---|---|"]

    def row(what, measured, ok):
        out.append(f"| {what} | {measured} | {'yes' if ok else 'no' if ok is not None else '-'} |")

    ran = [r for r in summary_rows if not r[1].startswith("skipped")]  # a rehearsal skips the GPU steps
    tests = [r for r in ran if r[0].startswith("test_")]
    if tests:
        passed = sum(1 for r in tests if r[1] == "ok")
        row("test_cuda: every test file passes", f"{passed} of {len(tests)} files", passed == len(tests))
    san = [r for r in ran if r[0] in ("memcheck", "racecheck")]
    if san:
        row("compute-sanitizer clean", ", ".join(f"{r[0]} {r[1]}" for r in san), all(r[1] == "ok" for r in san))
    if ceiling:
        fr = [compare.gbs(r) / ceiling for (b, _, i), r in best.items()
              if b in MEMORY_BOUND and i == "kiln" and compare.gbs(r)]
        if fr:
            fr.sort()
            row("memory-bound kernels >= 80% of the copy bandwidth",
                f"median {100 * fr[len(fr) // 2]:.0f}%, {sum(f >= 0.8 for f in fr)} of {len(fr)} cases", fr[len(fr) // 2] >= 0.8)
    for bench in ("matmul", "attention"):
        ratios = [best[(b, c, "pytorch")]["ms"] / r["ms"] for (b, c, i), r in best.items()
                  if b == bench and i == "kiln" and (b, c, "pytorch") in best]
        g = geomean(ratios)
        if g:
            row(f"{bench} >= 0.9x PyTorch (geometric mean)", f"{g:.2f}x over {len(ratios)} cases", g >= 0.9)
    cnn = os.path.join(logs, "train-cnn-to-93.log")
    if os.path.isfile(cnn):
        t = time_to(cnn, 93.0)
        row("CNN >= 93% test accuracy in < 10 s", f"after {t[0]:.1f} s (epoch {t[1]})" if t else "not reached",
            bool(t and t[0] < 10))
    summary = lambda n: last_json(os.path.join(logs, f"{n}.log")) if os.path.isfile(os.path.join(logs, f"{n}.log")) else None
    k = summary("train-gpt2-124m")
    for peer, label, bar in GPT_PEERS:
        p = summary(peer)
        if k and p and p.get("samples_per_second"):  # not a rehearsal's plan
            r, text = compare_gpt(k, p)
            row(f"GPT-2 124M steps >= {bar:.1f}x {label} tokens/s (steady state)", text, None if r is None else r >= bar)
    return out if len(out) > 4 else []


def summary_rows(path):
    rows = []
    if os.path.isfile(path):
        for line in open(path):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) >= 2 and cells[0] not in ("step", "---"):
                rows.append((cells[0], cells[1].split(":")[0].split(" (")[0]))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--summary", help="summary.md, for the targets' test and sanitizer rows")
    a = ap.parse_args()
    rows, meta, bad = compare.read_rows([a.bench])
    targets = targets_table(a.logs, summary_rows(a.summary) if a.summary else [], rows)
    text = "# GPU verdict: results\n\n" + ("\n".join(targets) + "\n\n" if targets else "")
    text += "\n".join(train_table(a.logs)) + "\n\n"
    text += compare.render(rows, meta, bad) if rows else "no GPU bench results\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
