//! Words: the one tokenisation every text-handling stage shares (Fistful §1.1 / spec §1.1).
//!
//! A caption is lower-cased (Unicode default case mapping) and split on runs of whitespace;
//! every non-empty piece is a *word*, punctuation included. A word is *alphabetical* when every
//! character is a letter in Python's `str.isalpha` sense (general category Lu, Ll, Lt, Lm, Lo),
//! which is not Rust's `char::is_alphabetic`. The NLTK English stopword list (179 entries) is
//! shipped in `stopwords_en.txt`. [`vocab`] holds base-vocabulary and document-frequency
//! statistics, [`pseudo_bow`] the word ranking of pseudo-BoW mining. The BoW stage (`stages::bow`)
//! and the mining stage (`stages::mine_pseudo_bow`) build on this.

pub mod pseudo_bow;
pub mod vocab;

use std::borrow::Cow;
use std::sync::OnceLock;

use rustc_hash::FxHashSet;
use unicode_general_category::{get_general_category, GeneralCategory};

/// Python's `str.split()` whitespace: Unicode `White_Space` plus U+001C..U+001F (the ASCII
/// file/group/record/unit separators), which Python treats as whitespace and Rust does not.
#[inline]
pub fn is_python_whitespace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The words `pre_caption` keeps in CUSA (its `max_words`, spec §1.2).
pub const PRE_CAPTION_WORDS: usize = 64;

/// CUSA's `pre_caption` (spec `cusa-and-pcmepp.md` §1.2), the text its teachers and student
/// see: lower-cased (as Python's `str.lower`); each of `, . ' ! ? " ( ) * # : ; ~ - /` made a
/// space; `<person>` made `person`; each run of two or more whitespace characters made one space
/// (a single tab or newline stays, as Python's `re.sub(r"\s{2,}", " ", ...)` leaves it); trailing
/// newlines, then spaces at either end, removed; at most the first `max_words` words of a split
/// on single spaces. `None` where nothing is left.
pub fn pre_caption(caption: &str, max_words: usize) -> Option<String> {
    let spaced: String =
        lowercase(caption).chars().map(|c| if ",.'!?\"()*#:;~-/".contains(c) { ' ' } else { c }).collect();
    let spaced = spaced.replace("<person>", "person");
    // `\s{2,}` → one space: a run of one whitespace character is kept as it is.
    let mut collapsed = String::with_capacity(spaced.len());
    let mut run: Vec<char> = Vec::new();
    let flush = |run: &mut Vec<char>, out: &mut String| {
        match run.len() {
            0 => {}
            1 => out.push(run[0]),
            _ => out.push(' '),
        }
        run.clear();
    };
    for c in spaced.chars() {
        if is_python_whitespace(c) {
            run.push(c);
        } else {
            flush(&mut run, &mut collapsed);
            collapsed.push(c);
        }
    }
    flush(&mut run, &mut collapsed);
    let trimmed = collapsed.trim_end_matches('\n').trim_matches(' ');
    let kept: Vec<&str> = trimmed.split(' ').take(max_words).collect();
    let out = kept.join(" ");
    (!out.is_empty()).then_some(out)
}

/// `text` with each run of whitespace ([`is_python_whitespace`]) made one space, and none at
/// either end: Python's `" ".join(text.split())`. Runs of other characters are copied whole.
pub fn collapse_whitespace(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut word: Option<usize> = None;
    let end_word = |out: &mut String, start: usize, end: usize| {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&text[start..end]);
    };
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let (space, len) = match bytes[i] {
            b if b.is_ascii() => (is_python_whitespace(b as char), 1),
            _ => {
                let c = text[i..].chars().next().expect("a char starts here");
                (is_python_whitespace(c), c.len_utf8())
            }
        };
        match (space, word) {
            (true, Some(start)) => {
                end_word(&mut out, start, i);
                word = None;
            }
            (false, None) => word = Some(i),
            _ => {}
        }
        i += len;
    }
    if let Some(start) = word {
        end_word(&mut out, start, text.len());
    }
    out
}

/// Lower-cases `caption`, borrowing when it has no upper-case character (CC3M is already lower
/// case, so the common path allocates nothing).
pub fn lowercase(caption: &str) -> Cow<'_, str> {
    let needs = if caption.is_ascii() {
        caption.bytes().any(|b| b.is_ascii_uppercase())
    } else {
        caption.chars().any(|c| c.is_uppercase() || c.to_lowercase().next() != Some(c))
    };
    if needs {
        Cow::Owned(caption.to_lowercase())
    } else {
        Cow::Borrowed(caption)
    }
}

