#!/usr/bin/env python3
"""`curate eval` against the eccv-caption package (0.1.0) on the full COCO 5K x 25K protocol.

Same inputs for both: the package's own id lists (`coco_test_ids.npy`, `original_*.json`) and
CxC / ECCV Caption files, with random embeddings (seeded; each caption = its image's vector plus
noise, L2-normalised, so the metrics are not at chance). Images are ordered as the package's
caption list groups them, so curate's COCO 1K folds (consecutive image rows) are the package's.

- curate: `target/release/curate eval --similarity dot` on Parquet files, the whole process
  timed (reading, scoring 5K x 25K both ways, every metric, writing the report).
- eccv-caption: the reference pipeline of PCME++ — float32 similarity and `torch.topk` lists of
  `--topk` ids (500 as PCME++ passes; full rankings make the package far slower) per query in
  both directions, then `Metrics.compute_all_metrics` (COCO 1K/5K and CxC R@1/5/10, ECCV
  mAP@R / R-P / R@1); torch uses every core.

Each side runs `--repeat` times, the two alternating so that both meet the same conditions on the
shared machine (curate after one untimed run that warms the page cache). Prints the median and
fastest time of each and their ratios, the load average before and after (both sides slow down
under load, the reference's torch part most; its first runs are also slower), curate's own
breakdown (`metrics.md` timings), and the largest difference per metric (lists of 500 are long
enough for every metric here, so differences can only come from float32 near-ties scored in a
different order).

    pip install --no-deps eccv-caption==0.1.0
    cargo build --release
    python3 benches/eval_bench.py              # dim 512
    python3 benches/eval_bench.py --dim 1024
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--topk", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--noise", type=float, default=8.0, help="caption noise scale (higher = lower recall)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each side")
    args = ap.parse_args()

    import eccv_caption
    from eccv_caption import Metrics

    data = os.path.join(os.path.dirname(eccv_caption.__file__), "data")
    cap_ids = np.load(os.path.join(data, "coco_test_ids.npy")).astype(np.int64)
    with open(os.path.join(data, "original_caption_to_image.json")) as f:
        c2i = {int(k): int(v[0]) for k, v in json.load(f).items()}
    cap_image = np.array([c2i[int(c)] for c in cap_ids], dtype=np.int64)
    image_ids = np.array(list(dict.fromkeys(cap_image.tolist())), dtype=np.int64)  # first-seen order
    row_of = {int(i): r for r, i in enumerate(image_ids)}

    rng = np.random.default_rng(args.seed)
    img = rng.standard_normal((len(image_ids), args.dim)).astype(np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    cap = img[[row_of[int(i)] for i in cap_image]] + args.noise * rng.standard_normal((len(cap_ids), args.dim)).astype(
        np.float32
    ) / np.sqrt(args.dim)
    cap = (cap / np.linalg.norm(cap, axis=1, keepdims=True)).astype(np.float32)
    print(f"{len(image_ids)} images x {len(cap_ids)} captions, dim {args.dim}, {os.cpu_count()} cores", flush=True)

    def emb(x):
        return pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1), pa.float32()), x.shape[1])

    with tempfile.TemporaryDirectory() as tmp:
        ip, cp, out = os.path.join(tmp, "images.parquet"), os.path.join(tmp, "captions.parquet"), os.path.join(tmp, "out")
        pq.write_table(pa.table({"coco_image_id": image_ids, "embedding": emb(img)}), ip)
        pq.write_table(pa.table({"coco_caption_id": cap_ids, "coco_image_id": cap_image, "embedding": emb(cap)}), cp)

        exe = os.path.join(ROOT, "target", "release", "curate")
        cmd = [exe, "eval", "--image-embeddings", ip, "--caption-embeddings", cp, "--eccv-annotations", data,
               "--out", out, "--similarity", "dot"]
        load_before = os.getloadavg()
        subprocess.run(cmd, check=True, capture_output=True)  # warm the page cache
        torch.set_num_threads(os.cpu_count())
        m = Metrics()
        # The two sides alternate, so that both meet the same conditions on the shared machine.
        t_curate, t_rank, t_metrics = [], [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            t_curate.append(time.perf_counter() - t)

            t = time.perf_counter()
            s = torch.from_numpy(img) @ torch.from_numpy(cap).T
            i2t_idx = torch.topk(s, args.topk, dim=1).indices.numpy()
            t2i_idx = torch.topk(s.T, min(args.topk, len(image_ids)), dim=1).indices.numpy()
            i2t = {int(image_ids[r]): cap_ids[row].tolist() for r, row in enumerate(i2t_idx)}
            t2i = {int(cap_ids[r]): image_ids[row].tolist() for r, row in enumerate(t2i_idx)}
            del s
            t_rank.append(time.perf_counter() - t)
            t = time.perf_counter()
            ref = m.compute_all_metrics(
                i2t, t2i,
                target_metrics=("coco_1k_recalls", "coco_5k_recalls", "cxc_recalls", "eccv_map_at_r",
                                "eccv_rprecision", "eccv_r1"),
                Ks=(1, 5, 10),
            )
            t_metrics.append(time.perf_counter() - t)
        with open(os.path.join(out, "metrics.json")) as f:
            ours = json.load(f)
        with open(os.path.join(out, "metrics.md")) as f:
            breakdown = next((line[2:].strip() for line in f if line.startswith("- timings:")), "")
    t_ref = [a + b for a, b in zip(t_rank, t_metrics)]
    load_after = os.getloadavg()

    med = statistics.median
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min)")
    print(f"curate eval (whole process)      median {med(t_curate):6.2f} s, fastest {min(t_curate):6.2f} s"
          f"  [{' '.join(f'{x:.2f}' for x in t_curate)}]")
    print(f"  {breakdown} (last run)")
    print(f"eccv-caption (torch top-{args.topk} + Metrics) median {med(t_ref):6.2f} s, fastest {min(t_ref):6.2f} s"
          f"  [{' '.join(f'{x:.2f}' for x in t_ref)}]")
    print(f"  ranking median {med(t_rank):.2f} s, metrics median {med(t_metrics):.2f} s")
    print(f"ratio of medians                 {med(t_ref) / med(t_curate):6.1f}x"
          f"  (of fastest runs {min(t_ref) / min(t_curate):.1f}x)")
    worst = 0.0
    for k, v in ref.items():
        d = max(abs(ours[k][x] - float(v[x])) for x in ("i2t", "t2i"))
        worst = max(worst, d)
        print(f"  {k:16s} i2t {ours[k]['i2t']:.6f} t2i {ours[k]['t2i']:.6f}  max |diff| {d:.2e}")
    print(f"largest difference {worst:.2e}")


if __name__ == "__main__":
    sys.exit(main())
