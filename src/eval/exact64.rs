//! Float64 scores and their rankings: PCME++'s closed-form sampled distance (spec
//! `cusa-and-pcmepp.md` §3.11: "the reference computes it in float64 from float32
//! embeddings") and `--precision f64` for cosine and dot, where parity with numbers computed in
//! float64 matters (§4.2). A score is `scale · (x_i · y_j) − a_i − b_j` in float64, the product
//! from the float32 embeddings widened to float64 (gemm, image or caption row blocks of at
//! most [`BLOCK_SCORES`] scores at a time).
//!
//! Positions are counted as [`super::ranking`] counts them (scores descending, ties by gallery
//! position, [`Ranks`] in request order), from each query's whole row of scores, so every rank
//! is exact (the requests' [`super::ranking::Need`]s are not needed). Each direction scores its
//! own blocks: a pair's two scores may differ in the last bit, as no metric compares them.

use std::ops::Range;

use rayon::prelude::*;

use super::embeddings::Matrix;
use super::ranking::{Ranks, Request};

/// Scores per block (64 MB of f64).
const BLOCK_SCORES: usize = 1 << 23;

/// `score(i, j) = ((scale · (image_i · caption_j) − constant) − image_offset[i]) −
/// caption_offset[j]`, in that order in both directions.
#[derive(Debug, Clone, PartialEq)]
pub struct Scoring64 {
    pub scale: f64,
    pub constant: f64,
    pub image_offset: Vec<f64>,
    pub caption_offset: Vec<f64>,
}

impl Scoring64 {
    /// Plain dot products (cosine once the rows are normalised).
    pub fn dot(images: usize, captions: usize) -> Scoring64 {
        Scoring64 { scale: 1.0, constant: 0.0, image_offset: vec![0.0; images], caption_offset: vec![0.0; captions] }
    }

    /// PCME++'s `−d = 2 μ_v·μ_t − 2 − ‖σ²_v‖₁ − ‖σ²_t‖₁` for unit means, from each item's
    /// `‖σ²‖₁ = Σ_k exp(v_k)`. Summed left to right, it is bit for bit the negation of `d` as
    /// §3.2 writes it (`2 − 2 μ_v·μ_t + ‖σ²_v‖₁ + ‖σ²_t‖₁`), so exact ties fall as there.
    pub fn csd(image_uncertainty: &[f64], caption_uncertainty: &[f64]) -> Scoring64 {
        Scoring64 {
            scale: 2.0,
            constant: 2.0,
            image_offset: image_uncertainty.to_vec(),
            caption_offset: caption_uncertainty.to_vec(),
        }
    }

    fn score(&self, dot: f64, image: usize, caption: usize) -> f64 {
        ((self.scale * dot - self.constant) - self.image_offset[image]) - self.caption_offset[caption]
    }
}

/// The ranks of both directions, as [`super::ranking::rank`] returns them: i2t queries are the
/// image rows ranking the captions (subsets: ascending caption lists), t2i queries the caption
/// rows ranking the images (subsets: ranges of image rows).
///
/// # Shapes
/// `images`: `[m, d]`, `captions`: `[n, d]`; `i2t`: `[m]`, `t2i`: `[n]` -> (`[m]`, `[n]`).
pub fn rank(
    images: &Matrix,
    captions: &Matrix,
    scoring: &Scoring64,
    i2t: &[Request],
    t2i: &[Request],
    caption_subsets: &[Vec<u32>],
    image_subsets: &[Range<u32>],
) -> (Vec<Ranks>, Vec<Ranks>) {
    rank_in_blocks(images, captions, scoring, i2t, t2i, caption_subsets, image_subsets, BLOCK_SCORES)
}

/// [`rank`] with at most `block_scores` scores per block.
#[allow(clippy::too_many_arguments)]
fn rank_in_blocks(
    images: &Matrix,
    captions: &Matrix,
    scoring: &Scoring64,
    i2t: &[Request],
    t2i: &[Request],
    caption_subsets: &[Vec<u32>],
    image_subsets: &[Range<u32>],
    block_scores: usize,
) -> (Vec<Ranks>, Vec<Ranks>) {
    assert_eq!((i2t.len(), t2i.len()), (images.rows, captions.rows), "one request per query");
    assert_eq!(images.dim, captions.dim, "images and captions differ in width");
    assert_eq!((scoring.image_offset.len(), scoring.caption_offset.len()), (images.rows, captions.rows));
    let (x, y) = (widen(images), widen(captions));
    let d = images.dim;
    let caption_lists: Vec<&[u32]> = caption_subsets.iter().map(Vec::as_slice).collect();
    let i2t_ranks = direction(
        &x,
        (&y, captions.rows),
        d,
        |q, j, dot| scoring.score(dot, q, j),
        i2t,
        block_scores,
        |s| Subset::List(caption_lists[s as usize]),
    );
    let t2i_ranks = direction(
        &y,
        (&x, images.rows),
        d,
        |q, j, dot| scoring.score(dot, j, q),
        t2i,
        block_scores,
        |s| Subset::Range(image_subsets[s as usize].clone()),
    );
    (i2t_ranks, t2i_ranks)
}

