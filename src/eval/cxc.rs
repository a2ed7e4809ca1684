//! CxC recall@K (spec §4.3): the COCO 5K galleries with the extended positives of Crisscrossed
//! Captions, read from the eccv-caption package's `cxc_image_to_caption.json` (5,000 image
//! queries) and `cxc_caption_to_image.json` (24,972 caption queries). A query hits at K when any
//! of its positives ranks below K in the full ranking; the query set is the file's keys.

use super::{recall, resolve, Direction, Index, Pair, PositivePairs, Query, CXC_NEED, KS};
use crate::error::Result;

/// The CxC queries of both directions, resolved to gallery rows.
#[derive(Debug, Clone)]
pub struct CxcPlan {
    pub i2t: Vec<Query>,
    pub t2i: Vec<Query>,
    absent: usize,
}

/// Resolves the CxC files and asks for the ranks of their positives.
pub fn plan(
    i2t_pairs: &PositivePairs,
    t2i_pairs: &PositivePairs,
    index: &Index,
    i2t: &mut Direction,
    t2i: &mut Direction,
) -> Result<CxcPlan> {
    let (qi, ai) =
        resolve(i2t_pairs, "cxc_image_to_caption.json", &index.image_row, &index.caption_row, i2t, |_| CXC_NEED)?;
    let (qt, at) =
        resolve(t2i_pairs, "cxc_caption_to_image.json", &index.caption_row, &index.image_row, t2i, |_| CXC_NEED)?;
    Ok(CxcPlan { i2t: qi, t2i: qt, absent: ai + at })
}

/// Best full-ranking position of each query's present positives.
pub fn best(queries: &[Query], dir: &Direction) -> Vec<Option<u32>> {
    queries.iter().map(|q| q.positives.iter().map(|&t| dir.rank(q.row, t)).min()).collect()
}

impl CxcPlan {
    /// Positives (both files) absent from the galleries.
    pub fn absent(&self) -> usize {
        self.absent
    }

    /// Appends `cxc_r{K}` and the best ranks for the plot.
    pub fn metrics(
        &self,
        i2t: &Direction,
        t2i: &Direction,
        metrics: &mut Vec<(String, Pair)>,
        best_ranks: &mut Vec<(String, Vec<Option<u32>>)>,
    ) {
        let (bi, bt) = (best(&self.i2t, i2t), best(&self.t2i, t2i));
        for k in KS {
            metrics.push((format!("cxc_r{k}"), Pair { i2t: recall(&bi, k), t2i: recall(&bt, k) }));
        }
        best_ranks.push(("CxC i2t".into(), bi));
        best_ranks.push(("CxC t2i".into(), bt));
    }
}
