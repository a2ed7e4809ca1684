//! Text inputs: [`open_text`] opens every text file a reader reads, and [`Lines`] reads the
//! small ones line by line (table headers, the YFCC15M list, `words.txt`): raw lines with
//! 1-based numbers, bytes untouched, so invalid UTF-8 can be reported per line instead of
//! failing the file. (The data of TSV inputs is cut into blocks and parsed in parallel by
//! `stages::LineChunks`.) Text inputs may be stored
//! compressed as they are published (YFCC100M and the YFCC15M list come as `.bz2`, many tables
//! as `.gz`): [`open_text`] knows gzip and bzip2 by their first bytes, whatever the file's name,
//! and every text reader reads through it.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use crate::error::{Error, Result};

/// The UTF-8 byte-order mark some tools (Excel, Notepad) put at the start of a text file: not
/// part of the first line.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// What follows a bzip2 stream's `BZh` and block-size digit: the magic of its first block, or
/// that of the stream's end (an empty stream).
const BZIP2_MAGICS: [&[u8]; 2] = [b"\x31\x41\x59\x26\x53\x59", b"\x17\x72\x45\x38\x50\x90"];

/// How a text input is stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Bzip2,
}

impl Compression {
    /// The compression a file's first bytes show. bzip2's `BZh` counts only with its block-size
    /// digit and the magic of a block or of the stream's end, so that no text line matches.
    pub fn of(head: &[u8]) -> Compression {
        if head.starts_with(b"\x1f\x8b") {
            Compression::Gzip
        } else if head.len() >= 10
            && head.starts_with(b"BZh")
            && (b'1'..=b'9').contains(&head[3])
            && BZIP2_MAGICS.contains(&&head[4..10])
        {
            Compression::Bzip2
        } else {
            Compression::None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "plain",
            Compression::Gzip => "gzip",
            Compression::Bzip2 => "bzip2",
        }
    }
}

/// A text input opened for reading: its text, decompressed if the file is compressed, past a
/// leading [`BOM`]. Plain files are read directly (no copy through a buffer).
pub struct TextFile {
    inner: Inner,
    compression: Compression,
}

enum Inner {
    Plain(File),
    Decoded(Box<dyn Read + Send + Sync>),
}

impl TextFile {
    pub fn compression(&self) -> Compression {
        self.compression
    }
}

impl Read for TextFile {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match &mut self.inner {
            Inner::Plain(f) => f.read(buf),
            Inner::Decoded(d) => d.read(buf).map_err(|e| decoding_error(self.compression, e)),
        }
    }
}

/// A decoder's own errors ("corrupt deflate stream", an early end) do not say where they come
/// from.
fn decoding_error(compression: Compression, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("its {} data is damaged or cut short ({e})", compression.name()))
}

/// Opens a text input (see [`TextFile`]): gzip (several members, as `cat a.gz b.gz` makes,
/// read as one text) and bzip2 (several streams, as parallel compressors write) are
/// decompressed on the fly, bzip2 on every core ([`super::bzip2_blocks`]).
pub fn open_text(path: &Path) -> std::io::Result<TextFile> {
    use std::io::{Seek, SeekFrom};
    let mut file = File::open(path)?;
    let compression = sniff(&mut file)?;
    file.seek(SeekFrom::Start(0))?;
    let mut decoder: Box<dyn Read + Send + Sync> = match compression {
        Compression::None => {
            skip_bom(&mut file)?;
            return Ok(TextFile { inner: Inner::Plain(file), compression });
        }
        Compression::Gzip => Box::new(GzipMembers::new(BufReader::with_capacity(1 << 20, file))),
        Compression::Bzip2 => Box::new(super::bzip2_blocks::ParallelBzDecoder::new(file)?),
    };
    // The first three bytes of the text: a BOM is dropped, anything else is read again.
    let mut start = Vec::with_capacity(3);
    (&mut decoder).take(3).read_to_end(&mut start).map_err(|e| decoding_error(compression, e))?;
    if start == BOM {
        start.clear();
    }
    let inner = Inner::Decoded(Box::new(std::io::Cursor::new(start).chain(decoder)));
    Ok(TextFile { inner, compression })
}

/// The gzip members of a file one after another, read as one text (as `gzip -dc` reads them),
/// where bytes after the last member that do not start another (zero padding, an appended
/// file) are an error that says so, not a damaged member.
struct GzipMembers {
    member: Option<flate2::bufread::GzDecoder<BufReader<File>>>,
}

