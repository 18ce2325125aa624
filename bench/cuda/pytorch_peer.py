#!/usr/bin/env python3
"""PyTorch on the same GPU, timed on the same cases as kiln's GPU benches (bench/cuda/*.cpp, *.cu).

Every case name is the one the kiln bench records (cuda_bench_util.h's record()), so
bench/cuda/compare.py can set the two side by side:

  copy          a large tensor copy_ (the device copy bandwidth, kiln's ceiling for memory-bound rows)
  matmul        torch.mm for bf16 / f16 / f32 with TF32 (as kiln's bench allows it) at the square
                and GPT-2 MLP shapes; F.gelu(F.linear(x, w, b), "tanh") for the fused linear layer;
                mm + aten.gelu_backward + sum(0) for the GELU backward
  softmax_xent  softmax forward / _softmax_backward_data; F.cross_entropy forward and forward+backward
  norm          F.batch_norm (NCHW and channels_last) and F.layer_norm, forward and forward+backward
  optim         torch.optim.AdamW(fused=True) ("pytorch") and (foreach=True) ("pytorch foreach") over
                the same parameter lists (bench/model_shapes.h), GradScaler's fused unscale + inf
                check, clip_grad_norm_(foreach=True)
  attention     F.scaled_dot_product_attention, causal and not, forward and forward+backward; each
                row records the backend PyTorch chose (sdpa_backend, from its kernels' names)
  conv          F.conv2d + aten.convolution_backward (raw, no autograd, like kiln's bench) with
                cudnn.benchmark = True, f32 without TF32, f16 NCHW and channels_last
  fused, elementwise, reduce, transfer: the eager PyTorch op for each of kiln's cases

Timing: CUDA events around back-to-back calls on the current stream, after warmup, median of
many repetitions; fresh random inputs per case (never zeros). Rows are JSON lines with
impl "pytorch", the torch version and the GPU name, written as they are measured.
--list prints the planned cases and exits 0 without importing torch (a machine without a GPU).
Cases not started before --seconds has passed are skipped and listed on stderr.
"""
import argparse
import json
import math
import statistics
import sys
import time

torch = None  # imported in main(), after --list
F = None

DTYPE_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


# ------------------------------------------------------------------------------------ the plan
# Each case: (bench, case name, kind, parameters). The names are built exactly as the kiln bench
# builds them; the comments name the line of the bench they mirror.

def plan_copy():
    # cuda_bench_util.h copy_bandwidth_gbs: "device copy %g MiB" (256 MiB in most benches, 512 in optim)
    return [("copy", f"device copy {mib} MiB", "copy", dict(mib=mib)) for mib in (256, 512)]


def plan_matmul():
    out = []
    for dt in ("bfloat16", "float16", "float32"):
        dn = dt + ("(tf32)" if dt == "float32" else "")
        shapes = [("square", s, s, s) for s in (1024, 2048, 4096, 8192)]
        shapes += [("gpt2 fc", 8192, 768, 3072), ("gpt2 proj", 8192, 3072, 768)]
        for label, M, K, N in shapes:  # gemm_row
            out.append(("matmul", f"{label} {dn} [{M}x{K}] @ [{K}x{N}]", "gemm", dict(dt=dt, M=M, K=K, N=N)))
    for dt in ("bfloat16", "float32"):  # linear_gelu_row(dt, 8192, 768, 3072)
        dn = dt + ("(tf32)" if dt == "float32" else "")
        name = f"{dn} [8192x768] -> 3072"
        p = dict(dt=dt, M=8192, K=768, N=3072)
        out.append(("matmul", "linear+bias+gelu(tanh) " + name, "linear_gelu", p))
        out.append(("matmul", "gemm+dgelu(tanh)+bgrad " + name, "dgelu_bgrad", p))
    return out


