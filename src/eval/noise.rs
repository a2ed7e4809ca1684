//! OTTER's dataset-noise diagnostic (spec `bow-and-otter.md` §5.10, OTTER Table 1): how well a
//! frozen reference model pairs a data set's images and captions. Over random batches of `N`
//! pairs, `P = row-softmax(scale · Z_v Z_tᵀ)` of the L2-normalised image and caption embeddings;
//! per batch, *paired* = mean_i `P_ii`, *unpaired avg* = `Σ_{i≠j} P_ij / N²` (the reference
//! divides by N² with the diagonal zeroed), *unpaired max* = mean_i max_{j≠i} `P_ij`; each
//! averaged over the batches. `curate noise IMAGE_FEATURES TEXT_FEATURES` reads the embeddings
//! as the `encode_image` / `encode_text` stages write them (`sample_id`, `embedding`), joined by
//! `sample_id`.

use std::path::PathBuf;

use burn::tensor::activation::softmax;
use burn::tensor::{Device, Tensor, TensorData};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::models::pooling::l2_normalize;
use crate::rng::RowRng;

/// What to measure: batch size, number of batches, the softmax scale (100 in OTTER: CLIP's
/// temperature) and the seed of the batch draws.
#[derive(Debug, Clone, Serialize)]
pub struct NoiseConfig {
    pub batch_size: usize,
    pub batches: usize,
    pub scale: f32,
    pub seed: u64,
}

/// The diagnostic's three figures, averaged over the batches, and what they came from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NoiseReport {
    pub paired: f64,
    pub unpaired_avg: f64,
    pub unpaired_max: f64,
    /// Pairs with both an image and a caption embedding (the rows batches are drawn from).
    pub pairs: usize,
    /// Rows of one table whose `sample_id` the other lacks (left out).
    pub unmatched: [usize; 2],
}

/// The rows of batch `b`: `n` distinct rows of `0..rows`, drawn by a partial Fisher–Yates
/// shuffle seeded by (`seed`, `b`), so a batch does not depend on the others.
pub fn batch_rows(seed: u64, b: usize, rows: usize, n: usize) -> Vec<usize> {
    let mut rng = RowRng::new(seed, "noise", &b.to_string());
    let mut all: Vec<usize> = (0..rows).collect();
    for i in 0..n.min(rows) {
        let j = i + rng.below((rows - i) as u64) as usize;
        all.swap(i, j);
    }
    all.truncate(n.min(rows));
    all
}

/// The three per-batch figures of `p`, one batch's `[n, n]` row-softmax, row-major.
pub fn batch_figures(p: &[f32], n: usize) -> [f64; 3] {
    let (mut paired, mut unpaired, mut max) = (0.0, 0.0, 0.0);
    for i in 0..n {
        let row = &p[i * n..(i + 1) * n];
        paired += f64::from(row[i]);
        let others = row.iter().enumerate().filter(|&(j, _)| j != i).map(|(_, &v)| f64::from(v));
        unpaired += others.clone().sum::<f64>();
        max += others.fold(0.0, f64::max);
    }
    let n = n as f64;
    [paired / n, unpaired / (n * n), max / n]
}

/// Runs the diagnostic on `images` and `texts` (`[pairs * dim]` each, row `i` of both one
/// pair) on `device`.
pub fn diagnose(images: &[f32], texts: &[f32], dim: usize, c: &NoiseConfig, device: &Device) -> Result<[f64; 3]> {
    let rows = images.len() / dim;
    if c.batch_size < 2 || rows < c.batch_size {
        return Err(Error::data(format!(
            "batches of {} pairs need at least that many pairs (and 2), and there are {rows}",
            c.batch_size
        )));
    }
    if !(c.scale.is_finite() && c.scale > 0.0) {
        return Err(Error::Data {
            message: format!("`--scale` must be a positive number, got {}", c.scale),
            hint: Some("OTTER's is 100 (CLIP's temperature); a float32, so at most 3.4e38".into()),
        });
    }
    if c.batches == 0 {
        return Err(Error::data("`--batches` must be at least 1"));
    }
    let unit = |v: &[f32]| l2_normalize(Tensor::<2>::from_data(TensorData::new(v.to_vec(), [rows, dim]), device));
    let (zv, zt) = (unit(images), unit(texts));
    let mut sums = [0.0; 3];
    for b in 0..c.batches {
        let picked: Vec<i64> = batch_rows(c.seed, b, rows, c.batch_size).into_iter().map(|r| r as i64).collect();
        let index = Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(picked, [c.batch_size]), device);
        let (v, t) = (zv.clone().select(0, index.clone()), zt.clone().select(0, index));
        let p = softmax(v.matmul(t.transpose()).mul_scalar(c.scale), 1);
        let p = p.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?;
        for (s, f) in sums.iter_mut().zip(batch_figures(&p, c.batch_size)) {
            *s += f;
        }
    }
    Ok(sums.map(|s| s / c.batches as f64))
}

/// Reads the two features tables, joins them by `sample_id` (in id order) and
/// runs [`diagnose`].
pub fn run(
    image_features: &[PathBuf],
    text_features: &[PathBuf],
    c: &NoiseConfig,
    device: &Device,
) -> Result<NoiseReport> {
    let (images, di) = crate::train::data::read_features(image_features)?;
    let (texts, dt) = crate::train::data::read_features(text_features)?;
    if di != dt {
        return Err(Error::data(format!(
            "the image embeddings are {di}-d and the caption embeddings {dt}-d: one model's two towers embed alike"
        )));
    }
    let mut ids: Vec<&String> = images.keys().filter(|id| texts.contains_key(*id)).collect();
    // A fixed order (the tables' maps have none), so the draws are reproducible.
    ids.sort();
    let unmatched = [images.len() - ids.len(), texts.len() - ids.len()];
    // Tables that share no id (one keyed by path, the other by a number, say): their ids shown.
    if ids.is_empty() && !images.is_empty() && !texts.is_empty() {
        let some = |m: &std::collections::HashMap<String, Vec<f32>>| {
            let mut k: Vec<&String> = m.keys().collect();
            k.sort();
            k.iter().take(3).map(|id| format!("`{id}`")).collect::<Vec<_>>().join(", ")
        };
        return Err(Error::Data {
            message: format!(
                "the image and caption tables share no `sample_id`: images have {}, captions {}",
                some(&images),
                some(&texts)
            ),
            hint: Some(
                "a pair is an image row and a caption row of one `sample_id`, as the encode stages write".into(),
            ),
        });
    }
    let (mut v, mut t): (Vec<f32>, Vec<f32>) = (
        ids.iter().flat_map(|id| images[*id].iter().copied()).collect(),
        ids.iter().flat_map(|id| texts[*id].iter().copied()).collect(),
    );
    // Used L2-normalised: rows of any scale are as good.
    crate::models::pooling::scale_rows_for_normalising(&mut v, di);
    crate::models::pooling::scale_rows_for_normalising(&mut t, di);
    let [paired, unpaired_avg, unpaired_max] = diagnose(&v, &t, di, c, device)?;
    Ok(NoiseReport { paired, unpaired_avg, unpaired_max, pairs: ids.len(), unmatched })
}
