#!/usr/bin/env python3
"""The PyTorch peer of kiln-train's default CPU runs, for bench/train/compare_pytorch.sh.

  pytorch_peer.py --model cnn|resnet18|gpt [--threads N] [--flush-denormal] [--max-steps N] [--data PATH]

Each model trains what `kiln-train --device cpu --model M` trains by default
(tools/kiln-train/{options,tasks,main}.cpp, kiln/nn/models/models.cpp):

  cnn       the Fashion-MNIST CNN (conv3x3 1->32 no bias + BN + ReLU + maxpool, conv3x3 32->64 no
            bias + BN + ReLU + maxpool, linear 3136->128, ReLU, linear 128->10), 2 epochs.
  resnet18  ResNet-18 with the CIFAR stem (one 3x3/1 conv, no max pool), 1 input channel, 10
            classes, kaiming-normal (fan_out) convs, on Fashion-MNIST; 2 epochs or --max-steps.
  gpt       the char GPT: 4 pre-norm blocks, d=128, 4 heads, T=128, residual dropout 0.1 (after
            the attention's and the MLP's projections), tanh GELU, biases, LM head tied to the
            token embedding, GPT-2's init; byte-level vocabulary of the fortunes corpus, random
            windows of the first 90%, batch 32, 300 steps.

Optimizer for all: AdamW (weight decay 5e-4, PyTorch's betas and eps, as kiln's) under
OneCycleLR (max LR 5e-3, gpt 2e-3; PyTorch's defaults otherwise, as kiln's) over the steps that
run; batch 128 (gpt 32), shuffled each epoch, last partial batch dropped; seed 0.

The data is decoded up front and kept as kiln keeps it (uint8 images, int64 tokens); each
batch is gathered and normalised in the timed loop, on the training thread (kiln-train does
it in 2 loader threads). Timing counts each epoch's training loop only, as kiln-train's
train_seconds does; evaluation happens after. samples_per_second is images/s, for gpt tokens/s
(kiln-train counts a GPT sample as its tokens), over the whole run (--compile: after its 3
compiling steps); steady_samples_per_second over the steps after --warmup-steps (kiln-train's rule,
steady_rate.py; --compile: at least its 3 compiling steps). peak_memory_bytes is the peak resident
set (getrusage), what kiln-train reports on the CPU. Prints one JSON line.
"""
import argparse
import gzip
import json
import math
import os
import resource
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import steady_rate

# The resident set right after the imports: the libraries alone (a CUDA build of PyTorch maps its
# CUDA libraries even when it only runs on the CPU), reported beside the peak.
IMPORT_RSS = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

MNIST_MEAN, MNIST_STD = 0.2860, 0.3530  # Fashion-MNIST's pixel statistics, as kiln-train's
DEFAULTS = {  # model: (batch, max LR, data)
    "cnn": (128, 5e-3, "/usr/share/datasets/fashion-mnist"),
    "resnet18": (128, 5e-3, "/usr/share/datasets/fashion-mnist"),
    "gpt": (32, 2e-3, "/usr/share/games/fortunes"),
}


def read_bytes(path):
    """A file's bytes, gunzipped if it is gzip (as kiln's file reader does)."""
    with open(path, "rb") as f:
        raw = f.read()
    return gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw


# ---------------------------------------------------------------- models


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(64)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
        return F.relu(out + (x if self.downsample is None else self.downsample(x)))


