//! Stages: one module per stage type. Every stage is a `Config` (serde, `deny_unknown_fields`,
//! documented fields, the papers' defaults) checked by the planner before any data is read, and a
//! runtime built from it.
//!
//! A pipeline is `read_* → transforms → write_parquet`. Readers stream [`Chunk`]s of the
//! `pairs` schema; transforms may first *fit* on one or more passes over the stream (the BoW
//! stage needs the base split and its statistics before deforming) and then *apply* to chunks in
//! parallel; the writer stores the result.

pub mod bow;
pub mod encode_image;
pub mod encode_text;
pub mod images;
pub mod mine_pseudo_bow;
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

use crate::error::{Error, Result};
use crate::io::lines::Lines;
use crate::schema::{Chunk, PairsBuilder, Reject, Rejects};

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
    /// The manifest fingerprints the inputs' listing (paths and sizes) instead of their bytes:
    /// for readers that never read most of the bytes (image folders).
    fn fingerprint_listing_only(&self) -> bool {
        false
    }
    /// Whether rows can have captions at all (not so for an image folder, or a table with no
    /// caption column mapped).
    fn has_captions(&self) -> bool {
        true
    }
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
    /// Called once, after every fit pass and before the streaming pass. `apply` also runs in
    /// the fit passes of later stages, to give them the stream they will see: statistics it
    /// counted there are dropped here, so that the report counts each row once.
    fn start_stream(&mut self) {}
    /// Transforms one chunk. Called from several threads at once; must be deterministic.
    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<Chunk>;
    fn output_schema(&self) -> SchemaRef;
    /// Statistics for the report, after all chunks were applied.
    fn report(&self) -> serde_json::Value;
    /// Key-value pairs for the output files' metadata and the manifest (e.g. the model used).
    fn metadata(&self) -> Vec<(String, String)> {
        Vec::new()
    }
}

/// Counts of rows a reader was configured to skip (not errors, so not stored as rejects):
/// videos in YFCC, rows outside the YFCC15M subset.
pub type Skipped = BTreeMap<&'static str, u64>;

/// Per-line parsing outcome for line-oriented readers.
pub enum LineOutcome {
    Row,
    Reject {
        reason: &'static str,
        detail: std::borrow::Cow<'static, str>,
    },
    /// A reject of a line whose `sample_id` was read before the problem showed.
    RejectWithId {
        reason: &'static str,
        detail: std::borrow::Cow<'static, str>,
        id: String,
    },
    Skip(&'static str),
}

/// Bytes of input per block in [`LineChunks`]; a block (cut at a line end) becomes one chunk.
/// Fixed, so chunk boundaries depend only on the file's bytes, never on the thread count.
pub const BLOCK_BYTES: usize = 8 << 20;

/// Blocks parsed at once, in parallel.
const BLOCKS_AT_ONCE: usize = 4;

/// One line of a text input, as [`LineChunks`] hands it to a parser.
pub struct Line<'a> {
    /// File name (without its folder).
    pub file: &'a str,
    /// 1-based line number.
    pub no: u64,
    /// The line's bytes, without the line end.
    pub bytes: &'a [u8],
    /// The whole block the line came from is valid UTF-8 (checked once per block: several
    /// times faster than checking each short field).
    utf8: bool,
}

impl<'a> Line<'a> {
    /// `piece` (a part of [`Line::bytes`], e.g. a field from [`split_tabs`]) as text, or
    /// `None` if it is not valid UTF-8.
    pub fn text(&self, piece: &'a [u8]) -> Option<&'a str> {
        if self.utf8 {
            let start = (piece.as_ptr() as usize).wrapping_sub(self.bytes.as_ptr() as usize);
            let end = start.wrapping_add(piece.len());
            let boundary = |i: usize| i == self.bytes.len() || (self.bytes[i] as i8) >= -0x40;
            if start <= end && end <= self.bytes.len() && boundary(start) && boundary(end) {
                // SAFETY: `bytes` is valid UTF-8 (cut from a valid block at ASCII line ends),
                // `piece` lies inside it and both its ends are character boundaries (neither
                // is a continuation byte), so it is valid UTF-8 too.
                return Some(unsafe { std::str::from_utf8_unchecked(piece) });
            }
        }
        std::str::from_utf8(piece).ok()
    }

    /// The whole line as text, or `None` if it is not valid UTF-8.
    pub fn as_text(&self) -> Option<&'a str> {
        self.text(self.bytes)
    }
}

