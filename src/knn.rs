//! Exact k-nearest-neighbour search by inner product: for every query row, the `k` rows of a pool
//! with the highest dot product, found by blocked f32 matrix products (the `gemm` kernels that
//! `eval::ranking` uses) and a running top-k per query. It is the retrieval step of pseudo-BoW
//! mining (spec §3 step 3: each crop embedding against every caption embedding, exact, no
//! index); `benches/knn_bench.py` runs it beside faiss's `IndexFlatIP`.
//!
//! The pool is cut into fixed blocks of about [`Blocking::pool`] rows and the queries into blocks
//! of [`Blocking::queries`]; each (query block, pool block) product is at most
//! `queries x pool` scores, so memory stays bounded whatever the sizes. Tasks — a query
//! block against a run of consecutive pool blocks — run on the rayon pool, each calling gemm
//! single-threaded. Every score is one FMA chain over the dimensions whose shape depends only on
//! `dim` and the pool block, never on the thread count or on which other queries share its block
//! (see `score_block`); the order (score descending, NaN lowest, ties by ascending pool index) is
//! total, so the top-k of a union is the top-k of the per-part top-k lists. Hence the result is
//! bit-identical for any thread count and any way of splitting the queries into calls, on a
//! given machine (gemm picks its kernels and depth blocking from the CPU it runs on).
//!
//! [`device_top_k`] is the same search on a burn device (a GPU with `--features cuda`): products
//! and per-block top-k there, lists merged here in the same order.

use std::cmp::Ordering;
use std::ops::Range;

use rayon::prelude::*;

/// Block sizes of the search. They change the speed, and the pool block also the rounding of the
/// scores (which products a score comes from), never which rows can be returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blocking {
    /// Queries per matrix product: every pool row is read once per query block, so larger
    /// blocks mean less memory traffic, as long as the score block stays in cache.
    pub queries: usize,
    /// Pool rows per matrix product (at least [`MIN_POOL_BLOCK`]; blocks are balanced and start
    /// on multiples of 64).
    pub pool: usize,
}

impl Default for Blocking {
    /// Measured with `benches/knn_bench.py` (768 dims, AVX-512, 2 MiB L2 per core): 512 queries
    /// per block ran ~10% faster than 256 (half the passes over the pool), 768 or 1024 at most 3%
    /// more; pool blocks of 704 to 2048 rows ran alike. The score block is 2 MiB per running task.
    fn default() -> Self {
        Blocking { queries: 512, pool: 1024 }
    }
}

/// Smallest pool block: balanced blocks of at least this many rows have at least
/// `MIN_POOL_ROWS` rows after their starts are rounded down to `TILE`.
pub const MIN_POOL_BLOCK: usize = 2 * (MIN_POOL_ROWS + TILE);

/// Pool block boundaries are multiples of gemm's AVX-512 register tile height (64 rows), so only
/// the last block has a partial tile.
const TILE: usize = 64;

/// Fewest rows in a pool block (a smaller pool is padded with zero rows that are never
/// returned): with more than 256 and more than 64 rows, gemm takes its packed kernel with a depth
/// blocking that depends on `dim` alone, for any number of queries from 2 on (fewer than
/// 16 x 16 products go to a dot-product kernel, fewer than 64 x 64 to another depth blocking).
const MIN_POOL_ROWS: usize = 257;

/// Result of a search: `ids[q*k + j]`, `scores[q*k + j]` = the j-th best pool row for query q.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopK {
    /// Neighbours per query: the `k` asked for, or the pool size if smaller.
    pub k: usize,
    /// Pool row indices, `[nq * k]`, best first.
    pub ids: Vec<u32>,
    /// Their inner products with the query (f32, as computed by the blocked product).
    pub scores: Vec<f32>,
}

impl TopK {
    /// Number of queries.
    pub fn queries(&self) -> usize {
        self.ids.len().checked_div(self.k).unwrap_or(0)
    }

    /// The neighbours of query `q`, best first.
    pub fn ids_of(&self, q: usize) -> &[u32] {
        &self.ids[q * self.k..(q + 1) * self.k]
    }

