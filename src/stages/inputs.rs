//! Checks of a reader's input files, at plan time, before any data is read: path patterns
//! expanded to distinct files; files a text reader cannot read (compressed other than with
//! gzip or bzip2, archives, Parquet, lone-CR line ends); the header and usual width of a
//! table's first lines.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::Problems;
use crate::io::lines::{Compression, Lines};

/// Shared reader configuration check: the patterns expand to files (not folders), and no two
/// share a file name — rows are known by `<file name>#<row>` (`sample_id`, rejects'
/// `source_file`), so two `part.tsv` in different folders would give the same ids. `files_like`
/// is a pattern of the reader's files in a folder, for the hint when a folder is given.
pub fn expand_inputs(
    patterns: &crate::io::PathPatterns,
    problems: &mut Problems,
    key: &'static str,
    files_like: &str,
) -> Vec<PathBuf> {
    expand_inputs_known_by(patterns, problems, key, files_like, None)
}

/// [`expand_inputs`] for a reader whose rows are known otherwise than by file name and row:
/// `known_by` says why two files of one name are refused all the same, for the hint.
pub fn expand_inputs_known_by(
    patterns: &crate::io::PathPatterns,
    problems: &mut Problems,
    key: &'static str,
    files_like: &str,
    known_by: Option<&str>,
) -> Vec<PathBuf> {
    if patterns.0.is_empty() {
        problems.push(
            key,
            "no input: the list of paths is empty".to_owned(),
            Some("give a file, a pattern or a list: `path = \"data/part-*.tsv\"`".to_owned()),
        );
        return Vec::new();
    }
    let files = match patterns.expand() {
        Ok(files) => files,
        Err(e) => {
            let hint = if e.contains("so its files would be left out") {
                "give curate's user the right to list that folder, or name the files it may read"
            } else {
                "paths are relative to the directory curate runs in"
            };
            problems.push(key, format!("input {e}"), Some(hint.into()));
            return Vec::new();
        }
    };
    let mut ok = true;
    for f in &files {
        ok &= !refuse_not_regular(f, problems, key);
    }
    for f in files.iter().filter(|f| f.is_dir()) {
        ok = false;
        problems.push(
            key,
            format!("input `{}` is a folder", f.display()),
            Some(format!("name the files in it, e.g. `{}`", f.join(files_like).display())),
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
                    match known_by {
                        Some(why) => format!("{why}: rename one, or run each folder as its own pipeline"),
                        None => format!(
                            "rows are known by file name and row (`{name}#1`): rename one, or run each folder as its own pipeline"
                        ),
                    },
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

/// Says so in `problems` when `path` is a pipe or a device (`/dev/stdin` from a pipe, a FIFO),
/// without opening it: such an input can be read once, where a run reads its inputs more than
/// once (fingerprint, fit passes, stream), and a FIFO with no writer would block `open` forever.
fn refuse_not_regular(path: &Path, problems: &mut Problems, key: &'static str) -> bool {
    let Some(what) = not_regular(path) else { return false };
    problems.push(
        key,
        format!("input `{}` is {what}, not a file", path.display()),
        Some("write it to a file first: a run reads its inputs more than once".into()),
    );
    true
}

/// What `path` is when it exists and is neither a regular file nor a folder (links followed):
/// "a pipe", "a device", "a socket".
fn not_regular(path: &Path) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let kind = std::fs::metadata(path).ok()?.file_type();
    if kind.is_file() || kind.is_dir() {
        None
    } else if kind.is_fifo() {
        Some("a pipe")
    } else if kind.is_char_device() || kind.is_block_device() {
        Some("a device")
    } else if kind.is_socket() {
        Some("a socket")
    } else {
        Some("something else")
    }
}

/// What a file is, by its first bytes, when it is one a text reader cannot read: a file
/// compressed other than with gzip or bzip2 (which [`crate::io::lines::open_text`] reads), an
/// archive, or a Parquet file — or, inside gzip or bzip2, any of these or gzip/bzip2 again.
/// Every line of it would be a reject, or worse, a row of binary bytes.
fn binary_kind(path: &Path) -> Option<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(path).ok()?;
    let mut head = Vec::new();
    (&mut f).take(512).read_to_end(&mut head).ok()?;
    // Parquet's `PAR1` counts only when the file also ends with it.
    let parquet = head.starts_with(b"PAR1") && {
        let mut tail = [0u8; 4];
        f.seek(SeekFrom::End(-4)).and_then(|_| f.read_exact(&mut tail)).is_ok() && tail == *b"PAR1"
    };
    if let Some(kind) = archive_kind(&head, parquet) {
        return Some(kind.to_owned());
    }
    let text = crate::io::lines::open_text(path).ok()?;
    let outer = text.compression();
    if outer == Compression::None {
        return None;
    }
    let mut inner = Vec::new();
    // A damaged stream is reported when it is read.
    text.take(512).read_to_end(&mut inner).ok()?;
    let kind = match Compression::of(&inner) {
        // (No file end to check for Parquet's second `PAR1` here: a text starting `PAR1` inside
        // gzip or bzip2 is refused as Parquet.)
        Compression::None => archive_kind(&inner, inner.starts_with(b"PAR1"))?.to_owned(),
        twice => format!("{}-compressed", twice.name()),
    };
    Some(format!("{kind} inside {}", outer.name()))
}

/// The compression `head`, a file's first bytes, shows, if any, as `gzip-compressed`: the
/// two that text readers decompress and those that [`archive_kind`] names.
pub fn compression_of(head: &[u8]) -> Option<String> {
    match Compression::of(head) {
        Compression::None => archive_kind(head, false).filter(|k| k.ends_with("-compressed")).map(str::to_owned),
        c => Some(format!("{}-compressed", c.name())),
    }
}

/// [`archive_kind`] of a file in UTF-16 (or UTF-32): text, but not the UTF-8 curate reads.
const UTF16: &str = "UTF-16 text (its byte-order mark)";

/// What `head`, the first bytes of a file, shows it to be, if not text: a compressed file that
/// text readers do not decompress, an archive, or (when `parquet`) a Parquet file. Only magic
/// numbers that no text line starts with.
fn archive_kind(head: &[u8], parquet: bool) -> Option<&'static str> {
    // POSIX (`ustar\0`) and GNU (`ustar  \0`) tar, at byte 257 of the first header.
    let tar = head.get(257..263) == Some(b"ustar\0") || head.get(257..265) == Some(b"ustar  \0");
    [
        (head.starts_with(b"\x28\xb5\x2f\xfd"), "zstd-compressed"),
        (head.starts_with(b"\xfd7zXZ\x00"), "xz-compressed"),
        // A byte-order mark of UTF-16 (or UTF-32, which starts as UTF-16LE's): no UTF-8 text
        // starts with byte FF or FE.
        (head.starts_with(b"\xff\xfe") || head.starts_with(b"\xfe\xff"), UTF16),
        (head.starts_with(b"PK\x03\x04"), "a zip archive"),
        (tar, "a tar archive"),
        (parquet, "a Parquet file"),
    ]
    .into_iter()
    .find_map(|(is, kind)| is.then_some(kind))
}

