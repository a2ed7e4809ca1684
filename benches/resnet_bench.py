#!/usr/bin/env python3
"""ResNet-50 inference throughput: torchvision vs curate, on the CPU (both use every core).

torchvision: `resnet50(weights=None)` (random init), `fc` replaced by the identity (curate's
feature extractor stops at the pooled 2048-d features), eval mode, `torch.no_grad()`, float32,
`torch.set_num_threads(os.cpu_count())`. curate: `examples/resnet_bench.rs` (the same network,
random weights, burn's CPU backend with its rayon thread pool). Same batch, input side and
iteration counts; each side warms up first. Prints images/s for both and curate / torchvision.

    python3 benches/resnet_bench.py                       # batch 32, 224x224, 5 timed iterations
    python3 benches/resnet_bench.py --batch 4 --iters 2   # smoke run

Builds the example with `cargo build --release --example resnet_bench` first.
"""
import argparse
import os
import subprocess
import sys
import time

import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchvision_rate(batch, side, iters, warmup):
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    model.fc = torch.nn.Identity()
    model.eval()
    x = torch.randn(batch, 3, side, side)
    with torch.no_grad():
        for _ in range(warmup):
            model(x)
        t = time.perf_counter()
        for _ in range(iters):
            model(x)
        secs = time.perf_counter() - t
    return batch * iters / secs


def curate_rate(batch, side, iters, warmup):
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "resnet_bench"], cwd=ROOT, check=True)
    exe = os.path.join(ROOT, "target", "release", "examples", "resnet_bench")
    out = subprocess.run([exe, "--batch", str(batch), "--side", str(side), "--iters", str(iters),
                          "--warmup", str(warmup)], cwd=ROOT, check=True, capture_output=True, text=True)
    sys.stderr.write(out.stderr)
    last = out.stdout.strip().splitlines()[-1].split()
    assert last[0] == "images_per_s", out.stdout
    return float(last[1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--side", type=int, default=224)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    a = p.parse_args()
    tv = torchvision_rate(a.batch, a.side, a.iters, a.warmup)
    print(f"torchvision {torchvision.__version__} / torch {torch.__version__}: {tv:.1f} images/s "
          f"({torch.get_num_threads()} threads)")
    cu = curate_rate(a.batch, a.side, a.iters, a.warmup)
    print(f"curate: {cu:.1f} images/s")
    print(f"ratio curate / torchvision: {cu / tv:.2f}x  (batch {a.batch}, {a.side}x{a.side}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
