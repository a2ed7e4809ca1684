//! COCO 5K and 1K recall@K (spec §4.3–4.4) with the ground truth of the caption table: a caption
//! is a positive of the image in its `coco_image_id`, and nothing else is.
//!
//! 5K: i2t queries are the images that have captions (hit when their best caption ranks below K
//! among all captions), t2i queries are all captions. 1K: the row order of the image table
//! defines five folds of `images / 5` consecutive rows (the Karpathy 5K test split in the
//! package's order gives its 1,000-image folds); each fold's queries rank only the fold's own
//! gallery — the full ranking filtered to the fold, order kept, as the package filters its lists
//! — and the 1K value is the mean of the fold values. Rows beyond `5 * (images / 5)` belong to
//! no fold; a fold without queries in a direction is left out of that direction's mean, and with
//! no such fold at all (fewer than five images) the 1K values are `null` (the package would
//! average NaNs).

use std::ops::Range;

use super::embeddings::{Captions, Images};
use super::{recall, Direction, Index, Pair, COCO_NEED, KS};

/// The COCO 1K folds of the image table's rows.
#[derive(Debug, Clone, Default)]
pub struct Folds {
    /// Fold of each image row, `None` for the rows past the last whole fold.
    pub image_fold: Vec<Option<u32>>,
    /// Per fold, its caption rows (ascending): the gallery of its i2t queries.
    pub caption_subsets: Vec<Vec<u32>>,
    /// Per fold, its image rows (a range): the gallery of its t2i queries.
    pub image_subsets: Vec<Range<u32>>,
    /// Captions whose fold by the caption table's order (five equal blocks of rows, spec §4.4's
    /// definition on the package's caption list) is not their image's fold by the image table's
    /// rows; counted when both tables split into five equal blocks.
    pub caption_order_disagreements: usize,
}

/// The number of COCO 1K folds.
pub const FOLDS: usize = 5;

impl Folds {
    pub fn new(images: &Images, captions: &Captions, index: &Index) -> Folds {
        let size = images.ids.len() / FOLDS;
        if size == 0 {
            return Folds { image_fold: vec![None; images.ids.len()], ..Folds::default() };
        }
        let image_fold: Vec<Option<u32>> =
            (0..images.ids.len()).map(|i| (i < size * FOLDS).then_some((i / size) as u32)).collect();
        let mut caption_subsets = vec![Vec::new(); FOLDS];
        for (c, im) in captions.image_ids.iter().enumerate() {
            if let Some(f) = image_fold[index.image_row[im] as usize] {
                caption_subsets[f as usize].push(c as u32);
            }
        }
        let image_subsets = (0..FOLDS).map(|f| (f * size) as u32..((f + 1) * size) as u32).collect();
        let n = captions.image_ids.len();
        let caption_order_disagreements = if n.is_multiple_of(FOLDS) && images.ids.len().is_multiple_of(FOLDS) {
            let block = n / FOLDS;
            (captions.image_ids.iter().enumerate())
                .filter(|(c, im)| image_fold[index.image_row[*im] as usize] != Some((c / block) as u32))
                .count()
        } else {
            0
        };
        Folds { image_fold, caption_subsets, image_subsets, caption_order_disagreements }
    }

    pub fn count(&self) -> usize {
        self.image_subsets.len()
    }

    /// Image rows in no fold.
    pub fn outside(&self) -> usize {
        self.image_fold.iter().filter(|f| f.is_none()).count()
    }
}

/// The COCO positives, by gallery row.
#[derive(Debug, Clone)]
pub struct CocoPlan {
    /// Per image row, its caption rows.
    captions_of: Vec<Vec<u32>>,
    /// Per caption row, its image row.
    image_of: Vec<u32>,
}

/// Gathers the COCO positives and asks for their ranks.
pub fn plan(images: &Images, captions: &Captions, index: &Index, i2t: &mut Direction, t2i: &mut Direction) -> CocoPlan {
    let mut captions_of = vec![Vec::new(); images.ids.len()];
    let mut image_of = Vec::with_capacity(captions.ids.len());
    for (c, im) in captions.image_ids.iter().enumerate() {
        let i = index.image_row[im];
        captions_of[i as usize].push(c as u32);
        image_of.push(i);
        i2t.want(i, c as u32, COCO_NEED);
        t2i.want(c as u32, i, COCO_NEED);
    }
    CocoPlan { captions_of, image_of }
}

impl CocoPlan {
    pub fn images_without_captions(&self) -> usize {
        self.captions_of.iter().filter(|c| c.is_empty()).count()
    }

    /// The fewest and most captions of an image that has any (`[0, 0]` for none).
    pub fn captions_per_image(&self) -> [usize; 2] {
        let counts = self.captions_of.iter().map(Vec::len).filter(|&n| n > 0);
        [counts.clone().min().unwrap_or(0), counts.max().unwrap_or(0)]
    }

    /// Best rank (full, or within the fold) of each i2t query among `rows`.
    fn i2t_best(&self, i2t: &Direction, rows: impl Iterator<Item = u32>, within: bool) -> Vec<Option<u32>> {
        rows.filter(|&i| !self.captions_of[i as usize].is_empty())
            .map(|i| {
                self.captions_of[i as usize]
                    .iter()
                    .map(|&c| if within { i2t.rank_within(i, c) } else { i2t.rank(i, c) })
                    .min()
            })
            .collect()
    }

    fn t2i_best(&self, t2i: &Direction, rows: impl Iterator<Item = u32>, within: bool) -> Vec<Option<u32>> {
        rows.map(|c| {
            let i = self.image_of[c as usize];
            Some(if within { t2i.rank_within(c, i) } else { t2i.rank(c, i) })
        })
        .collect()
    }

    /// Appends `coco_1k_r{K}` and `coco_5k_r{K}`, and the 5K best ranks for the plot.
    pub fn metrics(
        &self,
        folds: &Folds,
        i2t: &Direction,
        t2i: &Direction,
        metrics: &mut Vec<(String, Pair)>,
        best_ranks: &mut Vec<(String, Vec<Option<u32>>)>,
    ) {
        // Per fold: the best rank of each i2t query and of each t2i query.
        type BestRanks = (Vec<Option<u32>>, Vec<Option<u32>>);
        let per_fold: Vec<BestRanks> = (0..folds.count())
            .map(|f| {
                (
                    self.i2t_best(i2t, folds.image_subsets[f].clone(), true),
                    self.t2i_best(t2i, folds.caption_subsets[f].iter().copied(), true),
                )
            })
            .collect();
        let mean = |v: Vec<f64>| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
        for k in KS {
            let i = mean(per_fold.iter().filter_map(|(a, _)| recall(a, k)).collect());
            let t = mean(per_fold.iter().filter_map(|(_, b)| recall(b, k)).collect());
            metrics.push((format!("coco_1k_r{k}"), Pair { i2t: i, t2i: t }));
        }
        let all_i2t = self.i2t_best(i2t, 0..self.captions_of.len() as u32, false);
        let all_t2i = self.t2i_best(t2i, 0..self.image_of.len() as u32, false);
        for k in KS {
            metrics.push((format!("coco_5k_r{k}"), Pair { i2t: recall(&all_i2t, k), t2i: recall(&all_t2i, k) }));
        }
        best_ranks.push(("COCO i2t".into(), all_i2t));
        best_ranks.push(("COCO t2i".into(), all_t2i));
    }
}
