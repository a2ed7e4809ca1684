//! The library's one error type. Kinds follow STYLE.md: config, schema, io, data, model.
//!
//! Configuration problems are collected as [`Diagnostic`]s — every problem in a pipeline file is
//! reported at once, each with its location (file, line, column, the offending line) or the
//! `--set` argument it came from, and a hint.

use std::fmt;
use std::path::PathBuf;

pub type Result<T, E = Error> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The pipeline file or its overrides are wrong; nothing was read or written.
    #[error("{}", render_all(.0))]
    Config(Vec<Diagnostic>),
    /// A table does not have the columns or types a stage needs.
    #[error("{message}{}", hint_suffix(.hint))]
    Schema { message: String, hint: Option<String> },
    /// A file could not be read or written.
    #[error("{context} `{}`: {source}", .path.display())]
    Io {
        context: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Input data is unusable as a whole (individual bad rows are rejects, not errors).
    #[error("{message}{}", hint_suffix(.hint))]
    Data { message: String, hint: Option<String> },
    /// A model checkpoint, config or tokenizer cannot be used.
    #[error("{message}{}", hint_suffix(.hint))]
    Model { message: String, hint: Option<String> },
    /// Arrow or Parquet failed.
    #[error("parquet/arrow: {0}")]
    Arrow(String),
}

impl Error {
    pub fn io(context: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { context, path: path.into(), source }
    }

    pub fn data(message: impl Into<String>) -> Self {
        Error::Data { message: message.into(), hint: None }
    }

    /// The message and the hint apart, for a configuration problem that comes from an error
    /// (a model that cannot be loaded): the hint goes below the problem's place, as others do.
    pub fn into_message_and_hint(self) -> (String, Option<String>) {
        match self {
            Error::Schema { message, hint } | Error::Data { message, hint } | Error::Model { message, hint } => {
                (message, hint)
            }
            other => (other.to_string(), None),
        }
    }
}

impl From<parquet::errors::ParquetError> for Error {
    fn from(e: parquet::errors::ParquetError) -> Self {
        Error::Arrow(e.to_string())
    }
}

impl From<arrow_schema::ArrowError> for Error {
    fn from(e: arrow_schema::ArrowError) -> Self {
        Error::Arrow(e.to_string())
    }
}

fn hint_suffix(hint: &Option<String>) -> String {
    hint.as_ref().map(|h| format!("\nhint: {h}")).unwrap_or_default()
}

/// Where a configuration value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Location {
    /// A position in a pipeline file (1-based line and column) with the text of that line.
    File { path: PathBuf, line: usize, column: usize, text: String },
    /// A `--set key=value` command-line override.
    Override { arg: String },
}

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub message: String,
    pub location: Option<Location>,
    pub hint: Option<String>,
}

impl Diagnostic {
    pub fn new(message: impl Into<String>) -> Self {
        Diagnostic { message: message.into(), location: None, hint: None }
    }

    pub fn at(mut self, location: Option<Location>) -> Self {
        self.location = location;
        self
    }

    pub fn hint(mut self, hint: impl Into<String>) -> Self {
        self.hint = Some(hint.into());
        self
    }

    pub fn maybe_hint(mut self, hint: Option<String>) -> Self {
        self.hint = hint;
        self
    }
}

/// Characters of a pipeline file's line shown with an error, at most.
const SNIPPET_CHARS: usize = 120;

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "error: {}", self.message)?;
        match &self.location {
            Some(Location::File { path, line, column, text }) => {
                let num = line.to_string();
                let pad = " ".repeat(num.len());
                writeln!(f, "{pad}--> {}:{line}:{column}", path.display())?;
                writeln!(f, "{pad} |")?;
                // A long line is shown around the column only (a one-line file of megabytes
                // would flood a log).
                let chars: Vec<char> = text.chars().collect();
                let at = column.saturating_sub(1).min(chars.len());
                let (from, to) = match chars.len() > SNIPPET_CHARS {
                    true => {
                        let from = at.saturating_sub(SNIPPET_CHARS / 2).min(chars.len() - SNIPPET_CHARS);
                        (from, from + SNIPPET_CHARS)
                    }
                    false => (0, chars.len()),
                };
                let (before, after) = (if from > 0 { "…" } else { "" }, if to < chars.len() { "…" } else { "" });
                let shown: String = chars[from..to].iter().collect();
                writeln!(f, "{num} | {before}{shown}{after}")?;
                let caret_pad: String = before
                    .chars()
                    .map(|_| ' ')
                    .chain(chars[from..at].iter().map(|&c| if c == '\t' { '\t' } else { ' ' }))
                    .collect();
                writeln!(f, "{pad} | {caret_pad}^")?;
            }
            Some(Location::Override { arg }) => writeln!(f, "  --> --set {arg}")?,
            None => {}
        }
        if let Some(h) = &self.hint {
            writeln!(f, "hint: {h}")?;
        }
        Ok(())
    }
}

