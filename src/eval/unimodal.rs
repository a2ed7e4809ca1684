//! CUSA's uni-modal evaluation (spec `cusa-and-pcmepp.md` §2.7; the paper's Table 3, image
//! retrieval R@1, and Table 4, STS): how well each tower alone orders its own modality once
//! USA has aligned it to the uni-modal teacher. It owns the two metrics ([`image_r1_single_set`],
//! [`image_r1_query_gallery`], [`spearman`]), the tables they read ([`UniImages`],
//! [`StsPairs`]) and the embedding of those tables with a trained run's **uni-modal heads**
//! ([`evaluate`]); `curate eval RUN_DIR --uni-images TABLE --sts TABLE` ([`super::trained`])
//! calls it beside the cross-modal retrieval, and [`super::report`] writes its
//! [`UniModalMetrics`] under `"unimodal"`.
//!
//! A run without uni-modal heads (every loss but CUSA) is scored with its cross-modal
//! embeddings, the baseline the paper compares against, and [`UniModalMetrics::heads`] says
//! which were used.
//!
//! - Image retrieval: embeddings L2-normalised, nearest neighbour by Euclidean distance (the
//!   highest cosine, on unit vectors), scored by the exact blocked search of [`crate::knn`]
//!   (float32 products). A single-set data set (CUB, SOP, iNaturalist) ranks every image
//!   against all the others, the query itself left out by its row (not by taking the second
//!   neighbour, which would drop a duplicate image instead of the query where the two tie);
//!   In-Shop ranks its `query` rows against its `gallery` rows. R@1 is the fraction of queries
//!   whose nearest neighbour has the query's label. Exact score ties go to the lower row (of the
//!   table, or of the gallery): the order is total, so the result does not depend on threads.
//! - STS: the cosine of the two sentences' embeddings (float64 dot products of the rows
//!   L2-normalised in float64), against the gold scores by Spearman's ρ, the Pearson correlation
//!   of the ranks with ties given their average rank (`scipy.stats.spearmanr`, which SentEval
//!   calls).

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::embeddings::Matrix;
use crate::error::{Error, Result};
use crate::train::trained::TrainedRun;

/// Which embeddings the uni-modal metrics were computed from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Heads {
    /// CUSA's uni-modal heads (`image_uni`, `text_uni`).
    Uni,
    /// The cross-modal embeddings, for a run without uni-modal heads (the paper's baselines).
    Cross,
}

impl Heads {
    pub fn name(self) -> &'static str {
        match self {
            Heads::Uni => "uni",
            Heads::Cross => "cross",
        }
    }
}

/// The uni-modal scores of one evaluation: `metrics.json`'s `"unimodal"` object. The image and
/// STS keys are there only for the tables that were given.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct UniModalMetrics {
    pub heads: Heads,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub image: Option<ImageMetrics>,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub sts: Option<StsMetrics>,
}

/// Image retrieval R@1 of `--uni-images`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ImageMetrics {
    /// Fraction of queries whose nearest neighbour shares their label.
    pub image_r1: f64,
    /// `single_set` (every image against all the others) or `query_gallery` (In-Shop).
    pub image_protocol: &'static str,
    pub image_queries: usize,
    /// Images searched: all of them (each query without itself), or the gallery rows.
    pub image_gallery: usize,
    /// Rows left out for a null `path`, `label` or `split`.
    pub image_rows_skipped: usize,
    /// Queries no other searched image shares the label of: never a hit, still counted.
    pub image_queries_without_positive: usize,
    /// Queries whose nearest neighbour's score another image equals exactly (the lower row won).
    pub image_ties: usize,
    /// Rows whose `path` an earlier row has too: such a query finds its twin (warned of).
    pub image_duplicate_paths: usize,
}

/// STS Spearman of `--sts`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StsMetrics {
    /// Spearman's ρ of cosine against the gold scores; `null` when every cosine is the same to
    /// within [`COSINE_ROUNDING`] (a model that embeds every sentence alike, or pairs of the same
    /// sentence twice), where ρ is undefined or ranks rounding noise.
    pub sts_spearman: Option<f64>,
    pub sts_pairs: usize,
    /// Pairs left out for a null sentence, score or dataset.
    pub sts_pairs_skipped: usize,
    /// With a `dataset` column (STS12-16's sub-sets in one table): ρ and pairs per dataset, and
    /// their mean and pair-weighted mean, as SentEval's `all` gives them (`sts_spearman` is then
    /// its pooled ρ). A dataset whose ρ is undefined makes the means `null`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sts_datasets: Option<std::collections::BTreeMap<String, StsDataset>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sts_spearman_mean: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sts_spearman_wmean: Option<f64>,
}

