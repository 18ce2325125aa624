#!/usr/bin/env python3
"""results.md of scripts/gpu-verdict.sh: the kiln-train rows, then the benches beside PyTorch.

Usage: gpu_verdict_report.py --logs DIR --bench bench.jsonl --out results.md

kiln-train rows come from the verdict's logs (DIR/train-*.log): the last JSON line of each run
(samples/s, test accuracy, peak memory) and, from the lines gpu-verdict.sh stamped with seconds
since the run began, the first epoch whose test accuracy reached 93%. The PyTorch GPT-2 peer's
JSON line sits beside kiln's GPT-2 run. The bench tables are bench/cuda/compare.py's.
Standard library only.
"""
import argparse
import glob
import json
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


def train_table(logs):
    out = ["## kiln-train on the GPU", "",
           "| run | samples/s | test accuracy | peak memory (GiB) | note |", "|---|---|---|---|---|"]
    rates = {}
    for path in sorted(glob.glob(os.path.join(logs, "train-*.log")) + glob.glob(os.path.join(logs, "pytorch-gpt2*.log"))):
        name = os.path.basename(path)[:-4]
        d = last_json(path)
        if not d:
            out.append(f"| {name} | - | - | - | no summary line (see its log) |")
            continue
        sps = d.get("samples_per_second", 0.0)
        rates[name] = sps
        note = ""
        if "to-93" in name:
            t = time_to(path, 93.0)
            note = f"93% after epoch {t[1]}, {t[0]:.1f} s after start" if t else "93% not reached"
        if "gpt" in name:
            note = "samples are tokens"  # kiln-train's GPT counts tokens, as its PyTorch peer does
        acc = d.get("test_accuracy")
        mem = d.get("peak_memory_bytes")
        out.append(f"| {name} | {sps:,.1f} | {'-' if acc is None else f'{100 * acc:.2f}%'} | "
                   f"{'-' if mem is None else f'{mem / 2**30:.2f}'} | {note} |")
    k, p = rates.get("train-gpt2-124m"), rates.get("pytorch-gpt2-124m")
    if k and p:
        out += ["", f"GPT-2 124M, B=16 T=1024 bf16: kiln / PyTorch eager = **{k / p:.2f}x** tokens/s"]
    base = rates.get("train-cnn-f32")
    if base:
        out += ["", "CNN, 400 steps each, ratio to f32: " + ", ".join(
            f"{n[len('train-cnn-'):]} {rates[n] / base:.2f}x" for n in sorted(rates) if n.startswith("train-cnn-") and n != "train-cnn-to-93")]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--logs", required=True)
    ap.add_argument("--bench", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    text = "# GPU verdict: results\n\n" + "\n".join(train_table(a.logs)) + "\n\n"
    rows, meta, bad = compare.read_rows([a.bench])
    text += compare.render(rows, meta, bad) if rows else "no GPU bench results\n"
    with open(a.out, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
