//! `mine_pseudo_bow`: pseudo-BoW captions for uncaptioned images ("A Fistful of Words" §3,
//! spec `bow-and-otter.md` §3). With a finished `curate train` run, frozen: the intact captions
//! of the aligned set `S_a` are embedded once (or read from a features table), each input
//! image's `c` random-resized crops are embedded, each crop retrieves its `k` nearest captions
//! exactly ([`crate::knn`]), and the words of the `k·c` retrieved captions are ranked
//! ([`crate::text::pseudo_bow`]); the first `p` words are the image's caption.
//!
//! Output: the input columns with `caption` replaced by the pseudo-caption, plus `words` (the
//! ranked words kept, with `count` = cnt(w, NN_i), `pool_count` = cnt(w, S_a) and the
//! strategy's `score`), `neighbor_ids` (the `sample_id`s of all `k·c` retrieved captions, crop
//! by crop, best first, with repeats) and `strategy`. Rejects: `missing_image`,
//! `undecodable_image`, and `no_candidate_word` (nothing left to rank).
//!
//! The report scores all four strategies on the same retrievals: when the input carries a
//! true label (`label_text`, e.g. ImageNet-21k synset words, kept aside and never used for
//! mining), how often a label word is among the `p` words; and it shows example pseudo captions
//! beside their images.
//!
//! Randomness (crops, `rm_top_rand`, the optional word shuffle) is keyed by `sample_id`, so the
//! output does not depend on thread count or chunking.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use arrow_array::builder::{BooleanBuilder, StringBuilder};
use arrow_array::{
    Array, ArrayRef, Float64Array, ListArray, RecordBatch, StringArray, StructArray, UInt32Array, UInt64Array,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Fields, Schema, SchemaRef};
use burn::tensor::Device;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::bow::StemmerChoice;
use super::images::{self, ImageRows};
use super::{Problems, StageStats, Transform};
use crate::error::{Error, Result};
use crate::io::PathPatterns;
use crate::models::preprocess::decode;
use crate::rng::RowRng;
use crate::schema::{self, str_col, Chunk, Reject};
use crate::text::pseudo_bow::{PoolWords, RankedWord, Strategy};
use crate::text::vocab::Candidates;
use crate::text::{is_content_word, lowercase, Stemmer, Tokenizer};
use crate::train::data::{random_resized_crop, read_features, string_column};
use crate::train::trained::TrainedRun;

pub const TYPE: &str = "mine_pseudo_bow";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MinePseudoBowConfig {
    /// The pseudo-labeller: a finished `curate train` run directory (config.json + model.bpk),
    /// used frozen.
    pub run: String,
    /// The aligned set `S_a`: Parquet files or globs with `sample_id` and intact captions (a
    /// `curate run` output, or the training table of the run). An intact run's output is the
    /// whole set; a BoW output lacks the pairs its `bow` stage emptied (a note says so).
    pub aligned: PathPatterns,
    /// Caption column of `aligned`. Default: `original_caption` when the table has it (a BoW
    /// output keeps the intact caption there; the retrieval pool is intact captions, spec §3
    /// step 1), otherwise `caption`.
    #[serde(default)]
    pub caption_column: Option<String>,
    /// Precomputed caption embeddings in the run's space (`sample_id` + `embedding`, joined by
    /// `sample_id`); default: embed the captions with the run's text tower.
    #[serde(default)]
    pub aligned_features: Option<PathPatterns>,
    /// `c`: random-resized crops per image.
    #[serde(default = "default_crops")]
    pub crops: usize,
    /// `k`: captions retrieved per crop (exact inner-product top-k).
    #[serde(default = "default_neighbors")]
    pub neighbors: usize,
    /// `p`: words kept per pseudo-caption.
    #[serde(default = "default_words")]
    pub words: usize,
    /// `max_count`, `rm_top_max_count`, `rm_top_rand` or `weighted_count` (the paper's best).
    #[serde(default = "default_strategy")]
    pub strategy: Strategy,
    /// `t` of `Top_t(S_a)`, the frequent words the `rm_top_*` strategies drop.
    #[serde(default = "default_top_words")]
    pub top_words: usize,
    /// Which words compete for `Top_t(S_a)`: `content` (default, §7 A1) or `raw` (every word:
    /// stopwords, numbers and punctuation take places too), the `bow` stage's rule (§1.2).
    /// Pseudo-words are content words either way.
    #[serde(default)]
    pub frequency_candidates: Candidates,
    /// RandomResizedCrop area fraction range (spec §7 A6: [0.2, 1]).
    #[serde(default = "default_crop_scale")]
    pub crop_scale: [f64; 2],
    /// RandomResizedCrop aspect-ratio range.
    #[serde(default = "default_crop_ratio")]
    pub crop_ratio: [f64; 2],
    /// Shuffle the `p` words of each caption (default: rank order).
    #[serde(default)]
    pub shuffle_words: bool,
    /// `english`: count words by Snowball stem (shown in their most frequent form).
    #[serde(default = "default_stemmer")]
    pub stemmer: StemmerChoice,
    /// Split leading/trailing ASCII punctuation off words (spec §7 A3), as the `bow` stage.
    #[serde(default)]
    pub split_punct: bool,
    /// Images per forward pass (each contributes `crops` crops).
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Folder holding img2dataset's `<shard>.tar` files, for rows without a `path`.
    #[serde(default)]
    pub shards_dir: Option<String>,
    /// Column with each image's true class words, for the report only (never for mining).
    #[serde(default = "default_label_column")]
    pub label_column: String,
    /// Example pseudo captions shown in the report.
    #[serde(default = "default_examples")]
    pub examples: usize,
    /// Overrides the pipeline seed.
    #[serde(default)]
    pub seed: Option<u64>,
}

