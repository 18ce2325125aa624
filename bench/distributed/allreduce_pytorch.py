#!/usr/bin/env python3
"""PyTorch's Gloo all_reduce, the same-engine peer of bench_dist_allreduce (docs/distributed.md).

  torchrun --nproc-per-node 2 bench/distributed/allreduce_pytorch.py [--rounds 5] [--max-mb 64]

Same sizes, call counts, warm-up and statistics as bench_dist_allreduce's kiln column: f32 Sum
on the "gloo" backend over loopback, 1 thread per rank; per size, `rounds` rounds, each the mean
of 30 calls (8 at 16 MB, 4 at 64 MB); median [min-max] over the rounds. Every round checks the
result. Rank 0 prints the table.
"""
import argparse
import time

import torch
import torch.distributed as dist

SIZES = [4, 64, 512, 4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def human(b):
    for unit, scale in (("MB", 1 << 20), ("KB", 1 << 10)):
        if b >= scale:
            return f"{b // scale} {unit}"
    return f"{b} B"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-mb", type=float, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        print(f"PyTorch {torch.__version__} all_reduce f32 Sum, gloo, {world} ranks on loopback, "
              f"{args.rounds} rounds (median [min-max] of the per-round means)")
        print(f"{'size':>8} {'torch us':>24} {'busbw GB/s':>22}")
    for nbytes in SIZES:
        if nbytes > args.max_mb * (1 << 20):
            break
        n = max(1, nbytes // 4)
        calls = 4 if nbytes >= (64 << 20) else 8 if nbytes >= (16 << 20) else 30
        t = torch.empty(n)
        times = []
        for _ in range(args.rounds):
            t.fill_(rank + 1)
            dist.all_reduce(t)  # warm-up, and the value checked below
            want = world * (world + 1) / 2
            if not torch.all(t == want):
                raise SystemExit(f"VALIDATION FAILED: all_reduce of {nbytes} bytes")
            dist.barrier()
            start = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(t)
            times.append((time.perf_counter() - start) / calls)
        times.sort()
        med = times[len(times) // 2]
        factor = 2 * (world - 1) / world
        busbw = [n * 4 / x * factor / 1e9 for x in (med, times[-1], times[0])]
        if rank == 0:
            print(f"{human(nbytes):>8} {med * 1e6:>10.0f} [{times[0] * 1e6:.0f}-{times[-1] * 1e6:.0f}]"
                  f" {busbw[0]:>10.3f} [{busbw[1]:.3f}-{busbw[2]:.3f}]", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