/// A query's subset of the gallery.
enum Subset<'a> {
    List(&'a [u32]),
    Range(Range<u32>),
}

fn widen(m: &Matrix) -> Vec<f64> {
    m.data.par_iter().map(|&v| v as f64).collect()
}

/// One direction: the queries (rows of `queries`) rank the gallery (rows of `gallery`) by
/// `score(query, gallery item, dot product)`.
fn direction<'a>(
    queries: &[f64],
    (gallery, n): (&[f64], usize),
    d: usize,
    score: impl Fn(usize, usize, f64) -> f64 + Sync,
    requests: &[Request],
    block_scores: usize,
    subset: impl Fn(u32) -> Subset<'a> + Sync,
) -> Vec<Ranks> {
    let m = requests.len();
    if n == 0 {
        // Nothing to rank against: every target (there can be none) has no position.
        return vec![Ranks::default(); m];
    }
    let block = (block_scores / n).clamp(1, m.max(1));
    let mut out = Vec::with_capacity(m);
    let mut scores = vec![0f64; block * n];
    for start in (0..m).step_by(block) {
        let rows = block.min(m - start);
        let s = &mut scores[..rows * n];
        product(&queries[start * d..(start + rows) * d], gallery, rows, n, d, s);
        let ranks: Vec<Ranks> = s
            .par_chunks_mut(n)
            .take(rows)
            .enumerate()
            .map(|(k, row)| {
                let q = start + k;
                for (j, v) in row.iter_mut().enumerate() {
                    *v = score(q, j, *v);
                }
                count(row, &requests[q], requests[q].subset.map(&subset))
            })
            .collect();
        out.extend(ranks);
    }
    out
}

/// `out[i, j] = a_i · b_j` for `a`: `[m, d]`, `b`: `[n, d]` (row-major), in float64.
fn product(a: &[f64], b: &[f64], m: usize, n: usize, d: usize, out: &mut [f64]) {
    if m == 0 || n == 0 {
        return;
    }
    if d == 0 {
        out.fill(0.0);
        return;
    }
    // SAFETY: `a` holds m x d, `b` n x d (read transposed: column j is row j of `b`) and `out`
    // m x n values, and the strides address them within bounds; `out` is written only
    // (read_dst = false).
    unsafe {
        gemm::gemm(
            m,
            n,
            d,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            a.as_ptr(),
            1,
            d as isize,
            b.as_ptr(),
            d as isize,
            1,
            0.0f64,
            1.0f64,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(0),
        );
    }
}

