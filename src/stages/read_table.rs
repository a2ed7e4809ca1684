//! `read_table`: any Parquet, TSV or CSV table of pairs, with a column mapping onto the `pairs`
//! schema — e.g. Flickr8k's `Flickr8k.token.txt` (`IMAGE.jpg#N<TAB>caption`) or a CSV export.
//!
//! Columns are named (header / Parquet field) or given as 0-based indexes. Without a
//! `sample_id` column the id is `<file name>#<row>`: the 1-based line for TSV, the line a record
//! starts on for CSV, the 0-based row for Parquet. Relative image paths resolve against
//! `image_root`, or else the table's own folder; with `check_files` a row whose image file does
//! not exist is a `missing_file` reject. `keep_where` keeps only the rows whose given columns
//! hold one of the given values, as text (WIT's English rows: `keep_where = { language = "en" }`);
//! the others are skipped (`keep_where` in the skip counts) before any check of theirs but a
//! line's field count, not rejected; a null or a cell that is not UTF-8 is never kept.

use std::io::Read;
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::Array;
use arrow_schema::DataType;
use serde::{Deserialize, Serialize};

use super::{
    chunk_of, expand_inputs, has_words, header_fields, split_tabs, usual_width_of_first_lines, widest_of_first_lines,
    ChunkIter, LineChunks, LineOutcome, Problems, Reader, UniqueIds, CHUNK_ROWS, DUPLICATE_ID,
};
use crate::error::{did_you_mean, Error, Result};
use crate::io::lines::TextFile;
use crate::io::{file_name, parquet, PathPatterns};
use crate::schema::{Chunk, PairRow, PairsBuilder, Reject};

/// Lines (CSV: records) of a headerless table whose usual field count is the width every row
/// must have; a few malformed lines among them do not change it.
const FIRST_LINES: usize = 100;

pub const TYPE: &str = "read_table";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Parquet,
    Tsv,
    Csv,
}

impl Format {
    /// As the `format` key spells it.
    pub fn name(self) -> &'static str {
        match self {
            Format::Parquet => "parquet",
            Format::Tsv => "tsv",
            Format::Csv => "csv",
        }
    }
}

/// A column by header name or 0-based index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum ColumnRef {
    Index(usize),
    Name(String),
}

/// By hand rather than `untagged`, so a wrong value is told what is expected ("a column name or
/// a 0-based column index") instead of "did not match any variant".
impl<'de> Deserialize<'de> for ColumnRef {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ColumnRef;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a column name or a 0-based column index")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<ColumnRef, E> {
                usize::try_from(v)
                    .map(ColumnRef::Index)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Unsigned(v), &self))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<ColumnRef, E> {
                u64::try_from(v)
                    .map_err(|_| E::invalid_value(serde::de::Unexpected::Signed(v), &self))
                    .and_then(|v| self.visit_u64(v))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<ColumnRef, E> {
                Ok(ColumnRef::Name(v.to_owned()))
            }
        }
        d.deserialize_any(Visitor)
    }
}

impl std::fmt::Display for ColumnRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ColumnRef::Index(i) => write!(f, "#{i}"),
            ColumnRef::Name(n) => write!(f, "`{n}`"),
        }
    }
}

/// Which input column fills which `pairs` column.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ColumnMap {
    #[serde(default)]
    pub sample_id: Option<ColumnRef>,
    #[serde(default)]
    pub caption: Option<ColumnRef>,
    #[serde(default)]
    pub url: Option<ColumnRef>,
    #[serde(default)]
    pub path: Option<ColumnRef>,
    #[serde(default)]
    pub label: Option<ColumnRef>,
    #[serde(default)]
    pub label_text: Option<ColumnRef>,
}