class ResNet18(nn.Module):
    """kiln's resnet18(10, 1, ResNetStem::CIFAR)."""

    def __init__(self, in_channels=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, 64, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        stages, cin = [], 64
        for s in range(4):
            cout = 64 << s
            stages.append(nn.Sequential(BasicBlock(cin, cout, 1 if s == 0 else 2), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(512, classes)
        for m in self.modules():  # torchvision's (and kiln's) conv init; BN 1/0 and fc as default
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.layer4(self.layer3(self.layer2(self.layer1(h))))
        return self.fc(F.adaptive_avg_pool2d(h, 1).flatten(1))


class Block(nn.Module):
    """kiln's TransformerBlock: x + drop(proj(attn(ln1 x))), then + drop(proj(gelu_tanh(fc(ln2 x))))."""

    def __init__(self, d, heads, dropout):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.attn_proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, T, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # no dropout on the attention weights
        x = x + self.drop(self.attn_proj(y.transpose(1, 2).reshape(B, T, C)))
        return x + self.drop(self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh")))


class GPT(nn.Module):
    """kiln's GPT with kiln-train's char config (no dropout on the embeddings)."""

    def __init__(self, vocab, block=128, layers=4, heads=4, d=128, dropout=0.1):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(block, d)
        self.h = nn.ModuleList(Block(d, heads, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        for m in self.modules():  # GPT-2's init, as kiln's
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, 0.0, 0.02)
            if isinstance(m, nn.Linear):
                nn.init.zeros_(m.bias)
        for b in self.h:  # residual projections scaled by 1/sqrt(2 n_layer)
            nn.init.normal_(b.attn_proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))
            nn.init.normal_(b.proj.weight, 0.0, 0.02 / math.sqrt(2 * layers))

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1)))
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)  # tied LM head


# ---------------------------------------------------------------- tasks: data, loss, evaluation


class VisionTask:
    """Fashion-MNIST, normalised per batch as kiln-train's ToFloat + Normalize."""

    def __init__(self, model, root):
        def idx(name, offset):
            return torch.from_numpy(np.frombuffer(read_bytes(f"{root}/{name}"), np.uint8, offset=offset).copy())
        self.xtr = idx("train-images-idx3-ubyte.gz", 16).view(-1, 1, 28, 28)
        self.ytr = idx("train-labels-idx1-ubyte.gz", 8).long()
        self.xte = idx("t10k-images-idx3-ubyte.gz", 16).view(-1, 1, 28, 28)
        self.yte = idx("t10k-labels-idx1-ubyte.gz", 8).long()
        self.model = CNN() if model == "cnn" else ResNet18()
        self.size = len(self.xtr)

    @staticmethod
    def images(x):
        return (x.float() / 255.0 - MNIST_MEAN) / MNIST_STD

    def loss(self, i):
        return F.cross_entropy(self.model(self.images(self.xtr[i])), self.ytr[i])

    def samples(self, batch):
        return batch

    def evaluate(self):
        """Test accuracy, batches of 256."""
        hits = sum((self.model(self.images(self.xte[i:i + 256])).argmax(1) == self.yte[i:i + 256]).sum().item()
                   for i in range(0, len(self.xte), 256))
        return hits / len(self.xte)


