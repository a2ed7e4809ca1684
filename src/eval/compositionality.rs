//! OTTER's image-text compositionality benchmark (spec `bow-and-otter.md` §6.5, OTTER
//! Appendix D and Table 7; optional in the spec): does an image embedding plus a text
//! embedding retrieve an image that has both the image's attributes and the text's? It owns the
//! table ([`ComposeTable`]: `path`, `attributes`), the draw of the queries ([`draw_queries`]),
//! the three overlap rates ([`overlaps`], [`score`]) and their [`ComposeMetrics`];
//! `curate eval RUN_DIR --compose TABLE` ([`super::trained`]) embeds with the run's model.
//!
//! A query is a pair of images `(i, j)` sharing at least `min_shared` attributes (OTTER: 10):
//! image `i` is the image query, its attributes `Q_v = A_i`; the text query names `Q_t = A_j \
//! A_i`; `Q = Q_v ∪ Q_t`. The query vector is `norm(f(image i)) + norm(g(text))` and retrieves
//! the gallery image `r` of highest cosine. With `R` its attributes: `OR = mean |R ∩ Q| / |Q|`,
//! `IOR = mean |R ∩ Q_v| / |Q_v|`, `TOR = mean |R ∩ Q_t| / |Q_t|`; the random baseline returns
//! a uniformly drawn image instead.
//!
//! What the paper leaves open, and the choices made here (all in `metrics.json`):
//! - the text of `Q_t`: its attribute names, as the table gives them, in attribute order
//!   (first met in the table), joined by `", "` (with the run's `pre_caption` when it trained
//!   with it); write the names as phrases ("yellow forehead") for a text tower to read;
//! - the query image itself is never returned (it would score IOR 1: the paper's IOR of ~34%
//!   against 31.3% at random shows it was not), and neither is it the random baseline's draw;
//!   image `j` may be;
//! - pairs with an empty `Q_t` (`A_j ⊆ A_i`, so TOR is undefined) are drawn again;
//! - pairs are ordered and drawn uniformly with `i ≠ j`, by a generator seeded per query
//!   (`seed`, query index), so a query does not depend on the number drawn; the paper's 1,000,000
//!   queries (its published list is not available here) are `--compose-queries 1000000`;
//! - exact score ties go to the lower gallery row ([`crate::knn::exact_top_k`]).

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::Array;
use arrow_schema::{DataType, Field};
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::trained::{preprocess_batch, IMAGE_BATCH};
use crate::error::{Error, Result};
use crate::rng::RowRng;
use crate::train::trained::TrainedRun;

/// How many queries, how they are drawn.
#[derive(Debug, Clone, Serialize)]
pub struct ComposeConfig {
    pub queries: usize,
    /// Attributes a pair shares at least (OTTER: 10).
    pub min_shared: usize,
    pub seed: u64,
}

impl Default for ComposeConfig {
    fn default() -> Self {
        ComposeConfig { queries: 10_000, min_shared: 10, seed: 0 }
    }
}

/// The gallery (`--compose`): `path` and `attributes` (a list of strings or integers: the
/// attributes present in the image), in row order. Rows with a null `path` or `attributes` are
/// left out and counted.
#[derive(Debug, Clone, PartialEq)]
pub struct ComposeTable {
    pub file: PathBuf,
    pub paths: Vec<String>,
    /// Each kept row's attribute ids, sorted, without repeats.
    pub attributes: Vec<Vec<u32>>,
    /// The name of each attribute id (ids numbered as first met).
    pub names: Vec<String>,
    pub skipped: usize,
}