/// Streams chunks out of text files: the file is cut into blocks of about [`BLOCK_BYTES`] at
/// line ends, blocks are parsed in parallel (rayon; each one as soon as it is read) and yielded
/// in order. `parse` turns one [`Line`] (with a reusable scratch string) into a row pushed on the
/// builder, a reject, or a skip. Shared by the TSV readers.
pub struct LineChunks<F> {
    files: Vec<PathBuf>,
    next_file: usize,
    current: Option<BlockReader>,
    source: String,
    stage: &'static str,
    parse: F,
    skip_lines: u64,
    /// Rows are known by `file#line`, so a rejected line's `sample_id` is known too.
    line_ids: bool,
    /// Ids come from the data: a row whose id an earlier row had is a `duplicate_id` reject
    /// (checked in input order, after the parallel parse).
    unique: Option<UniqueIds>,
    ready: std::collections::VecDeque<Chunk>,
    /// Block buffers already parsed, for the next reads (no new memory to fault in and zero).
    spare: Vec<Vec<u8>>,
}

/// One block of whole lines: `buf[..len]`, `lines` lines starting at line `first`.
struct Block {
    buf: Vec<u8>,
    len: usize,
    first: u64,
    lines: u64,
}

/// One open file being cut into blocks.
struct BlockReader {
    file: crate::io::lines::TextFile,
    path: PathBuf,
    name: String,
    /// Bytes after the last line end of the previous block.
    carry: Vec<u8>,
    /// Line number of the first line of the next block.
    next_line: u64,
    eof: bool,
}

impl BlockReader {
    /// The next block (whole lines), read into `buf` (its old bytes are overwritten; its length
    /// only grows), or `None` at the end.
    fn next_block(&mut self, mut buf: Vec<u8>) -> Result<Option<Block>> {
        use std::io::Read;
        if self.eof && self.carry.is_empty() {
            return Ok(None);
        }
        let start = self.carry.len();
        // Exactly this much is read, whatever the buffer's size: blocks depend on the file only.
        let want = start + BLOCK_BYTES;
        if buf.len() < want {
            buf.resize(want, 0);
        }
        buf[..start].copy_from_slice(&self.carry);
        self.carry.clear();
        let mut filled = start;
        while filled < want && !self.eof {
            let n = self.file.read(&mut buf[filled..want]).map_err(|e| Error::io("cannot read", &self.path, e))?;
            if n == 0 {
                self.eof = true;
            }
            filled += n;
        }
        let mut len = filled;
        if !self.eof {
            match memchr::memrchr(b'\n', &buf[..filled]) {
                Some(last) => {
                    self.carry.extend_from_slice(&buf[last + 1..filled]);
                    len = last + 1;
                }
                // A single line longer than a block: keep reading until it ends.
                None => {
                    self.carry = buf[..filled].to_vec();
                    return self.next_block(buf);
                }
            }
        }
        if len == 0 {
            return Ok(None);
        }
        let block = &buf[..len];
        let (first, lines) =
            (self.next_line, memchr::memchr_iter(b'\n', block).count() as u64 + u64::from(!block.ends_with(b"\n")));
        self.next_line += lines;
        Ok(Some(Block { buf, len, first, lines }))
    }
}