/// The most crops of an image [`MinePseudoBow`] takes.
const MAX_CROPS: usize = 1024;

fn default_crops() -> usize {
    5
}
fn default_neighbors() -> usize {
    10
}
fn default_words() -> usize {
    4
}
fn default_strategy() -> Strategy {
    Strategy::WeightedCount
}
fn default_top_words() -> usize {
    1000
}
fn default_crop_scale() -> [f64; 2] {
    [0.2, 1.0]
}
fn default_crop_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}
fn default_stemmer() -> StemmerChoice {
    StemmerChoice::None
}
fn default_batch() -> usize {
    64
}
fn default_label_column() -> String {
    schema::LABEL_TEXT.into()
}
fn default_examples() -> usize {
    12
}

/// Names of the output columns this stage adds.
pub const WORDS: &str = "words";
pub const NEIGHBOR_IDS: &str = "neighbor_ids";
pub const STRATEGY: &str = "strategy";

fn words_type() -> DataType {
    let item = Fields::from(vec![
        Field::new("word", DataType::Utf8, false),
        Field::new("count", DataType::UInt32, false),
        Field::new("pool_count", DataType::UInt64, false),
        Field::new("score", DataType::Float64, false),
    ]);
    DataType::List(Arc::new(Field::new("item", DataType::Struct(item), false)))
}

fn neighbor_ids_type() -> DataType {
    DataType::List(Arc::new(Field::new("item", DataType::Utf8, false)))
}

impl MinePseudoBowConfig {
    pub fn build(
        &self,
        pipeline_seed: u64,
        input: &SchemaRef,
        device: &Device,
        problems: &mut Problems,
    ) -> Option<MinePseudoBow> {
        let references = images::reference_columns(input, TYPE, problems);
        images::check_shards_dir(&self.shards_dir, problems);
        // Crops are held in memory per batch of images (each 3×224×224 floats): 1,024 crops of
        // an image are already 600 MB a batch image.
        for (key, v, most) in [
            ("crops", self.crops, MAX_CROPS),
            ("neighbors", self.neighbors, usize::MAX),
            ("words", self.words, usize::MAX),
        ] {
            if v == 0 || v > most {
                let range = if most == usize::MAX { "at least 1".to_owned() } else { format!("from 1 to {most}") };
                problems.push(
                    key,
                    format!("{key} must be {range}, got {v}"),
                    Some("the paper's defaults: c = 5, k = 10, p = 4".into()),
                );
            }
        }
        if self.batch_size == 0 {
            problems.push("batch_size", "batch_size must be at least 1", None);
        }
        let range_ok = |r: [f64; 2], lo: f64| lo < r[0] && r[0] <= r[1];
        if !range_ok(self.crop_scale, 0.0) || self.crop_scale[1] > 1.0 {
            problems.push(
                "crop_scale",
                format!("crop_scale must satisfy 0 < min <= max <= 1, got {:?}", self.crop_scale),
                None,
            );
        }
        if !range_ok(self.crop_ratio, 0.0) {
            problems.push(
                "crop_ratio",
                format!("crop_ratio must satisfy 0 < min <= max, got {:?}", self.crop_ratio),
                None,
            );
        }
        let aligned = match self.aligned.expand() {
            Ok(files) => files,
            Err(e) => {
                problems.push(
                    "aligned",
                    format!("aligned set {e}"),
                    Some("Parquet tables of the captioned pairs S_a".into()),
                );
                Vec::new()
            }
        };
        let aligned_features = match self.aligned_features.as_ref().map(PathPatterns::expand) {
            None => None,
            Some(Ok(files)) => Some(files),
            Some(Err(e)) => {
                problems.push("aligned_features", format!("features {e}"), None);
                None
            }
        };
        // The tables' footers: what the run would find only after embedding the input.
        for file in &aligned {
            let caption = self.caption_column.as_deref();
            if let Some(problem) = table_problem(file, |has| {
                let caption = aligned_caption_column(caption, has);
                [schema::SAMPLE_ID, caption].into_iter().find(|c| !has(c)).map(str::to_owned)
            }) {
                problems.push("aligned", problem, Some("Parquet tables of the captioned pairs S_a".into()));
            }
        }
        for file in aligned_features.iter().flatten() {
            if let Some(problem) = table_problem(file, |has| {
                [schema::SAMPLE_ID, "embedding"].into_iter().find(|c| !has(c)).map(str::to_owned)
            }) {
                problems.push(
                    "aligned_features",
                    problem,
                    Some("caption embeddings as `encode_text` writes them: `sample_id` + `embedding`".into()),
                );
            }
        }
        // The columns this stage adds must not be there already (a second mining stage): the
        // output would hold each twice, and readers refuse such files.
        let taken: Vec<&str> =
            [WORDS, NEIGHBOR_IDS, STRATEGY].into_iter().filter(|c| input.field_with_name(c).is_ok()).collect();
        if !taken.is_empty() {
            problems.push(
                "type",
                format!(
                    "the stage's input already has {} (from an earlier `mine_pseudo_bow`?)",
                    crate::error::list(&taken)
                ),
                Some("mine once per pipeline: this stage adds those columns".into()),
            );
        }
        // The default column scores when the input has it; a column named by hand must be there.
        if self.label_column != schema::LABEL_TEXT {
            match input.field_with_name(&self.label_column) {
                Ok(f) if f.data_type() == &DataType::Utf8 => {}
                Ok(f) => problems.push(
                    "label_column",
                    format!("column `{}` is {}, expected text", self.label_column, f.data_type()),
                    None,
                ),
                Err(_) => {
                    let names: Vec<&str> = input.fields().iter().map(|f| f.name().as_str()).collect();
                    problems.push(
                        "label_column",
                        format!("the stage's input has no column `{}`", self.label_column),
                        Some(crate::error::column_hint(&self.label_column, &names)),
                    )
                }
            }
        }
        // The run is loaded whatever else is wrong, so one `validate` reports a missing run too.
        let run = match TrainedRun::load(Path::new(&self.run), device) {
            Ok(r) => Some(r),
            Err(e) => {
                let (message, hint) = e.into_message_and_hint();
                problems.push("run", message, hint);
                None
            }
        };
        // Caption features of another width than the run's embeddings: a fixed width is in the
        // footer (a list column's is known only from its rows, checked when the pool is built).
        if let Some(run) = &run {
            for file in aligned_features.iter().flatten() {
                let Ok(schema) = crate::io::parquet::read_schema(file) else { continue };
                if let Ok(DataType::FixedSizeList(_, d)) = schema.field_with_name("embedding").map(|f| f.data_type()) {
                    if *d as usize != run.dim() {
                        problems.push(
                            "aligned_features",
                            format!(
                                "`{}` holds {d}-d embeddings; the run `{}` embeds to {}-d",
                                file.display(),
                                self.run,
                                run.dim()
                            ),
                            Some(ALIGNED_FEATURES_HINT.into()),
                        );
                    }
                }
            }
        }
        let run = run.filter(|_| problems.is_empty())?;
        let mut fields: Vec<Field> =
            input.fields().iter().filter(|f| f.name() != schema::CAPTION).map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new(schema::CAPTION, DataType::Utf8, false));
        fields.push(Field::new(WORDS, words_type(), false));
        fields.push(Field::new(NEIGHBOR_IDS, neighbor_ids_type(), false));
        fields.push(Field::new(STRATEGY, DataType::Utf8, false));
        let label = input
            .field_with_name(&self.label_column)
            .ok()
            .filter(|f| f.data_type() == &DataType::Utf8)
            .map(|_| self.label_column.clone());
        Some(MinePseudoBow {
            config: self.clone(),
            seed: self.seed.unwrap_or(pipeline_seed),
            tokenizer: Tokenizer { split_punct: self.split_punct },
            stemmer: (self.stemmer == StemmerChoice::English).then(Stemmer::english),
            aligned,
            aligned_features,
            run,
            references,
            label,
            schema: Arc::new(Schema::new(fields)),
            pool: None,
        })
    }
}