    /// The scores of query `q`'s neighbours, best first.
    pub fn scores_of(&self, q: usize) -> &[f32] {
        &self.scores[q * self.k..(q + 1) * self.k]
    }
}

/// Exact top-k by inner product. `queries`: [nq, dim] row-major, `pool`: [np, dim] row-major.
/// Order: score descending, ties broken by the lower pool index. If np < k, k = np.
///
/// NaN scores rank below every number (and tie with -inf, by index). Scores equal the plain dot
/// products up to f32 rounding, and are bit-identical for any rayon thread count and whichever
/// other queries are searched in the same call (module doc); with `k = 0` or an empty pool the
/// result is empty (`k = 0`).
///
/// # Shapes
/// `queries`: `[nq * dim]`, `pool`: `[np * dim]` -> `ids`, `scores`: `[nq * min(k, np)]`.
///
/// # Panics
/// If `dim` is 0 or does not divide both lengths, or the pool has more than `u32::MAX` rows.
pub fn exact_top_k(queries: &[f32], pool: &[f32], dim: usize, k: usize) -> TopK {
    exact_top_k_with(queries, pool, dim, k, Blocking::default())
}

/// [`exact_top_k`] with other block sizes (for benchmarks); the guarantees hold for a fixed
/// `blocking.pool`.
pub fn exact_top_k_with(queries: &[f32], pool: &[f32], dim: usize, k: usize, blocking: Blocking) -> TopK {
    let query_block = blocking.queries.max(1);
    let pool_block = blocking.pool.max(MIN_POOL_BLOCK);
    let (nq, np, k) = shapes(queries, pool, dim, k);
    if k == 0 || nq == 0 {
        return TopK { k, ids: Vec::new(), scores: Vec::new() };
    }
    // A small pool is padded to MIN_POOL_ROWS so its one block takes the same gemm path for any
    // number of queries; only the first `np` rows are ever selected.
    let padded;
    let pool_rows = if np < MIN_POOL_ROWS {
        let mut p = vec![0.0f32; MIN_POOL_ROWS * dim];
        p[..pool.len()].copy_from_slice(pool);
        padded = p;
        &padded[..]
    } else {
        pool
    };
    let blocks = pool_blocks(pool_rows.len() / dim, pool_block);

    // Enough tasks to keep every thread busy, small enough for rayon to even out threads slowed
    // by other work: with few query blocks, each also takes only part of the pool, and the
    // parts' lists are merged (exact, since the order is total).
    let query_blocks = nq.div_ceil(query_block);
    let parts = (16 * rayon::current_num_threads()).div_ceil(query_blocks).clamp(1, blocks.len());
    let part_of = |p: usize| &blocks[p * blocks.len() / parts..(p + 1) * blocks.len() / parts];
    let lists: Vec<Vec<Vec<Candidate>>> = (0..query_blocks * parts)
        .into_par_iter()
        .map(|t| {
            let (b, p) = (t / parts, t % parts);
            let rows = b * query_block..((b + 1) * query_block).min(nq);
            search_block(&queries[rows.start * dim..rows.end * dim], pool_rows, np, part_of(p), dim, k)
        })
        .collect();

    let mut ids = Vec::with_capacity(nq * k);
    let mut scores = Vec::with_capacity(nq * k);
    for b in 0..query_blocks {
        let tasks = &lists[b * parts..(b + 1) * parts];
        for q in 0..tasks[0].len() {
            let mut best: Vec<Candidate> = tasks.iter().flat_map(|t| t[q].iter().copied()).collect();
            if parts > 1 {
                best.sort_unstable_by(order);
                best.truncate(k);
            }
            debug_assert_eq!(best.len(), k);
            ids.extend(best.iter().map(|c| c.id));
            scores.extend(best.iter().map(|c| c.score));
        }
    }
    TopK { k, ids, scores }
}

/// Query rows, pool rows and the `k` a search returns (at most the pool size), after the shape
/// checks both searches document under "Panics".
fn shapes(queries: &[f32], pool: &[f32], dim: usize, k: usize) -> (usize, usize, usize) {
    assert!(dim > 0, "knn: dim must be positive");
    assert_eq!(queries.len() % dim, 0, "knn: queries length is not a multiple of dim");
    assert_eq!(pool.len() % dim, 0, "knn: pool length is not a multiple of dim");
    let (nq, np) = (queries.len() / dim, pool.len() / dim);
    assert!(np <= u32::MAX as usize, "knn: pool rows must fit in u32");
    (nq, np, k.min(np))
}