def plan_softmax_xent():
    out = []
    for dt in ("float32", "bfloat16"):
        for R in (1024, 8192):  # softmax_rows
            shape = f"[{R}, 50257] {dt}"
            out.append(("softmax_xent", "softmax forward " + shape, "softmax_fwd", dict(dt=dt, R=R)))
            out.append(("softmax_xent", "softmax backward " + shape, "softmax_bwd", dict(dt=dt, R=R)))
    for dt in ("float32", "bfloat16"):
        for R in (1024, 8192):  # xent_rows
            shape = f"[{R}, 50257] {dt}"
            for backward in (False, True):
                what = "fwd+bwd" if backward else "forward"
                out.append(("softmax_xent", f"cross_entropy {what} {shape}", "xent",
                            dict(dt=dt, R=R, backward=backward)))
    return out


def plan_norm():
    # main() of norm.cpp; names as printed there (spacing included)
    bases = [
        ("batch_norm f32 [128, 32, 28, 28]", "batch_norm", dict(sizes=(128, 32, 28, 28), dt="float32", cl=False)),
        ("batch_norm f32 [256, 64, 56, 56]", "batch_norm", dict(sizes=(256, 64, 56, 56), dt="float32", cl=False)),
        ("batch_norm f32 channels-last [256,64,56,56]", "batch_norm",
         dict(sizes=(256, 64, 56, 56), dt="float32", cl=True)),
    ]
    for K in (768, 4096):
        R = 8192 * 768 // K * 2
        bases.append((f"layer_norm f32 [{R},{K}]", "layer_norm", dict(sizes=(R, K), dt="float32", cl=False)))
        if K == 768:
            bases.append((f"layer_norm bf16 [{R},{K}]", "layer_norm", dict(sizes=(R, K), dt="bfloat16", cl=False)))
    out = []
    for name, kind, p in bases:
        for backward in (False, True):
            out.append(("norm", name + (" forward+backward" if backward else " forward"), kind,
                        dict(p, backward=backward)))
    return out


def resnet18_shapes():  # bench/model_shapes.h
    s = [(64, 3, 7, 7), (64,), (64,)]
    cin_prev = 64
    for c in (64, 128, 256, 512):
        for block in (0, 1):
            cin = cin_prev if block == 0 else c
            s += [(c, cin, 3, 3), (c,), (c,), (c, c, 3, 3), (c,), (c,)]
            if block == 0 and cin != c:
                s += [(c, cin, 1, 1), (c,), (c,)]
        cin_prev = c
    return s + [(1000, 512), (1000,)]


def gpt2_124m_shapes():  # bench/model_shapes.h (tied embeddings counted once)
    d = 768
    s = [(50257, d), (1024, d)]
    for _ in range(12):
        s += [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]
    return s + [(d,), (d,)]


def plan_optim():
    out = []
    for name, shapes in (("ResNet-18", resnet18_shapes()), ("GPT-2 124M", gpt2_124m_shapes())):
        numel = sum(math.prod(s) for s in shapes)
        model = f"{name} ({len(shapes)} tensors, {numel} f32)"  # optim.cpp run()
        p = dict(shapes=shapes, numel=numel)
        out.append(("optim", "AdamW step " + model, "adamw", p))
        out.append(("optim", "unscale+inf check " + model, "unscale", p))
        out.append(("optim", "clip_grad_norm " + model, "clip", p))
    return out


def plan_attention():
    out = []
    B, H, D = 8, 12, 64
    for dt in ("float32", "bfloat16"):
        for T in (256, 1024):
            for causal in (True, False):
                rec = f"[{B}, {H}, {T}, {D}] {'causal' if causal else 'non-causal'} {dt}"
                for backward in (False, True):
                    out.append(("attention", rec + (" fwd+bwd" if backward else " forward"), "attention",
                                dict(B=B, H=H, T=T, D=D, dt=dt, causal=causal, backward=backward)))
    return out