impl ComposeTable {
    /// Reads and checks `file`: both columns (every missing one at once), `attributes` a list,
    /// at least 2 images.
    pub fn read(file: &Path) -> Result<ComposeTable> {
        super::unimodal::check_columns(file, &["path", "attributes"], "")?;
        let batches = crate::io::parquet::read_file(file)?;
        let paths = super::unimodal::strings(file, &batches, "path")?;
        let mut lists: Vec<Option<Vec<Option<String>>>> = Vec::new();
        let target = DataType::List(std::sync::Arc::new(Field::new("item", DataType::Utf8, true)));
        for b in &batches {
            let c = b.column_by_name("attributes").expect("checked against the schema");
            let inner = match c.data_type() {
                DataType::List(f) | DataType::LargeList(f) => f.data_type().clone(),
                other => {
                    return Err(Error::Schema {
                        message: format!("column `attributes` of `{}` is {other}, not a list", file.display()),
                        hint: Some("write each image's attributes as a list of names (or integer ids)".into()),
                    })
                }
            };
            if !(inner.is_integer() || matches!(inner, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)) {
                return Err(Error::Schema {
                    message: format!(
                        "column `attributes` of `{}` is a list of {inner}, not of strings or integers",
                        file.display()
                    ),
                    hint: None,
                });
            }
            let c = arrow_cast::cast(c, &target)?;
            let list = c.as_list::<i32>();
            for row in 0..list.len() {
                if list.is_null(row) {
                    lists.push(None);
                    continue;
                }
                let values = list.value(row);
                lists.push(Some(values.as_string::<i32>().iter().map(|s| s.map(str::to_owned)).collect()));
            }
        }
        let mut t = ComposeTable {
            file: file.to_owned(),
            paths: Vec::new(),
            attributes: Vec::new(),
            names: Vec::new(),
            skipped: 0,
        };
        let mut ids: FxHashMap<String, u32> = FxHashMap::default();
        for (path, list) in paths.into_iter().zip(lists) {
            let (Some(path), Some(list)) = (path, list) else {
                t.skipped += 1;
                continue;
            };
            let mut attrs: Vec<u32> = list
                .into_iter()
                .flatten()
                .map(|name| {
                    let next = ids.len() as u32;
                    *ids.entry(name.clone()).or_insert_with(|| {
                        t.names.push(name);
                        next
                    })
                })
                .collect();
            attrs.sort_unstable();
            attrs.dedup();
            t.paths.push(path);
            t.attributes.push(attrs);
        }
        if t.paths.len() < 2 {
            return Err(Error::data(format!(
                "`{}` has {} image(s) with attributes ({} row(s) left out for a null): a query needs two",
                file.display(),
                t.paths.len(),
                t.skipped
            )));
        }
        Ok(t)
    }
}

/// One image-text query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    /// The image query `i` (a gallery row).
    pub image: u32,
    /// The image `j` whose extra attributes the text names.
    pub partner: u32,
    /// `Q_t = A_j \ A_i`, sorted.
    pub text_attributes: Vec<u32>,
}