class TextTask:
    """Byte-level windows of a text corpus, as kiln's CharDataset: sample i is text[i, i+T) and
    its shift by one; the first 90% of the windows train, the rest validate."""

    def __init__(self, path, block=128):
        if os.path.isdir(path):  # the fortunes folder: every regular file but .dat/.u8, sorted
            names = sorted(n for n in os.listdir(path) if not n.startswith(".") and not n.endswith((".dat", ".u8"))
                           and os.path.isfile(os.path.join(path, n)) and not os.path.islink(os.path.join(path, n)))
            text = b"".join(read_bytes(os.path.join(path, n)) for n in names)
        else:
            text = read_bytes(path)
        raw = np.frombuffer(text, np.uint8)
        vocab = np.unique(raw)  # the sorted set of bytes that occur
        lookup = np.zeros(256, np.int64)
        lookup[vocab] = np.arange(len(vocab))
        self.tokens = torch.from_numpy(lookup[raw])
        self.block = block
        windows = len(self.tokens) - block
        self.size = windows * 9 // 10  # training windows [0, size)
        self.val = (self.size + block, windows)
        self.offsets = torch.arange(block)
        self.model = GPT(len(vocab), block)

    def windows(self, starts):
        i = starts[:, None] + self.offsets
        return self.tokens[i], self.tokens[i + 1]

    def loss(self, starts):
        x, y = self.windows(starts)
        logits = self.model(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    def samples(self, batch):
        return batch * self.block  # tokens

    def evaluate(self):
        """Next-byte accuracy on 40 random validation batches of 64, as kiln-train's."""
        g = torch.Generator().manual_seed(1234)
        hits = total = 0
        for _ in range(40):
            x, y = self.windows(torch.randint(self.val[0], self.val[1], (64,), generator=g))
            hits += (self.model(x).argmax(-1) == y).sum().item()
            total += y.numel()
        return hits / total


# ---------------------------------------------------------------- training


def main():
    ap = argparse.ArgumentParser(description="PyTorch peer of kiln-train's default CPU runs")
    ap.add_argument("--model", choices=sorted(DEFAULTS), default="cnn")
    ap.add_argument("--data", help="dataset folder (cnn, resnet18) or text file/folder (gpt); kiln-train's default")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--flush-denormal", action="store_true",
                    help="torch.set_flush_denormal(True), as kiln-train's default --flush-denormal true")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--max-steps", type=int, default=None,
                    help="stop after this many steps (kiln-train's --max-steps; gpt: 300, else no limit)")
    ap.add_argument("--compile", action="store_true",
                    help="torch.compile the model and use the fused AdamW: what a PyTorch user who cares about "
                         "speed runs; the first 3 steps (compilation) are left out of the timing")
    steady_rate.add_argument(ap)
    a = ap.parse_args()
    batch, max_lr, default_data = DEFAULTS[a.model]
    max_steps = a.max_steps or (300 if a.model == "gpt" else 0)  # gpt: 0 means 300, as in kiln-train

    torch.set_num_threads(a.threads)
    if a.flush_denormal:
        torch.set_flush_denormal(True)
    torch.manual_seed(0)
    task = TextTask(a.data or default_data) if a.model == "gpt" else VisionTask(a.model, a.data or default_data)
    model = task.model
    if a.compile:
        task.model = torch.compile(model)
    untimed = 3 if a.compile else 0  # steps left out of the timing
    steps_per_epoch = task.size // batch
    total_steps = steps_per_epoch * a.epochs
    if max_steps > 0:
        total_steps = min(total_steps, max_steps)
    opt = torch.optim.AdamW(model.parameters(), lr=max_lr, weight_decay=5e-4, fused=a.compile or None)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr, total_steps=total_steps)

    train_seconds, samples, step = 0.0, 0, 0
    # the training clock: the finished epochs' seconds and the current one's so far
    window = steady_rate.SteadyWindow(steady_rate.warmup_steps(total_steps, a.warmup_steps, at_least=untimed),
                                      lambda: train_seconds + time.perf_counter() - t0)
    model.train()
    for _ in range(a.epochs):
        if step >= total_steps:
            break
        t0 = time.perf_counter()
        window.step_done(step, samples)  # a warm-up of 0 steps: the window opens with the run
        perm = torch.randperm(task.size)  # inside the epoch's time, as kiln's loader shuffles
        for s in range(steps_per_epoch):
            loss = task.loss(perm[s * batch:(s + 1) * batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            samples += task.samples(batch) if step >= untimed else 0
            step += 1
            if step == untimed:  # compiled: the clock starts now
                t0 = time.perf_counter()
            window.step_done(step, samples)
            if step >= total_steps:
                break
        train_seconds += time.perf_counter() - t0
    final_loss = loss.item()
    model.eval()
    with torch.no_grad():
        acc = task.evaluate()
    print(json.dumps({
        "model": a.model, "framework": f"pytorch {torch.__version__}", "threads": a.threads,
        "flush_denormal": a.flush_denormal, "compile": a.compile,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(), "epochs": a.epochs, "steps": step, "batch_size": batch,
        "train_seconds": train_seconds, "samples_per_second": samples / train_seconds,
        **window.fields(step, samples, train_seconds),
        "final_loss": final_loss, "test_accuracy": acc,
        "peak_memory_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "import_memory_bytes": IMPORT_RSS}))


if __name__ == "__main__":
    main()