impl<F> LineChunks<F>
where
    F: Fn(&Line<'_>, &mut PairsBuilder, &mut String) -> LineOutcome + Send + Sync,
{
    /// `skip_lines` leading lines of every file are not data (a header).
    pub fn new(files: Vec<PathBuf>, source: &str, stage: &'static str, skip_lines: u64, parse: F) -> Self {
        LineChunks {
            files,
            next_file: 0,
            current: None,
            source: source.to_owned(),
            stage,
            parse,
            skip_lines,
            line_ids: false,
            unique: None,
            ready: Default::default(),
            spare: Vec::new(),
        }
    }

    /// The reader's ids are `file#line`: rejects carry them too.
    pub fn with_line_ids(mut self) -> Self {
        self.line_ids = true;
        self
    }

    /// The reader's ids come from the data: a repeated one is rejected (see [`UniqueIds`]).
    pub fn with_unique_ids(mut self) -> Self {
        self.unique = Some(UniqueIds::default());
        self
    }

    /// Parses one block of `lines` lines into a chunk, and, when ids are checked for repeats,
    /// the (line number, byte range in `block`) of each row.
    fn parse_block(&self, name: &str, block: &[u8], first_line: u64, lines: u64) -> (Chunk, Vec<(u64, usize, usize)>) {
        let mut rows = Vec::new();
        let utf8 = std::str::from_utf8(block).is_ok();
        let mut builder = PairsBuilder::with_capacity(&self.source, lines as usize, block.len() / 2);
        let mut rejects = Rejects::default();
        let mut skipped = Skipped::new();
        let mut scratch = String::new();
        let mut start = 0;
        let mut no = first_line;
        while start < block.len() {
            let end = memchr::memchr(b'\n', &block[start..]).map_or(block.len(), |i| start + i);
            let mut bytes = &block[start..end];
            if bytes.last() == Some(&b'\r') {
                bytes = &bytes[..bytes.len() - 1];
            }
            let line_start = start;
            start = end + 1;
            if no > self.skip_lines {
                let reject = match (self.parse)(&Line { file: name, no, bytes, utf8 }, &mut builder, &mut scratch) {
                    LineOutcome::Row => {
                        if self.unique.is_some() {
                            rows.push((no, line_start, line_start + bytes.len()));
                        }
                        None
                    }
                    LineOutcome::Skip(why) => {
                        *skipped.entry(why).or_insert(0) += 1;
                        None
                    }
                    LineOutcome::Reject { reason, detail } => {
                        Some((reason, detail, self.line_ids.then(|| format!("{name}#{no}"))))
                    }
                    LineOutcome::RejectWithId { reason, detail, id } => Some((reason, detail, Some(id))),
                };
                if let Some((reason, detail, sample_id)) = reject {
                    let (stage, source_file, raw) = (self.stage, name.to_owned(), bytes.to_vec());
                    rejects.push(Reject { stage, source_file, row: no, sample_id, reason, detail, raw });
                }
            }
            no += 1;
        }
        (Chunk { batch: builder.finish(), rejects, skipped }, rows)
    }

    /// Reads up to [`BLOCKS_AT_ONCE`] blocks, each parsed on the pool while the next is read.
    fn fill(&mut self) -> Result<()> {
        type Parsed = (usize, String, (Chunk, Vec<(u64, usize, usize)>), Vec<u8>);
        let (done, results) = std::sync::mpsc::channel::<Parsed>();
        let mut read = 0;
        let mut current = self.current.take();
        let mut next_file = self.next_file;
        let mut spare = std::mem::take(&mut self.spare);
        let this: &Self = &*self;
        let outcome = rayon::in_place_scope(|s| -> Result<()> {
            while read < BLOCKS_AT_ONCE {
                if current.is_none() {
                    let Some(path) = this.files.get(next_file) else { break };
                    next_file += 1;
                    let file = crate::io::lines::open_text(path).map_err(|e| Error::io("cannot open", path, e))?;
                    let name = crate::io::file_name(path);
                    current = Some(BlockReader {
                        file,
                        path: path.clone(),
                        name,
                        carry: Vec::new(),
                        next_line: 1,
                        eof: false,
                    });
                }
                let reader = current.as_mut().expect("opened above");
                match reader.next_block(spare.pop().unwrap_or_default())? {
                    Some(block) => {
                        let (name, k, done) = (reader.name.clone(), read, done.clone());
                        s.spawn(move |_| {
                            let parsed = this.parse_block(&name, &block.buf[..block.len], block.first, block.lines);
                            let _ = done.send((k, name, parsed, block.buf));
                        });
                        read += 1;
                    }
                    None => current = None,
                }
            }
            Ok(())
        });
        drop(done);
        let mut chunks: Vec<Parsed> = results.iter().collect();
        chunks.sort_unstable_by_key(|c| c.0);
        self.current = current;
        self.next_file = next_file;
        self.spare = spare;
        for (_, name, (mut chunk, rows), buf) in chunks {
            if let Some(unique) = &mut self.unique {
                let stage = self.stage;
                chunk = unique.reject_repeats(chunk, |i, id| Reject {
                    stage,
                    source_file: name.clone(),
                    row: rows[i].0,
                    sample_id: Some(id.to_owned()),
                    reason: "duplicate_id",
                    detail: DUPLICATE_ID.into(),
                    raw: buf[rows[i].1..rows[i].2].to_vec(),
                })?;
            }
            self.spare.push(buf);
            if chunk.batch.num_rows() > 0 || !chunk.rejects.is_empty() || !chunk.skipped.is_empty() {
                self.ready.push_back(chunk);
            }
        }
        outcome
    }
}

impl<F> Iterator for LineChunks<F>
where
    F: Fn(&Line<'_>, &mut PairsBuilder, &mut String) -> LineOutcome + Send + Sync,
{
    type Item = Result<Chunk>;
    fn next(&mut self) -> Option<Result<Chunk>> {
        while self.ready.is_empty() {
            if self.current.is_none() && self.next_file >= self.files.len() {
                return None;
            }
            if let Err(e) = self.fill() {
                self.files.clear();
                self.current = None;
                return Some(Err(e));
            }
        }
        self.ready.pop_front().map(Ok)
    }
}

pub const DUPLICATE_ID: &str = "an earlier row has this sample_id (ids must be unique)";

/// The ids seen so far in a reader's stream (as 128-bit hashes: 16 bytes each, whatever the
/// id's length; a collision is as likely as two equal xxh3-128 hashes among the ids, which is
/// never in practice). Readers whose ids come from the data use it, so that a repeated id (a
/// file given twice, a table keyed by image with several captions) is a reject, not a row that
/// joins wrongly later.
#[derive(Default)]
pub struct UniqueIds {
    seen: rustc_hash::FxHashSet<u128>,
}

impl UniqueIds {
    /// `true` the first time `id` is seen.
    pub fn first_time(&mut self, id: &str) -> bool {
        self.seen.insert(xxhash_rust::xxh3::xxh3_128(id.as_bytes()))
    }

    /// Whether `id` was seen (without adding it).
    pub fn seen(&self, id: &str) -> bool {
        self.seen.contains(&xxhash_rust::xxh3::xxh3_128(id.as_bytes()))
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

/// The tab-separated fields of one line (the first [`MAX_FIELDS`]) and the true count.
pub struct Fields<'a> {
    fields: [&'a [u8]; MAX_FIELDS],
    pub count: usize,
}

/// Fields of a TSV line kept for mapping (the line's true count is still counted): YFCC100M
/// has 25, CC 2; held on the stack, so every line splits without allocating. A `read_table`
/// column mapped past it is refused at plan time.
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

/// `true` if the text has at least one word (§1.1 whitespace): some character that is not
/// whitespace, usually the first.
pub fn has_words(text: &str) -> bool {
    text.chars().any(|c| !crate::text::is_python_whitespace(c))
}

/// A finished stream chunk made of rows held in memory (readers that load a shard at once).
pub fn chunk_of(batch: RecordBatch, rejects: Vec<Reject>) -> Chunk {
    Chunk { batch, rejects: rejects.into(), skipped: Skipped::new() }
}

/// Shared reader configuration check: the patterns expand to files (not folders), and no two
/// share a file name — rows are known by `<file name>#<row>` (`sample_id`, rejects'
/// `source_file`), so two `part.tsv` in different folders would give the same ids.
pub fn expand_inputs(patterns: &crate::io::PathPatterns, problems: &mut Problems, key: &'static str) -> Vec<PathBuf> {
    let files = match patterns.expand() {
        Ok(files) => files,
        Err(e) => {
            problems.push(key, format!("input {e}"), Some("paths are relative to the directory curate runs in".into()));
            return Vec::new();
        }
    };
    let mut ok = true;
    for f in files.iter().filter(|f| f.is_dir()) {
        ok = false;
        problems.push(
            key,
            format!("input `{}` is a folder", f.display()),
            Some(format!("name the files in it, e.g. `{}`", f.join("*.tsv").display())),
        );
    }
    let mut seen: BTreeMap<String, &Path> = BTreeMap::new();
    for f in &files {
        let name = crate::io::file_name(f);
        if let Some(first) = seen.insert(name.clone(), f) {
            ok = false;
            let (message, hint) = if first == f.as_path() {
                (format!("input `{}` is given twice", f.display()), "list each file once".to_owned())
            } else {
                (
                    format!("inputs `{}` and `{}` have the same file name", first.display(), f.display()),
                    format!("rows are known by file name and row (`{name}#1`): rename one, or run each folder as its own pipeline"),
                )
            };
            problems.push(key, message, Some(hint));
        }
    }
    if ok {
        files
    } else {
        Vec::new()
    }
}

/// What a file is, by its first bytes, when it is one a text reader cannot read: a file
/// compressed other than with gzip or bzip2 (which [`crate::io::lines::open_text`] reads), an
/// archive, or a Parquet file. Every line of it would be a reject.
pub fn binary_kind(path: &Path) -> Option<&'static str> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = Vec::new();
    (&mut f).take(10).read_to_end(&mut head).ok()?;
    // Magic numbers that no text line starts with (Parquet's `PAR1` counts only when the file
    // also ends with it).
    let parquet = head.starts_with(b"PAR1") && {
        let mut tail = [0u8; 4];
        f.seek(SeekFrom::End(-4)).and_then(|_| f.read_exact(&mut tail)).is_ok() && tail == *b"PAR1"
    };
    [
        (head.starts_with(b"\x28\xb5\x2f\xfd"), "zstd-compressed"),
        (head.starts_with(b"\xfd7zXZ\x00"), "xz-compressed"),
        (head.starts_with(b"PK\x03\x04"), "a zip archive"),
        (parquet, "a Parquet file"),
    ]
    .into_iter()
    .find_map(|(is, kind)| is.then_some(kind))
}

/// Whether the lines of `path` end in a lone CR (classic Mac OS): a CR not before an LF, and no
/// LF at all in its first 64 KiB. Read line by line at LF, the whole file would be one line.
pub fn cr_lines(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::new();
    if crate::io::lines::open_text(path).and_then(|f| f.take(1 << 16).read_to_end(&mut head)).is_err() {
        return false;
    }
    // A CR before the last byte: one CR ending a one-line file is that line's end.
    !head.contains(&b'\n') && head.iter().rev().skip(1).any(|&b| b == b'\r')
}

/// Reports each of `files`, read as LF-separated text, that is [`binary_kind`] or has
/// [`cr_lines`] (when `lone_cr_ends_lines` is false: CSV reads a lone CR as a line end);
/// whether there was one.
pub fn refuse_non_text(
    files: &[PathBuf],
    problems: &mut Problems,
    key: &'static str,
    lone_cr_ends_lines: bool,
) -> bool {
    let before = problems.0.len();
    for f in files {
        if !lone_cr_ends_lines && cr_lines(f) {
            problems.push(
                key,
                format!("the lines of `{}` end in a lone CR (no LF): it would read as one line", f.display()),
                Some("convert the line ends first, e.g. `tr '\\r' '\\n' < IN > OUT`".into()),
            );
        }
        if let Some(kind) = binary_kind(f) {
            let hint = match kind {
                "a Parquet file" => "read it with `read_table` (`format = \"parquet\"`, or a `.parquet` name)",
                _ => {
                    "decompress it first (e.g. `zstd -d`, `xz -dk`): curate reads text, plain or gzip/bzip2-compressed"
                }
            };
            problems.push(key, format!("input `{}` is {kind}, not text", f.display()), Some(hint.into()));
        }
    }
    problems.0.len() > before
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

/// The most common field count among the first `n` non-blank lines of a headerless file (the
/// wider on a tie): the width every row must have. A few malformed lines among the first do not
/// change it.
pub fn usual_width_of_first_lines(path: &Path, delimiter: u8, n: usize) -> std::result::Result<usize, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let mut widths = Vec::with_capacity(n);
    while widths.len() < n {
        match lines.next_line().map_err(|e| e.to_string())? {
            Some((_, [])) => {}
            Some((_, line)) => widths.push(line.iter().filter(|&&b| b == delimiter).count() + 1),
            None => break,
        }
    }
    usual_width(widths).ok_or_else(|| format!("`{}` is empty", path.display()))
}

/// The most common of `widths` (the wider on a tie), or `None` for none.
pub fn usual_width(widths: impl IntoIterator<Item = usize>) -> Option<usize> {
    let mut seen: std::collections::BTreeMap<usize, usize> = Default::default();
    for w in widths {
        *seen.entry(w).or_insert(0) += 1;
    }
    seen.into_iter().max_by_key(|&(width, count)| (count, width)).map(|(width, _)| width)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_headerless_file_has_the_usual_width_of_its_first_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.tsv");
        std::fs::write(&p, "a.jpg#0 no tab here\na.jpg#1\tok\nb.jpg#0\tok\tthird\nc.jpg#0\tok\n").unwrap();
        assert_eq!(usual_width_of_first_lines(&p, b'\t', 100).unwrap(), 2);
        assert_eq!(usual_width_of_first_lines(&p, b'\t', 1).unwrap(), 1);
        // A tie goes to the wider.
        assert_eq!(usual_width_of_first_lines(&p, b'\t', 3).unwrap(), 3);
        // Blank lines do not count.
        std::fs::write(&p, "\n\n\n\na\tb\n").unwrap();
        assert_eq!(usual_width_of_first_lines(&p, b'\t', 3).unwrap(), 2);
        std::fs::write(&p, "").unwrap();
        assert!(usual_width_of_first_lines(&p, b'\t', 100).unwrap_err().contains("is empty"));
    }

    #[test]
    fn a_malformed_first_line_does_not_hide_the_width_of_a_headerless_file() {
        // Flickr8k's first line has a space where its tab should be.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.tsv");
        std::fs::write(&p, "a.jpg#0 no tab here\na.jpg#1\tok\nb.jpg#0\tok\tthird\n").unwrap();
        assert_eq!(widest_of_first_lines(&p, b'\t', 2).unwrap(), 2, "only the first 2 lines are read");
        assert_eq!(widest_of_first_lines(&p, b'\t', 100).unwrap(), 3);
        std::fs::write(&p, "").unwrap();
        assert!(widest_of_first_lines(&p, b'\t', 100).unwrap_err().contains("is empty"));
    }

    /// All blocks of `path`, each read into the buffer `buffer(i)` gives for block `i`.
    fn blocks(path: &Path, mut buffer: impl FnMut(usize) -> Vec<u8>) -> Vec<(Vec<u8>, u64)> {
        let file = crate::io::lines::open_text(path).unwrap();
        let mut r =
            BlockReader { file, path: path.into(), name: "t".into(), carry: Vec::new(), next_line: 1, eof: false };
        let mut out = Vec::new();
        while let Some(b) = r.next_block(buffer(out.len())).unwrap() {
            let bytes = &b.buf[..b.len];
            let pieces = bytes.split(|&c| c == b'\n').count() - usize::from(bytes.ends_with(b"\n"));
            assert_eq!(b.lines as usize, pieces, "line count of block {}", out.len());
            out.push((b.buf[..b.len].to_vec(), b.first));
        }
        out
    }

    #[test]
    fn blocks_depend_on_the_file_only_not_on_the_buffers_they_are_read_into() {
        // Lines of many lengths, one longer than a block, and no line end at the very end.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("t.tsv");
        let mut text = Vec::new();
        let mut n = 0u64;
        while text.len() < 2 * BLOCK_BYTES {
            text.extend(std::iter::repeat_n(b'a' + (n % 26) as u8, (n * 7919 % 300) as usize));
            text.push(b'\n');
            n += 1;
        }
        text.extend(std::iter::repeat_n(b'x', BLOCK_BYTES + 10));
        text.extend_from_slice(b"\nlast line");
        std::fs::write(&p, &text).unwrap();

        let fresh = blocks(&p, |_| Vec::new());
        // Recycled buffers: dirty, and larger than a block (as after a long line's carry).
        let recycled = blocks(&p, |i| vec![0xff; BLOCK_BYTES + 4096 * (i + 1)]);
        assert_eq!(fresh, recycled);
        assert!(fresh.len() >= 3);
        assert_eq!(
            fresh.iter().flat_map(|b| b.0.clone()).collect::<Vec<u8>>(),
            text,
            "the blocks are the file, in order"
        );
        let mut line = 1;
        for (i, (b, first)) in fresh.iter().enumerate() {
            assert_eq!(*first, line, "block {i} starts at the right line");
            line += b.iter().filter(|&&c| c == b'\n').count() as u64;
            if i + 1 < fresh.len() {
                assert_eq!(b.last(), Some(&b'\n'), "block {i} ends at a line end");
            }
        }
    }

    #[test]
    fn line_text_is_checked_unless_the_piece_is_whole_characters_of_a_checked_line() {
        let bytes = "café\tnaïve".as_bytes();
        let line = Line { file: "t", no: 1, bytes, utf8: true };
        let f = split_tabs(bytes);
        assert_eq!((line.text(f[0]), line.text(f[1])), (Some("café"), Some("naïve")));
        assert_eq!(line.as_text(), Some("café\tnaïve"));
        // Cut inside `é` (two bytes): not text, although the line is.
        assert_eq!(line.text(&bytes[..4]), None);
        assert_eq!(line.text(&bytes[4..]), None);
        // A piece from elsewhere is checked in full.
        assert_eq!(line.text("ok".as_bytes()), Some("ok"));
        let bad = Line { file: "t", no: 1, bytes: b"a\xff\tb", utf8: false };
        let f = split_tabs(bad.bytes);
        assert_eq!((bad.text(f[0]), bad.text(f[1]), bad.as_text()), (None, Some("b"), None));
    }

    #[test]
    fn tab_fields_are_counted_past_the_stored_maximum() {
        let line = ["f"; 40].join("\t");
        let f = split_tabs(line.as_bytes());
        assert_eq!(f.count, 40);
        assert_eq!(f[0], b"f");
    }
}
