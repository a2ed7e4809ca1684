//! Table schemas shared by all stages (documented for users in `schemas/`).
//!
//! * `pairs` — what every reader emits: one row per image(-caption) pair.
//! * `bow` — `pairs` plus `original_caption` and `split`, written by the BoW stage.
//! * `rejects` — every input row that did not make it into the output, with its reason.
//!
//! Stages pass [`Chunk`]s: an Arrow record batch plus the rejects found while making it, so a
//! row is always either in a batch or in a rejects list ("nothing lost", DESIGN.md).

use std::sync::{Arc, OnceLock};

use arrow_array::builder::{BinaryBuilder, StringBuilder, UInt64Builder};
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
    /// File the row came from (file name, or shard member for tar files).
    pub source_file: String,
    /// 1-based line number for text files, 0-based row index for Parquet, member index for tars.
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

pub fn rejects_batch(rows: &[Reject]) -> RecordBatch {
    // Sized up front: a BoW stage sets aside hundreds of thousands of rows per run.
    let n = rows.len();
    let bytes = |f: fn(&Reject) -> usize| rows.iter().map(f).sum::<usize>();
    let mut stage = StringBuilder::with_capacity(n, bytes(|r| r.stage.len()));
    let mut file = StringBuilder::with_capacity(n, bytes(|r| r.source_file.len()));
    let mut row = UInt64Builder::with_capacity(n);
    let mut id = StringBuilder::with_capacity(n, bytes(|r| r.sample_id.as_ref().map_or(0, String::len)));
    let mut reason = StringBuilder::with_capacity(n, bytes(|r| r.reason.len()));
    let mut detail = StringBuilder::with_capacity(n, bytes(|r| r.detail.len()));
    let mut raw = BinaryBuilder::with_capacity(n, bytes(|r| r.raw.len()));
    for r in rows {
        stage.append_value(r.stage);
        file.append_value(&r.source_file);
        row.append_value(r.row);
        id.append_option(r.sample_id.as_deref());
        reason.append_value(r.reason);
        detail.append_value(&r.detail);
        raw.append_value(&r.raw);
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(stage.finish()),
        Arc::new(file.finish()),
        Arc::new(row.finish()),
        Arc::new(id.finish()),
        Arc::new(reason.finish()),
        Arc::new(detail.finish()),
        Arc::new(raw.finish()),
    ];
    RecordBatch::try_new(rejects(), cols).expect("columns match the rejects schema")
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
    pub rejects: Vec<Reject>,
    /// Rows a reader was configured to skip, counted by reason (not stored).
    pub skipped: std::collections::BTreeMap<&'static str, u64>,
}

/// The string column `name` of `batch`, which the plan has checked exists.
pub fn str_col<'a>(batch: &'a RecordBatch, name: &str) -> &'a arrow_array::StringArray {
    use arrow_array::cast::AsArray;
    batch.column_by_name(name).unwrap_or_else(|| panic!("column `{name}` checked at plan time")).as_string::<i32>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::cast::AsArray;
    use arrow_array::Array;

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