/// One dataset of an STS table with a `dataset` column.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StsDataset {
    pub spearman: Option<f64>,
    pub pairs: usize,
}

/// How far apart float32 cosines of one value can land by rounding alone (a 768-d dot product's
/// error is some 1e-7 · √768 ≈ 3e-6): cosines within it of each other count as equal when they
/// are all so.
pub const COSINE_ROUNDING: f64 = 1e-5;

/// [`spearman`] of cosines against gold scores, `None` where the cosines are all one value to
/// within [`COSINE_ROUNDING`].
fn cosine_spearman(cosines: &[f64], scores: &[f64]) -> Option<f64> {
    let (lo, hi) = cosines.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &c| (lo.min(c), hi.max(c)));
    if hi - lo <= COSINE_ROUNDING {
        return None;
    }
    spearman(cosines, scores)
}

impl StsMetrics {
    /// ρ of `cosines` against `pairs`' gold scores, pooled and (with datasets) per dataset.
    pub fn new(cosines: &[f64], pairs: &StsPairs) -> StsMetrics {
        let mut out = StsMetrics {
            sts_spearman: cosine_spearman(cosines, &pairs.scores),
            sts_pairs: pairs.scores.len(),
            sts_pairs_skipped: pairs.skipped,
            sts_datasets: None,
            sts_spearman_mean: None,
            sts_spearman_wmean: None,
        };
        let Some(names) = &pairs.datasets else { return out };
        let mut by: std::collections::BTreeMap<&str, (Vec<f64>, Vec<f64>)> = Default::default();
        for ((name, &c), &s) in names.iter().zip(cosines).zip(&pairs.scores) {
            let (cs, ss) = by.entry(name).or_default();
            cs.push(c);
            ss.push(s);
        }
        let sets: std::collections::BTreeMap<String, StsDataset> = by
            .into_iter()
            .map(|(name, (c, s))| (name.to_owned(), StsDataset { spearman: cosine_spearman(&c, &s), pairs: c.len() }))
            .collect();
        let all: Option<Vec<(f64, usize)>> = sets.values().map(|d| d.spearman.map(|r| (r, d.pairs))).collect();
        if let Some(all) = all {
            let n: usize = all.iter().map(|&(_, p)| p).sum();
            out.sts_spearman_mean = Some(all.iter().map(|&(r, _)| r).sum::<f64>() / all.len() as f64);
            out.sts_spearman_wmean = Some(all.iter().map(|&(r, p)| r * p as f64).sum::<f64>() / n as f64);
        }
        out.sts_datasets = Some(sets);
        out
    }
}

/// The R@1 of one search, with what the report says about it.
#[derive(Debug, Clone, PartialEq)]
pub struct NearestNeighbours {
    /// Each query's nearest neighbour: a row of the searched set.
    pub neighbours: Vec<u32>,
    pub hits: usize,
    pub gallery: usize,
    pub without_positive: usize,
    pub tied: usize,
}

impl NearestNeighbours {
    pub fn queries(&self) -> usize {
        self.neighbours.len()
    }

    /// R@1: hits over queries.
    pub fn r1(&self) -> f64 {
        self.hits as f64 / self.queries() as f64
    }
}

/// R@1 of a single-set data set (CUB, SOP, iNaturalist): each of the `labels.len()` images
/// (`rows`, one embedding of width `dim` each, L2-normalised here) is a query against all the
/// others, itself left out by its row; exact score ties go to the lower row.
///
/// # Shapes
/// `rows`: `[n * dim]`, `labels`: `[n]`.
pub fn image_r1_single_set(rows: &[f32], dim: usize, labels: &[u32]) -> Result<NearestNeighbours> {
    let n = labels.len();
    if n < 2 {
        return Err(Error::data(format!(
            "image retrieval needs at least 2 images to rank against each other, not {n}"
        )));
    }
    let unit = Matrix::new(n, dim, rows.to_vec()).l2_normalized();
    // The query itself, the nearest other and the runner-up (to see a tie).
    let top = crate::knn::exact_top_k(&unit.data, &unit.data, dim, 3);
    let mut per_class: FxHashMap<u32, usize> = FxHashMap::default();
    for &l in labels {
        *per_class.entry(l).or_default() += 1;
    }
    let mut out =
        NearestNeighbours { neighbours: Vec::with_capacity(n), hits: 0, gallery: n, without_positive: 0, tied: 0 };
    for q in 0..n {
        let others: Vec<(u32, f32)> = top
            .ids_of(q)
            .iter()
            .zip(top.scores_of(q))
            .filter(|(&id, _)| id as usize != q)
            .map(|(&id, &s)| (id, s))
            .collect();
        let (nearest, score) = others[0];
        out.neighbours.push(nearest);
        out.hits += usize::from(labels[nearest as usize] == labels[q]);
        out.without_positive += usize::from(per_class[&labels[q]] == 1);
        out.tied += usize::from(others.get(1).is_some_and(|o| o.1 == score));
    }
    Ok(out)
}