impl ColumnMap {
    fn entries(&self) -> [(&'static str, Option<&ColumnRef>); 6] {
        [
            ("sample_id", self.sample_id.as_ref()),
            ("caption", self.caption.as_ref()),
            ("url", self.url.as_ref()),
            ("path", self.path.as_ref()),
            ("label", self.label.as_ref()),
            ("label_text", self.label_text.as_ref()),
        ]
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadTableConfig {
    pub path: PathPatterns,
    /// Default: from the extension (`.parquet`, `.csv`; anything else is TSV).
    #[serde(default)]
    pub format: Option<Format>,
    /// The first line names the columns. Default: true for CSV, false for TSV.
    #[serde(default)]
    pub header: Option<bool>,
    #[serde(deserialize_with = "column_table")]
    pub columns: ColumnMap,
    /// Keep only the part of the `path` value before this marker (`#` for Flickr8k's
    /// `IMAGE.jpg#N`).
    #[serde(default)]
    pub path_cut_at: Option<String>,
    /// Folder relative image paths resolve against. Default: the table's folder.
    #[serde(default)]
    pub image_root: Option<String>,
    /// Reject rows whose image file does not exist (`missing_file`).
    #[serde(default = "super::yes")]
    pub check_files: bool,
    #[serde(default = "default_source")]
    pub source: String,
    /// Keep only rows whose column (a name, or a 0-based index in a table without a header)
    /// holds one of the listed values, exactly; for several columns, all must. Other rows are
    /// skipped before any check of theirs. Left out of `config.json` when empty (config hashes
    /// of runs without it stay as they were).
    #[serde(default, deserialize_with = "keep_table", skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub keep_where: std::collections::BTreeMap<String, Vec<String>>,
}

/// `keep_where`: column -> a value or a list of values, strings only (a number in a TOML file
/// is told to be quoted: values are matched as text).
fn keep_table<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<std::collections::BTreeMap<String, Vec<String>>, D::Error> {
    struct Values(Vec<String>);
    impl<'de> Deserialize<'de> for Values {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
            struct Visitor;
            impl<'de> serde::de::Visitor<'de> for Visitor {
                type Value = Values;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a string or a list of strings (values match as text: quote numbers, `\"3\"`)")
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<Values, E> {
                    Ok(Values(vec![v.to_owned()]))
                }
                fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Values, A::Error> {
                    let mut out = Vec::new();
                    while let Some(v) = seq.next_element::<serde_json::Value>()? {
                        match v {
                            serde_json::Value::String(s) => out.push(s),
                            other => {
                                return Err(serde::de::Error::invalid_type(
                                    serde::de::Unexpected::Other(&format!("the value {other}")),
                                    &self,
                                ))
                            }
                        }
                    }
                    Ok(Values(out))
                }
            }
            d.deserialize_any(Visitor)
        }
    }
    let map = std::collections::BTreeMap::<String, Values>::deserialize(d)?;
    Ok(map.into_iter().map(|(k, v)| (k, v.0)).collect())
}

/// `columns` as a table only: serde would read a list (`["text", "link"]`) as the fields in
/// order, `sample_id` first, and so map the wrong columns without a word.
fn column_table<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<ColumnMap, D::Error> {
    struct Visitor;
    impl<'de> serde::de::Visitor<'de> for Visitor {
        type Value = ColumnMap;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a table such as `{ sample_id = \"id\", caption = \"text\" }`")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> std::result::Result<ColumnMap, A::Error> {
            ColumnMap::deserialize(serde::de::value::MapAccessDeserializer::new(map))
        }
    }
    d.deserialize_map(Visitor)
}

fn default_source() -> String {
    "table".into()
}

impl ReadTableConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadTable> {
        let files_like = match self.format {
            Some(Format::Csv) => "*.csv",
            Some(Format::Parquet) => "*.parquet",
            _ => "*.tsv",
        };
        let files = expand_inputs(&self.path, problems, "path", files_like);
        let mut mixed = false;
        let format = match self.format {
            Some(format) => format,
            None => {
                let format = files.first().map_or(Format::Tsv, |f| format_of(f));
                if let Some(other) = files.iter().find(|f| format_of(f) != format) {
                    mixed = true;
                    problems.push(
                        "format",
                        format!(
                            "the inputs are of more than one format by their extensions: `{}` reads as {}, `{}` as {}",
                            file_name(other),
                            format_of(other).name(),
                            file_name(&files[0]),
                            format.name()
                        ),
                        Some(
                            "one `read_table` reads one format: set `format` where the extensions mislead (CSV \
                             files named `.txt`), else read the files in separate pipelines"
                                .into(),
                        ),
                    );
                }
                format
            }
        };
        let header = self.header.unwrap_or(format == Format::Csv);
        if self.columns.entries().iter().all(|(_, c)| c.is_none()) {
            problems.push(
                "columns",
                "no column is mapped",
                Some("e.g. `columns = { caption = \"text\", path = \"image\" }`".into()),
            );
        }
        if self.path_cut_at.as_deref() == Some("") {
            problems.push(
                "path_cut_at",
                "`path_cut_at` is empty",
                Some("leave it out to keep the whole value, or give the marker (`#` for Flickr8k)".into()),
            );
        }
        for (key, values) in &self.keep_where {
            if values.is_empty() {
                problems.push(
                    format!("keep_where.{key}"),
                    "no value is listed, so no row would be kept",
                    Some(format!("e.g. `keep_where = {{ {key} = [\"en\"] }}`")),
                );
            }
        }
        if mixed {
            // Each file checked as the first one's format would only add errors of that.
            return None;
        }
        // Names resolve to indexes against each file's own header or schema: files may order
        // their columns differently.
        let mut filters = Vec::new();
        let (indexes, widths): (Vec<[Option<usize>; 6]>, Vec<usize>) = files
            .iter()
            .filter_map(|f| {
                let (ix, width, filter) = self.resolve(f, format, header, problems)?;
                filters.push(filter);
                Some((ix, width))
            })
            .unzip();
        let image_root = self.image_root.as_ref().map(PathBuf::from);
        problems.is_empty().then(|| ReadTable {
            files,
            format,
            header,
            indexes,
            widths,
            filters,
            caption_mapped: self.columns.caption.is_some(),
            mapped: self.columns.entries().iter().filter(|(_, c)| c.is_some()).map(|(name, _)| *name).collect(),
            image_refs: match (&self.columns.path, &self.columns.url) {
                (Some(_), _) => super::ImageRefs::Paths,
                (None, Some(_)) => super::ImageRefs::UrlsOnly,
                (None, None) => super::ImageRefs::Nothing,
            },
            id_mapped: self.columns.sample_id.is_some(),
            path_cut_at: self.path_cut_at.clone(),
            image_root,
            check_files: self.check_files,
            source: self.source.clone(),
        })
    }

    /// The `keep_where` columns as column references (a key of digits is a 0-based index),
    /// each with its config key.
    /// A key of plain digits (`"2"`, not `"02"` or `"+2"`) is a position unless the table names
    /// a column so (`names`).
    fn filter_columns(&self, names: &[String]) -> Vec<(String, ColumnRef)> {
        self.keep_where
            .keys()
            .map(|k| {
                let digits =
                    !k.is_empty() && k.bytes().all(|b| b.is_ascii_digit()) && (k == "0" || !k.starts_with('0'));
                let col = match k.parse::<usize>() {
                    Ok(i) if digits && !names.contains(k) => ColumnRef::Index(i),
                    _ => ColumnRef::Name(k.clone()),
                };
                (format!("keep_where.{k}"), col)
            })
            .collect()
    }

