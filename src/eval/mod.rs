//! `curate eval`: image-text retrieval metrics with the COCO 5K / 1K, CxC and ECCV Caption
//! protocols, equal to the `eccv-caption` package (0.1.0) given full rankings (spec
//! `cusa-and-pcmepp.md` §4, issue 5).
//!
//! Inputs are embeddings ([`embeddings`]): an image gallery and a caption gallery whose
//! `coco_image_id` column is the COCO ground truth; CxC and ECCV Caption positives come from the
//! package's JSON files ([`PositivePairs`]). Both directions rank the full opposite gallery:
//! in float32 ([`ranking`]; cosine or dot), or in float64 ([`exact64`]; PCME++'s closed-form
//! sampled distance, or `--precision f64`); each protocol ([`coco`], [`cxc`], [`eccv`]) only
//! picks its queries and positives and reads their ranks, so one scoring pass serves them all.
//! [`report`] writes `metrics.json`, `metrics.md` and the recall@K plot.
//!
//! [`evaluate_scored`] (and [`evaluate`], its float32 cosine/dot form) takes embeddings from
//! anywhere: `curate eval --image-embeddings ...` reads them from Parquet ([`run_embeddings`]);
//! `curate eval RUN_DIR` embeds a retrieval set (the COCO 5K test split, or the bundled sample)
//! with a trained run's model ([`trained`]; a PCME++ run with its uncertainties) and calls the
//! same function, adding the run's zero-shot classification scores ([`ZeroShotMetrics`]) and,
//! given their tables, CUSA's uni-modal image retrieval and STS scores ([`unimodal`]) and the
//! transfer linear probe of its image tower ([`linear_probe`]) and OTTER's image-text
//! compositionality benchmark ([`compositionality`]).

pub mod coco;
pub mod compositionality;
pub mod cxc;
pub mod eccv;
pub mod embeddings;
pub mod exact64;
pub mod linear_probe;
pub mod noise;
pub mod product;
pub mod quantized;
pub mod ranking;
pub mod report;
pub mod screen;
pub mod trained;
pub mod unimodal;

use std::path::{Path, PathBuf};
use std::time::Instant;

use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::error::{Error, Result};
use embeddings::{Captions, Images, Matrix};
use ranking::{Need, Ranks, Request};

/// How an image and a caption embedding are scored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum, Default)]
#[serde(rename_all = "snake_case")]
pub enum Similarity {
    /// Cosine similarity (embeddings are L2-normalised first), as CLIP-style models are scored.
    #[default]
    Cosine,
    /// Dot product of the embeddings as given (already normalised, or a model whose score is
    /// an inner product).
    Dot,
    /// PCME++'s closed-form sampled distance, `−d = 2 μ_v·μ_t − 2 − ‖σ²_v‖₁ − ‖σ²_t‖₁`, with
    /// the means L2-normalised (spec `cusa-and-pcmepp.md` §3.11), computed in float64 as its
    /// reference does. Needs each item's `‖σ²‖₁`: a trained PCME++ run's log-variance heads, or
    /// the embeddings tables' `uncertainty` column.
    Csd,
}

impl Similarity {
    /// The name `--similarity` takes.
    pub fn name(self) -> &'static str {
        match self {
            Similarity::Cosine => "cosine",
            Similarity::Dot => "dot",
            Similarity::Csd => "csd",
        }
    }
}

/// The floating-point type scores are computed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum, Default)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// float32, as the eccv-caption package's torch code scores (and equal to it).
    #[default]
    F32,
    /// float64 from the float32 embeddings, as PCME++'s evaluation code scores (spec §4.2:
    /// where parity with its published numbers matters). Exact ranks from whole rows; slower.
    F64,
}

/// How [`evaluate_scored`] scores an (image, caption) pair.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Scoring<'a> {
    pub similarity: Similarity,
    /// Ignored for [`Similarity::Csd`], which is always float64.
    pub precision: Precision,
    /// [`Similarity::Csd`] only: each image's and each caption's `‖σ²‖₁ = Σ_k exp(v_k)`, in
    /// gallery order.
    pub uncertainty: Option<(&'a [f64], &'a [f64])>,
}

