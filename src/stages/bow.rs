//! `bow`: the Bag-of-Words caption deformations of "A Fistful of Words" (Tejankar et al.,
//! §3.1; spec `bow-and-otter.md` §1–2).
//!
//! "mostly" mode keeps a uniformly random base set of exactly `round(base_fraction·N)` captions
//! byte-identical and deforms the rest with the cascade
//! `Shuffle → RmStopNalpha → LimitToBaseVocab → RmTopFreq(t) → Keep(n)`; a deformed caption left
//! with no word is dropped (a `bow/empty_after_bow` reject). "only" mode deforms every caption
//! and has no base set, so the two base-derived filters are refused.
//!
//! Passes ("mostly"): (0) key every captioned row by `xxh3(seed, "bow.split", sample_id)` and
//! take the `round(base_fraction·N)` smallest keys as the base set; (1) count base-caption
//! document frequencies: `V_base` and `Top_t`; then apply, chunks in parallel. Pass 1 is
//! usually skipped: pass 0 already keeps the captions whose key falls in a band a little wider
//! than the expected base quantile (up to `1.1·base_fraction + 0.005` of the key range), and if
//! the final threshold lies inside the band the statistics come from that cache. For the
//! default 10% the margin is `0.047·√N` standard deviations of the count of keys in the band:
//! about 2 for 2,000 rows (pass 1 ran for 6 of 300 seeds on 2,000 captions), 15 for 100k, 80
//! for CC3M. Either way the result is the same; only the number of reads differs. Shuffle draws
//! from a per-row stream keyed by `(seed, "bow.shuffle", sample_id)`. Both depend only on
//! `sample_id`, so the output is the same for any thread count, chunking or input sharding.

use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::Arc;

use arrow_array::builder::StringBuilder;
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use rayon::prelude::*;
use rustc_hash::{FxHashMap, FxHashSet};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::{Problems, StageStats, Transform};
use crate::error::Result;
use crate::rng::{row_key, RowRng};
use crate::schema::{self, str_col, Chunk};
use crate::text::vocab::{Candidates, Counts};
use crate::text::{ascii_word_spans, is_content_word, lowercase, Stemmer, Tokenizer};

pub const TYPE: &str = "bow";

/// Longest caption length (words) tracked individually in the length histograms; longer
/// captions share the last bin.
pub const MAX_HIST_WORDS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A base set of `base_fraction` of the captions (0.1 in the paper) kept intact, the
    /// operators on the rest (the paper's default).
    Mostly,
    /// Operators on every caption (F-T4 "only BoW").
    Only,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StemmerChoice {
    None,
    /// Snowball English, used only to match words against `V_base` and `Top_t`. Whether a word
    /// is a frequency candidate is decided on the word, not its stem.
    English,
}

/// The default cascade ("default BoW", F-T2): mostly-BoW, Shuffle + RmStopNalpha +
/// LimitToBaseVocab + RmTopFreq(1000) + Keep(4), 10% base.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BowConfig {
    #[serde(default = "default_mode")]
    pub mode: Mode,
    /// Fraction of captions kept intact as the base set ("mostly" mode).
    #[serde(default = "default_base_fraction")]
    pub base_fraction: f64,
    /// Shuffle: random permutation of the caption's words.
    #[serde(default = "super::yes")]
    pub shuffle: bool,
    /// RmStopNalpha: drop non-alphabetical words and NLTK English stopwords.
    #[serde(default = "super::yes")]
    pub rm_stop_nalpha: bool,
    /// LimitToBaseVocab: drop words that never occur in a base caption.
    #[serde(default = "super::yes")]
    pub limit_to_base_vocab: bool,
    /// RmTopFreq(t): drop the `t` most frequent words of the base captions (by document
    /// frequency); 0 turns it off.
    #[serde(default = "default_rm_top_freq")]
    pub rm_top_freq: usize,
    /// Keep(n): keep the first `n` surviving words, always last; 0 turns it off.
    #[serde(default = "default_keep_words")]
    pub keep_words: usize,
    /// Words that may enter the top-`t` list: `content` (alphabetical non-stopwords, so `t`
    /// counts content words) or `raw` (every word).
    #[serde(default)]
    pub frequency_candidates: Candidates,
    /// Stemmer for vocabulary and frequency matching.
    #[serde(default = "default_stemmer")]
    pub stemmer: StemmerChoice,
    /// Split leading/trailing ASCII punctuation off words (for raw web captions; spec §7 A3).
    #[serde(default)]
    pub split_punct: bool,
    /// Keep only the first occurrence of a repeated word, before Shuffle (off in the paper,
    /// spec §7 A4).
    #[serde(default)]
    pub dedup: bool,
    /// Seed of the base split and the shuffles; defaults to the pipeline's `seed`.
    #[serde(default)]
    pub seed: Option<u64>,
}

fn default_mode() -> Mode {
    Mode::Mostly
}
fn default_base_fraction() -> f64 {
    0.1
}
fn default_rm_top_freq() -> usize {
    1000
}
fn default_keep_words() -> usize {
    4
}
fn default_stemmer() -> StemmerChoice {
    StemmerChoice::None
}