/// R@1 of a query set against a separate gallery (In-Shop): each query's nearest gallery image
/// (both sides L2-normalised here); exact score ties go to the lower gallery row.
///
/// # Shapes
/// `queries`: `[nq * dim]`, `query_labels`: `[nq]`, `gallery`: `[ng * dim]`, `gallery_labels`: `[ng]`.
pub fn image_r1_query_gallery(
    queries: &[f32],
    query_labels: &[u32],
    gallery: &[f32],
    gallery_labels: &[u32],
    dim: usize,
) -> Result<NearestNeighbours> {
    let (nq, ng) = (query_labels.len(), gallery_labels.len());
    if nq == 0 || ng == 0 {
        return Err(Error::data(format!(
            "query/gallery retrieval needs queries and a gallery to search: {nq} query and {ng} gallery image(s)"
        )));
    }
    let q = Matrix::new(nq, dim, queries.to_vec()).l2_normalized();
    let g = Matrix::new(ng, dim, gallery.to_vec()).l2_normalized();
    let top = crate::knn::exact_top_k(&q.data, &g.data, dim, 2);
    let in_gallery: rustc_hash::FxHashSet<u32> = gallery_labels.iter().copied().collect();
    let mut out =
        NearestNeighbours { neighbours: Vec::with_capacity(nq), hits: 0, gallery: ng, without_positive: 0, tied: 0 };
    for (i, &label) in query_labels.iter().enumerate() {
        let (ids, scores) = (top.ids_of(i), top.scores_of(i));
        out.neighbours.push(ids[0]);
        out.hits += usize::from(gallery_labels[ids[0] as usize] == label);
        out.without_positive += usize::from(!in_gallery.contains(&label));
        out.tied += usize::from(scores.get(1) == Some(&scores[0]));
    }
    Ok(out)
}

/// 1-based ranks of `x` in ascending order, tied values given the mean of the ranks they span
/// (`scipy.stats.rankdata(x, method="average")`). NaN-free input expected (ordered by
/// `total_cmp`).
pub fn average_ranks(x: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..x.len()).collect();
    order.sort_by(|&a, &b| x[a].total_cmp(&x[b]));
    let mut ranks = vec![0.0; x.len()];
    let mut start = 0;
    while start < order.len() {
        let mut end = start + 1;
        while end < order.len() && x[order[end]] == x[order[start]] {
            end += 1;
        }
        // Positions start..end (0-based) hold ranks start+1..=end: their mean.
        let mean = (start + 1 + end) as f64 / 2.0;
        for &i in &order[start..end] {
            ranks[i] = mean;
        }
        start = end;
    }
    ranks
}

/// Spearman's ρ: the Pearson correlation of [`average_ranks`] of `x` and of `y`
/// (`scipy.stats.spearmanr(x, y).statistic`). `None` when there are fewer than two values or
/// either side is constant (scipy: `nan`).
pub fn spearman(x: &[f64], y: &[f64]) -> Option<f64> {
    assert_eq!(x.len(), y.len(), "spearman: one y per x");
    if x.len() < 2 {
        return None;
    }
    let (rx, ry) = (average_ranks(x), average_ranks(y));
    let n = x.len() as f64;
    // Ranks 1..=n (averaged or not) always have mean (n + 1) / 2.
    let mean = (n + 1.0) / 2.0;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in rx.iter().zip(&ry) {
        let (a, b) = (a - mean, b - mean);
        sxy += a * b;
        sxx += a * a;
        syy += b * b;
    }
    if sxx == 0.0 || syy == 0.0 {
        return None;
    }
    Some((sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0))
}

/// Whether an image row is a query or in the gallery (In-Shop's `split` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Query,
    Gallery,
}

