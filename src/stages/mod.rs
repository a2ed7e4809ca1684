//! Stages: one module per stage type. Every stage is a `Config` (serde, `deny_unknown_fields`,
//! documented fields, the papers' defaults) checked by the planner before any data is read, and a
//! runtime built from it. Shared by the readers: `inputs` (checks of the input files),
//! `line_chunks` (the parallel TSV engine), `images` (image references, tar members) and
//! `split_chunks` (smaller chunks where a model stage runs); here,
//! the `Reader`/`Transform` traits and the id bookkeeping.
//!
//! A pipeline is `read_* → transforms → write_parquet`. Readers stream [`Chunk`]s of the
//! `pairs` schema; transforms may first *fit* on one or more passes over the stream (the BoW
//! stage needs the base split and its statistics before deforming) and then *apply* to chunks in
//! parallel; the writer stores the result.

pub mod bow;
pub mod encode_image;
pub mod encode_text;
pub mod images;
pub mod inputs;
pub mod line_chunks;
pub mod mine_pseudo_bow;
pub mod read_cc_tsv;
pub mod read_imagenet21k;
pub mod read_img2dataset;
pub mod read_table;
pub mod read_yfcc;
pub mod split_chunks;
pub mod write_parquet;

use std::collections::BTreeMap;
use std::path::PathBuf;

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use serde::{Deserialize, Serialize};

pub use inputs::{
    expand_inputs, expand_inputs_known_by, header_fields, refuse_non_text, usual_width, usual_width_of_first_lines,
    widest_of_first_lines,
};
pub use line_chunks::{split_tabs, Fields, Line, LineChunks, LineOutcome, BLOCK_BYTES, MAX_FIELDS};

use crate::error::Result;
use crate::schema::{Chunk, Reject, CAPTION, SAMPLE_ID, SOURCE, URL};

/// Rows per chunk. Fixed (not derived from the thread count) so chunking, and with it every
/// output, is the same on every machine.
pub const CHUNK_ROWS: usize = 32 * 1024;

pub type ChunkIter<'a> = Box<dyn Iterator<Item = Result<Chunk>> + Send + 'a>;

/// Computes an input's fingerprint (see [`Reader::fingerprinter`]).
pub type Fingerprinter = Box<dyn FnOnce() -> Result<String> + Send>;

/// A stage that produces `pairs` rows from files.
pub trait Reader: Send + Sync {
    /// Input files, for the manifest's fingerprint.
    fn inputs(&self) -> Vec<PathBuf>;
    /// Streams the input in order. Can be called again for another pass.
    fn open(&self) -> Result<ChunkIter<'_>>;
    /// Reads what the reader needs whole before its first row (YFCC's subset list), once the
    /// run holds its folder and before it clears an earlier run's output there, so that a bad
    /// side file fails the run with that output intact.
    fn prepare(&self) -> Result<()> {
        Ok(())
    }
    /// What computes the manifest's input fingerprint, on a thread of its own beside the
    /// passes: by default the names and bytes of the input files ([`crate::io::fingerprint`]);
    /// an image folder's reader fingerprints its listing instead (it never reads the images).
    fn fingerprinter(&self) -> Fingerprinter {
        let inputs = self.inputs();
        Box::new(move || crate::io::fingerprint(&inputs))
    }
    /// What the inputs' own stamps (size, modification time) do not show of a change, as a
    /// digest: an image folder's listed folders, whose times change when an image is added to
    /// or removed from one. Taken before and after a run, and saved in its checkpoints.
    fn folder_stamp(&self) -> Option<u128> {
        None
    }
    /// Whether rows can have a value in this `pairs` column at all: by default the columns of
    /// the `caption<TAB>url` formats (Conceptual Captions, YFCC); an image folder has no caption,
    /// a table only the columns it maps. A stage that reads a column no row can fill would
    /// reject every row, which the plan refuses.
    fn fills(&self, column: &str) -> bool {
        [SAMPLE_ID, SOURCE, CAPTION, URL].contains(&column)
    }
    /// How rows name their images, for the stages that read them.
    fn image_refs(&self) -> ImageRefs {
        ImageRefs::Paths
    }
}

/// An encoder's `embedding` would replace an earlier encoder's: one encoder per pipeline.
pub fn check_no_embedding_yet(input: &SchemaRef, problems: &mut Problems) {
    if input.field_with_name("embedding").is_ok() {
        problems.push(
            "type",
            "the rows have an `embedding` already (an earlier encoder's), which this stage's would replace",
            Some("one encoder per pipeline: embed with each model in a pipeline of its own".into()),
        );
    }
}

/// How a reader's rows name their images.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageRefs {
    /// By file (`path`).
    Paths,
    /// By tar shard and key (img2dataset's webdataset): the image stages then need `shards_dir`.
    ShardKeys,
    /// By URL only (Conceptual Captions, YFCC, a table whose `path` is not mapped): the images
    /// are not downloaded, and the image stages read files.
    UrlsOnly,
    /// Not at all (a table with neither `path` nor `url` mapped).
    Nothing,
}

