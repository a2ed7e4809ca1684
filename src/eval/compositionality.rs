//! OTTER's image-text compositionality benchmark (spec `bow-and-otter.md` §6.5, OTTER
//! Appendix D and Table 7; optional in the spec): does an image embedding plus a text
//! embedding retrieve an image that has both the image's attributes and the text's? It owns the
//! table ([`ComposeTable`]: `path`, `attributes`), the draw of the queries ([`Pairs`],
//! [`draw_queries`]), the three overlap rates ([`overlaps`], [`tally`]) and their
//! [`ComposeMetrics`];
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
//! - both embeddings are L2-normalised before they are added (each tower's scale would
//!   otherwise weigh its half of the query);
//! - pairs with an empty `Q_t` (`A_j ⊆ A_i`, so TOR is undefined) do not qualify;
//! - every qualifying ordered pair (`i ≠ j`) is found first ([`Pairs`]: one bit per pair), and
//!   each query draws one uniformly, by a generator seeded per query (`seed`, query index), so
//!   a query does not depend on the number drawn; the paper's 1,000,000 queries (its published
//!   list is not available here) are `--compose-queries 1000000`;
//! - exact score ties go to the lower gallery row ([`crate::knn::exact_top_k`]).
//!
//! Attribute names must be strings: CUB's integer ids would make texts of digits (map them to
//! the names of its `attributes.txt` first). The queries are drawn, embedded and searched in
//! blocks, so memory does not grow with their number.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::Array;
use arrow_schema::{DataType, Field};
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::trained::embed_image_paths;
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

