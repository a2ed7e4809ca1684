//! `read_table`: any Parquet, TSV or CSV table of pairs, with a column mapping onto the `pairs`
//! schema — e.g. Flickr8k's `Flickr8k.token.txt` (`IMAGE.jpg#N<TAB>caption`) or a CSV export.
//!
//! Columns are named (header / Parquet field) or given as 0-based indexes. Without a
//! `sample_id` column the id is `<file name>#<row>`: the 1-based line for TSV, the line a record
//! starts on for CSV, the 0-based row for Parquet. Relative image paths resolve against
//! `image_root`, or else the table's own folder; with `check_files` a row whose image file does
//! not exist is a `missing_file` reject.

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::Array;
use arrow_schema::DataType;
use serde::{Deserialize, Serialize};

use super::{
    chunk_of, expand_inputs, has_words, header_fields, split_tabs, widest_of_first_lines, ChunkIter, LineChunks,
    LineOutcome, Problems, Reader, CHUNK_ROWS,
};
use crate::error::{did_you_mean, Error, Result};
use crate::io::{file_name, parquet, PathPatterns};
use crate::schema::{Chunk, PairRow, PairsBuilder, Reject};

pub const TYPE: &str = "read_table";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    Parquet,
    Tsv,
    Csv,
}

/// A column by header name or 0-based index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ColumnRef {
    Index(usize),
    Name(String),
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
    pub columns: ColumnMap,
    /// Keep only the part of the `path` value before this marker (`#` for Flickr8k's
    /// `IMAGE.jpg#N`).
    #[serde(default)]
    pub path_cut_at: Option<String>,
    /// Folder relative image paths resolve against. Default: the table's folder.
    #[serde(default)]
    pub image_root: Option<String>,
    /// Reject rows whose image file does not exist (`missing_file`).
    #[serde(default = "yes")]
    pub check_files: bool,
    #[serde(default = "default_source")]
    pub source: String,
}

fn yes() -> bool {
    true
}
fn default_source() -> String {
    "table".into()
}

impl ReadTableConfig {
    pub fn build(&self, problems: &mut Problems) -> Option<ReadTable> {
        let files = expand_inputs(&self.path, problems, "path");
        let format =
            self.format.unwrap_or_else(|| match files.first().and_then(|f| f.extension()).and_then(|e| e.to_str()) {
                Some("parquet") => Format::Parquet,
                Some("csv") => Format::Csv,
                _ => Format::Tsv,
            });
        let header = self.header.unwrap_or(format == Format::Csv);
        if self.columns.entries().iter().all(|(_, c)| c.is_none()) {
            problems.push(
                "columns",
                "no column is mapped",
                Some("e.g. `columns = { caption = \"text\", path = \"image\" }`".into()),
            );
        }
        // Resolve names to indexes against the first file's header or schema.
        let mut indexes = [None; 6];
        if let Some(first) = files.first() {
            let names: std::result::Result<Vec<String>, String> = match format {
                Format::Parquet => parquet::read_schema(first)
                    .map(|s| s.fields().iter().map(|f| f.name().clone()).collect())
                    .map_err(|e| e.to_string()),
                Format::Tsv if !header => {
                    widest_of_first_lines(first, b'\t', 100).map(|n| (0..n).map(|i| format!("#{i}")).collect())
                }
                Format::Csv if !header => {
                    widest_of_first_lines(first, b',', 100).map(|n| (0..n).map(|i| format!("#{i}")).collect())
                }
                Format::Tsv => header_fields(first, b'\t'),
                Format::Csv => header_fields(first, b','),
            };
            match names {
                Err(e) => problems.push("path", e, None),
                Ok(names) => {
                    let named = header || format == Format::Parquet;
                    for (slot, (key, col)) in self.columns.entries().into_iter().enumerate() {
                        let Some(col) = col else { continue };
                        let found = match col {
                            ColumnRef::Index(i) if *i < names.len() => Some(*i),
                            ColumnRef::Index(_) => None,
                            ColumnRef::Name(n) if named => names.iter().position(|h| h == n),
                            ColumnRef::Name(_) => {
                                problems.push(
                                    format!("columns.{key}"),
                                    format!("column {col} named, but the table has no header"),
                                    Some("use a 0-based index, or set `header = true`".into()),
                                );
                                continue;
                            }
                        };
                        match found {
                            Some(i) => indexes[slot] = Some(i),
                            None => {
                                let hint = match col {
                                    ColumnRef::Name(n) => did_you_mean(n, names.iter().map(String::as_str)),
                                    ColumnRef::Index(_) => None,
                                }
                                .or_else(|| {
                                    Some(if named {
                                        format!(
                                            "`{}` has {} columns: {}",
                                            file_name(first),
                                            names.len(),
                                            names.join(", ")
                                        )
                                    } else {
                                        format!(
                                            "the first lines of `{}` have at most {} fields",
                                            file_name(first),
                                            names.len()
                                        )
                                    })
                                });
                                problems.push(
                                    format!("columns.{key}"),
                                    format!("missing column {col} in `{}`", file_name(first)),
                                    hint,
                                );
                            }
                        }
                    }
                }
            }
        }
        let image_root = self.image_root.as_ref().map(PathBuf::from);
        problems.is_empty().then(|| ReadTable {
            files,
            format,
            header,
            indexes,
            path_cut_at: self.path_cut_at.clone(),
            image_root,
            check_files: self.check_files,
            source: self.source.clone(),
        })
    }
}

