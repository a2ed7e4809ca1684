//! Rankings for retrieval metrics (spec §4.2): every query is scored against the whole gallery by
//! blocked matrix products (the `gemm` kernels burn's CPU backend uses), and the metrics read off
//! the position of each wanted gallery item in the query's full ranking — scores descending, ties
//! broken by ascending gallery position (a stable sort). Counting, for a target `t` with score
//! `v`, the items with `s_j > v` or (`s_j == v` and `j < t`) gives exactly its position in that
//! sorted list without sorting 25,000 scores per query, so no list is ever truncated (the
//! reference's top-50 lists under-count COCO 1K, spec §4.4). Query blocks run on the rayon pool;
//! the result does not depend on the thread count.

use rayon::prelude::*;

use super::embeddings::Matrix;

/// Query rows scored together: the block's scores (`64 x 25,000` f32 = 6.4 MB) stay in cache
/// while the targets are counted, and the gallery is packed once per block.
const QUERY_BLOCK: usize = 64;

/// What to locate in the ranking of one query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// Gallery indices whose ranks are wanted.
    pub targets: Vec<u32>,
    /// Index into the `subsets` passed to [`rank_targets`]: also rank the targets within that
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

/// Scores of `queries` against `gallery` (dot products), row-major.
///
/// # Shapes
/// `queries`: `[m, d]`, `gallery`: `[n, d]` -> `[m * n]` (row `i` = query `i`).
pub fn scores(queries: &Matrix, gallery: &Matrix) -> Vec<f32> {
    let mut out = vec![0.0f32; queries.rows * gallery.rows];
    score_block(&queries.data, queries.rows, gallery, &mut out);
    out
}

/// `out[i * n + j] = q_i . g_j` for the `m` query rows in `q`.
///
/// # Shapes
/// `q`: `[m * d]`, `gallery`: `[n, d]`, `out`: `[m * n]`.
fn score_block(q: &[f32], m: usize, gallery: &Matrix, out: &mut [f32]) {
    let (n, d) = (gallery.rows, gallery.dim);
    assert_eq!(q.len(), m * d);
    assert_eq!(out.len(), m * n);
    assert_eq!(gallery.data.len(), n * d);
    if m == 0 || n == 0 {
        return;
    }
    if d == 0 {
        out.fill(0.0);
        return;
    }
    // SAFETY: the three buffers hold exactly m x d, d x n (the gallery read transposed: column j
    // is gallery row j) and m x n elements, as asserted above, and the strides address them
    // within bounds; `out` is written only (read_dst = false).
    unsafe {
        gemm::gemm(
            m,
            n,
            d,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            q.as_ptr(),
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
            gemm::Parallelism::None,
        );
    }
}

/// Position of target `t` in the stable descending order of `row`, and whether another item has
/// exactly its score.
fn position(row: &[f32], t: usize) -> (u32, bool) {
    let v = row[t];
    let before = row[..t].iter().map(|&x| (x >= v) as u32).sum::<u32>();
    let after = row[t + 1..].iter().map(|&x| (x > v) as u32).sum::<u32>();
    let equal = row.iter().map(|&x| (x == v) as u32).sum::<u32>();
    (before + after, equal > 1)
}

/// Position of target `t` among the gallery items `subset` (ascending indices, containing `t` or
/// not) in the same stable descending order.
fn position_within(row: &[f32], subset: &[u32], t: usize) -> u32 {
    let v = row[t];
    subset
        .iter()
        .map(|&j| {
            let x = row[j as usize];
            (x > v || (x == v && (j as usize) < t)) as u32
        })
        .sum()
}

/// For every query, the positions of its requested targets in its full ranking over `gallery`
/// (and within its subset, if any).
///
/// # Shapes
/// `queries`: `[m, d]`, `gallery`: `[n, d]`, `requests`: `m` entries; `subsets`: ascending gallery
/// index lists.
pub fn rank_targets(queries: &Matrix, gallery: &Matrix, requests: &[Request], subsets: &[Vec<u32>]) -> Vec<Ranks> {
    assert_eq!(requests.len(), queries.rows, "one request per query");
    assert_eq!(queries.dim, gallery.dim, "queries and gallery differ in width");
    let (n, d) = (gallery.rows, gallery.dim);
    let blocks: Vec<Vec<Ranks>> = requests
        .par_chunks(QUERY_BLOCK)
        .enumerate()
        .map(|(b, reqs)| {
            let first = b * QUERY_BLOCK;
            if reqs.iter().all(|r| r.targets.is_empty()) {
                return vec![Ranks::default(); reqs.len()];
            }
            let q = &queries.data[first * d..(first + reqs.len()) * d];
            let mut s = vec![0.0f32; reqs.len() * n];
            score_block(q, reqs.len(), gallery, &mut s);
            reqs.iter()
                .enumerate()
                .map(|(i, r)| {
                    let row = &s[i * n..(i + 1) * n];
                    let mut out = Ranks::default();
                    for &t in &r.targets {
                        let (p, tied) = position(row, t as usize);
                        out.full.push(p);
                        out.tied += tied as u32;
                        if let Some(k) = r.subset {
                            out.subset.push(position_within(row, &subsets[k as usize], t as usize));
                        }
                    }
                    out
                })
                .collect()
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
        // Within the subset {0, 2, 4}: [0, 2, 4].
        assert_eq!(position_within(&row, &[0, 2, 4], 2), 1);
        assert_eq!(position_within(&row, &[0, 2, 4], 0), 0);
        assert_eq!(top_k(&row, 2), vec![1, 3]);
    }

    #[test]
    fn rank_targets_matches_top_k_and_ignores_blocking() {
        let (qn, gn, d) = (130, 40, 3);
        // Coarse values: many exact ties.
        let q: Vec<f32> = (0..qn * d).map(|i| ((i * 7 % 5) as f32 - 2.0) / 2.0).collect();
        let g: Vec<f32> = (0..gn * d).map(|i| ((i * 3 % 4) as f32 - 1.0) / 2.0).collect();
        let (qm, gm) = (m(qn, d, &q), m(gn, d, &g));
        let subsets = vec![(0..gn as u32).filter(|j| j % 3 == 0).collect::<Vec<u32>>()];
        let reqs: Vec<Request> =
            (0..qn).map(|i| Request { targets: vec![(i % gn) as u32, 0, 39], subset: Some(0) }).collect();
        let ranks = rank_targets(&qm, &gm, &reqs, &subsets);
        let s = scores(&qm, &gm);
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