    /// The input column of each mapped `pairs` column in `file`, the number of fields each
    /// TSV line must have (the header's, or the usual width of a headerless file's first
    /// lines) and the `keep_where` columns' indexes with their values, or `None` after
    /// reporting what is missing.
    fn resolve(
        &self,
        file: &Path,
        format: Format,
        header: bool,
        problems: &mut Problems,
    ) -> Option<([Option<usize>; 6], usize, Filter)> {
        // Before the file's names are known: digit keys as positions (for the Parquet type check).
        let filter_columns = self.filter_columns(&[]);
        if format != Format::Parquet
            && super::refuse_non_text(&[file.to_owned()], problems, "path", format == Format::Csv)
        {
            return None;
        }
        let names: std::result::Result<Vec<String>, String> = match format {
            Format::Parquet => parquet::read_schema(file).map_err(|e| e.to_string()).and_then(|schema| {
                // Every mapped and filtering column must read as text.
                let filtering = filter_columns.iter().map(|(key, col)| (key.as_str(), Some(col)));
                for (key, col) in self.columns.entries().into_iter().chain(filtering) {
                    let field = match col {
                        Some(ColumnRef::Name(n)) => schema.field_with_name(n).ok(),
                        Some(ColumnRef::Index(i)) => schema.fields().get(*i).map(|f| f.as_ref()),
                        None => None,
                    };
                    if let Some(f) = field {
                        if !arrow_cast::can_cast_types(f.data_type(), &DataType::Utf8) || f.data_type().is_nested() {
                            return Err(format!(
                                "`{}`: column `{}` (for {key}) is {}, which does not read as text",
                                file_name(file),
                                f.name(),
                                f.data_type()
                            ));
                        }
                    }
                }
                Ok(schema.fields().iter().map(|f| f.name().clone()).collect())
            }),
            Format::Tsv if !header => {
                widest_of_first_lines(file, b'\t', FIRST_LINES).map(|n| (0..n).map(|i| format!("#{i}")).collect())
            }
            Format::Csv if !header => {
                csv_first_widths(file, FIRST_LINES).map(|(n, _)| (0..n).map(|i| format!("#{i}")).collect())
            }
            Format::Tsv => header_fields(file, b'\t'),
            Format::Csv => csv_header(file),
        };
        // A headerless file with no line at all (one shard of many may be) is a table of no
        // rows: as wide as the mapping needs.
        let empty = names.is_err() && !header && format != Format::Parquet && text_is_empty(file);
        let names = match names {
            Err(_) if empty => {
                let filtering = filter_columns.iter().map(|(_, c)| Some(c));
                let widest =
                    self.columns.entries().into_iter().map(|(_, c)| c).chain(filtering).filter_map(|c| match c {
                        Some(ColumnRef::Index(i)) => Some(*i + 1),
                        _ => None,
                    });
                Ok((0..widest.max().unwrap_or(1)).map(|i| format!("#{i}")).collect())
            }
            names => names,
        };
        let names = match names {
            Ok(n) => n,
            Err(e) => {
                problems.push("path", e, None);
                return None;
            }
        };
        let named = header || format == Format::Parquet;
        let mut ok = true;
        // The input column `col` names (`key`: its config key), or `None` after reporting why not.
        let mut locate = |key: &str, col: &ColumnRef, problems: &mut Problems| -> Option<usize> {
            let found = match col {
                ColumnRef::Index(i) if *i < names.len() => Some(*i),
                ColumnRef::Index(_) => None,
                ColumnRef::Name(n) if named => {
                    // A header that names two columns alike: either could be meant.
                    let at: Vec<usize> = names.iter().enumerate().filter(|(_, h)| *h == n).map(|(i, _)| i).collect();
                    if let [first, second, ..] = at[..] {
                        problems.push(
                            key,
                            format!(
                                "column {col} is named twice in the header of `{}` (columns #{first} and #{second})",
                                file_name(file)
                            ),
                            Some(match key.strip_prefix("columns.") {
                                Some(short) => format!(
                                    "name it by position: `{short} = {first}` (0-based), or rename one of them in the file"
                                ),
                                None => format!(
                                    "name it by position: `keep_where = {{ \"{first}\" = ... }}` (0-based), or rename \
                                     one of them in the file"
                                ),
                            }),
                        );
                        ok = false;
                        return None;
                    }
                    at.first().copied()
                }
                ColumnRef::Name(_) => {
                    problems.push(
                        key,
                        format!("column {col} named, but the table has no header"),
                        Some("use a 0-based index, or set `header = true`".into()),
                    );
                    ok = false;
                    return None;
                }
            };
            match found {
                Some(i) if format == Format::Tsv && i >= super::MAX_FIELDS => {
                    problems.push(
                        key,
                        match col {
                            ColumnRef::Name(_) => format!(
                                "column {col} is column #{i} of `{}`; TSV tables are read up to column #{}",
                                file_name(file),
                                super::MAX_FIELDS - 1
                            ),
                            ColumnRef::Index(_) => {
                                format!("column {col}: TSV tables are read up to column #{}", super::MAX_FIELDS - 1)
                            }
                        },
                        Some("cut the table to the columns you need, or convert it to Parquet".into()),
                    );
                    ok = false;
                    None
                }
                Some(i) => Some(i),
                None => {
                    // Header names as a TOML string would spell them (a quoted CSV name may hold a
                    // line break).
                    let shown: Vec<String> = names.iter().map(|n| n.escape_debug().to_string()).collect();
                    let hint = match col {
                        ColumnRef::Name(n) => did_you_mean(n, shown.iter().map(String::as_str)),
                        ColumnRef::Index(_) => None,
                    }
                    .or_else(|| {
                        Some(if named && format != Format::Parquet && names.iter().all(|n| n.trim().is_empty()) {
                            format!("the header of `{}`, its first line, is blank", file_name(file))
                        } else if named {
                            let listed: Vec<String> = shown.iter().map(|n| format!("`{n}`")).collect();
                            format!("`{}` has {} column(s): {}", file_name(file), names.len(), listed.join(", "))
                        } else {
                            format!("the first lines of `{}` have at most {} fields", file_name(file), names.len())
                        })
                    });
                    problems.push(key, format!("missing column {col} in `{}`", file_name(file)), hint);
                    ok = false;
                    None
                }
            }
        };
        let mut indexes = [None; 6];
        for (slot, (key, col)) in self.columns.entries().into_iter().enumerate() {
            if let Some(col) = col {
                indexes[slot] = locate(&format!("columns.{key}"), col, problems);
            }
        }
        let mut filter = Filter::new();
        let filter_columns = if named { self.filter_columns(&names) } else { filter_columns };
        for (key, col) in &filter_columns {
            if let Some(i) = locate(key, col, problems) {
                filter.push((i, self.keep_where[&key["keep_where.".len()..]].iter().cloned().collect()));
            }
        }
        let width = match format {
            _ if empty => Ok(names.len()),
            Format::Tsv if !header => usual_width_of_first_lines(file, b'\t', FIRST_LINES),
            Format::Csv if !header => csv_first_widths(file, FIRST_LINES).map(|(_, usual)| usual),
            _ => Ok(names.len()),
        };
        let width = match width {
            Ok(w) => w,
            Err(e) => {
                problems.push("path", e, None);
                return None;
            }
        };
        let mapped = indexes.iter().flatten().max().map_or(0, |m| m + 1);
        let filtered = filter.iter().map(|(i, _)| i + 1).max().unwrap_or(0);
        let (need, key, what) =
            if filtered > mapped { (filtered, "keep_where", "filtered on") } else { (mapped, "columns", "mapped") };
        if ok && format != Format::Parquet && width < need {
            problems.push(
                key,
                format!(
                    "column #{} is {what}, but most of the first lines of `{}` have {width} field(s)",
                    need - 1,
                    file_name(file)
                ),
                Some("every line must have as many fields as the file's usual width".into()),
            );
            ok = false;
        }
        ok.then_some((indexes, width, filter))
    }
}

