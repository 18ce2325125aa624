#!/usr/bin/env python3
"""The PyTorch peer of `kiln-train --model gpt --gpt-size 124m` on the same GPU.

Same model as kiln's nn::models::GPT with GPTConfig::gpt2_124m(): 12 pre-norm blocks (LayerNorm,
causal self-attention with 12 heads, LayerNorm, Linear 768->3072, tanh GELU, Linear 3072->768),
learned position embeddings, final LayerNorm, the LM head tied to the token embedding,
vocabulary 50304, T = 1024, no dropout. Same data: windows of the character corpus (the
characters' indices are the first entries of the vocabulary). Same step: bf16 autocast, cross
entropy, AdamW (fused, weight decay 5e-4) under OneCycleLR, batch 16 by default. PyTorch eager
with F.scaled_dot_product_attention (its flash kernel); --compile wraps the model in torch.compile
(default mode; the first step compiles). Two rates, in tokens/s, as kiln-train reports them:
samples_per_second counts every step from the first to the last (compilation included), and
steady_samples_per_second the steps after --warmup-steps (kiln-train's rule, steady_rate.py), the
GPU synchronised at both ends of that window. Prints one JSON line.

--list checks the arguments and the corpus and prints the plan without importing torch (the
GPU suite's rehearsal runs it so on a machine without PyTorch).
"""
import argparse
import json
import math
import os
import sys
import time

import steady_rate

VOCAB, BLOCK, LAYERS, HEADS, EMBD = 50304, 1024, 12, 12, 768


def read_corpus(path):
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path)
        if os.path.isfile(os.path.join(path, f)) and not f.endswith((".dat", ".u8")))
    if not files:
        sys.exit(f"pytorch_gpt_peer: no text files in {path}")
    text = b"".join(open(f, "rb").read() for f in files).decode("utf-8", errors="replace")
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    return [index[c] for c in text], len(chars)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="text file or folder (the GPU bundle's fortunes)")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
    steady_rate.add_argument(ap)
    ap.add_argument("--list", action="store_true", help="check the arguments and data, print the plan, no torch")
    a = ap.parse_args()
    tokens, vocab_used = read_corpus(a.data)
    if vocab_used > VOCAB or len(tokens) < BLOCK + 2:
        sys.exit(f"pytorch_gpt_peer: corpus unusable ({len(tokens)} characters, {vocab_used} distinct)")
    warmup = steady_rate.warmup_steps(a.steps, a.warmup_steps, at_least=1 if a.compile else 0)
    plan = {"model": f"gpt2-124m (pytorch {'compile' if a.compile else 'eager'})", "batch_size": a.batch_size,
            "steps": a.steps, "warmup_steps": warmup, "corpus_characters": len(tokens), "vocab_used": vocab_used}
    if a.list:
        print(json.dumps(plan))
        return

    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(EMBD), nn.LayerNorm(EMBD)
            self.qkv, self.out = nn.Linear(EMBD, 3 * EMBD), nn.Linear(EMBD, EMBD)
            self.fc, self.proj = nn.Linear(EMBD, 4 * EMBD), nn.Linear(4 * EMBD, EMBD)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out(y.transpose(1, 2).reshape(B, T, C))
            return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(VOCAB, EMBD), nn.Embedding(BLOCK, EMBD)
            self.h = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln_f = nn.LayerNorm(EMBD)
            for n, p in self.named_parameters():  # GPT-2's init, as kiln's
                if p.dim() >= 2:
                    std = 0.02 / math.sqrt(2 * LAYERS) if n.endswith(("out.weight", "proj.weight")) else 0.02
                    nn.init.normal_(p, 0.0, std)
                elif n.endswith("bias"):
                    nn.init.zeros_(p)

        def forward(self, idx):
            x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
            for b in self.h:
                x = b(x)
            return F.linear(self.ln_f(x), self.wte.weight)

    dev = torch.device("cuda")
    torch.manual_seed(0)
    data = torch.tensor(tokens, dtype=torch.int64)
    model = GPT().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=5e-4, fused=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=a.lr, total_steps=a.steps)
    forward = torch.compile(model) if a.compile else model
    g = torch.Generator().manual_seed(0)
    tokens_per_step = a.batch_size * BLOCK
    window = steady_rate.SteadyWindow(warmup, time.perf_counter, torch.cuda.synchronize)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    window.step_done(0, 0)
    for step in range(a.steps):
        starts = torch.randint(0, len(tokens) - BLOCK - 1, (a.batch_size,), generator=g)
        x = torch.stack([data[s:s + BLOCK] for s in starts]).pin_memory().to(dev, non_blocking=True)
        y = torch.stack([data[s + 1:s + 1 + BLOCK] for s in starts]).pin_memory().to(dev, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(forward(x).view(-1, VOCAB), y.view(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        window.step_done(step + 1, (step + 1) * tokens_per_step)
    torch.cuda.synchronize()
    end = time.perf_counter()
    secs = end - t0
    print(json.dumps({**plan, "train_seconds": secs, "samples_per_second": a.steps * tokens_per_step / secs,
                      **window.fields(a.steps, a.steps * tokens_per_step, end),
                      "final_loss": loss.item(), "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
                      "peak_memory_bytes": torch.cuda.max_memory_reserved()}))


if __name__ == "__main__":
    main()
