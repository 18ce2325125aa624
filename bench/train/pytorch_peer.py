#!/usr/bin/env python3
"""The PyTorch peer of `kiln-train` (defaults) for bench/train/compare_pytorch.sh.

Same model (the Fashion-MNIST CNN: conv3x3 1->32 no bias + BN + ReLU + maxpool, conv3x3 32->64
no bias + BN + ReLU + maxpool, linear 3136->128, ReLU, linear 128->10), same data and
normalisation, batch 128 with the last partial batch dropped, AdamW (weight decay 5e-4) under
OneCycleLR (max LR 5e-3, PyTorch's defaults otherwise), 2 epochs, the same number of CPU threads.
The whole dataset is decoded into one tensor up front, so PyTorch's input pipeline costs nothing
here (kiln-train's loader work is included in its own numbers). Prints one JSON line like
kiln-train's last line.
"""
import gzip
import json
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = sys.argv[1] if len(sys.argv) > 1 else "/usr/share/datasets/fashion-mnist"
THREADS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
# "flush": torch.set_flush_denormal(True), as kiln-train's default --flush-denormal true
FLUSH_DENORMAL = len(sys.argv) > 3 and sys.argv[3] == "flush"
EPOCHS, BATCH, MAX_LR, MEAN, STD = 2, 128, 5e-3, 0.2860, 0.3530


def idx(path, offset):
    with gzip.open(f"{ROOT}/{path}", "rb") as f:
        return np.frombuffer(f.read(), dtype=np.uint8, offset=offset)


def images(path):
    x = torch.from_numpy(idx(path, 16).copy()).view(-1, 1, 28, 28).float() / 255.0
    return (x - MEAN) / STD


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


def main():
    torch.set_num_threads(THREADS)
    if FLUSH_DENORMAL:
        torch.set_flush_denormal(True)
    torch.manual_seed(0)
    xtr, ytr = images("train-images-idx3-ubyte.gz"), torch.from_numpy(idx("train-labels-idx1-ubyte.gz", 8).astype(np.int64))
    xte, yte = images("t10k-images-idx3-ubyte.gz"), torch.from_numpy(idx("t10k-labels-idx1-ubyte.gz", 8).astype(np.int64))
    model = CNN()
    steps = len(xtr) // BATCH
    opt = torch.optim.AdamW(model.parameters(), lr=MAX_LR, weight_decay=5e-4)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, MAX_LR, total_steps=steps * EPOCHS)
    train_seconds, samples = 0.0, 0
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(xtr))
        model.train()
        t0 = time.perf_counter()
        for s in range(steps):
            i = perm[s * BATCH:(s + 1) * BATCH]
            loss = F.cross_entropy(model(xtr[i]), ytr[i])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        train_seconds += time.perf_counter() - t0
        samples += steps * BATCH
    model.eval()
    with torch.no_grad():
        acc = sum((model(xte[i:i + 256]).argmax(1) == yte[i:i + 256]).sum().item()
                  for i in range(0, len(xte), 256)) / len(xte)
    print(json.dumps({"model": "cnn", "framework": f"pytorch {torch.__version__}", "threads": THREADS,
                      "flush_denormal": FLUSH_DENORMAL,
                      "epochs": EPOCHS, "train_seconds": train_seconds,
                      "samples_per_second": samples / train_seconds, "test_accuracy": acc}))


if __name__ == "__main__":
    main()