fn render_all(diags: &[Diagnostic]) -> String {
    let mut s = String::new();
    for d in diags {
        s.push_str(&d.to_string());
        s.push('\n');
    }
    let n = diags.len();
    s.push_str(&format!("{n} configuration error{}; nothing was run", if n == 1 { "" } else { "s" }));
    s
}

/// "did you mean `x`?" for the closest candidate, if any is close enough.
pub fn did_you_mean<'a>(given: &str, candidates: impl IntoIterator<Item = &'a str>) -> Option<String> {
    // Close by edits (typos, transpositions: `bwo` -> `bow`) or by shared prefix
    // (`keep` -> `keep_words`); the fewest edits win, then the higher Jaro-Winkler score.
    let mut best: Option<(usize, f64, &str)> = None;
    for c in candidates {
        let edits = strsim::damerau_levenshtein(given, c);
        let jw = strsim::jaro_winkler(given, c);
        let close = edits <= (given.chars().count() / 3).max(1) || jw >= 0.85;
        if close && best.is_none_or(|(e, j, _)| edits < e || (edits == e && jw > j)) {
            best = Some((edits, jw, c));
        }
    }
    best.map(|(_, _, c)| format!("did you mean `{c}`?"))
}

/// The hint for a missing column `given`: "did you mean `x`?" for a near miss among `columns`,
/// else the columns there are.
pub fn column_hint(given: &str, columns: &[&str]) -> String {
    did_you_mean(given, columns.iter().copied()).unwrap_or_else(|| format!("columns here: {}", list(columns)))
}

/// `items` in backticks, comma-separated (names in a hint: `` `a`, `b` ``).
pub fn list(items: &[&str]) -> String {
    items.iter().map(|s| format!("`{s}`")).collect::<Vec<_>>().join(", ")
}

thread_local! {
    /// Set while [`catch_quietly`] runs `f` on this thread.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Runs `f`; a panic in it comes back as `Err(message)` without being printed. For calls into
/// libraries that panic on damaged input where they should fail (the parquet crate on some
/// corrupt pages): the caller turns the message into an error that names the file. Panics
/// elsewhere, on any thread, are printed as before.
pub fn catch_quietly<T>(f: impl FnOnce() -> T) -> std::result::Result<T, String> {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                previous(info)
            }
        }));
    });
    let was = QUIET.with(|q| q.replace(true));
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    QUIET.with(|q| q.set(was));
    result.map_err(|panic| {
        panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// Why a command-line count `s` did not parse: not a whole number, or one too large.
pub fn whole_number_problem(s: &str) -> String {
    let t = s.trim();
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        format!("`{s}` is too large a number")
    } else {
        format!("`{s}` is not a whole number")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A count flag that does not parse says whether it is no number or one too large.
    #[test]
    fn a_bad_count_is_named_for_what_is_wrong() {
        assert_eq!(whole_number_problem("99999999999999999999"), "`99999999999999999999` is too large a number");
        assert_eq!(whole_number_problem("2.5"), "`2.5` is not a whole number");
        assert_eq!(whole_number_problem(""), "`` is not a whole number");
    }

    #[test]
    fn suggests_close_names_only() {
        let keys = ["keep_words", "rm_top_freq", "shuffle"];
        assert_eq!(did_you_mean("keep", keys).as_deref(), Some("did you mean `keep_words`?"));
        assert_eq!(did_you_mean("shufle", keys).as_deref(), Some("did you mean `shuffle`?"));
        assert_eq!(did_you_mean("zzz", keys), None);
        assert_eq!(did_you_mean("bwo", ["bow", "seed"]).as_deref(), Some("did you mean `bow`?"));
        assert_eq!(column_hint("captoin", &["sample_id", "caption"]), "did you mean `caption`?");
        assert_eq!(column_hint("zzz", &["sample_id", "caption"]), "columns here: `sample_id`, `caption`");
    }
}
