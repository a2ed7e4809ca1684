//! The pipeline file as a document: its TOML values, where each value came from (file span or
//! `--set` override), and typed extraction that reports every problem at once.
//!
//! Paths name values inside the document: `seed`, `stage[1]`, `stage[1].keep_words`,
//! `stage[0].columns.caption`. `--set` addresses a stage by its `name` (default: its `type`),
//! so `--set bow.rm_top_freq=500` works without knowing the stage's position; messages name a
//! stage's keys that way too (`bow.keep_words`).

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use toml::de::{DeTable, DeValue};
use toml::{Spanned, Table, Value};

use crate::error::{did_you_mean, Diagnostic, Location};

#[derive(Debug, Clone)]
enum Origin {
    Span { key: Range<usize>, value: Range<usize> },
    Override(String),
}

/// The most errors found in one stage's (or the file's top-level) keys: one per key at most.
const MAX_ERRORS_PER_STAGE: usize = 64;

/// A parsed pipeline file with the origin of every value.
#[derive(Debug, Clone)]
pub struct ConfigDoc {
    pub path: PathBuf,
    source: String,
    pub root: Table,
    origins: HashMap<String, Origin>,
    /// Problems found while reading: numbers out of range, then `--set` arguments; reported
    /// together with the file's other problems.
    pub override_errors: Vec<Diagnostic>,
    /// Keys dropped while reading (a number out of range, reported): as a wrong-typed key, one
    /// is not reported missing, nor are the problems of its default.
    dropped: Vec<String>,
}

/// The largest pipeline or training file read: far beyond any real one.
const MAX_FILE_BYTES: u64 = 16 << 20;

impl ConfigDoc {
    /// Reads and parses `path`, then applies `overrides` (`key.path=value`). Bad overrides are
    /// kept in `override_errors`, so they are reported with the rest of the file's problems.
    pub fn load(path: &Path, overrides: &[String]) -> Result<ConfigDoc, Vec<Diagnostic>> {
        let source = read_source(path)?;
        if is_json_path(path) {
            let root = json_as_table(path, &source)?;
            let (origins, twice) = json_walk(&source);
            if !twice.is_empty() {
                return Err(twice
                    .into_iter()
                    .map(|(key, at)| {
                        Diagnostic::new(format!(
                            "invalid JSON: duplicate key `{key}` (each key is set once per object)"
                        ))
                        .at(Some(location_in(path, &source, at)))
                        .hint("keep one of them: JSON readers disagree on which one counts")
                    })
                    .collect());
            }
            return Ok(Self::assemble(path, source, root, origins, overrides));
        }
        Self::parse(path, source, overrides)
    }

    /// For a TOML file with syntax errors: the document its other lines make (each broken line
    /// blanked as [`syntax_errors`] blanks it, so places keep their lines) and the lines blanked;
    /// `None` for a file without syntax errors, or when what is left does not parse either. Its
    /// problems that [`survives_recovery`] keeps are reported beside the syntax errors.
    pub fn load_recovered(path: &Path, overrides: &[String]) -> Option<(ConfigDoc, Vec<usize>)> {
        let source = read_source(path).ok()?;
        if is_json_path(path) {
            return None;
        }
        let first = DeTable::parse(&source).err()?;
        let (_, recovered) = syntax_recovery(path, &source, first);
        let Recovered { text, lines } = recovered?;
        Some((Self::parse(path, text, overrides).ok()?, lines))
    }
}

/// The text of the file at `path`, checked to be a pipeline-sized UTF-8 file.
fn read_source(path: &Path) -> Result<String, Vec<Diagnostic>> {
    {
        use std::io::Read;
        let cannot = |e: std::io::Error| {
            vec![Diagnostic::new(format!("cannot read pipeline file `{}`: {e}", path.display()))
                .hint("check the path; pipelines live in `pipelines/`")]
        };
        // At most MAX_FILE_BYTES: `/dev/zero` or a data file named by mistake would fill memory.
        let read = || {
            let mut bytes = Vec::new();
            std::fs::File::open(path).and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes)).map(|_| bytes)
        };
        // A file is read more than once as it is checked (what kind of file, then the whole);
        // a stream (`/dev/stdin`, `<(…)`, a FIFO) gives its text only once, so it is kept.
        let bytes = if std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
            read().map_err(cannot)?
        } else {
            static STREAMS: std::sync::Mutex<Option<HashMap<PathBuf, Vec<u8>>>> = std::sync::Mutex::new(None);
            let mut streams = STREAMS.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            match streams.get_or_insert_default().entry(path.to_path_buf()) {
                std::collections::hash_map::Entry::Occupied(kept) => kept.get().clone(),
                std::collections::hash_map::Entry::Vacant(slot) => slot.insert(read().map_err(cannot)?).clone(),
            }
        };
        if bytes.len() as u64 > MAX_FILE_BYTES {
            return Err(vec![Diagnostic::new(format!(
                "`{}` is over {} MiB: not a pipeline or training file",
                path.display(),
                MAX_FILE_BYTES >> 20
            ))
            .hint("name the pipeline file (`pipelines/bow.toml`), not a data file")]);
        }
        let source = String::from_utf8(bytes).map_err(|e| {
            // Placed at the first byte that is not UTF-8 (the text before it is).
            let at = e.utf8_error().valid_up_to();
            let byte = e.as_bytes()[at];
            let lossy = String::from_utf8_lossy(e.as_bytes());
            vec![Diagnostic::new(format!(
                "`{}` is not UTF-8 text: byte 0x{byte:02X} cannot be read as a character",
                path.display()
            ))
            .at(Some(location_in(path, &lossy, at)))
            .hint("save the file as UTF-8 (pipeline and training files are TOML or JSON, both UTF-8)")]
        })?;
        Ok(source)
    }
}

impl ConfigDoc {
    pub fn parse(path: &Path, source: String, overrides: &[String]) -> Result<ConfigDoc, Vec<Diagnostic>> {
        let parsed = match DeTable::parse(&source) {
            Ok(t) => t,
            Err(e) => return Err(syntax_errors(path, &source, e)),
        };
        let mut origins = HashMap::new();
        record_spans(&mut origins, "", parsed.get_ref());
        // DeTable keeps numbers as text; converting them can still fail (an integer past i64, a
        // float past f64). Each such number is reported, then blanked out (`0` and spaces, so
        // later places keep their offsets) and its key dropped, and the rest is read on: one
        // run reports every number, and the file's other problems with them.
        let out_of_range = |e: &toml::de::Error| {
            let loc = e.span().map(|s| location_in(path, &source, s.start));
            let what = match e.span().and_then(|s| source.get(s)) {
                Some(text) => format!("number `{text}` is out of range"),
                None => e.message().lines().next().unwrap_or("invalid TOML").to_owned(),
            };
            Diagnostic::new(format!("invalid TOML: {what}")).at(loc).hint(NUMBER_RANGE)
        };
        let mut text = source.clone();
        let mut numbers: Vec<(Range<usize>, Diagnostic)> = Vec::new();
        let mut root: Table = loop {
            match toml::from_str(&text) {
                Ok(t) => break t,
                Err(e) => {
                    let span = e
                        .span()
                        .filter(|s| !s.is_empty() && text.is_char_boundary(s.start) && text.is_char_boundary(s.end));
                    let Some(span) =
                        span.filter(|s| !numbers.iter().any(|(n, _)| n == s) && numbers.len() < MAX_ERRORS_PER_STAGE)
                    else {
                        let mut diags: Vec<Diagnostic> = numbers.into_iter().map(|(_, d)| d).collect();
                        diags.push(out_of_range(&e));
                        return Err(diags);
                    };
                    numbers.push((span.clone(), out_of_range(&e)));
                    text.replace_range(span.clone(), &format!("0{}", " ".repeat(span.len() - 1)));
                }
            }
        };
        // Unquoted dates and times are values of a TOML type of their own, which no key takes:
        // read as strings they would be rewritten (`1979-05-27 07:32:00` -> `...T07:32:00`), and
        // a number key would call them strings. Each is reported and dropped, as a number is.
        let mut dates = Vec::new();
        datetimes(&Value::Table(root.clone()), "", &mut dates);
        for key in dates {
            let Some(Origin::Span { value: span, .. }) = origins.get(&key) else { continue };
            let written = source.get(span.clone()).unwrap_or("");
            let name = key.rsplit('.').next().unwrap_or(&key);
            let d = Diagnostic::new(format!(
                "wrong type: `{key}` is an unquoted TOML date-time ({written}); no key takes one"
            ))
            .at(Some(location_in(path, &source, span.start)))
            .hint(format!("quote it to mean the text: `{name} = \"{written}\"`"));
            numbers.push((span.clone(), d));
        }
        // Each blanked number's key (or array element) is dropped, the last in the file first:
        // an array's later elements go before its earlier ones shift them.
        numbers.sort_by_key(|(span, _)| std::cmp::Reverse(span.start));
        let gone: Vec<String> = numbers
            .iter()
            .filter_map(|(span, _)| {
                origins
                    .iter()
                    .find_map(|(k, o)| matches!(o, Origin::Span { value, .. } if value == span).then(|| k.clone()))
            })
            .collect();
        let mut value = Value::Table(std::mem::take(&mut root));
        for key in &gone {
            remove_path(&mut value, key);
        }
        let Value::Table(root) = value else { unreachable!("a table stays a table") };
        let mut doc = Self::assemble(path, source, root, origins, overrides);
        doc.override_errors.splice(0..0, numbers.into_iter().rev().map(|(_, d)| d));
        doc.dropped = gone;
        Ok(doc)
    }

    /// The document from its values and their places in `source`, with `overrides` applied.
    fn assemble(
        path: &Path,
        source: String,
        root: Table,
        origins: HashMap<String, Origin>,
        overrides: &[String],
    ) -> ConfigDoc {
        let mut doc = ConfigDoc {
            path: path.to_owned(),
            source,
            root,
            origins,
            override_errors: Vec::new(),
            dropped: Vec::new(),
        };
        for arg in overrides {
            if let Err(d) = doc.apply_override(arg) {
                doc.override_errors.push(d);
            }
        }
        doc
    }