/// A mapped Parquet column as text (`schemas/pairs.md`). A timestamp with a time zone (pandas
/// and pyarrow write every tz-aware datetime so) is its UTC instant in RFC 3339,
/// `2020-01-02T03:04:05Z`: Arrow's own cast would need the time-zone database for names such as
/// `Europe/Paris`.
///
/// Also returns the rows whose value cannot be read as text, with Arrow's reason: a timestamp
/// or date outside the dates chrono represents (nanoseconds stored in a millisecond column, say)
/// fails Arrow's cast of the whole column, and one bad value must reject its row, not stop the
/// run (README: a malformed row never does).
fn as_text(
    col: &arrow_array::ArrayRef,
) -> std::result::Result<(arrow_array::ArrayRef, Unreadable), arrow_schema::ArrowError> {
    if let DataType::Timestamp(unit, Some(_)) = col.data_type() {
        let naive = DataType::Timestamp(*unit, None);
        let utc = arrow_array::make_array(col.to_data().into_builder().data_type(naive).build()?);
        let (text, unreadable) = cast_each_value(&utc)?;
        let rfc3339: arrow_array::StringArray =
            text.as_string::<i32>().iter().map(|v| v.map(|v| format!("{v}Z"))).collect();
        return Ok((std::sync::Arc::new(rfc3339), unreadable));
    }
    cast_each_value(col)
}

/// Rows of a column whose value cannot be read as text, with the reason.
type Unreadable = std::collections::BTreeMap<usize, String>;

/// `col` cast to text; where the cast of the whole column fails, each value is cast alone and
/// those that fail are null and listed. A type with no cast to text at all stays an error of
/// the column (its every row would fail the same way).
fn cast_each_value(
    col: &arrow_array::ArrayRef,
) -> std::result::Result<(arrow_array::ArrayRef, Unreadable), arrow_schema::ArrowError> {
    let whole = match arrow_cast::cast(col, &DataType::Utf8) {
        Ok(text) => return Ok((text, Unreadable::new())),
        Err(e) if !arrow_cast::can_cast_types(col.data_type(), &DataType::Utf8) => return Err(e),
        Err(e) => e,
    };
    let mut text = arrow_array::builder::StringBuilder::new();
    let mut unreadable = Unreadable::new();
    for i in 0..col.len() {
        match arrow_cast::cast(&col.slice(i, 1), &DataType::Utf8) {
            Ok(v) => text.append_option(v.as_string::<i32>().iter().next().flatten()),
            Err(e) => {
                unreadable.insert(i, e.to_string());
                text.append_null();
            }
        }
    }
    // The column failed as a whole yet every value alone is fine: not expected, so the
    // column's own error is kept rather than guessed at.
    if unreadable.is_empty() {
        return Err(whole);
    }
    Ok((std::sync::Arc::new(text.finish()), unreadable))
}

/// Value `r` of `col` as it is stored, for the `raw` of an `unreadable_value` reject: the
/// number behind a timestamp, date, time or duration (empty for a type with no such number).
fn stored_value(col: &dyn Array, r: usize) -> Vec<u8> {
    arrow_cast::cast(&col.slice(r, 1), &DataType::Int64)
        .ok()
        .and_then(|v| {
            v.as_primitive_opt::<arrow_array::types::Int64Type>().filter(|v| v.is_valid(0)).map(|v| v.value(0))
        })
        .map(|v| v.to_string().into_bytes())
        .unwrap_or_default()
}

/// Whether `raw` parses to `record` (a CSV record's bytes without their line end do).
fn same_record(raw: &[u8], record: &csv::ByteRecord) -> bool {
    let mut rdr = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(raw);
    let mut again = csv::ByteRecord::new();
    matches!(rdr.read_byte_record(&mut again), Ok(true)) && again.iter().eq(record.iter())
}

/// A file's format by its extension (any case): `.parquet`, `.csv`, anything else is TSV. A
/// compression extension (`.gz`, `.bz2`) is not the format: `x.csv.gz` is a CSV file.
fn format_of(file: &Path) -> Format {
    let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("").to_ascii_lowercase();
    let name = [".gz", ".gzip", ".bz2", ".bz", ".bzip2"].iter().find_map(|c| name.strip_suffix(c)).unwrap_or(&name);
    match Path::new(name).extension().and_then(|e| e.to_str()) {
        Some("parquet") => Format::Parquet,
        Some("csv") => Format::Csv,
        _ => Format::Tsv,
    }
}

/// Whether the text of `file` (decompressed) has no byte.
fn text_is_empty(file: &Path) -> bool {
    crate::io::lines::open_text(file).is_ok_and(|mut f| matches!(f.read(&mut [0u8; 1]), Ok(0)))
}

/// Whether a line of `fields` fields, in a file whose lines have `width`, can hold an id field:
/// not when it has one field where more are expected (no separator at all, as when a space was
/// typed for the tab): that field is the whole line.
fn has_id_field(fields: usize, width: usize) -> bool {
    fields > 1 || width <= 1
}

/// Line ends in `bytes`: LF, CRLF (one) and a lone CR.
fn line_ends(bytes: &[u8]) -> u64 {
    let lf = memchr::memchr_iter(b'\n', bytes).count();
    let lone_cr = memchr::memchr_iter(b'\r', bytes).filter(|&i| bytes.get(i + 1) != Some(&b'\n')).count();
    (lf + lone_cr) as u64
}

/// The most common field count among the first `n` records of a headerless CSV text (the wider
/// on a tie; 0 for no record).
fn usual_csv_width(text: impl Read, n: usize) -> usize {
    let mut rdr = csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(text);
    super::usual_width(rdr.byte_records().take(n).map_while(|r| r.ok()).map(|r| r.len())).unwrap_or(0)
}