impl GzipMembers {
    fn new(file: BufReader<File>) -> Self {
        Self { member: Some(flate2::bufread::GzDecoder::new(file)) }
    }
}

impl Read for GzipMembers {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use std::io::BufRead;
        loop {
            let Some(member) = self.member.as_mut() else { return Ok(0) };
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // The member ended: what follows is the end of the file or another member.
            let mut rest = self.member.take().expect("a member").into_inner();
            match rest.fill_buf()?.first() {
                None => return Ok(0),
                Some(0x1f) => self.member = Some(flate2::bufread::GzDecoder::new(rest)),
                Some(_) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "bytes after the last member are not gzip data",
                    ))
                }
            }
        }
    }
}

/// The compression of `file`, read from its start: [`Compression::of`] its first bytes, and a
/// file that starts as bzip2 does (`BZh`) without the rest of the magic after it is bzip2 still
/// when what follows is not text (NUL bytes or invalid UTF-8 in its first 64 KiB): a bzip2
/// file damaged in its first bytes, which decoding then reports, where a text line such as
/// `BZh9 dogs` is read as text; and so is a file of 4 to 9 bytes that is the start of a bzip2
/// file.
fn sniff(file: &mut File) -> std::io::Result<Compression> {
    let mut head = Vec::with_capacity(1 << 16);
    file.take(1 << 16).read_to_end(&mut head)?;
    let compression = Compression::of(&head);
    let bzip2_start = head.len() >= 4 && head.starts_with(b"BZh");
    if compression == Compression::None && bzip2_start {
        // A file cut inside the bzip2 magic.
        let cut = head.len() < 10 && BZIP2_MAGICS.iter().any(|m| m.starts_with(&head[4..]));
        if cut {
            return Ok(Compression::Bzip2);
        }
        let text = match std::str::from_utf8(&head) {
            Ok(_) => true,
            // A character cut at the end of the 64 KiB is still text.
            Err(e) => e.error_len().is_none() && head.len() == 1 << 16,
        };
        if !text || head.contains(&0) {
            return Ok(Compression::Bzip2);
        }
    }
    Ok(compression)
}