    /// Whether the file is JSON (above all a run's `config.json`).
    pub fn is_json(&self) -> bool {
        is_json_path(&self.path)
    }

    /// `diags` with their hints in the file's own syntax: a JSON file's problems say
    /// `"keep_words": 4` where a TOML file's say `keep_words = 4`. Problems of `--set` arguments
    /// keep TOML, the syntax of `--set` values.
    pub fn in_file_syntax(&self, mut diags: Vec<Diagnostic>) -> Vec<Diagnostic> {
        if self.is_json() {
            for d in diags.iter_mut().filter(|d| !matches!(d.location, Some(Location::Override { .. }))) {
                d.message = json_type_names(&d.message);
                d.hint = d.hint.as_deref().map(json_flavoured);
            }
        }
        diags
    }

    fn file_location(&self, offset: usize) -> Location {
        location_in(&self.path, &self.source, offset)
    }

    /// Location of the value at `path`, or of its closest enclosing value.
    pub fn location(&self, path: &str) -> Option<Location> {
        self.origin_of(path, false)
    }

    /// Location of the key at `path` (for "unknown key" errors).
    pub fn key_location(&self, path: &str) -> Option<Location> {
        self.origin_of(path, true)
    }

    fn origin_of(&self, path: &str, key: bool) -> Option<Location> {
        let mut p = path;
        loop {
            if let Some(o) = self.origins.get(p) {
                return Some(match o {
                    Origin::Span { key: k, value: v } => self.file_location(if key { k.start } else { v.start }),
                    Origin::Override(arg) => Location::Override { arg: arg.clone() },
                });
            }
            match p.rfind(['.', '[']) {
                Some(i) => p = &p[..i],
                // Nothing of the path is in the file (a missing top-level key): the file itself.
                None => return Some(self.file_location(0)),
            }
        }
    }

    /// The stage tables, in file order.
    pub fn stages(&self) -> Vec<&Table> {
        self.indexed_stages().into_iter().map(|(_, t)| t).collect()
    }

    /// The stage tables with their positions in the file's `stage` array (`stage[i]`), which
    /// may hold other values too (reported as wrong types).
    pub fn indexed_stages(&self) -> Vec<(usize, &Table)> {
        match self.root.get("stage") {
            Some(Value::Array(a)) => a.iter().enumerate().filter_map(|(i, t)| t.as_table().map(|t| (i, t))).collect(),
            _ => Vec::new(),
        }
    }

    /// `name` of a stage: its `name` key or else its `type`.
    pub fn stage_name(stage: &Table) -> Option<&str> {
        stage.get("name").or_else(|| stage.get("type")).and_then(Value::as_str)
    }

    fn apply_override(&mut self, arg: &str) -> Result<(), Diagnostic> {
        // `--set 'bow={rm_top_freq = 500, keep_words = 3}'`: a stage (by name or `stage[i]`)
        // given a table takes each of its keys, as one `--set` each would set them.
        if let Some((stage, table)) = self.stage_table_override(arg) {
            for (key, value) in table {
                self.apply_override_as(&format!("{stage}.{key}={value}"), arg)?;
            }
            return Ok(());
        }
        self.apply_override_as(arg, arg)
    }

    /// The stage and table of an override that gives a whole stage a table (a name that is no
    /// top-level key, in a file with stages), if `arg` is one.
    fn stage_table_override(&self, arg: &str) -> Option<(String, Table)> {
        let (key, raw) = arg.split_once('=')?;
        let key = key.trim();
        if key.contains('.') || self.root.contains_key(key) || !self.root.contains_key("stage") {
            return None;
        }
        let Value::Table(table) = parse_override_value(raw.trim()) else { return None };
        if let Some(i) = key.strip_prefix("stage[").and_then(|p| p.strip_suffix(']')) {
            // An empty table sets nothing, but a stage that is not there is still an error.
            let there = i.parse::<usize>().is_ok_and(|i| self.indexed_stages().iter().any(|(j, _)| *j == i));
            return (there || !table.is_empty()).then(|| (key.to_owned(), table));
        }
        // By position from here: a `name` among the keys renames the stage for the keys after it.
        let (i, _) = self.indexed_stages().into_iter().find(|(_, t)| Self::stage_name(t) == Some(key))?;
        Some((format!("stage[{i}]"), table))
    }

    /// [`ConfigDoc::apply_override`] of `arg`, its messages and origins naming `shown` (the
    /// argument as given, where `arg` is one key of a stage's table).
    fn apply_override_as(&mut self, arg: &str, shown: &str) -> Result<(), Diagnostic> {
        let bad = |msg: String| Diagnostic::new(msg).at(Some(Location::Override { arg: shown.to_owned() }));
        // `--set a.b=...` where `a` holds a value, not keys: the value is what can be set.
        let not_a_table = |part: &str| {
            let upto = &key_of(arg)[..key_of(arg).find(part).map_or(0, |i| i + part.len())];
            bad(format!("`--set {}`: `{part}` is not a table", key_of(arg)))
                .hint(format!("`{part}` holds a value, not keys: set it whole, `--set {upto}=VALUE`"))
        };
        let (key, raw) = arg
            .split_once('=')
            .ok_or_else(|| bad(format!("override `{arg}` has no `=`")).hint("write `--set key.path=value`"))?;
        let parts: Vec<&str> = key.trim().split('.').collect();
        if parts.iter().any(|p| p.is_empty()) {
            return Err(
                bad(format!("override key `{key}` has an empty part")).hint("write `--set stage_name.key=value`")
            );
        }
        let raw = raw.trim();
        let value = parse_override_value(raw);
        // Text that starts as a TOML string, array or table but does not parse as one (a quote
        // left open, or quotes the shell took away) is a mistake, not a bare string.
        if value.as_str() == Some(raw) && raw.starts_with(['"', '\'', '[', '{']) {
            return Err(bad(format!("`--set {key}`: the value `{raw}` is not valid TOML")).hint(
                "close its quotes or brackets, and quote the whole argument for the shell: \
                 `--set 'key=\"text\"'`, `--set 'key=[\"a\", \"b\"]'`",
            ));
        }
        // A number TOML reads but no i64 or f64 holds is not a bare string either.
        if value.as_str() == Some(raw) && is_out_of_range_number(raw) {
            return Err(bad(format!("`--set {key}`: number `{raw}` is out of range")).hint(NUMBER_RANGE));
        }
        // `stage[i]` addresses a stage by its position in the file, as messages name it.
        let position = parts[0]
            .strip_prefix("stage[")
            .and_then(|p| p.strip_suffix(']'))
            .and_then(|i| i.parse::<usize>().ok())
            .filter(|_| parts.len() > 1);
        // Top-level keys win; otherwise the first part names a stage. A file without stages (a
        // training config) has only top-level keys: `optim.lr` makes an `[optim]` it leaves out.
        let top = parts.len() == 1 || self.root.get(parts[0]).is_some_and(|v| !v.is_array());
        let (mut table, mut prefix, rest): (&mut Table, String, &[&str]) =
            if position.is_none() && (top || !self.root.contains_key("stage")) {
                (&mut self.root, String::new(), &parts[..])
            } else if let Some(idx) = position {
                if parts[1..] == ["type"] {
                    return Err(bad(format!("`--set {key}`: a stage's `type` cannot be overridden"))
                        .hint("edit the pipeline file (or copy it) to use another stage type"));
                }
                let count = self.indexed_stages().last().map_or(0, |&(i, _)| i + 1);
                let Some(Value::Table(table)) = self.root.get_mut("stage").and_then(|s| s.get_mut(idx)) else {
                    return Err(bad(format!("`--set {key}`: there is no stage[{idx}]"))
                        .hint(format!("stages are numbered from 0; this file has {count}")));
                };
                (table, format!("stage[{idx}]"), &parts[1..])
            } else {
                // Positions in the file's stage list, which may hold a stage without a name.
                let named: Vec<(usize, String)> = self
                    .indexed_stages()
                    .into_iter()
                    .filter_map(|(i, t)| Self::stage_name(t).map(|n| (i, n.to_owned())))
                    .collect();
                let names: Vec<String> = named.iter().map(|(_, n)| n.clone()).collect();
                let Some(idx) = named.iter().find(|(_, n)| n == parts[0]).map(|&(i, _)| i) else {
                    let mut candidates: Vec<&str> = names.iter().map(String::as_str).collect();
                    candidates.extend(["name", "output_dir", "seed"]);
                    return Err(bad(format!("`--set {key}`: no stage is named `{}`", parts[0])).maybe_hint(
                        did_you_mean(parts[0], candidates.iter().copied())
                            .or_else(|| Some(format!("stage names here: {}", names.join(", ")))),
                    ));
                };
                if parts[1..] == ["type"] {
                    // Every other key of the stage would then be checked against another type.
                    return Err(bad(format!("`--set {key}`: a stage's `type` cannot be overridden"))
                        .hint("edit the pipeline file (or copy it) to use another stage type"));
                }
                let Some(Value::Array(stages)) = self.root.get_mut("stage") else { unreachable!() };
                let table = stages[idx].as_table_mut().expect("stages() only lists tables");
                (table, format!("stage[{idx}]"), &parts[1..])
            };
        for (i, part) in rest.iter().enumerate() {
            prefix = if prefix.is_empty() { (*part).to_owned() } else { format!("{prefix}.{part}") };
            // `columns[1]`: one element of an array the file (or an earlier `--set`) has.
            let element = part
                .strip_suffix(']')
                .and_then(|p| p.split_once('['))
                .and_then(|(name, ix)| Some((name, ix.parse::<usize>().ok()?)));
            if let Some((name, ix)) = element {
                let len = table.get(name).and_then(Value::as_array).map(Vec::len);
                let Some(slot) = table.get_mut(name).and_then(Value::as_array_mut).and_then(|a| a.get_mut(ix)) else {
                    return Err(bad(match len {
                        Some(n) => format!("`--set {key}`: `{name}` has {n} element(s), numbered from 0"),
                        None => format!("`--set {key}`: there is no array `{name}` to set an element of"),
                    })
                    .hint(format!(
                        "set the whole array: `--set '{}=[...]'`",
                        key.rsplit_once('[').map_or(key, |k| k.0)
                    )));
                };
                if i + 1 == rest.len() {
                    *slot = value.clone();
                    break;
                }
                table = slot.as_table_mut().ok_or_else(|| not_a_table(part))?;
                continue;
            }
            if i + 1 == rest.len() {
                table.insert((*part).to_owned(), value.clone());
                break;
            }
            if !table.contains_key(*part) {
                // A table made by this override: its problems are the override's.
                self.origins.insert(prefix.clone(), Origin::Override(shown.to_owned()));
            }
            let entry = table.entry((*part).to_owned()).or_insert_with(|| Value::Table(Table::new()));
            table = entry.as_table_mut().ok_or_else(|| not_a_table(part))?;
        }
        // A table set whole replaces what the file had under it: its keys come from `--set` too.
        let under = [format!("{prefix}."), format!("{prefix}[")];
        self.origins.retain(|k, _| !under.iter().any(|u| k.starts_with(u.as_str())));
        self.origins.insert(prefix, Origin::Override(shown.to_owned()));
        Ok(())
    }

