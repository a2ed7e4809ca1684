//! Table schemas shared by all stages (documented for users in `schemas/`).
//!
//! * `pairs` — what every reader emits: one row per image(-caption) pair.
//! * `bow` — `pairs` plus `original_caption` and `split`, written by the BoW stage.
//! * `rejects` — every input row that did not make it into the output, with its reason.
//!
//! Stages pass [`Chunk`]s: an Arrow record batch plus the rejects found while making it, so a
//! row is always either in a batch or in a rejects list ("nothing lost", DESIGN.md).

use std::sync::{Arc, OnceLock};

use arrow_array::builder::{BinaryBuilder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};

pub const SAMPLE_ID: &str = "sample_id";
pub const SOURCE: &str = "source";
pub const CAPTION: &str = "caption";
pub const URL: &str = "url";
pub const PATH: &str = "path";
pub const SHARD: &str = "shard";
pub const KEY: &str = "key";
pub const LABEL: &str = "label";
pub const LABEL_TEXT: &str = "label_text";
pub const ORIGINAL_CAPTION: &str = "original_caption";
pub const SPLIT: &str = "split";

/// The `pairs` schema (see `schemas/pairs.md`).
pub fn pairs() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new(SAMPLE_ID, DataType::Utf8, false),
            Field::new(SOURCE, DataType::Utf8, false),
            Field::new(CAPTION, DataType::Utf8, true),
            Field::new(URL, DataType::Utf8, true),
            Field::new(PATH, DataType::Utf8, true),
            Field::new(SHARD, DataType::Utf8, true),
            Field::new(KEY, DataType::Utf8, true),
            Field::new(LABEL, DataType::Utf8, true),
            Field::new(LABEL_TEXT, DataType::Utf8, true),
        ]))
    })
    .clone()
}

/// One row of the `pairs` schema, borrowed.
#[derive(Debug, Clone, Copy, Default)]
pub struct PairRow<'a> {
    pub sample_id: &'a str,
    pub caption: Option<&'a str>,
    pub url: Option<&'a str>,
    pub path: Option<&'a str>,
    pub shard: Option<&'a str>,
    pub key: Option<&'a str>,
    pub label: Option<&'a str>,
    pub label_text: Option<&'a str>,
}

/// Builds `pairs` record batches row by row.
pub struct PairsBuilder {
    source: String,
    id: StringBuilder,
    src: StringBuilder,
    /// caption, url, path, shard, key, label, label_text: a builder is only fed once its
    /// column got a first value (earlier rows are backfilled with nulls), so the columns a
    /// format never fills cost nothing per row.
    optional: [Option<StringBuilder>; 7],
    len: usize,
    /// Expected rows and bytes per batch, to size new builders once.
    capacity: (usize, usize),
}

impl PairsBuilder {
    pub fn new(source: &str) -> Self {
        Self::with_capacity(source, 1024, 64 * 1024)
    }

    /// A builder expecting about `rows` rows per batch and `bytes` bytes per string column.
    pub fn with_capacity(source: &str, rows: usize, bytes: usize) -> Self {
        PairsBuilder {
            source: source.to_owned(),
            id: StringBuilder::with_capacity(rows, bytes / 4),
            src: StringBuilder::with_capacity(rows, rows * source.len()),
            optional: Default::default(),
            len: 0,
            capacity: (rows, bytes),
        }
    }