/// A stage that maps chunks to chunks, possibly after fitting on the whole input.
pub trait Transform: Send + Sync {
    /// Files the stage reads beside the data (a model, a training run, an aligned table), and
    /// only those: a run's checkpoints stamp them with its inputs, so that one changed before a
    /// killed run is resumed is noticed.
    fn side_inputs(&self) -> Vec<PathBuf> {
        Vec::new()
    }
    /// Number of full passes over the input this stage needs before `apply`.
    fn fit_passes(&self) -> usize {
        0
    }
    /// Whether pass `pass` is still needed, asked just before it starts (a stage may have
    /// learned enough from an earlier pass).
    fn wants_pass(&self, _pass: usize) -> bool {
        true
    }
    /// Sees every chunk of pass `pass`, in input order. `first_row` is the index of the
    /// chunk's first row in the whole input.
    fn fit(&mut self, _pass: usize, _batch: &RecordBatch, _first_row: u64) -> Result<()> {
        Ok(())
    }
    /// Called after the last chunk of pass `pass`.
    fn end_pass(&mut self, _pass: usize) -> Result<()> {
        Ok(())
    }
    /// Reads what the stage needs whole from files of its own (the captions `mine_pseudo_bow`
    /// retrieves from), once the run holds its folder and before it clears an earlier run's
    /// output there, so that a bad side file fails the run with that output intact.
    fn prepare(&mut self) -> Result<()> {
        Ok(())
    }
    /// Called once, after every fit pass and before the streaming pass, to get ready for it
    /// (from files of the stage's own, say).
    fn start_stream(&mut self) -> Result<()> {
        Ok(())
    }
    /// Transforms one chunk, and counts what it did for the report. Called from several
    /// threads at once; must be deterministic.
    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)>;
    /// Whether `apply` keeps every core busy on its own (an encoder: batches on the thread
    /// pool). Its chunks then go through it one at a time, in input order: run side by side,
    /// the pool would finish the first one last, and no shard (nor checkpoint) would be written
    /// until a whole window of chunks was done. A pipeline with such a stage also cuts the
    /// reader's chunks smaller ([`split_chunks`]).
    fn parallel_inside(&self) -> bool {
        false
    }
    fn output_schema(&self) -> SchemaRef;
    /// The report's section of this stage, from the statistics of every chunk it applied to,
    /// merged.
    fn report(&self, stats: &StageStats) -> serde_json::Value;
    /// Key-value pairs for the output files' metadata and the manifest (e.g. the model used).
    fn metadata(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// What one stage counted for its report in some chunks: `apply` returns a chunk's, and the
/// writer merges them in input order, so that what it has merged at any point covers exactly the
/// chunks written (a checkpoint saves it: see `pipeline::checkpoint`). Counts and bounded sets
/// only, so that the merge order changes nothing.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub enum StageStats {
    /// A stage that counts nothing (its report comes from its settings), or no chunk yet.
    #[default]
    None,
    Bow(Box<bow::Stats>),
    MinePseudoBow(Box<mine_pseudo_bow::Stats>),
    /// Rows a stage encoded (`encode_image`'s images).
    Encoded(u64),
}

impl StageStats {
    /// Adds the counts of `later`, a stage's statistics of other chunks.
    pub fn merge(&mut self, later: StageStats) {
        match (self, later) {
            (_, StageStats::None) => {}
            (s @ StageStats::None, later) => *s = later,
            (StageStats::Bow(a), StageStats::Bow(b)) => a.merge(*b),
            (StageStats::MinePseudoBow(a), StageStats::MinePseudoBow(b)) => a.merge(*b),
            (StageStats::Encoded(a), StageStats::Encoded(b)) => *a += b,
            _ => unreachable!("one stage counts one kind of statistics"),
        }
    }
}

/// Counts of rows a reader was configured to skip (not errors, so not stored as rejects):
/// videos in YFCC, rows outside the YFCC15M subset.
pub type Skipped = BTreeMap<&'static str, u64>;

pub const DUPLICATE_ID: &str = "an earlier row has this sample_id (ids must be unique)";

/// The ids seen so far in a reader's stream. Ids of up to 17 digits (YFCC photo ids,
/// img2dataset keys such as `000000012`) are kept exactly in 8 bytes (their length and value);
/// others as 128-bit hashes, 16 bytes whatever the id's length (a collision is as likely as two
/// equal xxh3-128 hashes among the ids, which is never in practice). About 10-21 and 19-39
/// bytes an id with the table's slack: YFCC100M's 100M ids take ~1-2 GB. Readers whose ids
/// come from the data use it, so that a repeated id (a file given twice, a table keyed by image
/// with several captions) is a reject, not a row that joins wrongly later.
#[derive(Default)]
pub struct UniqueIds {
    digits: rustc_hash::FxHashSet<u64>,
    seen: rustc_hash::FxHashSet<u128>,
}

