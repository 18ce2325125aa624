#!/usr/bin/env python3
"""The report of bench/train/compare_pytorch.sh, from its log: per model, each side's rounds,
median, spread, peak memory and accuracy, and the ratios of the medians; with --json, the same as
a record for scripts/performance_page.py (docs/performance.md).

usage: compare_report.py LOG [--json OUT] [--what-cnn TEXT] [--what-resnet18 TEXT] [--what-gpt TEXT]

LOG holds lines "round R MODEL SIDE...: {json}" (kiln-train's or pytorch_peer.py's last line) and
"CPU: ...; ISA=..." as compare_pytorch.sh prints them.
"""
import argparse
import json
import re
import statistics

SIDES = {"kiln": "kiln", "pytorch": "PyTorch", "pytorch (flush denormal)": "PyTorch, flush denormal",
         "pytorch (compile)": "PyTorch, torch.compile + fused AdamW"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--json")
    for m in ("cnn", "resnet18", "gpt"):
        ap.add_argument(f"--what-{m}", default="")
    a = ap.parse_args()
    records, machine, failures = {}, {}, {}
    for line in open(a.log):
        f = re.match(r"round (\d+) (\w+) (.+?):\s+FAILED: ?(.*)$", line)
        if f:
            failures.setdefault(f.group(2), []).append((f.group(3).strip(), f.group(1), f.group(4).strip()))
        m = re.match(r"round (\d+) (\w+) (.+?):\s+(\{.*\})\s*$", line)
        if m:
            records.setdefault(m.group(2), {}).setdefault(m.group(3).strip(), []).append(json.loads(m.group(4)))
        m = re.match(r"CPU:\s*(.*); ISA=(\w+)", line)
        if m:
            machine = {"kind": "CPU", "cpu": m.group(1).strip(), "level": m.group(2)}
    mb = lambda b: f"{b / 1e6:.0f} MB"
    out = {"machine": machine, "models": {}}
    for model, sides in records.items():
        unit = "tokens/s" if model == "gpt" else "images/s"
        n = max(len(rs) for rs in sides.values())
        any_torch = next((rs[0] for s, rs in sides.items() if s != "kiln"), {})
        threads = any_torch.get("threads", "?")
        what = getattr(a, f"what_{model}")
        print(f"\n### {model}: {what + ', ' if what else ''}{threads} threads ({unit}, {n} round{'s' if n > 1 else ''})\n")
        print("| run | " + " | ".join(f"round {i + 1}" for i in range(n))
              + " | median | spread (min-max) | peak RSS (median) | test accuracy (median) |")
        print("|---" * (n + 5) + "|")
        medians, rows = {}, {}
        for side, rs in sides.items():
            sps = [r["samples_per_second"] for r in rs]
            medians[side] = statistics.median(sps)
            mem = statistics.median(r["peak_memory_bytes"] for r in rs)
            if "import_memory_bytes" in rs[0]:  # PyTorch: how much of it is the imported libraries
                mem_text = f"{mb(mem)} ({mb(statistics.median(r['import_memory_bytes'] for r in rs))} after import)"
            else:
                mem_text = mb(mem)
            acc = statistics.median(r["test_accuracy"] for r in rs)
            print(f"| {SIDES.get(side, side)} | " + " | ".join([f"{s:,.0f}" for s in sps] + ["-"] * (n - len(sps)))
                  + f" | **{medians[side]:,.0f}** | {min(sps):,.0f}-{max(sps):,.0f} | {mem_text} | {100 * acc:.2f}% |")
            rows[side] = {"label": SIDES.get(side, side), "rounds": sps, "median": medians[side], "min": min(sps),
                          "max": max(sps), "peak_memory_bytes": mem, "test_accuracy": acc,
                          "cpu_isa": rs[0].get("cpu_isa") or rs[0].get("cpu_capability")}
        print()
        for side in sides:
            if side != "kiln" and "kiln" in medians:
                print(f"- ratio of medians, kiln / {SIDES.get(side, side)}: **{medians['kiln'] / medians[side]:.2f}x**")
        for side, rnd, why in failures.get(model, []):
            print(f"- {SIDES.get(side, side)} failed in round {rnd}: {why}")
        out["models"][model] = {"unit": unit, "what": what, "threads": threads, "sides": rows,
                                "failures": [{"side": s, "round": int(r), "error": w} for s, r, w in failures.get(model, [])]}
    if machine.get("level") == "auto":  # the level kiln ran at
        kiln_isa = next((r["cpu_isa"] for sides in records.values() for r in sides.get("kiln", []) if "cpu_isa" in r), None)
        machine["level"] = kiln_isa or "auto"
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