/// Elements of two sorted lists in common.
fn shared(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// Draws `c.queries` queries: ordered pairs `i ≠ j` uniformly, kept when they share at least
/// `c.min_shared` attributes and `A_j \ A_i` is not empty. Fails, saying so, when no pair
/// qualifies or qualifying pairs are too rare to draw (under one in 100,000 draws).
pub fn draw_queries(table: &ComposeTable, c: &ComposeConfig) -> Result<Vec<Query>> {
    let n = table.attributes.len() as u64;
    const TRIES: usize = 100_000;
    (0..c.queries)
        .map(|k| {
            let mut rng = RowRng::new(c.seed, "compose", &k.to_string());
            for _ in 0..TRIES {
                let i = rng.below(n) as usize;
                let j = (i + 1 + rng.below(n - 1) as usize) % n as usize;
                let (a, b) = (&table.attributes[i], &table.attributes[j]);
                if shared(a, b) < c.min_shared {
                    continue;
                }
                let extra: Vec<u32> = b.iter().copied().filter(|x| a.binary_search(x).is_err()).collect();
                if !extra.is_empty() {
                    return Ok(Query { image: i as u32, partner: j as u32, text_attributes: extra });
                }
            }
            Err(Error::Data {
                message: format!(
                    "`{}`: no image pair found sharing at least {} attributes with an attribute the second has and \
                     the first lacks, in {TRIES} random draws",
                    table.file.display(),
                    c.min_shared
                ),
                hint: Some("lower `--compose-min-shared` (OTTER: 10 of CUB's 288 attributes)".into()),
            })
        })
        .collect()
}

/// The text query of `attributes`: their names joined by `", "`.
pub fn text_of(attributes: &[u32], names: &[String]) -> String {
    attributes.iter().map(|&a| names[a as usize].as_str()).collect::<Vec<_>>().join(", ")
}

/// `[|R ∩ Q| / |Q|, |R ∩ Q_v| / |Q_v|, |R ∩ Q_t| / |Q_t|]` of the retrieved image's attributes
/// `r` (sorted) for the query attributes `q_v` and `q_t` (sorted, disjoint; `q_t` not empty).
pub fn overlaps(q_v: &[u32], q_t: &[u32], r: &[u32]) -> [f64; 3] {
    let (v, t) = (shared(q_v, r), shared(q_t, r));
    let ratio = |hit: usize, all: usize| if all == 0 { 0.0 } else { hit as f64 / all as f64 };
    [ratio(v + t, q_v.len() + q_t.len()), ratio(v, q_v.len()), ratio(t, q_t.len())]
}

/// The benchmark's figures: `metrics.json`'s `"compositionality"` object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComposeMetrics {
    /// Overlap rate of the retrieved image with `Q`, `Q_v` and `Q_t`.
    pub or: f64,
    pub ior: f64,
    pub tor: f64,
    /// The same for a uniformly drawn image (other than the query image).
    pub random_or: f64,
    pub random_ior: f64,
    pub random_tor: f64,
    pub queries: usize,
    pub images: usize,
    pub attributes: usize,
    pub min_shared: usize,
    pub seed: u64,
    /// Queries whose retrieved image was `j`, the image the text came from.
    pub retrieved_partner: usize,
    /// Gallery rows left out for a null `path` or `attributes`.
    pub rows_skipped: usize,
}

/// Scores `queries` given the L2-normalised gallery embeddings `images` (`[rows * dim]`, in
/// table order) and the L2-normalised text embedding of each query (`texts`, `[queries * dim]`).
pub fn score(
    table: &ComposeTable,
    queries: &[Query],
    images: &[f32],
    texts: &[f32],
    dim: usize,
    c: &ComposeConfig,
) -> ComposeMetrics {
    let rows = table.attributes.len();
    let vectors: Vec<f32> = queries
        .iter()
        .zip(texts.chunks(dim))
        .flat_map(|(q, t)| {
            let v = &images[q.image as usize * dim..(q.image as usize + 1) * dim];
            v.iter().zip(t).map(|(a, b)| a + b).collect::<Vec<_>>()
        })
        .collect();
    // Two nearest: the first that is not the query image.
    let top = crate::knn::exact_top_k(&vectors, images, dim, 2.min(rows));
    let (mut sums, mut random, mut partner) = ([0.0; 3], [0.0; 3], 0);
    for (k, q) in queries.iter().enumerate() {
        let r = *top.ids_of(k).iter().find(|&&r| r != q.image).expect("two gallery images");
        partner += usize::from(r == q.partner);
        let q_v = &table.attributes[q.image as usize];
        for (s, o) in sums.iter_mut().zip(overlaps(q_v, &q.text_attributes, &table.attributes[r as usize])) {
            *s += o;
        }
        let mut rng = RowRng::new(c.seed, "compose-random", &k.to_string());
        let drawn = (q.image as usize + 1 + rng.below(rows as u64 - 1) as usize) % rows;
        for (s, o) in random.iter_mut().zip(overlaps(q_v, &q.text_attributes, &table.attributes[drawn])) {
            *s += o;
        }
    }
    let n = queries.len().max(1) as f64;
    ComposeMetrics {
        or: sums[0] / n,
        ior: sums[1] / n,
        tor: sums[2] / n,
        random_or: random[0] / n,
        random_ior: random[1] / n,
        random_tor: random[2] / n,
        queries: queries.len(),
        images: rows,
        attributes: table.names.len(),
        min_shared: c.min_shared,
        seed: c.seed,
        retrieved_partner: partner,
        rows_skipped: table.skipped,
    }
}

