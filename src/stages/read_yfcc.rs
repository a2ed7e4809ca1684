//! `read_yfcc`: the YFCC100M metadata file, in its 25-field release (line number, photo id,
//! photo hash, user, ...) or the original 23-field layout (no line number, no hash); the layout
//! is recognised per line by its field count. Optionally restricted to the YFCC15M subset
//! (`yfcc100m_subset_data.tsv`: line number, photo id, hash).
//!
//! Text fields are URL-encoded in the release (`+` is a space, `%XX` escapes); they are decoded,
//! HTML tags stripped and whitespace collapsed (the cleaning OTTER describes, spec §5.8). The
//! caption is the title, the description, or both as `title. description`. `sample_id` is the
//! photo id; `url` the download URL. Videos and rows outside the subset are skipped and counted
//! (they are not errors, and YFCC100M has 85M rows outside YFCC15M); a photo without title and
//! description is an `empty_caption` reject.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{expand_inputs, split_tabs, ChunkIter, LineChunks, LineOutcome, LoadError, Problems, Reader};
use crate::error::{Error, Result};
use crate::io::lines::Lines;
use crate::io::PathPatterns;
use crate::schema::PairRow;

pub const TYPE: &str = "read_yfcc";

/// Which metadata fields make the caption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaptionFrom {
    Title,
    Description,
    /// `title. description` when both exist, else whichever exists (OTTER, spec §5.8).
    TitleAndDescription,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadYfccConfig {
    /// The dataset file(s) (`yfcc100m_dataset`, or its parts).
    pub path: PathPatterns,
    /// YFCC15M subset list; when set, other photos are skipped.
    #[serde(default)]
    pub subset: Option<PathPatterns>,
    #[serde(default = "default_caption")]
    pub caption: CaptionFrom,
    /// Remove HTML tags from title and description and decode character references
    /// (`&amp;`, `&#39;`; see [`clean`]).
    #[serde(default = "super::yes")]
    pub strip_html: bool,
    #[serde(default = "default_source")]
    pub source: String,
}

fn default_caption() -> CaptionFrom {
    CaptionFrom::TitleAndDescription
}
fn default_source() -> String {
    "yfcc100m".into()
}

impl ReadYfccConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadYfcc> {
        let files = expand_inputs(&self.path, problems, "path", "yfcc100m_dataset*");
        let subset = self.subset.as_ref().map(|s| expand_inputs(s, problems, "subset", "yfcc100m_subset_data.tsv"));
        super::refuse_non_text(&files, problems, "path", false);
        super::refuse_non_text(subset.as_deref().unwrap_or_default(), problems, "subset", false);
        if !problems.is_empty() {
            return None;
        }
        let subset_files = subset.unwrap_or_default();
        // The first lines only: the whole list (YFCC15M: 15M lines) is read when the run starts.
        match load_subset(&subset_files, Some(SUBSET_LINES_CHECKED)) {
            Ok(_) => {}
            Err(LoadError::Io(e)) => {
                problems.push("subset", e, None);
                return None;
            }
            Err(LoadError::Format(e)) => {
                problems.push("subset", e, Some(SUBSET_HINT.into()));
                return None;
            }
        }
        Some(ReadYfcc {
            files,
            subset_files,
            subset: Default::default(),
            caption: self.caption,
            strip_html: self.strip_html,
            source: self.source.clone(),
        })
    }
}

/// Lines of each subset list that `validate` checks.
const SUBSET_LINES_CHECKED: u64 = 1000;
const SUBSET_HINT: &str = "expected `line_number<TAB>photo_id<TAB>hash` lines";

/// A photo id, in the data or a subset list: digits only (no sign), around which blanks are
/// allowed, of at most a 64-bit value (YFCC100M's go up to ~1.2e10); else why not.
fn photo_id(field: &str) -> std::result::Result<u64, &'static str> {
    // Blanks as Python's `str.split()` has them (U+001C..U+001F too), as for every id.
    let digits = field.trim_matches(crate::text::is_python_whitespace);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("is not a number");
    }
    digits.parse::<u64>().map_err(|_| "is too large (over 18446744073709551615)")
}

/// Photo ids listed in subset files (of each file's first `lines_each` lines, if given). A
/// first line whose second field is not a number is a header.
fn load_subset(files: &[PathBuf], lines_each: Option<u64>) -> std::result::Result<HashSet<u64>, LoadError> {
    let io = |e: crate::error::Error| LoadError::Io(e.to_string());
    let mut ids = HashSet::new();
    for f in files {
        let mut lines = Lines::open(f).map_err(io)?;
        while let Some((no, line)) = lines.next_line().map_err(io)? {
            if lines_each.is_some_and(|n| no > n) {
                break;
            }
            if line.is_empty() {
                continue;
            }
            let fields = split_tabs(line);
            let n = fields.count;
            let field = (n >= 2).then(|| String::from_utf8_lossy(fields[1]));
            match field.as_deref().map(|s| (s, photo_id(s))) {
                Some((_, Ok(id))) => {
                    ids.insert(id);
                }
                _ if no == 1 => {} // header
                found => {
                    let why = match found {
                        Some((s, Err(why))) => format!(" (`{s}` {why})"),
                        _ => String::new(),
                    };
                    let e = format!("`{}` line {no}: no photo id in the second field{why}", f.display());
                    return Err(LoadError::Format(e));
                }
            }
        }
    }
    Ok(ids)
}

