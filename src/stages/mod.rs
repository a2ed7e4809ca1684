//! Stages: one module per stage type. Every stage is a `Config` (serde, `deny_unknown_fields`,
//! documented fields, the papers' defaults) checked by the planner before any data is read, and a
//! runtime built from it.
//!
//! A pipeline is `read_* → transforms → write_parquet`. Readers stream [`Chunk`]s of the
//! `pairs` schema; transforms may first *fit* on one or more passes over the stream (the BoW
//! stage needs the base split and its statistics before deforming) and then *apply* to chunks in
//! parallel; the writer stores the result.

pub mod bow;
pub mod read_cc_tsv;
pub mod read_imagenet21k;
pub mod read_img2dataset;
pub mod read_table;
pub mod read_yfcc;
pub mod write_parquet;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;

use crate::error::Result;
use crate::io::lines::Lines;
use crate::schema::{Chunk, PairsBuilder, Reject};

/// Rows per chunk. Fixed (not derived from the thread count) so chunking, and with it every
/// output, is the same on every machine.
pub const CHUNK_ROWS: usize = 32 * 1024;

pub type ChunkIter<'a> = Box<dyn Iterator<Item = Result<Chunk>> + Send + 'a>;

/// A stage that produces `pairs` rows from files.
pub trait Reader: Send + Sync {
    /// Input files, for the manifest's fingerprint.
    fn inputs(&self) -> Vec<PathBuf>;
    /// Streams the input in order. Can be called again for another pass.
    fn open(&self) -> Result<ChunkIter<'_>>;
}

/// A stage that maps chunks to chunks, possibly after fitting on the whole input.
pub trait Transform: Send + Sync {
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
    /// Transforms one chunk. Called from several threads at once; must be deterministic.
    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<Chunk>;
    fn output_schema(&self) -> SchemaRef;
    /// Statistics for the report, after all chunks were applied.
    fn report(&self) -> serde_json::Value;
}

/// Counts of rows a reader was configured to skip (not errors, so not stored as rejects):
/// videos in YFCC, rows outside the YFCC15M subset.
pub type Skipped = BTreeMap<&'static str, u64>;

/// Per-line parsing outcome for line-oriented readers.
pub enum LineOutcome {
    Row,
    Reject { reason: &'static str, detail: String },
    Skip(&'static str),
}

/// Streams chunks out of text files line by line: `parse` turns one line into a row (pushed
/// on the builder) or a reject. Shared by the TSV-based readers.
pub struct LineChunks<F> {
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<(Lines, String)>,
    builder: PairsBuilder,
    stage: &'static str,
    parse: F,
    skip_lines: u64,
}

impl<F> LineChunks<F>
where
    F: FnMut(&str, u64, &[u8], &mut PairsBuilder) -> LineOutcome + Send,
{
    /// `skip_lines` leading lines of every file are not data (a header).
    pub fn new(files: Vec<PathBuf>, source: &str, stage: &'static str, skip_lines: u64, parse: F) -> Self {
        LineChunks { files, next_file: 0, current: None, builder: PairsBuilder::new(source), stage, parse, skip_lines }
    }

    fn fill(&mut self) -> Result<Option<Chunk>> {
        let mut rejects = Vec::new();
        let mut skipped = Skipped::new();
        loop {
            if self.current.is_none() {
                let Some(path) = self.files.get(self.next_file) else { break };
                self.next_file += 1;
                self.current = Some((Lines::open(path)?, crate::io::file_name(path)));
            }
            let (lines, name) = self.current.as_mut().expect("opened above");
            let Some((no, line)) = lines.next_line()? else {
                self.current = None;
                continue;
            };
            if no <= self.skip_lines {
                continue;
            }
            match (self.parse)(name, no, line, &mut self.builder) {
                LineOutcome::Row => {}
                LineOutcome::Reject { reason, detail } => rejects.push(Reject {
                    stage: self.stage,
                    source_file: name.clone(),
                    row: no,
                    sample_id: None,
                    reason,
                    detail,
                    raw: line.to_vec(),
                }),
                LineOutcome::Skip(why) => *skipped.entry(why).or_insert(0) += 1,
            }
            if self.builder.len() >= CHUNK_ROWS {
                break;
            }
        }
        if self.builder.is_empty() && rejects.is_empty() && skipped.is_empty() {
            return Ok(None);
        }
        Ok(Some(Chunk { batch: self.builder.finish(), rejects, skipped }))
    }
}

impl<F> Iterator for LineChunks<F>
where
    F: FnMut(&str, u64, &[u8], &mut PairsBuilder) -> LineOutcome + Send,
{
    type Item = Result<Chunk>;
    fn next(&mut self) -> Option<Result<Chunk>> {
        self.fill().transpose()
    }
}

/// The tab-separated fields of one line (the first [`MAX_FIELDS`]) and the true count.
pub struct Fields<'a> {
    fields: [&'a [u8]; MAX_FIELDS],
    pub count: usize,
}

pub const MAX_FIELDS: usize = 32;

impl<'a> std::ops::Index<usize> for Fields<'a> {
    type Output = &'a [u8];
    fn index(&self, i: usize) -> &&'a [u8] {
        &self.fields[i]
    }
}

/// Splits a line on tabs without allocating.
pub fn split_tabs(line: &[u8]) -> Fields<'_> {
    let mut f = Fields { fields: [&[][..]; MAX_FIELDS], count: 0 };
    let mut start = 0;
    for tab in memchr::memchr_iter(b'\t', line).chain(std::iter::once(line.len())) {
        if f.count < MAX_FIELDS {
            f.fields[f.count] = &line[start..tab];
        }
        f.count += 1;
        start = tab + 1;
    }
    f
}

/// `true` if the text has at least one word (§1.1 whitespace).
pub fn has_words(text: &str) -> bool {
    text.split(crate::text::is_python_whitespace).any(|p| !p.is_empty())
}

/// A finished stream chunk made of rows held in memory (readers that load a shard at once).
pub fn chunk_of(batch: RecordBatch, rejects: Vec<Reject>) -> Chunk {
    Chunk { batch, rejects, skipped: Skipped::new() }
}

/// Shared reader configuration check: the patterns expand to files.
pub fn expand_inputs(patterns: &crate::io::PathPatterns, problems: &mut Problems, key: &'static str) -> Vec<PathBuf> {
    match patterns.expand() {
        Ok(files) => files,
        Err(e) => {
            problems.push(key, format!("input {e}"), Some("paths are relative to the directory curate runs in".into()));
            Vec::new()
        }
    }
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

/// Reads a file's header line for column-name checks.
pub fn header_fields(path: &Path, delimiter: u8) -> std::result::Result<Vec<String>, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let Some((_, line)) = lines.next_line().map_err(|e| e.to_string())? else {
        return Err(format!("`{}` is empty", path.display()));
    };
    let text = String::from_utf8_lossy(line);
    Ok(text.split(delimiter as char).map(|s| s.trim_matches('"').to_owned()).collect())
}

/// Field count of the widest of the first `n` lines of a headerless file (one malformed first
/// line must not hide the file's real width).
pub fn widest_of_first_lines(path: &Path, delimiter: u8, n: usize) -> std::result::Result<usize, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let mut widest = 0;
    for _ in 0..n {
        match lines.next_line().map_err(|e| e.to_string())? {
            Some((_, line)) => widest = widest.max(line.iter().filter(|&&b| b == delimiter).count() + 1),
            None => break,
        }
    }
    if widest == 0 {
        return Err(format!("`{}` is empty", path.display()));
    }
    Ok(widest)
}