/// The two values of one metric; `None` where the protocol has no queries (an empty COCO 1K
/// fold set), written as `null`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Default)]
pub struct Pair {
    pub i2t: Option<f64>,
    pub t2i: Option<f64>,
}

/// Positive pairs of one annotation file: query COCO id -> positive COCO ids, in file order.
/// Positives may be absent from the gallery; they still count (ECCV's R).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PositivePairs(pub Vec<(i64, Vec<i64>)>);

impl PositivePairs {
    /// Reads a `{"<query id>": [<positive id>, ...], ...}` file (the `eccv-caption` package's
    /// `data/*.json`); ids may be numbers or decimal strings, as the package's `int()` accepts.
    pub fn read(path: &Path) -> Result<PositivePairs> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("cannot read", path, e))?;
        let bad = |what: String| Error::Data {
            message: format!("`{}`: {what}", path.display()),
            hint: Some("expected the eccv-caption package's format: {\"<query id>\": [<positive id>, ...]}".into()),
        };
        // Every entry as written: a JSON object read into a map keeps only the last of a
        // repeated key, and would drop a query without a word. Entries take any value, so
        // valid JSON fails only where its top level is not an object.
        let Entries(mut map) = serde_json::from_str(&text).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => bad("the top level is not an object".into()),
            _ => bad(format!("not JSON: {e}")),
        })?;
        if map.is_empty() {
            return Err(bad("holds no queries (`{}`): every metric of its protocol would be undefined".into()));
        }
        // In key order, as a JSON map is read (the order queries are summed in).
        map.sort_by(|a, b| a.0.cmp(&b.0));
        let int = |v: &serde_json::Value| match v {
            serde_json::Value::Number(n) => n.as_i64(),
            serde_json::Value::String(s) => s.trim().parse().ok(),
            _ => None,
        };
        let mut out = Vec::with_capacity(map.len());
        let mut seen: std::collections::HashMap<i64, &str> = std::collections::HashMap::with_capacity(map.len());
        for (k, v) in &map {
            let q: i64 = k.trim().parse().map_err(|_| bad(format!("key `{k}` is not an integer id")))?;
            // One query, one list: a second would be scored as another query (or replace the first).
            if let Some(first) = seen.insert(q, k) {
                return Err(bad(format!("query id {q} is listed twice (as `{first}` and as `{k}`)")));
            }
            let serde_json::Value::Array(items) = v else {
                return Err(bad(format!("the value of `{k}` is not a list")));
            };
            let ids = items
                .iter()
                .map(|x| int(x).ok_or_else(|| bad(format!("a positive of `{k}` is not an integer id: {x}"))))
                .collect::<Result<Vec<i64>>>()?;
            out.push((q, ids));
        }
        Ok(PositivePairs(out))
    }
}

/// A JSON object's entries in file order, repeated keys included.
struct Entries(Vec<(String, serde_json::Value)>);