/// `id` as one number when it is 1 to 17 ASCII digits: `length · 10^17 + value`, so that `012`
/// and `12` stay two ids.
fn digits_key(id: &str) -> Option<u64> {
    let b = id.as_bytes();
    if b.is_empty() || b.len() > 17 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let value = b.iter().fold(0u64, |v, d| v * 10 + u64::from(d - b'0'));
    Some(b.len() as u64 * 100_000_000_000_000_000 + value)
}

impl UniqueIds {
    /// `true` the first time `id` is seen.
    pub fn first_time(&mut self, id: &str) -> bool {
        match digits_key(id) {
            Some(k) => self.digits.insert(k),
            None => self.seen.insert(xxhash_rust::xxh3::xxh3_128(id.as_bytes())),
        }
    }

    /// Whether `id` was seen (without adding it).
    pub fn seen(&self, id: &str) -> bool {
        match digits_key(id) {
            Some(k) => self.digits.contains(&k),
            None => self.seen.contains(&xxhash_rust::xxh3::xxh3_128(id.as_bytes())),
        }
    }

    /// Drops the rows of `chunk` whose id was seen before (in this chunk or an earlier one) and
    /// adds `reject(row index, id)` for each to its rejects, which stay in line order (the
    /// chunk's rejects and the rejects made here are each in line order already).
    pub fn reject_repeats(&mut self, mut chunk: Chunk, reject: impl Fn(usize, &str) -> Reject) -> Result<Chunk> {
        let ids = crate::schema::str_col(&chunk.batch, crate::schema::SAMPLE_ID);
        let keep: Vec<bool> = (0..chunk.batch.num_rows()).map(|i| self.first_time(ids.value(i))).collect();
        if keep.iter().all(|&k| k) {
            return Ok(chunk);
        }
        let mut repeats = crate::schema::Rejects::default();
        for i in keep.iter().enumerate().filter(|(_, k)| !**k).map(|(i, _)| i) {
            repeats.push(reject(i, ids.value(i)));
        }
        chunk.rejects = std::mem::take(&mut chunk.rejects).merged_by_row(repeats);
        chunk.batch = crate::schema::keep_rows(&chunk.batch, &keep)?;
        Ok(chunk)
    }
}

/// Why a small side file of a reader (the YFCC15M list, `words.txt`) could not be loaded: it
/// could not be read (no hint about its lines helps), or a line is not what it should be.
pub(crate) enum LoadError {
    Io(String),
    Format(String),
}

/// serde's default for switches that are on unless set off.
pub(crate) fn yes() -> bool {
    true
}

/// `true` if the text has at least one word (§1.1 whitespace): some character that is not
/// whitespace, usually the first.
pub fn has_words(text: &str) -> bool {
    text.chars().any(|c| !crate::text::is_python_whitespace(c))
}

/// A finished stream chunk made of rows held in memory (readers that load a shard at once).
pub fn chunk_of(batch: RecordBatch, rejects: Vec<Reject>) -> Chunk {
    Chunk { batch, rejects: rejects.into(), skipped: Skipped::new() }
}

/// Problems found while checking one stage's config: `(key, message, hint)`; the planner adds
/// the file location of `key`.
#[derive(Debug, Default)]
pub struct Problems(pub Vec<(String, String, Option<String>)>);

impl Problems {
    pub fn push(&mut self, key: impl Into<String>, message: impl Into<String>, hint: Option<String>) {
        self.0.push((key.into(), message.into(), hint));
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::{digits_key, UniqueIds};

    #[test]
    fn ids_of_digits_are_kept_exactly_and_others_by_hash() {
        assert_eq!(digits_key("12"), Some(2 * 100_000_000_000_000_000 + 12));
        assert_ne!(digits_key("012"), digits_key("12"), "a leading zero is another id");
        assert_eq!(digits_key("99999999999999999"), Some(17 * 100_000_000_000_000_000 + 99_999_999_999_999_999));
        for other in ["", "123456789012345678", "12a", "-1", "+1", " 1", "١٢"] {
            assert_eq!(digits_key(other), None, "{other:?}");
        }
        let mut ids = UniqueIds::default();
        for (id, first) in [
            ("000000012", true),
            ("12", true),
            ("12", false),
            ("000000012", false),
            ("5012345678", true),
            ("123456789012345678", true),
            ("123456789012345678", false),
            ("n01440764/x.JPEG", true),
            ("n01440764/x.JPEG", false),
        ] {
            assert_eq!(ids.first_time(id), first, "{id}");
            assert!(ids.seen(id), "{id}");
        }
        assert!(!ids.seen("0012") && !ids.seen("x"));
    }
}