# conv.cpp kNets: (name, count, C, H, K, k, stride, pad, input_grad)
CONV_NETS = [
    ("Fashion-MNIST CNN", 256, [
        ("conv1 1->32 3x3 @28", 1, 1, 28, 32, 3, 1, 1, False),
        ("conv2 32->64 3x3 @14", 1, 32, 14, 64, 3, 1, 1, True)]),
    ("ResNet-18 (224x224)", 128, [
        ("stem 3->64 7x7/2 @224", 1, 3, 224, 64, 7, 2, 3, False),
        ("layer1 64->64 3x3 @56", 4, 64, 56, 64, 3, 1, 1, True),
        ("layer2 64->128 3x3/2 @56", 1, 64, 56, 128, 3, 2, 1, True),
        ("layer2 128->128 3x3 @28", 3, 128, 28, 128, 3, 1, 1, True),
        ("layer2 down 64->128 1x1/2 @56", 1, 64, 56, 128, 1, 2, 0, True),
        ("layer3 128->256 3x3/2 @28", 1, 128, 28, 256, 3, 2, 1, True),
        ("layer3 256->256 3x3 @14", 3, 256, 14, 256, 3, 1, 1, True),
        ("layer3 down 128->256 1x1/2 @28", 1, 128, 28, 256, 1, 2, 0, True),
        ("layer4 256->512 3x3/2 @14", 1, 256, 14, 512, 3, 2, 1, True),
        ("layer4 512->512 3x3 @7", 3, 512, 7, 512, 3, 1, 1, True),
        ("layer4 down 256->512 1x1/2 @14", 1, 256, 14, 512, 1, 2, 0, True)]),
]
CONV_FORMATS = [("f32 NCHW", "float32", False), ("f16 NCHW", "float16", False), ("f16 NHWC", "float16", True)]


def conv_flops(N, C, H, K, k, s, p, input_grad):
    OH = (H + 2 * p - k) // s + 1
    fwd = 2.0 * N * K * C * k * k * OH * OH
    return fwd, fwd * (3 if input_grad else 2)


def plan_conv():
    out = []
    for net, N, shapes in CONV_NETS:
        for fmt, dt, cl in CONV_FORMATS:
            for pass_ in ("forward", "fwd+bwd"):
                total_flops = 0.0
                for sname, count, C, H, K, k, s, p, ig in shapes:
                    fwd, fwdbwd = conv_flops(N, C, H, K, k, s, p, ig)
                    flops = fwd if pass_ == "forward" else fwdbwd
                    total_flops += count * flops
                    out.append(("conv", f"{net}, batch {N}, {sname}, {fmt}, {pass_}", "conv",
                                dict(N=N, C=C, H=H, K=K, k=k, s=s, p=p, input_grad=ig, dt=dt, cl=cl,
                                     backward=pass_ == "fwd+bwd", flops=flops)))
                members = [(f"{net}, batch {N}, {sn}, {fmt}, {pass_}", cnt) for sn, cnt, *_ in shapes]
                out.append(("conv", f"{net}, batch {N}, whole network, {fmt}, {pass_}", "conv_total",
                            dict(members=members, flops=total_flops)))
    return out


def plan_fused():
    out = []
    n = 64 << 20
    for dt in ("float32", "float16"):  # bench_gelu
        out.append(("fused", f"gelu {dt} [{n}] forward", "gelu", dict(dt=dt, n=n)))
    for dt in ("float32", "bfloat16"):  # bench_bias_ops(dt, 16384, 4096)
        sfx = f" [16384, 4096] {dt}"
        p = dict(dt=dt, rows=16384, cols=4096)
        out.append(("fused", "bias+gelu forward" + sfx, "bias_gelu", dict(p, backward=False)))
        out.append(("fused", "bias+dropout+add forward" + sfx, "bias_dropout_add", dict(p, backward=False)))
        out.append(("fused", "bias+gelu forward+backward" + sfx, "bias_gelu", dict(p, backward=True)))
        out.append(("fused", "bias+dropout+add forward+backward" + sfx, "bias_dropout_add", dict(p, backward=True)))
    return out