/// Why the Parquet table `file` cannot serve, from its footer: unreadable, or without the
/// column `missing` names (given a test of the columns it has).
/// Where `aligned_features` must come from.
const ALIGNED_FEATURES_HINT: &str = "the features must come from the same run's text tower";

fn table_problem(file: &Path, missing: impl FnOnce(&dyn Fn(&str) -> bool) -> Option<String>) -> Option<String> {
    match crate::io::parquet::read_schema(file) {
        Err(e) => Some(e.to_string()),
        Ok(schema) => {
            let column = missing(&|c| schema.field_with_name(c).is_ok())?;
            let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
            Some(format!("`{}` has no column `{column}` (its columns: {})", file.display(), names.join(", ")))
        }
    }
}

/// The retrieval pool: caption embeddings, ids and words of `S_a`.
struct Pool {
    ids: Vec<String>,
    /// `[ids.len(), dim]` row-major, L2-normalised.
    embeddings: Vec<f32>,
    words: PoolWords,
    caption_column: String,
    embed_seconds: f64,
    embedded: bool,
}

/// One report example: an image and its pseudo caption under every strategy.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Example {
    sample_id: String,
    image: Option<String>,
    label: Option<String>,
    captions: Vec<String>,
}

/// Report accumulators (merged from chunks applied in parallel).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Stats {
    images: u64,
    crops: u64,
    mined: u64,
    words_out: u64,
    no_candidate: u64,
    labelled: u64,
    /// Per strategy ([`Strategy::ALL`] order): labelled images with any / all of their label
    /// words among the `p` words, and images with no candidate.
    hit_any: [u64; 4],
    hit_all: [u64; 4],
    empty: [u64; 4],
    search_seconds: f64,
    embed_seconds: f64,
    /// Lowest input rows first, at most `examples_kept`.
    examples: BTreeMap<u64, Example>,
    examples_kept: usize,
}