pub struct ReadTable {
    files: Vec<PathBuf>,
    format: Format,
    header: bool,
    /// Input column index for sample_id, caption, url, path, label, label_text.
    indexes: [Option<usize>; 6],
    path_cut_at: Option<String>,
    image_root: Option<PathBuf>,
    check_files: bool,
    source: String,
}

/// Turns one record's mapped values into a row or a reject reason.
struct RowMaker<'a> {
    t: &'a ReadTable,
    id: String,
    path: String,
}

impl RowMaker<'_> {
    /// `values[k]` is the value of mapped column `k` (None = null / unmapped).
    fn emit(
        &mut self,
        table: &Path,
        row: u64,
        values: [Option<&str>; 6],
        out: &mut PairsBuilder,
    ) -> std::result::Result<(), (&'static str, String)> {
        let [id, caption, url, path, label, label_text] = values;
        if self.t.indexes[1].is_some() {
            match caption {
                None => return Err(("missing_caption", "caption is null".into())),
                Some(c) if !has_words(c) => return Err(("empty_caption", "caption has no words".into())),
                _ => {}
            }
        }
        self.id.clear();
        match id {
            Some(id) => self.id.push_str(id),
            None => self.id.push_str(&format!("{}#{row}", file_name(table))),
        }
        let path = match path {
            Some(p) => {
                let p = match &self.t.path_cut_at {
                    Some(m) => p.split(m.as_str()).next().unwrap_or(p),
                    None => p,
                };
                let rel = Path::new(p);
                let base = self.t.image_root.as_deref().or_else(|| table.parent()).unwrap_or(Path::new(""));
                let full = if rel.is_absolute() { rel.to_owned() } else { base.join(rel) };
                if self.t.check_files && !full.is_file() {
                    return Err(("missing_file", format!("`{}` does not exist", full.display())));
                }
                self.path = full.to_string_lossy().into_owned();
                Some(self.path.as_str())
            }
            None => None,
        };
        out.push(PairRow { sample_id: &self.id, caption, url, path, label, label_text, ..Default::default() });
        Ok(())
    }
}

impl Reader for ReadTable {
    fn inputs(&self) -> Vec<PathBuf> {
        self.files.clone()
    }

    fn open(&self) -> Result<ChunkIter<'_>> {
        match self.format {
            Format::Tsv => {
                let by_name: std::collections::HashMap<String, PathBuf> =
                    self.files.iter().map(|f| (file_name(f), f.clone())).collect();
                let skip = u64::from(self.header);
                Ok(Box::new(LineChunks::new(
                    self.files.clone(),
                    &self.source,
                    TYPE,
                    skip,
                    move |line, out, _scratch| {
                        if line.as_text().is_none() {
                            return LineOutcome::Reject {
                                reason: "invalid_utf8",
                                detail: "line is not valid UTF-8".into(),
                            };
                        }
                        let fields = split_tabs(line.bytes);
                        let n = fields.count;
                        let need = self.indexes.iter().flatten().max().map_or(0, |m| m + 1);
                        if need > super::MAX_FIELDS {
                            return LineOutcome::Reject {
                                reason: "wrong_field_count",
                                detail: format!("column index beyond {}", super::MAX_FIELDS).into(),
                            };
                        }
                        if n < need {
                            return LineOutcome::Reject {
                                reason: "wrong_field_count",
                                detail: format!("{n} fields, need at least {need}").into(),
                            };
                        }
                        let values =
                            self.indexes.map(|i| i.map(|i| line.text(fields[i]).expect("line checked as UTF-8")));
                        let mut maker = RowMaker { t: self, id: String::new(), path: String::new() };
                        match maker.emit(&by_name[line.file], line.no, values, out) {
                            Ok(()) => LineOutcome::Row,
                            Err((reason, detail)) => LineOutcome::Reject { reason, detail: detail.into() },
                        }
                    },
                )))
            }
            Format::Csv => Ok(Box::new(self.files.iter().flat_map(move |f| match self.read_csv(f) {
                Ok(chunks) => chunks.into_iter().map(Ok).collect::<Vec<_>>(),
                Err(e) => vec![Err(e)],
            }))),
            Format::Parquet => Ok(Box::new(self.files.iter().map(move |f| self.read_parquet(f)))),
        }
    }
}