/// Positions of the request's targets in `row`'s ranking, and in its subset's.
fn count(row: &[f64], request: &Request, subset: Option<Subset>) -> Ranks {
    let mut ranks = Ranks::default();
    for &t in &request.targets {
        let t = t as usize;
        let v = row[t];
        // Position: items scoring higher, then equal ones ahead in gallery order.
        let at = |j: usize, x: f64| x > v || (x == v && j < t);
        let full = row.iter().enumerate().filter(|&(j, &x)| at(j, x)).count();
        ranks.full.push(full as u32);
        if row.iter().enumerate().any(|(j, &x)| x == v && j != t) {
            ranks.tied += 1;
        }
        match &subset {
            Some(Subset::List(list)) => {
                ranks.subset.push(list.iter().filter(|&&j| at(j as usize, row[j as usize])).count() as u32)
            }
            Some(Subset::Range(r)) => {
                ranks.subset.push((r.start as usize..r.end as usize).filter(|&j| at(j, row[j])).count() as u32)
            }
            None => {}
        }
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::RowRng;

    /// Position of `t` in the stable descending sort of `scores` (by gallery order on ties).
    fn sorted_position(scores: &[f64], t: usize) -> u32 {
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order.iter().position(|&j| j == t).unwrap() as u32
    }

    #[test]
    fn ranks_equal_a_stable_sort_of_float64_scores_in_both_directions_and_subsets() {
        let mut rng = RowRng::new(5, "exact64", "x");
        let (m, n, d) = (7, 23, 5);
        // Values on a coarse grid, so that scores tie.
        let mut value = || (rng.below(5) as f32 - 2.0) * 0.5;
        let images = Matrix::new(m, d, (0..m * d).map(|_| value()).collect());
        let captions = Matrix::new(n, d, (0..n * d).map(|_| value()).collect());
        let (iu, cu): (Vec<f64>, Vec<f64>) =
            ((0..m).map(|i| (i % 3) as f64).collect(), (0..n).map(|j| (j % 4) as f64 * 0.5).collect());
        let scoring = Scoring64::csd(&iu, &cu);
        let score = |i: usize, j: usize| {
            let dot: f64 = images.row(i).iter().zip(captions.row(j)).map(|(&a, &b)| a as f64 * b as f64).sum();
            ((2.0 * dot - 2.0) - iu[i]) - cu[j]
        };
        let caption_subsets = vec![(0..n as u32).filter(|j| j % 2 == 0).collect::<Vec<_>>()];
        let image_subsets: Vec<Range<u32>> = std::iter::once(2..6).collect();
        let i2t: Vec<Request> =
            (0..m).map(|i| Request { targets: vec![(i * 3 % n) as u32, 0], subset: Some(0), need: vec![] }).collect();
        let t2i: Vec<Request> = (0..n)
            .map(|j| Request { targets: vec![(2 + j % 4) as u32], subset: (j % 2 == 0).then_some(0), need: vec![] })
            .collect();
        // Tiny blocks exercise the block loop too.
        for block_scores in [BLOCK_SCORES, 1, 50] {
            let (a, b) = rank_in_blocks(
                &images,
                &captions,
                &scoring,
                &i2t,
                &t2i,
                &caption_subsets,
                &image_subsets,
                block_scores,
            );
            let mut tied = 0;
            for i in 0..m {
                let row: Vec<f64> = (0..n).map(|j| score(i, j)).collect();
                for (k, &t) in i2t[i].targets.iter().enumerate() {
                    assert_eq!(a[i].full[k], sorted_position(&row, t as usize), "i2t {i} -> {t}");
                    let sub: Vec<f64> = caption_subsets[0].iter().map(|&j| row[j as usize]).collect();
                    let pos = caption_subsets[0].iter().position(|&j| j == t);
                    if let Some(p) = pos {
                        assert_eq!(a[i].subset[k], sorted_position(&sub, p), "i2t {i} -> {t} in its subset");
                    }
                }
                tied += a[i].tied;
            }
            for j in 0..n {
                let row: Vec<f64> = (0..m).map(|i| score(i, j)).collect();
                let t = t2i[j].targets[0] as usize;
                assert_eq!(b[j].full[0], sorted_position(&row, t), "t2i {j} -> {t}");
                if t2i[j].subset.is_some() {
                    assert_eq!(b[j].subset[0], sorted_position(&row[2..6], t - 2), "t2i {j} in its subset");
                } else {
                    assert!(b[j].subset.is_empty());
                }
            }
            assert!(tied > 0, "the grid makes ties, and they are counted");
        }
    }

    #[test]
    fn float64_tells_apart_what_float32_rounds_together() {
        // 1 + 2^-30 and 1 are one float32 but two float64 scores: float64 ranks the larger first.
        let images = Matrix::new(1, 2, vec![1.0, 1.0]);
        let captions = Matrix::new(2, 2, vec![1.0, 0.0, 1.0, (2f64.powi(-30)) as f32]);
        let req = vec![Request { targets: vec![0, 1], subset: None, need: vec![] }];
        let t2i = vec![Request::default(), Request::default()];
        let (a, _) = rank(&images, &captions, &Scoring64::dot(1, 2), &req, &t2i, &[], &[]);
        assert_eq!((a[0].full.clone(), a[0].tied), (vec![1, 0], 0));
    }

    #[test]
    fn csd_scores_are_the_bitwise_negation_of_d_as_the_spec_sums_it() {
        // d = 2 − 2 μ_v·μ_t + ‖σ²_v‖₁ + ‖σ²_t‖₁, left to right (§3.2); a tie in d is a tie here.
        let mut rng = RowRng::new(9, "csd", "order");
        let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        for _ in 0..100_000 {
            let (dot, ui, uj) = (2.0 * unit() - 1.0, 3.0 * unit(), 3.0 * unit());
            let s = Scoring64::csd(&[ui], &[uj]);
            let d = ((2.0 - 2.0 * dot) + ui) + uj;
            assert_eq!(s.score(dot, 0, 0).to_bits(), (-d).to_bits(), "{dot} {ui} {uj}");
        }
    }

    #[test]
    fn an_empty_gallery_gives_every_query_its_empty_ranks() {
        let images = Matrix::new(2, 3, vec![1.0; 6]);
        let captions = Matrix::new(0, 3, vec![]);
        let i2t = vec![Request::default(), Request::default()];
        let (a, b) = rank(&images, &captions, &Scoring64::dot(2, 0), &i2t, &[], &[], &[]);
        assert_eq!((a.len(), b.len()), (2, 0));
    }
}