ELEMENTWISE = [  # elementwise.cpp cases: name, op, bytes in units of elements x (f32: 4, 16-bit: 2)
    ("add f32", "add", 12), ("mul f32", "mul", 12), ("mul f32 by a scalar", "mul_scalar", 8),
    ("exp f32", "exp", 8), ("gelu f32", "gelu", 8), ("gelu bf16", "gelu_bf16", 4), ("add bf16", "add_bf16", 6),
    ("cast f32 -> bf16", "to_bf16", 6), ("cast bf16 -> f32", "bf16_to_f32", 6),
    ("cast f32 -> f16", "to_f16", 6), ("cast f16 -> f32", "f16_to_f32", 6),
    ("add f32, broadcast row", "add_row", 8), ("add f32, transposed operand", "add_t", 12),
    ("copy f32 of a transpose (contiguous())", "t_contiguous", 8),
    ("mul f32, every other column", "mul_strided", 4),
]


def plan_elementwise():
    return [("elementwise", f"{name} [8192, 8192]", "elementwise", dict(op=op, bytes_per=b))
            for name, op, b in ELEMENTWISE]


def plan_reduce():
    out = []
    for R, C in ((8192, 8192), (65536, 1024), (1024, 65536), (4194304, 16)):
        for name, op in (("sum all", "sum"), ("sum over rows (dim -1)", "sum_rows"),
                         ("sum over columns (dim 0)", "sum_cols")):
            out.append(("reduce", f"{name} [{R}, {C}] float32", "reduce", dict(R=R, C=C, dt="float32", op=op)))
    for name, op, dt in (("amax over rows", "amax_rows", "float32"), ("mean over rows", "mean_rows", "float32"),
                         ("sum all", "sum", "bfloat16"), ("sum over columns (dim 0)", "sum_cols", "bfloat16")):
        out.append(("reduce", f"{name} [8192, 8192] {dt}", "reduce", dict(R=8192, C=8192, dt=dt, op=op)))
    return out


def plan_transfer():
    out = []
    for mib in (1, 4, 16, 64, 256):
        out.append(("transfer", f"host->device pinned {mib} MiB", "h2d", dict(mib=mib, pinned=True)))
        out.append(("transfer", f"host->device pageable {mib} MiB", "h2d", dict(mib=mib, pinned=False)))
    return out


# The order cases run in: what the comparison needs most first, so a tight time budget loses the
# extras. The allocator bench has no PyTorch counterpart here (Python's overhead would dominate).
SECTIONS = [
    ("copy", plan_copy), ("matmul", plan_matmul), ("softmax_xent", plan_softmax_xent), ("norm", plan_norm),
    ("optim", plan_optim), ("attention", plan_attention), ("conv", plan_conv), ("fused", plan_fused),
    ("elementwise", plan_elementwise), ("reduce", plan_reduce), ("transfer", plan_transfer),
]


def plan(only=None):
    cases = []
    for name, fn in SECTIONS:
        if only is None or name in only:
            cases += fn()
    return cases


# ------------------------------------------------------------------------------------ timing
REPS = 15


def time_ms(fn, reps=None, warmup=3, max_inner=10):
    """Median milliseconds per call: CUDA events around `inner` back-to-back calls on the current
    stream (inner chosen so one repetition lasts about a millisecond or more)."""
    reps = reps or REPS
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    a = torch.cuda.Event(enable_timing=True)
    b = torch.cuda.Event(enable_timing=True)
    a.record()
    fn()
    b.record()
    b.synchronize()
    one = max(a.elapsed_time(b), 1e-3)
    inner = max(1, min(max_inner, int(1.0 / one)))
    reps = max(5, min(reps, int(3000.0 / (one * inner))))  # at most ~3 s per case
    times = []
    for _ in range(reps):
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / inner)
    return statistics.median(times)


def dev():
    return torch.device("cuda")


def dtype(name):
    return getattr(torch, name)


def randn(*sizes, dt="float32", scale=1.0):
    x = torch.randn(*sizes, device=dev())
    if scale != 1.0:
        x = x * scale
    return x.to(dtype(dt))


# ------------------------------------------------------------------------------------ runners
# Each returns [(impl, ms, {"bytes": ...} or {"flops": ...})].

def run_copy(p):
    n = (p["mib"] << 20) // 4
    src = randn(n)
    dst = torch.empty_like(src)
    return [("pytorch", time_ms(lambda: dst.copy_(src)), {"bytes": 2.0 * (p["mib"] << 20)})]