/// An image retrieval table (`--uni-images`): `path`, `label` (a string or an integer: images
/// of a class share it) and optionally `split` (`query` / `gallery`, In-Shop's protocol), in
/// row order. Rows with a null `path`, `label` or `split` are left out and counted.
#[derive(Debug, Clone, PartialEq)]
pub struct UniImages {
    pub file: PathBuf,
    pub paths: Vec<String>,
    /// Class index of each kept row (labels numbered as first met).
    pub labels: Vec<u32>,
    /// Each kept row's side when the table has a `split` column.
    pub split: Option<Vec<Side>>,
    pub skipped: usize,
}

impl UniImages {
    /// Reads and checks `file`: every missing column at once, an unknown `split` value (by row),
    /// fewer than 2 images, queries without a gallery or a gallery without queries.
    pub fn read(file: &Path) -> Result<UniImages> {
        let has_split = check_columns(file, &["path", "label"], "split")?;
        let batches = crate::io::parquet::read_file(file)?;
        let paths = strings(file, &batches, "path")?;
        let names = labels(file, &batches)?;
        let split = if has_split { Some(strings(file, &batches, "split")?) } else { None };
        let mut out = UniImages {
            file: file.to_owned(),
            paths: Vec::new(),
            labels: Vec::new(),
            split: split.as_ref().map(|_| Vec::new()),
            skipped: 0,
        };
        let mut classes: FxHashMap<String, u32> = FxHashMap::default();
        for (row, (path, name)) in paths.into_iter().zip(names).enumerate() {
            let side = match split.as_ref().map(|s| s[row].as_deref()) {
                None => None,
                Some(None) => {
                    out.skipped += 1;
                    continue;
                }
                Some(Some("query")) => Some(Side::Query),
                Some(Some("gallery")) => Some(Side::Gallery),
                Some(Some(other)) => {
                    return Err(Error::Data {
                        message: format!("`{}`: row {row} has `split` = `{other}`", file.display()),
                        hint: Some(
                            "`split` is `query` or `gallery` (In-Shop's protocol); leave the column out to rank \
                             every image against all the others"
                                .into(),
                        ),
                    })
                }
            };
            let (Some(path), Some(name)) = (path, name) else {
                out.skipped += 1;
                continue;
            };
            let next = classes.len() as u32;
            out.labels.push(*classes.entry(name).or_insert(next));
            out.paths.push(path);
            if let (Some(s), Some(side)) = (out.split.as_mut(), side) {
                s.push(side);
            }
        }
        let kept = out.labels.len();
        let skipped = |n: usize| match n {
            0 => String::new(),
            n => format!(" ({n} row(s) left out for a null `path`, `label` or `split`)"),
        };
        match &out.split {
            None if kept < 2 => Err(Error::Data {
                message: format!(
                    "`{}` has {kept} image(s){}: retrieval needs at least 2",
                    file.display(),
                    skipped(out.skipped)
                ),
                hint: None,
            }),
            Some(s) => {
                let queries = s.iter().filter(|&&x| x == Side::Query).count();
                let gallery = kept - queries;
                if queries == 0 || gallery == 0 {
                    return Err(Error::Data {
                        message: format!(
                            "`{}` has {queries} query and {gallery} gallery image(s){}: each query is searched \
                             in the gallery, so both are needed",
                            file.display(),
                            skipped(out.skipped)
                        ),
                        hint: Some(
                            "mark rows `split` = `query` and `gallery` (In-Shop), or leave out `split` to rank every \
                             image against all the others"
                                .into(),
                        ),
                    });
                }
                Ok(out)
            }
            None => Ok(out),
        }
    }

    /// The protocol's name in `metrics.json`.
    pub fn protocol(&self) -> &'static str {
        if self.split.is_some() {
            "query_gallery"
        } else {
            "single_set"
        }
    }

    /// R@1 of `rows` (one embedding per kept row, in order) under the table's protocol.
    ///
    /// # Shapes
    /// `rows`: `[self.paths.len() * dim]`.
    pub fn r1(&self, rows: &[f32], dim: usize) -> Result<NearestNeighbours> {
        let Some(split) = &self.split else {
            return image_r1_single_set(rows, dim, &self.labels);
        };
        let (mut q, mut ql, mut g, mut gl) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for ((row, &label), side) in rows.chunks(dim).zip(&self.labels).zip(split) {
            match side {
                Side::Query => {
                    q.extend_from_slice(row);
                    ql.push(label);
                }
                Side::Gallery => {
                    g.extend_from_slice(row);
                    gl.push(label);
                }
            }
        }
        image_r1_query_gallery(&q, &ql, &g, &gl, dim)
    }
}

