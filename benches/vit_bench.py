#!/usr/bin/env python3
"""ViT-B/32 inference throughput on the CPU: PyTorch vs curate (both use every core).

`--model unicom` (CUSA's image teacher, the default): PyTorch runs `UnicomViT` from
`tests/fixtures/models/make_vit_fixtures.py` (Unicom's ViT as spec `cusa-and-pcmepp.md` §1.1
describes it: the module curate's ViT is checked against) at ViT-B/32 sizes; `--model clip`:
open_clip's `ViT-B-32-quickgelu` image tower (OpenAI CLIP's). Both random init, eval mode,
`torch.no_grad()`, float32, `torch.set_num_threads(os.cpu_count())`. curate:
`examples/vit_bench.rs` (the same network, random weights in the checkpoint layout, burn's CPU
backend). Same batch and iteration counts, 224-px images; each side warms up first. The two
sides run in alternation, `--repeat` times each (this machine's speed drifts within minutes);
prints every run's images/s and the ratio of the best runs.

    python3 benches/vit_bench.py                        # Unicom, batch 32, 5 timed iterations
    python3 benches/vit_bench.py --model clip
    python3 benches/vit_bench.py --batch 4 --iters 2 --repeat 1   # smoke run

Builds the example with `cargo build --release --example vit_bench` first.
"""
import argparse
import importlib.util
import os

import torch

from example_rates import ROOT, alternate, build_example, example_rate, runs, torch_rate


def torch_model(name):
    if name == "clip":
        import open_clip
        return open_clip.create_model("ViT-B-32-quickgelu", pretrained=None).visual
    path = os.path.join(ROOT, "tests", "fixtures", "models", "make_vit_fixtures.py")
    spec = importlib.util.spec_from_file_location("make_vit_fixtures", path)
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    return fixtures.UnicomViT(image_size=224, patch_size=32, width=768, layers=12, heads=12, output_dim=512)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=["unicom", "clip"], default="unicom")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3, help="runs of each side, in alternation")
    a = p.parse_args()
    build_example("vit_bench")
    torch.set_num_threads(os.cpu_count())
    torch.manual_seed(0)
    model = torch_model(a.model).eval()
    x = torch.randn(a.batch, 3, 224, 224)
    args = ["--model", a.model, "--batch", str(a.batch), "--iters", str(a.iters), "--warmup", str(a.warmup)]
    pts, cus = alternate(lambda: torch_rate(model, x, a.iters, a.warmup), lambda: example_rate("vit_bench", args),
                         a.repeat)
    print(f"PyTorch {torch.__version__} ({a.model}): best {max(pts):.1f} images/s ({torch.get_num_threads()} threads;"
          f" runs {runs(pts)})")
    print(f"curate ({a.model}): best {max(cus):.1f} images/s (runs {runs(cus)})")
    print(f"ratio curate / PyTorch, best of {a.repeat} each: {max(cus) / max(pts):.2f}x  (batch {a.batch}, 224x224,"
          f" {os.cpu_count()} cores)")


if __name__ == "__main__":
    main()