def run_gemm(p):
    M, K, N, dt = p["M"], p["K"], p["N"], p["dt"]
    a = randn(M, K, dt=dt)
    b = randn(K, N, dt=dt, scale=1.0 / math.sqrt(K))
    c = torch.empty(M, N, device=dev(), dtype=dtype(dt))
    return [("pytorch", time_ms(lambda: torch.mm(a, b, out=c)), {"flops": 2.0 * M * N * K})]


def run_linear_gelu(p):
    M, K, N, dt = p["M"], p["K"], p["N"], p["dt"]
    x = randn(M, K, dt=dt)
    w = randn(N, K, dt=dt, scale=1.0 / math.sqrt(K))
    b = randn(N, dt=dt)
    with torch.no_grad():
        ms = time_ms(lambda: F.gelu(F.linear(x, w, b), approximate="tanh"))
    return [("pytorch", ms, {"flops": 2.0 * M * N * K})]


def run_dgelu_bgrad(p):
    M, K, N, dt = p["M"], p["K"], p["N"], p["dt"]
    g2 = randn(M, K, dt=dt)
    w2 = randn(K, N, dt=dt, scale=1.0 / math.sqrt(K))
    pre = randn(M, N, dt=dt)

    def fn():
        dh = torch.mm(g2, w2)
        dpre = torch.ops.aten.gelu_backward(dh, pre, approximate="tanh")
        return dpre, dpre.sum(0)

    return [("pytorch", time_ms(fn), {"flops": 2.0 * M * N * K})]


def run_softmax_fwd(p):
    x = randn(p["R"], 50257, dt=p["dt"], scale=3.0)
    return [("pytorch", time_ms(lambda: torch.softmax(x, -1)), {"bytes": 2.0 * x.nbytes})]


def run_softmax_bwd(p):
    x = randn(p["R"], 50257, dt=p["dt"], scale=3.0)
    g = randn(p["R"], 50257, dt=p["dt"])
    y = torch.softmax(x, -1)
    ms = time_ms(lambda: torch._softmax_backward_data(g, y, -1, x.dtype))
    return [("pytorch", ms, {"bytes": 3.0 * x.nbytes})]


def run_xent(p):
    x = randn(p["R"], 50257, dt=p["dt"], scale=3.0)
    t = torch.randint(0, 50257, (p["R"],), device=dev())
    if p["backward"]:
        def fn():
            xx = x.detach().requires_grad_(True)
            F.cross_entropy(xx, t).backward()
            return xx.grad
        ms = time_ms(fn)
    else:
        with torch.no_grad():
            ms = time_ms(lambda: F.cross_entropy(x, t))
    return [("pytorch", ms, {"bytes": (3.0 if p["backward"] else 1.0) * x.nbytes})]


def run_norm(p, kind):
    sizes, dt = p["sizes"], p["dt"]
    x = randn(*sizes, dt=dt, scale=2.0) + 0.5
    g = randn(*sizes, dt=dt)
    w = randn(sizes[1] if kind == "batch_norm" else sizes[-1], dt=dt)
    b = randn(w.shape[0], dt=dt)
    if p["cl"]:
        x = x.contiguous(memory_format=torch.channels_last)
        g = g.contiguous(memory_format=torch.channels_last)
    eps = 1e-5
    if kind == "batch_norm":
        def f(xx, ww, bb):
            return F.batch_norm(xx, None, None, ww, bb, training=True, momentum=0.1, eps=eps)
    else:
        def f(xx, ww, bb):
            return F.layer_norm(xx, (sizes[-1],), ww, bb, eps)
    nbytes = float(x.nbytes)
    if not p["backward"]:
        with torch.no_grad():
            return [("pytorch", time_ms(lambda: f(x, w, b)), {"bytes": 2.0 * nbytes})]
    xl, wl, bl = (t.detach().requires_grad_(True) for t in (x, w, b))

    def step():
        xl.grad = wl.grad = bl.grad = None
        f(xl, wl, bl).backward(g)

    return [("pytorch", time_ms(step), {"bytes": 5.0 * nbytes})]