/// The widest and the usual field count (see [`usual_csv_width`]) of the first `n` records of a
/// headerless CSV file, quoted separators not counted.
fn csv_first_widths(path: &Path, n: usize) -> std::result::Result<(usize, usize), String> {
    let file = crate::io::lines::open_text(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let mut rdr =
        csv::ReaderBuilder::new().has_headers(false).flexible(true).from_reader(std::io::BufReader::new(file));
    let widths: Vec<usize> = rdr.byte_records().take(n).map_while(|r| r.ok()).map(|r| r.len()).collect();
    match (widths.iter().max(), super::usual_width(widths.iter().copied())) {
        (Some(&widest), Some(usual)) => Ok((widest, usual)),
        _ => Err(format!("`{}` is empty", path.display())),
    }
}

/// The column names on a CSV file's first line (quoted names may hold commas; a leading
/// byte-order mark is not part of the first name).
fn csv_header(path: &Path) -> std::result::Result<Vec<String>, String> {
    let file = crate::io::lines::open_text(path).map_err(|e| format!("cannot read `{}`: {e}", path.display()))?;
    let mut rdr = csv::ReaderBuilder::new().has_headers(true).flexible(true).from_reader(std::io::BufReader::new(file));
    let headers = rdr.byte_headers().map_err(|e| format!("`{}`: {e}", path.display()))?;
    if headers.is_empty() {
        return Err(format!("`{}` is empty", path.display()));
    }
    Ok(headers.iter().map(|h| String::from_utf8_lossy(h).into_owned()).collect())
}

/// The chunks of `files`, one file after another: `open` starts a file, `next` gives its next
/// chunk, or `None` once the file is read. Ids are checked for repeats across all the files.
fn file_chunks<'a, S: Send + 'a>(
    mut files: impl Iterator<Item = (&'a PathBuf, &'a [Option<usize>; 6])> + Send + 'a,
    mut open: impl FnMut(&'a PathBuf, &'a [Option<usize>; 6]) -> Result<S> + Send + 'a,
    mut next: impl FnMut(&mut S, &mut UniqueIds) -> Result<Option<Chunk>> + Send + 'a,
) -> ChunkIter<'a> {
    let mut unique = UniqueIds::default();
    let mut current: Option<S> = None;
    Box::new(std::iter::from_fn(move || loop {
        if current.is_none() {
            let (f, ix) = files.next()?;
            match open(f, ix) {
                Ok(file) => current = Some(file),
                Err(e) => return Some(Err(e)),
            }
        }
        match next(current.as_mut().expect("opened above"), &mut unique) {
            Ok(Some(chunk)) => return Some(Ok(chunk)),
            Ok(None) => current = None,
            Err(e) => return Some(Err(e)),
        }
    }))
}

/// A CSV file's text as its parser reads it, kept from the record being read on, so that each
/// record's raw bytes and line are known exactly while the file streams.
struct SeenText {
    file: TextFile,
    /// The text from byte `from` on, up to where the parser has read.
    bytes: Vec<u8>,
    from: u64,
    /// The parser has read to the end of the text.
    eof: bool,
}

impl Read for SeenText {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.eof |= n == 0 && !buf.is_empty();
        self.bytes.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

impl SeenText {
    /// Where the bytes read so far end, in the text.
    fn end(&self) -> u64 {
        self.from + self.bytes.len() as u64
    }

    /// Bytes `a..b` of the text (both at or after `from`).
    fn slice(&self, a: u64, b: u64) -> &[u8] {
        &self.bytes[(a - self.from) as usize..(b - self.from) as usize]
    }

    /// Lets go of the text before byte `at`, once that is 1 MiB or more.
    fn forget_before(&mut self, at: u64) {
        let k = (at - self.from) as usize;
        if k >= 1 << 20 {
            self.bytes.drain(..k);
            self.from = at;
        }
    }
}

/// A CSV file being read (see [`ReadTable::open_csv`]): the parser over its text, and where it
/// is.
struct CsvFile<'a> {
    path: &'a Path,
    indexes: &'a [Option<usize>; 6],
    filter: &'a Filter,
    rdr: csv::Reader<SeenText>,
    /// Fields every record must have.
    expected: usize,
    /// Fields a record needs for every mapped column.
    need: usize,
    /// Text bytes whose line ends are counted in `line`.
    counted: u64,
    /// Line of the byte at `counted` (1-based).
    line: u64,
    done: bool,
}

pub struct ReadTable {
    files: Vec<PathBuf>,
    format: Format,
    header: bool,
    /// For each file: its column index for sample_id, caption, url, path, label, label_text.
    indexes: Vec<[Option<usize>; 6]>,
    /// For each TSV file: the fields every line must have (see [`ReadTableConfig::resolve`]).
    widths: Vec<usize>,
    /// For each file: the `keep_where` columns' indexes and the values each may hold.
    filters: Vec<Filter>,
    caption_mapped: bool,
    /// The `pairs` columns mapped (`sample_id` is `file#row` when it is not).
    mapped: Vec<&'static str>,
    /// How rows name their images: by the mapped `path`, else the mapped `url`.
    image_refs: super::ImageRefs,
    /// Without a mapped id, rows (rejected ones too) are known by `file#row`.
    id_mapped: bool,
    path_cut_at: Option<String>,
    image_root: Option<PathBuf>,
    check_files: bool,
    source: String,
}

/// `keep_where` resolved against one file: each column's index and the values it may hold (a
/// set: a list of ids may be long, and every row is looked up in it).
type Filter = Vec<(usize, std::collections::HashSet<String>)>;

/// Whether a row is kept: every filter column's value (`value(index)`, `None` for a null or a
/// value that is not text) is one of its listed values.
fn keeps<'v>(filter: &Filter, value: impl Fn(usize) -> Option<&'v str>) -> bool {
    filter.iter().all(|(i, allowed)| value(*i).is_some_and(|v| allowed.contains(v)))
}

/// Turns one record's mapped values into a row or a reject reason.
struct RowMaker<'a> {
    t: &'a ReadTable,
    id: String,
    path: String,
}