/// `str.isalpha()`: non-empty and every character in a letter category (Lu, Ll, Lt, Lm, Lo).
#[inline]
pub fn is_alpha(word: &str) -> bool {
    if word.is_empty() {
        return false;
    }
    if word.is_ascii() {
        return word.bytes().all(|b| b.is_ascii_alphabetic());
    }
    word.chars().all(|c| {
        matches!(
            get_general_category(c),
            GeneralCategory::UppercaseLetter
                | GeneralCategory::LowercaseLetter
                | GeneralCategory::TitlecaseLetter
                | GeneralCategory::ModifierLetter
                | GeneralCategory::OtherLetter
        )
    })
}

/// The NLTK English stopword list, exactly as NLTK ships it (179 entries).
pub fn stopwords() -> &'static FxHashSet<&'static str> {
    static SET: OnceLock<FxHashSet<&'static str>> = OnceLock::new();
    SET.get_or_init(|| include_str!("stopwords_en.txt").split_whitespace().collect())
}

/// `RmStopNalpha`'s per-word predicate: alphabetical and not a stopword.
#[inline]
pub fn is_content_word(word: &str) -> bool {
    is_alpha(word) && !stopwords().contains(word)
}

/// How captions are cut into words.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tokenizer {
    /// Split leading and trailing ASCII punctuation off each piece as separate one-character
    /// words (`men.` -> `men` `.`). Off by default: CC3M is pre-tokenised and the paper's
    /// statistics were made without it (spec §7 A3).
    pub split_punct: bool,
}

impl Tokenizer {
    /// Appends the words of an already lower-cased caption to `out`.
    pub fn split_into<'a>(&self, lowered: &'a str, out: &mut Vec<&'a str>) {
        if lowered.is_ascii() && !self.split_punct {
            // Same rule on bytes: ASCII whitespace incl. \x0b and \x1c..\x1f (Python's set).
            let ws = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | 0x1c..=0x1f);
            out.extend(lowered.as_bytes().split(ws).filter(|p| !p.is_empty()).map(|p| {
                // SAFETY: `p` is a subslice of an ASCII `&str` split at ASCII bytes.
                unsafe { std::str::from_utf8_unchecked(p) }
            }));
            return;
        }
        for piece in lowered.split(is_python_whitespace).filter(|p| !p.is_empty()) {
            if self.split_punct {
                split_punct(piece, out);
            } else {
                out.push(piece);
            }
        }
    }

    /// The words of `caption` (lower-cased first), as owned strings. Convenience for tests and
    /// statistics; hot paths use [`Tokenizer::split_into`] with a reused buffer.
    pub fn words(&self, caption: &str) -> Vec<String> {
        let lowered = lowercase(caption);
        let mut out = Vec::new();
        self.split_into(&lowered, &mut out);
        out.into_iter().map(str::to_owned).collect()
    }
}

/// Bytes of zero padding [`ascii_word_spans`] leaves after the caption in its scratch buffer.
pub const SPAN_PADDING: usize = 64;