def make_params(shapes):
    params, grads = [], []
    for s in shapes:
        params.append(randn(*s, scale=0.02))
        grads.append(randn(*s, scale=0.01))
    return params, grads


def run_adamw(p):
    rows = []
    for impl, kw in (("pytorch", dict(fused=True)), ("pytorch foreach", dict(foreach=True))):
        params, grads = make_params(p["shapes"])
        ps = [torch.nn.Parameter(t) for t in params]
        for q, g in zip(ps, grads):
            q.grad = g
        opt = torch.optim.AdamW(ps, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1, **kw)
        rows.append((impl, time_ms(opt.step), {"bytes": 28.0 * p["numel"]}))
        del opt, ps, params, grads
        torch.cuda.empty_cache()
    return rows


def run_unscale(p):
    _, grads = make_params(p["shapes"])
    found = torch.zeros(1, device=dev())
    inv = torch.ones(1, device=dev())  # 1: repeated calls keep the values, as in kiln's bench
    ms = time_ms(lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv))
    return [("pytorch", ms, {"bytes": 8.0 * p["numel"]})]


def run_clip(p):
    params, grads = make_params(p["shapes"])
    ps = [torch.nn.Parameter(t) for t in params]
    for q, g in zip(ps, grads):
        q.grad = g
    ms = time_ms(lambda: torch.nn.utils.clip_grad_norm_(ps, 1e9, foreach=True))
    return [("pytorch", ms, {"bytes": 12.0 * p["numel"]})]


def sdpa_backend(fn):
    """Which of PyTorch's SDPA backends ran fn, read from the names of the GPU kernels it launched
    (the two longest-running): cudnn, flash, efficient or math, and the names themselves."""
    try:
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        timed = [(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0), e.key)
                 for e in prof.key_averages() if not e.key.startswith(("aten::", "cuda", "Memcpy", "Memset"))]
        names = [n for _, n in sorted(timed, reverse=True)[:2]]
    except Exception as e:  # the profiler's API moves between versions: say so, keep the timing
        return {"sdpa_backend": f"unknown ({type(e).__name__})"}
    text = " ".join(names).lower()
    backend = ("cudnn" if "cudnn" in text else "flash" if "flash" in text else
               "efficient" if ("fmha" in text or "efficient" in text or "mem_eff" in text) else "math")
    return {"sdpa_backend": backend, "sdpa_kernels": [n[:120] for n in names]}


def run_attention(p):
    B, H, T, D, dt, causal = p["B"], p["H"], p["T"], p["D"], p["dt"], p["causal"]
    q, k, v, g = (randn(B, H, T, D, dt=dt) for _ in range(4))
    flops = 4.0 * B * H * T * T * D * (0.5 if causal else 1.0)
    if not p["backward"]:
        def fwd():
            with torch.no_grad():
                F.scaled_dot_product_attention(q, k, v, is_causal=causal)

        return [("pytorch", time_ms(fwd), {"flops": flops, **sdpa_backend(fwd)})]

    def fn():
        qq, kk, vv = (t.detach().requires_grad_(True) for t in (q, k, v))
        F.scaled_dot_product_attention(qq, kk, vv, is_causal=causal).backward(g)

    return [("pytorch", time_ms(fn, reps=10), {"flops": 3.5 * flops, **sdpa_backend(fn)})]


CONV_MS = {}  # case name -> ms, for the whole-network totals


def run_conv(p, case_name):
    N, C, H, K, k, s, pad, dt = p["N"], p["C"], p["H"], p["K"], p["k"], p["s"], p["p"], p["dt"]
    OH = (H + 2 * pad - k) // s + 1
    x = randn(N, C, H, H, dt=dt)
    w = randn(K, C, k, k, dt=dt, scale=1.0 / math.sqrt(C * k * k))
    gy = randn(N, K, OH, OH, dt=dt)
    if p["cl"]:  # the model converted with .to(memory_format=torch.channels_last), weights included
        x, w, gy = (t.contiguous(memory_format=torch.channels_last) for t in (x, w, gy))
    mask = [p["input_grad"], True, False]

    def fwd():
        return F.conv2d(x, w, None, s, pad)

    def fwdbwd():
        fwd()
        return torch.ops.aten.convolution_backward(gy, x, w, None, [s, s], [pad, pad], [1, 1], False, [0, 0], 1,
                                                   mask)

    with torch.no_grad():
        ms = time_ms(fwdbwd if p["backward"] else fwd, reps=10, warmup=2)
    CONV_MS[case_name] = ms
    return [("pytorch", ms, {"flops": p["flops"]})]