    /// Deserializes `value` (found at `path`) into `T`, collecting every type error: after an
    /// error in one key, that key is dropped and deserialization retried, so a table with three
    /// wrong values yields three diagnostics. Returns `None` if anything was wrong.
    pub fn extract<T: DeserializeOwned>(&self, path: &str, value: &Value, diags: &mut Vec<Diagnostic>) -> Option<T> {
        match self.extract_recovering(path, value, diags) {
            (Some(t), dropped) if dropped.is_empty() => Some(t),
            _ => None,
        }
    }

    /// [`ConfigDoc::extract`] that also returns what is left once the wrong keys are dropped
    /// (their defaults in their place), with those keys' paths inside `value`: the caller can
    /// go on checking the rest (input files, columns) so that one run of `validate` reports
    /// everything, and leave out problems that only follow from a dropped key. The value is
    /// `None` when a required key is wrong or missing. A non-empty list means errors were
    /// reported.
    pub(crate) fn extract_recovering<T: DeserializeOwned>(
        &self,
        path: &str,
        value: &Value,
        diags: &mut Vec<Diagnostic>,
    ) -> (Option<T>, Vec<String>) {
        self.extract_shown(path, path, value, diags)
    }

    /// [`ConfigDoc::extract_recovering`] with messages naming keys from `shown` instead of
    /// `path`: a stage's keys as `--set` addresses them (`bow.keep_words`, not
    /// `stage[1].keep_words`), while the file location still comes from `path`.
    pub fn extract_shown<T: DeserializeOwned>(
        &self,
        path: &str,
        shown: &str,
        value: &Value,
        diags: &mut Vec<Diagnostic>,
    ) -> (Option<T>, Vec<String>) {
        let mut value = value.clone();
        // What was dropped while reading (a number out of range, reported) inside `value`. A
        // pipeline's stages are extracted on their own, so the top level leaves theirs out.
        let read_drops: Vec<&str> = self
            .dropped
            .iter()
            .filter_map(|d| match path {
                "" => Some(d.as_str()).filter(|d| !d.starts_with("stage[")),
                p => d.strip_prefix(p).and_then(|r| r.strip_prefix('.')),
            })
            .collect();
        let parent_of = |d: &str| d.rfind(['.', '[']).map_or(String::new(), |i| d[..i].to_owned());
        // Keys among them (their parent is a table): not reported missing, and the problems of
        // their defaults are left out, as for a key of a wrong type.
        let mut dropped: Vec<String> = read_drops
            .iter()
            .filter(|d| {
                let parent = parent_of(d);
                parent.is_empty() || lookup(&value, &parent).is_some_and(Value::is_table)
            })
            .map(|d| (*d).to_owned())
            .collect();
        // Array elements dropped so far, as (array's path, index) in `value` as given: serde's
        // paths index the array as it is now, with those elements gone.
        let mut removed: Vec<(String, usize)> = read_drops
            .iter()
            .filter_map(|d| {
                let (array, ix) = d.strip_suffix(']')?.rsplit_once('[')?;
                Some((array.to_owned(), ix.parse().ok()?))
            })
            .collect();
        // Arrays that lost an element so: a fixed-length one is now too short, which is no news.
        let shortened: Vec<String> = removed.iter().map(|(a, _)| a.clone()).collect();
        // Each round reports one error and drops its key; a stage has far fewer keys than
        // this, so every error is found (the bound only guards against a loop that drops none).
        for _ in 0..MAX_ERRORS_PER_STAGE {
            match serde_path_to_error::deserialize::<_, T>(value.clone()) {
                Ok(t) => return (Some(t), dropped),
                Err(e) => {
                    let mut now = e.path().to_string();
                    // Inside a tagged enum (`[loss]`) serde's path of a wrong key ends at its
                    // table: the key itself is what gets dropped (not the whole table).
                    let at_root = now == "." || now.is_empty();
                    let table = if at_root { Some(&value) } else { lookup(&value, &now) };
                    let mut candidates =
                        table.and_then(Value::as_table).map_or(Vec::new(), |t| culprits(t, e.inner().message()));
                    let key_path = |k: &str| if at_root { k.to_owned() } else { format!("{now}.{k}") };
                    // Outside a tagged enum the path ends at the unknown key itself, and its value
                    // may hold a key of the same name (`--set model.a.a=1`): that inner key is the
                    // culprit only if dropping it takes the error away.
                    if e.inner().message().starts_with("unknown field `") && !at_root {
                        candidates.retain(|k| {
                            let mut trial = value.clone();
                            remove_path(&mut trial, &key_path(k));
                            match serde_path_to_error::deserialize::<_, T>(trial) {
                                Ok(_) => true,
                                Err(e2) => e2.path().to_string() != now || e2.inner().message() != e.inner().message(),
                            }
                        });
                    }
                    // Several keys hold the value the message quotes: the one whose removal takes
                    // the error away (not into "missing field" for it) is the one.
                    let culprit = match candidates.len() {
                        0 | 1 => candidates.first().cloned(),
                        _ => candidates
                            .iter()
                            .find(|k| {
                                let mut trial = value.clone();
                                remove_path(&mut trial, &key_path(k));
                                match serde_path_to_error::deserialize::<_, T>(trial) {
                                    Ok(_) => true,
                                    Err(e2) => {
                                        let m2 = e2.inner().message();
                                        (e2.path().to_string() != now || m2 != e.inner().message())
                                            && m2 != format!("missing field `{k}`")
                                    }
                                }
                            })
                            .or(candidates.first())
                            .cloned(),
                    };
                    if let Some(key) = culprit {
                        now = key_path(&key);
                    }
                    let inner = as_given(&now, &removed);
                    let join = |prefix: &str| match (prefix.is_empty(), inner == "." || inner.is_empty()) {
                        (_, true) => prefix.to_owned(),
                        (true, false) => inner.clone(),
                        (false, false) => format!("{prefix}.{inner}"),
                    };
                    let full = join(path);
                    let message = e.inner().message().to_owned();
                    if message.starts_with("invalid length") && shortened.contains(&inner) {
                        // Dropped silently: its element's error is the one to fix.
                        if !remove_path(&mut value, &now) {
                            return (None, dropped);
                        }
                        dropped.push(inner);
                        continue;
                    }
                    // A key dropped for its wrong type comes back as "missing": already reported.
                    if let Some(field) = message.strip_prefix("missing field `").and_then(|m| m.strip_suffix('`')) {
                        let missing = if inner == "." || inner.is_empty() {
                            field.to_owned()
                        } else {
                            format!("{inner}.{field}")
                        };
                        if dropped.contains(&missing) {
                            return (None, dropped);
                        }
                    }
                    let (msg, mut hint) = explain_serde_error(&message, &join(shown));
                    // A choice given as a number, a list or a table: say what it takes.
                    if hint.is_none() && message.starts_with("invalid type") {
                        if let Some(names) = choices_at::<T>(&value, &now).filter(|n| !n.is_empty()) {
                            let names: Vec<String> = names.iter().map(|n| format!("`\"{n}\"`")).collect();
                            hint = Some(format!("one of {} (a quoted name)", names.join(", ")));
                        }
                    }
                    // An unknown key is shown at the key, as the file's other unknown keys are.
                    let at = if message.starts_with("unknown field `") {
                        self.key_location(&full).or_else(|| self.location(&full))
                    } else {
                        self.location(&full)
                    };
                    diags.push(Diagnostic::new(msg).at(at).maybe_hint(hint));
                    // Drop the offending key and retry to find further errors.
                    if inner == "." || inner.is_empty() || !remove_path(&mut value, &now) {
                        dropped.push(inner);
                        return (None, dropped);
                    }
                    if let Some((array, ix)) = inner.strip_suffix(']').and_then(|p| p.rsplit_once('[')) {
                        removed.extend(ix.parse().ok().map(|ix| (array.to_owned(), ix)));
                    }
                    dropped.push(inner);
                }
            }
        }
        (None, dropped)
    }
}

