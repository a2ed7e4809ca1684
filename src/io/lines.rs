//! Line-oriented input (TSV files): raw lines with 1-based numbers, bytes untouched, so invalid
//! UTF-8 can be reported per line instead of failing the file.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use crate::error::{Error, Result};

/// The UTF-8 byte-order mark some tools (Excel, Notepad) put at the start of a text file: not
/// part of the first line.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Moves past a [`BOM`] at the start of `file`, if there is one.
pub fn skip_bom(file: &mut File) -> std::io::Result<()> {
    use std::io::{Read, Seek};
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
    reader: BufReader<File>,
    buf: Vec<u8>,
    line: u64,
    path: std::path::PathBuf,
}

impl Lines {
    pub fn open(path: &Path) -> Result<Lines> {
        let mut f = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
        skip_bom(&mut f).map_err(|e| Error::io("cannot read", path, e))?;
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
}