/// Sentence pairs with gold similarity scores (`--sts`): `sentence1`, `sentence2` (strings) and
/// `score` (any numeric type), as STS12-16, STS-B and SICK-R are distributed. Pairs with a null
/// are left out and counted.
#[derive(Debug, Clone, PartialEq)]
pub struct StsPairs {
    pub file: PathBuf,
    /// The sentences as the text tower sees them (after `pre_caption` for a run trained so).
    pub sentence1: Vec<String>,
    pub sentence2: Vec<String>,
    pub scores: Vec<f64>,
    /// Each pair's `dataset` (an optional column: STS12-16's sub-sets in one table).
    pub datasets: Option<Vec<String>>,
    pub skipped: usize,
}

impl StsPairs {
    /// Reads and checks `file` (`pre_caption`: the run's `data.pre_caption`, which its retrieval
    /// captions get too): every missing column at once, a non-numeric or non-finite score, a
    /// sentence `pre_caption` empties (by row), fewer than 2 pairs, gold scores all equal.
    pub fn read(file: &Path, pre_caption: bool) -> Result<StsPairs> {
        let has_dataset = check_columns(file, &["sentence1", "sentence2", "score"], "dataset")?;
        let batches = crate::io::parquet::read_file(file)?;
        let (s1, s2) = (strings(file, &batches, "sentence1")?, strings(file, &batches, "sentence2")?);
        let scores = floats(file, &batches, "score")?;
        let dataset = if has_dataset { Some(strings(file, &batches, "dataset")?) } else { None };
        let mut out = StsPairs {
            file: file.to_owned(),
            sentence1: Vec::new(),
            sentence2: Vec::new(),
            scores: Vec::new(),
            datasets: has_dataset.then(Vec::new),
            skipped: 0,
        };
        let prepare = |row: usize, column: &str, text: String| -> Result<String> {
            if !pre_caption {
                return Ok(text);
            }
            crate::text::pre_caption(&text, crate::text::PRE_CAPTION_WORDS).ok_or_else(|| {
                Error::data(format!(
                    "`{column}` of row {row} of `{}` has nothing left after `pre_caption` (the run's `data.pre_caption`)",
                    file.display()
                ))
            })
        };
        for (row, ((a, b), score)) in s1.into_iter().zip(s2).zip(scores).enumerate() {
            let name = dataset.as_ref().map(|d| d[row].clone());
            let (Some(a), Some(b), Some(score), Some(name)) = (a, b, score, name.unwrap_or(Some(String::new()))) else {
                out.skipped += 1;
                continue;
            };
            if let Some(names) = &mut out.datasets {
                names.push(name);
            }
            if !score.is_finite() {
                return Err(Error::data(format!("`score` of row {row} of `{}` is {score}", file.display())));
            }
            out.sentence1.push(prepare(row, "sentence1", a)?);
            out.sentence2.push(prepare(row, "sentence2", b)?);
            out.scores.push(score);
        }
        let n = out.scores.len();
        if n < 2 {
            return Err(Error::data(format!(
                "`{}` has {n} sentence pair(s) with a score ({} left out for a null): Spearman's ρ needs at least 2",
                file.display(),
                out.skipped
            )));
        }
        if out.scores.iter().all(|&s| s == out.scores[0]) {
            return Err(Error::data(format!(
                "every gold `score` of `{}` is {}: Spearman's ρ is undefined for constant scores",
                file.display(),
                out.scores[0]
            )));
        }
        Ok(out)
    }
}

/// Embeds the tables with `run`'s uni-modal heads (its cross-modal embeddings when it has none)
/// and scores them. `images`: the table and the folder its relative paths resolve against (as
/// `--image-root` does for the retrieval set; none: as stored).
pub fn evaluate(
    run: &TrainedRun,
    images: Option<(&UniImages, Option<&Path>)>,
    sts: Option<&StsPairs>,
    note: &dyn Fn(String),
) -> Result<UniModalMetrics> {
    let heads = heads(run);
    let image = match images {
        None => None,
        Some((table, root)) => {
            note(format!(
                "uni-modal: embedding {} images (`{}`) with the {} heads",
                table.paths.len(),
                table.file.display(),
                heads.name()
            ));
            let rows = embed_image_table(run, &table.paths, root)?;
            let r = table.r1(&rows, run.dim())?;
            Some(ImageMetrics {
                image_r1: r.r1(),
                image_protocol: table.protocol(),
                image_queries: r.queries(),
                image_gallery: r.gallery,
                image_rows_skipped: table.skipped,
                image_queries_without_positive: r.without_positive,
                image_ties: r.tied,
                image_duplicate_paths: super::repeated_paths(&table.paths),
            })
        }
    };
    let sts = match sts {
        None => None,
        Some(pairs) => {
            note(format!(
                "uni-modal: embedding {} sentence pairs (`{}`) with the {} heads",
                pairs.scores.len(),
                pairs.file.display(),
                heads.name()
            ));
            let d = run.dim();
            let a = Matrix::new(pairs.scores.len(), d, embed_texts(run, &pairs.sentence1)?).l2_normalized();
            let b = Matrix::new(pairs.scores.len(), d, embed_texts(run, &pairs.sentence2)?).l2_normalized();
            let cosines: Vec<f64> =
                (0..a.rows).map(|i| a.row(i).iter().zip(b.row(i)).map(|(&x, &y)| x as f64 * y as f64).sum()).collect();
            if let Some(i) = cosines.iter().position(|c| !c.is_finite()) {
                return Err(Error::Model {
                    message: format!("the model's embeddings of STS pair {i} are not finite"),
                    hint: None,
                });
            }
            Some(StsMetrics::new(&cosines, pairs))
        }
    };
    Ok(UniModalMetrics { heads, image, sts })
}