/// Whether the file at `path` is read as JSON: its extension is `json` (`.JSON` too).
fn is_json_path(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// The most syntax errors one run reports: past a few dozen, the next ones are more likely the
/// first ones' echoes than news.
const MAX_SYNTAX_ERRORS: usize = 20;

/// Every syntax error of a TOML file, not only the first. The parser's own recovery reports
/// errors out of file order and echoes some (an unclosed array gives one per line after it), so
/// only its first error in the file is taken; that line is blanked out (spaces, so later places
/// keep their offsets) and the file parsed again, until it parses or the next error is no further
/// on. A table header that does not parse blanks its whole table, up to the next header: its keys
/// would otherwise land in the table before it and be reported as duplicates there; the table's
/// lines are read alone first, for their own syntax errors. The other
/// checks then run on what is left ([`ConfigDoc::load_recovered`]), and only the problems they
/// find that no blanked line could explain are added ([`survives_recovery`]).
fn syntax_errors(path: &Path, source: &str, first: toml::de::Error) -> Vec<Diagnostic> {
    syntax_recovery(path, source, first).0
}

/// A TOML file with its broken lines blanked out ([`syntax_errors`]), once what is left parses.
pub struct Recovered {
    pub text: String,
    /// The lines blanked, 1-based.
    pub lines: Vec<usize>,
}

/// [`syntax_errors`], and the text it leaves when that parses.
fn syntax_recovery(path: &Path, source: &str, first: toml::de::Error) -> (Vec<Diagnostic>, Option<Recovered>) {
    let error = first_in_file(source).unwrap_or(first);
    let pass = blank_out(path, source, source.as_bytes().to_vec(), error, MAX_SYNTAX_ERRORS);
    let recovered =
        pass.parses.then(|| Recovered { text: String::from_utf8(pass.text).expect("still UTF-8"), lines: pass.lines });
    (pass.diags, recovered)
}

/// What [`blank_out`] found and left.
struct Blanked {
    diags: Vec<Diagnostic>,
    text: Vec<u8>,
    lines: Vec<usize>,
    parses: bool,
}

/// The loop of [`syntax_errors`] on `text` (`source` with some bytes made spaces, at the same
/// offsets), from its first syntax error `error`, reporting at most `max` errors.
fn blank_out(path: &Path, source: &str, mut text: Vec<u8>, mut error: toml::de::Error, max: usize) -> Blanked {
    let mut diags = Vec::new();
    let mut blanked_to = 0;
    let mut lines = Vec::new();
    let mut parses = false;
    while diags.len() < max {
        diags.push(syntax_diagnostic(path, source, &error));
        let Some(at) = error.span().map(|s| s.start.min(text.len())) else { break };
        let line_start = text[..at].iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        if line_start < blanked_to {
            // An error inside what was blanked: the echo of an earlier one (an unclosed string
            // or array that runs on); it is not news.
            diags.pop();
            break;
        }
        let line_end = |from: usize| text[from..].iter().position(|&b| b == b'\n').map_or(text.len(), |i| from + i);
        let is_header = |start: usize| text[start..].iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'[');
        let mut end = line_end(line_start);
        if is_header(line_start) {
            let body = (end + 1).min(text.len());
            while end < text.len() && !is_header(end + 1) {
                end = line_end(end + 1);
            }
            // The table's lines go with its header, unread; their own syntax errors are found
            // by reading them alone (as keys of no table), so that none waits for another run.
            if body < end && diags.len() < max {
                let alone: Vec<u8> = text
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| if (body..end).contains(&i) || b == b'\n' { b } else { b' ' })
                    .collect();
                if let Some(e) = std::str::from_utf8(&alone).ok().and_then(first_in_file) {
                    diags.extend(blank_out(path, source, alone, e, max - diags.len()).diags);
                }
            }
        }
        let first_line = text[..line_start].iter().filter(|&&b| b == b'\n').count() + 1;
        let blanked_lines = text[line_start..end].iter().filter(|&&b| b == b'\n').count() + 1;
        lines.extend(first_line..first_line + blanked_lines);
        for b in &mut text[line_start..end] {
            if *b != b'\n' {
                *b = b' ';
            }
        }
        blanked_to = end.max(line_start + 1);
        // Whole lines of bytes became spaces, so the text is still UTF-8.
        let Ok(rest) = std::str::from_utf8(&text) else { break };
        match first_in_file(rest) {
            None => {
                parses = true;
                break;
            }
            Some(e) => error = e,
        }
    }
    Blanked { diags, text, lines, parses }
}

/// Whether a problem found in a [`ConfigDoc::load_recovered`] document stands whatever the
/// blanked `lines` held: it is placed on a line that was not blanked, and it is about that place
/// alone (an unknown key, stage type or value, a wrong type). A missing key or stage, a stage
/// order or a missing column could be the blanked lines' doing, and is left for the run after
/// the syntax is mended.
pub fn survives_recovery(d: &Diagnostic, lines: &[usize]) -> bool {
    let Some(Location::File { line, .. }) = &d.location else { return false };
    let m = d.message.as_str();
    !lines.contains(line)
        && (m.starts_with("unknown key ")
            || m.starts_with("unknown top-level key ")
            || m.starts_with("unknown stage type ")
            || m.contains(": wrong type: ")
            || m.contains(": unknown value "))
}

/// The syntax error of `text` that comes first in the file (the parser reports some out of order).
fn first_in_file(text: &str) -> Option<toml::de::Error> {
    let (_, errors) = DeTable::parse_recoverable(text);
    errors.into_iter().min_by_key(|e| e.span().map_or(usize::MAX, |s| s.start))
}

/// One TOML syntax error as a diagnostic, at its place in `source`.
fn syntax_diagnostic(path: &Path, source: &str, e: &toml::de::Error) -> Diagnostic {
    let loc = match e.span() {
        Some(s) => Some(location_in(path, source, s.start)),
        None => placeless_line(source, e.message()).map(|at| location_in(path, source, at)),
    };
    let mut first = e.message().lines().next().unwrap_or("invalid TOML").to_owned();
    // The parser names no key: it is the text of the line before its `=`.
    if first == "duplicate key" {
        let key = e.span().and_then(|s| source.get(s.start..)).and_then(|rest| {
            let line = rest.lines().next()?;
            let key = line.split('=').next()?.trim().trim_matches(['[', ']']).trim();
            (!key.is_empty()).then(|| key.to_owned())
        });
        if let Some(key) = key {
            first = format!("duplicate key `{key}` (each key is set once per table)");
        }
    }
    Diagnostic::new(format!("invalid TOML: {first}")).at(loc).hint("see https://toml.io for the syntax")
}

/// Where the line starts that a TOML error without a place (the parser's recursion limit: keys,
/// arrays or tables nested too deep) is in: the first line whose end, with the lines before it,
/// gives that error (found by bisection, as a longer start gives it too).
fn placeless_line(source: &str, message: &str) -> Option<usize> {
    // Where each line ends (after its `\n`).
    let ends: Vec<usize> = source.match_indices('\n').map(|(i, _)| i + 1).chain([source.len()]).collect();
    let errs =
        |end: usize| DeTable::parse(&source[..end]).err().is_some_and(|e| e.span().is_none() && e.message() == message);
    let end = *ends.get(ends.partition_point(|&end| !errs(end)))?;
    let line = &source[..end];
    Some(line.strip_suffix('\n').unwrap_or(line).rfind('\n').map_or(0, |i| i + 1))
}

/// Line, column and text of byte `offset` in `source`, the file at `path`. A byte-order mark
/// at the start is not a column (editors do not show it).
fn location_in(path: &Path, source: &str, offset: usize) -> Location {
    let bom = if source.starts_with('\u{feff}') { '\u{feff}'.len_utf8() } else { 0 };
    let (source, offset) = (&source[bom..], offset.saturating_sub(bom));
    let mut offset = offset.min(source.len());
    while !source.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &source[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = source[line_start..offset].chars().count() + 1;
    let text = source[line_start..].lines().next().unwrap_or("").to_owned();
    Location::File { path: path.to_owned(), line, column, text }
}

/// A pipeline written as JSON — above all a run's own `config.json`, so that `curate run
/// out/bow/config.json` repeats that run — as the TOML table it stands for. JSON nulls (a
/// setting left at "none") are left out, as TOML has no null.
fn json_as_table(path: &Path, source: &str) -> Result<Table, Vec<Diagnostic>> {
    // A byte-order mark (which some editors write) before the JSON is not part of it.
    let body = source.strip_prefix('\u{feff}').unwrap_or(source);
    let bom = source.len() - body.len();
    let bad = |e: serde_json::Error| {
        let message = e.to_string();
        // serde_json ends its messages with the place, which the location shows.
        let message = match message.rfind(" at line ") {
            Some(i) if e.line() > 0 => message[..i].to_owned(),
            _ => message,
        };
        // serde_json counts lines from 1 and columns in bytes from 1.
        let at = (e.line() > 0).then(|| {
            let line_start: usize = body.split_inclusive('\n').take(e.line() - 1).map(str::len).sum();
            location_in(path, source, bom + line_start + e.column().saturating_sub(1))
        });
        // Without a line, the text is JSON but not a table of settings (an array at the top, a
        // number past TOML's integers).
        let layout = "a JSON pipeline is an object with the layout of a run's `config.json`";
        vec![match at {
            Some(_) => Diagnostic::new(format!("invalid JSON: {message}")).at(at).hint(layout),
            None => {
                let message = message.replace("sequence", "array").replace("a map", "an object");
                Diagnostic::new(format!("`{}` is JSON but not a pipeline: {message}", path.display()))
                    .hint(format!("{layout}, with integers up to {}", i64::MAX))
            }
        }]
    };
    fn drop_nulls(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                m.retain(|_, x| !x.is_null());
                m.values_mut().for_each(drop_nulls);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(drop_nulls),
            _ => {}
        }
    }
    let mut value: serde_json::Value = serde_json::from_str(body).map_err(bad)?;
    drop_nulls(&mut value);
    serde_json::from_value(value).map_err(bad)
}

/// A hint written for TOML files, as a JSON file's user would read it: `key = value` snippets
/// become `"key": value`, and the phrases about `[[stage]]` tables speak of the `stage` list.
fn json_flavoured(hint: &str) -> String {
    const PHRASES: [(&str, &str); 6] = [
        (
            "begin each stage with `[[stage]]` (double brackets: a list of stages)",
            "`stage` is a list of tables: `\"stage\": [{...}, ...]`",
        ),
        ("add `[[stage]]` tables:", "add a `stage` list of tables:"),
        ("end the file with a `[[stage]]` of", "end the `stage` list with a table of"),
        ("stage keys go under `[[stage]]`", "stage keys go in the tables of the `stage` list"),
        ("at the top of the file", "to the top-level object"),
        ("TOML ", "JSON "),
    ];
    let mut hint = hint.to_owned();
    for (toml, json) in PHRASES {
        hint = hint.replace(toml, json);
    }
    // `key = value` as JSON; other code (`--set` lines, names, JSON already) as it is.
    map_code_spans(&hint, json_assignment)
}