/// A fraction as a person writes it: `0.1`, but `1e-300` rather than three hundred digits.
fn readable(x: f64) -> String {
    if x != 0.0 && x.is_finite() && !(1e-4..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

impl BowConfig {
    /// `input`: the schema of the rows coming in, which must be `pairs` as a reader writes them:
    /// the stage adds `original_caption` and `split`, so it runs once, right after the reader.
    pub fn build(&self, pipeline_seed: u64, input: &Schema, problems: &mut Problems) -> Option<Bow> {
        if input.fields() != schema::pairs().fields() {
            let extra: Vec<&str> = input
                .fields()
                .iter()
                .map(|f| f.name().as_str())
                .filter(|n| schema::pairs().field_with_name(n).is_err())
                .collect();
            problems.push(
                "type",
                format!(
                    "the `bow` stage takes the `pairs` rows of the read stage, and these rows also have {}",
                    extra.iter().map(|n| format!("`{n}`")).collect::<Vec<_>>().join(", ")
                ),
                Some("put the `bow` stage right after the read stage, once per pipeline".into()),
            );
        }
        let only = self.mode == Mode::Only;
        if only && self.limit_to_base_vocab {
            problems.push(
                "limit_to_base_vocab",
                "LimitToBaseVocab needs a base set, which \"only\" mode does not have",
                Some("set `limit_to_base_vocab = false`, or `mode = \"mostly\"`".into()),
            );
        }
        if only && self.rm_top_freq > 0 {
            problems.push(
                "rm_top_freq",
                "RmTopFreq needs base-set frequencies, which \"only\" mode does not have",
                Some("set `rm_top_freq = 0`, or `mode = \"mostly\"`".into()),
            );
        }
        // The base set's settings have nothing to act on in "only" mode: a run would ignore them.
        let base_settings = [
            ("base_fraction", self.base_fraction != default_base_fraction()),
            ("stemmer", self.stemmer != default_stemmer()),
            ("frequency_candidates", self.frequency_candidates != Candidates::default()),
        ];
        for (key, set) in base_settings {
            if only && set {
                problems.push(
                    key,
                    format!("`{key}` has no effect in \"only\" mode, which has no base set"),
                    Some(format!("leave `{key}` out, or set `mode = \"mostly\"`")),
                );
            }
        }
        let fraction_ok = 0.0 < self.base_fraction && self.base_fraction < 1.0;
        if !only && !fraction_ok {
            problems.push(
                "base_fraction",
                format!("base_fraction must be in (0, 1), got {}", readable(self.base_fraction)),
                Some("the paper uses 0.1".into()),
            );
        }
        if !problems.is_empty() {
            return None;
        }
        let mut warnings = Vec::new();
        let operators = [self.shuffle, self.rm_stop_nalpha, self.dedup, self.limit_to_base_vocab];
        let no_operator = !operators.contains(&true) && self.rm_top_freq == 0 && self.keep_words == 0;
        if no_operator {
            // The ablations' "intact" row: right statistics, but not the intact data.
            let w = "every operator is off: the deformed captions are the captions tokenised (lower-cased, \
                     words joined by one space), not the captions as read; for intact data, run without a \
                     `bow` stage (pipelines/intact.toml)";
            say!("warning: stage `bow`: {w}");
            warnings.push(w.to_owned());
        }
        // Base-set settings with nothing to act on. Not errors, as in "only" mode: a sweep over
        // `rm_top_freq` may well include 0.
        let matched = self.limit_to_base_vocab || self.rm_top_freq > 0;
        let idle = [
            ("stemmer", self.stemmer != default_stemmer() && !matched, "LimitToBaseVocab and RmTopFreq are off"),
            (
                "frequency_candidates",
                self.frequency_candidates != Candidates::default() && self.rm_top_freq == 0,
                "RmTopFreq is off (`rm_top_freq = 0`)",
            ),
        ];
        for (key, set, why) in idle {
            if !only && set {
                let w = format!("`{key}` has no effect: {why}");
                say!("warning: stage `bow`: {w}");
                warnings.push(w);
            }
        }
        Some(Bow {
            config: self.clone(),
            seed: self.seed.unwrap_or(pipeline_seed),
            tokenizer: Tokenizer { split_punct: self.split_punct },
            stemmer: (self.stemmer == StemmerChoice::English).then(Stemmer::english),
            split_keys: Vec::new(),
            band: Vec::new(),
            band_text: String::new(),
            // Expected base quantile plus 10% and 0.005 of margin: ~11% of rows cached.
            band_limit: ((self.base_fraction * 1.1 + 0.005).min(1.0) * u64::MAX as f64) as u64,
            stats_done: false,
            base: Vec::new(),
            base_df: Counts::default(),
            candidate_df: Counts::default(),
            base_surface: FxHashSet::default(),
            vocab: FxHashSet::default(),
            table: WordTable::default(),
            top: Vec::new(),
            top_set: FxHashSet::default(),
            schema: output_schema(),
            warnings,
            said_all_empty: false,
            top_takes_all: None,
        })
    }
}

/// `pairs` + `original_caption` + `split`, the new columns beside `caption`.
pub fn output_schema() -> SchemaRef {
    let pairs = schema::pairs();
    let mut fields: Vec<Field> = Vec::new();
    for f in pairs.fields() {
        fields.push(f.as_ref().clone());
        if f.name() == schema::CAPTION {
            fields.push(Field::new(schema::ORIGINAL_CAPTION, DataType::Utf8, true));
            fields.push(Field::new(schema::SPLIT, DataType::Utf8, false));
        }
    }
    Arc::new(Schema::new(fields))
}

/// Statistics gathered while applying (merged from chunks; every merge is a sum, so the
/// result does not depend on the order chunks finish in). Word counts are dense vectors
/// indexed by [`WordTable`] id, plus a map for words outside the table.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Stats {
    rows_in: u64,
    no_caption: u64,
    base: u64,
    deformed_in: u64,
    deformed_out: u64,
    emptied: u64,
    words_before: u64,
    words_after: u64,
    words_deformed_after: u64,
    len_before: Vec<u64>,
    len_after: Vec<u64>,
    /// Occurrences (before, after, after in the surviving deformed captions) by table id.
    ids: Vec<[u64; 3]>,
    before_other: Counts,
    after_other: Counts,
    deformed_other: Counts,
}

/// Band rows counted per parallel job when the base statistics come from the band: enough
/// captions (~40k words) to outweigh a job's cost, few enough to spread over the cores.
const BAND_ROWS_PER_JOB: usize = 4096;

/// The word-count slots of [`Stats`]: words of every caption before the cascade, of every
/// output caption after it, and of the deformed output captions only.
const BEFORE: usize = 0;
const AFTER: usize = 1;
const DEFORMED_AFTER: usize = 2;

impl Stats {
    pub(crate) fn merge(&mut self, o: Stats) {
        self.rows_in += o.rows_in;
        self.no_caption += o.no_caption;
        self.base += o.base;
        self.deformed_in += o.deformed_in;
        self.deformed_out += o.deformed_out;
        self.emptied += o.emptied;
        self.words_before += o.words_before;
        self.words_after += o.words_after;
        self.words_deformed_after += o.words_deformed_after;
        add_hist(&mut self.len_before, &o.len_before);
        add_hist(&mut self.len_after, &o.len_after);
        self.before_other.merge(o.before_other);
        self.after_other.merge(o.after_other);
        self.deformed_other.merge(o.deformed_other);
        if self.ids.len() < o.ids.len() {
            self.ids.resize(o.ids.len(), [0; 3]);
        }
        for (a, b) in self.ids.iter_mut().zip(&o.ids) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += y;
            }
        }
    }

    /// Adds a chunk's counts by table id.
    fn add_counts(&mut self, counts: &[[u32; 3]]) {
        if self.ids.len() < counts.len() {
            self.ids.resize(counts.len(), [0; 3]);
        }
        for (a, b) in self.ids.iter_mut().zip(counts) {
            for (x, y) in a.iter_mut().zip(b) {
                *x += u64::from(*y);
            }
        }
    }

    /// Adds one occurrence of `word` to a chunk's counts in `SLOT` ([`BEFORE`], [`AFTER`],
    /// [`DEFORMED_AFTER`]): by id when the table has it, else by string.
    #[inline]
    fn count<const SLOT: usize>(ids: &mut [[u32; 3]], other: &mut Counts, word: &str, e: Option<Entry>) {
        match e {
            Some(e) => ids[e.id()][SLOT] += 1,
            None => other.add_occurrences([word]),
        }
    }

    /// Distinct words counted in `slot` (see [`Stats::count`]).
    fn distinct(&self, slot: usize) -> usize {
        let other = [&self.before_other, &self.after_other, &self.deformed_other][slot];
        self.ids.iter().filter(|c| c[slot] > 0).count() + other.len()
    }

    /// Occurrences per distinct word in `SLOT` (see [`Stats::count`]), largest first, and the
    /// number of distinct words.
    fn ranked(&self, slot: usize) -> (Vec<u64>, usize) {
        let other = [&self.before_other, &self.after_other, &self.deformed_other][slot];
        let by_id = self.ids.iter().map(|c| c[slot]);
        let mut v: Vec<u64> = by_id.filter(|&c| c > 0).chain(other.iter().map(|(_, c)| c)).collect();
        v.sort_unstable_by(|a, b| b.cmp(a));
        let n = v.len();
        (v, n)
    }
}

fn add_hist(into: &mut Vec<u64>, from: &[u64]) {
    if into.len() < from.len() {
        into.resize(from.len(), 0);
    }
    for (a, b) in into.iter_mut().zip(from) {
        *a += b;
    }
}

fn bump_hist(h: &mut Vec<u64>, len: usize) {
    let bin = len.min(MAX_HIST_WORDS);
    if h.len() <= bin {
        h.resize(bin + 1, 0);
    }
    h[bin] += 1;
}

/// Every surface word of the base captions with the filters' verdict on it, so a caption word
/// costs one hash lookup (ids also index the statistics). Words outside the table are judged
/// directly. Empty in "only" mode.
///
/// Words of at most 15 bytes (nearly all) are keyed by their bytes packed into an integer with
/// the length in the top byte, so a lookup hashes one or two words and compares one integer
/// instead of following a pointer to compare strings. Words of at most 7 bytes (most words of
/// a caption) have a table of their own with 8-byte keys, half the size of the other, so more of
/// it stays in cache. Ids follow base document frequency, most frequent first, so the counters
/// the common words bump share a few cache lines.
#[derive(Debug, Default)]
struct WordTable {
    tiny: HashMap<u64, Entry, BuildHasherDefault<PackedHasher>>,
    short: HashMap<u128, Entry, BuildHasherDefault<PackedHasher>>,
    long: FxHashMap<Box<str>, Entry>,
    len: usize,
}