pub struct ReadYfcc {
    files: Vec<PathBuf>,
    /// The subset lists: inputs too (they change the output), so fingerprinted.
    subset_files: Vec<PathBuf>,
    /// Their photo ids, read whole once the run starts (`Reader::prepare`).
    subset: std::sync::OnceLock<Arc<HashSet<u64>>>,
    caption: CaptionFrom,
    strip_html: bool,
    source: String,
}

impl ReadYfcc {
    /// The subset's photo ids (`None`: no subset), read once.
    fn subset_ids(&self) -> Result<Option<Arc<HashSet<u64>>>> {
        if self.subset_files.is_empty() {
            return Ok(None);
        }
        if let Some(ids) = self.subset.get() {
            return Ok(Some(ids.clone()));
        }
        let bytes: u64 = self.subset_files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        if bytes > 64 << 20 {
            say!("reading the subset list ({} MB) ...", bytes >> 20);
        }
        let ids = load_subset(&self.subset_files, None).map_err(|e| match e {
            LoadError::Io(e) => Error::data(format!("subset: {e}")),
            LoadError::Format(e) => Error::data(format!("subset: {e} ({SUBSET_HINT})")),
        })?;
        Ok(Some(self.subset.get_or_init(|| Arc::new(ids)).clone()))
    }
}

/// Field positions in the two layouts.
struct Layout {
    id: usize,
    title: usize,
    description: usize,
    download_url: usize,
    marker: usize,
}
const LAYOUT_25: Layout = Layout { id: 1, title: 8, description: 9, download_url: 16, marker: 24 };
const LAYOUT_23: Layout = Layout { id: 0, title: 6, description: 7, download_url: 14, marker: 22 };

impl Reader for ReadYfcc {
    fn image_refs(&self) -> super::ImageRefs {
        super::ImageRefs::UrlsOnly
    }

    fn inputs(&self) -> Vec<PathBuf> {
        self.files.iter().chain(&self.subset_files).cloned().collect()
    }

    fn prepare(&self) -> Result<()> {
        self.subset_ids().map(|_| ())
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        let subset = self.subset_ids()?;
        let (how, strip) = (self.caption, self.strip_html);
        Ok(Box::new(
            LineChunks::new(self.files.clone(), &self.source, TYPE, 0, move |line, out, _scratch| {
                let fields = split_tabs(line.bytes);
                let layout = match fields.count {
                    25 => &LAYOUT_25,
                    23 => &LAYOUT_23,
                    n => {
                        return LineOutcome::Reject {
                            reason: "wrong_field_count",
                            detail: format!("{n} fields, expected 25 or 23").into(),
                        }
                    }
                };
                let Some(id) = line.text(fields[layout.id]) else {
                    return LineOutcome::Reject { reason: "invalid_utf8", detail: "photo id is not UTF-8".into() };
                };
                let num = match photo_id(id) {
                    Ok(num) => num,
                    Err(why) => {
                        return LineOutcome::Reject {
                            reason: "bad_id",
                            detail: format!("photo id `{id}` {why}").into(),
                        }
                    }
                };
                // The id as a number (`007` is photo 7), as the subset file is matched: one photo
                // is one id, so a repeat is found however it is written.
                let id = num.to_string();
                if fields[layout.marker] == b"1" {
                    return LineOutcome::Skip("video");
                }
                if subset.as_ref().is_some_and(|s| !s.contains(&num)) {
                    return LineOutcome::Skip("not_in_subset");
                }
                let decode = |i: usize| -> std::result::Result<String, ()> {
                    let text = String::from_utf8(url_decode(fields[i])).map_err(|_| ())?;
                    Ok(clean(&text, strip))
                };
                // The download URL is a URL as it stands: not form-decoded (`+` stays `+`).
                let url = line
                    .text(fields[layout.download_url])
                    .map(|u| u.trim_matches(crate::text::is_python_whitespace).to_owned());
                // Only the fields the caption is made of are decoded: a field it does not use
                // cannot reject the row.
                let used = |i: usize, used: bool| if used { decode(i) } else { Ok(String::new()) };
                let title = used(layout.title, !matches!(how, CaptionFrom::Description));
                let desc = used(layout.description, !matches!(how, CaptionFrom::Title));
                let (Ok(title), Ok(desc)) = (title, desc) else {
                    return LineOutcome::RejectWithId {
                        reason: "invalid_utf8",
                        detail: "the title or description is not UTF-8 once URL-decoded".into(),
                        id: id.clone(),
                    };
                };
                // The row's image reference: without it the pair is no pair.
                let Some(url) = url else {
                    return LineOutcome::RejectWithId {
                        reason: "invalid_utf8",
                        detail: "the download URL is not UTF-8".into(),
                        id: id.clone(),
                    };
                };
                let caption = match how {
                    CaptionFrom::Title => title,
                    CaptionFrom::Description => desc,
                    CaptionFrom::TitleAndDescription => match (title.is_empty(), desc.is_empty()) {
                        (false, false) => format!("{title}. {desc}"),
                        (false, true) => title,
                        _ => desc,
                    },
                };
                if caption.is_empty() {
                    return LineOutcome::RejectWithId {
                        reason: "empty_caption",
                        detail: match how {
                            CaptionFrom::Title => "no title",
                            CaptionFrom::Description => "no description",
                            CaptionFrom::TitleAndDescription => "no title or description",
                        }
                        .into(),
                        id: id.clone(),
                    };
                }
                let url = (!url.is_empty()).then_some(url.as_str());
                out.push(PairRow { sample_id: &id, caption: Some(&caption), url, ..Default::default() });
                LineOutcome::Row
            })
            // Photo ids are unique in YFCC100M: a repeat means an input given twice or a corrupt one.
            .with_unique_ids(),
        ))
    }
}