impl RowMaker<'_> {
    /// `values[k]` is the value of mapped column `k` (None = null / unmapped). The checks run
    /// in the order of `schemas/rejects.md`; a repeated mapped id (in `unique`, where the caller
    /// checks ids here) is the last of them.
    fn emit(
        &mut self,
        table: &Path,
        row: u64,
        values: [Option<&str>; 6],
        unique: Option<&UniqueIds>,
        out: &mut PairsBuilder,
    ) -> std::result::Result<(), (&'static str, String)> {
        let [id, caption, url, path, label, label_text] = values;
        self.id.clear();
        match id {
            Some(id) if has_words(id) => self.id.push_str(id),
            _ if self.t.id_mapped => return Err(("missing_id", "sample_id is null or empty".into())),
            _ => self.id.push_str(&format!("{}#{row}", file_name(table))),
        }
        if self.t.caption_mapped {
            match caption {
                None => return Err(("missing_caption", "caption is null".into())),
                Some(c) if !has_words(c) => return Err(("empty_caption", "caption has no words".into())),
                _ => {}
            }
        }
        let cut_at = self.t.path_cut_at.as_deref();
        let path = path.map(|p| cut_at.and_then(|m| p.split(m).next()).unwrap_or(p));
        // An empty cell is no path (null), not the image folder.
        let path = match path.filter(|p| !p.is_empty()) {
            Some(p) => {
                let rel = Path::new(p);
                let base = self.t.image_root.as_deref().or_else(|| table.parent()).unwrap_or(Path::new(""));
                let full = if rel.is_absolute() { rel.to_owned() } else { base.join(rel) };
                if self.t.check_files && !full.is_file() {
                    return Err(("missing_file", format!("`{}` {}", full.display(), crate::io::not_a(&full, "file"))));
                }
                self.path = full.to_string_lossy().into_owned();
                Some(self.path.as_str())
            }
            None => None,
        };
        // Likewise an empty or blank URL cell is no URL (null), as in the other readers.
        let url = url.filter(|u| !u.trim().is_empty());
        if self.t.id_mapped && unique.is_some_and(|u| u.seen(&self.id)) {
            return Err(("duplicate_id", DUPLICATE_ID.into()));
        }
        out.push(PairRow { sample_id: &self.id, caption, url, path, label, label_text, ..Default::default() });
        Ok(())
    }
}

impl Reader for ReadTable {
    fn inputs(&self) -> Vec<PathBuf> {
        self.files.clone()
    }

    /// The tables' names and bytes, and, when image paths start at each table's own folder (a
    /// mapped `path`, no `image_root`), those folders as written: the `path` column shows them.
    fn fingerprinter(&self) -> super::Fingerprinter {
        let inputs = self.files.clone();
        let folders: Vec<String> = if self.image_root.is_none() && self.indexes.iter().any(|ix| ix[3].is_some()) {
            let folder = |f: &PathBuf| f.parent().map_or_else(String::new, |p| p.to_string_lossy().into_owned());
            self.files.iter().map(folder).collect()
        } else {
            Vec::new()
        };
        Box::new(move || crate::io::fingerprint_with(&inputs, &folders))
    }

    fn fills(&self, column: &str) -> bool {
        [crate::schema::SAMPLE_ID, crate::schema::SOURCE].contains(&column) || self.mapped.contains(&column)
    }

    fn image_refs(&self) -> super::ImageRefs {
        self.image_refs
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        match self.format {
            Format::Tsv => {
                // Input names are distinct (checked at plan time).
                let by_name: std::collections::HashMap<String, usize> =
                    self.files.iter().enumerate().map(|(i, f)| (file_name(f), i)).collect();
                let skip = u64::from(self.header);
                let chunks =
                    LineChunks::new(self.files.clone(), &self.source, TYPE, skip, move |line, out, _scratch| {
                        let k = by_name[line.file];
                        let indexes = &self.indexes[k];
                        let fields = split_tabs(line.bytes);
                        let (n, width) = (fields.count, self.widths[k]);
                        // The mapped id, where it can be read: rejects carry it.
                        let readable_id = || {
                            if !has_id_field(n, width) {
                                return None;
                            }
                            let i = indexes[0].filter(|&i| self.id_mapped && i < n.min(super::MAX_FIELDS))?;
                            std::str::from_utf8(fields[i]).ok().filter(|id| has_words(id))
                        };
                        let reject = |reason, detail: String| match readable_id() {
                            Some(id) => LineOutcome::RejectWithId { reason, detail: detail.into(), id: id.to_owned() },
                            None => LineOutcome::Reject { reason, detail: detail.into() },
                        };
                        // Every mapped index is below the width and `MAX_FIELDS` (plan time).
                        if n != width {
                            return reject("wrong_field_count", format!("{n} fields, expected {width}"));
                        }
                        // The filter before the UTF-8 check: a row not kept is not looked at (a filter
                        // cell that is not UTF-8 is no value, and not kept).
                        if !keeps(&self.filters[k], |i| std::str::from_utf8(fields[i]).ok()) {
                            return LineOutcome::Skip(KEEP_WHERE);
                        }
                        if line.as_text().is_none() {
                            return reject("invalid_utf8", "line is not valid UTF-8".into());
                        }
                        let values = indexes.map(|i| i.map(|i| line.text(fields[i]).expect("line checked as UTF-8")));
                        let mut maker = RowMaker { t: self, id: String::new(), path: String::new() };
                        // Repeated ids are rejected after the chunk (`with_unique_ids`).
                        match (maker.emit(&self.files[k], line.no, values, None, out), values[0]) {
                            (Ok(()), _) => LineOutcome::Row,
                            (Err((reason, detail)), Some(id)) if self.id_mapped && has_words(id) => {
                                LineOutcome::RejectWithId { reason, detail: detail.into(), id: id.to_owned() }
                            }
                            (Err((reason, detail)), _) => LineOutcome::Reject { reason, detail: detail.into() },
                        }
                    });
                Ok(Box::new(if self.id_mapped { chunks.with_unique_ids() } else { chunks.with_line_ids() }))
            }
            Format::Csv => Ok(file_chunks(
                self.files.iter().zip(&self.indexes),
                |f, ix| self.open_csv(f, ix),
                |file, unique| self.csv_chunk(file, unique),
            )),
            // Each file streams in chunks of `CHUNK_ROWS` rows: a table of any size is never
            // held whole.
            Format::Parquet => Ok(file_chunks(
                self.files.iter().zip(&self.indexes),
                |f, ix| parquet::read_batches_text_unchecked(f, CHUNK_ROWS).map(|batches| (f, ix, batches, 0)),
                |(f, ix, batches, row), unique| {
                    batches.next().map(|b| b.and_then(|b| self.parquet_chunk(f, ix, &b, row, unique))).transpose()
                },
            )),
        }
    }
}

