#!/usr/bin/env python3
"""Fails when a file under kiln/ includes a header from a layer above its own, or when a kernel
touches the autograd engine. The layers are those of docs/architecture.md ("Layers"); keep the
table below and that page equal.

Usage: scripts/check-layers.py [REPO_ROOT]   (exit 0: clean, 1: violations listed)
       scripts/check-layers.py --self-test    (the check finds planted violations)
"""
import pathlib
import re
import sys

# folder -> the folders its files may include (itself included). A layer may use any layer below
# it; nothing reaches up.
ALLOWED = {
    "core": {"core", "cuda"},
    "cuda": {"core", "cuda"},  # the CUDA runtime: core's room for the device, the same layer
    "utils": {"core", "cuda", "utils"},
    "kernels": {"core", "cuda", "kernels"},
    "ops": {"core", "cuda", "kernels", "ops"},
    "nn": {"core", "cuda", "utils", "kernels", "ops", "nn"},
    "data": {"core", "cuda", "utils", "kernels", "ops", "data"},
    "optim": {"core", "cuda", "utils", "kernels", "ops", "nn", "optim"},
    "distributed": {"core", "cuda", "utils", "kernels", "ops", "nn", "optim", "data", "distributed"},
}
# Headers any layer may include: the generated build configuration.
ANYWHERE = {"kiln/config.h"}
# Kernels compute; they never record or consult autograd (docs/architecture.md, "Kernels and
# dispatch").
KERNEL_FORBIDDEN = [
    (re.compile(r'#include\s+[<"]kiln/core/autograd\.h[>"]'), "includes the autograd engine"),
    (re.compile(r"\bNoGradGuard\b"), "needs a NoGradGuard (it calls differentiable ops)"),
    (re.compile(r"\brecord_function\b"), "records autograd nodes"),
    (re.compile(r"\.(add_|sub_|mul_|div_|copy_|fill_|zero_|clone|contiguous)\("),
     "calls a differentiable Tensor method (use the kernels of kernels/copy_fill.h, pointwise.h)"),
]
INCLUDE = re.compile(r'^\s*#\s*include\s+[<"](kiln/[^>"]+)[>"]', re.M)


def check(root: pathlib.Path) -> list:
    problems = []
    kiln = root / "kiln"
    for path in sorted(kiln.rglob("*")):
        if path.suffix not in {".h", ".cpp", ".cu", ".cuh"}:
            continue
        rel = path.relative_to(root)
        layer = rel.parts[1] if len(rel.parts) > 2 else None  # kiln/kiln.h: the umbrella
        text = path.read_text(encoding="utf-8", errors="replace")
        if layer is None:
            continue
        if layer not in ALLOWED:
            problems.append(f"{rel}: folder kiln/{layer} is not a known layer (add it to {__file__})")
            continue
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            if inc in ANYWHERE:
                continue
            parts = inc.split("/")
            target = parts[1] if len(parts) > 2 else "kiln.h"
            if target not in ALLOWED[layer]:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{rel}:{line}: kiln/{layer} includes {inc} (layer '{target}' is "
                                f"not below '{layer}')")
        if layer == "kernels":
            for pattern, what in KERNEL_FORBIDDEN:
                for m in pattern.finditer(text):
                    line = text.count("\n", 0, m.start()) + 1
                    problems.append(f"{rel}:{line}: a kernel {what}")
    return problems


def self_test() -> int:
    """Plants one violation of each kind in a scratch tree and requires the check to name each."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        root = pathlib.Path(tmp)
        files = {
            "kiln/core/upward.h": '#include "kiln/nn/module.h"\n',
            "kiln/kernels/records.cpp": '#include "kiln/core/autograd.h"\nNoGradGuard ng;\nx.add_(y);\n',
            "kiln/ops/fine.cpp": '#include "kiln/kernels/matmul.h"\n#include "kiln/config.h"\n',
        }
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        found = check(root)
    expected = ["kiln/core/upward.h:1: kiln/core includes kiln/nn/module.h",
                "kiln/kernels/records.cpp:1: a kernel includes the autograd engine",
                "kiln/kernels/records.cpp:2: a kernel needs a NoGradGuard",
                "kiln/kernels/records.cpp:3: a kernel calls a differentiable Tensor method"]
    missing = [e for e in expected if not any(f.startswith(e) for f in found)]
    if missing or len(found) != len(expected):
        print("check-layers self-test failed; found:", *found, "missing:", *missing, sep="\n  ")
        return 1
    print("check-layers self-test: all planted violations found, nothing else")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    problems = check(root.resolve())
    for p in problems:
        print(p)
    if problems:
        print(f"check-layers: {len(problems)} violation(s)")
        return 1
    print("check-layers: every include points down a layer")
    return 0


if __name__ == "__main__":
    sys.exit(main())