impl Blocking {
    /// The blocks of [`device_top_k`]: 4,096 queries × 65,536 pool rows, a 1 GiB score block.
    pub fn device_default() -> Self {
        Blocking { queries: 4_096, pool: 65_536 }
    }
}

/// Scores per row of the first top-k stage in [`device_top_k`]: burn-cubecl reduces with one
/// GPU thread per output row (without autotuning), so a pool block's scores are cut into rows of
/// this many before the first top-k, and the rows' lists are reduced again.
pub const DEVICE_TOP_K_CHUNK: usize = 1_024;

/// [`exact_top_k`] on a burn device (a GPU with `--features cuda`): the pool goes to the device
/// once, in blocks; each query block's product with each pool block is reduced to its top `k` on
/// the device in two stages (`topk_with_indices` over every [`DEVICE_TOP_K_CHUNK`] scores, then
/// over the chunks' lists), and the blocks' lists are merged here in [`exact_top_k`]'s order.
/// Still exhaustive, no index; but the device's matrix product rounds differently from the CPU
/// kernel, and its top-k breaks exact ties its own way within a block, so rows whose scores tie
/// or nearly tie at the k-th place may differ from [`exact_top_k`]'s.
///
/// # Shapes
/// As [`exact_top_k`].
///
/// # Panics
/// As [`exact_top_k`].
pub fn device_top_k(queries: &[f32], pool: &[f32], dim: usize, k: usize, device: &burn::tensor::Device) -> TopK {
    device_top_k_with(queries, pool, dim, k, device, Blocking::device_default())
}

/// [`device_top_k`] with other block sizes; the pool block is rounded down to whole chunks of
/// [`DEVICE_TOP_K_CHUNK`] rows, and up to one chunk ([`device_pool_block_used`]). The blocks'
/// lists of one query block are joined on the device and read back at once, so the device runs
/// every pool block of a query block without waiting for the host.
pub fn device_top_k_with(
    queries: &[f32],
    pool: &[f32],
    dim: usize,
    k: usize,
    device: &burn::tensor::Device,
    blocking: Blocking,
) -> TopK {
    device_top_k_chunked(queries, pool, dim, k, device, blocking, DEVICE_TOP_K_CHUNK)
}

/// The pool rows per product that [`device_top_k_with`] uses when asked for `requested`: whole
/// chunks of [`DEVICE_TOP_K_CHUNK`] scores, at least one.
pub fn device_pool_block_used(requested: usize) -> usize {
    device_pool_block(requested, DEVICE_TOP_K_CHUNK)
}

fn device_pool_block(requested: usize, chunk: usize) -> usize {
    requested.max(chunk) / chunk * chunk
}