pub struct MinePseudoBow {
    config: MinePseudoBowConfig,
    seed: u64,
    tokenizer: Tokenizer,
    stemmer: Option<Stemmer>,
    aligned: Vec<PathBuf>,
    /// The files of `aligned_features` as compiled (its patterns are not expanded again).
    aligned_features: Option<Vec<PathBuf>>,
    run: TrainedRun,
    references: Vec<&'static str>,
    /// The label column, when the input has it (report only).
    label: Option<String>,
    schema: SchemaRef,
    pool: Option<Pool>,
}

/// The caption column of an aligned table with columns `has`: `column` when given, else
/// `original_caption` where the table has it (a BoW output's intact captions), else `caption`.
fn aligned_caption_column<'a>(column: Option<&'a str>, has: &dyn Fn(&str) -> bool) -> &'a str {
    column.unwrap_or(if has(schema::ORIGINAL_CAPTION) { schema::ORIGINAL_CAPTION } else { schema::CAPTION })
}

/// The aligned set's rows, as [`read_aligned`] reads them.
struct Aligned {
    ids: Vec<String>,
    captions: Vec<String>,
    /// The caption column used.
    column: String,
    /// A table has BoW's `split` column: a BoW output, which lacks the pairs its `bow` stage
    /// emptied (they are in its `rejects/`).
    bow_output: bool,
    /// Rows left out for a null `sample_id`, or a null or blank caption.
    left_out: usize,
}

/// `sample_id`s and captions of the aligned tables.
fn read_aligned(files: &[PathBuf], column: &Option<String>) -> Result<Aligned> {
    let mut ids = Vec::new();
    let mut captions = Vec::new();
    let mut used = String::new();
    let mut bow_output = false;
    let mut left_out = 0;
    for file in files {
        for batch in crate::io::parquet::read_file(file)? {
            bow_output |= batch.column_by_name(schema::SPLIT).is_some();
            let col = aligned_caption_column(column.as_deref(), &|c| batch.column_by_name(c).is_some()).to_owned();
            let batch_ids = string_column(&batch, schema::SAMPLE_ID, file)?;
            let batch_captions = string_column(&batch, &col, file)?;
            for (id, caption) in batch_ids.into_iter().zip(batch_captions) {
                // A blank caption has no word to give, and would take a neighbour's place.
                match (id, caption) {
                    (Some(id), Some(caption)) if super::has_words(&caption) => {
                        ids.push(id);
                        captions.push(caption);
                    }
                    _ => left_out += 1,
                }
            }
            used = col;
        }
    }
    // Ids name the retrieved captions in the output (`neighbor_ids`) and join the features:
    // two rows of one id could be told apart by neither.
    let mut seen = std::collections::HashSet::with_capacity(ids.len());
    if let Some(id) = ids.iter().find(|id| !seen.insert(id.as_str())) {
        return Err(Error::Data {
            message: format!("the aligned set has two captioned rows with `sample_id` `{id}`"),
            hint: Some("list each aligned table once; ids must be unique across the `aligned` tables".into()),
        });
    }
    if ids.is_empty() {
        return Err(Error::Data {
            message: "the aligned set has no captioned rows".into(),
            hint: Some("`aligned` should list the Parquet tables of the captioned pairs".into()),
        });
    }
    Ok(Aligned { ids, captions, column: used, bow_output, left_out })
}

impl MinePseudoBow {
    /// Reads `S_a`, counts its words and embeds its captions (or reads their embeddings).
    fn build_pool(&self) -> Result<Pool> {
        let Aligned { ids, captions, column: caption_column, bow_output, left_out } =
            read_aligned(&self.aligned, &self.config.caption_column)?;
        if left_out > 0 {
            say!("{TYPE}: note: {left_out} aligned row(s) left out of the pool: a null `sample_id`, or a null or blank caption");
        }
        if bow_output {
            say!(
                "{TYPE}: note: the aligned set is a BoW output, without the pairs its `bow` stage emptied (they are in \
                 its `rejects/`), so the pool lacks their intact captions (spec §3 step 1 pools all of S_a); an \
                 intact run (`pipelines/intact.toml`) gives the whole set"
            );
        }
        let words = PoolWords::build(
            captions.iter().map(String::as_str),
            self.tokenizer,
            self.stemmer.as_ref(),
            self.config.top_words,
            self.config.frequency_candidates,
        );
        let started = Instant::now();
        let dim = self.run.dim();
        let (embeddings, embedded) = match &self.aligned_features {
            Some(features) => {
                let (by_id, d) = read_features(features)?;
                if d != dim {
                    return Err(Error::Data {
                        message: format!(
                            "`aligned_features` are {d}-d; the run `{}` embeds to {dim}-d",
                            self.config.run
                        ),
                        hint: Some(ALIGNED_FEATURES_HINT.into()),
                    });
                }
                let mut out = Vec::with_capacity(ids.len() * dim);
                for id in &ids {
                    let row = by_id.get(id).ok_or_else(|| Error::Data {
                        message: format!("aligned caption `{id}` has no row in `aligned_features`"),
                        hint: Some("the features table must cover every aligned `sample_id`".into()),
                    })?;
                    // L2-normalised as the run's own caption embeddings are (`e_y = norm(g(y))`,
                    // spec §3): the search ranks by inner product, which is then the cosine.
                    // (Scaled first, so that no row's squared norm leaves f32's range.)
                    let mut row = row.clone();
                    crate::models::pooling::scale_rows_for_normalising(&mut row, dim);
                    let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                    out.extend(row.iter().map(|x| x / norm));
                }
                (out, false)
            }
            None => {
                say!("{TYPE}: embedding {} aligned captions with `{}` ...", ids.len(), self.config.run);
                let texts: Vec<&str> = captions.iter().map(String::as_str).collect();
                (self.run.embed_texts(&texts)?, true)
            }
        };
        let embed_seconds = started.elapsed().as_secs_f64();
        if embedded {
            say!(
                "{TYPE}: {} captions embedded in {embed_seconds:.1} s ({:.0}/s)",
                ids.len(),
                ids.len() as f64 / embed_seconds.max(1e-9)
            );
        }
        Ok(Pool { ids, embeddings, words, caption_column, embed_seconds, embedded })
    }