impl ReadTable {
    fn reject(&self, file: &Path, row: u64, reason: &'static str, detail: String, raw: Vec<u8>) -> Reject {
        Reject { stage: TYPE, source_file: file_name(file), row, sample_id: None, reason, detail: detail.into(), raw }
    }

    fn read_csv(&self, path: &Path) -> Result<Vec<Chunk>> {
        let mut rdr = csv::ReaderBuilder::new()
            .has_headers(self.header)
            .flexible(true)
            .from_path(path)
            .map_err(|e| Error::data(format!("cannot read `{}`: {e}", path.display())))?;
        let expected = rdr.byte_headers().map(|h| h.len()).unwrap_or(0);
        let mut maker = RowMaker { t: self, id: String::new(), path: String::new() };
        let mut out = PairsBuilder::new(&self.source);
        let mut rejects = Vec::new();
        let mut chunks = Vec::new();
        let mut record = csv::ByteRecord::new();
        loop {
            match rdr.read_byte_record(&mut record) {
                Ok(false) => break,
                Ok(true) => {}
                Err(e) => return Err(Error::data(format!("`{}`: {e}", path.display()))),
            }
            let line = record.position().map_or(0, |p| p.line());
            let raw = record.iter().collect::<Vec<_>>().join(&b","[..]);
            if self.header && record.len() != expected {
                let d = format!("{} fields, expected {expected}", record.len());
                rejects.push(self.reject(path, line, "wrong_field_count", d, raw));
                continue;
            }
            let Ok(fields) = record.iter().map(std::str::from_utf8).collect::<std::result::Result<Vec<&str>, _>>()
            else {
                rejects.push(self.reject(path, line, "invalid_utf8", "record is not valid UTF-8".into(), raw));
                continue;
            };
            let values = self.indexes.map(|i| i.and_then(|i| fields.get(i).copied()));
            if let Err((reason, detail)) = maker.emit(path, line, values, &mut out) {
                rejects.push(self.reject(path, line, reason, detail, raw));
            }
            if out.len() >= CHUNK_ROWS {
                chunks.push(chunk_of(out.finish(), std::mem::take(&mut rejects)));
            }
        }
        chunks.push(chunk_of(out.finish(), rejects));
        Ok(chunks)
    }

    fn read_parquet(&self, path: &Path) -> Result<Chunk> {
        let mut maker = RowMaker { t: self, id: String::new(), path: String::new() };
        let mut out = PairsBuilder::new(&self.source);
        let mut rejects = Vec::new();
        let mut row = 0u64;
        for batch in parquet::read_file(path)? {
            let cols: Vec<Option<arrow_array::ArrayRef>> = self
                .indexes
                .iter()
                .map(|i| i.map(|i| arrow_cast::cast(batch.column(i), &DataType::Utf8)).transpose())
                .collect::<std::result::Result<_, _>>()?;
            for r in 0..batch.num_rows() {
                let values: [Option<&str>; 6] = std::array::from_fn(|k| {
                    cols[k].as_ref().and_then(|c| {
                        let s = c.as_string::<i32>();
                        s.is_valid(r).then(|| s.value(r))
                    })
                });
                if let Err((reason, detail)) = maker.emit(path, row, values, &mut out) {
                    let raw = serde_json::to_vec(&values).unwrap_or_default();
                    rejects.push(self.reject(path, row, reason, detail, raw));
                }
                row += 1;
            }
        }
        Ok(chunk_of(out.finish(), rejects))
    }
}