/// [`device_top_k_with`] with `chunk` scores per first-stage row (tests use small ones).
fn device_top_k_chunked(
    queries: &[f32],
    pool: &[f32],
    dim: usize,
    k: usize,
    device: &burn::tensor::Device,
    blocking: Blocking,
    chunk: usize,
) -> TopK {
    use burn::tensor::{Int, Tensor, TensorData};
    let (nq, np, k) = shapes(queries, pool, dim, k);
    if k == 0 || nq == 0 {
        return TopK { k, ids: Vec::new(), scores: Vec::new() };
    }
    let query_block = blocking.queries.max(1);
    // Pool blocks of whole chunks, then the rest: whole chunks, and the last < `chunk` rows.
    let pool_block = device_pool_block(blocking.pool, chunk);
    let mut bounds: Vec<(usize, usize)> =
        (0..np / pool_block).map(|b| (b * pool_block, (b + 1) * pool_block)).collect();
    let mut at = np / pool_block * pool_block;
    for end in [at + (np - at) / chunk * chunk, np] {
        if end > at {
            bounds.push((at, end));
            at = end;
        }
    }
    // `[dim, rows]` per block, so each product is a plain `[q, dim] x [dim, rows]`.
    let blocks: Vec<(usize, Tensor<2>)> = bounds
        .iter()
        .map(|&(start, end)| {
            let data = TensorData::new(pool[start * dim..end * dim].to_vec(), [end - start, dim]);
            (start, Tensor::<2>::from_data(data, device).transpose())
        })
        .collect();
    // Each block's list: its first pool row and its length, in the joined columns' order.
    let lists: Vec<(usize, usize)> = blocks.iter().map(|(start, b)| (*start, k.min(b.dims()[1]))).collect();
    let width: usize = lists.iter().map(|l| l.1).sum();
    // The top `kk` of each row of `scores` (`[q, rows]`), with column indices.
    let top = |scores: Tensor<2>, kk: usize| -> (Tensor<2>, Tensor<2, Int>) {
        let [q, rows] = scores.dims();
        if rows <= chunk || rows % chunk != 0 {
            return scores.topk_with_indices(kk, 1);
        }
        let chunks = rows / chunk;
        let k1 = kk.min(chunk);
        let (values, index) = scores.reshape([q * chunks, chunk]).topk_with_indices(k1, 1);
        let offsets =
            Tensor::<1, Int>::arange(0..chunks as i64, device).mul_scalar(chunk as i64).reshape([1, chunks, 1]);
        let index = (index.reshape([q, chunks, k1]) + offsets).reshape([q, chunks * k1]);
        let (values, pick) = values.reshape([q, chunks * k1]).topk_with_indices(kk, 1);
        (values, index.gather(1, pick))
    };
    let mut ids = Vec::with_capacity(nq * k);
    let mut scores = Vec::with_capacity(nq * k);
    for q0 in (0..nq).step_by(query_block) {
        let q1 = (q0 + query_block).min(nq);
        let q = Tensor::<2>::from_data(TensorData::new(queries[q0 * dim..q1 * dim].to_vec(), [q1 - q0, dim]), device);
        let (values, index): (Vec<_>, Vec<_>) =
            blocks.iter().zip(&lists).map(|((_, block), &(_, kk))| top(q.clone().matmul(block.clone()), kk)).unzip();
        let values = Tensor::cat(values, 1).into_data().convert::<f32>().try_to_vec::<f32>().expect("f32 scores");
        let index = Tensor::cat(index, 1).into_data().convert::<i64>().try_to_vec::<i64>().expect("integer indices");
        let mut list = Vec::with_capacity(width);
        for r in 0..q1 - q0 {
            list.clear();
            let mut j = r * width;
            for &(start, kk) in &lists {
                for _ in 0..kk {
                    list.push(Candidate { score: values[j], id: (start + index[j] as usize) as u32 });
                    j += 1;
                }
            }
            list.sort_unstable_by(order);
            ids.extend(list[..k].iter().map(|c| c.id));
            scores.extend(list[..k].iter().map(|c| c.score));
        }
    }
    TopK { k, ids, scores }
}

/// A pool row and its score for one query.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    score: f32,
    id: u32,
}

/// The score used for ordering: NaN counts as -inf.
#[inline]
fn key(score: f32) -> f32 {
    if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score
    }
}

/// Best first: key descending, then pool index ascending (a total order: keys are never NaN,
/// and -0.0 equals 0.0).
fn order(a: &Candidate, b: &Candidate) -> Ordering {
    key(b.score).partial_cmp(&key(a.score)).unwrap_or(Ordering::Equal).then(a.id.cmp(&b.id))
}

/// Boundaries of the pool blocks: about `size` rows each, balanced, starting on multiples
/// of [`TILE`]; with `rows >= MIN_POOL_ROWS`, every block has at least `MIN_POOL_ROWS` rows.
fn pool_blocks(rows: usize, size: usize) -> Vec<Range<usize>> {
    let n = rows.div_ceil(size).max(1);
    let start = |b: usize| if b == n { rows } else { b * rows / n / TILE * TILE };
    (0..n).map(|b| start(b)..start(b + 1)).collect()
}