impl<'de> serde::Deserialize<'de> for Entries {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Entries;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> std::result::Result<Entries, A::Error> {
                let mut out = Vec::new();
                while let Some(entry) = m.next_entry()? {
                    out.push(entry);
                }
                Ok(Entries(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// The CxC and ECCV Caption positive pairs (both directions).
#[derive(Debug, Clone, Default)]
pub struct Annotations {
    pub cxc_i2t: PositivePairs,
    pub cxc_t2i: PositivePairs,
    pub eccv_i2t: PositivePairs,
    pub eccv_t2i: PositivePairs,
    /// The package's own COCO ground truth (`original_caption_to_image.json`, caption → its
    /// image), when the folder has it: the caption table is checked against it (spec §4.1).
    pub original_t2i: Option<PositivePairs>,
}

/// The package's COCO 5K ground truth, beside [`ANNOTATION_FILES`] (read when present).
pub const ORIGINAL_T2I_FILE: &str = "original_caption_to_image.json";

/// The files read from `--eccv-annotations DIR`, named as in the package's `data/` folder.
pub const ANNOTATION_FILES: [&str; 4] = [
    "cxc_image_to_caption.json",
    "cxc_caption_to_image.json",
    "eccv_image_to_caption.json",
    "eccv_caption_to_image.json",
];

impl Annotations {
    pub fn read_dir(dir: &Path) -> Result<Annotations> {
        let missing: Vec<&str> = ANNOTATION_FILES.iter().copied().filter(|f| !dir.join(f).is_file()).collect();
        if !missing.is_empty() {
            let what = if dir.is_dir() {
                format!("lacks {}", missing.join(", "))
            } else {
                format!(
                    "{} (`--eccv-annotations` names the folder of the package's JSON files)",
                    crate::io::not_a(dir, "folder")
                )
            };
            return Err(Error::Data {
                message: format!("`{}` {what}", dir.display()),
                hint: Some(
                    "pass the `data/` folder of the eccv-caption package (`pip download --no-deps \
                     eccv-caption==0.1.0`, unzip, `eccv_caption/data`)"
                        .into(),
                ),
            });
        }
        let read = |f: &str| PositivePairs::read(&dir.join(f));
        Ok(Annotations {
            cxc_i2t: read(ANNOTATION_FILES[0])?,
            cxc_t2i: read(ANNOTATION_FILES[1])?,
            eccv_i2t: read(ANNOTATION_FILES[2])?,
            eccv_t2i: read(ANNOTATION_FILES[3])?,
            original_t2i: dir.join(ORIGINAL_T2I_FILE).is_file().then(|| read(ORIGINAL_T2I_FILE)).transpose()?,
        })
    }
}

/// Gallery rows by COCO id, for both sides.
pub struct Index {
    pub image_row: FxHashMap<i64, u32>,
    pub caption_row: FxHashMap<i64, u32>,
}

impl Index {
    fn new(images: &Images, captions: &Captions) -> Index {
        Index {
            image_row: images.ids.iter().enumerate().map(|(i, &id)| (id, i as u32)).collect(),
            caption_row: captions.ids.iter().enumerate().map(|(i, &id)| (id, i as u32)).collect(),
        }
    }
}

/// One direction's rank requests as they are gathered from the protocols, then its ranks.
#[derive(Debug, Clone)]
pub struct Direction {
    requests: Vec<Request>,
    ranks: Vec<Ranks>,
    gallery: usize,
}

impl Direction {
    fn new(queries: usize, gallery: usize) -> Direction {
        Direction { requests: vec![Request::default(); queries], ranks: Vec::new(), gallery }
    }

    /// Asks for the rank of gallery item `t` for query `q` (once, however many protocols ask),
    /// saying which of its ranks the protocol reads.
    fn want(&mut self, q: u32, t: u32, need: Need) {
        let r = &mut self.requests[q as usize];
        match r.targets.iter().position(|&x| x == t) {
            Some(k) => r.need[k] = r.need[k].merge(need),
            None => {
                r.targets.push(t);
                r.need.push(need);
            }
        }
    }

    fn slot(&self, q: u32, t: u32) -> usize {
        self.requests[q as usize].targets.iter().position(|&x| x == t).expect("rank was requested")
    }

    /// 0-based position of gallery item `t` in the full ranking of query `q`.
    pub fn rank(&self, q: u32, t: u32) -> u32 {
        self.ranks[q as usize].full[self.slot(q, t)]
    }

    /// 0-based position of `t` within the query's subset (its COCO 1K fold).
    pub fn rank_within(&self, q: u32, t: u32) -> u32 {
        self.ranks[q as usize].subset[self.slot(q, t)]
    }

    /// Number of items in the gallery this direction ranks.
    pub fn gallery_len(&self) -> usize {
        self.gallery
    }

    /// Requested (query, target) pairs whose score another gallery item shares exactly.
    pub fn tied(&self) -> u64 {
        self.ranks.iter().map(|r| r.tied as u64).sum()
    }
}

/// Everything computed by [`evaluate`] (the default: nothing, as for uni-modal tables alone).
#[derive(Debug, Clone, Default)]
pub struct Evaluation {
    /// Metric name (as the eccv-caption package names it) -> values, in report order.
    pub metrics: Vec<(String, Pair)>,
    /// Recall@K curves: (label, best 0-based rank of each query; `None` when none of its
    /// positives is in the gallery) for the plot.
    pub best_ranks: Vec<(String, Vec<Option<u32>>)>,
    pub counts: Counts,
    pub timings_s: Vec<(String, f64)>,
    /// Zero-shot classification of a trained run (`curate eval RUN_DIR` when the run config has
    /// zero-shot settings); `None` from embeddings.
    pub zeroshot: Option<ZeroShotMetrics>,
    /// CUSA's uni-modal evaluation of a trained run (`curate eval RUN_DIR --uni-images/--sts`);
    /// `None` otherwise.
    pub unimodal: Option<unimodal::UniModalMetrics>,
    /// The transfer linear probe of a trained run's image tower (`curate eval RUN_DIR --probe`);
    /// `None` otherwise.
    pub linear_probe: Option<linear_probe::ProbeMetrics>,
    /// OTTER's compositionality benchmark of a trained run (`curate eval RUN_DIR --compose`);
    /// `None` otherwise.
    pub compositionality: Option<compositionality::ComposeMetrics>,
}

/// Zero-shot top-1/2/5/10 (flat hit@k over the class prompts, spec `bow-and-otter.md` §6.2), as
/// the trainer computes them ([`crate::train::zeroshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ZeroShotMetrics {
    pub top1: f64,
    pub top2: f64,
    pub top5: f64,
    pub top10: f64,
    pub classes: usize,
}

impl From<crate::train::zeroshot::ZeroShotScores> for ZeroShotMetrics {
    fn from(s: crate::train::zeroshot::ZeroShotScores) -> Self {
        ZeroShotMetrics { top1: s.top1, top2: s.top2, top5: s.top5, top10: s.top10, classes: s.classes }
    }
}

/// Sizes and diagnostics shown in the report.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Counts {
    pub images: usize,
    pub captions: usize,
    pub dim: usize,
    pub coco_1k_folds: usize,
    /// COCO 1K folds none of whose images has a caption: no query, so left out of the 1K means.
    pub coco_1k_folds_without_queries: usize,
    /// Images of the gallery outside every COCO 1K fold (row count not a multiple of 5).
    pub images_outside_folds: usize,
    /// Images with no caption: distractors only, not COCO i2t queries.
    pub images_without_captions: usize,
    /// Captions in another COCO 1K fold by the caption table's order than by the image table's
    /// ([`coco::Folds::caption_order_disagreements`]).
    pub coco_1k_fold_disagreements: usize,
    pub cxc_queries: [usize; 2],
    pub eccv_queries: [usize; 2],
    /// CxC / ECCV positives absent from the gallery (never retrieved, still counted).
    pub positives_absent: [usize; 2],
    /// Requested (query, positive) pairs tied exactly with another gallery item, i2t and t2i,
    /// among the ranks computed exactly (all of them, or with the screen those a metric reads).
    pub tied_pairs: [u64; 2],
    /// Image and caption rows whose embedding is all zeros where scores normalise them (cosine,
    /// CSD): they have no direction, so every cosine with them is 0.
    pub zero_rows: [usize; 2],
    /// The fewest and most captions of an image with captions: COCO's 5K test split has 5 for
    /// each (25,000); some loaders keep a few more (spec §4.1: do not use them).
    pub captions_per_image: [usize; 2],
    /// Against the package's `original_caption_to_image.json` (when `--eccv-annotations` has
    /// it): captions of the table it does not list (extras), captions it lists that the table
    /// lacks, and captions the two give different images.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original_gt: Option<[usize; 3]>,
    /// The set scored is the one the run selected its model on (`eval.select_best`): its figures
    /// are validation figures, optimistic as test figures.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub selection_set: bool,
}

/// Scores both directions once (float32) and computes every metric: [`evaluate_scored`] with
/// cosine or dot products.
pub fn evaluate(
    images: &Images,
    captions: &Captions,
    annotations: Option<&Annotations>,
    similarity: Similarity,
) -> Result<Evaluation> {
    evaluate_scored(images, captions, annotations, &Scoring { similarity, ..Scoring::default() })
}

/// Refuses float32 dot products that can pass float32's range: the largest image and caption
/// norms (in float64) bound every score (Cauchy–Schwarz), and a score past the range is an
/// infinity that ties with its like.
fn refuse_overflowing_dot(images: &Matrix, captions: &Matrix) -> Result<()> {
    let largest = |m: &Matrix| -> f64 {
        m.data
            .chunks(m.dim.max(1))
            .map(|r| r.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt())
            .fold(0.0, f64::max)
    };
    let (a, b) = (largest(images), largest(captions));
    if a * b >= f64::from(f32::MAX) {
        return Err(Error::Data {
            message: format!(
                "`--similarity dot`: the largest image norm ({a:.3e}) times the largest caption norm ({b:.3e}) is past \
                 float32's range ({:.3e}), so float32 scores can overflow to infinity and tie",
                f32::MAX
            ),
            hint: Some("score in float64 (`--precision f64`), or by cosine".into()),
        });
    }
    Ok(())
}

/// Scores both directions once and computes every metric.
///
/// COCO metrics always; CxC and ECCV Caption when `annotations` is given. Errors when an
/// annotation query is not in the gallery (the reference would fail on it too), or when CSD
/// has no uncertainties for every item.
pub fn evaluate_scored(
    images: &Images,
    captions: &Captions,
    annotations: Option<&Annotations>,
    scoring: &Scoring,
) -> Result<Evaluation> {
    let similarity = scoring.similarity;
    if similarity == Similarity::Dot && scoring.precision == Precision::F32 {
        refuse_overflowing_dot(&images.embeddings, &captions.embeddings)?;
    }
    if similarity == Similarity::Csd {
        let (iu, cu) = scoring
            .uncertainty
            .ok_or_else(|| Error::data("scoring by CSD needs each image's and each caption's uncertainty (‖σ²‖₁)"))?;
        if (iu.len(), cu.len()) != (images.ids.len(), captions.ids.len()) {
            return Err(Error::data(format!(
                "{} image and {} caption uncertainties for {} images and {} captions",
                iu.len(),
                cu.len(),
                images.ids.len(),
                captions.ids.len()
            )));
        }
        if let Some(u) = iu.iter().chain(cu).find(|u| !(u.is_finite() && **u >= 0.0)) {
            return Err(Error::data(format!("an uncertainty ‖σ²‖₁ is {u}: CSD needs finite, non-negative ones")));
        }
    }
    let t0 = Instant::now();
    let index = Index::new(images, captions);
    let mut i2t = Direction::new(images.ids.len(), captions.ids.len());
    let mut t2i = Direction::new(captions.ids.len(), images.ids.len());
    let folds = coco::Folds::new(images, captions, &index);
    let coco_plan = coco::plan(images, captions, &index, &mut i2t, &mut t2i);
    let mut counts = Counts {
        images: images.ids.len(),
        captions: captions.ids.len(),
        dim: images.embeddings.dim,
        coco_1k_folds: folds.count(),
        coco_1k_folds_without_queries: folds.caption_subsets.iter().filter(|c| c.is_empty()).count(),
        images_outside_folds: folds.outside(),
        coco_1k_fold_disagreements: folds.caption_order_disagreements,
        images_without_captions: coco_plan.images_without_captions(),
        captions_per_image: coco_plan.captions_per_image(),
        ..Counts::default()
    };
    counts.original_gt = annotations.and_then(|a| a.original_t2i.as_ref()).map(|gt| {
        let truth: FxHashMap<i64, &[i64]> = gt.0.iter().map(|(c, images)| (*c, images.as_slice())).collect();
        let mut extra = 0;
        let mut other_image = 0;
        for (c, image) in captions.ids.iter().zip(&captions.image_ids) {
            match truth.get(c) {
                None => extra += 1,
                Some(images) if !images.contains(image) => other_image += 1,
                Some(_) => {}
            }
        }
        let in_table: rustc_hash::FxHashSet<i64> = captions.ids.iter().copied().collect();
        let missing = truth.keys().filter(|c| !in_table.contains(c)).count();
        [extra, missing, other_image]
    });
    let gt_plans = match annotations {
        Some(a) => {
            let cxc = cxc::plan(&a.cxc_i2t, &a.cxc_t2i, &index, &mut i2t, &mut t2i)?;
            let eccv = eccv::plan(&a.eccv_i2t, &a.eccv_t2i, &index, &mut i2t, &mut t2i)?;
            counts.cxc_queries = [cxc.i2t.len(), cxc.t2i.len()];
            counts.eccv_queries = [eccv.i2t.len(), eccv.t2i.len()];
            counts.positives_absent = [cxc.absent(), eccv.absent()];
            Some((cxc, eccv))
        }
        None => None,
    };
    for (q, f) in folds.image_fold.iter().enumerate() {
        i2t.requests[q].subset = *f;
    }
    for (q, &im) in captions.image_ids.iter().enumerate() {
        t2i.requests[q].subset = folds.image_fold[index.image_row[&im] as usize];
    }
    let t_plan = t0.elapsed().as_secs_f64();

    let t1 = Instant::now();
    let normalized;
    let (img, cap): (&Matrix, &Matrix) = match similarity {
        Similarity::Dot => (&images.embeddings, &captions.embeddings),
        // CSD's means are unit vectors (§3.11).
        Similarity::Cosine | Similarity::Csd => {
            counts.zero_rows = [images.embeddings.zero_rows(), captions.embeddings.zero_rows()];
            normalized = (images.embeddings.l2_normalized(), captions.embeddings.l2_normalized());
            (&normalized.0, &normalized.1)
        }
    };
    let (i2t_requests, t2i_requests) = (&i2t.requests, &t2i.requests);
    let (caption_subsets, image_subsets) = (&folds.caption_subsets, &folds.image_subsets);
    (i2t.ranks, t2i.ranks) = match (similarity, scoring.precision, scoring.uncertainty) {
        (Similarity::Csd, _, Some((iu, cu))) => {
            let s = exact64::Scoring64::csd(iu, cu);
            exact64::rank(img, cap, &s, i2t_requests, t2i_requests, caption_subsets, image_subsets)
        }
        (_, Precision::F64, _) => {
            let s = exact64::Scoring64::dot(img.rows, cap.rows);
            exact64::rank(img, cap, &s, i2t_requests, t2i_requests, caption_subsets, image_subsets)
        }
        _ => ranking::rank(img, cap, i2t_requests, t2i_requests, caption_subsets, image_subsets),
    };
    let t_rank = t1.elapsed().as_secs_f64();
    counts.tied_pairs = [i2t.tied(), t2i.tied()];

    let t3 = Instant::now();
    let mut metrics = Vec::new();
    let mut best_ranks = Vec::new();
    coco_plan.metrics(&folds, &i2t, &t2i, &mut metrics, &mut best_ranks);
    if let Some((cxc, eccv)) = &gt_plans {
        cxc.metrics(&i2t, &t2i, &mut metrics, &mut best_ranks);
        eccv.metrics(&i2t, &t2i, &mut metrics);
    }
    let timings_s = vec![
        ("plan".to_owned(), t_plan),
        ("score_and_rank".to_owned(), t_rank),
        ("metrics".to_owned(), t3.elapsed().as_secs_f64()),
    ];
    Ok(Evaluation {
        metrics,
        best_ranks,
        counts,
        timings_s,
        zeroshot: None,
        unimodal: None,
        linear_probe: None,
        compositionality: None,
    })
}

/// One annotation query resolved to gallery rows.
#[derive(Debug, Clone)]
pub struct Query {
    /// Query row in its gallery.
    pub row: u32,
    /// Distinct positives present in the opposite gallery (rows).
    pub positives: Vec<u32>,
    /// Distinct positives in the file, present or not (ECCV's R).
    pub n_positives: usize,
}

/// What each protocol reads of its positives' ranks ([`Need`]): COCO and CxC their best
/// (recall@K and the recall curve; COCO also within the 1K fold), ECCV Caption the ranks below
/// `max(R, 10)` (mAP@R and R-Precision over the top R, recall@1/5/10).
pub const COCO_NEED: Need = Need { best_of: 1, below: 0 };
pub const CXC_NEED: Need = Need { best_of: 2, below: 0 };

pub fn eccv_need(r: usize) -> Need {
    Need { best_of: 0, below: u32::try_from(r).unwrap_or(u32::MAX).max(KS[KS.len() - 1]) }
}

/// Resolves positive pairs to gallery rows and asks `dir` for the ranks of the present
/// positives (`need(R)`: what the protocol reads of them, given the query's positive count).
/// Duplicate positives count once (the package takes a set); positives absent from the gallery
/// are kept in the count only. A query absent from its gallery is an error.
pub fn resolve(
    pairs: &PositivePairs,
    name: &str,
    query_rows: &FxHashMap<i64, u32>,
    target_rows: &FxHashMap<i64, u32>,
    dir: &mut Direction,
    need: impl Fn(usize) -> Need,
) -> Result<(Vec<Query>, usize)> {
    let mut out = Vec::with_capacity(pairs.0.len());
    let mut absent = 0;
    for (q, ids) in &pairs.0 {
        let Some(&row) = query_rows.get(q) else {
            let hint = if target_rows.contains_key(q) {
                "it is an id of the other side (a caption where an image was looked for, or the other way): are the \
                 image-to-caption and caption-to-image files swapped, or renamed?"
            } else {
                "CxC and ECCV Caption are defined on the COCO 5K test split: embed all of it"
            };
            return Err(Error::Data {
                message: format!("query {q} of `{name}` is not in the gallery"),
                hint: Some(hint.into()),
            });
        };
        let mut seen = rustc_hash::FxHashSet::default();
        let mut positives = Vec::new();
        for id in ids {
            if !seen.insert(*id) {
                continue;
            }
            match target_rows.get(id) {
                Some(&t) => positives.push(t),
                None => absent += 1,
            }
        }
        for &t in &positives {
            dir.want(row, t, need(seen.len()));
        }
        out.push(Query { row, positives, n_positives: seen.len() });
    }
    Ok((out, absent))
}

/// Recall@K cut-offs reported for every recall protocol (the package's default `Ks`).
pub const KS: [u32; 3] = [1, 5, 10];

/// Rows of `paths` that repeat an earlier row's path (an image listed twice finds its twin).
pub fn repeated_paths(paths: &[String]) -> usize {
    let mut seen = rustc_hash::FxHashSet::default();
    paths.iter().filter(|p| !seen.insert(p.as_str())).count()
}

/// Fraction of queries whose best positive rank (0-based, `None` = no positive in the gallery)
/// is below `k`; `None` without queries.
pub fn recall(best: &[Option<u32>], k: u32) -> Option<f64> {
    if best.is_empty() {
        return None;
    }
    Some(best.iter().filter(|r| r.is_some_and(|r| r < k)).count() as f64 / best.len() as f64)
}

/// `curate eval --image-embeddings ... --caption-embeddings ...`: what to read and where to write.
#[derive(Debug, Clone, Serialize)]
pub struct EmbeddingsRun {
    pub image_embeddings: PathBuf,
    pub caption_embeddings: PathBuf,
    pub eccv_annotations: Option<PathBuf>,
    pub out: PathBuf,
    pub similarity: Similarity,
    pub precision: Precision,
}

/// Reads the embeddings and annotations, evaluates, and writes the report into `run.out`
/// (`config.json`, `metrics.json`, `metrics.md`, `recall_at_k.svg`, once the evaluation is done).
pub fn run_embeddings(run: &EmbeddingsRun) -> Result<Evaluation> {
    let t0 = Instant::now();
    // The three inputs are read side by side (the captions take longest); errors are reported
    // in this order.
    let (images, (captions, annotations)) = rayon::join(
        || embeddings::read_images(&run.image_embeddings),
        || {
            rayon::join(
                || embeddings::read_captions(&run.caption_embeddings),
                || run.eccv_annotations.as_deref().map(Annotations::read_dir).transpose(),
            )
        },
    );
    let (images, captions) = (images?, captions?);
    embeddings::check_pair(&images, &captions, &run.image_embeddings, &run.caption_embeddings)?;
    let annotations = annotations?;
    // CSD's uncertainties: the tables' `uncertainty` column.
    let uncertainty = match run.similarity {
        Similarity::Csd => Some((
            embeddings::read_uncertainty(&run.image_embeddings, images.ids.len())?,
            embeddings::read_uncertainty(&run.caption_embeddings, captions.ids.len())?,
        )),
        _ => None,
    };
    let t_read = t0.elapsed().as_secs_f64();
    report::check_out(&run.out)?;
    let scoring = Scoring { similarity: run.similarity, precision: run.precision, uncertainty: None };
    let mut ev = match &uncertainty {
        Some((iu, cu)) => evaluate_scored(
            &images,
            &captions,
            annotations.as_ref(),
            &Scoring { uncertainty: Some((iu, cu)), ..scoring },
        )?,
        None => evaluate_scored(&images, &captions, annotations.as_ref(), &scoring)?,
    };
    ev.timings_s.insert(0, ("read".to_owned(), t_read));
    // Only now, with everything read and scored: a failed evaluation leaves an earlier one as it was.
    report::write_config(&run.out, run)?;
    report::write(&run.out, &ev)?;
    Ok(ev)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_pairs_read_every_query_once_and_refuse_a_repeated_one() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cxc.json");
        let read = |text: &str| {
            std::fs::write(&file, text).unwrap();
            PositivePairs::read(&file)
        };
        // Numbers or decimal strings, in key order.
        let ok = read(r#"{"9": [1, "2"], "10": []}"#).unwrap();
        assert_eq!(ok, PositivePairs(vec![(10, vec![]), (9, vec![1, 2])]));
        // The same key twice (a map keeps the last), or one id written two ways.
        for (text, first, second) in
            [(r#"{"7": [1], "7": [2]}"#, "7", "7"), (r#"{"112141": [1], "0112141": [2]}"#, "0112141", "112141")]
        {
            let e = read(text).unwrap_err().to_string();
            let want =
                format!("query id {} is listed twice (as `{first}` and as `{second}`)", first.trim_start_matches('0'));
            assert!(e.contains(&want) && e.contains("cxc.json"), "{e}");
        }
        for (text, want) in [
            ("[1]", "the top level is not an object"),
            (" {} ", "holds no queries"),
            (r#"{"x": [1]}"#, "key `x` is not an integer id"),
            (r#"{"1": 2}"#, "the value of `1` is not a list"),
            (r#"{"1": [1.5]}"#, "a positive of `1` is not an integer id: 1.5"),
        ] {
            let e = read(text).unwrap_err().to_string();
            assert!(e.contains(want), "{text}: {e}");
        }
    }
}