/// Moves past a [`BOM`] at the start of `file`, if there is one.
fn skip_bom(file: &mut File) -> std::io::Result<()> {
    use std::io::Seek;
    let mut head = [0u8; 3];
    let mut n = 0;
    while n < 3 {
        match file.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    if head[..n] != *BOM {
        file.seek(std::io::SeekFrom::Start(0))?;
    }
    Ok(())
}

/// Reads `path` line by line. A line is the bytes up to `\n` (exclusive); one trailing `\r` is
/// removed too, so CRLF files read like LF files. A last line without a newline is still a line,
/// and loses a trailing `\r` as well.
pub struct Lines {
    reader: BufReader<TextFile>,
    buf: Vec<u8>,
    line: u64,
    path: std::path::PathBuf,
}

impl Lines {
    pub fn open(path: &Path) -> Result<Lines> {
        let f = open_text(path).map_err(|e| Error::io("cannot open", path, e))?;
        Ok(Lines { reader: BufReader::with_capacity(1 << 20, f), buf: Vec::new(), line: 0, path: path.to_owned() })
    }

    /// The next line and its 1-based number, or `None` at the end of the file.
    pub fn next_line(&mut self) -> Result<Option<(u64, &[u8])>> {
        self.buf.clear();
        let n = self.reader.read_until(b'\n', &mut self.buf).map_err(|e| Error::io("cannot read", &self.path, e))?;
        if n == 0 {
            return Ok(None);
        }
        self.line += 1;
        let mut end = self.buf.len();
        if self.buf[end - 1] == b'\n' {
            end -= 1;
        }
        // CRLF, or a CR ending the last line of the file, as the block parser reads lines.
        if end > 0 && self.buf[end - 1] == b'\r' {
            end -= 1;
        }
        Ok(Some((self.line, &self.buf[..end])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole text of a text input, as a reader reads it.
    fn read_text(path: &Path) -> std::io::Result<Vec<u8>> {
        let mut text = Vec::new();
        open_text(path)?.read_to_end(&mut text)?;
        Ok(text)
    }

    #[test]
    fn numbers_lines_and_strips_terminators() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.tsv");
        std::fs::write(&p, b"a\tb\nc\r\n\nlast\r").unwrap();
        let mut l = Lines::open(&p).unwrap();
        let mut got = Vec::new();
        while let Some((n, line)) = l.next_line().unwrap() {
            got.push((n, line.to_vec()));
        }
        assert_eq!(got, vec![(1, b"a\tb".to_vec()), (2, b"c".to_vec()), (3, b"".to_vec()), (4, b"last".to_vec())]);
        // A byte-order mark is not part of the first line.
        std::fs::write(&p, b"\xEF\xBB\xBFid\tx\n").unwrap();
        assert_eq!(Lines::open(&p).unwrap().next_line().unwrap(), Some((1, &b"id\tx"[..])));
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    fn bzip2(bytes: &[u8]) -> Vec<u8> {
        use std::io::Write;
        let mut e = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn compressed_text_is_known_by_its_first_bytes_and_read_as_text() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.tsv");
        // (file bytes, compression, text): a BOM goes whether or not the file is compressed;
        // texts shorter than a BOM and empty ones read as they are.
        let cases: Vec<(Vec<u8>, Compression, &[u8])> = vec![
            (b"BZh9 dogs\n".to_vec(), Compression::None, b"BZh9 dogs\n"),
            (b"\xEF\xBB\xBFa\n".to_vec(), Compression::None, b"a\n"),
            (gzip(b"\xEF\xBB\xBFa\tb\n"), Compression::Gzip, b"a\tb\n"),
            (gzip(b"ab"), Compression::Gzip, b"ab"),
            (gzip(b""), Compression::Gzip, b""),
            (bzip2(b"\xEF\xBB\xBF"), Compression::Bzip2, b""),
            (bzip2(b""), Compression::Bzip2, b""),
            ([bzip2(b"one\n"), bzip2(b"two\n")].concat(), Compression::Bzip2, b"one\ntwo\n"),
        ];
        for (bytes, compression, text) in cases {
            std::fs::write(&p, &bytes).unwrap();
            let mut f = open_text(&p).unwrap();
            assert_eq!(f.compression(), compression, "{bytes:?}");
            let mut got = Vec::new();
            f.read_to_end(&mut got).unwrap();
            assert_eq!(got, text, "{compression:?}");
            assert_eq!(read_text(&p).unwrap(), text);
        }
        // A bzip2 file damaged in its magic, or cut inside it, is still bzip2 (and its
        // decoding fails) unless what follows reads as text.
        let whole = bzip2(b"a dog\n");
        for bytes in [[&whole[..4], b"\x00\xff\x13"].concat(), whole[..6].to_vec(), {
            let mut b = whole.clone();
            b[5] ^= 0x40;
            b
        }] {
            std::fs::write(&p, &bytes).unwrap();
            let e = read_text(&p).unwrap_err().to_string();
            assert!(e.contains("bzip2 data is damaged or cut short"), "{bytes:?}: {e}");
        }
        // gzip members one after another are one text; bytes after the last that start no
        // member are named as such, a member cut short as damaged.
        let two = [gzip(b"one\n"), gzip(b""), gzip(b"two\n")].concat();
        std::fs::write(&p, &two).unwrap();
        assert_eq!(read_text(&p).unwrap(), b"one\ntwo\n");
        for (tail, says) in [
            (&b"\0\0\0\0"[..], "gzip data is damaged or cut short (bytes after the last member are not gzip data)"),
            (b"junk", "bytes after the last member are not gzip data"),
            (b"\x1f\x8b\x08", "gzip data is damaged or cut short"),
        ] {
            std::fs::write(&p, [&two[..], tail].concat()).unwrap();
            let e = read_text(&p).unwrap_err().to_string();
            assert!(e.contains(says), "{tail:?}: {e}");
        }
        std::fs::write(&p, &two[..two.len() - 3]).unwrap();
        let e = read_text(&p).unwrap_err().to_string();
        assert!(e.contains("gzip data is damaged or cut short") && !e.contains("after the last"), "{e}");
        // Lines of a compressed file, CRLF and all.
        std::fs::write(&p, gzip(b"a\r\nb")).unwrap();
        let mut l = Lines::open(&p).unwrap();
        assert_eq!(l.next_line().unwrap(), Some((1, &b"a"[..])));
        assert_eq!(l.next_line().unwrap(), Some((2, &b"b"[..])));
        assert_eq!(l.next_line().unwrap(), None);
    }
}