/// `text` with each code span (between backticks) that `f` rewrites replaced.
fn map_code_spans(text: &str, f: impl Fn(&str) -> Option<String>) -> String {
    text.split('`')
        .enumerate()
        .map(|(i, piece)| if i % 2 == 1 { f(piece) } else { None }.unwrap_or_else(|| piece.to_owned()))
        .collect::<Vec<_>>()
        .join("`")
}

/// A message's words for TOML's values as JSON's: tables are objects, and an inline table
/// shown as an example (`{ sample_id = "id" }`) is written as one.
fn json_type_names(message: &str) -> String {
    let message = message
        .replace("invalid type: table", "invalid type: object")
        .replace("expected a table", "expected an object");
    // Only examples are spans that open with `{ `; values the user wrote are quoted otherwise.
    map_code_spans(&message, |code| code.starts_with("{ ").then(|| toml_value(code)).flatten().map(|v| json_text(&v)))
}

/// `code` read as one TOML value.
fn toml_value(code: &str) -> Option<Value> {
    toml::from_str::<Table>(&format!("v = {code}")).ok()?.remove("v")
}

/// The hint for a number out of range, in a file or a `--set`.
const NUMBER_RANGE: &str = "TOML integers go from -9223372036854775808 to 9223372036854775807; floats are finite";

/// Whether `raw` is TOML's syntax of a number (`99999999999999999999`, `1e999`), whatever its
/// size: the syntax is checked apart from the conversion to i64 or f64.
fn is_out_of_range_number(raw: &str) -> bool {
    let code = format!("v = {raw}");
    let Ok(parsed) = DeTable::parse(&code) else { return false };
    let is_number =
        parsed.get_ref().get("v").is_some_and(|v| matches!(v.get_ref(), DeValue::Integer(_) | DeValue::Float(_)));
    is_number && toml_value(raw).is_none()
}

/// `key = value` (a TOML assignment, `...` standing for any value) as `"key": value`.
fn json_assignment(code: &str) -> Option<String> {
    let (key, value) = code.split_once(" = ")?;
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return None;
    }
    let value = if value == "..." { value.to_owned() } else { json_text(&toml_value(value)?) };
    Some(format!("\"{key}\": {value}"))
}

/// A TOML value written as JSON, spaced as the hints are (`{"a": 1, "b": [2, 3]}`).
fn json_text(v: &Value) -> String {
    let quote = |s: &str| serde_json::Value::from(s).to_string();
    match v {
        Value::String(s) => quote(s),
        Value::Integer(i) => i.to_string(),
        Value::Float(f) => serde_json::Value::from(*f).to_string(),
        Value::Boolean(b) => b.to_string(),
        Value::Datetime(d) => quote(&d.to_string()),
        Value::Array(a) => format!("[{}]", a.iter().map(json_text).collect::<Vec<_>>().join(", ")),
        Value::Table(t) => {
            format!(
                "{{{}}}",
                t.iter().map(|(k, v)| format!("{}: {}", quote(k), json_text(v))).collect::<Vec<_>>().join(", ")
            )
        }
    }
}

/// Where each key and value of a JSON document sits in its text, by the paths TOML's values get
/// (`stage[1].keep_words`), so that a JSON pipeline's problems are placed by line as a TOML
/// file's are. `source` is valid JSON (serde_json has read it); the walk stops early otherwise.
#[cfg(test)]
fn json_spans(source: &str) -> HashMap<String, Origin> {
    json_walk(source).0
}

/// Each key's and value's place (`json_spans`, used by the tests), and the keys set twice in one object (their path and the byte offset of the
/// second), which `serde_json` reads as the last one silently.
fn json_walk(source: &str) -> (HashMap<String, Origin>, Vec<(String, usize)>) {
    struct Walk<'a> {
        s: &'a [u8],
        i: usize,
        out: HashMap<String, Origin>,
        twice: Vec<(String, usize)>,
    }
    impl Walk<'_> {
        fn peek(&mut self) -> Option<u8> {
            while self.s.get(self.i).is_some_and(|b| b.is_ascii_whitespace()) {
                self.i += 1;
            }
            self.s.get(self.i).copied()
        }
        /// Skips a string at `self.i` (its opening quote) and returns its text.
        fn string(&mut self) -> Option<String> {
            let start = self.i;
            self.i += 1;
            loop {
                match *self.s.get(self.i)? {
                    b'\\' => self.i += 2,
                    b'"' => break,
                    _ => self.i += 1,
                }
            }
            self.i += 1;
            serde_json::from_slice(&self.s[start..self.i]).ok()
        }
        fn value(&mut self, path: String, key: Range<usize>) -> Option<()> {
            let first = self.peek()?;
            let start = self.i;
            match first {
                b'{' => {
                    self.i += 1;
                    let mut seen = std::collections::HashSet::new();
                    while self.peek()? != b'}' {
                        let k = self.i;
                        let name = self.string()?;
                        let key = k..self.i;
                        (self.peek()? == b':').then_some(())?;
                        self.i += 1;
                        let twice = !seen.insert(name.clone());
                        let child = if path.is_empty() { name } else { format!("{path}.{name}") };
                        if twice {
                            self.twice.push((child.clone(), k));
                        }
                        self.value(child, key)?;
                        if self.peek()? == b',' {
                            self.i += 1;
                        }
                    }
                    self.i += 1;
                }
                b'[' => {
                    self.i += 1;
                    let mut n = 0;
                    while self.peek()? != b']' {
                        let item = self.i;
                        self.value(format!("{path}[{n}]"), item..item)?;
                        n += 1;
                        if self.peek()? == b',' {
                            self.i += 1;
                        }
                    }
                    self.i += 1;
                }
                b'"' => {
                    self.string()?;
                }
                _ => {
                    while self.s.get(self.i).is_some_and(|b| !b",}] \t\r\n".contains(b)) {
                        self.i += 1;
                    }
                }
            }
            if !path.is_empty() {
                self.out.insert(path, Origin::Span { key, value: start..self.i });
            }
            Some(())
        }
    }
    let bom = if source.starts_with('\u{feff}') { '\u{feff}'.len_utf8() } else { 0 };
    let mut walk = Walk { s: source.as_bytes(), i: bom, out: HashMap::new(), twice: Vec::new() };
    walk.peek();
    let start = walk.i;
    walk.value(String::new(), start..start);
    (walk.out, walk.twice)
}

fn record_spans(origins: &mut HashMap<String, Origin>, prefix: &str, table: &DeTable<'_>) {
    for (k, v) in table.iter() {
        let path = if prefix.is_empty() { k.get_ref().to_string() } else { format!("{prefix}.{}", k.get_ref()) };
        record_value(origins, path, k.span(), v);
    }
}

fn record_value(origins: &mut HashMap<String, Origin>, path: String, key: Range<usize>, v: &Spanned<DeValue<'_>>) {
    match v.get_ref() {
        DeValue::Table(t) => record_spans(origins, &path, t),
        DeValue::Array(a) => {
            for (i, item) in a.iter().enumerate() {
                record_value(origins, format!("{path}[{i}]"), item.span(), item);
            }
        }
        _ => {}
    }
    origins.insert(path, Origin::Span { key, value: v.span() });
}

/// The key of a `--set` argument (`a.b` of `a.b=1`).
fn key_of(arg: &str) -> &str {
    arg.split_once('=').map_or(arg, |(k, _)| k.trim())
}

/// A `--set` value is TOML (`4`, `true`, `"x"`, `[1, 2]`, `{a = 1}`); anything that does not
/// parse as TOML is taken as a bare string, so `--set output_dir=out/x` works unquoted; so is a
/// date (`--set name=2024-01-02`), which no key takes as a TOML date-time.
fn parse_override_value(raw: &str) -> Value {
    toml_value(raw).filter(|v| !v.is_datetime()).unwrap_or_else(|| Value::String(raw.to_owned()))
}

/// The paths (as [`ConfigDoc`]'s `origins` name them) of the dates and times in `v`.
fn datetimes(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Datetime(_) => out.push(path.to_owned()),
        Value::Table(t) => {
            for (k, x) in t {
                datetimes(x, &if path.is_empty() { k.clone() } else { format!("{path}.{k}") }, out)
            }
        }
        Value::Array(a) => {
            for (i, x) in a.iter().enumerate() {
                datetimes(x, &format!("{path}[{i}]"), out)
            }
        }
        _ => {}
    }
}

/// `path`, a path into a value from which the array elements in `removed` ((array's path,
/// index), both as given) were dropped, as a path into the value as given.
fn as_given(path: &str, removed: &[(String, usize)]) -> String {
    let mut out = String::new();
    for (i, part) in path.split('.').enumerate() {
        if i > 0 {
            out.push('.');
        }
        let Some((name, ix)) = part.strip_suffix(']').and_then(|p| p.split_once('[')) else {
            out.push_str(part);
            continue;
        };
        out.push_str(name);
        let Ok(mut ix) = ix.parse::<usize>() else {
            out.push_str(&part[name.len()..]);
            continue;
        };
        let mut gone: Vec<usize> = removed.iter().filter(|(a, _)| *a == out).map(|&(_, r)| r).collect();
        gone.sort_unstable();
        for r in gone {
            if r <= ix {
                ix += 1;
            }
        }
        out.push_str(&format!("[{ix}]"));
    }
    out
}

/// The value at `path` (`a.b[2].c`) in `value`.
fn lookup<'v>(value: &'v Value, path: &str) -> Option<&'v Value> {
    let mut cur = value;
    for part in path.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, Some(rest.trim_end_matches(']').parse::<usize>().ok()?)),
            None => (part, None),
        };
        cur = cur.as_table()?.get(name)?;
        if let Some(ix) = index {
            cur = cur.as_array()?.get(ix)?;
        }
    }
    Some(cur)
}

