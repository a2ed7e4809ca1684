//! ECCV Caption metrics (spec §4.5; PCME++ §4, "ECCV Caption" Chun et al. 2022): mAP@R,
//! R-Precision and recall@K over the package's `eccv_image_to_caption.json` (1,261 image
//! queries) and `eccv_caption_to_image.json` (1,332 caption queries), ranked against the full
//! COCO 5K galleries.
//!
//! For a query with `R` distinct positives (counting those absent from the gallery, which can
//! never be retrieved) whose present positives sit at 0-based ranks `ρ_1 < ρ_2 < ...` of a
//! gallery of `n` items, with `prec(r)` = positives among the first `r` items / `min(r, n)`
//! (the package's set-based precision):
//! `AP@R = (1/R) Σ_{i: ρ_i < R} i / (ρ_i + 1)` (i 1-based), `RP = #{ρ_i < R} / min(R, n)`,
//! `R@K = [ρ_1 < K]`. Each is averaged over the file's queries. Where `R > n` the package
//! indexes past its list and fails; the formulas above extend it.

use super::{eccv_need, resolve, Direction, Index, Pair, PositivePairs, Query};
use crate::error::{Error, Result};

/// The ECCV Caption queries of both directions, resolved to gallery rows.
#[derive(Debug, Clone)]
pub struct EccvPlan {
    pub i2t: Vec<Query>,
    pub t2i: Vec<Query>,
    absent: usize,
}

/// Resolves the ECCV files and asks for the ranks of their positives.
pub fn plan(
    i2t_pairs: &PositivePairs,
    t2i_pairs: &PositivePairs,
    index: &Index,
    i2t: &mut Direction,
    t2i: &mut Direction,
) -> Result<EccvPlan> {
    let (qi, ai) =
        resolve(i2t_pairs, "eccv_image_to_caption.json", &index.image_row, &index.caption_row, i2t, eccv_need)?;
    let (qt, at) =
        resolve(t2i_pairs, "eccv_caption_to_image.json", &index.caption_row, &index.image_row, t2i, eccv_need)?;
    for (name, pairs) in [("eccv_image_to_caption.json", i2t_pairs), ("eccv_caption_to_image.json", t2i_pairs)] {
        if let Some((q, _)) = pairs.0.iter().find(|(_, ids)| ids.is_empty()) {
            // R = 0 leaves mAP@R and R-Precision undefined (the package divides by zero).
            return Err(Error::data(format!("`{name}`: query {q} has no positives")));
        }
    }
    Ok(EccvPlan { i2t: qi, t2i: qt, absent: ai + at })
}

/// Per-query ECCV values: (AP@R, R-Precision, best rank).
///
/// `ranks`: 0-based ranks of the present positives (any order); `r`: distinct positives, present
/// or not (≥ 1); `n`: gallery size.
pub fn query_scores(ranks: &mut [u32], r: usize, n: usize) -> (f64, f64, Option<u32>) {
    ranks.sort_unstable();
    let mut ap = 0.0;
    let mut hits = 0usize;
    for (i, &rho) in ranks.iter().enumerate() {
        if (rho as usize) < r {
            ap += (i + 1) as f64 / (rho as f64 + 1.0);
            hits += 1;
        }
    }
    let rp = hits as f64 / r.min(n).max(1) as f64;
    (ap / r as f64, rp, ranks.first().copied())
}

impl EccvPlan {
    /// Positives (both files) absent from the galleries.
    pub fn absent(&self) -> usize {
        self.absent
    }

    fn direction(queries: &[Query], dir: &Direction) -> [Option<f64>; 5] {
        if queries.is_empty() {
            return [None; 5];
        }
        let mut sums = [0.0f64; 5];
        for q in queries {
            let mut ranks: Vec<u32> = q.positives.iter().map(|&t| dir.rank(q.row, t)).collect();
            let (ap, rp, best) = query_scores(&mut ranks, q.n_positives, dir.gallery_len());
            sums[0] += ap;
            sums[1] += rp;
            for (s, k) in sums[2..].iter_mut().zip(super::KS) {
                *s += best.is_some_and(|b| b < k) as u32 as f64;
            }
        }
        sums.map(|s| Some(s / queries.len() as f64))
    }

    /// Appends `eccv_map_at_r`, `eccv_rprecision`, `eccv_r1`, `eccv_r5`, `eccv_r10`.
    pub fn metrics(&self, i2t: &Direction, t2i: &Direction, metrics: &mut Vec<(String, Pair)>) {
        let (a, b) = (Self::direction(&self.i2t, i2t), Self::direction(&self.t2i, t2i));
        let names = ["eccv_map_at_r", "eccv_rprecision", "eccv_r1", "eccv_r5", "eccv_r10"];
        for (k, name) in names.iter().enumerate() {
            metrics.push((name.to_string(), Pair { i2t: a[k], t2i: b[k] }));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_test_vector() {
        // Spec §4.5 (checked with eccv_caption._metrics.compute_eccv_metrics): lists
        // {1:[10..16], 2:[21,20,22,23], 3:[30,31]}, GT {1:[10,12,15], 2:[20], 3:[31,99]}.
        let q1 = query_scores(&mut [0, 2, 5], 3, 7);
        let q2 = query_scores(&mut [1], 1, 4);
        let q3 = query_scores(&mut [1], 2, 2); // 99 is absent: R = 2
        let mean = |f: fn(&(f64, f64, Option<u32>)) -> f64| [q1, q2, q3].iter().map(f).sum::<f64>() / 3.0;
        assert!((mean(|q| q.0) - 0.26851851851851855).abs() < 1e-15);
        assert!((mean(|q| q.1) - 0.3888888888888889).abs() < 1e-15);
        assert_eq!([q1.2, q2.2, q3.2], [Some(0), Some(1), Some(1)]);
    }
}