/// [`Heads::Uni`] when the run has both uni-modal heads (a CUSA run).
pub fn heads(run: &TrainedRun) -> Heads {
    if run.model.image_uni.is_some() && run.model.text_uni.is_some() {
        Heads::Uni
    } else {
        Heads::Cross
    }
}

/// The images at `paths` (under `root` when given) through the evaluation view of the run's
/// transform, embedded by [`embed_images`], in batches of [`super::trained::IMAGE_BATCH`].
///
/// # Shapes
/// returns `[paths.len() * dim]`
fn embed_image_table(run: &TrainedRun, paths: &[String], root: Option<&Path>) -> Result<Vec<f32>> {
    super::trained::embed_image_paths(run, paths, root, |pixels, n| embed_images(run, pixels, n))
}

/// The uni-modal image embeddings of `n` preprocessed images, `uni(f) = Linear(LayerNorm(f))` on
/// the pooled features `f` (§2.1; the LayerNorm where the run has it), as
/// [`crate::train::dual_encoder::DualEncoder::forward`] computes `image_uni`; the cross-modal
/// ones for a run without uni-modal heads. Not normalised.
///
/// # Shapes
/// `pixels`: `[n * 3 * size * size]` → `[n * dim]`
pub fn embed_images(run: &TrainedRun, pixels: Vec<f32>, n: usize) -> Result<Vec<f32>> {
    match heads(run) {
        Heads::Cross => run.embed_images(pixels, n),
        Heads::Uni => Ok(run.embed_images_uni(pixels, n)?.expect("a run with uni-modal heads")),
    }
}

/// The uni-modal text embeddings of `texts` (through the run's tokenizer), as
/// [`embed_images`]; the cross-modal ones for a run without uni-modal heads. Not normalised.
///
/// # Shapes
/// returns `[texts.len() * dim]`
pub fn embed_texts(run: &TrainedRun, texts: &[String]) -> Result<Vec<f32>> {
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    match heads(run) {
        Heads::Cross => run.embed_texts(&refs),
        Heads::Uni => Ok(run.embed_texts_uni(&refs)?.expect("a run with uni-modal heads")),
    }
}

/// Checks `file`'s schema for the `required` columns (every missing one at once, with a "did
/// you mean") and says whether it has the optional column `optional`.
pub(super) fn check_columns(file: &Path, required: &[&str], optional: &str) -> Result<bool> {
    let schema = crate::io::parquet::read_schema(file)?;
    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
    let missing: Vec<&str> = required.iter().copied().filter(|c| !names.contains(c)).collect();
    if !missing.is_empty() {
        let list: Vec<String> = missing.iter().map(|c| format!("`{c}`")).collect();
        let have: Vec<String> = names.iter().map(|c| format!("`{c}`")).collect();
        let hints: Vec<String> =
            missing.iter().filter_map(|c| crate::error::did_you_mean(c, names.iter().copied())).collect();
        let need: Vec<String> = required.iter().map(|c| format!("`{c}`")).collect();
        return Err(Error::Schema {
            message: format!(
                "`{}` has no column {} (columns: {})",
                file.display(),
                list.join(", "),
                if have.is_empty() { "none".to_owned() } else { have.join(", ") }
            ),
            hint: Some(if hints.is_empty() {
                format!("the table needs {}", need.join(", "))
            } else {
                hints.join("; ")
            }),
        });
    }
    Ok(!optional.is_empty() && names.contains(&optional))
}

