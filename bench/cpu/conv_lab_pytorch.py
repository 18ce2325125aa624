#!/usr/bin/env python3
"""PyTorch's side of the CPU convolution lab (bench/cpu/conv_lab.cpp).

Usage: bench_conv_lab --json [--batch N --threads T] > kiln.jsonl
       python3 bench/cpu/conv_lab_pytorch.py kiln.jsonl

For every shape kiln measured, times PyTorch's CPU convolution (oneDNN where PyTorch uses it) on
the same shape, batch and thread count -- forward, input gradient and weight gradient separately,
through aten::convolution_backward with one output mask each -- and prints both sides' times and
kiln's speed-up (PyTorch time / kiln time; above 1 means kiln is faster), then the sums for the
ResNet-18 and CNN shapes per training step (PyTorch's backward there is one call for both
gradients, as autograd makes it, which can cost less than the two separate calls in the table). Best of 5 runs each, as on kiln's side. PyTorch's denormal flushing is
on, as kiln's kernels run with it (kiln::set_flush_denormal). Needs torch.
"""
import json
import sys
import time

import torch
import torch.nn.functional as F


def best_seconds(fn, reps=5):
    fn()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def torch_times(s):
    n, c, h, k, ks, st = s["batch"], s["C"], s["H"], s["K"], s["k"], s["stride"]
    pad = ks // 2
    x, w = torch.randn(n, c, h, h), torch.randn(k, c, ks, ks)
    y = F.conv2d(x, w, stride=st, padding=pad)
    gy = torch.randn_like(y)

    def backward(mask):
        return lambda: torch.ops.aten.convolution_backward(
            gy, x, w, None, [st, st], [pad, pad], [1, 1], False, [0, 0], 1, mask)

    with torch.no_grad():
        return (best_seconds(lambda: F.conv2d(x, w, stride=st, padding=pad)),
                best_seconds(backward([True, False, False])),
                best_seconds(backward([False, True, False])),
                best_seconds(backward([True, True, False])))


def main():
    rows = [json.loads(line) for line in open(sys.argv[1]) if line.startswith("{")]
    if not rows:
        sys.exit("no kiln results in " + sys.argv[1])
    torch.set_num_threads(rows[0]["threads"])
    torch.set_flush_denormal(True)
    print(f"conv lab: batch {rows[0]['batch']}, {rows[0]['threads']} threads, kiln vs PyTorch {torch.__version__} "
          f"(measured FMA peak {rows[0]['peak_gflops']:.0f} GFLOP/s)")
    print(f"{'shape':34} {'forward kiln/torch ms (x)':>28} {'input grad':>28} {'weight grad':>28}")
    totals = {}
    for s in rows:
        kt = (s["forward_s"], s["input_grad_s"], s["weight_grad_s"])
        tt = torch_times(s)
        cells = "".join(f"  {a * 1e3:8.2f}/{b * 1e3:8.2f} ({b / a:4.2f}x)" for a, b in zip(kt, tt[:3]))
        print(f"{s['shape']:34}{cells}")
        model = s["shape"].split()[0]
        # weighted by how often one training step runs the shape; the images need no gradient
        grad = 1 if s["input_grad"] else 0
        kiln_sum = s["uses"] * (kt[0] + kt[2] + grad * kt[1])
        # training asks PyTorch for both gradients in one call, which can share work: count that
        torch_sum = s["uses"] * (tt[0] + (tt[3] if grad else tt[2]))
        a, b = totals.get(model, (0.0, 0.0))
        totals[model] = (a + kiln_sum, b + torch_sum)
    for model, (a, b) in totals.items():
        print(f"{model}: one training step's convolutions, kiln {a * 1e3:.1f} ms, PyTorch {b * 1e3:.1f} ms "
              f"= {b / a:.2f}x")


if __name__ == "__main__":
    main()