impl ReadTable {
    /// The `keep_where` filter of `file`, one of the tables.
    fn filter_of(&self, file: &Path) -> &Filter {
        let k = self.files.iter().position(|f| f == file).expect("one of the tables");
        &self.filters[k]
    }

    /// A reject of `row`; `id` is the mapped id column's value, where it was read.
    fn reject(
        &self,
        file: &Path,
        row: u64,
        id: Option<&str>,
        reason: &'static str,
        detail: String,
        raw: Vec<u8>,
    ) -> Reject {
        let sample_id = match self.id_mapped {
            true => id.filter(|id| has_words(id)).map(str::to_owned),
            false => Some(format!("{}#{row}", file_name(file))),
        };
        Reject { stage: TYPE, source_file: file_name(file), row, sample_id, reason, detail: detail.into(), raw }
    }

    /// [`RowMaker::emit`], with `duplicate_id` for a mapped id seen in an earlier row (only
    /// rows that became rows count as seen).
    #[allow(clippy::too_many_arguments)]
    fn emit_unique(
        &self,
        maker: &mut RowMaker<'_>,
        unique: &mut UniqueIds,
        file: &Path,
        row: u64,
        values: [Option<&str>; 6],
        out: &mut PairsBuilder,
        raw: impl FnOnce() -> Vec<u8>,
    ) -> Option<Reject> {
        let id = values[0].filter(|_| self.id_mapped);
        match maker.emit(file, row, values, Some(unique), out) {
            Ok(()) => {
                if let Some(id) = id {
                    unique.first_time(id);
                }
                None
            }
            Err((reason, detail)) => Some(self.reject(file, row, id, reason, detail, raw())),
        }
    }