/// The column `name` of every batch.
fn column<'a>(batches: &'a [RecordBatch], name: &str) -> Vec<&'a dyn Array> {
    batches.iter().map(|b| b.column_by_name(name).expect("checked against the schema").as_ref()).collect()
}

/// A string column, nulls as `None`.
pub(super) fn strings(file: &Path, batches: &[RecordBatch], name: &str) -> Result<Vec<Option<String>>> {
    let mut out = Vec::new();
    for c in column(batches, name) {
        if !matches!(c.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
            return Err(Error::Schema {
                message: format!("column `{name}` of `{}` is {}, not a string", file.display(), c.data_type()),
                hint: None,
            });
        }
        let c = arrow_cast::cast(c, &DataType::Utf8)?;
        out.extend(c.as_string::<i32>().iter().map(|s| s.map(str::to_owned)));
    }
    Ok(out)
}

/// The `label` column, strings or integers (as text: only equality matters), nulls as `None`.
pub(super) fn labels(file: &Path, batches: &[RecordBatch]) -> Result<Vec<Option<String>>> {
    text_or_integers(file, batches, "label", "write class labels as strings or integers: images of a class share one")
}

/// A column of strings or integers, dictionary-encoded or not (pandas' `category`), as text,
/// nulls as `None`.
pub(super) fn text_or_integers(
    file: &Path,
    batches: &[RecordBatch],
    name: &str,
    hint: &str,
) -> Result<Vec<Option<String>>> {
    let textual =
        |t: &DataType| t.is_integer() || matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View);
    let mut out = Vec::new();
    for c in column(batches, name) {
        let t = c.data_type();
        let ok = match t {
            DataType::Dictionary(_, v) => textual(v),
            t => textual(t),
        };
        if !ok {
            return Err(Error::Schema {
                message: format!("column `{name}` of `{}` is {t}, not a string or an integer", file.display()),
                hint: Some(hint.into()),
            });
        }
        let c = arrow_cast::cast(c, &DataType::Utf8)?;
        out.extend(c.as_string::<i32>().iter().map(|s| s.map(str::to_owned)));
    }
    Ok(out)
}