    pub fn push(&mut self, r: PairRow<'_>) {
        self.id.append_value(r.sample_id);
        self.src.append_value(&self.source);
        let values = [r.caption, r.url, r.path, r.shard, r.key, r.label, r.label_text];
        for (slot, v) in self.optional.iter_mut().zip(values) {
            match (slot.as_mut(), v) {
                (Some(b), v) => b.append_option(v),
                (None, Some(v)) => {
                    let mut b = StringBuilder::with_capacity(self.capacity.0, self.capacity.1);
                    b.append_nulls(self.len);
                    b.append_value(v);
                    *slot = Some(b);
                }
                (None, None) => {}
            }
        }
        self.len += 1;
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Returns the rows pushed so far as a batch and starts a new one.
    pub fn finish(&mut self) -> RecordBatch {
        let n = self.len;
        let mut cols: Vec<ArrayRef> = vec![Arc::new(self.id.finish()), Arc::new(self.src.finish())];
        for slot in self.optional.iter_mut() {
            cols.push(match slot.take() {
                Some(mut b) => Arc::new(b.finish()),
                None => arrow_array::new_null_array(&DataType::Utf8, n),
            });
        }
        self.len = 0;
        RecordBatch::try_new(pairs(), cols).expect("builder columns match the pairs schema")
    }
}

/// An input row (or a row dropped by a stage) that is not in the output, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// The stage that set the row aside (`read_cc_tsv`, `bow`, ...).
    pub stage: &'static str,
    /// File the row came from: the input file's name (a tar shard's, for its members; the
    /// root folder's, for ImageNet-21k), empty for stages after the reader.
    pub source_file: String,
    /// Readers: 1-based line for text files (CSV: where the record starts), 0-based row for
    /// Parquet, member index for tars, 0-based listing position for ImageNet-21k. Later stages:
    /// 0-based index of the row in the stage's input (`schemas/rejects.md`).
    pub row: u64,
    pub sample_id: Option<String>,
    /// Machine-readable reason (`wrong_field_count`, `invalid_utf8`, `empty_caption`, ...).
    pub reason: &'static str,
    /// Human-readable detail, e.g. `3 fields, expected 2`.
    pub detail: std::borrow::Cow<'static, str>,
    /// The raw input bytes (the line, or the caption for stage rejects), kept verbatim.
    pub raw: Vec<u8>,
}

/// The `rejects` schema (see `schemas/rejects.md`).
pub fn rejects() -> SchemaRef {
    static S: OnceLock<SchemaRef> = OnceLock::new();
    S.get_or_init(|| {
        Arc::new(Schema::new(vec![
            Field::new("stage", DataType::Utf8, false),
            Field::new("source_file", DataType::Utf8, false),
            Field::new("row", DataType::UInt64, false),
            Field::new(SAMPLE_ID, DataType::Utf8, true),
            Field::new("reason", DataType::Utf8, false),
            Field::new("detail", DataType::Utf8, false),
            Field::new("raw", DataType::Binary, false),
        ]))
    })
    .clone()
}

/// `name` as a `&'static str`, for the `stage` of rejects: a stage's name in a pipeline file.
/// Each distinct name is kept once for the life of the process (a few bytes per name).
pub fn stage_name(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().expect("stage names lock");
    if let Some(n) = names.iter().find(|n| **n == name) {
        return n;
    }
    let n: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(n);
    n
}

/// Rows set aside, kept by column: a stage that sets many aside (the BoW stage drops ~23% of
/// CC3M's pairs) adds each without allocating, and the `rejects` batch is built in one go.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rejects {
    stage: Vec<&'static str>,
    source_file: Vec<String>,
    row: Vec<u64>,
    /// The `sample_id`s one after another, where each row's ends, and whether it has one.
    ids: String,
    id_ends: Vec<usize>,
    has_id: Vec<bool>,
    reason: Vec<&'static str>,
    detail: Vec<std::borrow::Cow<'static, str>>,
    /// The raw bytes one after another, and where each row's end.
    raw: Vec<u8>,
    raw_ends: Vec<usize>,
}

/// One row of [`Rejects`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RejectRef<'a> {
    pub stage: &'static str,
    pub source_file: &'a str,
    pub row: u64,
    pub sample_id: Option<&'a str>,
    pub reason: &'static str,
    pub detail: &'a str,
    pub raw: &'a [u8],
}

impl Rejects {
    pub fn len(&self) -> usize {
        self.row.len()
    }