/// The keys of `table` a serde error `message` may be about, where its path names only the
/// table (as inside an internally tagged enum): an unknown key by its name, a wrong value by the
/// value the message quotes (`invalid type: string "x", expected a number`), every key holding it.
fn culprits(table: &Table, message: &str) -> Vec<String> {
    if let Some(rest) = message.strip_prefix("unknown field `") {
        let field = rest.split('`').next().unwrap_or("");
        return if table.contains_key(field) { vec![field.to_owned()] } else { Vec::new() };
    }
    let Some(got) = message.strip_prefix("invalid type: ").or_else(|| message.strip_prefix("invalid value: ")) else {
        return Vec::new();
    };
    let got = got.rsplit_once(", expected").map_or(got, |(g, _)| g);
    // A table where another type was expected: the table itself is wrong, not a key of it.
    if got == "map" {
        return Vec::new();
    }
    let quoted = || got.split('`').nth(1);
    table
        .iter()
        .filter(|(_, v)| match v {
            Value::String(s) => got == format!("string {s:?}"),
            Value::Integer(i) => got.starts_with("integer") && quoted() == Some(&i.to_string()),
            Value::Float(f) => got.starts_with("floating point") && quoted().and_then(|q| q.parse().ok()) == Some(*f),
            Value::Boolean(b) => got.starts_with("boolean") && quoted() == Some(&b.to_string()),
            Value::Array(_) => got == "sequence",
            Value::Table(_) | Value::Datetime(_) => false,
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// Sets the value at `path` (which must be there) to `new`.
fn replace_path(value: &mut Value, path: &str, new: Value) -> bool {
    let parts: Vec<&str> = path.split('.').collect();
    let mut cur = value;
    for part in parts {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        let Some(next) = cur.as_table_mut().and_then(|t| t.get_mut(name)) else { return false };
        cur = match index {
            Some(ix) => match next.as_array_mut().and_then(|a| a.get_mut(ix)) {
                Some(v) => v,
                None => return false,
            },
            None => next,
        };
    }
    *cur = new;
    true
}

/// The names a key of a choice takes (an enum's variants), learnt by giving it a name it cannot
/// have: serde then lists them. `None` for a key that is no choice.
fn choices_at<T: DeserializeOwned>(value: &Value, path: &str) -> Option<Vec<String>> {
    let mut probe = value.clone();
    if !replace_path(&mut probe, path, Value::String("\u{1}".into())) {
        return None;
    }
    let e = serde_path_to_error::deserialize::<_, T>(probe).err()?;
    let m = e.inner().message();
    let rest = m.strip_prefix("unknown variant ")?;
    let expected = rest.split("expected").nth(1)?.split('`').skip(1).step_by(2).map(str::to_owned).collect();
    Some(expected)
}

fn remove_path(value: &mut Value, path: &str) -> bool {
    let parts: Vec<&str> = path.split('.').collect();
    let mut cur = value;
    for (i, part) in parts.iter().enumerate() {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (*part, None),
        };
        let Some(table) = cur.as_table_mut() else { return false };
        if i + 1 == parts.len() && index.is_none() {
            return table.remove(name).is_some();
        }
        let Some(next) = table.get_mut(name) else { return false };
        cur = match index {
            Some(ix) => match next.as_array_mut() {
                Some(a) if ix < a.len() => {
                    if i + 1 == parts.len() {
                        a.remove(ix);
                        return true;
                    }
                    &mut a[ix]
                }
                _ => return false,
            },
            None => next,
        };
    }
    false
}

/// `v` (a number to Rust, or `true`/`false`) as TOML writes it, for a hint: `.1` and `1.` are
/// `0.1` and `1.0`, `NaN` is `nan`, and `04` for an integer key is `4`.
fn toml_number(v: &str, integer: bool) -> String {
    if format!("x = {v}").parse::<toml::Table>().is_ok() {
        return v.to_owned();
    }
    match (integer, v.parse::<i128>(), v.parse::<f64>()) {
        (true, Ok(i), _) => i.to_string(),
        (_, _, Ok(f)) if f.is_nan() => "nan".to_owned(),
        (_, _, Ok(f)) if f.is_infinite() => if f > 0.0 { "inf" } else { "-inf" }.to_owned(),
        (_, _, Ok(f)) => format!("{f:?}"),
        _ => v.to_owned(),
    }
}

/// Turns serde's message into ours plus a hint ("did you mean" for unknown variants).
fn explain_serde_error(message: &str, shown: &str) -> (String, Option<String>) {
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let given = rest.split('`').nth(1).unwrap_or("");
        let expected: Vec<&str> = rest.split("expected").nth(1).unwrap_or("").split('`').skip(1).step_by(2).collect();
        let hint = did_you_mean(given, expected.iter().copied()).or_else(|| {
            Some(format!("choose one of {}", expected.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", ")))
        });
        return (format!("`{shown}`: unknown value `{given}`"), hint);
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        // A key of a nested table (`columns = { captoin = "text" }`): its table, and a near miss.
        let given = rest.split('`').nth(1).unwrap_or("");
        let expected: Vec<&str> = rest.split("expected").nth(1).unwrap_or("").split('`').skip(1).step_by(2).collect();
        let table = shown.strip_suffix(given).map_or(shown, |t| t.trim_end_matches('.'));
        let hint = did_you_mean(given, expected.iter().copied()).or_else(|| {
            (!expected.is_empty()).then(|| {
                format!("keys here: {}", expected.iter().map(|e| format!("`{e}`")).collect::<Vec<_>>().join(", "))
            })
        });
        let within = if table.is_empty() { String::new() } else { format!(" in `{table}`") };
        return (format!("unknown key `{given}`{within}"), hint);
    }
    if let Some(field) = message.strip_prefix("missing field ") {
        let key = field.trim_matches('`');
        return if shown.is_empty() {
            (format!("missing required key `{key}`"), Some(format!("add `{key} = ...` at the top of the file")))
        } else {
            (format!("`{shown}`: missing required key `{key}`"), Some(format!("add `{key} = ...` to this stage")))
        };
    }
    // A number, a list or a table where a choice's name goes (toml's wording).
    if message.starts_with("invalid type") && message.ends_with("expected string only") {
        return (format!("`{shown}`: wrong type: expected a name (quoted text)"), None);
    }
    if message.starts_with("invalid type") || message.starts_with("invalid value") {
        let message = plain_type_names(message);
        // `keep_words = "4"`: a number or a boolean written as a string.
        let given = message.strip_prefix("invalid type: string \"").and_then(|m| m.split('"').next());
        let key = shown.rsplit('.').next().unwrap_or(shown);
        let hint = match given {
            // Too large for TOML, so `--set` kept it as a string.
            Some(v) if v.bytes().all(|b| b.is_ascii_digit()) && !v.is_empty() && v.parse::<i64>().is_err() => {
                Some(format!("TOML integers go up to {}", i64::MAX))
            }
            Some(v) if v.parse::<f64>().is_ok() || v == "true" || v == "false" => {
                let v = toml_number(v, message.contains("integer"));
                Some(format!("TOML numbers and booleans are written without quotes: `{key} = {v}`"))
            }
            _ if message.ends_with("expected a boolean") => Some(format!("write `{key} = true` or `{key} = false`")),
            // `[stage]` where `[[stage]]` was meant: one table, not an array of them.
            _ if shown == "stage" && message.starts_with("invalid type: table") => {
                Some("begin each stage with `[[stage]]` (double brackets: a list of stages)".into())
            }
            // `--set output_dir=2024`: TOML reads a bare number as a number.
            _ if message.ends_with("expected a string")
                && ["integer", "floating point", "boolean"].iter().any(|t| message.contains(t)) =>
            {
                let v = message.split('`').nth(1).unwrap_or("...");
                if key.contains('[') {
                    // An array element: neither `columns[1] = ...` nor `--set` can address it.
                    Some(format!("quote text: `\"{v}\"` in the array"))
                } else {
                    Some(format!("quote text: `{key} = \"{v}\"`, or `--set '{shown}=\"{v}\"'`"))
                }
            }
            _ if message.ends_with("expected a non-negative integer") => {
                Some(format!("a whole number from 0 to {} (no quotes, no decimal point)", i64::MAX))
            }
            _ if message.ends_with("expected an integer") => {
                Some("a whole number (no quotes, no decimal point)".into())
            }
            _ if message.ends_with("expected a number") => Some("a number, without quotes, such as `0.5`".into()),
            _ if message.ends_with("expected an array") => {
                let v = message.split('"').nth(1).or_else(|| message.split('`').nth(1)).unwrap_or("...");
                Some(format!("a list, in brackets: `{key} = [\"{v}\"]`"))
            }
            _ => None,
        };
        // A value of the right type outside the key's range is no wrong type.
        if message.starts_with("invalid value") {
            let message = message.strip_prefix("invalid value: ").unwrap_or(&message);
            return (format!("`{shown}`: out of range: {message}"), hint);
        }
        return (format!("`{shown}`: wrong type: {message}"), hint);
    }
    (format!("`{shown}`: {message}"), None)
}