/// A word of a caption and its [`WordTable`] entry (none for a word outside the base
/// vocabulary).
type Word<'a> = (&'a str, Option<Entry>);

/// A word's id in its [`WordTable`] and whether it passes the filters (RmStopNalpha,
/// LimitToBaseVocab and RmTopFreq, see [`Bow::passes_filters`]), decided once at fit time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry(u32);

impl Entry {
    const PASSES: u32 = 1 << 31;

    fn id(self) -> usize {
        (self.0 & !Self::PASSES) as usize
    }

    fn passes_filters(self) -> bool {
        self.0 & Self::PASSES != 0
    }
}

impl WordTable {
    /// `words[i]` gets id `i`, and passes the filters iff `passes[i]`.
    fn new(words: Vec<Box<str>>, passes: Vec<bool>) -> Self {
        assert!(words.len() < Entry::PASSES as usize, "ids fit below the filters' bit");
        let mut t = WordTable { len: words.len(), ..Default::default() };
        for (i, (w, p)) in words.into_iter().zip(passes).enumerate() {
            let e = Entry(i as u32 | if p { Entry::PASSES } else { 0 });
            match pack_word(&w) {
                Some(Packed::Tiny(key)) => t.tiny.insert(key, e),
                Some(Packed::Short(key)) => t.short.insert(key, e),
                None => t.long.insert(w, e),
            };
        }
        t
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Every (key, entry), by id.
    #[cfg(test)]
    fn entries(&self) -> Vec<(String, Entry)> {
        let mut v: Vec<(String, Entry)> = (self.tiny.iter().map(|(k, e)| (format!("{k:x}"), *e)))
            .chain(self.short.iter().map(|(k, e)| (format!("{k:x}"), *e)))
            .chain(self.long.iter().map(|(k, e)| (k.to_string(), *e)))
            .collect();
        v.sort_by_key(|x| x.1.id());
        v
    }

    #[inline]
    fn get(&self, word: &str) -> Option<Entry> {
        match pack_word(word) {
            Some(Packed::Tiny(key)) => self.tiny.get(&key).copied(),
            Some(Packed::Short(key)) => self.short.get(&key).copied(),
            None => self.long.get(word).copied(),
        }
    }

    /// [`WordTable::get`] for the word `padded[s..e]` of an [`ascii_word_spans`] buffer: the
    /// key comes from one 8- or 16-byte load, masked to the word (the padding keeps it in
    /// bounds).
    #[inline]
    fn get_padded(&self, padded: &[u8], s: usize, e: usize) -> Option<Entry> {
        let len = e - s;
        if len <= 7 {
            let bytes: [u8; 8] = padded[s..s + 8].try_into().expect("8 bytes");
            let key = (u64::from_le_bytes(bytes) & ((1u64 << (8 * len)) - 1)) | ((len as u64) << 56);
            return self.tiny.get(&key).copied();
        }
        if len > 15 {
            // SAFETY: `ascii_word_spans` buffers are ASCII.
            return self.long.get(unsafe { std::str::from_utf8_unchecked(&padded[s..e]) }).copied();
        }
        self.short.get(&padded_key(padded, s, e)).copied()
    }
}

/// The 16-byte [`pack_word`] key of the word `padded[s..e]` (at most 15 bytes) of an
/// [`ascii_word_spans`] buffer, from one masked load (the padding keeps it in bounds).
#[inline]
fn padded_key(padded: &[u8], s: usize, e: usize) -> u128 {
    let len = e - s;
    debug_assert!(len <= 15);
    let bytes: [u8; 16] = padded[s..s + 16].try_into().expect("16 bytes");
    (u128::from_le_bytes(bytes) & ((1u128 << (8 * len)) - 1)) | ((len as u128) << 120)
}

/// Hashes a [`pack_word`] key with a full avalanche (murmur3's finaliser): Fx would leave the
/// bucket index of short words depending on their first bytes only.
#[derive(Default)]
struct PackedHasher(u64);

impl PackedHasher {
    #[inline]
    fn mix(mut x: u64) -> u64 {
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

impl std::hash::Hasher for PackedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, _: &[u8]) {
        unreachable!("only integer keys are hashed")
    }
    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = Self::mix(v);
    }
    #[inline]
    fn write_u128(&mut self, v: u128) {
        self.0 = Self::mix((v as u64) ^ ((v >> 64) as u64).rotate_left(29).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    }
}

/// A word of at most 15 bytes as one integer: the bytes, zero-padded, and the length in the
/// last byte (so `a` and `a\0` differ); 8 bytes wide for words of at most 7.
#[derive(Debug, PartialEq, Eq)]
enum Packed {
    Tiny(u64),
    Short(u128),
}

#[inline]
fn pack_word(word: &str) -> Option<Packed> {
    let b = word.as_bytes();
    if b.len() <= 7 {
        let mut key = [0u8; 8];
        key[..b.len()].copy_from_slice(b);
        key[7] = b.len() as u8;
        return Some(Packed::Tiny(u64::from_le_bytes(key)));
    }
    if b.len() > 15 {
        return None;
    }
    let mut key = [0u8; 16];
    key[..b.len()].copy_from_slice(b);
    key[15] = b.len() as u8;
    Some(Packed::Short(u128::from_le_bytes(key)))
}

/// Base statistics of some captions, merged by summing (so chunks can be counted in parallel).
#[derive(Default)]
struct BaseCounts {
    df: Counts,
    /// With a stemmer: document frequencies of the stems of candidate surface words only (see
    /// [`Bow::candidate_df`]).
    candidate_df: Counts,
    surface: FxHashSet<Box<str>>,
}

pub struct Bow {
    config: BowConfig,
    seed: u64,
    tokenizer: Tokenizer,
    stemmer: Option<Stemmer>,
    /// Pass 0: `(split key, row index)` of every captioned row.
    split_keys: Vec<(u64, u64)>,
    /// Pass 0: rows whose split key is below `band_limit` (base candidates), with where each
    /// one's caption ends in `band_text` (it starts where the one before ends).
    band: Vec<(u64, usize)>,
    /// Pass 0: the captions of the `band` rows, one after another.
    band_text: String,
    band_limit: u64,
    /// The base statistics are complete (from the band or from pass 1).
    stats_done: bool,
    /// Base-set membership by input row index (bitset).
    base: Vec<u64>,
    /// Document frequencies over the base captions (of stems, with a stemmer).
    base_df: Counts,
    /// With a stemmer, the counts `Top_t` is ranked by: a caption counts for a stem when one of
    /// its words with that stem is a frequency candidate. The candidate test is on the word, not
    /// the stem: stopwords stem to non-stopwords (`during` -> `dure`) and content words to
    /// stopwords (`others` -> `other`). Without a stemmer, `base_df` serves.
    candidate_df: Counts,
    /// Surface words of the base captions (kept apart only when stemming).
    base_surface: FxHashSet<Box<str>>,
    /// `V_base` and `Top_t`, in match form (stems with a stemmer).
    vocab: FxHashSet<Box<str>>,
    top: Vec<(String, u64)>,
    top_set: FxHashSet<Box<str>>,
    table: WordTable,
    schema: SchemaRef,
    /// Things the report should point out (a setting that empties the output).
    warnings: Vec<String>,
    /// A warning above already says that every deformed caption ends empty.
    said_all_empty: bool,
    /// The number of frequency candidates (words, or stems with a stemmer) of the base
    /// captions, when `Top_t` holds every one of them.
    top_takes_all: Option<usize>,
}

impl Bow {
    fn mostly(&self) -> bool {
        self.config.mode == Mode::Mostly
    }