    /// Opens a CSV file for [`ReadTable::csv_chunk`]: its text streams through [`SeenText`], so
    /// that each record's line (where it starts, counting blank lines; a line ends at LF, CRLF
    /// or a lone CR, as the CSV parser's records do) and raw bytes are known exactly. Every
    /// record must have as many fields as the header, or, without one, as most of the first 100
    /// records.
    fn open_csv<'a>(&'a self, path: &'a Path, indexes: &'a [Option<usize>; 6]) -> Result<CsvFile<'a>> {
        let open = || crate::io::lines::open_text(path).map_err(|e| Error::io("cannot read", path, e));
        let width = if self.header { None } else { Some(usual_csv_width(open()?, FIRST_LINES)) };
        let text = SeenText { file: open()?, bytes: Vec::new(), from: 0, eof: false };
        let mut rdr = csv::ReaderBuilder::new().has_headers(self.header).flexible(true).from_reader(text);
        let expected = match width {
            None => rdr.byte_headers().map(|h| h.len()).unwrap_or(0),
            Some(width) => width,
        };
        let filter = self.filter_of(path);
        let need = indexes.iter().flatten().chain(filter.iter().map(|(i, _)| i)).max().map_or(0, |m| m + 1);
        Ok(CsvFile { path, indexes, filter, rdr, expected, need, counted: 0, line: 1, done: false })
    }

    /// The next chunk of `file` ([`CHUNK_ROWS`] rows, with the rejects among them), or `None`
    /// once the file is read.
    fn csv_chunk(&self, file: &mut CsvFile<'_>, unique: &mut UniqueIds) -> Result<Option<Chunk>> {
        if file.done {
            return Ok(None);
        }
        let (path, indexes, expected, filter) = (file.path, file.indexes, file.expected, file.filter);
        let mut skipped = 0u64;
        let mut maker = RowMaker { t: self, id: String::new(), path: String::new() };
        let mut out = PairsBuilder::new(&self.source);
        let mut rejects = Vec::new();
        let mut record = csv::ByteRecord::new();
        while out.len() < CHUNK_ROWS {
            match file.rdr.read_byte_record(&mut record) {
                Ok(false) => {
                    file.done = true;
                    break;
                }
                Ok(true) => {}
                // The text could not be read (a compressed file damaged past its start).
                Err(e) if e.is_io_error() => {
                    let csv::ErrorKind::Io(e) = e.into_kind() else { unreachable!("an I/O error") };
                    return Err(Error::io("cannot read", path, e));
                }
                Err(e) => return Err(Error::data(format!("`{}`: {e}", path.display()))),
            }
            let text = file.rdr.get_ref();
            let end = file.rdr.position().byte().min(text.end());
            // A record's position can be that of the line ends (blank lines, the `\n` of a CRLF)
            // before it.
            let mut start = record.position().map_or(0, |p| p.byte()).clamp(file.counted, end);
            while start < end && matches!(text.slice(start, start + 1), b"\r" | b"\n") {
                start += 1;
            }
            // `line` is the line of byte `counted` of the text.
            file.line += line_ends(text.slice(file.counted, start));
            file.counted = start;
            let line = file.line;
            let whole = text.slice(start, end);
            let mut raw = whole;
            while let Some(r) = raw.strip_suffix(b"\n").or_else(|| raw.strip_suffix(b"\r")) {
                raw = r;
            }
            // The last record may end inside an open quote: its line ends are then the field's.
            let last = text.eof && end == text.end();
            if last && raw.len() < whole.len() && raw.contains(&b'"') && !same_record(raw, &record) {
                raw = whole;
            }
            let raw = raw.to_vec();
            file.rdr.get_mut().forget_before(start);
            // The mapped id, where it can be read: rejects carry it.
            let id = indexes[0]
                .filter(|_| has_id_field(record.len(), expected))
                .and_then(|i| record.get(i))
                .and_then(|id| std::str::from_utf8(id).ok());
            if record.len() != expected || record.len() < file.need {
                let d = format!("{} fields, expected {expected}", record.len());
                rejects.push(self.reject(path, line, id, "wrong_field_count", d, raw));
                continue;
            }
            // The filter before the UTF-8 check, as for TSV.
            if !keeps(filter, |i| record.get(i).and_then(|f| std::str::from_utf8(f).ok())) {
                skipped += 1;
                continue;
            }
            let Ok(fields) = record.iter().map(std::str::from_utf8).collect::<std::result::Result<Vec<&str>, _>>()
            else {
                rejects.push(self.reject(path, line, id, "invalid_utf8", "record is not valid UTF-8".into(), raw));
                continue;
            };
            let values = indexes.map(|i| i.and_then(|i| fields.get(i).copied()));
            if let Some(r) = self.emit_unique(&mut maker, unique, path, line, values, &mut out, || raw) {
                rejects.push(r);
            }
        }
        Ok(Some(with_skipped(chunk_of(out.finish(), rejects), skipped)))
    }

    /// One batch of a Parquet file as a chunk; `row` is the file's row index of the batch's
    /// first row, and is moved past the batch.
    fn parquet_chunk(
        &self,
        path: &Path,
        indexes: &[Option<usize>; 6],
        batch: &arrow_array::RecordBatch,
        row: &mut u64,
        unique: &mut UniqueIds,
    ) -> Result<Chunk> {
        let mut maker = RowMaker { t: self, id: String::new(), path: String::new() };
        let mut out = PairsBuilder::new(&self.source);
        let mut rejects = Vec::new();
        let (cols, unreadable): (Vec<Option<arrow_array::ArrayRef>>, Vec<Unreadable>) = indexes
            .iter()
            .map(|i| match i {
                None => Ok((None, Unreadable::new())),
                Some(i) => as_text(batch.column(*i)).map(|(text, bad)| (Some(text), bad)).map_err(|e| {
                    let name = batch.schema().field(*i).name().clone();
                    Error::data(format!("`{}`: column `{name}` cannot be read as text: {e}", path.display()))
                }),
            })
            .collect::<Result<Vec<_>>>()?
            .into_iter()
            .unzip();
        // The `keep_where` columns as text, by column index (a value that is not text is null:
        // its row is not kept).
        let filter = self.filter_of(path);
        let filter_text: std::collections::HashMap<usize, arrow_array::ArrayRef> = filter
            .iter()
            .map(|(i, _)| {
                as_text(batch.column(*i)).map(|(text, _)| (*i, text)).map_err(|e| {
                    let name = batch.schema().field(*i).name().clone();
                    Error::data(format!("`{}`: column `{name}` cannot be read as text: {e}", path.display()))
                })
            })
            .collect::<Result<_>>()?;
        let mut skipped = 0u64;
        for r in 0..batch.num_rows() {
            let value = |i: usize| {
                let c = filter_text[&i].as_string::<i32>();
                c.is_valid(r).then(|| c.value(r))
            };
            if !keeps(filter, value) {
                skipped += 1;
                *row += 1;
                continue;
            }
            // A value the cast to text turned into a null was not text: bytes that are not
            // UTF-8 (in a binary column, or in a text column whose writer did not check them:
            // text columns are read as bytes), kept as they were.
            let not_text = indexes.iter().zip(&cols).zip(&unreadable).find_map(|((i, c), bad)| {
                let (i, c) = (i.as_ref()?, c.as_ref()?);
                let orig = batch.column(*i);
                // (A column of type Null, as pyarrow writes an all-None one, is nulls.)
                let valid = orig.data_type() != &DataType::Null && orig.is_valid(r);
                (valid && !c.is_valid(r) && !bad.contains_key(&r)).then_some(orig)
            });
            if let Some(orig) = not_text {
                // Through a cast of the one value, so that a dictionary of bytes (a categorical
                // column) gives its bytes as a plain binary column does.
                let raw = arrow_cast::cast(&orig.slice(r, 1), &DataType::Binary)
                    .ok()
                    .and_then(|b| b.as_binary::<i32>().iter().next().flatten().map(<[u8]>::to_vec))
                    .unwrap_or_default();
                let id = cols[0].as_ref().map(|c| c.as_string::<i32>()).filter(|c| c.is_valid(r)).map(|c| c.value(r));
                rejects.push(self.reject(
                    path,
                    *row,
                    id,
                    "invalid_utf8",
                    "a mapped value is not UTF-8 text".into(),
                    raw,
                ));
                *row += 1;
                continue;
            }
            // A value that is there but cannot be read as text (see `as_text`): its row only.
            let cannot_read = indexes.iter().zip(&unreadable).find_map(|(i, bad)| Some((i.as_ref()?, bad.get(&r)?)));
            if let Some((&i, why)) = cannot_read {
                let name = batch.schema().field(i).name().clone();
                let id = cols[0].as_ref().map(|c| c.as_string::<i32>()).filter(|c| c.is_valid(r)).map(|c| c.value(r));
                let detail = format!("column `{name}`: the value cannot be read as text: {why}");
                let raw = stored_value(batch.column(i).as_ref(), r);
                rejects.push(self.reject(path, *row, id, "unreadable_value", detail, raw));
                *row += 1;
                continue;
            }
            let values: [Option<&str>; 6] = std::array::from_fn(|k| {
                cols[k].as_ref().and_then(|c| {
                    let s = c.as_string::<i32>();
                    s.is_valid(r).then(|| s.value(r))
                })
            });
            let raw = || serde_json::to_vec(&values).unwrap_or_default();
            if let Some(r) = self.emit_unique(&mut maker, unique, path, *row, values, &mut out, raw) {
                rejects.push(r);
            }
            *row += 1;
        }
        Ok(with_skipped(chunk_of(out.finish(), rejects), skipped))
    }
}

/// `chunk` with `n` rows skipped by `keep_where`.
fn with_skipped(mut chunk: Chunk, n: u64) -> Chunk {
    if n > 0 {
        *chunk.skipped.entry(KEEP_WHERE).or_default() += n;
    }
    chunk
}

/// The skip reason of rows `keep_where` leaves out.
const KEEP_WHERE: &str = "keep_where";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_format_is_the_extension_before_a_compression_extension() {
        let cases = [
            ("t.parquet", Format::Parquet),
            ("t.CSV", Format::Csv),
            ("t.tsv", Format::Tsv),
            ("t.txt", Format::Tsv),
            ("t.csv.gz", Format::Csv),
            ("t.csv.GZIP", Format::Csv),
            ("t.csv.bz2", Format::Csv),
            ("t.csv.bz", Format::Csv),
            ("t.csv.bzip2", Format::Csv),
            ("t.tsv.gz", Format::Tsv),
            ("t.gz", Format::Tsv),
        ];
        for (name, format) in cases {
            assert_eq!(format_of(Path::new(name)), format, "{name}");
        }
    }
}