/// Whether the lines of `path` end in a lone CR (classic Mac OS): a CR not before an LF, and no
/// LF at all in its first 64 KiB. Read line by line at LF, the whole file would be one line.
fn cr_lines(path: &Path) -> bool {
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
        if refuse_not_regular(f, problems, key) {
            continue;
        }
        if !lone_cr_ends_lines && cr_lines(f) {
            problems.push(
                key,
                format!("the lines of `{}` end in a lone CR (no LF): it would read as one line", f.display()),
                Some("convert the line ends first, e.g. `tr '\\r' '\\n' < IN > OUT`".into()),
            );
        }
        if let Some(kind) = binary_kind(f) {
            if kind.starts_with(UTF16) {
                problems.push(
                    key,
                    format!("input `{}` is {kind}, not UTF-8", f.display()),
                    Some("convert it first, e.g. `iconv -f UTF-16 -t UTF-8 IN > OUT`".into()),
                );
                continue;
            }
            let hint = if kind == "a Parquet file" {
                "read it with `read_table` (`format = \"parquet\"`, or a `.parquet` name)"
            } else if kind.starts_with("a tar archive") {
                "webdataset shards are read by `read_img2dataset`; extract other archives first"
            } else {
                "decompress it first (e.g. `zstd -d`, `xz -dk`): curate reads text, plain or gzip/bzip2-compressed"
            };
            problems.push(key, format!("input `{}` is {kind}, not text", f.display()), Some(hint.into()));
        }
    }
    problems.0.len() > before
}

/// Reads a file's header line for column-name checks: the names between delimiters, byte for
/// byte (a TSV has no quoting, so a `"` is part of a name).
pub fn header_fields(path: &Path, delimiter: u8) -> std::result::Result<Vec<String>, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let Some((_, line)) = lines.next_line().map_err(|e| e.to_string())? else {
        return Err(format!("`{}` is empty", path.display()));
    };
    let text = String::from_utf8_lossy(line);
    Ok(text.split(delimiter as char).map(str::to_owned).collect())
}

/// Field count of the widest of the first `n` non-blank lines of a headerless file (one
/// malformed first line must not hide the file's real width).
pub fn widest_of_first_lines(path: &Path, delimiter: u8, n: usize) -> std::result::Result<usize, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let (mut widest, mut read, mut blank) = (0, 0, 0);
    while read < n {
        match lines.next_line().map_err(|e| e.to_string())? {
            Some((_, [])) => blank += 1,
            Some((_, line)) => {
                read += 1;
                widest = widest.max(line.iter().filter(|&&b| b == delimiter).count() + 1);
            }
            None => break,
        }
    }
    match (widest, blank) {
        (0, 0) => Err(format!("`{}` is empty", path.display())),
        (0, _) => Err(only_empty_lines(path, blank)),
        _ => Ok(widest),
    }
}

/// The error of a headerless file of `blank` empty lines and nothing else.
fn only_empty_lines(path: &Path, blank: usize) -> String {
    format!("`{}` has only empty lines ({blank}): its width cannot be known", path.display())
}

/// The most common field count among the first `n` non-blank lines of a headerless file (the
/// wider on a tie): the width every row must have. A few malformed lines among the first do not
/// change it.
pub fn usual_width_of_first_lines(path: &Path, delimiter: u8, n: usize) -> std::result::Result<usize, String> {
    let mut lines = Lines::open(path).map_err(|e| e.to_string())?;
    let mut widths = Vec::with_capacity(n);
    let mut blank = 0;
    while widths.len() < n {
        match lines.next_line().map_err(|e| e.to_string())? {
            Some((_, [])) => blank += 1,
            Some((_, line)) => widths.push(line.iter().filter(|&&b| b == delimiter).count() + 1),
            None => break,
        }
    }
    usual_width(widths).ok_or_else(|| match blank {
        0 => format!("`{}` is empty", path.display()),
        _ => only_empty_lines(path, blank),
    })
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
        std::fs::write(&p, "\n\r\n").unwrap();
        let err = usual_width_of_first_lines(&p, b'\t', 100).unwrap_err();
        assert!(err.ends_with("has only empty lines (2): its width cannot be known"), "{err}");
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
}
