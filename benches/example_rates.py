"""What the image-encoder benches (`resnet_bench.py`, `vit_bench.py`) share: PyTorch's and the
curate example's images/s, taken in alternation (this machine's speed drifts within minutes)."""
import os
import subprocess
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def build_example(name):
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", name], cwd=ROOT, check=True)


def torch_rate(model, x, iters, warmup):
    """Images/s of `model` (eval mode) on the batch `x`, under `torch.no_grad()`."""
    with torch.no_grad():
        for _ in range(warmup):
            model(x)
        t = time.perf_counter()
        for _ in range(iters):
            model(x)
        secs = time.perf_counter() - t
    return x.shape[0] * iters / secs


def example_rate(name, args):
    """Images/s that `target/release/examples/NAME ARGS` prints on its last line."""
    exe = os.path.join(ROOT, "target", "release", "examples", name)
    out = subprocess.run([exe, *args], cwd=ROOT, check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "images_per_s", out.stdout
    return float(last[1])


def alternate(first, second, repeat):
    """`repeat` rates of each side, the two sides in turn."""
    a, b = [], []
    for _ in range(repeat):
        a.append(first())
        b.append(second())
    return a, b


def runs(rates):
    return ", ".join(f"{r:.1f}" for r in rates)
