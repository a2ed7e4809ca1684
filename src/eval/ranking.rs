//! Rankings for retrieval metrics (spec §4.2): the image x caption score matrix is computed once by
//! a blocked, multi-threaded matrix product (the `gemm` kernels burn's CPU backend uses; 500 MB
//! of f32 for COCO 5K x 25K) and serves both directions — i2t reads its rows, t2i its columns —
//! so the two directions see bit-identical scores, as with the reference's one similarity
//! matrix. The metrics read off
//! the position of each wanted gallery item in the query's full ranking — scores descending, ties
//! broken by ascending gallery position (a stable sort). Counting, for a target `t` with score
//! `v`, the items with `s_j > v` or (`s_j == v` and `j < t`) gives exactly its position in that
//! sorted list without sorting 25,000 scores per query, so no list is ever truncated (the
//! reference's top-50 lists under-count COCO 1K, spec §4.4). Queries are counted in blocks on the
//! rayon pool; the result does not depend on the thread count.

use rayon::prelude::*;

use super::embeddings::Matrix;

/// Queries counted together: a block of t2i queries (score columns) is transposed into a
/// `64 x 5,000` buffer first so that every count runs over contiguous memory.
const QUERY_BLOCK: usize = 64;

/// What to locate in the ranking of one query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Gallery indices whose ranks are wanted.
    pub targets: Vec<u32>,
    /// Index into the `subsets` passed to [`rank_rows`] / [`rank_columns`]: also rank the targets within that
    /// part of the gallery alone (the COCO 1K fold of the query).
    pub subset: Option<u32>,
}

/// Where the targets of one query landed, in the order of [`Request::targets`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ranks {
    /// 0-based position in the full ranking.
    pub full: Vec<u32>,
    /// 0-based position in the ranking restricted to the subset (empty without one).
    pub subset: Vec<u32>,
    /// Targets whose score another gallery item shares exactly (order decided by position).
    pub tied: u32,
}