/// The top-k lists (best first) of each query in `queries` among the pool rows of `blocks`
/// (ascending, consecutive); rows from `real_rows` on are padding and never selected.
///
/// # Shapes
/// `queries`: `[m * dim]`, `pool`: `[rows * dim]` -> `m` lists of at most `k`.
fn search_block(
    queries: &[f32],
    pool: &[f32],
    real_rows: usize,
    blocks: &[Range<usize>],
    dim: usize,
    k: usize,
) -> Vec<Vec<Candidate>> {
    let m = queries.len() / dim;
    // A single query is paired with a zero row: gemm sends one-column products to a
    // matrix-vector kernel that sums in another order.
    let single;
    let rhs = if m == 1 {
        let mut q = vec![0.0f32; 2 * dim];
        q[..dim].copy_from_slice(queries);
        single = q;
        &single[..]
    } else {
        queries
    };
    let widest = blocks.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut scores = vec![0.0f32; widest * rhs.len() / dim];
    let mut best: Vec<Running> = (0..m).map(|_| Running::new(k)).collect();
    for block in blocks {
        let n = block.len();
        score_block(&pool[block.start * dim..block.end * dim], rhs, dim, &mut scores[..n * rhs.len() / dim]);
        let real = real_rows.saturating_sub(block.start).min(n);
        for (q, running) in best.iter_mut().enumerate() {
            running.scan(&scores[q * n..q * n + real], block.start as u32);
        }
    }
    best.into_iter().map(Running::finish).collect()
}