/// The fast path of lower-casing and [`Tokenizer::split_into`] (without `split_punct`) for the
/// common caption: ASCII with no control bytes, so the only whitespace is the space. Writes the
/// lower-cased caption into `scratch` followed by [`SPAN_PADDING`] zero bytes (so a 16-byte load
/// at any word start stays inside the buffer) and appends each word's byte range. Returns false,
/// leaving `spans` untouched, when the caption does not qualify; the words are then those of
/// the general path.
pub fn ascii_word_spans(caption: &str, scratch: &mut Vec<u8>, spans: &mut Vec<(u32, u32)>) -> bool {
    if caption.len() >= u32::MAX as usize {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    {
        ascii_word_spans_sse2(caption.as_bytes(), scratch, spans)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        ascii_word_spans_portable(caption.as_bytes(), scratch, spans)
    }
}

/// [`ascii_word_spans`] 16 bytes at a time: each piece of the caption is loaded once, and its
/// lower-cased copy, its control/non-ASCII bytes and its spaces all come from that load (the
/// portable version reads the spaces back from `scratch` right after writing it, and the CPU
/// stalls on loads of bytes it has just stored).
#[cfg(target_arch = "x86_64")]
fn ascii_word_spans_sse2(b: &[u8], scratch: &mut Vec<u8>, spans: &mut Vec<(u32, u32)>) -> bool {
    use std::arch::x86_64::*;
    let n = b.len();
    let before = spans.len();
    // 16 bytes more than needed: the last piece's store may end past the padding's start.
    scratch.clear();
    scratch.resize(n + SPAN_PADDING + 16, 0);
    let out = scratch.as_mut_ptr();
    let (mut carry, mut start, mut w) = (0u64, 0u32, 0usize);
    // Windows of 64 bytes; the scan covers position `n`, so every word closes inside it.
    while w <= n {
        let (mut ws, mut bad) = (0u64, 0u32);
        for q in 0..4 {
            let at = w + 16 * q;
            if at >= n {
                break;
            }
            let left = n - at;
            // The last piece, shorter than 16 bytes, is read as the 16 bytes that end the
            // caption (it re-reads bytes already seen, with the same results); only a caption
            // shorter than 16 bytes goes through a zero-padded copy.
            let (from, shift) = if left >= 16 || n < 16 { (at, 0) } else { (n - 16, 16 - left) };
            // SAFETY: SSE2 is part of x86_64. The load reads 16 bytes of `b` at `from` (or of
            // `short`, a copy of a caption under 16 bytes); the store writes 16 bytes at
            // `from < n` of `scratch`, which holds `n + SPAN_PADDING + 16` bytes.
            let (space, low_or_high) = unsafe {
                let v = if n >= 16 {
                    _mm_loadu_si128(b.as_ptr().add(from).cast())
                } else {
                    let mut short = [0u8; 16];
                    short[..n].copy_from_slice(b);
                    _mm_loadu_si128(short.as_ptr().cast())
                };
                let upper = _mm_and_si128(
                    _mm_cmpgt_epi8(v, _mm_set1_epi8(b'A' as i8 - 1)),
                    _mm_cmplt_epi8(v, _mm_set1_epi8(b'Z' as i8 + 1)),
                );
                _mm_storeu_si128(out.add(from).cast(), _mm_or_si128(v, _mm_and_si128(upper, _mm_set1_epi8(0x20))));
                // Signed: bytes >= 0x80 are negative, so this also flags non-ASCII.
                let low_or_high = _mm_movemask_epi8(_mm_cmplt_epi8(v, _mm_set1_epi8(0x20))) as u32;
                (_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8))) as u32, low_or_high)
            };
            // Only a short caption's copy holds bytes past the end (zeros, which would count).
            let valid = if n < 16 { (1u32 << n) - 1 } else { 0xffff };
            bad |= low_or_high & valid;
            // Bit `i` of `space` is byte `from + i`; bytes before the window drop out.
            ws |= (u64::from(space) << (16 * q)) >> shift;
        }
        if bad != 0 {
            spans.truncate(before);
            return false;
        }
        if n - w < 64 {
            ws |= !0u64 << (n - w);
        }
        push_spans(ws, w as u32, &mut carry, &mut start, spans);
        w += 64;
    }
    scratch.truncate(n + SPAN_PADDING);
    true
}

/// The word starts and ends of one 64-byte window of [`ascii_word_spans`] (`ws`: bit `i` set
/// when byte `w + i` is whitespace), given whether the byte before the window was in a word.
#[inline]
fn push_spans(ws: u64, w: u32, carry: &mut u64, start: &mut u32, spans: &mut Vec<(u32, u32)>) {
    let word = !ws;
    let prev = (word << 1) | *carry;
    let mut starts = word & !prev;
    let mut ends = ws & prev;
    // Starts and ends alternate; take whichever comes first.
    while starts | ends != 0 {
        let (s, e) = (starts.trailing_zeros(), ends.trailing_zeros());
        if s < e {
            *start = w + s;
            starts &= starts - 1;
        } else {
            spans.push((*start, w + e));
            ends &= ends - 1;
        }
    }
    *carry = word >> 63;
}

/// [`ascii_word_spans`] a byte at a time (other targets, and the reference in tests).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn ascii_word_spans_portable(b: &[u8], scratch: &mut Vec<u8>, spans: &mut Vec<(u32, u32)>) -> bool {
    scratch.clear();
    let mut bad = 0u8;
    scratch.extend(b.iter().map(|&c| {
        bad |= u8::from(c >= 0x80) | u8::from(c < 0x20);
        c | (u8::from(c.wrapping_sub(b'A') < 26) << 5)
    }));
    if bad != 0 {
        return false;
    }
    scratch.resize(b.len() + SPAN_PADDING, 0);
    // Positions from the end on count as whitespace, and the scan covers position `n`, so
    // every word closes inside it.
    let n = b.len();
    let (mut carry, mut start) = (0u64, 0u32);
    for w in (0..=n).step_by(64) {
        let mut ws = scratch[w..w + 64].iter().enumerate().fold(0u64, |m, (i, &c)| m | (u64::from(c == b' ') << i));
        if n - w < 64 {
            ws |= !0u64 << (n - w);
        }
        push_spans(ws, w as u32, &mut carry, &mut start, spans);
    }
    true
}