/// serde's Rust type names (`expected usize`) in the words of a config file.
fn plain_type_names(message: &str) -> String {
    let names = [
        ("usize", "a non-negative integer"),
        ("u64", "a non-negative integer"),
        ("u32", "a non-negative integer"),
        ("u16", "a non-negative integer"),
        ("u8", "a non-negative integer"),
        ("i64", "an integer"),
        ("i32", "an integer"),
        ("f64", "a number"),
        ("f32", "a number"),
    ];
    // serde's words for TOML's tables and arrays.
    let mut out = message
        .replace("invalid type: map", "invalid type: table")
        .replace("expected a map", "expected a table")
        .replace("invalid type: sequence", "invalid type: array")
        .replace("expected a sequence", "expected an array");
    for (rust, words) in names {
        // Whole words only: `expected u64`, `expected u64 at ...`.
        let pattern = format!("expected {rust}");
        if let Some(at) = out.find(&pattern) {
            let end = at + pattern.len();
            if out[end..].chars().next().is_none_or(|c| !c.is_alphanumeric()) {
                out.replace_range(at..end, &format!("expected {words}"));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct S {
        a: u32,
        b: bool,
        #[serde(default)]
        c: String,
    }

    fn doc(src: &str, sets: &[&str]) -> ConfigDoc {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        ConfigDoc::parse(Path::new("p.toml"), src.to_owned(), &sets).unwrap()
    }

    #[test]
    fn a_set_number_out_of_range_is_reported_as_one_not_as_a_string() {
        let d = doc(
            "seed = 1\nname = \"x\"\n",
            &["seed=99999999999999999999", "name=-1e400", "seed=1_000", "name=12ab", "name=inf"],
        );
        let messages: Vec<&str> = d.override_errors.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            messages,
            [
                "`--set seed`: number `99999999999999999999` is out of range",
                "`--set name`: number `-1e400` is out of range"
            ]
        );
        assert!(d.override_errors.iter().all(|e| e.hint.as_deref() == Some(NUMBER_RANGE)));
        assert!(NUMBER_RANGE.contains(&format!("from {} to {};", i64::MIN, i64::MAX)));
        // What TOML does not read as a number stays a bare string; what fits is a number.
        assert_eq!(d.root["seed"].as_integer(), Some(1000));
        assert_eq!(d.root["name"].as_float(), Some(f64::INFINITY));
        let d = doc("name = \"x\"\n", &["name=12ab"]);
        assert!(d.override_errors.is_empty());
        assert_eq!(d.root["name"].as_str(), Some("12ab"));
    }

    #[test]
    fn every_number_out_of_range_is_reported_and_its_key_dropped() {
        let d = doc(
            "seed = 99999999999999999999\nname = \"x\"\n[[stage]]\ntype = \"bow\"\nkeep_words = 1e999\n\
             crop_scale = [0.5, -1e400, 2e400, 1, 2, 3, 4, 5, 6, 7, 8e999, 11]\n",
            &["seed=x=1"],
        );
        let messages: Vec<(String, usize)> = d
            .override_errors
            .iter()
            .map(|e| match &e.location {
                Some(Location::File { line, .. }) => (e.message.clone(), *line),
                _ => (e.message.clone(), 0),
            })
            .collect();
        let out = |n: &str| format!("invalid TOML: number `{n}` is out of range");
        assert_eq!(
            messages,
            [
                (out("99999999999999999999"), 1),
                (out("1e999"), 5),
                (out("-1e400"), 6),
                (out("2e400"), 6),
                (out("8e999"), 6)
            ],
            "`seed=x=1` sets a string: no error of its own here"
        );
        // The rest is read: the keys with a number out of range are gone, the others stay.
        assert_eq!(d.root["seed"].as_str(), Some("x=1"));
        assert_eq!(d.root["name"].as_str(), Some("x"));
        let stage = &d.stages()[0];
        assert!(stage.get("keep_words").is_none());
        // Elements past the tenth go too, and the right ones (the later first).
        let kept: Vec<f64> = stage["crop_scale"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_float().or(v.as_integer().map(|i| i as f64)).unwrap())
            .collect();
        assert_eq!(kept, [0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 11.0]);
        // A key dropped for its number is not reported missing: `seed=x=1` put `seed` back; a
        // dropped required key leaves the stage unbuilt, without a word of its own.
        let d = doc("output_dir = \"o\"\nseed = 1e999\n", &[]);
        let mut diags = Vec::new();
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Top {
            output_dir: String,
            seed: u64,
        }
        let (top, dropped) = d.extract_recovering::<Top>("", &Value::Table(d.root.clone()), &mut diags);
        assert!(top.is_none() && diags.is_empty() && dropped == ["seed"], "{diags:?}");
    }

    #[test]
    fn locations_point_at_lines() {
        let d = doc("seed = 1\n\n[[stage]]\ntype = \"bow\"\nkeep_words = 4\n", &[]);
        match d.location("stage[0].keep_words") {
            Some(Location::File { line, column, .. }) => assert_eq!((line, column), (5, 14)),
            other => panic!("{other:?}"),
        }
        match d.key_location("stage[0].keep_words") {
            Some(Location::File { line, column, .. }) => assert_eq!((line, column), (5, 1)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn overrides_address_stages_by_name_and_parse_toml_values() {
        let d = doc(
            "output_dir = \"out\"\n[[stage]]\ntype = \"bow\"\nkeep_words = 4\n",
            &["bow.keep_words=2", "output_dir=out/x", "bow.columns.caption=\"text\""],
        );
        let st = d.stages()[0];
        assert_eq!(st["keep_words"].as_integer(), Some(2));
        assert_eq!(st["columns"]["caption"].as_str(), Some("text"));
        assert_eq!(d.root["output_dir"].as_str(), Some("out/x"));
        assert_eq!(d.location("stage[0].keep_words"), Some(Location::Override { arg: "bow.keep_words=2".into() }));
    }

    #[test]
    fn a_table_set_whole_is_located_at_the_override() {
        let d = doc(
            "[[stage]]\ntype = \"read_table\"\ncolumns = { caption = \"text\" }\n",
            &["read_table.columns={ caption = \"txt\" }"],
        );
        let at = Some(Location::Override { arg: "read_table.columns={ caption = \"txt\" }".into() });
        assert_eq!(d.location("stage[0].columns.caption"), at);
        assert!(matches!(d.location("stage[0].type"), Some(Location::File { line: 2, .. })));
    }

    #[test]
    fn a_stage_type_is_not_overridden() {
        let sets = ["bow.type=read_cc_tsv".to_owned(), "bow.keep_words=2".to_owned()];
        let doc = ConfigDoc::parse(Path::new("p.toml"), "[[stage]]\ntype = \"bow\"\n".into(), &sets).unwrap();
        assert_eq!(doc.override_errors.len(), 1, "{:?}", doc.override_errors);
        assert!(doc.override_errors[0].message.contains("`type` cannot be overridden"));
        assert_eq!(doc.stages()[0]["type"].as_str(), Some("bow"));
        assert_eq!(doc.stages()[0]["keep_words"].as_integer(), Some(2));
    }

    #[test]
    fn unknown_stage_in_override_is_reported() {
        let sets = ["bwo.keep_words=2".to_owned()];
        let doc = ConfigDoc::parse(Path::new("p.toml"), "[[stage]]\ntype = \"bow\"\n".into(), &sets).unwrap();
        let e = doc.override_errors;
        assert!(e[0].message.contains("no stage is named `bwo`"));
        assert_eq!(e[0].hint.as_deref(), Some("did you mean `bow`?"));
    }

    #[test]
    fn extract_reports_every_type_error() {
        let d = doc("[[stage]]\na = \"x\"\nb = 3\n", &[]);
        let mut diags = Vec::new();
        let v = Value::Table(d.stages()[0].clone());
        assert_eq!(d.extract::<S>("stage[0]", &v, &mut diags), None);
        assert_eq!(diags.len(), 2, "{diags:?}");
        assert!(diags[0].message.contains("stage[0].a"));
        assert!(diags[1].message.contains("stage[0].b"));
    }

    #[test]
    fn extract_recovering_returns_the_rest_with_defaults() {
        let d = doc("[[stage]]\na = 1\nb = true\nc = 5\n", &[]);
        let mut diags = Vec::new();
        let v = Value::Table(d.stages()[0].clone());
        let (s, dropped) = d.extract_recovering::<S>("stage[0]", &v, &mut diags);
        assert_eq!(s, Some(S { a: 1, b: true, c: String::new() }));
        assert_eq!(dropped, ["c"]);
        assert_eq!(diags.len(), 1, "{diags:?}");
        // A wrong required key leaves nothing to check.
        let d = doc("[[stage]]\na = \"x\"\nb = true\n", &[]);
        let (s, dropped) = d.extract_recovering::<S>("stage[0]", &Value::Table(d.stages()[0].clone()), &mut diags);
        assert_eq!((s, dropped.len()), (None, 1));
    }

    #[test]
    fn json_keys_set_twice_in_one_object_are_found() {
        let json =
            r#"{"seed": 1, "stage": [{"type": "bow", "keep_words": 4, "keep_words": 1}, {"type": "bow"}], "seed": 2}"#;
        let (_, twice) = json_walk(json);
        let found: Vec<(&str, &str)> = twice.iter().map(|(k, at)| (k.as_str(), &json[*at..*at + 6])).collect();
        assert_eq!(found, [("stage[0].keep_words", "\"keep_"), ("seed", "\"seed\"")]);
    }

    #[test]
    fn json_values_are_placed_where_toml_values_would_be() {
        let json = "{\"seed\": 7,\n \"stage\": [\n  {\"type\": \"bow\", \"columns\": {\"caption\": \"text\"}},\n  \
                    {\"a\\u0062\": [1, 2], \"s\": \"x,}\\\"]\"}\n ]\n}";
        let spans = json_spans(json);
        let at = |path: &str| match &spans[path] {
            Origin::Span { key, value } => (&json[key.clone()], &json[value.clone()]),
            Origin::Override(_) => unreachable!(),
        };
        assert_eq!(at("seed"), ("\"seed\"", "7"));
        assert_eq!(at("stage[0].type"), ("\"type\"", "\"bow\""));
        assert_eq!(at("stage[0].columns.caption"), ("\"caption\"", "\"text\""));
        assert_eq!(at("stage[0].columns").1, "{\"caption\": \"text\"}");
        // An escaped key is found by its meaning; strings may hold `,`, `}` and quotes.
        assert_eq!(at("stage[1].ab").1, "[1, 2]");
        assert_eq!(at("stage[1].ab[1]").1, "2");
        assert_eq!(at("stage[1].s").1, "\"x,}\\\"]\"");
        assert!(at("stage").1.starts_with('[') && at("stage").1.ends_with(']'));
        assert_eq!(spans.len(), 11, "{:?}", spans.keys().collect::<Vec<_>>());
        // Read as a pipeline, the places are lines and columns of the JSON text.
        let dir = std::env::temp_dir().join(format!("curate-json-spans-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.json");
        std::fs::write(&file, json).unwrap();
        let d = ConfigDoc::load(&file, &["seed=3".to_owned()]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        match d.location("stage[1].s") {
            Some(Location::File { line: 4, column, text, .. }) => assert_eq!(&text[column - 1..][..2], "\"x"),
            other => panic!("{other:?}"),
        }
        assert!(matches!(d.key_location("stage[0].columns.caption"), Some(Location::File { line: 3, column: 31, .. })));
        assert!(matches!(d.location("seed"), Some(Location::Override { .. })));
        assert_eq!(d.root["seed"].as_integer(), Some(3));
    }

    #[test]
    fn a_json_syntax_error_is_placed_by_character() {
        // serde_json counts the column in bytes; `ß` is two of them but one character.
        let e = json_as_table(Path::new("p.json"), "{\"ß\": 1,\n \"x\": 1 y}").unwrap_err();
        assert_eq!(e[0].message, "invalid JSON: expected `,` or `}`");
        match &e[0].location {
            Some(Location::File { line: 2, column: 9, text, .. }) => assert_eq!(text, " \"x\": 1 y}"),
            other => panic!("{other:?}"),
        }
        let e = json_as_table(Path::new("p.json"), "{\"ß\": 1 y}").unwrap_err();
        assert!(matches!(e[0].location, Some(Location::File { line: 1, column: 9, .. })), "{e:?}");
    }

    #[test]
    fn hints_speak_json_to_a_json_file() {
        let cases = [
            ("write `shuffle = true` or `shuffle = false`", r#"write `"shuffle": true` or `"shuffle": false`"#),
            (
                "TOML numbers and booleans are written without quotes: `keep_words = 4`",
                r#"JSON numbers and booleans are written without quotes: `"keep_words": 4`"#,
            ),
            ("add `output_dir = ...` at the top of the file", r#"add `"output_dir": ...` to the top-level object"#),
            ("set `rm_top_freq = 0`, or `mode = \"mostly\"`", r#"set `"rm_top_freq": 0`, or `"mode": "mostly"`"#),
            (
                "e.g. `columns = { caption = \"text\", path = \"image\" }`",
                r#"e.g. `"columns": {"caption": "text", "path": "image"}`"#,
            ),
            ("`x = [1, 0.5, 'a\"b']`", r#"`"x": [1, 0.5, "a\"b"]`"#),
            (
                "quote text: `output_dir = \"2024\"`, or `--set 'output_dir=\"2024\"'`",
                r#"quote text: `"output_dir": "2024"`, or `--set 'output_dir="2024"'`"#,
            ),
            (
                "end the file with a `[[stage]]` of `type = \"write_parquet\"`",
                r#"end the `stage` list with a table of `"type": "write_parquet"`"#,
            ),
            (
                "begin each stage with `[[stage]]` (double brackets: a list of stages)",
                r#"`stage` is a list of tables: `"stage": [{...}, ...]`"#,
            ),
            // Not assignments: names, `--set` lines and unparsable values stay as written.
            ("did you mean `keep_words`?", "did you mean `keep_words`?"),
            ("write `--set key.path=value`", "write `--set key.path=value`"),
            ("`a = b c`", "`a = b c`"),
        ];
        for (toml, json) in cases {
            assert_eq!(json_flavoured(toml), json, "{toml}");
        }
        assert_eq!(
            json_type_names("`c`: wrong type: invalid type: array, expected a table such as `{ a = \"x\", b = 1 }`"),
            r#"`c`: wrong type: invalid type: array, expected an object such as `{"a": "x", "b": 1}`"#
        );
        assert_eq!(json_type_names("unknown value `{a}`"), "unknown value `{a}`");
        // Only a JSON file's own problems; a `--set` argument's keep TOML.
        let dir = std::env::temp_dir().join(format!("curate-hints-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("p.json");
        std::fs::write(&file, "{\"seed\": 1}").unwrap();
        let d = ConfigDoc::load(&file, &[]).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let at_file = Diagnostic::new("x").at(d.location("seed")).hint("write `seed = 1`");
        let at_set =
            Diagnostic::new("y").at(Some(Location::Override { arg: "seed=x".into() })).hint("write `seed = 1`");
        let hints: Vec<_> = d.in_file_syntax(vec![at_file, at_set]).into_iter().map(|d| d.hint.unwrap()).collect();
        assert_eq!(hints, ["write `\"seed\": 1`", "write `seed = 1`"]);
        let toml = ConfigDoc::parse(Path::new("p.toml"), "seed = 1".into(), &[]).unwrap();
        assert_eq!(
            toml.in_file_syntax(vec![Diagnostic::new("x").hint("`seed = 1`")])[0].hint.as_deref(),
            Some("`seed = 1`")
        );
    }

    #[test]
    fn type_errors_use_the_words_of_a_config_file() {
        let (msg, hint) = explain_serde_error("invalid type: string \"four\", expected usize", "stage[1].keep_words");
        assert_eq!(
            msg,
            "`stage[1].keep_words`: wrong type: invalid type: string \"four\", expected a non-negative integer"
        );
        assert_eq!(hint.as_deref(), Some("a whole number from 0 to 9223372036854775807 (no quotes, no decimal point)"));
        // A value of the right type out of the key's range.
        let (msg, _) = explain_serde_error("invalid value: integer `-1`, expected u64", "seed");
        assert_eq!(msg, "`seed`: out of range: integer `-1`, expected a non-negative integer");
        let (_, hint) = explain_serde_error("invalid type: integer `1`, expected a boolean", "stage[0].url_first");
        assert_eq!(hint.as_deref(), Some("write `url_first = true` or `url_first = false`"));
        let (_, hint) = explain_serde_error("invalid type: string \"id\", expected a sequence", "stage[2].columns");
        assert_eq!(hint.as_deref(), Some("a list, in brackets: `columns = [\"id\"]`"));
        let (_, hint) = explain_serde_error("invalid type: string \"4\", expected usize", "stage[1].keep_words");
        assert_eq!(hint.as_deref(), Some("TOML numbers and booleans are written without quotes: `keep_words = 4`"));
        // Numbers to Rust that TOML does not take are shown as TOML writes them.
        for (given, shown) in
            [(".1", "0.1"), ("1.", "1.0"), ("+.5", "0.5"), ("1e-3", "1e-3"), ("NaN", "nan"), ("-Infinity", "-inf")]
        {
            let (_, hint) =
                explain_serde_error(&format!("invalid type: string \"{given}\", expected f64"), "bow.base_fraction");
            let want = format!("TOML numbers and booleans are written without quotes: `base_fraction = {shown}`");
            assert_eq!(hint, Some(want), "{given}");
        }
        // An integer key: as an integer.
        let (_, hint) = explain_serde_error("invalid type: string \"04\", expected usize", "stage[1].keep_words");
        assert_eq!(hint.as_deref(), Some("TOML numbers and booleans are written without quotes: `keep_words = 4`"));
        let (_, hint) = explain_serde_error("invalid type: string \"18446744073709551615\", expected u64", "seed");
        assert_eq!(hint.as_deref(), Some("TOML integers go up to 9223372036854775807"));
        let (_, hint) = explain_serde_error("invalid type: string \"yes\", expected a boolean", "stage[1].shuffle");
        assert_eq!(hint.as_deref(), Some("write `shuffle = true` or `shuffle = false`"));
        let (msg, hint) = explain_serde_error("invalid type: integer `3`, expected a boolean", "stage[0].b");
        assert!(msg.ends_with("expected a boolean"), "{msg}");
        assert_eq!(hint.as_deref(), Some("write `b = true` or `b = false`"));
        assert_eq!(plain_type_names("expected f64s"), "expected f64s", "whole words only");
        let (msg, hint) = explain_serde_error("missing field `output_dir`", "");
        assert_eq!(msg, "missing required key `output_dir`");
        assert_eq!(hint.as_deref(), Some("add `output_dir = ...` at the top of the file"));
    }

    #[test]
    fn a_recovered_file_keeps_its_lines_and_only_local_problems_survive() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.toml");
        // Line 2 is broken; the header on line 4 is too, which blanks its table (lines 4-5).
        std::fs::write(&path, "a = 1\nb = \nc = 3\n[t\nd = 4\n[u]\ne = 5\n").unwrap();
        let (doc, lines) = ConfigDoc::load_recovered(&path, &[]).unwrap();
        assert_eq!(lines, [2, 4, 5]);
        assert!(doc.root.contains_key("a") && doc.root.contains_key("c") && doc.root.contains_key("u"));
        assert!(!doc.root.contains_key("b") && !doc.root.contains_key("t"));
        // Placed by line as in the file (the blanking keeps offsets).
        assert!(matches!(doc.location("u.e"), Some(Location::File { line: 7, .. })), "{:?}", doc.location("u.e"));
        let at = |line| Some(Location::File { path: path.clone(), line, column: 1, text: String::new() });
        let d = |m: &str, line| Diagnostic::new(m).at(at(line));
        assert!(survives_recovery(&d("unknown key `x` in stage `bow` (bow)", 7), &lines));
        assert!(survives_recovery(&d("`u.e`: wrong type: expected a boolean", 7), &lines));
        assert!(!survives_recovery(&d("unknown key `x` in stage `bow` (bow)", 5), &lines), "on a blanked line");
        assert!(!survives_recovery(&d("missing required key `path`", 7), &lines), "could be the blanked lines'");
        assert!(!survives_recovery(&Diagnostic::new("unknown top-level key `x`"), &lines), "not placed");
        // A file that parses has nothing to recover; neither has one whose rest does not parse.
        std::fs::write(&path, "a = 1\n").unwrap();
        assert!(ConfigDoc::load_recovered(&path, &[]).is_none());
    }

    #[test]
    fn syntax_errors_have_a_line() {
        let e = ConfigDoc::parse(Path::new("p.toml"), "a = 1\nb = \n".into(), &[]).unwrap_err();
        assert!(matches!(e[0].location, Some(Location::File { line: 2, .. })), "{e:?}");
    }

    #[test]
    fn nesting_too_deep_has_a_line() {
        // The parser's recursion limit has no place of its own for dotted keys: it is found by
        // line (arrays have theirs).
        for deep in [format!("x{}= 1", ".a".repeat(200)), format!("x = {}{}", "[".repeat(200), "]".repeat(200))] {
            let text = format!("a = 1\n\n{deep}\nb = 2\n");
            let e = ConfigDoc::parse(Path::new("p.toml"), text, &[]).unwrap_err();
            assert!(e[0].message.contains("recurs"), "{e:?}");
            assert!(matches!(e[0].location, Some(Location::File { line: 3, .. })), "{e:?}");
        }
    }
}
