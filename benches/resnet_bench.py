#!/usr/bin/env python3
"""ResNet-50 inference throughput: torchvision vs curate, on the CPU (both use every core).

torchvision: `resnet50(weights=None)` (random init), `fc` replaced by the identity (curate's
feature extractor stops at the pooled 2048-d features), eval mode, `torch.no_grad()`, float32,
`torch.set_num_threads(os.cpu_count())`. curate: `examples/resnet_bench.rs` (the same network,
random weights, burn's CPU backend with its rayon thread pool). Same batch, input side and
iteration counts; each side warms up first. The two sides run in alternation, `--repeat` times
each (this machine's speed drifts within minutes); prints every run's images/s and the ratio of
the best runs.

    python3 benches/resnet_bench.py                       # batch 32, 224x224, 5 timed iterations
    python3 benches/resnet_bench.py --batch 4 --iters 2 --repeat 1   # smoke run

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


def torchvision_runner(batch, side, iters, warmup):
    """A function that times the torchvision model (built once) and returns images/s."""
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    model.fc = torch.nn.Identity()
    model.eval()
    x = torch.randn(batch, 3, side, side)

    def rate():
        with torch.no_grad():
            for _ in range(warmup):
                model(x)
            t = time.perf_counter()
            for _ in range(iters):
                model(x)
            secs = time.perf_counter() - t
        return batch * iters / secs

    return rate


def curate_rate(batch, side, iters, warmup):
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
    p.add_argument("--repeat", type=int, default=3, help="runs of each side, in alternation")
    a = p.parse_args()
    subprocess.run(["cargo", "build", "--release", "--quiet", "--example", "resnet_bench"], cwd=ROOT, check=True)
    torchvision_rate = torchvision_runner(a.batch, a.side, a.iters, a.warmup)
    tvs, cus = [], []
    for _ in range(a.repeat):
        tvs.append(torchvision_rate())
        cus.append(curate_rate(a.batch, a.side, a.iters, a.warmup))
    runs = lambda rates: ", ".join(f"{r:.1f}" for r in rates)
    print(f"torchvision {torchvision.__version__} / torch {torch.__version__}: best {max(tvs):.1f} images/s "
          f"({torch.get_num_threads()} threads; runs {runs(tvs)})")
    print(f"curate: best {max(cus):.1f} images/s (runs {runs(cus)})")
    print(f"ratio curate / torchvision, best of {a.repeat} each: {max(cus) / max(tvs):.2f}x  (batch {a.batch},"
          f" {a.side}x{a.side}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
