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

import torch
import torchvision

from example_rates import alternate, build_example, example_rate, runs, torch_rate


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--side", type=int, default=224)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="runs of each side, in alternation")
    a = p.parse_args()
    build_example("resnet_bench")
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = torchvision.models.resnet50(weights=None)
    model.fc = torch.nn.Identity()
    model.eval()
    x = torch.randn(a.batch, 3, a.side, a.side)
    args = ["--batch", str(a.batch), "--side", str(a.side), "--iters", str(a.iters), "--warmup", str(a.warmup)]
    tvs, cus = alternate(lambda: torch_rate(model, x, a.iters, a.warmup), lambda: example_rate("resnet_bench", args),
                         a.repeat)
    print(f"torchvision {torchvision.__version__} / torch {torch.__version__}: best {max(tvs):.1f} images/s "
          f"({torch.get_num_threads()} threads; runs {runs(tvs)})")
    print(f"curate: best {max(cus):.1f} images/s (runs {runs(cus)})")
    print(f"ratio curate / torchvision, best of {a.repeat} each: {max(cus) / max(tvs):.2f}x  (batch {a.batch},"
          f" {a.side}x{a.side}, {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