    /// Adds which rows were rejected (file and row), by whom and why (not the details or bytes)
    /// to `h`.
    pub fn digest_into(&self, h: &mut xxhash_rust::xxh3::Xxh3) {
        h.update(&(self.len() as u64).to_le_bytes());
        let rows = self.row.iter().zip(&self.source_file);
        for (((row, file), stage), reason) in rows.zip(&self.stage).zip(&self.reason) {
            h.update(file.as_bytes());
            h.update(b"\0");
            h.update(&row.to_le_bytes());
            h.update(stage.as_bytes());
            h.update(b"\0");
            h.update(reason.as_bytes());
            h.update(b"\0");
        }
    }

    pub fn is_empty(&self) -> bool {
        self.row.is_empty()
    }

    pub fn push(&mut self, r: Reject) {
        self.push_row(r.stage, r.source_file, r.row, r.sample_id.as_deref(), r.reason, r.detail, &r.raw);
    }

    /// [`Rejects::push`] from borrowed parts: only the bytes are copied.
    #[allow(clippy::too_many_arguments)]
    pub fn push_row(
        &mut self,
        stage: &'static str,
        source_file: String,
        row: u64,
        sample_id: Option<&str>,
        reason: &'static str,
        detail: std::borrow::Cow<'static, str>,
        raw: &[u8],
    ) {
        self.stage.push(stage);
        self.source_file.push(source_file);
        self.row.push(row);
        self.ids.push_str(sample_id.unwrap_or(""));
        self.id_ends.push(self.ids.len());
        self.has_id.push(sample_id.is_some());
        self.reason.push(reason);
        self.detail.push(detail);
        self.raw.extend_from_slice(raw);
        self.raw_ends.push(self.raw.len());
    }

    /// Names the stage of rows `from..` `name` (a stage named in the pipeline file: its rejects
    /// carry that name, as its report does, not its type).
    pub fn name_stage_from(&mut self, from: usize, name: &'static str) {
        for s in &mut self.stage[from..] {
            *s = name;
        }
    }

    /// The rows of `self` and `other`, each already in `row` order, merged in `row` order
    /// (`self`'s first on equal rows).
    pub fn merged_by_row(self, other: Rejects) -> Rejects {
        if other.is_empty() {
            return self;
        }
        let mut out = Rejects::default();
        let (mut i, mut j) = (0, 0);
        while i < self.len() || j < other.len() {
            if j == other.len() || (i < self.len() && self.row[i] <= other.row[j]) {
                out.push_from(&self, i);
                i += 1;
            } else {
                out.push_from(&other, j);
                j += 1;
            }
        }
        out
    }

    /// Appends row `i` of `from`.
    fn push_from(&mut self, from: &Rejects, i: usize) {
        let r = from.get(i);
        self.push_row(r.stage, r.source_file.to_owned(), r.row, r.sample_id, r.reason, from.detail[i].clone(), r.raw);
    }

    pub fn get(&self, i: usize) -> RejectRef<'_> {
        let start = |ends: &[usize]| if i == 0 { 0 } else { ends[i - 1] };
        let (id_start, raw_start) = (start(&self.id_ends), start(&self.raw_ends));
        RejectRef {
            stage: self.stage[i],
            source_file: &self.source_file[i],
            row: self.row[i],
            sample_id: self.has_id[i].then(|| &self.ids[id_start..self.id_ends[i]]),
            reason: self.reason[i],
            detail: &self.detail[i],
            raw: &self.raw[raw_start..self.raw_ends[i]],
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = RejectRef<'_>> {
        (0..self.len()).map(|i| self.get(i))
    }