/// `out[q * n + i] = pool[i] . queries[q]` for the `n` pool rows and `m` queries, computed by
/// gemm on the current thread.
///
/// Each score is one FMA chain over the dimensions, split in depth chunks that gemm derives from
/// `dim` and the CPU's caches — as long as the product goes through gemm's packed kernel, which
/// holds here for every `m >= 2` because `n >= MIN_POOL_ROWS` (the callers ensure both). The
/// chain does not depend on the score's position in the register tile (full and partial tiles
/// run the same per-lane FMAs; the store adds with `beta = 1`, exactly), so a score does not
/// depend on `m` or on the other queries.
///
/// # Shapes
/// `pool`: `[n * dim]`, `queries`: `[m * dim]` -> `out`: `[m * n]` (row `q` = query `q`).
fn score_block(pool: &[f32], queries: &[f32], dim: usize, out: &mut [f32]) {
    let (n, m) = (pool.len() / dim, queries.len() / dim);
    assert!(n >= MIN_POOL_ROWS && m >= 2 && pool.len() == n * dim && queries.len() == m * dim && out.len() == m * n);
    // SAFETY: gemm reads lhs[i * dim + d] (i < n, d < dim) from `pool`, rhs[j * dim + d] (j < m)
    // from `queries`, and writes dst[i + j * n] (< m * n) to `out`, all in bounds by the assert
    // above; `out` is written only (read_dst = false, so alpha is ignored) and aliases neither
    // input (it is a distinct `&mut`).
    unsafe {
        gemm::gemm(
            n,
            m,
            dim,
            out.as_mut_ptr(),
            n as isize,
            1,
            false,
            pool.as_ptr(),
            1,
            dim as isize,
            queries.as_ptr(),
            dim as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// The best `k` candidates seen so far for one query. Candidates that can still enter are
/// appended to a buffer; when it holds `2k`, it is cut back to the best `k` and the floor (the
/// k-th best score) rises. Most scores are rejected by one compare against the floor, 16 at a
/// time; the cuts cost amortised O(1) per candidate kept.
struct Running {
    k: usize,
    buf: Vec<Candidate>,
    /// Whether a cut has happened: before it, every candidate enters.
    full: bool,
    /// Key of the k-th best at the last cut. Pool rows are scanned in ascending order, so a
    /// later candidate enters only with a strictly higher key.
    floor: f32,
}

impl Running {
    fn new(k: usize) -> Self {
        Running { k, buf: Vec::with_capacity(2 * k), full: false, floor: f32::NEG_INFINITY }
    }

    /// Offers `row[i]` as pool row `first + i`, for all `i`; rows must come in ascending order
    /// across calls.
    fn scan(&mut self, row: &[f32], first: u32) {
        const LANES: usize = 16;
        // Until the first cut every candidate enters, NaN included.
        let mut start = 0;
        while !self.full && start < row.len() {
            self.push(row[start], first + start as u32);
            start += 1;
        }
        // From then on only a score above the floor can (a NaN, ranked as -inf, never does).
        let (rest, first) = (&row[start..], first + start as u32);
        let mut chunks = rest.chunks_exact(LANES);
        for (c, chunk) in chunks.by_ref().enumerate() {
            let floor = self.floor;
            if chunk.iter().fold(false, |hit, &s| hit | (s > floor)) {
                self.offer(chunk, first + (c * LANES) as u32);
            }
        }
        let tail = chunks.remainder();
        self.offer(tail, first + (rest.len() - tail.len()) as u32);
    }

    /// Offers `scores[i]` as pool row `first + i` once the buffer has been cut.
    fn offer(&mut self, scores: &[f32], first: u32) {
        for (i, &s) in scores.iter().enumerate() {
            if s > self.floor {
                self.push(s, first + i as u32);
            }
        }
    }

    fn push(&mut self, score: f32, id: u32) {
        self.buf.push(Candidate { score, id });
        if self.buf.len() == 2 * self.k {
            self.buf.select_nth_unstable_by(self.k - 1, order);
            self.buf.truncate(self.k);
            self.floor = key(self.buf[self.k - 1].score);
            self.full = true;
        }
    }

    /// The best `min(k, seen)` candidates, best first.
    fn finish(mut self) -> Vec<Candidate> {
        self.buf.sort_unstable_by(order);
        self.buf.truncate(self.k);
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::RowRng;

    /// Uniform in [-1, 1), seeded.
    fn uniform(n: usize, seed: u64) -> Vec<f32> {
        let mut r = RowRng::new(seed, "knn-test", "uniform");
        (0..n).map(|_| (r.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0).collect()
    }

    /// Integers in -3..=3, seeded: every dot product is exact in f32, and many tie.
    fn small_ints(n: usize, seed: u64) -> Vec<f32> {
        let mut r = RowRng::new(seed, "knn-test", "ints");
        (0..n).map(|_| r.below(7) as f32 - 3.0).collect()
    }

    fn dot64(a: &[f32], b: &[f32]) -> f64 {
        a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
    }

    /// Bound on the f32 rounding error of a dot product, whatever the summation order:
    /// `dim * 2^-24 * sum |a_i b_i|` (with a little slack for the `1 / (1 - n u)` factor).
    fn tolerance(a: &[f32], b: &[f32]) -> f64 {
        let abs: f64 = a.iter().zip(b).map(|(&x, &y)| (x as f64 * y as f64).abs()).sum();
        1.01 * a.len() as f64 * f64::powi(2.0, -24) * abs
    }

    /// All dot products in f64, fully sorted by (score descending, index ascending), first `k`.
    /// NumPy: `s = q.astype(np.float64) @ p.astype(np.float64).T`,
    /// `np.lexsort((np.arange(len(p)), -s[i]))[:k]` for each query `i`.
    fn brute_force(queries: &[f32], pool: &[f32], dim: usize, k: usize) -> Vec<Vec<(f64, u32)>> {
        queries
            .chunks(dim)
            .map(|q| {
                let mut s: Vec<(f64, u32)> =
                    pool.chunks(dim).enumerate().map(|(j, p)| (dot64(q, p), j as u32)).collect();
                s.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                s.truncate(k);
                s
            })
            .collect()
    }

    /// `got` against the brute-force reference: the same ids, except that two rows whose exact
    /// scores lie within f32 rounding of each other may swap; scores are the dot products up to
    /// f32 rounding.
    fn check_against_reference(queries: &[f32], pool: &[f32], dim: usize, k: usize, got: &TopK) {
        let expect = brute_force(queries, pool, dim, k);
        assert_eq!(got.k, k.min(pool.len() / dim));
        assert_eq!(got.queries(), expect.len());
        for (q, e) in expect.iter().enumerate() {
            let query = &queries[q * dim..(q + 1) * dim];
            let row = |id: u32| &pool[id as usize * dim..(id as usize + 1) * dim];
            for (j, (&id, &score)) in got.ids_of(q).iter().zip(got.scores_of(q)).enumerate() {
                let exact = dot64(query, row(id));
                assert!((score as f64 - exact).abs() <= tolerance(query, row(id)), "query {q} rank {j}");
                let want = e[j].1;
                if id != want {
                    let gap = (exact - e[j].0).abs();
                    let tol = tolerance(query, row(id)) + tolerance(query, row(want));
                    assert!(gap <= tol, "query {q} rank {j}: got {id}, want {want} (gap {gap:e} > {tol:e})");
                }
            }
            let mut distinct = got.ids_of(q).to_vec();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(distinct.len(), got.k, "query {q}: repeated ids");
        }
    }

    #[test]
    fn matches_brute_force_on_random_shapes() {
        // (queries, pool rows, dim, k): queries not a multiple of the block, several pool blocks
        // with a short last one, np < k, np = k, k = 1, odd dims, one query, dim 768 (two depth
        // chunks in gemm), a pool smaller than MIN_POOL_ROWS.
        let shapes = [
            (700, 2500, 17, 10),
            (5, 7, 8, 10),
            (3, 10, 5, 10),
            (257, 300, 33, 1),
            (1, 2100, 31, 5),
            (40, 600, 768, 10),
            (70, 100, 3, 100),
            (2, 1, 1, 3),
        ];
        for (i, &(nq, np, dim, k)) in shapes.iter().enumerate() {
            let q = uniform(nq * dim, 2 * i as u64);
            let p = uniform(np * dim, 2 * i as u64 + 1);
            check_against_reference(&q, &p, dim, k, &exact_top_k(&q, &p, dim, k));
        }
    }

    #[test]
    fn device_path_matches_brute_force_across_blocks() {
        // On the CPU device: the same search through burn's matmul and top-k, in blocks small
        // enough that every query's list is merged from several pool blocks and query blocks.
        let device = burn::tensor::Device::flex();
        for (nq, np, dim, k, blocks) in
            [(13, 200, 24, 5, [4, 37]), (7, 50, 3, 10, [7, 64]), (3, 9, 8, 20, [2, 4]), (20, 300, 64, 1, [16, 1000])]
        {
            let queries = uniform(nq * dim, 7 + nq as u64);
            let pool = uniform(np * dim, 11 + np as u64);
            // Chunks of 8 and 3 take the two-stage top-k on blocks of whole chunks, and the
            // single stage on the rest.
            for chunk in [DEVICE_TOP_K_CHUNK, 8, 3] {
                let blocking = Blocking { queries: blocks[0], pool: blocks[1] };
                let got = device_top_k_chunked(&queries, &pool, dim, k, &device, blocking, chunk);
                check_against_reference(&queries, &pool, dim, k, &got);
                assert_eq!(got.ids, exact_top_k(&queries, &pool, dim, k).ids, "{nq}x{np}x{dim} k={k} chunk {chunk}");
            }
        }
        // A query whose 10 nearest rows are 16..26, so one chunk of 8 holds 8 of its top 10:
        // each chunk must keep min(k, chunk) rows, not fewer.
        let (dim, k) = (6, 10);
        let queries = uniform(3 * dim, 5);
        let mut pool = uniform(200 * dim, 6);
        for (j, row) in pool.chunks_mut(dim).enumerate().skip(16).take(10) {
            for (x, q) in row.iter_mut().zip(&queries[..dim]) {
                *x = 4.0 * q + 0.01 * j as f32;
            }
        }
        let blocking = Blocking { queries: 2, pool: 64 };
        let got = device_top_k_chunked(&queries, &pool, dim, k, &device, blocking, 8);
        assert_eq!(got.ids_of(0).iter().filter(|&&i| (16..26).contains(&i)).count(), 10, "{:?}", got.ids_of(0));
        assert_eq!(got.ids, exact_top_k(&queries, &pool, dim, k).ids);
        assert_eq!(device_top_k(&[], &uniform(8, 1), 4, 3, &device).ids.len(), 0);
    }

    #[test]
    fn ties_come_out_by_ascending_index() {
        // Integer vectors: exact scores, so ids and scores must equal the reference exactly —
        // including the order among the many equal scores. Rows 60.. repeat rows 0..60.
        let (nq, np, dim, k) = (90, 1500, 9, 25);
        let q = small_ints(nq * dim, 1);
        let mut p = small_ints(np * dim, 2);
        for j in 60..np {
            p.copy_within((j % 60) * dim..(j % 60 + 1) * dim, j * dim);
        }
        let got = exact_top_k(&q, &p, dim, k);
        for (qi, e) in brute_force(&q, &p, dim, k).iter().enumerate() {
            assert_eq!(got.ids_of(qi), e.iter().map(|x| x.1).collect::<Vec<_>>(), "query {qi}");
            assert_eq!(got.scores_of(qi), e.iter().map(|x| x.0 as f32).collect::<Vec<_>>(), "query {qi}");
        }
        // A duplicated row's copies sit next to each other, lowest index first.
        for qi in 0..nq {
            assert!(got.ids_of(qi).windows(2).all(|w| w[0] % 60 != w[1] % 60 || w[0] < w[1]));
        }
    }

    fn bits(r: &TopK) -> (Vec<u32>, Vec<u32>) {
        (r.ids.clone(), r.scores.iter().map(|s| s.to_bits()).collect())
    }

    #[test]
    fn same_bits_for_any_thread_count() {
        // 600 queries make 2 query blocks, so the pool (12 blocks) is also split into parts: 8
        // for 1 thread, 12 for 3.
        let (nq, np, dim, k) = (600, 12_000, 12, 7);
        let (q, p) = (uniform(nq * dim, 10), uniform(np * dim, 11));
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| exact_top_k(&q, &p, dim, k))
        };
        // (The merge of parts is checked against the reference in the first test.)
        assert_eq!(bits(&run(1)), bits(&run(3)));
    }

    #[test]
    fn same_bits_whatever_the_query_grouping() {
        // The mining stage embeds queries in chunks: any split gives the same scores and ids,
        // for a pool of several blocks and for a padded small pool.
        for (np, seed) in [(2300, 20), (40, 30)] {
            let (nq, dim, k) = (600, 19, 6);
            let (q, p) = (uniform(nq * dim, seed), uniform(np * dim, seed + 1));
            let whole = exact_top_k(&q, &p, dim, k);
            let mut pieces = TopK { k, ..TopK::default() };
            let mut at = 0;
            for len in [1, 2, 3, 511, 44, 39] {
                let r = exact_top_k(&q[at * dim..(at + len) * dim], &p, dim, k);
                pieces.ids.extend(r.ids);
                pieces.scores.extend(r.scores);
                at += len;
            }
            assert_eq!(at, nq);
            assert_eq!(bits(&whole), bits(&pieces), "pool of {np}");
        }
    }

    #[test]
    fn nan_scores_rank_lowest_by_index() {
        // Rows 1 and 3 hold a NaN: their scores are NaN and they come last, in index order.
        let dim = 4;
        let mut p = uniform(6 * dim, 40);
        p[dim] = f32::NAN;
        p[3 * dim + 2] = f32::NAN;
        let q = uniform(2 * dim, 41);
        let r = exact_top_k(&q, &p, dim, 6);
        for qi in 0..2 {
            assert_eq!(&r.ids_of(qi)[4..], &[1, 3]);
            assert!(r.scores_of(qi)[4..].iter().all(|s| s.is_nan()));
            assert!(r.scores_of(qi)[..4].windows(2).all(|w| w[0] >= w[1]));
        }
        // With k below the finite rows, no NaN is returned.
        let r = exact_top_k(&q, &p, dim, 3);
        assert!(r.scores.iter().all(|s| s.is_finite()));
    }

    #[test]
    fn empty_inputs_give_empty_results() {
        let q = uniform(6, 50);
        assert_eq!(exact_top_k(&q, &[], 3, 5), TopK { k: 0, ids: vec![], scores: vec![] });
        assert_eq!(exact_top_k(&q, &q, 3, 0).ids, Vec::<u32>::new());
        let r = exact_top_k(&[], &q, 3, 1);
        assert_eq!((r.k, r.queries()), (1, 0));
    }
}