def run_conv_total(p):
    if not all(m in CONV_MS for m, _ in p["members"]):
        return []
    return [("pytorch", sum(cnt * CONV_MS[m] for m, cnt in p["members"]), {"flops": p["flops"]})]


def run_gelu(p):
    x = randn(p["n"], dt=p["dt"], scale=2.0)
    with torch.no_grad():
        ms = time_ms(lambda: F.gelu(x))
    return [("pytorch", ms, {"bytes": 2.0 * x.nbytes})]


def run_bias_op(p, kind):
    rows, cols, dt = p["rows"], p["cols"], p["dt"]
    x, r, g = (randn(rows, cols, dt=dt) for _ in range(3))
    b = randn(cols, dt=dt)
    nb = float(x.nbytes)
    if kind == "bias_gelu":
        def f(xx, bb):
            return F.gelu(xx + bb)
        fwd_bytes = 2 * nb
    else:
        def f(xx, bb):
            return r + F.dropout(xx + bb, 0.1, True)
        fwd_bytes = 3 * nb
    if not p["backward"]:
        with torch.no_grad():
            return [("pytorch", time_ms(lambda: f(x, b)), {"bytes": fwd_bytes})]
    xl, bl = x.detach().requires_grad_(True), b.detach().requires_grad_(True)

    def step():
        xl.grad = bl.grad = None
        f(xl, bl).backward(g)

    return [("pytorch", time_ms(step), {"bytes": 5 * nb})]


def run_elementwise(p):
    R = C = 8192
    a, b = randn(R, C), randn(R, C)
    row = randn(C)
    a16, abf, bbf = a.half(), a.bfloat16(), b.bfloat16()
    ops = {
        "add": lambda: a + b, "mul": lambda: a * b, "mul_scalar": lambda: a * 1.5, "exp": lambda: a.exp(),
        "gelu": lambda: F.gelu(a), "gelu_bf16": lambda: F.gelu(abf), "add_bf16": lambda: abf + bbf,
        "to_bf16": lambda: a.to(torch.bfloat16), "bf16_to_f32": lambda: abf.to(torch.float32),
        "to_f16": lambda: a.to(torch.float16), "f16_to_f32": lambda: a16.to(torch.float32),
        "add_row": lambda: a + row, "add_t": lambda: a + b.t(), "t_contiguous": lambda: a.t().contiguous(),
        "mul_strided": lambda: a[:, ::2] * 2.0,
    }
    with torch.no_grad():
        ms = time_ms(ops[p["op"]])
    return [("pytorch", ms, {"bytes": float(p["bytes_per"]) * R * C})]


def run_reduce(p):
    x = randn(p["R"], p["C"], dt=p["dt"])
    ops = {"sum": lambda: x.sum(), "sum_rows": lambda: x.sum(-1), "sum_cols": lambda: x.sum(0),
           "amax_rows": lambda: x.amax(-1), "mean_rows": lambda: x.mean(-1)}
    with torch.no_grad():
        ms = time_ms(ops[p["op"]])
    return [("pytorch", ms, {"bytes": float(x.nbytes)})]


