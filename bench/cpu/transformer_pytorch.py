#!/usr/bin/env python3
"""kiln's nn::TransformerEncoder language model against PyTorch's, one training step each
(bench/cpu/transformer.cpp describes the model and the two configurations).

Usage: python3 bench/cpu/transformer_pytorch.py BENCH_TRANSFORMER [--config lm|encoder]
                                                [--rounds 3] [--steps 7]

Each round runs kiln's bench (which writes its initial weights and batch as .npy files), then
builds the same model in PyTorch from those weights, checks that PyTorch's first loss equals
kiln's (same weights, same batch, dropout 0: they must agree to float32 rounding), and times the
same step (forward, backward, AdamW, zero_grad; median of --steps after 2 warm-up steps) with the
same thread count and denormals flushed, as kiln runs. Rounds alternate kiln and PyTorch; the
summary gives the median and range of milliseconds per step and of kiln's speed-up (PyTorch time
/ kiln time; above 1 means kiln is faster). Needs torch and numpy.
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F


class LanguageModel(torch.nn.Module):
    def __init__(self, vocab, d_model, nhead, dim_feedforward, layers, seq):
        super().__init__()
        self.d_model, self.vocab = d_model, vocab
        self.embedding = torch.nn.Embedding(vocab, d_model)
        layer = torch.nn.TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout=0.0)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.decoder = torch.nn.Linear(d_model, vocab)
        pos = torch.arange(seq, dtype=torch.float32).unsqueeze(1)
        freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(seq, d_model)
        pe[:, 0::2] = torch.sin(pos * freq)
        pe[:, 1::2] = torch.cos(pos * freq)
        self.register_buffer("positions", pe.unsqueeze(1))
        self.register_buffer("causal", torch.nn.Transformer.generate_square_subsequent_mask(seq))

    def loss(self, tokens, targets):
        x = self.embedding(tokens) * math.sqrt(self.d_model) + self.positions
        logits = self.decoder(self.encoder(x, mask=self.causal, is_causal=True))
        return F.cross_entropy(logits.view(-1, self.vocab), targets.reshape(-1))


def run_kiln(binary, config, steps, dump):
    out = subprocess.run([binary, "--config", config, "--steps", str(steps), "--dump", dump],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def run_pytorch(dump, kiln_result, steps):
    shapes = {"lm": (33278, 200, 2, 200, 2, 35, 20), "encoder": (1000, 256, 4, 1024, 4, 128, 8)}
    vocab, d_model, nhead, ff, layers, seq, batch = shapes[kiln_result["config"]]
    model = LanguageModel(vocab, d_model, nhead, ff, layers, seq)
    params = dict(model.named_parameters())
    loaded = 0
    with torch.no_grad():
        for f in sorted(os.listdir(dump)):
            if f == "stream.npy":
                continue
            name = f[: -len(".npy")]  # kiln's parameter names are PyTorch's
            params[name].copy_(torch.from_numpy(np.load(os.path.join(dump, f))))
            loaded += 1
    if loaded != len(params):
        sys.exit(f"VALIDATION FAILED: loaded {loaded} of PyTorch's {len(params)} parameters")
    stream = torch.from_numpy(np.load(os.path.join(dump, "stream.npy")))
    tokens, targets = stream[:seq].contiguous(), stream[1:].contiguous()
    with torch.no_grad():
        loss0 = model.loss(tokens, targets).item()
    if abs(loss0 - kiln_result["loss0"]) > 1e-4 * max(1.0, abs(loss0)):
        sys.exit(f"VALIDATION FAILED: first loss PyTorch {loss0} vs kiln {kiln_result['loss0']}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        loss = model.loss(tokens, targets)
        loss.backward()
        opt.step()
        opt.zero_grad()
        loss.item()
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3, loss0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("--config", default="encoder")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=7)
    args = ap.parse_args()
    torch.set_flush_denormal(True)
    kiln_ms, torch_ms = [], []
    for r in range(args.rounds):
        with tempfile.TemporaryDirectory() as dump:
            k = run_kiln(args.binary, args.config, args.steps, dump)
            torch.set_num_threads(k["threads"])
            t, loss0 = run_pytorch(dump, k, args.steps)
        kiln_ms.append(k["ms_per_step"])
        torch_ms.append(t)
        print(f"round {r + 1}: kiln {k['ms_per_step']:.1f} ms/step, PyTorch {t:.1f} ms/step, "
              f"speed-up {t / k['ms_per_step']:.2f}x (first loss kiln {k['loss0']:.6f}, PyTorch {loss0:.6f}; "
              f"{k['threads']} threads)")
    ratios = [t / k for k, t in zip(kiln_ms, torch_ms)]
    print(f"{args.config}: kiln {statistics.median(kiln_ms):.1f} ms/step ({min(kiln_ms):.1f}-{max(kiln_ms):.1f}), "
          f"PyTorch {torch.__version__} {statistics.median(torch_ms):.1f} ({min(torch_ms):.1f}-{max(torch_ms):.1f}), "
          f"kiln's speed-up {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) over {args.rounds} rounds")


if __name__ == "__main__":
    main()
