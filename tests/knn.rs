//! `knn::device_top_k` (the mining stage's search on a burn device) on every test device: the
//! CPU device always, the GPU with `--features cuda` and `CURATE_TEST_CUDA=1` (run by
//! `tools/gpu-check/check.sh`). On the CPU it must return `knn::exact_top_k`'s lists exactly; on a
//! GPU, whose matrix product rounds its operands to TF32, every list must still be a true top k up
//! to that rounding, checked against scores computed here in f64.

mod common;

use curate::knn::{device_top_k, device_top_k_with, exact_top_k, Blocking, TopK};
use curate::rng::RowRng;

/// Seeded values in [-1, 1).
fn uniform(n: usize, seed: u64) -> Vec<f32> {
    let mut r = RowRng::new(seed, "knn-test", "uniform");
    (0..n).map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect()
}

/// Every list of `got` holds `k` distinct rows, best first, whose exact (f64) scores are within
/// `slack` of the exact k-th best score of the query and within `slack` of the score reported;
/// `slack` bounds the rounding of the product: `rel · Σ|q_i·p_i|` for each pair.
fn assert_true_top_k(queries: &[f32], pool: &[f32], dim: usize, k: usize, got: &TopK, rel: f64, what: &str) {
    let (nq, np) = (queries.len() / dim, pool.len() / dim);
    assert_eq!((got.k, got.queries()), (k.min(np), nq), "{what}: shape");
    for qi in 0..nq {
        let q = &queries[qi * dim..(qi + 1) * dim];
        let exact: Vec<(f64, f64)> = pool
            .chunks(dim)
            .map(|p| {
                let products = q.iter().zip(p).map(|(&a, &b)| a as f64 * b as f64);
                (products.clone().sum(), products.map(f64::abs).sum::<f64>() * rel + 1e-9)
            })
            .collect();
        let mut sorted: Vec<f64> = exact.iter().map(|e| e.0).collect();
        sorted.sort_by(|a, b| b.total_cmp(a));
        let kth = sorted[got.k - 1];
        let (ids, scores) = (got.ids_of(qi), got.scores_of(qi));
        let mut seen = ids.to_vec();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), ids.len(), "{what}: query {qi} repeats a row: {ids:?}");
        assert!(scores.windows(2).all(|w| w[0] >= w[1]), "{what}: query {qi} not best first: {scores:?}");
        for (&id, &score) in ids.iter().zip(scores) {
            let (value, slack) = exact[id as usize];
            assert!((value - score as f64).abs() <= slack, "{what}: query {qi} row {id}: {score} vs {value}");
            assert!(value >= kth - 2.0 * slack, "{what}: query {qi} row {id} ({value}) is not among the top {k}");
        }
    }
}

#[test]
fn device_top_k_returns_the_true_top_k_on_every_device() {
    // 130 queries × 3,000 rows × 40 dims: with blocks of 50 queries and 1,024 rows, three query
    // blocks (the last short) and three pool blocks (the last short) merge into each list; the
    // default blocks take everything in one. k = 10, and k larger than a chunk's share of the pool.
    let (nq, np, dim) = (130, 3_000, 40);
    let (queries, pool) = (uniform(nq * dim, 1), uniform(np * dim, 2));
    for (name, device) in common::test_devices() {
        // f32 sums on the CPU; TF32 operands (unit roundoff 2⁻¹¹, both rounded) on a GPU.
        let rel = if name == "cuda" { 4.0 * 2f64.powi(-11) } else { 1e-5 };
        for k in [10, 40] {
            let want = exact_top_k(&queries, &pool, dim, k);
            let small = Blocking { queries: 50, pool: 1_024 };
            for (label, got) in [
                ("blocks of 50 x 1024", device_top_k_with(&queries, &pool, dim, k, &device, small)),
                ("default blocks", device_top_k(&queries, &pool, dim, k, &device)),
            ] {
                let what = format!("{name} k={k} {label}");
                assert_true_top_k(&queries, &pool, dim, k, &got, rel, &what);
                if name != "cuda" {
                    assert_eq!(got.ids, want.ids, "{what}: not exact_top_k's lists");
                }
            }
        }
        // A pool smaller than k: every row, best first.
        let got = device_top_k(&queries[..3 * dim], &pool[..5 * dim], dim, 8, &device);
        assert_true_top_k(&queries[..3 * dim], &pool[..5 * dim], dim, 8, &got, rel, &format!("{name} np < k"));
    }
}