def run_h2d(p):
    nbytes = p["mib"] << 20
    host = torch.randn(nbytes // 4)
    if p["pinned"]:
        host = host.pin_memory()
    reps = 5 if p["mib"] >= 64 else 10
    ms = time_ms(lambda: host.to(dev(), non_blocking=True), reps=reps, max_inner=5)
    return [("pytorch", ms, {"bytes": float(nbytes)})]


def run_case(kind, p, case_name):
    if kind in ("batch_norm", "layer_norm"):
        return run_norm(p, kind)
    if kind in ("bias_gelu", "bias_dropout_add"):
        return run_bias_op(p, kind)
    if kind == "conv":
        return run_conv(p, case_name)
    return globals()["run_" + kind](p)


# ------------------------------------------------------------------------------------ main

def main(argv=None):
    global torch, F, REPS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="JSON-lines file to write (default: stdout)")
    ap.add_argument("--list", action="store_true", help="print the planned cases and exit (no torch needed)")
    ap.add_argument("--only", help="comma-separated benches to run (" + ", ".join(n for n, _ in SECTIONS) + ")")
    ap.add_argument("--seconds", type=float, default=125.0,
                    help="start no case after this many seconds (default 125: the suite allows 150)")
    ap.add_argument("--reps", type=int, default=REPS, help="timed repetitions per case (median)")
    args = ap.parse_args(argv)
    only = None
    if args.only:
        only = {s.strip() for s in args.only.split(",") if s.strip()}
        unknown = only - {n for n, _ in SECTIONS}
        if unknown:
            ap.error("unknown bench(es): " + ", ".join(sorted(unknown)))
    cases = plan(only)

    if args.list:
        for bench, name, _, _ in cases:
            print(f"{bench:<13} {name}")
        print(f"{len(cases)} cases; impl \"pytorch\" (and \"pytorch foreach\" for the AdamW steps)")
        return 0

    t0 = time.monotonic()
    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError as e:
        print(f"pytorch_peer: cannot import torch ({e})", file=sys.stderr)
        return 2
    torch, F = _torch, _F
    REPS = max(3, args.reps)
    if not torch.cuda.is_available():
        print(f"pytorch_peer: no CUDA device (torch {torch.__version__}), skipping")
        return 77
    torch.manual_seed(0)
    gpu = torch.cuda.get_device_name(0)
    meta = {"torch": torch.__version__, "gpu": gpu}
    out = open(args.out, "w") if args.out else sys.stdout
    header = dict(bench="_meta", impl="pytorch", cuda=torch.version.cuda,
                  cudnn=torch.backends.cudnn.version(), **meta)
    out.write(json.dumps(header) + "\n")
    out.flush()
    print(f"pytorch_peer: torch {torch.__version__}, {gpu}, {len(cases)} cases", file=sys.stderr)

    # kiln's settings: TF32 only in the matmul bench (set_allow_tf32(true) there), f32 convolutions
    # without TF32, cuDNN autotuned (compared with kiln's autotuned configuration)
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.deterministic = False
    failed, skipped = [], []
    for bench, name, kind, p in cases:
        if time.monotonic() - t0 > args.seconds:
            skipped.append(f"{bench}: {name}")
            continue
        torch.backends.cuda.matmul.allow_tf32 = bench == "matmul"
        try:
            rows = run_case(kind, p, name)
        except Exception as e:  # one case failing (memory, an op missing in this version) keeps the others
            failed.append(f"{bench}: {name}: {type(e).__name__}: {e}")
            print(f"FAILED {bench}: {name}: {type(e).__name__}: {e}", file=sys.stderr)
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            continue
        for impl, ms, work in rows:
            row = {"bench": bench, "case": name, "impl": impl, "ms": round(ms, 6), **work, **meta}
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(f"{bench:<13} {name:<66} {impl:<16} {ms:9.3f} ms", file=sys.stderr)
        if bench in ("optim", "conv", "attention"):
            torch.cuda.empty_cache()
    if out is not sys.stdout:
        out.close()
    if skipped:
        print(f"pytorch_peer: time budget ({args.seconds:.0f} s) used up; {len(skipped)} case(s) not run:",
              file=sys.stderr)
        for s in skipped:
            print("  " + s, file=sys.stderr)
    print(f"pytorch_peer: {len(cases) - len(skipped) - len(failed)} cases in {time.monotonic() - t0:.0f} s, "
          f"{len(failed)} failed, {len(skipped)} skipped", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