    /// The content words of a label (commas separate ImageNet synonyms), in match form.
    fn label_words(&self, label: &str) -> Vec<String> {
        let lowered = lowercase(label).replace(',', " ");
        let mut words = Vec::new();
        self.tokenizer.split_into(&lowered, &mut words);
        let mut out: Vec<String> = words
            .into_iter()
            .filter(|w| is_content_word(w))
            .map(|w| match &self.stemmer {
                Some(s) => s.stem(w).into_owned(),
                None => w.to_owned(),
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The match form of a pool word (its stem with a stemmer), to compare with label words.
    fn match_form(&self, pool: &PoolWords, id: u32) -> String {
        let w = pool.surface(id);
        match &self.stemmer {
            Some(s) => s.stem(w).into_owned(),
            None => w.to_owned(),
        }
    }

    /// The pseudo-caption: the first `p` ranked words, in rank order or shuffled.
    fn caption(&self, pool: &PoolWords, kept: &[RankedWord], sample_id: &str) -> String {
        let mut words: Vec<&str> = kept.iter().map(|w| pool.surface(w.id)).collect();
        if self.config.shuffle_words {
            RowRng::new(self.seed, "mine_pseudo_bow/order", sample_id).shuffle(&mut words);
        }
        words.join(" ")
    }
}

/// The ranked words of one mined image.
struct Mined {
    kept: Vec<RankedWord>,
    caption: String,
    neighbors: Vec<u32>,
}

impl Transform for MinePseudoBow {
    fn parallel_inside(&self) -> bool {
        true
    }

    /// The run's model, config and tokenizer, the aligned tables and their features.
    fn side_inputs(&self) -> Vec<PathBuf> {
        let mut files = self.run.files();
        files.extend(self.aligned.iter().cloned());
        files.extend(self.aligned_features.iter().flatten().cloned());
        files
    }

    /// The pool is built from the aligned set (its own files), not from the stream: no fit
    /// pass, and before the run clears an earlier one's output, which a bad aligned table or
    /// features table then leaves intact. Its embedding time is reported on its own
    /// (`aligned_embed_seconds`), apart from the crops'.
    fn prepare(&mut self) -> Result<()> {
        let pool = self.build_pool()?;
        if self.config.neighbors > pool.ids.len() {
            say!(
                "note: {TYPE}: `neighbors = {}` is more than the {} aligned captions: each crop retrieves all of them",
                self.config.neighbors,
                pool.ids.len()
            );
        }
        self.pool = Some(pool);
        Ok(())
    }

    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
        let pool = self.pool.as_ref().expect("the pool is built before the stream");
        let c = &self.config;
        let Chunk { batch, mut rejects, skipped } = chunk;
        let n = batch.num_rows();
        let ids = str_col(&batch, schema::SAMPLE_ID);
        let rows = ImageRows::new(&batch, &self.references, c.shards_dir.as_deref());
        let size = self.run.image_size();
        let transform = self.run.transform();
        let dim = self.run.dim();
        let per_crop = 3 * size * size;

        // 1. Crops of each image, embedded batch by batch (the next batch is decoded while the
        //    model runs). `ok[r]`: whether row r's image was usable.
        let crops_of = |r: usize| -> std::result::Result<Vec<f32>, images::Failure> {
            let bytes = rows.bytes(r)?;
            let img = decode(&bytes).map_err(|e| ("undecodable_image", format!("{}: {e}", rows.describe(r))))?;
            let mut rng = RowRng::new(self.seed, "mine_pseudo_bow/crop", ids.value(r));
            let mut out = Vec::with_capacity(c.crops * per_crop);
            for _ in 0..c.crops {
                let crop = random_resized_crop(img.width, img.height, c.crop_scale, c.crop_ratio, &mut rng);
                transform.crop(&img, crop, &mut out);
            }
            Ok(out)
        };
        let all: Vec<usize> = (0..n).collect();
        let parts: Vec<&[usize]> = all.chunks(c.batch_size).collect();
        let load = |part: &[usize]| part.par_iter().map(|&r| crops_of(r)).collect::<Vec<_>>();
        let mut queries: Vec<f32> = Vec::new();
        let mut good: Vec<usize> = Vec::new();
        // This stage's rejects, put in row order at the end (unusable images are found first).
        let mut own_rejects: Vec<Reject> = Vec::new();
        let embed_started = Instant::now();
        let mut next = parts.first().map(|p| load(p));
        for (i, part) in parts.iter().enumerate() {
            let loaded = next.take().expect("loaded ahead");
            let mut pixels = Vec::with_capacity(part.len() * c.crops * per_crop);
            let mut batch_rows = 0;
            for (&r, result) in part.iter().zip(loaded) {
                match result {
                    Ok(t) => {
                        pixels.extend_from_slice(&t);
                        good.push(r);
                        batch_rows += 1;
                    }
                    Err((reason, detail)) => own_rejects.push(Reject {
                        stage: TYPE,
                        source_file: String::new(),
                        row: first_row + r as u64,
                        sample_id: Some(ids.value(r).to_owned()),
                        reason,
                        detail: detail.into(),
                        raw: schema::caption_bytes(&batch, r),
                    }),
                }
            }
            let (embedded, ahead) = rayon::join(
                || self.run.embed_images(pixels, batch_rows * c.crops),
                || parts.get(i + 1).map(|p| load(p)),
            );
            next = ahead;
            queries.extend(embedded?);
        }
        let embed_seconds = embed_started.elapsed().as_secs_f64();

        // 2. Each crop's k nearest aligned captions, exhaustively: the CPU kernel on the host,
        // products and top-k on the run's device otherwise (a GPU).
        let search_started = Instant::now();
        let top = if crate::models::activation::is_host(self.run.device()) {
            crate::knn::exact_top_k(&queries, &pool.embeddings, dim, c.neighbors)
        } else {
            crate::knn::device_top_k(&queries, &pool.embeddings, dim, c.neighbors, self.run.device())
        };
        let search_seconds = search_started.elapsed().as_secs_f64();
        let per_image = c.crops * top.k;

        // 3. Rank the retrieved words, under the configured strategy and (for the report) all.
        let labels = self.label.as_ref().map(|l| str_col(&batch, l));
        let paths = self.references.contains(&schema::PATH).then(|| str_col(&batch, schema::PATH));
        let strategy_index = Strategy::ALL.iter().position(|s| *s == c.strategy).expect("listed");
        let ranked: Vec<(Mined, [Vec<RankedWord>; 4])> = good
            .par_iter()
            .enumerate()
            .map(|(g, &r)| {
                let neighbors = top.ids[g * per_image..(g + 1) * per_image].to_vec();
                let counts = pool.words.count_neighbors(&neighbors);
                let sample_id = ids.value(r);
                let all: [Vec<RankedWord>; 4] = Strategy::ALL.map(|s| {
                    let mut rng = RowRng::new(self.seed, "mine_pseudo_bow/rank", sample_id);
                    let mut words = pool.words.rank(&counts, s, &mut rng);
                    words.truncate(c.words);
                    words
                });
                let kept = all[strategy_index].clone();
                let caption = self.caption(&pool.words, &kept, sample_id);
                (Mined { kept, caption, neighbors }, all)
            })
            .collect();

        // 4. Output rows, rejects and report statistics.
        let mut keep = BooleanBuilder::with_capacity(n);
        let mut mined_by_row: Vec<Option<&Mined>> = vec![None; n];
        let mut stats = Stats { examples_kept: c.examples, ..Stats::default() };
        for (&r, (m, all)) in good.iter().zip(&ranked) {
            if let Some(labels) = labels.filter(|l| l.is_valid(r)) {
                let label = self.label_words(labels.value(r));
                if !label.is_empty() {
                    stats.labelled += 1;
                    for (s, words) in all.iter().enumerate() {
                        let have: Vec<String> = words.iter().map(|w| self.match_form(&pool.words, w.id)).collect();
                        stats.hit_any[s] += u64::from(label.iter().any(|l| have.contains(l)));
                        stats.hit_all[s] += u64::from(label.iter().all(|l| have.contains(l)));
                    }
                }
            }
            for (s, words) in all.iter().enumerate() {
                stats.empty[s] += u64::from(words.is_empty());
            }
            // Report examples: the first good rows of each chunk (the merge keeps the lowest).
            if stats.examples.len() < c.examples {
                stats.examples.insert(
                    first_row + r as u64,
                    Example {
                        sample_id: ids.value(r).to_owned(),
                        image: paths.filter(|p| p.is_valid(r)).map(|p| p.value(r).to_owned()),
                        label: labels.filter(|l| l.is_valid(r)).map(|l| l.value(r).to_owned()),
                        captions: all.iter().map(|w| self.caption(&pool.words, w, ids.value(r))).collect(),
                    },
                );
            }
            if m.kept.is_empty() {
                stats.no_candidate += 1;
                own_rejects.push(Reject {
                    stage: TYPE,
                    source_file: String::new(),
                    row: first_row + r as u64,
                    sample_id: Some(ids.value(r).to_owned()),
                    reason: "no_candidate_word",
                    detail: format!(
                        "the {} retrieved captions have no word left under `{}`",
                        m.neighbors.len(),
                        c.strategy.name()
                    )
                    .into(),
                    raw: schema::caption_bytes(&batch, r),
                });
            } else {
                mined_by_row[r] = Some(m);
            }
        }
        own_rejects.sort_by_key(|r| r.row);
        for r in own_rejects {
            rejects.push(r);
        }
        for m in &mined_by_row {
            keep.append_value(m.is_some());
        }
        let kept_rows: Vec<&Mined> = mined_by_row.iter().flatten().copied().collect();
        stats.images = n as u64;
        stats.crops = (good.len() * c.crops) as u64;
        stats.mined = kept_rows.len() as u64;
        stats.words_out = kept_rows.iter().map(|m| m.kept.len() as u64).sum();
        stats.search_seconds = search_seconds;
        stats.embed_seconds = embed_seconds;

        let mask = keep.finish();
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.schema.fields().len());
        for f in batch.schema().fields().iter().filter(|f| f.name() != schema::CAPTION) {
            let col = batch.column_by_name(f.name()).expect("own schema");
            columns.push(arrow_select::filter::filter(col.as_ref(), &mask)?);
        }
        columns.push(Arc::new(StringArray::from_iter_values(kept_rows.iter().map(|m| m.caption.as_str()))));
        columns.push(words_column(&pool.words, &kept_rows));
        columns.push(neighbors_column(&pool.ids, &kept_rows));
        columns.push(Arc::new(StringArray::from_iter_values(kept_rows.iter().map(|_| c.strategy.name()))));
        let chunk = Chunk { batch: RecordBatch::try_new(self.schema.clone(), columns)?, rejects, skipped };
        Ok((chunk, StageStats::MinePseudoBow(Box::new(stats))))
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn metadata(&self) -> Vec<(String, String)> {
        let c = &self.config;
        vec![
            ("curate.pseudo_bow.run".into(), c.run.clone()),
            ("curate.pseudo_bow.strategy".into(), c.strategy.name().into()),
            ("curate.pseudo_bow.crops".into(), c.crops.to_string()),
            ("curate.pseudo_bow.neighbors".into(), c.neighbors.to_string()),
            ("curate.pseudo_bow.words".into(), c.words.to_string()),
        ]
    }

    fn report(&self, stats: &StageStats) -> serde_json::Value {
        let none = Stats::default();
        let s = match stats {
            StageStats::MinePseudoBow(s) => s,
            _ => &none,
        };
        let c = &self.config;
        let pool = self.pool.as_ref();
        let rate = |x: u64| if s.labelled > 0 { x as f64 / s.labelled as f64 } else { f64::NAN };
        let strategies: serde_json::Map<String, serde_json::Value> = Strategy::ALL
            .iter()
            .enumerate()
            .map(|(i, st)| {
                (
                    st.name().to_owned(),
                    json!({
                        "label_word_hit_rate": rate(s.hit_any[i]),
                        "all_label_words_rate": rate(s.hit_all[i]),
                        "no_candidate": s.empty[i],
                    }),
                )
            })
            .collect();
        let examples: Vec<serde_json::Value> = s
            .examples
            .values()
            .take(c.examples)
            .map(|e| {
                let captions: serde_json::Map<String, serde_json::Value> =
                    Strategy::ALL.iter().zip(&e.captions).map(|(st, cap)| (st.name().to_owned(), json!(cap))).collect();
                json!({"sample_id": e.sample_id, "image": e.image, "label": e.label, "captions": captions})
            })
            .collect();
        json!({
            "pseudo_bow": true,
            "run": c.run,
            "strategy": c.strategy.name(),
            "crops": c.crops,
            "neighbors": c.neighbors,
            "words": c.words,
            "top_words": c.top_words,
            "frequency_candidates": c.frequency_candidates,
            "aligned_captions": pool.map_or(0, |p| p.ids.len()),
            "aligned_vocabulary": pool.map_or(0, |p| p.words.vocabulary()),
            "aligned_caption_column": pool.map(|p| p.caption_column.clone()),
            "aligned_embedded_here": pool.is_some_and(|p| p.embedded),
            "aligned_embed_seconds": pool.map_or(0.0, |p| p.embed_seconds),
            "images_in": s.images,
            "images_mined": s.mined,
            "no_candidate_word": s.no_candidate,
            "mean_words": (s.mined > 0).then(|| s.words_out as f64 / s.mined as f64),
            "crop_embed_seconds": s.embed_seconds,
            "search_seconds": s.search_seconds,
            "crops_per_second_searched": if s.search_seconds > 0.0 { s.crops as f64 / s.search_seconds } else { 0.0 },
            "label_column": self.label,
            "labelled_images": s.labelled,
            "strategies": strategies,
            "examples": examples,
        })
    }
}

impl Stats {
    pub(crate) fn merge(&mut self, add: Stats) {
        let s = self;
        s.examples_kept = s.examples_kept.max(add.examples_kept);
        s.images += add.images;
        s.crops += add.crops;
        s.mined += add.mined;
        s.words_out += add.words_out;
        s.no_candidate += add.no_candidate;
        s.labelled += add.labelled;
        for i in 0..4 {
            s.hit_any[i] += add.hit_any[i];
            s.hit_all[i] += add.hit_all[i];
            s.empty[i] += add.empty[i];
        }
        s.search_seconds += add.search_seconds;
        s.embed_seconds += add.embed_seconds;
        s.examples.extend(add.examples);
        while s.examples.len() > s.examples_kept {
            s.examples.pop_last();
        }
    }
}

/// `words`: per row, the kept words with their counts and score.
fn words_column(pool: &PoolWords, rows: &[&Mined]) -> ArrayRef {
    let mut offsets = vec![0i32];
    let (mut word, mut count, mut pool_count, mut score) = (StringBuilder::new(), vec![], vec![], vec![]);
    for m in rows {
        for w in &m.kept {
            word.append_value(pool.surface(w.id));
            count.push(w.count);
            pool_count.push(w.pool_count);
            score.push(w.score);
        }
        offsets.push(offsets.last().expect("starts at 0") + m.kept.len() as i32);
    }
    let DataType::List(item) = words_type() else { unreachable!("a list type") };
    let DataType::Struct(fields) = item.data_type().clone() else { unreachable!("a struct item") };
    let values = StructArray::new(
        fields,
        vec![
            Arc::new(word.finish()),
            Arc::new(UInt32Array::from(count)),
            Arc::new(UInt64Array::from(pool_count)),
            Arc::new(Float64Array::from(score)),
        ],
        None,
    );
    Arc::new(ListArray::new(item, OffsetBuffer::new(offsets.into()), Arc::new(values), None))
}

/// `neighbor_ids`: per row, the `sample_id`s of the `k·c` retrieved captions.
fn neighbors_column(ids: &[String], rows: &[&Mined]) -> ArrayRef {
    let mut offsets = vec![0i32];
    let mut values = StringBuilder::new();
    for m in rows {
        for &n in &m.neighbors {
            values.append_value(&ids[n as usize]);
        }
        offsets.push(offsets.last().expect("starts at 0") + m.neighbors.len() as i32);
    }
    let DataType::List(item) = neighbor_ids_type() else { unreachable!("a list type") };
    Arc::new(ListArray::new(item, OffsetBuffer::new(offsets.into()), Arc::new(values.finish()), None))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example(id: &str) -> Example {
        Example { sample_id: id.into(), image: Some(format!("{id}.jpg")), label: None, captions: vec!["dog".into()] }
    }

    #[test]
    fn chunk_statistics_merge_keep_the_lowest_examples_and_survive_a_checkpoint() {
        let chunk = |first: u64, seconds: f64| {
            let mut s = Stats { images: 3, mined: 2, examples_kept: 2, search_seconds: seconds, ..Stats::default() };
            s.hit_any[1] = 1;
            for r in first..first + 2 {
                s.examples.insert(r, example(&format!("s{r}")));
            }
            StageStats::MinePseudoBow(Box::new(s))
        };
        // Merged in either order: the same counts and the two lowest rows' examples.
        let (mut a, mut b) = (StageStats::None, StageStats::None);
        for c in [chunk(10, 0.5), chunk(0, 0.25), chunk(5, 0.125)] {
            a.merge(c);
        }
        for c in [chunk(5, 0.125), chunk(10, 0.5), chunk(0, 0.25)] {
            b.merge(c);
        }
        let StageStats::MinePseudoBow(s) = &a else { panic!("{a:?}") };
        assert_eq!((s.images, s.mined, s.hit_any[1], s.search_seconds), (9, 6, 3, 0.875));
        assert_eq!(s.examples.keys().copied().collect::<Vec<_>>(), [0, 1]);
        let json = serde_json::to_string(&a).unwrap();
        assert_eq!(json, serde_json::to_string(&b).unwrap());
        // A checkpoint's JSON gives them back as they were.
        let back: StageStats = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
    }

    #[test]
    fn a_bow_output_is_read_by_its_intact_captions_and_known_as_one() {
        use arrow_array::{ArrayRef, RecordBatch, StringArray};
        let dir = tempfile::tempdir().unwrap();
        let s = |v: Vec<&str>| -> ArrayRef { std::sync::Arc::new(StringArray::from(v)) };
        let write = |name: &str, batch: RecordBatch| {
            let path = dir.path().join(name);
            let mut w =
                parquet::arrow::ArrowWriter::try_new(std::fs::File::create(&path).unwrap(), batch.schema(), None)
                    .unwrap();
            w.write(&batch).unwrap();
            w.close().unwrap();
            path
        };
        let bow = write(
            "bow.parquet",
            RecordBatch::try_from_iter([
                ("sample_id", s(vec!["a", "b"])),
                ("caption", s(vec!["dog red", "a cat"])),
                ("original_caption", s(vec!["a red dog", "a cat"])),
                ("split", s(vec!["deformed", "base"])),
            ])
            .unwrap(),
        );
        let a = read_aligned(&[bow], &None).unwrap();
        assert_eq!(
            (a.captions, a.column.as_str(), a.bow_output),
            (vec!["a red dog".into(), "a cat".into()], "original_caption", true)
        );
        let plain = write(
            "plain.parquet",
            RecordBatch::try_from_iter([("sample_id", s(vec!["c"])), ("caption", s(vec!["a bird"]))]).unwrap(),
        );
        let p = read_aligned(&[plain], &None).unwrap();
        assert_eq!((p.captions, p.column.as_str(), p.bow_output), (vec!["a bird".into()], "caption", false));
        assert_eq!(p.left_out, 0);
        // Rows without an id or a caption are left out, and counted.
        let holes = write(
            "holes.parquet",
            RecordBatch::try_from_iter([
                ("sample_id", std::sync::Arc::new(StringArray::from(vec![Some("d"), None, Some("f")])) as ArrayRef),
                (
                    "caption",
                    std::sync::Arc::new(StringArray::from(vec![Some("a fox"), Some("an owl"), None])) as ArrayRef,
                ),
            ])
            .unwrap(),
        );
        let h = read_aligned(&[holes], &None).unwrap();
        assert_eq!((h.ids, h.left_out), (vec!["d".to_owned()], 2));
    }
}
