#!/usr/bin/env python3
"""all-MiniLM-L6-v2 sentence embeddings per second: curate (burn, CPU) against
sentence-transformers (PyTorch) on the same machine, the same captions and batch size, in one
run. Prints both figures and the ratio (issue 3's target: curate at least PyTorch's throughput).

    models/fetch_minilm.sh
    python3 benches/text_encoder_bench.py [--input ../shared/data/flickr8k_captions.tsv]
        [--rows 10000] [--batch-size 64] [--curate target/release/curate] [--repeat 2]

Flickr8k lines are `IMAGE#N<TAB>caption`; lines without a tab are skipped by both sides.
"""
import argparse
import json
import subprocess
import time

import torch
from sentence_transformers import SentenceTransformer


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/all-MiniLM-L6-v2")
    ap.add_argument("--input", default="../shared/data/flickr8k_captions.tsv")
    ap.add_argument("--rows", type=int, default=10000)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--curate", default="target/release/curate")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()

    captions = []
    with open(args.input, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) > 1:
                captions.append(parts[1])
            if len(captions) == args.rows:
                break

    model = SentenceTransformer(args.model, device="cpu" if args.device == "cpu" else "cuda")
    model.encode(captions[: args.batch_size], batch_size=args.batch_size)
    results = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        model.encode(captions, batch_size=args.batch_size, convert_to_numpy=True)
        torch_s = time.perf_counter() - t
        out = subprocess.run(
            [args.curate, "bench", "text", "--model", args.model, "--input", args.input, "--rows", str(args.rows),
             "--batch-size", str(args.batch_size), "--device", args.device],
            check=True, capture_output=True, text=True,
        ).stdout
        c = json.loads(out.strip().splitlines()[-1])
        results.append((len(captions) / torch_s, c["sentences_per_s"]))
    best_torch = max(r[0] for r in results)
    best_curate = max(r[1] for r in results)
    print(f"{len(captions)} captions, batch {args.batch_size}, torch threads {torch.get_num_threads()}, device {args.device}")
    print("| implementation | sentences/s (best of %d) | all runs |" % args.repeat)
    print("| --- | ---: | --- |")
    print(f"| sentence-transformers {__import__('sentence_transformers').__version__} (PyTorch {torch.__version__}) | {best_torch:.0f} | {', '.join(f'{r[0]:.0f}' for r in results)} |")
    print(f"| curate (burn) | {best_curate:.0f} | {', '.join(f'{r[1]:.0f}' for r in results)} |")
    print(f"ratio curate / PyTorch: {best_curate / best_torch:.2f}x")


if __name__ == "__main__":
    main()