    /// (stage, reason) of each row, in order.
    pub fn reasons(&self) -> impl Iterator<Item = (&'static str, &'static str)> + '_ {
        self.stage.iter().copied().zip(self.reason.iter().copied())
    }

    /// Bytes held (for memory budgets): the text and raw bytes, and each row's entries.
    pub fn bytes(&self) -> usize {
        let per_row = std::mem::size_of::<(&str, String, u64, usize, bool, &str, std::borrow::Cow<str>, usize)>();
        let owned: usize = self.source_file.iter().map(String::len).sum::<usize>()
            + self.detail.iter().map(|d| if let std::borrow::Cow::Owned(d) = d { d.len() } else { 0 }).sum::<usize>();
        self.raw.len() + self.ids.len() + owned + self.len() * per_row
    }

    /// The rows as a batch of the [`rejects`] schema.
    pub fn to_batch(&self) -> RecordBatch {
        let n = self.len();
        let text_bytes = |v: &[&str]| v.iter().map(|s| s.len()).sum::<usize>();
        let mut stage = StringBuilder::with_capacity(n, text_bytes(&self.stage));
        let mut file = StringBuilder::with_capacity(n, self.source_file.iter().map(String::len).sum());
        let mut id = StringBuilder::with_capacity(n, self.ids.len());
        let mut reason = StringBuilder::with_capacity(n, text_bytes(&self.reason));
        let mut detail = StringBuilder::with_capacity(n, self.detail.iter().map(|d| d.len()).sum());
        let mut raw = BinaryBuilder::with_capacity(n, self.raw.len());
        for r in self.iter() {
            stage.append_value(r.stage);
            file.append_value(r.source_file);
            id.append_option(r.sample_id);
            reason.append_value(r.reason);
            detail.append_value(r.detail);
            raw.append_value(r.raw);
        }
        let cols: Vec<ArrayRef> = vec![
            Arc::new(stage.finish()),
            Arc::new(file.finish()),
            Arc::new(arrow_array::UInt64Array::from(self.row.clone())),
            Arc::new(id.finish()),
            Arc::new(reason.finish()),
            Arc::new(detail.finish()),
            Arc::new(raw.finish()),
        ];
        RecordBatch::try_new(rejects(), cols).expect("columns match the rejects schema")
    }
}

impl From<Vec<Reject>> for Rejects {
    fn from(rows: Vec<Reject>) -> Self {
        let mut r = Rejects::default();
        for row in rows {
            r.push(row);
        }
        r
    }
}

/// The rows of `batch` where `keep` is true, in order: `arrow_select`'s filter, except that
/// string columns without nulls are copied a run of kept rows at a time (the filter copies row
/// by row once it keeps under 80% of rows, and the BoW stage keeps ~77%) and all-null columns
/// are made anew.
pub fn keep_rows(batch: &RecordBatch, keep: &[bool]) -> std::result::Result<RecordBatch, arrow_schema::ArrowError> {
    use arrow_array::cast::AsArray;
    use arrow_array::{Array, BooleanArray};
    assert_eq!(keep.len(), batch.num_rows(), "one flag per row");
    // Runs of kept rows, `[start, end)`.
    let mut runs = Vec::new();
    let mut i = 0;
    while i < keep.len() {
        if keep[i] {
            let start = i;
            while i < keep.len() && keep[i] {
                i += 1;
            }
            runs.push((start, i));
        } else {
            i += 1;
        }
    }
    let kept: usize = runs.iter().map(|(a, b)| b - a).sum();
    let mut mask: Option<BooleanArray> = None;
    let mut columns = Vec::with_capacity(batch.num_columns());
    for col in batch.columns() {
        let out: ArrayRef = if col.null_count() == col.len() {
            arrow_array::new_null_array(col.data_type(), kept)
        } else if *col.data_type() == DataType::Utf8 && col.null_count() == 0 {
            let a = col.as_string::<i32>();
            let (offsets, values) = (a.value_offsets(), a.value_data());
            let bytes: usize = runs.iter().map(|&(s, e)| (offsets[e] - offsets[s]) as usize).sum();
            let mut new_offsets = Vec::with_capacity(kept + 1);
            let mut new_values = Vec::with_capacity(bytes);
            new_offsets.push(0i32);
            for &(s, e) in &runs {
                let shift = new_values.len() as i32 - offsets[s];
                new_values.extend_from_slice(&values[offsets[s] as usize..offsets[e] as usize]);
                new_offsets.extend(offsets[s + 1..=e].iter().map(|o| o + shift));
            }
            // SAFETY: the offsets start at 0, never decrease, end at `new_values.len()`, and
            // each value is a whole value of a valid string array (runs copy whole values).
            Arc::new(unsafe {
                arrow_array::StringArray::new_unchecked(
                    arrow_buffer::OffsetBuffer::new_unchecked(new_offsets.into()),
                    new_values.into(),
                    None,
                )
            })
        } else {
            let m = mask.get_or_insert_with(|| BooleanArray::from(keep.to_vec()));
            arrow_select::filter::filter(col.as_ref(), m)?
        };
        columns.push(out);
    }
    RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &arrow_array::RecordBatchOptions::new().with_row_count(Some(kept)),
    )
}