/// Draws the queries, embeds the gallery (`root`: the folder relative paths resolve against)
/// and the distinct query texts with `run`'s cross-modal towers, and scores them.
pub fn evaluate(
    run: &TrainedRun,
    table: &ComposeTable,
    root: Option<&Path>,
    c: &ComposeConfig,
    note: &dyn Fn(String),
) -> Result<ComposeMetrics> {
    let queries = draw_queries(table, c)?;
    let pre_caption = run.config.data.pre_caption;
    let mut text_index: FxHashMap<String, usize> = FxHashMap::default();
    let mut distinct: Vec<String> = Vec::new();
    let mut which = Vec::with_capacity(queries.len());
    for q in &queries {
        let mut text = text_of(&q.text_attributes, &table.names);
        if pre_caption {
            text = crate::text::pre_caption(&text, crate::text::PRE_CAPTION_WORDS).ok_or_else(|| {
                Error::data(format!(
                    "the text query `{text}` has nothing left after `pre_caption` (the run's `data.pre_caption`)"
                ))
            })?;
        }
        let next = distinct.len();
        let at = *text_index.entry(text.clone()).or_insert_with(|| {
            distinct.push(text);
            next
        });
        which.push(at);
    }
    note(format!(
        "compositionality: embedding {} images (`{}`) and {} distinct text queries of {} queries",
        table.paths.len(),
        table.file.display(),
        distinct.len(),
        queries.len()
    ));
    let transform = run.transform();
    let mut images = Vec::with_capacity(table.paths.len() * run.dim());
    for chunk in table.paths.chunks(IMAGE_BATCH) {
        images.extend(run.embed_images(preprocess_batch(chunk, root, &transform)?, chunk.len())?);
    }
    let refs: Vec<&str> = distinct.iter().map(String::as_str).collect();
    let embedded = run.embed_texts(&refs)?;
    let dim = run.dim();
    let texts: Vec<f32> = which.iter().flat_map(|&w| embedded[w * dim..(w + 1) * dim].iter().copied()).collect();
    if images.iter().chain(&texts).any(|v| !v.is_finite()) {
        return Err(Error::Model {
            message: "the model's compositionality embeddings are not finite".into(),
            hint: None,
        });
    }
    Ok(score(table, &queries, &images, &texts, dim, c))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(attributes: Vec<Vec<u32>>) -> ComposeTable {
        let names =
            (0..=attributes.iter().flatten().copied().max().unwrap_or(0)).map(|a| format!("attr {a}")).collect();
        ComposeTable {
            file: "t.parquet".into(),
            paths: (0..attributes.len()).map(|i| format!("{i}.jpg")).collect(),
            attributes,
            names,
            skipped: 0,
        }
    }

    #[test]
    fn overlaps_by_hand() {
        // Q_v = {1, 2, 3, 4}, Q_t = {7, 9}; R = {2, 4, 9, 11}: |R∩Q| = 3 of 6, |R∩Q_v| = 2 of 4,
        // |R∩Q_t| = 1 of 2.
        assert_eq!(overlaps(&[1, 2, 3, 4], &[7, 9], &[2, 4, 9, 11]), [0.5, 0.5, 0.5]);
        // R = Q: all ones; R disjoint: zeros.
        assert_eq!(overlaps(&[1, 2], &[3], &[1, 2, 3]), [1.0, 1.0, 1.0]);
        assert_eq!(overlaps(&[1, 2], &[3], &[5]), [0.0, 0.0, 0.0]);
        assert_eq!(shared(&[1, 3, 5, 7], &[2, 3, 4, 7, 8]), 2);
        assert_eq!(text_of(&[2, 0], &["red wing".into(), "x".into(), "long bill".into()]), "long bill, red wing");
    }

    #[test]
    fn queries_share_enough_and_add_an_attribute_and_are_seeded_per_query() {
        // Images 0-2 share 3 attributes with each other; image 3 shares none; 2 ⊂ 0.
        let t = table(vec![vec![1, 2, 3, 4], vec![1, 2, 3, 5], vec![1, 2, 3], vec![8, 9]]);
        let c = ComposeConfig { queries: 200, min_shared: 3, seed: 7 };
        let q = draw_queries(&t, &c).unwrap();
        assert_eq!(q.len(), 200);
        for x in &q {
            let (a, b) = (&t.attributes[x.image as usize], &t.attributes[x.partner as usize]);
            assert!(x.image != x.partner && shared(a, b) >= 3);
            let extra: Vec<u32> = b.iter().copied().filter(|v| !a.contains(v)).collect();
            assert!(!extra.is_empty() && x.text_attributes == extra, "{x:?}");
            // Never (0, 2) or (1, 2): A_2 ⊂ A_0 and A_1, so Q_t would be empty; never image 3.
            assert!(x.partner != 2 && x.image != 3 && x.partner != 3, "{x:?}");
        }
        // Every qualifying ordered pair turns up: (0,1), (1,0), (2,0), (2,1).
        let mut pairs: Vec<(u32, u32)> = q.iter().map(|x| (x.image, x.partner)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs, [(0, 1), (1, 0), (2, 0), (2, 1)]);
        // A query does not depend on how many are drawn; another seed draws others.
        let few = draw_queries(&t, &ComposeConfig { queries: 5, ..c.clone() }).unwrap();
        assert_eq!(few[..], q[..5]);
        assert_ne!(draw_queries(&t, &ComposeConfig { seed: 8, ..c.clone() }).unwrap(), q);
        // No pair shares 4: refused with a hint.
        let e = draw_queries(&t, &ComposeConfig { min_shared: 4, ..c }).unwrap_err().to_string();
        assert!(e.contains("sharing at least 4 attributes") && e.contains("--compose-min-shared"), "{e}");
    }

    #[test]
    fn the_query_image_is_never_retrieved_and_ties_go_to_the_lower_row() {
        // 2-d unit embeddings. Gallery: 0 = (1,0), 1 = (0,1), 2 = (0,1) (a tie with 1), 3 = (-1,0).
        let t = table(vec![vec![1, 2], vec![1, 3], vec![2, 3], vec![4]]);
        let images = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, -1.0, 0.0];
        // Query 0: image 0 + text (1,0): nearest is image 0 itself, left out -> 1 and 2 tie at 0
        // (cos of (2,0) with (0,1)), 3 at -1 -> image 1 (lower row).
        // Query 1: image 3 + text (0,1) -> (-1,1): 1 and 2 tie at 0.707 -> image 1.
        let queries = vec![
            Query { image: 0, partner: 2, text_attributes: vec![3] },
            Query { image: 3, partner: 2, text_attributes: vec![2, 3] },
        ];
        let texts = [1.0, 0.0, 0.0, 1.0];
        let c = ComposeConfig { queries: 2, min_shared: 0, seed: 0 };
        let m = score(&t, &queries, &images, &texts, 2, &c);
        // Query 0: Q_v {1,2}, Q_t {3}, R = A_1 = {1,3}: OR 2/3, IOR 1/2, TOR 1.
        // Query 1: Q_v {4}, Q_t {2,3}, R = {1,3}: OR 1/3, IOR 0, TOR 1/2.
        assert!((m.or - 0.5).abs() < 1e-15 && (m.ior - 0.25).abs() < 1e-15 && (m.tor - 0.75).abs() < 1e-15, "{m:?}");
        assert_eq!((m.queries, m.images, m.retrieved_partner), (2, 4, 0));
        // The random baseline never draws the query image: with a 2-image gallery it is the
        // other one, every time.
        let t2 = table(vec![vec![1], vec![2]]);
        let q = vec![Query { image: 0, partner: 1, text_attributes: vec![2] }; 50];
        let m = score(&t2, &q, &[1.0, 0.0, 0.0, 1.0], &[0.0, 1.0].repeat(50), 2, &c);
        assert_eq!((m.random_or, m.random_ior, m.random_tor, m.retrieved_partner), (0.5, 0.0, 1.0, 50));
    }
}