/// A numeric column as float64, nulls as `None`.
fn floats(file: &Path, batches: &[RecordBatch], name: &str) -> Result<Vec<Option<f64>>> {
    let mut out = Vec::new();
    for c in column(batches, name) {
        if !c.data_type().is_numeric() {
            return Err(Error::Schema {
                message: format!("column `{name}` of `{}` is {}, not a number", file.display(), c.data_type()),
                hint: Some("gold similarity scores are numbers (STS: 0 to 5)".into()),
            });
        }
        let c = arrow_cast::cast(c, &DataType::Float64)?;
        out.extend(c.as_primitive::<arrow_array::types::Float64Type>().iter());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Pure-function checks on inputs small enough to work by hand; the NumPy equivalent of each
    // search is in its comment. Every vector's scores are exact in float32 (0, ±1, small
    // integers over norms that are powers of two), so ties are exact whatever the summation order.

    #[test]
    fn single_set_r1_leaves_out_the_query_itself_and_breaks_ties_by_row() {
        // e = normalise(rows); s = e @ e.T; np.fill_diagonal(s, -inf)
        // nn = s.argmax(1)   (argmax takes the first of equal maxima: the lower row)
        // r1 = (labels[nn] == labels).mean()
        #[rustfmt::skip]
        let rows = [
            1.0, 0.0,   // 0: class 0
            2.0, 0.0,   // 1: class 0, same direction as 0 (only normalised they tie with the query)
            0.0, 1.0,   // 2: class 1
            0.0, 3.0,   // 3: class 2: 2 and 3 coincide, so their neighbours are each other
            0.0, 1.0,   // 4: class 1: equal to 2 and 3; its nearest is row 2 (lower than 3)
        ];
        let labels = [0, 0, 1, 2, 1];
        let r = image_r1_single_set(&rows, 2, &labels).unwrap();
        // 0 -> 1 (itself left out although it ties at 1.0 and comes first), 1 -> 0,
        // 2 -> 3 (tied with 4: row 3 is lower), 3 -> 2, 4 -> 2 (tied with 3).
        assert_eq!(r.neighbours, [1, 0, 3, 2, 2]);
        // Hits: 0, 1 (class 0), 4 (2 is class 1); misses: 2 (3 is class 2), 3 (2 is class 1).
        assert_eq!((r.hits, r.queries(), r.gallery), (3, 5, 5));
        assert!((r.r1() - 0.6).abs() < 1e-15);
        // Row 3 is alone in class 2; queries 2, 3, 4 each tie between two others.
        assert_eq!((r.without_positive, r.tied), (1, 3));

        // A duplicate image that precedes the query and ties with it: "the second neighbour"
        // would be the query itself for row 1 here; the query is left out by row instead.
        let r = image_r1_single_set(&[1.0, 0.0, 1.0, 0.0, 0.0, 1.0], 2, &[5, 5, 6]).unwrap();
        assert_eq!(r.neighbours[..2], [1, 0]);
        assert_eq!(r.hits, 2);

        let e = image_r1_single_set(&[1.0, 0.0], 2, &[0]).unwrap_err().to_string();
        assert!(e.contains("at least 2 images"), "{e}");
    }

    #[test]
    fn query_gallery_r1_searches_the_gallery_alone_with_ties_to_the_lower_row() {
        // q = normalise(queries); g = normalise(gallery); nn = (q @ g.T).argmax(1)
        // r1 = (gallery_labels[nn] == query_labels).mean()
        #[rustfmt::skip]
        let queries = [
            1.0, 0.0,    // class 7
            0.0, 2.0,    // class 8
            -1.0, 0.0,   // class 9: no gallery image of it
        ];
        #[rustfmt::skip]
        let gallery = [
            0.0, 4.0,    // 0: class 7, ties with 1 for query 1 and wins it (lower row)
            0.0, 1.0,    // 1: class 8
            3.0, 0.0,    // 2: class 7
            -1.0, 1.0,   // 3: class 8, nearest to query 2 (cos 0.707)
        ];
        let r = image_r1_query_gallery(&queries, &[7, 8, 9], &gallery, &[7, 8, 7, 8], 2).unwrap();
        assert_eq!(r.neighbours, [2, 0, 3]);
        // Query 0 hits; query 1 misses on the tie; query 2 cannot hit.
        assert_eq!((r.hits, r.queries(), r.gallery, r.without_positive, r.tied), (1, 3, 4, 1, 1));
        assert!((r.r1() - 1.0 / 3.0).abs() < 1e-15);
        // The query set is not searched: a query equal to another query still finds the gallery.
        let r = image_r1_query_gallery(&[1.0, 0.0, 1.0, 0.0], &[1, 1], &[0.0, 1.0], &[2], 2).unwrap();
        assert_eq!((r.neighbours, r.hits), (vec![0, 0], 0));
        let e = image_r1_query_gallery(&[1.0, 0.0], &[1], &[], &[], 2).unwrap_err().to_string();
        assert!(e.contains("1 query and 0 gallery"), "{e}");
    }

    #[test]
    fn spearman_ranks_ties_by_their_average() {
        // scipy.stats.rankdata([3, 1, 4, 1, 5]) -> [3, 1.5, 4, 1.5, 5]
        assert_eq!(average_ranks(&[3.0, 1.0, 4.0, 1.0, 5.0]), [3.0, 1.5, 4.0, 1.5, 5.0]);
        // rankdata([2, 2, 2, 1]) -> [3, 3, 3, 1]
        assert_eq!(average_ranks(&[2.0, 2.0, 2.0, 1.0]), [3.0, 3.0, 3.0, 1.0]);
        // By hand: x = [1, 2, 2, 3] -> ranks [1, 2.5, 2.5, 4]; y = [1, 3, 2, 4] -> [1, 3, 2, 4].
        // Centred (mean 2.5): [-1.5, 0, 0, 1.5] and [-1.5, 0.5, -0.5, 1.5]:
        // Σab = 4.5, Σa² = 4.5, Σb² = 5  ->  ρ = 4.5 / sqrt(4.5 · 5) = sqrt(0.9) = 0.9486832980505138
        // (scipy.stats.spearmanr([1, 2, 2, 3], [1, 3, 2, 4]).statistic == 0.9486832980505138)
        let rho = spearman(&[1.0, 2.0, 2.0, 3.0], &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((rho - 0.9_f64.sqrt()).abs() < 1e-15, "{rho}");
        // Monotone but not linear: 1; reversed: -1.
        assert!((spearman(&[1.0, 10.0, 100.0], &[0.1, 0.2, 0.3]).unwrap() - 1.0).abs() < 1e-15);
        assert!((spearman(&[1.0, 2.0, 3.0], &[3.0, 2.0, 1.0]).unwrap() + 1.0).abs() < 1e-15);
        // Undefined: a constant side, or one value.
        assert_eq!(spearman(&[1.0, 1.0, 1.0], &[1.0, 2.0, 3.0]), None);
        assert_eq!(spearman(&[1.0], &[2.0]), None);
    }
}