    fn is_base(&self, row: u64) -> bool {
        let (w, b) = ((row / 64) as usize, row % 64);
        self.base.get(w).is_some_and(|x| x >> b & 1 == 1)
    }

    /// The form a word is matched in against `V_base` / `Top_t`.
    fn match_form<'a>(&self, word: &'a str) -> std::borrow::Cow<'a, str> {
        match &self.stemmer {
            Some(s) => s.stem(word),
            None => std::borrow::Cow::Borrowed(word),
        }
    }

    /// Document frequencies of some base captions (of their match forms) and, with a stemmer,
    /// their surface words.
    ///
    /// Without a stemmer or punctuation splitting, the words of ASCII captions (nearly all) of
    /// at most 15 bytes are counted by their [`pack_word`] integer, sorted and de-duplicated as
    /// integers, and turned back into strings once at the end: no string is hashed, compared
    /// or allocated per word.
    fn count_base_captions<'a>(&self, captions: impl Iterator<Item = &'a str>) -> BaseCounts {
        let mut counts = BaseCounts::default();
        let mut buf: Vec<&str> = Vec::new();
        let fast = self.stemmer.is_none() && !self.tokenizer.split_punct;
        let mut packed: FxHashMap<u128, u64> = FxHashMap::default();
        let (mut scratch, mut spans, mut keys) = (Vec::new(), Vec::new(), Vec::new());
        for caption in captions {
            spans.clear();
            if fast && ascii_word_spans(caption, &mut scratch, &mut spans) {
                keys.clear();
                let mut long: Vec<&str> = Vec::new();
                for &(s, e) in &spans {
                    let (s, e) = (s as usize, e as usize);
                    if e - s <= 15 {
                        keys.push(padded_key(&scratch, s, e));
                    } else {
                        // SAFETY: `ascii_word_spans` buffers are ASCII.
                        long.push(unsafe { std::str::from_utf8_unchecked(&scratch[s..e]) });
                    }
                }
                keys.sort_unstable();
                keys.dedup();
                for &k in &keys {
                    *packed.entry(k).or_insert(0) += 1;
                }
                long.sort_unstable();
                long.dedup();
                for w in long {
                    counts.df.add(w, 1);
                }
                counts.df.docs += 1;
                continue;
            }
            let lowered = lowercase(caption);
            let mut words = recycle_str(std::mem::take(&mut buf));
            self.tokenizer.split_into(&lowered, &mut words);
            if self.stemmer.is_some() {
                let forms: Vec<String> = words.iter().map(|w| self.match_form(w).into_owned()).collect();
                let refs: Vec<&str> = forms.iter().map(String::as_str).collect();
                counts.df.add_document(&refs);
                let candidates = self.config.frequency_candidates;
                let admitted: Vec<&str> =
                    words.iter().zip(&refs).filter(|(w, _)| candidates.admits(w)).map(|(_, f)| *f).collect();
                counts.candidate_df.add_document(&admitted);
                for w in &words {
                    if !counts.surface.contains(*w) {
                        counts.surface.insert((*w).into());
                    }
                }
            } else {
                counts.df.add_document(&words);
            }
            buf = recycle_str(words);
        }
        for (k, n) in packed {
            let bytes = k.to_le_bytes();
            let word = std::str::from_utf8(&bytes[..bytes[15] as usize]).expect("packed from ASCII");
            counts.df.add(word, n);
        }
        counts
    }

    fn add_base_counts(&mut self, counts: BaseCounts) {
        self.base_df.merge(counts.df);
        self.candidate_df.merge(counts.candidate_df);
        self.base_surface.extend(counts.surface);
    }

    /// The filters of the cascade, per word: whether RmStopNalpha, LimitToBaseVocab and
    /// RmTopFreq(t) (those switched on) all keep `word`. Decided once per base word at fit time
    /// (the [`Entry`] bit); asked here only for words outside the base vocabulary.
    fn passes_filters(&self, word: &str) -> bool {
        let c = &self.config;
        if c.rm_stop_nalpha && !is_content_word(word) {
            return false;
        }
        let limit = c.limit_to_base_vocab && self.mostly();
        let top = c.rm_top_freq > 0 && self.mostly();
        if limit || top {
            let form = self.match_form(word);
            if limit && !self.vocab.contains(form.as_ref()) {
                return false;
            }
            // Only candidates are removed: with a stemmer a stopword can share a top word's stem
            // (`other`, `others`).
            if top && c.frequency_candidates.admits(word) && self.top_set.contains(form.as_ref()) {
                return false;
            }
        }
        true
    }

    /// The cascade on the words of one deformed caption (`words`, with their table entries),
    /// in canonical order; `survivors` gets the words left, in their new order:
    /// - dedup (if set), keeping each word where it first occurs, so that Shuffle + Keep(n) draw
    ///   a uniform subset of the distinct words (deduplicated after the shuffle, a word written
    ///   twice would be twice as likely to be kept);
    /// - Shuffle, from the row's own stream `(seed, "bow.shuffle", sample_id)`;
    /// - RmStopNalpha, LimitToBaseVocab, RmTopFreq(t): per word, one verdict for the three
    ///   ([`Bow::passes_filters`]), so their order does not matter;
    /// - Keep(n): the first `n` survivors, always last.
    #[inline]
    fn deform<'w>(&self, sample_id: &str, words: &mut Vec<Word<'w>>, survivors: &mut Vec<Word<'w>>) {
        let c = &self.config;
        if c.dedup {
            let mut distinct = 0;
            for i in 0..words.len() {
                let w = words[i].0;
                if !words[..distinct].iter().any(|k| k.0 == w) {
                    words[distinct] = words[i];
                    distinct += 1;
                }
            }
            words.truncate(distinct);
        }
        if c.shuffle {
            RowRng::new(self.seed, "bow.shuffle", sample_id).shuffle(words);
        }
        survivors.extend(words.iter().filter(|&&(w, e)| match e {
            Some(e) => e.passes_filters(),
            None => self.passes_filters(w),
        }));
        if c.keep_words > 0 {
            survivors.truncate(c.keep_words);
        }
    }

    /// Fixes `V_base`, `Top_t` and the word table once the base statistics are complete.
    fn finish_statistics(&mut self) {
        self.vocab = self.base_df.iter().map(|(w, _)| w.into()).collect();
        self.top = match self.stemmer {
            // Already candidates only (their stems): nothing more to filter.
            Some(_) => self.candidate_df.top(self.config.rm_top_freq, Candidates::Raw),
            None => self.base_df.top(self.config.rm_top_freq, self.config.frequency_candidates),
        };
        self.top_set = self.top.iter().map(|(w, _)| w.as_str().into()).collect();
        let surface: Vec<Box<str>> = if self.stemmer.is_some() {
            std::mem::take(&mut self.base_surface).into_iter().collect()
        } else {
            self.vocab.iter().cloned().collect()
        };
        // Most frequent first (see `WordTable`); the order changes no output.
        let mut by_df: Vec<(u64, Box<str>)> =
            surface.into_iter().map(|w| (self.base_df.get(&self.match_form(&w)), w)).collect();
        by_df.sort_unstable_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let surface: Vec<Box<str>> = by_df.into_iter().map(|(_, w)| w).collect();
        let passes: Vec<bool> = surface.iter().map(|w| self.passes_filters(w)).collect();
        let none_kept = !passes.contains(&true);
        self.table = WordTable::new(surface, passes);
        let candidates = match self.stemmer {
            Some(_) => self.candidate_df.len(),
            None => self.base_df.iter().filter(|(w, _)| self.config.frequency_candidates.admits(w)).count(),
        };
        self.top_takes_all = (candidates > 0 && self.top.len() == candidates).then_some(candidates);
        // With LimitToBaseVocab, a word outside the base vocabulary goes: if no base word
        // survives the filters either, every deformed caption ends empty. (Not foretold with a
        // stemmer, where a word outside the table may share a kept stem: the report says it
        // after the run, see `Bow::report`.)
        if none_kept
            && self.config.limit_to_base_vocab
            && self.mostly()
            && self.stemmer.is_none()
            && !self.vocab.is_empty()
        {
            let why = match self.top_takes_all {
                Some(k) => format!("{} removes all {k} candidate words of the base captions", self.top_text()),
                None => "no word of the base captions passes the filters".to_owned(),
            };
            let w = format!(
                "{why}, so with LimitToBaseVocab every deformed caption ends empty and only the base set \
                 is left; lower `rm_top_freq` (or set `limit_to_base_vocab = false`)"
            );
            say!("warning: stage `bow`: {w}");
            self.warnings.push(w);
            self.said_all_empty = true;
        }
        self.stats_done = true;
    }

    /// The operators as the paper names them, in the order they act, with the settings that
    /// change them: `Shuffle, RmStopNalpha, LimitToBaseVocab, RmTopFreq(1000), Keep(4)`. For the
    /// report and its plots, which would otherwise look alike across ablations.
    fn operators(&self) -> String {
        let c = &self.config;
        let mostly = self.mostly();
        let mut ops: Vec<String> = Vec::new();
        if c.dedup {
            ops.push("Dedup".into());
        }
        if c.shuffle {
            ops.push("Shuffle".into());
        }
        if c.rm_stop_nalpha {
            ops.push("RmStopNalpha".into());
        }
        if c.limit_to_base_vocab && mostly {
            ops.push("LimitToBaseVocab".into());
        }
        if c.rm_top_freq > 0 && mostly {
            ops.push(format!("RmTopFreq({})", c.rm_top_freq));
        }
        if c.keep_words > 0 {
            ops.push(format!("Keep({})", c.keep_words));
        }
        let mut out = if ops.is_empty() { "no operator".to_owned() } else { ops.join(", ") };
        let mut with: Vec<String> = Vec::new();
        if mostly {
            let pct = format!("{:.4}", 100.0 * c.base_fraction);
            with.push(format!("{}% base", pct.trim_end_matches('0').trim_end_matches('.')));
        }
        if c.stemmer != StemmerChoice::None {
            with.push("stems".into());
        }
        if c.frequency_candidates == Candidates::Raw && c.rm_top_freq > 0 && mostly {
            with.push("raw top-t".into());
        }
        if c.split_punct {
            with.push("split_punct".into());
        }
        if !with.is_empty() {
            out = format!("{out} ({})", with.join(", "));
        }
        format!("{}: {out}", if mostly { "mostly" } else { "only" })
    }

    /// `rm_top_freq = t`, for warnings.
    fn top_text(&self) -> String {
        format!("rm_top_freq = {}", self.config.rm_top_freq)
    }

    /// The report's warnings: those said before the stream, and one when every deformed
    /// caption ended empty where none foretold it (with a stemmer, without LimitToBaseVocab, or
    /// in "only" mode).
    fn warnings(&self, st: &Stats) -> Vec<String> {
        let mut out = self.warnings.clone();
        if !self.said_all_empty && st.deformed_in > 0 && st.deformed_out == 0 {
            let unit = if self.stemmer.is_some() { "stems" } else { "words" };
            let why = match self.top_takes_all {
                Some(k) => format!("; {} removes all {k} candidate {unit} of the base captions", self.top_text()),
                None => String::new(),
            };
            let left = if self.mostly() { "only the base set is left" } else { "no caption is left" };
            let hint = if self.top_takes_all.is_some() { "lower `rm_top_freq`" } else { "turn a filter off" };
            out.push(format!("all {} deformed captions ended empty{why}, so {left}; {hint}", st.deformed_in));
        }
        out
    }
}

