#!/usr/bin/env python3
"""Writes the PyTorch state dicts that tests/nn/test_torch_state_dicts.cpp loads into kiln's
mirrored modules: one safetensors file per module family, holding the module's state_dict under
PyTorch's own names, plus `__input__` and `__output__` (the module's eval-mode output for that
input). Run with PyTorch installed; the files are committed, so the tests need no PyTorch.

usage: python3 make_fixtures.py [OUT_DIR]   (default: this folder)
"""
import json
import os
import struct
import sys

import torch
import torch.nn as nn

OUT = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
DTYPES = {torch.float32: "F32", torch.int64: "I64"}


def save(path, tensors):
    """safetensors: 8-byte little-endian header length, JSON header, raw little-endian bytes."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(b)]}
        blobs.append(b)
        offset += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def first(out):
    return out[0] if isinstance(out, tuple) else out


def case(name, module, x, train_steps=0):
    torch.manual_seed(0)
    for p in module.parameters():  # away from the default initialisation, so loading is visible
        with torch.no_grad():
            p.add_(torch.randn_like(p) * 0.1)
    module.train()
    for _ in range(train_steps):  # running statistics (BatchNorm)
        module(torch.randn_like(x) * 2 + 0.5)
    module.eval()
    with torch.no_grad():
        if isinstance(module, nn.MultiheadAttention):
            y = module(x, x, x, need_weights=False)[0]
        else:
            y = first(module(x))
    tensors = dict(module.state_dict())
    tensors["__input__"] = x
    tensors["__output__"] = y
    save(os.path.join(OUT, f"{name}.safetensors"), tensors)
    print(f"{name}: {', '.join(k for k in module.state_dict())}")


torch.manual_seed(1)
r = lambda *s: torch.randn(*s)
case("linear", nn.Linear(5, 3), r(2, 5))
case("conv1d", nn.Conv1d(3, 4, 3, padding=1), r(2, 3, 7))
case("conv2d", nn.Conv2d(3, 4, 3, padding=1), r(2, 3, 5, 6))
case("conv_transpose2d", nn.ConvTranspose2d(4, 3, 3, stride=2), r(2, 4, 3, 3))
case("batch_norm2d", nn.BatchNorm2d(4), r(3, 4, 5, 5), train_steps=3)
case("layer_norm", nn.LayerNorm(6), r(2, 3, 6))
case("group_norm", nn.GroupNorm(2, 4), r(2, 4, 3, 3))
case("rms_norm", nn.RMSNorm(6, eps=1e-6), r(2, 3, 6))
case("embedding", nn.Embedding(10, 4), torch.tensor([[1, 3, 9], [0, 2, 2]]))
case("multihead_attention", nn.MultiheadAttention(8, 2), r(5, 2, 8))
case("transformer_encoder_layer", nn.TransformerEncoderLayer(8, 2, dim_feedforward=16, dropout=0.0), r(5, 2, 8))
case("lstm", nn.LSTM(4, 5, num_layers=2), r(6, 2, 4))
case("gru", nn.GRU(4, 5), r(6, 2, 4))
