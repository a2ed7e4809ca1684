//! The text-input engine of the TSV readers (`read_cc_tsv`, `read_yfcc`, `read_table`'s TSV):
//! files cut into blocks at line ends, blocks parsed in parallel as soon as they are read, chunks
//! yielded in input order; and the tab splitting of one line.

use std::path::PathBuf;

use super::{Skipped, UniqueIds, DUPLICATE_ID};
use crate::error::{Error, Result};
use crate::schema::{Chunk, PairsBuilder, Reject, Rejects};

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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

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