/// `application/x-www-form-urlencoded` decoding: `+` is a space, `%XX` a byte; an invalid
/// escape is kept literally (as Python's `urllib.parse.unquote_plus` does).
fn url_decode(s: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < s.len() => match (hex(s[i + 1]), hex(s[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                    continue;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    out
}

/// Strips HTML tags (optional) and collapses whitespace runs to one space. A tag opens as in
/// HTML: `<` then a letter (`<b`), `</`, `<!` (`<!--`) or `<?`. A start tag ends where Python's
/// `html.parser` ends it ([`Scan::start_tag`]): at the `>` after its name and attributes, quoted
/// values holding `<` and `>` (`<a title="1 > 0">`, `<x<b>` is one tag); an end tag, or what
/// Python reads as a bogus comment after `</` (`</ b>`, `</1>`), runs to the next `>`, quotes
/// or not; a comment `<!--` runs to `--` and a `>` (blanks between allowed); `</>` goes. A tag that does not
/// close, and any other `<`, is text (`I <3 NY`, `< 5 and > 0`). This follows Python's
/// `html.parser`, except that a tag becomes a space (`a<br>b` is two words; `</>`, which the
/// parser drops without a word, leaves none). Then character references are decoded as Python's `html.unescape` decodes them:
/// numeric ones (`&#39;`, `&#x27;`, also without `;`), and of the named ones `&amp; &lt; &gt;
/// &quot; &apos; &nbsp;` (all but `&apos;` also without `;`); any other `&` stays as it is.
pub fn clean(text: &str, strip_html: bool) -> String {
    if !strip_html {
        return crate::text::collapse_whitespace(text);
    }
    // Most texts are read about once over; the scans are remembered only where a text is not.
    strip_tags(&mut Scan::new(text, 2 * text.len() + 256))
}

/// [`clean`]'s tag stripping over `scan`'s text, before whitespace is collapsed.
fn strip_tags(scan: &mut Scan) -> String {
    let text = scan.text;
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    while let Some(open) = text[at..].find('<').map(|o| at + o) {
        // The text before a `<`, with its references decoded: a reference does not run on
        // into the text after a tag (`&#x4a</>b` is `Jb`).
        push_decoded(&mut out, &text[at..open]);
        let after = open + 1;
        at = match scan.markup(after) {
            Markup::Tag { len, space } => {
                if space {
                    out.push(' ');
                }
                after + len
            }
            Markup::Text { len, decoded } => {
                let piece = &text[open..after + len];
                if decoded {
                    push_decoded(&mut out, piece);
                } else {
                    out.push_str(piece);
                }
                after + len
            }
        };
    }
    push_decoded(&mut out, &text[at..]);
    crate::text::collapse_whitespace(&out)
}

/// Appends `text` with its character references decoded.
fn push_decoded(out: &mut String, text: &str) {
    if text.contains('&') {
        out.push_str(&decode_references(text));
    } else {
        out.push_str(text);
    }
}

/// Decodes the character references [`clean`] names, as Python's `html.unescape` does.
fn decode_references(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        match reference(after) {
            Some((decoded, len)) => {
                out.extend(decoded);
                rest = &after[len..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The names decoded without their `;` too (HTML's legacy ones among [`clean`]'s six).
const LEGACY_NAMES: [(&str, char); 5] = [("amp", '&'), ("lt", '<'), ("gt", '>'), ("quot", '"'), ("nbsp", '\u{a0}')];

/// The character reference `after` (the text after a `&`) starts, as `html.unescape` reads
/// it: what it decodes to (at most one character) and its length, `;` included; `None` where
/// the `&` stays text. Numbers may lack the `;` (`&#65b` is `Ab`), as may the legacy names,
/// which also match as the longest prefix of a longer name (`&ampx` is `&x`).
fn reference(after: &str) -> Option<(Option<char>, usize)> {
    let b = after.as_bytes();
    if b.first() == Some(&b'#') {
        let (start, radix) = match b.get(1) {
            Some(b'x' | b'X') => (2, 16),
            _ => (1, 10),
        };
        let digits = b[start..].iter().take_while(|&&c| (c as char).is_digit(radix)).count();
        if digits == 0 {
            return None;
        }
        // Saturates past the last code point: any larger number decodes the same.
        let code = b[start..start + digits]
            .iter()
            .fold(0u32, |n, &c| (n * radix + (c as char).to_digit(radix).unwrap_or(0)).min(0x11_0000));
        let len = start + digits + usize::from(b.get(start + digits) == Some(&b';'));
        return Some((numeric_reference(code), len));
    }
    // A name runs to the first of `\t \n \x0c space < & # ;`, at most 32 characters.
    let name = after.chars().take(32).take_while(|c| !matches!(c, '\t' | '\n' | '\x0c' | ' ' | '<' | '&' | '#' | ';'));
    let name_len: usize = name.map(char::len_utf8).sum();
    let name = &after[..name_len];
    if b.get(name_len) == Some(&b';') {
        let c = match name {
            "amp" => Some('&'),
            "lt" => Some('<'),
            "gt" => Some('>'),
            "quot" => Some('"'),
            "apos" => Some('\''),
            "nbsp" => Some('\u{a0}'),
            _ => None,
        };
        if let Some(c) = c {
            return Some((Some(c), name_len + 1));
        }
    }
    // The whole name, or its longest prefix (of 2 or more bytes, shorter than the name with
    // its `;`), that is a legacy name.
    let whole = name_len + usize::from(b.get(name_len) == Some(&b';'));
    LEGACY_NAMES
        .iter()
        .filter(|(n, _)| name.starts_with(n) && (n.len() == name_len || n.len() < whole))
        .max_by_key(|(n, _)| n.len())
        .map(|&(n, c)| (Some(c), n.len()))
}

/// What `&#N;` decodes to in `html.unescape`: Windows-1252 for 0x80–0x9F (as browsers read
/// them), U+FFFD for 0, surrogates and numbers past U+10FFFF, nothing for the other control
/// characters and non-characters, else the character.
fn numeric_reference(code: u32) -> Option<char> {
    const WINDOWS_1252: [char; 32] = [
        '\u{20ac}', '\u{81}', '\u{201a}', '\u{192}', '\u{201e}', '\u{2026}', '\u{2020}', '\u{2021}', '\u{2c6}',
        '\u{2030}', '\u{160}', '\u{2039}', '\u{152}', '\u{8d}', '\u{17d}', '\u{8f}', '\u{90}', '\u{2018}', '\u{2019}',
        '\u{201c}', '\u{201d}', '\u{2022}', '\u{2013}', '\u{2014}', '\u{2dc}', '\u{2122}', '\u{161}', '\u{203a}',
        '\u{153}', '\u{9d}', '\u{17e}', '\u{178}',
    ];
    match code {
        0 => Some('\u{fffd}'),
        0x0d => Some('\r'),
        0x80..=0x9f => Some(WINDOWS_1252[(code - 0x80) as usize]),
        0xd800..=0xdfff | 0x11_0000.. => Some('\u{fffd}'),
        0x01..=0x08 | 0x0b | 0x0e..=0x1f | 0x7f | 0xfdd0..=0xfdef => None,
        c if c & 0xfffe == 0xfffe => None,
        c => char::from_u32(c),
    }
}

/// What a `<` starts, as Python's `html.parser` reads it: the rest of a tag, or text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Markup {
    /// `len` bytes after the `<`, through its `>`; whether it leaves a space.
    Tag { len: usize, space: bool },
    /// The `<` and `len` bytes after it, as one piece of text, its references decoded or not
    /// (the parser hands the start of a tag that a NUL ends on as it is).
    Text { len: usize, decoded: bool },
}

/// The first position at or after a start where a fixed pattern holds, remembered: where one
/// was found at `x` from `from`, none lies in `from..x`, so any start in `from..=x` finds `x`
/// too, and where none was found, none lies after `from`.
#[derive(Default)]
struct NextMatch {
    last: Option<(usize, Option<usize>)>,
}

impl NextMatch {
    fn get(&mut self, from: usize, memo: bool, find: impl FnOnce(usize) -> Option<usize>) -> Option<usize> {
        if let Some((start, found)) = self.last {
            if memo && start <= from && found.is_none_or(|x| from <= x) {
                return found;
            }
        }
        let found = find(from);
        self.last = Some((from, found));
        found
    }
}

/// The markup scans of one text. Python's parser reads a `<` that opens a tag but does not
/// close it on to the end of the text, then hands it over as text up to the next `<` and
/// starts again there: read one `<` at a time, a text of many (`<a <a <a …`, a broken title)
/// costs time quadratic in its length (a 120 kB title took 22 s). Each scan here depends only on
/// where it starts in the text, so its result is remembered by that position (the next `>`, a
/// comment's end, a tag name's end, and where a start tag's attribute loop ends from each
/// position it passes through): each part of the text is then read about once. They are
/// remembered once the scans have taken `remember_after` steps (kept in hash maps, they cost a
/// fifth more CPU time on texts full of tags that need none of them); `usize::MAX` reads every `<`
/// afresh, as the parser does (the tests compare the two).
struct Scan<'t> {
    text: &'t str,
    remember_after: usize,
    next_gt: NextMatch,
    /// The `--` that ends a comment (blanks and a `>` after it).
    comment_end: NextMatch,
    name_end: NextMatch,
    /// A start tag's outcome by the position its name ends at.
    after_name: HashMap<usize, Option<Markup>>,
    /// Where the attribute loop ends, by a position it passes through at its top.
    attributes_end: HashMap<usize, usize>,
    /// Characters stepped over and bytes searched.
    steps: usize,
}

impl<'t> Scan<'t> {
    fn new(text: &'t str, remember_after: usize) -> Scan<'t> {
        Scan {
            text,
            remember_after,
            next_gt: NextMatch::default(),
            comment_end: NextMatch::default(),
            name_end: NextMatch::default(),
            after_name: HashMap::new(),
            attributes_end: HashMap::new(),
            steps: 0,
        }
    }

    /// Whether results are remembered (and looked up) now.
    fn memo(&self) -> bool {
        self.steps >= self.remember_after
    }

    /// The first `>` at or after byte `from`.
    fn next_gt(&mut self, from: usize) -> Option<usize> {
        let (t, memo, steps) = (self.text, self.memo(), &mut self.steps);
        self.next_gt.get(from, memo, |from| {
            let found = t[from..].find('>').map(|k| from + k);
            *steps += found.unwrap_or(t.len()) - from;
            found
        })
    }

    /// What the text after a `<` (from byte `a`) starts: see [`Markup`].
    fn markup(&mut self, a: usize) -> Markup {
        let t = self.text;
        // A tag that opens but does not close is text through the next `>` (any `<` on the way
        // included), else up to the next `<`, else just the `<`: the parser's last resort when
        // its input ends.
        let unclosed = |s: &mut Self| Markup::Text {
            len: s.next_gt(a).map(|end| end + 1 - a).or_else(|| t[a..].find('<')).unwrap_or(0),
            decoded: true,
        };
        if t[a..].starts_with("!--") {
            // To the first `--` that blanks and a `>` follow (Python's `--\s*>`).
            let (memo, steps) = (self.memo(), &mut self.steps);
            let closing = |dashes: usize| {
                let blanks = leading_blanks(&t[dashes + 2..]);
                t[dashes + 2 + blanks..].starts_with('>').then_some(dashes + 2 + blanks + 1)
            };
            let dashes = self.comment_end.get(a + 3, memo, |mut from| {
                while let Some(dashes) = t[from..].find("--").map(|d| from + d) {
                    *steps += dashes + 2 + leading_blanks(&t[dashes + 2..]) - from;
                    if closing(dashes).is_some() {
                        return Some(dashes);
                    }
                    from = dashes + 1;
                }
                *steps += t.len() - from;
                None
            });
            return dashes
                .and_then(closing)
                .map_or_else(|| unclosed(self), |end| Markup::Tag { len: end - a, space: true });
        }
        match t.as_bytes()[a..] {
            [b'/', b'>', ..] => Markup::Tag { len: 2, space: false },
            [c, ..] if c.is_ascii_alphabetic() => self.start_tag(a).unwrap_or_else(|| unclosed(self)),
            // An end tag or a bogus comment (Python's `parse_endtag`), a declaration or a
            // processing instruction: to the first `>`, quotes or not.
            [b'/' | b'!' | b'?', ..] => {
                self.next_gt(a).map_or_else(|| unclosed(self), |end| Markup::Tag { len: end + 1 - a, space: true })
            }
            // `<3`, `< 5`: only the `<` is text.
            _ => Markup::Text { len: 0, decoded: true },
        }
    }

    /// A start tag (the text from byte `a` begins with a letter) as Python's `html.parser` finds
    /// its end: the match of its `locatestarttagend_tolerant` (a tag name, then attributes,
    /// `name`, `name=value`, `name='value'`, with its backtracking where a quote does not close),
    /// then `check_for_whole_start_tag`. `None` where the parser waits for more input (the tag is
    /// left open); `Text` where it gives up on the tag (its `<` and what it matched are text, as
    /// they stand).
    fn start_tag(&mut self, a: usize) -> Option<Markup> {
        let t = self.text;
        // The tag name: `[a-zA-Z][^\t\n\r\f />\x00]*` (the stops are ASCII: a byte search).
        let (memo, steps) = (self.memo(), &mut self.steps);
        let name_end = self.name_end.get(a + 1, memo, |from| {
            let end = t.as_bytes()[from..]
                .iter()
                .position(|b| matches!(b, b'\t' | b'\n' | b'\r' | b'\x0c' | b' ' | b'/' | b'>' | b'\0'))
                .map(|k| from + k);
            *steps += end.unwrap_or(t.len()) - from;
            end
        });
        let name_end = name_end.unwrap_or(t.len());
        if self.memo() {
            if let Some(&outcome) = self.after_name.get(&name_end) {
                return outcome.map(|m| m.shifted(name_end, a));
            }
        }
        let outcome = self.after_tag_name(name_end);
        if self.memo() {
            self.after_name.insert(name_end, outcome);
        }
        outcome.map(|m| m.shifted(name_end, a))
    }

    /// The rest of a start tag whose name ends at byte `q`: its outcome, with lengths counted
    /// from `q`.
    fn after_tag_name(&mut self, mut q: usize) -> Option<Markup> {
        let t = self.text;
        let n = t.len();
        // Positions are stepped a character at a time (the tag is read, not the rest of the text).
        let ch = |i: usize| t[i..].chars().next();
        let ws = |c: Option<char>| c.is_some_and(crate::text::is_python_whitespace);
        let start = q;
        // `[\s/]*`, then attributes: each starts after a quote, a blank or `/` (the character
        // before it, so that where the loop goes on depends only on where it is).
        while q < n && (ws(ch(q)) || ch(q) == Some('/')) {
            q += ch(q).map_or(1, char::len_utf8);
        }
        self.steps += q - start;
        q = self.attributes(q);
        let before = q;
        while q < n && ws(ch(q)) {
            q += ch(q).map_or(1, char::len_utf8);
        }
        self.steps += q - before;
        let len = q - start;
        match ch(q) {
            Some('>') => Some(Markup::Tag { len: len + 1, space: true }),
            Some('/') if ch(q + 1) == Some('>') => Some(Markup::Tag { len: len + 2, space: true }),
            None | Some('/' | '=') => None,
            Some(c) if c.is_ascii_alphabetic() => None,
            // Anything else there: the parser hands `<` and the match on as text, undecoded.
            Some(_) => Some(Markup::Text { len, decoded: false }),
        }
    }

    /// Where a start tag's attribute loop, at its top at byte `q`, ends.
    fn attributes(&mut self, mut q: usize) -> usize {
        let t = self.text;
        let n = t.len();
        let ch = |i: usize| t[i..].chars().next();
        let ws = |c: Option<char>| c.is_some_and(crate::text::is_python_whitespace);
        let next = |i: usize| i + ch(i).map_or(0, char::len_utf8);
        let gap = |c: Option<char>| matches!(c, Some('\'' | '"' | '/')) || ws(c);
        let mut tops = Vec::new();
        let end = loop {
            if self.memo() {
                if let Some(&end) = self.attributes_end.get(&q) {
                    break end;
                }
            }
            let prev = t[..q].chars().next_back();
            if !(q < n && gap(prev) && !(ws(ch(q)) || matches!(ch(q), Some('/' | '>')))) {
                break q;
            }
            if self.memo() {
                tops.push(q);
            }
            let top = q;
            q = next(q);
            while q < n && !(ws(ch(q)) || matches!(ch(q), Some('/' | '=' | '>'))) {
                q = next(q);
            }
            if let Some(end) = attribute_value(t, q) {
                q = end;
            }
            while q < n && (ws(ch(q)) || (ch(q) == Some('/') && ch(q + 1) != Some('>'))) {
                q = next(q);
            }
            self.steps += q - top;
        };
        for top in tops {
            self.attributes_end.insert(top, end);
        }
        end
    }
}

impl Markup {
    /// This outcome, its length counted from byte `from`, counted from byte `to` instead.
    fn shifted(self, from: usize, to: usize) -> Markup {
        match self {
            Markup::Tag { len, space } => Markup::Tag { len: len + from - to, space },
            Markup::Text { len, decoded } => Markup::Text { len: len + from - to, decoded },
        }
    }
}

/// Bytes of the blanks (Python's `\s`) `s` starts with.
fn leading_blanks(s: &str) -> usize {
    s.len() - s.trim_start_matches(crate::text::is_python_whitespace).len()
}

/// Where `\s*=+\s*(?:'[^']*'|"[^"]*"|(?!['"])[^>\s]*)\s*` matched at byte `q` of `t` ends,
/// with the backtracking of Python's `re`: a quote that does not close gives back the blanks
/// before it (an empty bare value), then the `=`s one by one (a bare value that starts with `=`).
fn attribute_value(t: &str, q: usize) -> Option<usize> {
    let blanks_from = |i: usize| i + leading_blanks(&t[i..]);
    let a = blanks_from(q);
    if !t[a..].starts_with('=') {
        return None;
    }
    let b = a + t[a..].len() - t[a..].trim_start_matches('=').len();
    let c = blanks_from(b);
    let value = |p: usize| -> Option<usize> {
        match t[p..].chars().next() {
            Some(quote @ ('\'' | '"')) => t[p + 1..].find(quote).map(|k| p + 1 + k + 1),
            _ => {
                Some(p + t[p..].find(|x: char| x == '>' || crate::text::is_python_whitespace(x)).unwrap_or(t.len() - p))
            }
        }
    };
    // The blanks after the `=`s given back one by one, then the `=`s (one byte each).
    let blanks: Vec<usize> = t[b..c].char_indices().map(|(i, _)| b + i).chain([c]).collect();
    let end = blanks.into_iter().rev().chain((a + 1..b).rev()).find_map(value)?;
    Some(blanks_from(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn photo_ids_are_digits_of_at_most_64_bits_in_the_data_and_the_subset_alike() {
        assert_eq!(photo_id(" 007 "), Ok(7));
        assert_eq!(photo_id("\u{1c}7\u{1f}\u{a0}"), Ok(7), "blanks as Python's str.split() has them");
        assert_eq!(photo_id("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(photo_id("18446744073709551616"), Err("is too large (over 18446744073709551615)"));
        for bad in ["", " ", "+7", "-7", "7a", "0x7", "7.0"] {
            assert_eq!(photo_id(bad), Err("is not a number"), "{bad:?}");
        }
        // A subset list reads its ids the same way: `+7` is no photo id there either.
        let dir = tempfile::tempdir().unwrap();
        let list = dir.path().join("subset.tsv");
        std::fs::write(&list, "0\t7\tabc\n1\t+8\tabc\n").unwrap();
        let Err(LoadError::Format(e)) = load_subset(std::slice::from_ref(&list), None) else { panic!("`+8` read") };
        assert!(e.ends_with("line 2: no photo id in the second field (`+8` is not a number)"), "{e}");
        std::fs::write(&list, "0\t7\tabc\n1\t99999999999999999999\tabc\n2\n").unwrap();
        let Err(LoadError::Format(e)) = load_subset(std::slice::from_ref(&list), None) else { panic!("read") };
        assert!(e.ends_with("line 2: no photo id in the second field (`99999999999999999999` is too large (over 18446744073709551615))"), "{e}");
        std::fs::write(&list, "0\t7\tabc\n2\n").unwrap();
        let Err(LoadError::Format(e)) = load_subset(std::slice::from_ref(&list), None) else { panic!("read") };
        assert!(e.ends_with("line 2: no photo id in the second field"), "{e}");
    }

    #[test]
    fn url_decoding_follows_unquote_plus() {
        // Python: urllib.parse.unquote_plus('caf%C3%A9+on%2Bthe+%ZZcorner%')
        //   == 'café on+the %ZZcorner%'
        assert_eq!(String::from_utf8(url_decode(b"caf%C3%A9+on%2Bthe+%ZZcorner%")).unwrap(), "café on+the %ZZcorner%");
        assert!(String::from_utf8(url_decode(b"%FF")).is_err());
    }

    /// `text`'s tags stripped with the scans remembered from the start, as [`clean`] remembers
    /// them, and read afresh: the three texts (which must be equal) and the steps each took.
    fn strip_three_ways(text: &str) -> [(String, usize); 3] {
        [0, 2 * text.len() + 256, usize::MAX].map(|remember_after| {
            let mut scan = Scan::new(text, remember_after);
            (strip_tags(&mut scan), scan.steps)
        })
    }

    #[test]
    fn remembered_scans_strip_what_fresh_ones_strip() {
        // Random texts over the pieces markup is made of: every `<` is read with the scans of
        // earlier `<`s remembered and afresh, as Python's parser reads it.
        const PIECES: [&str; 24] = [
            "<", ">", "<a", "<b ", "</", "<!", "<!--", "--", "-->", "<?", "/", "/>", "=", "'", "\"", " ", "\n", "\0",
            "x", "é", "&amp;", "&#65", "a", "<a href=",
        ];
        let mut rng = crate::rng::RowRng::new(1, "strip_tags", "random");
        let mut tags = 0;
        for case in 0..4000 {
            let len = 1 + rng.below(if case % 10 == 0 { 400 } else { 40 }) as usize;
            let text: String = (0..len).map(|_| PIECES[rng.below(PIECES.len() as u64) as usize]).collect();
            let [(memo, _), (adaptive, _), (fresh, _)] = strip_three_ways(&text);
            assert_eq!(memo, fresh, "{text:?}");
            assert_eq!(adaptive, fresh, "{text:?}");
            tags += usize::from(fresh.len() < text.len());
        }
        assert!(tags > 1000, "too few texts lost markup ({tags}): the pieces should make tags");
    }

    #[test]
    fn texts_of_many_unclosed_tags_cost_linear_steps() {
        // Each of these left open reads on to the end of the text in Python's parser, one `<`
        // at a time: afresh, twice the text is about four times the steps; remembered, twice.
        let shapes: [fn(usize) -> String; 6] = [
            |n| "<a ".repeat(n),
            |n| "<a".repeat(n) + &" ".repeat(n),
            |n| "<a x=y ".repeat(n),
            |n| "<!-- ".repeat(n),
            |n| "</b <?x ".repeat(n),
            |n| "<a b='x <a c=\"y ".repeat(n),
        ];
        for shape in shapes {
            let (small, large) = (shape(400), shape(800));
            let (small_ways, large_ways) = (strip_three_ways(&small), strip_three_ways(&large));
            assert!(small_ways.iter().all(|(text, _)| *text == small_ways[2].0));
            assert!(large_ways[2].0.len() > small_ways[2].0.len(), "{:?}", &small[..20]);
            let growth: Vec<f64> = (0..3).map(|i| large_ways[i].1 as f64 / small_ways[i].1 as f64).collect();
            assert!(growth[0] < 2.5 && growth[1] < 2.5, "{:?}: steps grew {growth:?}", &small[..20]);
            assert!(growth[2] > 3.5, "{:?}: afresh, steps grew {:.2}× (not quadratic?)", &small[..20], growth[2]);
        }
    }

    #[test]
    fn cleaning_strips_tags_and_collapses_space() {
        assert_eq!(clean("<b>bold</b>\nand  <a href=\"x\">link</a> ", true), "bold and link");
        assert_eq!(clean("a <b>", false), "a <b>");
        // A `<` that opens no tag stays.
        assert_eq!(clean("I <3 NY", true), "I <3 NY");
        assert_eq!(clean("I <3 <b>NY</b> <not closed", true), "I <3 NY <not closed");
        assert_eq!(clean("a<<b>>c", true), "a< >c");
        // Comparisons are not tags (Python's html.parser keeps them as text too).
        assert_eq!(clean("Temperature < 5 and > 0 degrees", true), "Temperature < 5 and > 0 degrees");
        assert_eq!(clean("<<< Back to the album >>>", true), "<<< Back to the album >>>");
        assert_eq!(clean("x<? y> <!-- note --> <?php ?>z", true), "x z");
        // As Python's `html.parser`: `>` inside a quoted attribute value, comments that hold
        // `>`, the empty end tag.
        assert_eq!(clean("a <a href=\"x>y\">link</a> b", true), "a link b");
        assert_eq!(clean("a <img alt = '1 > 0'> b", true), "a b");
        assert_eq!(clean("a <a b=\"x\"c>d", true), "a d");
        assert_eq!(clean("<!-- a > b --> c", true), "c");
        // `</>` goes without a word; other `</` run to the first `>` (Python's end tags and
        // bogus comments); a NUL after a start tag's name makes it text.
        assert_eq!(clean("a</>b", true), "ab");
        assert_eq!(clean("a</ b>c</1>d</$ x>e", true), "a c d e");
        assert_eq!(clean("a</a title=\"1 > 0\">b", true), "a 0\">b");
        assert_eq!(clean("a<b\0>c <b \0>d", true), "a<b\0>c d");
        assert_eq!(clean("a </ b", true), "a </ b");
        // References end where a tag begins, even one that leaves no space.
        assert_eq!(clean("&#x4a</>b &amp</>c", true), "Jb &c");
        // A tag that opens but does not close is text through the next `>` (a tag on the way
        // included), else up to the next `<`, else the `<` alone; the start of a tag that a
        // NUL ends is text as it stands, references and all.
        assert_eq!(clean("<b title='&amp; <i>y</i>", true), "<b title='& <i>y");
        assert_eq!(clean("a <!-- &amp; <3 &amp;", true), "a <!-- & <3 &");
        assert_eq!(clean("a <b &amp;", true), "a <b &");
        assert_eq!(clean("<b&amp;\0&amp;> &amp;", true), "<b&amp;\0&> &");
        // Start tags as Python's regular expression reads them: a quote or `=` is part of a tag
        // name; blanks are Unicode ones around `=`; an unclosed quote after `= ` leaves an empty
        // value, and the quote starts the next attribute; comments end at `--`, blanks, `>`.
        assert_eq!(clean("a<b=\"x>y\">c", true), "a y\">c");
        assert_eq!(clean("a<b c=\u{a0}'>'>d e<x'\0B>f", true), "a d e f");
        assert_eq!(clean("a<b c= \"x>y", true), "a y");
        assert_eq!(clean("a<b c= 'x' = 'y>z'>w", true), "a z'>w");
        assert_eq!(clean("a<!-- x -- >b<!-- y --\n>c", true), "a b c");
        // Unclosed, they stay text.
        assert_eq!(clean("a <!-- unclosed > b", true), "a <!-- unclosed > b");
        assert_eq!(clean("a <b class=\"unclosed > c", true), "a <b class=\"unclosed > c");
        assert_eq!(clean("x <b title=x>y</b>", true), "x y");
        // A `<` inside a tag does not end it (Python and browsers read `<cat<b>` as one tag).
        assert_eq!(clean("a <cat<!-- note --> b", true), "a b");
    }

    #[test]
    fn cleaning_decodes_character_references() {
        // Python: html.unescape gives the same for each of these.
        assert_eq!(clean("rock &amp; roll &quot;live&quot; &#39;77 &#x41;&#X42;", true), "rock & roll \"live\" '77 AB");
        // After the tags are gone: an escaped tag is text.
        assert_eq!(clean("&lt;b&gt;bold&lt;/b&gt; <i>x</i>", true), "<b>bold</b> x");
        // `&nbsp;` is a space between words (Python's `str.split` splits at U+00A0).
        assert_eq!(clean("a&nbsp;b", true), "a b");
        // As `html.unescape`: legacy names and numbers without `;`, U+FFFD for 0, surrogates and
        // numbers past U+10FFFF, Windows-1252 for 0x80-0x9F, control characters dropped.
        assert_eq!(
            clean("AT&T &amp &#xD800; &#0; &#; &#12345678901; & &", true),
            "AT&T & \u{fffd} \u{fffd} &#; \u{fffd} & &"
        );
        assert_eq!(
            clean("&#65b &ampx &amp b &lt &apos x&#1;y &#128;&#x9d;&#13;z &#xFFFE;.", true),
            "Ab &x & b < &apos xy \u{20ac}\u{9d} z ."
        );
        // Other names stay (Python knows all of HTML5's: `&copy;` is its `©`).
        assert_eq!(clean("&copy; &eacute;", true), "&copy; &eacute;");
        assert_eq!(clean("&amp;amp; &&amp;", true), "&amp; &&");
        assert_eq!(clean("&#+5; &#x+5; &#-5; &#x;", true), "&#+5; &#x+5; &#-5; &#x;");
        // Non-ASCII text right after a reference.
        assert_eq!(clean("&amp;ééé &#233;&#xe9;", true), "&ééé éé");
        // Without `strip_html` the text is left as it is.
        assert_eq!(clean("a &amp; b", false), "a &amp; b");
    }
}