/// Reuses a word buffer's allocation for borrows of another lifetime (the vector is emptied;
/// the in-place `collect` keeps its capacity).
fn recycle_str<'b>(mut v: Vec<&str>) -> Vec<&'b str> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied above")).collect()
}

/// [`recycle_str`] for `(word, payload)` pairs.
fn recycle<'b, T: Copy>(mut v: Vec<(&str, T)>) -> Vec<(&'b str, T)> {
    v.clear();
    v.into_iter().map(|_| unreachable!("emptied above")).collect()
}

impl Transform for Bow {
    fn fit_passes(&self) -> usize {
        if self.mostly() {
            2
        } else {
            0
        }
    }

    fn wants_pass(&self, pass: usize) -> bool {
        pass == 0 || !self.stats_done
    }

    fn fit(&mut self, pass: usize, batch: &RecordBatch, first_row: u64) -> Result<()> {
        let ids = str_col(batch, schema::SAMPLE_ID);
        let caps = str_col(batch, schema::CAPTION);
        if pass == 0 {
            for r in 0..batch.num_rows() {
                if caps.is_valid(r) && super::has_words(caps.value(r)) {
                    let row = first_row + r as u64;
                    let key = row_key(self.seed, "bow.split", ids.value(r));
                    self.split_keys.push((key, row));
                    if key < self.band_limit {
                        self.band_text.push_str(caps.value(r));
                        self.band.push((row, self.band_text.len()));
                    }
                }
            }
        } else {
            let base = (0..batch.num_rows()).filter(|&r| self.is_base(first_row + r as u64)).map(|r| caps.value(r));
            let counts = self.count_base_captions(base);
            self.add_base_counts(counts);
        }
        Ok(())
    }

