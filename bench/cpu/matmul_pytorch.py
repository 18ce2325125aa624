#!/usr/bin/env python3
"""PyTorch's f32 torch.matmul GFLOP/s for square products, the peer of bench_matmul (same sizes,
same thread count, median of the same number of timed runs). The CPU level is PyTorch's own
choice unless ATEN_CPU_CAPABILITY / ONEDNN_MAX_CPU_ISA / MKL_ENABLE_INSTRUCTIONS restrict it
(bench/cpu/compare_matmul.sh sets them). Each product is checked against float64 on sampled
entries, as bench_matmul does.

Usage: matmul_pytorch.py [--threads T] [N ...]   (default sizes 256 512 1024 2048)
Prints one line per size: "torch <n> <ms> <GFLOP/s>".
"""
import argparse
import statistics
import time

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("sizes", type=int, nargs="*", default=[256, 512, 1024, 2048])
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads")
    for n in args.sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        c = torch.matmul(a, b)  # warm-up (and the checked result)
        rows = torch.arange(64) * 7919 % n
        cols = torch.arange(64) * 104729 % n
        exact = (a[rows].double() * b[:, cols].double().t()).sum(1)
        scale = (a[rows].double() * b[:, cols].double().t()).abs().sum(1)
        err = ((c[rows, cols].double() - exact).abs() / scale).max().item()
        assert err < n * 6e-8, f"torch.matmul n={n}: error {err}"
        times = []
        for _ in range(5 if n >= 2048 else 9):
            t0 = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - t0)
        t = statistics.median(times)
        print(f"torch {n} {t * 1e3:.3f} {2 * n ** 3 / t / 1e9:.1f}")


if __name__ == "__main__":
    main()