/// A batch of rows moving through a pipeline, with the rejects found while producing it.
#[derive(Debug, Clone)]
pub struct Chunk {
    pub batch: RecordBatch,
    pub rejects: Rejects,
    /// Rows a reader was configured to skip, counted by reason (not stored).
    pub skipped: std::collections::BTreeMap<&'static str, u64>,
}

/// The string column `name` of `batch`, which the plan has checked exists.
pub fn str_col<'a>(batch: &'a RecordBatch, name: &str) -> &'a arrow_array::StringArray {
    use arrow_array::cast::AsArray;
    batch.column_by_name(name).unwrap_or_else(|| panic!("column `{name}` checked at plan time")).as_string::<i32>()
}

/// What a reject of a stage after the reader keeps as `raw` (`schemas/rejects.md`): row `r`'s
/// caption, or nothing when the row has none.
pub fn caption_bytes(batch: &RecordBatch, r: usize) -> Vec<u8> {
    use arrow_array::cast::AsArray;
    use arrow_array::Array;
    match batch.column_by_name(CAPTION).and_then(|c| c.as_string_opt::<i32>()) {
        Some(c) if c.is_valid(r) => c.value(r).as_bytes().to_vec(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::Array;

    #[test]
    fn rejects_keep_every_field_of_every_row_in_order() {
        // Rows with and without ids, empty and non-UTF-8 raw bytes, owned and borrowed details,
        // pushed both ways: each reads back as pushed, and the batch holds the same values.
        let rows: Vec<Reject> = (0..7u64)
            .map(|i| Reject {
                stage: if i % 2 == 0 { "read_cc_tsv" } else { "bow" },
                source_file: if i % 2 == 0 { format!("f{i}.tsv") } else { String::new() },
                row: 100 - i,
                sample_id: (i % 3 != 1).then(|| format!("id{i}")),
                reason: if i < 4 { "wrong_field_count" } else { "empty_after_bow" },
                detail: if i % 2 == 0 { format!("{i} fields").into() } else { "fixed".into() },
                raw: match i {
                    2 => Vec::new(),
                    5 => vec![0xff, b'a', 0xfe],
                    _ => format!("line {i}\tx").into_bytes(),
                },
            })
            .collect();
        let mut r = Rejects::default();
        for (i, row) in rows.iter().enumerate() {
            if i % 2 == 0 {
                r.push(row.clone());
            } else {
                let id = row.sample_id.as_deref();
                r.push_row(row.stage, row.source_file.clone(), row.row, id, row.reason, row.detail.clone(), &row.raw);
            }
        }
        assert_eq!(r.len(), rows.len());
        assert_eq!(r, Rejects::from(rows.clone()));
        let b = r.to_batch();
        assert_eq!(b.num_rows(), rows.len());
        for (i, (got, want)) in r.iter().zip(&rows).enumerate() {
            assert_eq!(got.stage, want.stage);
            assert_eq!(got.source_file, want.source_file);
            assert_eq!(got.row, want.row);
            assert_eq!(got.sample_id, want.sample_id.as_deref());
            assert_eq!((got.reason, got.detail), (want.reason, &*want.detail));
            assert_eq!(got.raw, &want.raw[..]);
            assert_eq!(b.column(0).as_string::<i32>().value(i), want.stage);
            assert_eq!(b.column(1).as_string::<i32>().value(i), want.source_file);
            assert_eq!(b.column(2).as_primitive::<arrow_array::types::UInt64Type>().value(i), want.row);
            let ids = b.column(3).as_string::<i32>();
            assert_eq!(ids.is_valid(i).then(|| ids.value(i)), want.sample_id.as_deref());
            assert_eq!(b.column(4).as_string::<i32>().value(i), want.reason);
            assert_eq!(b.column(5).as_string::<i32>().value(i), want.detail);
            assert_eq!(b.column(6).as_binary::<i32>().value(i), &want.raw[..]);
        }
        let reasons: Vec<_> = r.reasons().collect();
        assert_eq!(reasons, rows.iter().map(|w| (w.stage, w.reason)).collect::<Vec<_>>());
        assert_eq!(Rejects::default().to_batch().num_rows(), 0);
    }

    proptest::proptest! {
        /// Equal to Arrow's filter for every mask, on each kind of column `keep_rows` treats
        /// apart: strings without nulls (run copies), strings with some nulls, all-null
        /// columns, and another type.
        #[test]
        fn keep_rows_equals_the_arrow_filter(
            rows in proptest::collection::vec(("[a-zé ]{0,12}", proptest::bool::ANY, proptest::bool::weighted(0.75)), 0..200)
        ) {
            use arrow_array::{StringArray, UInt64Array};
            let schema = Arc::new(Schema::new(vec![
                Field::new("s", DataType::Utf8, false),
                Field::new("n", DataType::Utf8, true),
                Field::new("z", DataType::Utf8, true),
                Field::new("u", DataType::UInt64, false),
            ]));
            let strings: StringArray = rows.iter().map(|r| Some(r.0.as_str())).collect();
            let some_null: StringArray = rows.iter().map(|r| r.1.then_some(r.0.as_str())).collect();
            let all_null: StringArray = rows.iter().map(|_| None::<&str>).collect();
            let numbers: UInt64Array = (0..rows.len() as u64).collect();
            let cols: Vec<ArrayRef> = vec![Arc::new(strings), Arc::new(some_null), Arc::new(all_null), Arc::new(numbers)];
            // Sliced, so the string columns' offsets do not start at 0.
            let batch = RecordBatch::try_new(schema, cols).unwrap();
            let cut = rows.len().min(3);
            let batch = batch.slice(cut, rows.len() - cut);
            let keep: Vec<bool> = rows[cut..].iter().map(|r| r.2).collect();
            let ours = keep_rows(&batch, &keep).unwrap();
            let arrow = arrow_select::filter::filter_record_batch(&batch, &arrow_array::BooleanArray::from(keep)).unwrap();
            proptest::prop_assert_eq!(ours, arrow);
        }
    }

    #[test]
    fn columns_first_filled_later_are_backfilled_with_nulls() {
        let mut b = PairsBuilder::new("src");
        b.push(PairRow { sample_id: "a", ..Default::default() });
        b.push(PairRow { sample_id: "b", caption: Some("a dog"), ..Default::default() });
        let batch = b.finish();
        let cap = batch.column_by_name(CAPTION).unwrap().as_string::<i32>();
        assert_eq!((cap.is_null(0), cap.value(1)), (true, "a dog"));
        let url = batch.column_by_name(URL).unwrap();
        assert_eq!((url.len(), url.null_count()), (2, 2), "never-filled column is all null");
        // The next batch starts clean.
        b.push(PairRow { sample_id: "c", ..Default::default() });
        assert_eq!(b.finish().column_by_name(CAPTION).unwrap().null_count(), 1);
    }
}
