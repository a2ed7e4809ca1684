#!/usr/bin/env python3
"""Exact top-k on a GPU: `curate bench knn --device cuda` (knn::device_top_k) against the same
blocked search in PyTorch, on the same data, in one run (issue 6's GPU figure).

faiss' GPU index is not on PyPI (only `faiss-cpu`; `benches/knn_bench.py` compares with that on
the CPU), so the peer here is what a flat GPU index does, written in PyTorch: each block of
queries times each block of the pool (one cuBLAS product), `topk` per block, the blocks' lists
joined and reduced to the top k on the GPU, the result copied back. Both sides use curate's
blocks (4,096 queries x 65,536 pool rows) and both timings include copying the queries and the
pool to the GPU and the ids back. PyTorch runs twice: in full float32 (its default for matrix
products) and with TF32 allowed (`torch.backends.cuda.matmul.allow_tf32`), which is what
cubecl's f32 product runs on the tensor cores.

Data: seeded Gaussian rows, L2-normalised, float32, made on the GPU (torch.Generator) and saved
as .npy for curate. Default size: the issue's own, 100k queries x 1M captions x 768 dims, k = 10
(3.1 GB of pool, ~150 TFLOP per pass). Reported: the best of `--repeat` runs of each side as
queries/s, ratios to curate, and how far the ids agree with PyTorch's float32 search (identical
lists, and the mean share of common ids).

    cargo build --release --features cuda --config 'patch.crates-io.cubecl-llvm.path="tools/cubecl-llvm-offline"'
    python3 benches/knn_gpu_bench.py --curate target/release/curate
    python3 benches/knn_gpu_bench.py --queries 10000      # a tenth of the queries
"""
import argparse
import json
import os
import subprocess
import tempfile
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def torch_search(queries, pool, k, query_block, pool_block, dev):
    """Blocked exact top-k on `dev`; `queries`, `pool` are host tensors. Returns host ids."""
    pool_blocks = [pool[s : s + pool_block].to(dev).t().contiguous() for s in range(0, len(pool), pool_block)]
    starts = list(range(0, len(pool), pool_block))
    out = []
    for q0 in range(0, len(queries), query_block):
        q = queries[q0 : q0 + query_block].to(dev)
        values, ids = [], []
        for start, block in zip(starts, pool_blocks):
            v, i = torch.topk(q @ block, min(k, block.shape[1]), dim=1)
            values.append(v)
            ids.append(i + start)
        v, j = torch.topk(torch.cat(values, 1), k, dim=1)
        out.append(torch.gather(torch.cat(ids, 1), 1, j).cpu())
    sync()
    return torch.cat(out).numpy()


def best_of(repeat, f):
    runs, result = [], None
    for _ in range(repeat):
        sync()
        t = time.perf_counter()
        result = f()
        runs.append(time.perf_counter() - t)
    return min(runs), runs, result


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=100_000)
    ap.add_argument("--pool", type=int, default=1_000_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda", help="curate's --device")
    ap.add_argument("--torch-device", default="cuda")
    ap.add_argument("--curate", default=os.path.join(ROOT, "target", "release", "curate"))
    ap.add_argument("--tmp", default=None, help="folder for the .npy files (default: a temporary one)")
    args = ap.parse_args()
    nq, n_pool, dim, k = args.queries, args.pool, args.dim, args.k
    qb, pb = 4096, 65536
    dev = torch.device(args.torch_device)
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    print(f"size: {nq} queries x {n_pool} pool rows x {dim} dims, k = {k}; GPU: {gpu}, "
          f"torch {torch.__version__}", flush=True)

    g = torch.Generator(device=dev).manual_seed(args.seed)

    def normalised(rows):
        x = torch.randn(rows, dim, generator=g, device=dev)
        return torch.nn.functional.normalize(x, dim=1).cpu()

    pool, queries = normalised(n_pool), normalised(nq)
    with tempfile.TemporaryDirectory(prefix="knn_gpu_", dir=args.tmp) as tmp:
        qf, pf, idf = (os.path.join(tmp, f) for f in ("queries.npy", "pool.npy", "ids.u32"))
        np.save(qf, queries.numpy())
        np.save(pf, pool.numpy())
        results = {}
        for name, tf32 in (("torch_fp32", False), ("torch_tf32", True)):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch_search(queries[:qb], pool, k, qb, pb, dev)  # warm-up: cuBLAS handles, allocator
            best, runs, ids = best_of(args.repeat, lambda: torch_search(queries, pool, k, qb, pb, dev))
            results[name] = {"best_s": best, "runs_s": runs, "queries_per_s": nq / best}
            results[name + "_ids"] = ids
            print(json.dumps({"side": name, **results[name]}), flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # PyTorch's cached blocks would sit beside curate's
        cmd = [args.curate, "bench", "knn", "--queries", qf, "--pool", pf, "--k", str(k), "--device", args.device,
               "--repeat", str(args.repeat), "--ids-out", idf]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True)
        line = json.loads(out.stdout.strip().splitlines()[-1])
        print(json.dumps({"side": "curate", **line}), flush=True)
        curate_ids = np.fromfile(idf, dtype=np.uint32).reshape(nq, k).astype(np.int64)
    ref = results["torch_fp32_ids"]
    same = float(np.mean(np.all(curate_ids == ref, axis=1)))
    overlap = float(np.mean([len(set(a) & set(b)) / k for a, b in zip(curate_ids, ref)]))
    tf32_same = float(np.mean(np.all(results["torch_tf32_ids"] == ref, axis=1)))
    c = line["queries_per_s"]
    print(f"curate {c:,.0f} queries/s (best {line['best_s']:.2f} s, runs {line['runs_s']}); "
          f"torch fp32 {results['torch_fp32']['queries_per_s']:,.0f} ({c / results['torch_fp32']['queries_per_s']:.2f}x), "
          f"torch tf32 {results['torch_tf32']['queries_per_s']:,.0f} ({c / results['torch_tf32']['queries_per_s']:.2f}x)")
    print(f"ids against torch fp32: curate identical lists {same:.4f}, mean common ids {overlap:.4f}; "
          f"torch tf32 identical lists {tf32_same:.4f}")


if __name__ == "__main__":
    main()