fn split_punct<'a>(piece: &'a str, out: &mut Vec<&'a str>) {
    let bytes = piece.as_bytes();
    if bytes.iter().all(u8::is_ascii_punctuation) {
        out.push(piece);
        return;
    }
    let start = bytes.iter().take_while(|b| b.is_ascii_punctuation()).count();
    let end = bytes.len() - bytes.iter().rev().take_while(|b| b.is_ascii_punctuation()).count();
    // ASCII punctuation bytes are one-byte chars, so these slice bounds are char boundaries.
    for i in 0..start {
        out.push(&piece[i..i + 1]);
    }
    out.push(&piece[start..end]);
    for i in end..bytes.len() {
        out.push(&piece[i..i + 1]);
    }
}

/// Optional Snowball stemming used to *match* words against the base vocabulary and the
/// top-frequency list; output captions always keep the surface words.
pub struct Stemmer(rust_stemmers::Stemmer);

impl Stemmer {
    pub fn english() -> Self {
        Stemmer(rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English))
    }

    pub fn stem<'a>(&self, word: &'a str) -> Cow<'a, str> {
        self.0.stem(word)
    }
}

impl std::fmt::Debug for Stemmer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stemmer(english)")
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn pre_caption_is_cusas() {
        // Expected values printed by Python 3.11 running CUSA's `pre_caption` (spec §1.2).
        let cases: [(&str, Option<&str>); 7] = [
            ("A Dog, running!", Some("a dog running")),
            ("  <PERSON> rides a bike/scooter -- fast.\n\n", Some("person rides a bike scooter fast")),
            ("tab\there  and\t\tthere", Some("tab\there and there")),
            ("Ünïcode İstanbul.", Some("ünïcode i\u{307}stanbul")),
            ("x\u{1c}\u{1d}y", Some("x y")),
            ("...", None),
            ("one\ntwo\n", Some("one\ntwo")),
        ];
        for (caption, want) in cases {
            assert_eq!(super::pre_caption(caption, 64).as_deref(), want, "{caption:?}");
        }
        let long: Vec<String> = (0..70).map(|i| format!("w{i}")).collect();
        let got = super::pre_caption(&long.join(" "), 64).unwrap();
        assert_eq!(got, long[..64].join(" "));
    }
    use super::*;

    #[test]
    fn collapsed_whitespace_is_pythons_split_and_join() {
        let reference = |t: &str| t.split(is_python_whitespace).filter(|p| !p.is_empty()).collect::<Vec<_>>().join(" ");
        for t in [
            "",
            " ",
            "a",
            "  a  b\t\tc\n",
            "caf\u{e9}\u{a0}au\u{2003}lait\u{3000}",
            "x\u{1c}y\u{1f}z\u{85}w",
            "\u{200b}zero width is no space\u{200b}",
            "\r\n\u{b}\u{c}end",
            "\u{1f600} \u{1f600}",
        ] {
            assert_eq!(collapse_whitespace(t), reference(t), "{t:?}");
        }
    }

    #[test]
    fn splits_like_python_str_split() {
        // Python: "a  b\tc\x1cd\u3000e ".split() == ['a', 'b', 'c', 'd', 'e']
        let t = Tokenizer::default();
        assert_eq!(t.words("a  b\tc\u{1c}d\u{3000}e "), ["a", "b", "c", "d", "e"]);
        assert_eq!(t.words("   "), Vec::<String>::new());
        assert_eq!(t.words("on white background .").len(), 4);
    }

    #[test]
    fn ascii_spans_match_the_general_path() {
        let t = Tokenizer::default();
        let long = format!("{} tail", "word ".repeat(40));
        let cases = [
            "a dog",
            "  Leading and trailing  ",
            "",
            "   ",
            "x",
            "on white background .",
            "MiXeD CaSe 3D",
            long.as_str(),
            "exactly-sixty-four-bytes-long-caption-with-no-space-at-all-xxxxxx",
        ];
        for c in cases {
            let (mut scratch, mut spans) = (Vec::new(), Vec::new());
            assert!(ascii_word_spans(c, &mut scratch, &mut spans), "{c:?}");
            assert!(scratch[c.len()..].iter().all(|&b| b == 0) && scratch.len() == c.len() + SPAN_PADDING);
            let got: Vec<String> = spans
                .iter()
                .map(|&(s, e)| String::from_utf8(scratch[s as usize..e as usize].to_vec()).unwrap())
                .collect();
            assert_eq!(got, t.words(c), "{c:?}");
        }
        // Every length around the 64-byte windows, words ending exactly at a window edge.
        for n in 1..200 {
            let c: String = (0..n).map(|i| if i % 7 == 6 || i % 64 == 63 { ' ' } else { 'a' }).collect();
            let (mut scratch, mut spans) = (Vec::new(), Vec::new());
            assert!(ascii_word_spans(&c, &mut scratch, &mut spans));
            let got: Vec<&[u8]> = spans.iter().map(|&(s, e)| &scratch[s as usize..e as usize]).collect();
            let want: Vec<&[u8]> = c.as_bytes().split(|&b| b == b' ').filter(|p| !p.is_empty()).collect();
            assert_eq!(got, want, "{n}");
        }
        // Tabs, other control bytes and non-ASCII text take the general path.
        for c in ["a\tb", "a\u{1c}b", "café", "a\u{0}b"] {
            assert!(!ascii_word_spans(c, &mut Vec::new(), &mut Vec::new()), "{c:?}");
        }
    }

    proptest::proptest! {
        /// The 16-byte path equals the byte-at-a-time one on any text: lengths around the
        /// 16- and 64-byte pieces, upper case, runs of spaces, and bytes that disqualify
        /// (tabs, other control bytes, non-ASCII) anywhere, including in the last piece.
        #[test]
        fn ascii_spans_fast_path_equals_the_portable_one(
            chars in proptest::collection::vec(proptest::sample::select(
                vec!['a', 'b', 'Z', 'Q', ' ', ' ', ' ', '.', '3', '@', '[', '`', '{', '\t', '\u{1f}', '\u{7f}', 'é']
            ), 0..300),
            clean in proptest::bool::weighted(0.7),
        ) {
            let text: String = if clean {
                chars.iter().map(|&c| if c.is_ascii() && !c.is_ascii_control() { c } else { ' ' }).collect()
            } else {
                chars.iter().collect()
            };
            let (mut s1, mut s2) = (vec![7u8; 3], vec![9u8; 500]);
            let (mut p1, mut p2) = (vec![(1, 2)], vec![(1, 2)]);
            let ok = ascii_word_spans(&text, &mut s1, &mut p1);
            proptest::prop_assert_eq!(ok, ascii_word_spans_portable(text.as_bytes(), &mut s2, &mut p2));
            proptest::prop_assert_eq!(&p1, &p2);
            if ok {
                proptest::prop_assert_eq!(&s1, &s2);
            } else {
                proptest::prop_assert_eq!(&p1, &vec![(1, 2)]);
            }
            if clean {
                proptest::prop_assert!(ok);
            }
        }
    }

    #[test]
    fn lowercases_unicode() {
        assert_eq!(lowercase("ÉCOLE Straße"), "école straße");
        assert!(matches!(lowercase("already lower"), Cow::Borrowed(_)));
    }

    #[test]
    fn isalpha_matches_python() {
        // Python isalpha() on each: True for letters of any script, False for digits,
        // punctuation, apostrophes, letter-numbers (Nl, e.g. 'Ⅻ') and combining marks.
        for w in ["dog", "café", "東京", "ǅ", "ʰ"] {
            assert!(is_alpha(w), "{w}");
        }
        for w in ["", ".", "'s", "n't", "3d", "18th", "e-mail", "don't", "Ⅻ", "e\u{301}"] {
            assert!(!is_alpha(w), "{w}");
        }
    }

    #[test]
    fn stopword_list_is_nltk_english() {
        let s = stopwords();
        assert_eq!(s.len(), 179);
        assert_eq!(s.iter().filter(|w| is_alpha(w)).count(), 153);
        assert!(s.contains("the") && s.contains("wouldn't") && !s.contains("dog"));
    }

    #[test]
    fn split_punct_peels_ascii_punctuation() {
        let t = Tokenizer { split_punct: true };
        assert_eq!(t.words("Men. (hi), ... e-mail"), ["men", ".", "(", "hi", ")", ",", "...", "e-mail"]);
    }

    #[test]
    fn english_stemmer() {
        let s = Stemmer::english();
        assert_eq!(s.stem("running"), "run");
        assert_eq!(s.stem("dogs"), "dog");
    }
}
