#!/usr/bin/env python3
"""Two curate builds on the paper preset, step by step: each step's loss and samples/s of `curate
train --device cuda` for build A and build B, on the same generated config, data and seed as
`benches/train_gpu_bench.py` (ResNet-50 + DistilBERT-base, batch 128, SGD).

Two runs of one build agree to the last digit, so where A and B differ in arithmetic only (for
example burn's `fusion`, which merges element-wise kernels), the first step's loss shows how far
their arithmetic differs, and later steps how training amplifies it. Prints one JSON line per
(loss, build): the median samples/s over the steps after `--skip` and every step's loss.

    python3 benches/train_gpu_ab.py --a curate_plain --b curate_fusion --tokenizer tokenizer.json
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train_gpu_bench  # noqa: E402


def run(curate, config, out_dir, steps, timeout, workers):
    cmd = [curate, "train", config, "--device", "cuda", "--progress", "never", "--workers", str(workers),
           "--set", "log_every=1", "--set", f"steps={steps}", "--set", f"output_dir={out_dir}"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            print(f"{curate} failed ({done.returncode}):\n{done.stderr[-2000:]}", flush=True)
    except subprocess.TimeoutExpired:
        print(f"{curate} stopped after {timeout} s; the steps logged so far:", flush=True)
    path = os.path.join(out_dir, "metrics.jsonl")
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    return {r["step"]: (r["loss"], r.get("samples_per_s")) for r in rows if "loss" in r}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="curate binary A")
    ap.add_argument("--b", required=True, help="curate binary B")
    ap.add_argument("--tokenizer", required=True, help="a BERT uncased tokenizer.json (30,522 words)")
    ap.add_argument("--losses", default="infonce,memory_bank")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--skip", type=int, default=5, help="steps left out of the median (kernel compilation)")
    ap.add_argument("--workers", type=int, default=6)
    ap.add_argument("--timeout", type=int, default=150, help="seconds per run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="train_gpu_ab_") as tmp:
        for loss in [l for l in args.losses.split(",") if l]:
            config = train_gpu_bench.write_config(tmp, args.batch, args.steps, loss, args.tokenizer)
            for name, curate in (("A", args.a), ("B", args.b)):
                steps = run(curate, config, os.path.join(tmp, f"{name}_{loss}"), args.steps, args.timeout,
                            args.workers)
                rates = [rate for step, (_, rate) in sorted(steps.items()) if step > args.skip and rate]
                print(json.dumps({"loss": loss, "build": f"{name}: {curate}",
                                  "median_samples_per_s": statistics.median(rates) if rates else None,
                                  "losses": [[step, value] for step, (value, _) in sorted(steps.items())]}),
                      flush=True)


if __name__ == "__main__":
    main()
