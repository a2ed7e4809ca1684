#!/usr/bin/env python3
"""`curate bench knn` (knn::exact_top_k) against faiss `IndexFlatIP` on the same data.

Pseudo-BoW mining (issue 6, spec §3 step 3) searches L2-normalised crop embeddings against
L2-normalised caption embeddings by exact inner product. The issue's realistic size, 100k queries
x 1M captions x 768 dims, is ~150 TFLOP per pass; this script scales it down (default 4096 x
200,000 x 768, k = 10, about 1.3 TFLOP) so each side runs in well under a minute on a 2-core
machine, and says by how much.

Data: seeded Gaussian rows, L2-normalised, float32, written as .npy to a temporary folder.
faiss: `IndexFlatIP.add(pool)` (not timed), then `search(queries, k)` timed `--repeat` times;
faiss uses BLAS sgemm in blocks plus a heap per query. curate: `target/release/curate bench knn`
on the same files, `exact_top_k` timed `--repeat` times in-process (loading excluded); the two
alternate for `--rounds` rounds and the best run of each counts. Both get
`--threads` threads (faiss.omp_set_num_threads, RAYON_NUM_THREADS). Reported: the best run of
each as queries/s and the ratio curate / faiss; then whether the ids agree — a differing id
counts as a tie when the two rows' exact (float64) scores are within float32 rounding.

faiss-cpu's wheels bundle OpenBLAS 0.3.15 (DYNAMIC_ARCH), which does not recognise recent Xeons
(e.g. family 6 model 207) and falls back to its SSE3 "Prescott" kernels, 4x slower than its
AVX-512 ones. For a fair comparison the script sets OPENBLAS_CORETYPE=SkylakeX on AVX-512
machines (`--openblas-coretype auto`, the default); `--openblas-coretype none` keeps OpenBLAS's
own choice. The core OpenBLAS runs is printed.

    pip install faiss-cpu
    cargo build --release
    python3 benches/knn_bench.py                       # 4096 x 200,000 x 768, k = 10
    python3 benches/knn_bench.py --queries 8192 --pool 100000 --threads 1
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ISSUE = (100_000, 1_000_000, 768)  # queries, pool, dim named by issue 6


def normalised(rng, rows, dim):
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def openblas_core(faiss):
    """The kernel set faiss's bundled OpenBLAS runs (best effort)."""
    import ctypes
    import glob

    libs = glob.glob(os.path.join(os.path.dirname(faiss.__file__), "..", "faiss_cpu.libs", "libopenblas*"))
    try:
        lib = ctypes.CDLL(libs[0])
        lib.openblas_get_corename.restype = ctypes.c_char_p
        return lib.openblas_get_corename().decode()
    except (IndexError, OSError, AttributeError):
        return "unknown"


def load():
    try:
        return os.getloadavg()
    except OSError:
        return (float("nan"),) * 3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--queries", type=int, default=4096)
    ap.add_argument("--pool", type=int, default=200_000)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each per round")
    ap.add_argument("--rounds", type=int, default=2, help="faiss then curate, this many times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--curate", default=os.path.join(ROOT, "target", "release", "curate"))
    ap.add_argument("--openblas-coretype", default="auto", help="auto (SkylakeX on AVX-512), none, or a core name")
    ap.add_argument("--query-block", type=int, help="curate's queries per matrix product")
    ap.add_argument("--pool-block", type=int, help="curate's pool rows per matrix product")
    args = ap.parse_args()

    # Read by OpenBLAS when it loads, so before `import faiss`.
    coretype = args.openblas_coretype
    if coretype == "auto":
        with open("/proc/cpuinfo") as f:
            coretype = "SkylakeX" if " avx512f " in f.read() else "none"
    if coretype != "none":
        os.environ["OPENBLAS_CORETYPE"] = coretype
    import faiss

    nq, n_pool, dim, k = args.queries, args.pool, args.dim, args.k
    iq, ip, idim = ISSUE
    print(
        f"size: {nq} queries x {n_pool} pool rows x {dim} dims, k = {k}, {args.threads} threads "
        f"(issue 6: {iq} x {ip} x {idim}; this run is 1/{iq * ip * idim / (nq * n_pool * dim):.0f} of its work: "
        f"queries / {iq / nq:.1f}, pool / {ip / n_pool:.1f})"
    )
    print(f"faiss {faiss.__version__} (OpenBLAS core: {openblas_core(faiss)}), numpy {np.__version__}")
    rng = np.random.default_rng(args.seed)
    pool = normalised(rng, n_pool, dim)
    queries = normalised(rng, nq, dim)

    with tempfile.TemporaryDirectory(prefix="knn_bench_") as tmp:
        qf, pf, idf = (os.path.join(tmp, f) for f in ("queries.npy", "pool.npy", "ids.u32"))
        np.save(qf, queries)
        np.save(pf, pool)

        faiss.omp_set_num_threads(args.threads)
        index = faiss.IndexFlatIP(dim)
        index.add(pool)
        env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
        cmd = [args.curate, "bench", "knn", "--queries", qf, "--pool", pf, "--k", str(k)]
        cmd += ["--repeat", str(args.repeat), "--ids-out", idf]
        for flag, value in (("--query-block", args.query_block), ("--pool-block", args.pool_block)):
            if value:
                cmd += [flag, str(value)]

        # Rounds alternate the two, so both see the same machine state (it is shared).
        loads = [load()]
        faiss_runs, curate_runs = [], []
        for _ in range(args.rounds):
            for _ in range(args.repeat):
                t = time.perf_counter()
                _, faiss_ids = index.search(queries, k)
                faiss_runs.append(time.perf_counter() - t)
            loads.append(load())
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            report = json.loads(out.strip().splitlines()[-1])
            curate_runs += report["runs_s"]
            loads.append(load())
        curate_ids = np.fromfile(idf, dtype="<u4").reshape(nq, k).astype(np.int64)

    f_best, c_best = min(faiss_runs), min(curate_runs)
    f_qps, c_qps = nq / f_best, nq / c_best
    print("1-min load average before, between and after the runs: " + ", ".join(f"{x[0]:.2f}" for x in loads))
    print("| search | threads | best s | queries/s | all runs s |")
    print("| --- | ---: | ---: | ---: | --- |")
    print(f"| faiss IndexFlatIP | {args.threads} | {f_best:.3f} | {f_qps:.0f} | {', '.join(f'{x:.3f}' for x in faiss_runs)} |")
    print(
        f"| curate exact_top_k ({report['query_block']} x {report['pool_block']} blocks) | {report['threads']} | "
        f"{c_best:.3f} | {c_qps:.0f} | "
        f"{', '.join(f'{x:.3f}' for x in curate_runs)} |"
    )
    print(f"ratio curate / faiss (queries/s): {c_qps / f_qps:.2f}")

    # Agreement: differing ids must be near-ties, i.e. their exact scores agree to f32 rounding.
    differ = curate_ids != faiss_ids
    q64, p64 = queries.astype(np.float64), pool.astype(np.float64)
    rows, cols = np.nonzero(differ)
    sc = np.einsum("ij,ij->i", q64[rows], p64[curate_ids[rows, cols]])
    sf = np.einsum("ij,ij->i", q64[rows], p64[faiss_ids[rows, cols]])
    ties = np.abs(sc - sf) <= 1e-6
    print(
        f"ids: {int((~differ.any(axis=1)).sum())}/{nq} queries identical; {int(differ.sum())} of {nq * k} "
        f"positions differ, {int(ties.sum())} of them near-ties (exact scores within 1e-6)"
    )
    if not ties.all():
        print("error: curate and faiss disagree beyond ties", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