/// Scores of `queries` against `gallery` (dot products), row-major, on the rayon pool.
///
/// # Shapes
/// `queries`: `[m, d]`, `gallery`: `[n, d]` -> `[m * n]` (row `i` = query `i`).
pub fn scores(queries: &Matrix, gallery: &Matrix) -> Vec<f32> {
    assert_eq!(queries.dim, gallery.dim, "queries and gallery differ in width");
    let (m, n, d) = (queries.rows, gallery.rows, gallery.dim);
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 || d == 0 {
        return out;
    }
    // SAFETY: the three buffers hold exactly m x d, d x n (the gallery read transposed: column j
    // is gallery row j) and m x n elements, and the strides address them within bounds; `out`
    // is written only (read_dst = false).
    unsafe {
        gemm::gemm(
            m,
            n,
            d,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            queries.data.as_ptr(),
            1,
            d as isize,
            gallery.data.as_ptr(),
            d as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
    out
}

/// Position of target `t` in the stable descending order of `row`, and whether another item has
/// exactly its score.
#[cfg(test)]
fn position(row: &[f32], t: usize) -> (u32, bool) {
    let mut p = Vec::new();
    let tied = positions(row, &[(row[t], t, true)], |j| j, &mut p);
    (p[0], tied > 0)
}

/// Positions in the stable descending order of `row` of targets given as (score, gallery index,
/// whether the target is itself an item of `row`), pushed to `out`; returns how many targets
/// share their score with another item. `index(j)` is the gallery index of `row[j]` (`row` may
/// be a subset gathered in ascending gallery order); an equal item ranks ahead of a target when
/// its gallery index is smaller.
///
/// Targets are taken eight at a time against one pass over the row (the inner loop over the
/// eight thresholds vectorises), counting items scoring strictly higher and items scoring equal.
/// Only when a tie exists is the row read again, for the equal items ahead of the target.
fn positions(row: &[f32], targets: &[(f32, usize, bool)], index: impl Fn(usize) -> usize, out: &mut Vec<u32>) -> u32 {
    const L: usize = 8;
    let mut tied = 0;
    for chunk in targets.chunks(L) {
        // Padding lanes compare against +inf: never exceeded, never equalled (scores are finite).
        let mut v = [f32::INFINITY; L];
        for (k, t) in chunk.iter().enumerate() {
            v[k] = t.0;
        }
        let (mut gt, mut eq) = ([0u32; L], [0u32; L]);
        for &x in row {
            for k in 0..L {
                gt[k] += (x > v[k]) as u32;
                eq[k] += (x == v[k]) as u32;
            }
        }
        for (k, &(score, key, in_row)) in chunk.iter().enumerate() {
            let mut p = gt[k];
            if eq[k] > in_row as u32 {
                tied += 1;
                p += row.iter().enumerate().filter(|&(j, &x)| x == score && index(j) < key).count() as u32;
            }
            out.push(p);
        }
    }
    tied
}

/// The ranks of one query's targets in its score row.
fn rank_row(row: &[f32], r: &Request, subsets: &[Vec<u32>]) -> Ranks {
    let mut out = Ranks::default();
    let targets: Vec<(f32, usize, bool)> = r.targets.iter().map(|&t| (row[t as usize], t as usize, true)).collect();
    out.tied = positions(row, &targets, |j| j, &mut out.full);
    if let Some(k) = r.subset {
        // The subset's scores gathered once, in ascending gallery order.
        let subset = &subsets[k as usize];
        let sub: Vec<f32> = subset.iter().map(|&j| row[j as usize]).collect();
        let targets: Vec<(f32, usize, bool)> =
            r.targets.iter().map(|&t| (row[t as usize], t as usize, subset.binary_search(&t).is_ok())).collect();
        positions(&sub, &targets, |j| subset[j] as usize, &mut out.subset);
    }
    out
}

/// Queries are the rows of `scores` (`cols` gallery items each): the positions of each query's
/// requested targets in its full ranking (and within its subset, if any).
///
/// # Shapes
/// `scores`: `[requests.len() * cols]`; `subsets`: ascending gallery index lists.
pub fn rank_rows(scores: &[f32], cols: usize, requests: &[Request], subsets: &[Vec<u32>]) -> Vec<Ranks> {
    assert_eq!(scores.len(), requests.len() * cols, "one request per score row");
    if cols == 0 {
        return vec![Ranks::default(); requests.len()];
    }
    requests.par_iter().zip(scores.par_chunks(cols)).map(|(r, row)| rank_row(row, r, subsets)).collect()
}

/// Queries are the columns of `scores` (`rows x requests.len()`): as [`rank_rows`] on its
/// transpose, without materialising it.
///
/// # Shapes
/// `scores`: `[rows * requests.len()]`; `subsets`: ascending row index lists.
pub fn rank_columns(scores: &[f32], rows: usize, requests: &[Request], subsets: &[Vec<u32>]) -> Vec<Ranks> {
    let cols = requests.len();
    assert_eq!(scores.len(), rows * cols, "one request per score column");
    let blocks: Vec<Vec<Ranks>> = requests
        .par_chunks(QUERY_BLOCK)
        .enumerate()
        .map(|(b, reqs)| {
            let (c0, w) = (b * QUERY_BLOCK, reqs.len());
            if reqs.iter().all(|r| r.targets.is_empty()) {
                return vec![Ranks::default(); w];
            }
            let mut t = vec![0.0f32; w * rows];
            for r in 0..rows {
                for (k, &x) in scores[r * cols + c0..r * cols + c0 + w].iter().enumerate() {
                    t[k * rows + r] = x;
                }
            }
            reqs.iter().enumerate().map(|(k, r)| rank_row(&t[k * rows..(k + 1) * rows], r, subsets)).collect()
        })
        .collect();
    blocks.into_iter().flatten().collect()
}

/// The first `k` gallery indices of one query's ranking (scores descending, ties by ascending
/// index): the list the reference package is given.
pub fn top_k(row: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..row.len() as u32).collect();
    let cmp = |a: &u32, b: &u32| row[*b as usize].total_cmp(&row[*a as usize]).then(a.cmp(b));
    let k = k.min(idx.len());
    if k < idx.len() && k > 0 {
        idx.select_nth_unstable_by(k - 1, cmp);
    }
    idx.truncate(k);
    idx.sort_by(cmp);
    idx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(rows: usize, dim: usize, v: &[f32]) -> Matrix {
        Matrix::new(rows, dim, v.to_vec())
    }

    #[test]
    fn blocked_scores_equal_naive_dot_products() {
        // 70 queries span two blocks; odd sizes exercise the kernels' edges.
        let (qn, gn, d) = (70, 13, 7);
        let q: Vec<f32> = (0..qn * d).map(|i| ((i * 37 % 17) as f32 - 8.0) / 8.0).collect();
        let g: Vec<f32> = (0..gn * d).map(|i| ((i * 11 % 13) as f32 - 6.0) / 4.0).collect();
        let s = scores(&m(qn, d, &q), &m(gn, d, &g));
        for i in 0..qn {
            for j in 0..gn {
                let naive: f32 = (0..d).map(|k| q[i * d + k] * g[j * d + k]).sum();
                assert_eq!(s[i * gn + j], naive, "({i}, {j})");
            }
        }
    }

    #[test]
    fn positions_follow_a_stable_descending_sort() {
        // np.argsort(-row, kind="stable") = [1, 3, 0, 2, 4]
        let row = [0.5f32, 0.9, 0.5, 0.7, 0.1];
        let order = top_k(&row, 5);
        assert_eq!(order, vec![1, 3, 0, 2, 4]);
        for (p, &t) in order.iter().enumerate() {
            assert_eq!(position(&row, t as usize).0, p as u32);
        }
        assert!(position(&row, 0).1 && position(&row, 2).1 && !position(&row, 1).1);
        // Within the subset {0, 2, 4}: [0, 2, 4]; target 3 (not in it) would come first.
        let r = rank_row(&row, &Request { targets: vec![2, 0, 4, 3], subset: Some(0) }, &[vec![0, 2, 4]]);
        assert_eq!((r.full, r.subset, r.tied), (vec![3, 2, 4, 1], vec![1, 0, 2, 0], 2));
        assert_eq!(top_k(&row, 2), vec![1, 3]);
    }

    #[test]
    fn rows_and_columns_match_top_k() {
        let (qn, gn, d) = (130, 40, 3);
        // Coarse values: many exact ties.
        let q: Vec<f32> = (0..qn * d).map(|i| ((i * 7 % 5) as f32 - 2.0) / 2.0).collect();
        let g: Vec<f32> = (0..gn * d).map(|i| ((i * 3 % 4) as f32 - 1.0) / 2.0).collect();
        let (qm, gm) = (m(qn, d, &q), m(gn, d, &g));
        let subsets = vec![(0..gn as u32).filter(|j| j % 3 == 0).collect::<Vec<u32>>()];
        let reqs: Vec<Request> =
            (0..qn).map(|i| Request { targets: vec![(i % gn) as u32, 0, 39], subset: Some(0) }).collect();
        let s = scores(&qm, &gm);
        let ranks = rank_rows(&s, gn, &reqs, &subsets);
        // The same scores read by columns: the transpose, computed the other way round.
        let st = scores(&gm, &qm);
        assert_eq!(rank_columns(&st, gn, &reqs, &subsets), ranks);
        for (i, r) in ranks.iter().enumerate() {
            let row = &s[i * gn..(i + 1) * gn];
            let full = top_k(row, gn);
            let sub: Vec<u32> = full.iter().copied().filter(|j| j % 3 == 0).collect();
            for (k, &t) in reqs[i].targets.iter().enumerate() {
                assert_eq!(full[r.full[k] as usize], t);
                let expect = sub
                    .iter()
                    .filter(|&&j| full.iter().position(|&x| x == j) < full.iter().position(|&x| x == t))
                    .count();
                assert_eq!(r.subset[k] as usize, expect);
            }
        }
    }
}