    fn end_pass(&mut self, pass: usize) -> Result<()> {
        if pass == 0 {
            let n = self.split_keys.len();
            // `round` as in the spec's (Python) pseudo-code: halves to even, so 200.5 -> 200.
            let k = ((self.config.base_fraction * n as f64).round_ties_even() as usize).min(n);
            if k == 0 && n > 0 && self.config.limit_to_base_vocab {
                // As the spec defines it, but surely not what was meant: said on stderr and in
                // the report.
                let w = format!(
                    "base_fraction {} of {n} captions is 0 base captions, so LimitToBaseVocab empties every \
                     caption; raise `base_fraction` (or set `limit_to_base_vocab = false`)",
                    readable(self.config.base_fraction)
                );
                say!("warning: stage `bow`: {w}");
                self.warnings.push(w);
                self.said_all_empty = true;
            }
            let keys = &mut self.split_keys;
            if k > 0 && k < n {
                keys.select_nth_unstable(k);
            }
            let max_row = keys.iter().map(|x| x.1).max().unwrap_or(0);
            self.base = vec![0u64; (max_row / 64 + 1) as usize];
            let mut band_covers = true;
            for &(key, row) in &keys[..k] {
                self.base[(row / 64) as usize] |= 1 << (row % 64);
                band_covers &= key < self.band_limit;
            }
            self.split_keys = Vec::new();
            let band = std::mem::take(&mut self.band);
            let text = std::mem::take(&mut self.band_text);
            if band_covers {
                // Counted in parallel; the merge is a sum, so the result is the same.
                let counts = (0..band.len())
                    .into_par_iter()
                    .step_by(BAND_ROWS_PER_JOB)
                    .map(|first| {
                        let part = first..(first + BAND_ROWS_PER_JOB).min(band.len());
                        let base = part.filter(|&i| self.is_base(band[i].0)).map(|i| {
                            let start = if i == 0 { 0 } else { band[i - 1].1 };
                            &text[start..band[i].1]
                        });
                        self.count_base_captions(base)
                    })
                    .reduce(BaseCounts::default, |mut a, b| {
                        a.df.merge(b.df);
                        a.candidate_df.merge(b.candidate_df);
                        a.surface.extend(b.surface);
                        a
                    });
                self.add_base_counts(counts);
                self.finish_statistics();
            }
        } else {
            self.finish_statistics();
        }
        Ok(())
    }

    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
        let Chunk { batch, mut rejects, skipped } = chunk;
        let ids = str_col(&batch, schema::SAMPLE_ID);
        let caps = str_col(&batch, schema::CAPTION);
        let n = batch.num_rows();
        let mut out = StringBuilder::with_capacity(n, n * 24);
        let mut split = StringBuilder::with_capacity(n, n * 8);
        // Whether each input row is in the output (a deformed caption left empty is not).
        let mut in_output = Vec::with_capacity(n);
        let mut st = Stats::default();
        // Occurrences (before, after) by table id: 32 bits are enough within a chunk.
        let mut counts = vec![[0u32; 3]; self.table.len()];
        // (word, table entry) of the current caption, and of the survivors.
        let mut buf: Vec<(&'static str, Option<Entry>)> = Vec::with_capacity(32);
        let mut survivors_buf: Vec<(&'static str, Option<Entry>)> = Vec::with_capacity(32);
        let mut joined = String::new();
        let mut tokens: Vec<&str> = Vec::with_capacity(32);
        // The lower-cased caption of the fast path and its word ranges.
        let mut scratch: Vec<u8> = Vec::with_capacity(256);
        let mut spans: Vec<(u32, u32)> = Vec::with_capacity(32);
        let fast = !self.tokenizer.split_punct;
        for r in 0..n {
            st.rows_in += 1;
            let id = ids.value(r);
            let caption = caps.is_valid(r).then(|| caps.value(r));
            let mut words = recycle(std::mem::take(&mut buf));
            spans.clear();
            let lowered;
            if let Some(cap) = caption {
                if fast && ascii_word_spans(cap, &mut scratch, &mut spans) {
                    let padded = scratch.as_slice();
                    words.extend(spans.iter().map(|&(s, e)| {
                        let (s, e) = (s as usize, e as usize);
                        // SAFETY: `ascii_word_spans` buffers are ASCII.
                        let w = unsafe { std::str::from_utf8_unchecked(&padded[s..e]) };
                        (w, self.table.get_padded(padded, s, e))
                    }));
                } else {
                    lowered = lowercase(cap);
                    let mut t = recycle_str(std::mem::take(&mut tokens));
                    t.clear();
                    self.tokenizer.split_into(&lowered, &mut t);
                    words.extend(t.iter().map(|w| (*w, self.table.get(w))));
                    tokens = recycle_str(t);
                }
            }
            if words.is_empty() {
                st.no_caption += 1;
                rejects.push_row(
                    TYPE,
                    String::new(),
                    first_row + r as u64,
                    Some(id),
                    if caption.is_none() { "no_caption" } else { "empty_caption" },
                    "the BoW stage needs a caption".into(),
                    caption.unwrap_or("").as_bytes(),
                );
                // Dropped below; a value (not a null) keeps the column on the run-copy path.
                out.append_value("");
                split.append_value("");
                in_output.push(false);
                buf = recycle(words);
                continue;
            }
            st.words_before += words.len() as u64;
            bump_hist(&mut st.len_before, words.len());
            for &(w, e) in &words {
                Stats::count::<BEFORE>(&mut counts, &mut st.before_other, w, e);
            }
            if self.mostly() && self.is_base(first_row + r as u64) {
                st.base += 1;
                st.words_after += words.len() as u64;
                bump_hist(&mut st.len_after, words.len());
                for &(w, e) in &words {
                    Stats::count::<AFTER>(&mut counts, &mut st.after_other, w, e);
                }
                out.append_value(caption.expect("has words"));
                split.append_value("base");
                in_output.push(true);
                buf = recycle(words);
                continue;
            }
            st.deformed_in += 1;
            let mut survivors = recycle(std::mem::take(&mut survivors_buf));
            self.deform(id, &mut words, &mut survivors);
            if survivors.is_empty() {
                st.emptied += 1;
                rejects.push_row(
                    TYPE,
                    String::new(),
                    first_row + r as u64,
                    Some(id),
                    "empty_after_bow",
                    "no word survived the BoW operators".into(),
                    caption.expect("has words").as_bytes(),
                );
                // Dropped below; a value (not a null) keeps the column on the run-copy path.
                out.append_value("");
                split.append_value("");
                in_output.push(false);
            } else {
                st.deformed_out += 1;
                st.words_after += survivors.len() as u64;
                st.words_deformed_after += survivors.len() as u64;
                bump_hist(&mut st.len_after, survivors.len());
                joined.clear();
                for (i, &(w, e)) in survivors.iter().enumerate() {
                    Stats::count::<AFTER>(&mut counts, &mut st.after_other, w, e);
                    Stats::count::<DEFORMED_AFTER>(&mut counts, &mut st.deformed_other, w, e);
                    if i > 0 {
                        joined.push(' ');
                    }
                    joined.push_str(w);
                }
                out.append_value(&joined);
                split.append_value("deformed");
                in_output.push(true);
            }
            survivors_buf = recycle(survivors);
            buf = recycle(words);
        }
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(batch.num_columns() + 2);
        for (f, col) in batch.schema().fields().iter().zip(batch.columns()) {
            if f.name() == schema::CAPTION {
                columns.push(Arc::new(out.finish()));
                columns.push(col.clone());
                columns.push(Arc::new(split.finish()));
            } else {
                columns.push(col.clone());
            }
        }
        let full = RecordBatch::try_new(self.schema.clone(), columns)?;
        let batch = schema::keep_rows(&full, &in_output)?;
        st.add_counts(&counts);
        Ok((Chunk { batch, rejects, skipped }, StageStats::Bow(Box::new(st))))
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn report(&self, stats: &StageStats) -> serde_json::Value {
        let none = Stats::default();
        let st = match stats {
            StageStats::Bow(s) => s,
            _ => &none,
        };
        // The run asks once, at its end: a warning the stream's outcome gives is said then.
        let warnings = self.warnings(st);
        for w in &warnings[self.warnings.len()..] {
            say!("warning: stage `bow`: {w}");
        }
        let n_in = st.base + st.deformed_in;
        let n_out = st.base + st.deformed_out;
        let (ranked_before, vocab_before) = st.ranked(BEFORE);
        let (ranked_after, vocab_after) = st.ranked(AFTER);
        let (ranked_deformed_after, _) = st.ranked(DEFORMED_AFTER);
        let vocab_deformed_after = st.distinct(DEFORMED_AFTER);
        // A mean or Δ over no caption is undefined: `null` in the JSON.
        let mean = |words: u64, n: u64| (n > 0).then(|| words as f64 / n as f64);
        json!({
            "mode": self.config.mode,
            "operators": self.operators(),
            "seed": self.seed,
            "warnings": warnings,
            "rows_in": st.rows_in,
            "rows_without_caption": st.no_caption,
            "captions_in": n_in,
            "captions_out": n_out,
            "base": st.base,
            "deformed_in": st.deformed_in,
            "deformed_out": st.deformed_out,
            "emptied": st.emptied,
            "delta_dataset_size": (n_in > 0).then(|| (n_out as f64 - n_in as f64) / n_in as f64),
            "mean_words_before": mean(st.words_before, n_in),
            "mean_words_after": mean(st.words_after, n_out),
            "mean_words_deformed_after": mean(st.words_deformed_after, st.deformed_out),
            "vocabulary_before": vocab_before,
            "vocabulary_after": vocab_after,
            "vocabulary_deformed_after": vocab_deformed_after,
            "base_vocabulary": self.vocab.len(),
            // With a stemmer, `V_base` and `Top_t` are stems.
            "base_vocabulary_unit": if self.stemmer.is_some() { "stems" } else { "words" },
            "top_removed": self.top.iter().map(|(w, df)| json!({"word": w, "base_df": df})).collect::<Vec<_>>(),
            // Bin i counts captions of i words; the last possible bin, MAX_HIST_WORDS, also
            // counts the longer ones.
            "length_histogram_open_bin": MAX_HIST_WORDS,
            "length_histogram_before": st.len_before,
            "length_histogram_after": st.len_after,
            "rank_frequency_before": ranked_before,
            "rank_frequency_after": ranked_after,
            "rank_frequency_deformed_after": ranked_deformed_after,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{PairRow, PairsBuilder};

    fn batch(n: usize) -> RecordBatch {
        let words = ["dog", "cat", "park", "the", "red", "beach", "a", "tree", "runs", "city"];
        let mut b = PairsBuilder::new("t");
        for i in 0..n {
            let cap: Vec<&str> = (0..(2 + i % 7)).map(|j| words[(i * 7 + j * 3) % words.len()]).collect();
            b.push(PairRow { sample_id: &format!("s{i}"), caption: Some(&cap.join(" ")), ..Default::default() });
        }
        b.finish()
    }

    /// Messages name a tiny `base_fraction` as it would be written, not in 300 digits.
    #[test]
    fn fractions_in_messages_are_short() {
        assert_eq!(readable(0.1), "0.1");
        assert_eq!(readable(0.0), "0");
        assert_eq!(readable(1e-300), "1e-300");
        assert_eq!(readable(-2.5e-7), "-2.5e-7");
        assert_eq!(readable(1e20), "1e20");
    }

    fn fitted(band_limit: Option<u64>, b: &RecordBatch) -> Bow {
        fitted_with("rm_top_freq = 3", band_limit, b)
    }

    fn fitted_with(config: &str, band_limit: Option<u64>, b: &RecordBatch) -> Bow {
        let config: BowConfig = toml::from_str(config).unwrap();
        let mut bow = config.build(5, &schema::pairs(), &mut Problems::default()).unwrap();
        if let Some(l) = band_limit {
            bow.band_limit = l;
        }
        for pass in 0..bow.fit_passes() {
            if bow.wants_pass(pass) {
                bow.fit(pass, b, 0).unwrap();
                bow.end_pass(pass).unwrap();
            }
        }
        bow
    }

    #[test]
    fn base_document_frequencies_by_packed_words_equal_the_string_count() {
        let captions = [
            "A dog and a DOG and a dog .",
            "fifteen-bytes!! sixteen-bytes!!! sixteen-bytes!!! a",
            "Café au lait , café",
            "tab\tseparated words and\u{1f} a unit separator",
            "  leading and trailing spaces  ",
            "an-extraordinarily-long-compound-word and an-extraordinarily-long-compound-word",
            "a\0 a",
        ];
        for config in ["", "split_punct = true", "stemmer = \"english\""] {
            let bow = fitted_with(config, None, &batch(10));
            let got = bow.count_base_captions(captions.iter().copied());
            let mut want = Counts::default();
            for c in captions {
                let lowered = lowercase(c);
                let mut words = Vec::new();
                bow.tokenizer.split_into(&lowered, &mut words);
                let forms: Vec<String> = words.iter().map(|w| bow.match_form(w).into_owned()).collect();
                want.add_document(&forms.iter().map(String::as_str).collect::<Vec<_>>());
            }
            let sorted = |c: &Counts| {
                let mut v: Vec<(String, u64)> = c.iter().map(|(w, n)| (w.to_owned(), n)).collect();
                v.sort();
                v
            };
            assert_eq!(sorted(&got.df), sorted(&want), "{config}");
            assert_eq!(got.df.docs, want.docs);
            assert_eq!(got.df.get("dog"), 1, "one document, whatever the repeats");
        }
    }

    #[test]
    fn packed_words_are_distinct_and_long_words_fall_back() {
        // Same bytes up to zero padding, and the 15/16-byte boundary.
        assert_ne!(pack_word("a"), pack_word("a\0"));
        assert_ne!(pack_word(""), pack_word("\0"));
        assert!(pack_word("fifteen-bytes!!").is_some() && pack_word("sixteen-bytes!!!").is_none());
        // The 7/8-byte boundary between the two integer widths.
        assert!(matches!(pack_word("seven!!"), Some(Packed::Tiny(_))));
        assert!(matches!(pack_word("eight!!!"), Some(Packed::Short(_))));
        let words: Vec<Box<str>> =
            ["a", "a\0", "dog", "a-very-long-compound-word", "seven!!", "seven!!\0"].map(Into::into).into();
        let t = WordTable::new(words, vec![true, false, true, false, false, true]);
        assert_eq!(
            [
                "a",
                "a\0",
                "dog",
                "a-very-long-compound-word",
                "seven!!",
                "seven!!\0",
                "cat",
                "a-very-long-compound-wore"
            ]
            .map(|w| t.get(w).map(|e| (e.id(), e.passes_filters()))),
            [
                Some((0, true)),
                Some((1, false)),
                Some((2, true)),
                Some((3, false)),
                Some((4, false)),
                Some((5, true)),
                None,
                None
            ]
        );
        // The fast path's keys (one masked 16-byte load from the padded caption) are the same,
        // for words of every length up to past 15 bytes and at any position.
        let words: Vec<String> =
            (1..=20).map(|n| (0..n).map(|i| (b'a' + (i * 7 + n) as u8 % 26) as char).collect()).collect();
        let t = WordTable::new(words.iter().map(|w| w.as_str().into()).collect(), vec![true; words.len()]);
        let caption = format!("{} Dog zebra {}", words.join(" "), words[14].to_uppercase());
        let (mut padded, mut spans) = (Vec::new(), Vec::new());
        assert!(ascii_word_spans(&caption, &mut padded, &mut spans));
        let fast: Vec<Option<Entry>> =
            spans.iter().map(|&(s, e)| t.get_padded(&padded, s as usize, e as usize)).collect();
        let slow: Vec<Option<Entry>> = Tokenizer::default().words(&caption).iter().map(|w| t.get(w)).collect();
        assert_eq!(fast, slow);
        assert_eq!(fast.iter().flatten().count(), 21);
    }

    #[test]
    fn stemmed_statistics_agree_between_band_and_second_pass() {
        // With a stemmer the base surface words are collected too (in parallel from the band).
        let b = batch(5000);
        let config = "rm_top_freq = 3\nstemmer = \"english\"";
        let (cached, reread) = (fitted_with(config, None, &b), fitted_with(config, Some(0), &b));
        assert_eq!((&cached.top, &cached.vocab), (&reread.top, &reread.vocab));
        // The word tables (surface words, each with its id and the filters' verdict) agree.
        assert_eq!(cached.table.entries(), reread.table.entries());
        // Stems in the vocabulary, surface words in the table: `runs` is matched as `run`.
        assert!(cached.vocab.contains("run") && !cached.vocab.contains("runs"));
        assert_eq!(cached.table.get("runs").map(Entry::passes_filters), Some(true));
        let chunk = |bow: &Bow| {
            bow.apply(Chunk { batch: b.clone(), rejects: Default::default(), skipped: Default::default() }, 0)
                .unwrap()
                .0
                .batch
        };
        assert_eq!(chunk(&cached), chunk(&reread));
    }

    #[test]
    fn stemmed_top_words_are_ranked_among_content_words_by_their_surface_form() {
        // `during` stems to `dure` and `does` to `doe` (not stopwords), `others` to `other` (a
        // stopword): the candidate test is on the caption's word, the count on its stem.
        let caption = |i: usize| {
            if i % 10 == 9 {
                "does it snow"
            } else {
                ["others watch during rain", "others play during day"][i % 2]
            }
        };
        let mut b = PairsBuilder::new("t");
        for i in 0..200 {
            b.push(PairRow { sample_id: &format!("s{i}"), caption: Some(caption(i)), ..Default::default() });
        }
        let b = b.finish();
        let config = "stemmer = \"english\"\nrm_top_freq = 1\nbase_fraction = 0.5\nshuffle = false";
        let bow = fitted_with(config, None, &b);
        // Base captions with `others` (and `during`).
        let n = (0..200).filter(|&i| bow.is_base(i as u64) && i % 10 != 9).count() as u64;
        assert!(n > 50);
        assert_eq!(bow.top, vec![("other".to_owned(), n)]);
        // With every filter but RmTopFreq off, the stopword `other` stays: it is no candidate.
        let config = format!("{config}\nrm_stop_nalpha = false\nlimit_to_base_vocab = false");
        let bow = fitted_with(&config, None, &b);
        assert_eq!(bow.top, vec![("other".to_owned(), n)]);
        assert!(!bow.passes_filters("others") && bow.passes_filters("other") && bow.passes_filters("during"));
        // Raw candidates: every word counts, stopwords' stems included (`dure` ties with
        // `other` and comes first in byte order).
        let bow = fitted_with(&format!("{config}\nfrequency_candidates = \"raw\""), None, &b);
        assert_eq!(bow.top, vec![("dure".to_owned(), n)]);
    }

    #[test]
    fn a_top_t_that_removes_every_candidate_is_reported() {
        let b = batch(400);
        let all = fitted_with("rm_top_freq = 100000", None, &b);
        assert_eq!(all.warnings.len(), 1, "{:?}", all.warnings);
        assert!(all.warnings[0].contains("removes all"), "{:?}", all.warnings);
        // Without LimitToBaseVocab, words outside the base vocabulary survive: nothing to say.
        assert!(fitted_with("rm_top_freq = 100000\nlimit_to_base_vocab = false", None, &b).warnings.is_empty());
        assert!(fitted_with("rm_top_freq = 3", None, &b).warnings.is_empty());
    }

    /// The report's warnings after `bow` (fitted on `b`) has deformed `b`.
    fn warnings_after_run(bow: &Bow, b: &RecordBatch) -> Vec<String> {
        let chunk = Chunk { batch: b.clone(), rejects: Default::default(), skipped: Default::default() };
        let (_, stats) = bow.apply(chunk, 0).unwrap();
        serde_json::from_value(bow.report(&stats)["warnings"].clone()).unwrap()
    }

    #[test]
    fn deformed_captions_that_all_end_empty_are_reported_when_nothing_foretold_it() {
        let b = batch(400);
        // With a stemmer nothing is said before the stream (a word outside the base captions
        // may share a kept stem): the report says it after, with the cause.
        let stemmed = fitted_with("rm_top_freq = 100000\nstemmer = \"english\"", None, &b);
        assert!(stemmed.warnings.is_empty(), "{:?}", stemmed.warnings);
        let w = warnings_after_run(&stemmed, &b);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].starts_with("all 360 deformed captions ended empty; rm_top_freq = 100000 removes all"), "{w:?}");
        assert!(w[0].contains("candidate stems of the base captions, so only the base set is left"), "{w:?}");
        // "only" mode, captions of stopwords only.
        let mut stop = PairsBuilder::new("t");
        for i in 0..20 {
            stop.push(PairRow { sample_id: &format!("s{i}"), caption: Some("the a of"), ..Default::default() });
        }
        let stop = stop.finish();
        let only = fitted_with("mode = \"only\"\nlimit_to_base_vocab = false\nrm_top_freq = 0", None, &stop);
        assert_eq!(
            warnings_after_run(&only, &stop),
            ["all 20 deformed captions ended empty, so no caption is left; turn a filter off"]
        );
        // Said once: a warning before the stream already said so.
        let all = fitted_with("rm_top_freq = 100000", None, &b);
        assert_eq!(warnings_after_run(&all, &b), all.warnings);
        // Captions that survive: nothing to say.
        assert!(warnings_after_run(&fitted_with("rm_top_freq = 3\nstemmer = \"english\"", None, &b), &b).is_empty());
    }

    #[test]
    fn the_operators_are_named_as_the_paper_names_them() {
        let ops = |config: &str| {
            let config: BowConfig = toml::from_str(config).unwrap();
            config.build(5, &schema::pairs(), &mut Problems::default()).unwrap().operators()
        };
        assert_eq!(
            ops("rm_top_freq = 500"),
            "mostly: Shuffle, RmStopNalpha, LimitToBaseVocab, RmTopFreq(500), Keep(4) (10% base)"
        );
        assert_eq!(
            ops("base_fraction = 0.25\nshuffle = false\nkeep_words = 0\nstemmer = \"english\"\nfrequency_candidates = \"raw\"\nrm_top_freq = 3"),
            "mostly: RmStopNalpha, LimitToBaseVocab, RmTopFreq(3) (25% base, stems, raw top-t)"
        );
        assert_eq!(
            ops("mode = \"only\"\nlimit_to_base_vocab = false\nrm_top_freq = 0\ndedup = true\nsplit_punct = true"),
            "only: Dedup, Shuffle, RmStopNalpha, Keep(4) (split_punct)"
        );
        let off = "mode = \"only\"\nshuffle = false\nrm_stop_nalpha = false\nlimit_to_base_vocab = false\nrm_top_freq = 0\nkeep_words = 0";
        assert_eq!(ops(off), "only: no operator");
    }

    #[test]
    fn base_settings_with_nothing_to_act_on_are_warned_about() {
        let warnings = |config: &str| {
            let config: BowConfig = toml::from_str(config).unwrap();
            config.build(5, &schema::pairs(), &mut Problems::default()).unwrap().warnings
        };
        assert_eq!(
            warnings("stemmer = \"english\"\nlimit_to_base_vocab = false\nrm_top_freq = 0"),
            ["`stemmer` has no effect: LimitToBaseVocab and RmTopFreq are off"]
        );
        assert_eq!(
            warnings("frequency_candidates = \"raw\"\nrm_top_freq = 0"),
            ["`frequency_candidates` has no effect: RmTopFreq is off (`rm_top_freq = 0`)"]
        );
        // Either matching operator gives the stemmer work; RmTopFreq gives the candidates work.
        assert!(warnings("stemmer = \"english\"\nrm_top_freq = 0").is_empty());
        assert!(warnings("stemmer = \"english\"\nlimit_to_base_vocab = false\nrm_top_freq = 5").is_empty());
        assert!(warnings("frequency_candidates = \"raw\"\nrm_top_freq = 5").is_empty());
    }

    #[test]
    fn no_base_caption_with_limit_to_base_vocab_is_reported() {
        let config: BowConfig = toml::from_str("base_fraction = 0.001").unwrap();
        let mut bow = config.build(5, &schema::pairs(), &mut Problems::default()).unwrap();
        bow.fit(0, &batch(100), 0).unwrap();
        bow.end_pass(0).unwrap();
        let w = bow.report(&StageStats::None)["warnings"][0].as_str().unwrap().to_owned();
        assert!(w.contains("0 base captions") && w.contains("raise `base_fraction`"), "{w}");
        // Without LimitToBaseVocab, no base caption is no problem; with 10%, no warning.
        for config in ["base_fraction = 0.001\nlimit_to_base_vocab = false", ""] {
            let config: BowConfig = toml::from_str(config).unwrap();
            let mut bow = config.build(5, &schema::pairs(), &mut Problems::default()).unwrap();
            bow.fit(0, &batch(100), 0).unwrap();
            bow.end_pass(0).unwrap();
            assert_eq!(bow.report(&StageStats::None)["warnings"], json!([]));
        }
    }

    #[test]
    fn band_cache_and_second_pass_give_the_same_statistics() {
        let b = batch(5000);
        let cached = fitted(None, &b);
        let reread = fitted(Some(0), &b);
        assert!(cached.stats_done && reread.stats_done);
        assert_eq!(cached.base, reread.base);
        assert_eq!(cached.top, reread.top);
        assert_eq!(cached.vocab, reread.vocab);
        assert_eq!(cached.base.iter().map(|w| w.count_ones()).sum::<u32>(), 500);
        let chunk = |bow: &Bow| {
            bow.apply(Chunk { batch: b.clone(), rejects: Default::default(), skipped: Default::default() }, 0)
                .unwrap()
                .0
                .batch
        };
        assert_eq!(chunk(&cached), chunk(&reread));
    }
}