/// The gallery (`--compose`): `path` and `attributes` (a list of strings: the names of the
/// attributes present in the image), in row order. Rows with a null `path` or `attributes` are
/// left out and counted; a null or blank name in a list is refused.
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
                        hint: Some("write each image's attributes as a list of names".into()),
                    })
                }
            };
            if !matches!(inner, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
                return Err(Error::Schema {
                    message: format!(
                        "column `attributes` of `{}` is a list of {inner}, not of strings",
                        file.display()
                    ),
                    hint: Some(
                        "the names are the text queries: map attribute ids to their names (CUB: `attributes.txt`, \
                         written as phrases such as `yellow forehead`)"
                            .into(),
                    ),
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
        for (row, (path, list)) in paths.into_iter().zip(lists).enumerate() {
            let (Some(path), Some(list)) = (path, list) else {
                t.skipped += 1;
                continue;
            };
            // A name is a text query: a null or blank one is a mistake in the table, not a name.
            if list.iter().any(|name| name.as_deref().is_none_or(|n| n.trim().is_empty())) {
                return Err(Error::Data {
                    message: format!(
                        "column `attributes` of `{}` holds a null or blank name (row {row}: {list:?})",
                        file.display()
                    ),
                    hint: Some("each name is a text query: leave out the missing ones".into()),
                });
            }
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

/// Every qualifying ordered pair `(i, j)`: `i ≠ j`, at least `min_shared` attributes shared,
/// `A_j \ A_i` not empty. One bit per pair (`n²/8` bytes: 4.5 MB for CUB's 6,033 images).
pub struct Pairs {
    n: usize,
    words: usize,
    bits: Vec<u64>,
    /// Qualifying pairs of rows `0..i` (`n + 1` entries).
    before: Vec<u64>,
    /// The most attributes any two images share (for the message when no pair qualifies).
    pub most_shared: usize,
}

impl Pairs {
    pub fn find(table: &ComposeTable, min_shared: usize) -> Pairs {
        use rayon::prelude::*;
        let n = table.attributes.len();
        let words = n.div_ceil(64);
        let rows: Vec<(Vec<u64>, usize)> = (0..n)
            .into_par_iter()
            .map(|i| {
                let a = &table.attributes[i];
                let (mut row, mut most) = (vec![0u64; words], 0);
                for (j, b) in table.attributes.iter().enumerate() {
                    if i == j {
                        continue;
                    }
                    let common = shared(a, b);
                    most = most.max(common);
                    if common >= min_shared && common < b.len() {
                        row[j / 64] |= 1 << (j % 64);
                    }
                }
                (row, most)
            })
            .collect();
        let mut before = Vec::with_capacity(n + 1);
        before.push(0u64);
        for (row, _) in &rows {
            let count: u64 = row.iter().map(|w| u64::from(w.count_ones())).sum();
            before.push(before.last().expect("one entry") + count);
        }
        let most_shared = rows.iter().map(|r| r.1).max().unwrap_or(0);
        Pairs { n, words, bits: rows.into_iter().flat_map(|r| r.0).collect(), before, most_shared }
    }

    /// How many ordered pairs qualify.
    pub fn count(&self) -> u64 {
        self.before[self.n]
    }

    /// The `k`-th qualifying pair in row-major order (`k < count`).
    pub fn nth(&self, k: u64) -> (u32, u32) {
        let i = self.before.partition_point(|&b| b <= k) - 1;
        let mut left = k - self.before[i];
        for (w, &word) in self.bits[i * self.words..(i + 1) * self.words].iter().enumerate() {
            let ones = u64::from(word.count_ones());
            if left < ones {
                let mut word = word;
                for _ in 0..left {
                    word &= word - 1;
                }
                return (i as u32, (w * 64 + word.trailing_zeros() as usize) as u32);
            }
            left -= ones;
        }
        unreachable!("k is below the count")
    }
}

/// The draw of an evaluation's queries: the qualifying pairs, how many queries and their seed.
/// The queries themselves are made a block at a time ([`Drawn::queries`]), so memory does not
/// grow with their number.
pub struct Drawn {
    pairs: Pairs,
    count: usize,
    seed: u64,
}

impl std::fmt::Debug for Drawn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Drawn")
            .field("count", &self.count)
            .field("seed", &self.seed)
            .field("qualifying_pairs", &self.pairs.count())
            .finish()
    }
}

impl Drawn {
    /// How many queries the evaluation draws.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// How many ordered pairs qualify (the queries are drawn from them).
    pub fn qualifying_pairs(&self) -> u64 {
        self.pairs.count()
    }

    /// Queries `range` of the draw (within `0..len()`): query `k` depends on the seed and `k`
    /// alone, not on the block it is made in or on the number drawn.
    pub fn queries(&self, table: &ComposeTable, range: std::ops::Range<usize>) -> Vec<Query> {
        range
            .map(|k| {
                let mut rng = RowRng::new(self.seed, "compose", &k.to_string());
                let (i, j) = self.pairs.nth(rng.below(self.pairs.count()));
                let (a, b) = (&table.attributes[i as usize], &table.attributes[j as usize]);
                let extra: Vec<u32> = b.iter().copied().filter(|x| a.binary_search(x).is_err()).collect();
                Query { image: i, partner: j, text_attributes: extra }
            })
            .collect()
    }
}

/// Sets up the draw of `c.queries` queries, each a qualifying pair drawn uniformly ([`Pairs`]).
/// Refuses a config without queries or shared attributes, and a table where no pair qualifies,
/// saying how many attributes its images share at most.
pub fn draw_queries(table: &ComposeTable, c: &ComposeConfig) -> Result<Drawn> {
    if c.queries == 0 || c.min_shared == 0 {
        return Err(Error::Data {
            message: format!(
                "`--compose-queries` {} and `--compose-min-shared` {}: both must be at least 1",
                c.queries, c.min_shared
            ),
            hint: Some(
                "OTTER draws 1,000,000 queries from pairs sharing at least 10 attributes (with none shared the \
                 image query could have no attribute, and IOR no meaning)"
                    .into(),
            ),
        });
    }
    let pairs = Pairs::find(table, c.min_shared);
    if pairs.count() == 0 && pairs.most_shared < c.min_shared {
        return Err(Error::Data {
            message: format!(
                "`{}`: no two images share at least {} attribute(s) (the most any two share is {})",
                table.file.display(),
                c.min_shared,
                pairs.most_shared
            ),
            hint: Some(if pairs.most_shared == 0 {
                "no two of its images have any attribute in common: the benchmark composes an image with what \
                 another image sharing some of its attributes adds (OTTER: CUB's birds, 288 attributes)"
                    .to_owned()
            } else {
                format!(
                    "lower `--compose-min-shared` to at most {} (OTTER: 10 of CUB's 288 attributes)",
                    pairs.most_shared
                )
            }),
        });
    }
    if pairs.count() == 0 {
        return Err(Error::Data {
            message: format!(
                "`{}`: every pair of images sharing at least {} attribute(s) leaves no text query: the second \
                 image has no attribute the first lacks",
                table.file.display(),
                c.min_shared
            ),
            hint: Some(
                "the text names what the second image adds; the images need attributes that tell them apart".into(),
            ),
        });
    }
    Ok(Drawn { pairs, count: c.queries, seed: c.seed })
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
    /// The same for a uniformly drawn image other than the query image.
    pub random_or: f64,
    pub random_ior: f64,
    pub random_tor: f64,
    pub queries: usize,
    pub images: usize,
    /// Distinct attribute names in the table.
    pub attributes: usize,
    pub min_shared: usize,
    pub seed: u64,
    /// Ordered pairs that qualify (the queries are drawn from them).
    pub qualifying_pairs: u64,
    /// Mean `|Q_v|` and `|Q_t|` over the queries.
    pub mean_image_attributes: f64,
    pub mean_text_attributes: f64,
    /// Queries whose retrieved image was `j`, the image the text came from.
    pub retrieved_partner: usize,
    /// Gallery rows left out for a null `path` or `attributes`.
    pub rows_skipped: usize,
    /// Rows whose `path` an earlier row has too (a twin of the query image can be retrieved).
    pub duplicate_paths: usize,
}

/// The gallery row nearest each query vector (`vectors`, `[queries.len() * dim]`) other than
/// its query image, by inner product with the L2-normalised `images` (`[rows * dim]`), exact
/// ties to the lower row.
pub fn nearest(queries: &[Query], vectors: &[f32], images: &[f32], dim: usize) -> Vec<u32> {
    let rows = images.len() / dim;
    let top = crate::knn::exact_top_k(vectors, images, dim, 2.min(rows));
    queries
        .iter()
        .enumerate()
        .map(|(k, q)| *top.ids_of(k).iter().find(|&&r| r != q.image).expect("two gallery images"))
        .collect()
}

/// The figures of `queries` given each one's retrieved row, beside the random baseline (a row
/// other than the query image, drawn per query).
pub fn tally(table: &ComposeTable, queries: &[Query], retrieved: &[u32], c: &ComposeConfig) -> ComposeMetrics {
    let mut t = Tally::default();
    t.add(table, 0, queries, retrieved, c.seed);
    t.finish(table, c, 0)
}

/// The benchmark's sums over the queries scored so far, a block at a time.
#[derive(Debug, Default)]
pub struct Tally {
    sums: [f64; 3],
    random: [f64; 3],
    partner: usize,
    sizes: [usize; 2],
    queries: usize,
}

impl Tally {
    /// Adds the block of queries `first..first + queries.len()` of the draw and the row each one
    /// retrieved; the random baseline's row is drawn from (`seed`, query index).
    pub fn add(&mut self, table: &ComposeTable, first: usize, queries: &[Query], retrieved: &[u32], seed: u64) {
        let rows = table.attributes.len();
        for (k, (q, &r)) in queries.iter().zip(retrieved).enumerate() {
            self.partner += usize::from(r == q.partner);
            let q_v = &table.attributes[q.image as usize];
            self.sizes[0] += q_v.len();
            self.sizes[1] += q.text_attributes.len();
            for (s, o) in self.sums.iter_mut().zip(overlaps(q_v, &q.text_attributes, &table.attributes[r as usize])) {
                *s += o;
            }
            let mut rng = RowRng::new(seed, "compose-random", &(first + k).to_string());
            let drawn = (q.image as usize + 1 + rng.below(rows as u64 - 1) as usize) % rows;
            for (s, o) in self.random.iter_mut().zip(overlaps(q_v, &q.text_attributes, &table.attributes[drawn])) {
                *s += o;
            }
        }
        self.queries += queries.len();
    }

    /// The figures: means over the queries added.
    pub fn finish(self, table: &ComposeTable, c: &ComposeConfig, qualifying_pairs: u64) -> ComposeMetrics {
        let n = self.queries.max(1) as f64;
        ComposeMetrics {
            or: self.sums[0] / n,
            ior: self.sums[1] / n,
            tor: self.sums[2] / n,
            random_or: self.random[0] / n,
            random_ior: self.random[1] / n,
            random_tor: self.random[2] / n,
            queries: self.queries,
            images: table.attributes.len(),
            attributes: table.names.len(),
            min_shared: c.min_shared,
            seed: c.seed,
            qualifying_pairs,
            mean_image_attributes: self.sizes[0] as f64 / n,
            mean_text_attributes: self.sizes[1] as f64 / n,
            retrieved_partner: self.partner,
            rows_skipped: table.skipped,
            duplicate_paths: super::repeated_paths(&table.paths),
        }
    }
}

/// Queries per search block: their texts are embedded and their vectors built a block at a time.
const QUERY_BLOCK: usize = 16_384;

/// Embeds the gallery (`root`: the folder relative paths resolve against) with `run`'s image
/// tower, then each block of `queries` (drawn by [`draw_queries`]) with its text tower (distinct
/// texts once per block), searches and scores them.
pub fn evaluate(
    run: &TrainedRun,
    table: &ComposeTable,
    drawn: &Drawn,
    root: Option<&Path>,
    c: &ComposeConfig,
    note: &dyn Fn(String),
) -> Result<ComposeMetrics> {
    let pre_caption = run.config.data.pre_caption;
    note(format!(
        "compositionality: embedding {} images (`{}`), then {} queries",
        table.paths.len(),
        table.file.display(),
        drawn.len()
    ));
    let dim = run.dim();
    let images = embed_image_paths(run, &table.paths, root, |pixels, n| run.embed_images(pixels, n))?;
    if images.iter().any(|v| !v.is_finite()) {
        return Err(Error::Model { message: "the model's image embeddings are not finite".into(), hint: None });
    }
    let mut tally = Tally::default();
    for first in (0..drawn.len()).step_by(QUERY_BLOCK) {
        let block = &drawn.queries(table, first..drawn.len().min(first + QUERY_BLOCK));
        let mut index: FxHashMap<String, usize> = FxHashMap::default();
        let mut distinct: Vec<String> = Vec::new();
        let mut which = Vec::with_capacity(block.len());
        for q in block {
            let mut text = text_of(&q.text_attributes, &table.names);
            if pre_caption {
                text = crate::text::pre_caption(&text, crate::text::PRE_CAPTION_WORDS).ok_or_else(|| {
                    Error::data(format!(
                        "the text query `{text}` has nothing left after `pre_caption` (the run's `data.pre_caption`)"
                    ))
                })?;
            }
            let next = distinct.len();
            which.push(*index.entry(text.clone()).or_insert_with(|| {
                distinct.push(text);
                next
            }));
        }
        let refs: Vec<&str> = distinct.iter().map(String::as_str).collect();
        let texts = run.embed_texts(&refs)?;
        if texts.iter().any(|v| !v.is_finite()) {
            return Err(Error::Model { message: "the model's text embeddings are not finite".into(), hint: None });
        }
        let vectors: Vec<f32> = block
            .iter()
            .zip(&which)
            .flat_map(|(q, &w)| {
                let v = &images[q.image as usize * dim..(q.image as usize + 1) * dim];
                v.iter().zip(&texts[w * dim..(w + 1) * dim]).map(|(a, b)| a + b).collect::<Vec<_>>()
            })
            .collect();
        tally.add(table, first, block, &nearest(block, &vectors, &images, dim), c.seed);
        if drawn.len() > QUERY_BLOCK {
            note(format!("compositionality: {} / {} queries", first + block.len(), drawn.len()));
        }
    }
    Ok(tally.finish(table, c, drawn.qualifying_pairs()))
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
    fn pairs_are_every_qualifying_ordered_pair_in_row_order() {
        // Images 0-2 share 3 attributes with each other; image 3 shares none; A_2 ⊂ A_0, A_1, so
        // (0, 2) and (1, 2) have an empty Q_t. 70 images: more than one word of bits per row.
        let mut rows = vec![vec![1, 2, 3, 4], vec![1, 2, 3, 5], vec![1, 2, 3], vec![8, 9]];
        let p = Pairs::find(&table(rows.clone()), 3);
        let all: Vec<(u32, u32)> = (0..p.count()).map(|k| p.nth(k)).collect();
        assert_eq!(all, [(0, 1), (1, 0), (2, 0), (2, 1)]);
        assert_eq!(p.most_shared, 3);
        rows.extend((0..66).map(|k| vec![1, 2, 3, 100 + k]));
        let t = table(rows);
        let p = Pairs::find(&t, 3);
        let all: Vec<(u32, u32)> = (0..p.count()).map(|k| p.nth(k)).collect();
        let mut want = Vec::new();
        for i in 0..70u32 {
            for j in 0..70u32 {
                let (a, b) = (&t.attributes[i as usize], &t.attributes[j as usize]);
                if i != j && shared(a, b) >= 3 && b.iter().any(|x| !a.contains(x)) {
                    want.push((i, j));
                }
            }
        }
        assert_eq!(all, want);
        assert!(all.iter().any(|&(_, j)| j >= 64) && all.iter().any(|&(i, _)| i >= 64));
    }

    #[test]
    fn queries_are_drawn_from_the_qualifying_pairs_and_seeded_per_query() {
        let t = table(vec![vec![1, 2, 3, 4], vec![1, 2, 3, 5], vec![1, 2, 3], vec![8, 9]]);
        let c = ComposeConfig { queries: 200, min_shared: 3, seed: 7 };
        let drawn = draw_queries(&t, &c).unwrap();
        assert_eq!((drawn.len(), drawn.qualifying_pairs()), (200, 4));
        let d = drawn.queries(&t, 0..200);
        for x in &d {
            let (a, b) = (&t.attributes[x.image as usize], &t.attributes[x.partner as usize]);
            let extra: Vec<u32> = b.iter().copied().filter(|v| !a.contains(v)).collect();
            assert!(!extra.is_empty() && x.text_attributes == extra, "{x:?}");
        }
        let mut pairs: Vec<(u32, u32)> = d.iter().map(|x| (x.image, x.partner)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs, [(0, 1), (1, 0), (2, 0), (2, 1)]);
        // A query does not depend on how many are drawn or on its block; another seed draws others.
        let few = draw_queries(&t, &ComposeConfig { queries: 5, ..c.clone() }).unwrap();
        assert_eq!(few.queries(&t, 0..5)[..], d[..5]);
        assert_eq!(drawn.queries(&t, 150..200)[..], d[150..]);
        assert_ne!(draw_queries(&t, &ComposeConfig { seed: 8, ..c.clone() }).unwrap().queries(&t, 0..200), d);
        // Rare pairs are still found: 2 qualifying ordered pairs among 2,000 images.
        let mut rare: Vec<Vec<u32>> = (0..2000).map(|k| vec![10_000 + k]).collect();
        rare[3] = vec![1, 2];
        rare[1500] = vec![1, 3];
        let rare = table(rare);
        let d = draw_queries(&rare, &ComposeConfig { queries: 50, min_shared: 1, seed: 0 }).unwrap();
        assert_eq!(d.qualifying_pairs(), 2);
        assert!(d
            .queries(&rare, 0..50)
            .iter()
            .all(|q| (q.image, q.partner) == (3, 1500) || (q.image, q.partner) == (1500, 3)));
        // No pair shares 4: refused, saying the most any two share; 0 queries or 0 shared too.
        let e = draw_queries(&t, &ComposeConfig { min_shared: 4, ..c.clone() }).unwrap_err().to_string();
        assert!(e.contains("(the most any two share is 3)") && e.contains("to at most 3"), "{e}");
        // Pairs that share enough but add nothing: another message.
        let same = table(vec![vec![1, 2], vec![1, 2]]);
        let e = draw_queries(&same, &ComposeConfig { min_shared: 1, ..c.clone() }).unwrap_err().to_string();
        assert!(e.contains("leaves no text query"), "{e}");
        // Images with no attribute in common: no smaller --compose-min-shared would do.
        let apart = table(vec![vec![1], vec![2], vec![3]]);
        let e = draw_queries(&apart, &ComposeConfig { min_shared: 1, ..c.clone() }).unwrap_err().to_string();
        assert!(e.contains("most any two share is 0") && e.contains("have any attribute in common"), "{e}");
        assert!(!e.contains("lower `--compose-min-shared`"), "{e}");
        for (queries, min_shared) in [(0, 3), (10, 0)] {
            let e = draw_queries(&t, &ComposeConfig { queries, min_shared, seed: 0 }).unwrap_err().to_string();
            assert!(e.contains("both must be at least 1"), "{e}");
        }
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
        let vectors = [2.0, 0.0, -1.0, 1.0];
        let retrieved = nearest(&queries, &vectors, &images, 2);
        assert_eq!(retrieved, [1, 1]);
        let c = ComposeConfig { queries: 2, min_shared: 1, seed: 0 };
        let m = tally(&t, &queries, &retrieved, &c);
        // Query 0: Q_v {1,2}, Q_t {3}, R = A_1 = {1,3}: OR 2/3, IOR 1/2, TOR 1.
        // Query 1: Q_v {4}, Q_t {2,3}, R = {1,3}: OR 1/3, IOR 0, TOR 1/2.
        assert!((m.or - 0.5).abs() < 1e-15 && (m.ior - 0.25).abs() < 1e-15 && (m.tor - 0.75).abs() < 1e-15, "{m:?}");
        assert_eq!((m.queries, m.images, m.retrieved_partner, m.duplicate_paths), (2, 4, 0, 0));
        assert_eq!((m.mean_image_attributes, m.mean_text_attributes), (1.5, 1.5));
        // The random baseline never draws the query image: with a 2-image gallery it is the
        // other one, every time.
        let mut t2 = table(vec![vec![1], vec![2]]);
        t2.paths[1] = t2.paths[0].clone();
        let q = vec![Query { image: 0, partner: 1, text_attributes: vec![2] }; 50];
        let m = tally(&t2, &q, &[1; 50], &c);
        assert_eq!((m.random_or, m.random_ior, m.random_tor, m.retrieved_partner), (0.5, 0.0, 1.0, 50));
        assert_eq!(m.duplicate_paths, 1);
        // Tallied a block at a time, the figures are those of one block: the random baseline is
        // drawn by query index.
        let q: Vec<Query> = (0..40u32).map(|k| Query { image: k % 4, partner: 2, text_attributes: vec![3] }).collect();
        let r: Vec<u32> = (0..40u32).map(|k| (k + 1) % 4).collect();
        let whole = tally(&t, &q, &r, &c);
        let mut blocks = Tally::default();
        blocks.add(&t, 0, &q[..17], &r[..17], c.seed);
        blocks.add(&t, 17, &q[17..], &r[17..], c.seed);
        assert_eq!(blocks.finish(&t, &c, 0), whole);
        let mut shifted = Tally::default();
        shifted.add(&t, 1, &q, &r, c.seed);
        assert_ne!(shifted.finish(&t, &c, 0).random_or, whole.random_or);
    }
}
