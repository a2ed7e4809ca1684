//! Parquet files: reading inputs ([`read_batches`], [`read_batches_text_unchecked`], [`read_file`],
//! [`read_schema`]) and writing output shards of at most `rows_per_shard` rows
//! (`part-00000.parquet`, ...), each written to a temporary name and renamed into place when
//! complete, with key-value metadata (curate version, config hash) in the file footer. LZ4_RAW
//! compression: on the BoW benchmark it wrote 13% faster than Snappy for a 2% larger file, and
//! pyarrow, polars, DuckDB and Spark (3.3+) read it. Rows are gathered into row groups of
//! [`ROW_GROUP_ROWS`]; each full row group's columns are encoded and compressed as rayon jobs while
//! the writer goes on (up to [`ENCODING_AT_MOST`] row groups at once), then appended in order, so
//! the file's bytes do not depend on the thread count.

use std::collections::VecDeque;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver, TryRecvError};
use std::sync::Arc;

use arrow_array::RecordBatch;
use arrow_schema::{Schema, SchemaRef};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::arrow_writer::{compute_leaves, ArrowColumnChunk, ArrowLeafColumn, ArrowRowGroupWriterFactory};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::metadata::KeyValue;
use parquet::file::properties::{EnabledStatistics, WriterProperties};
use parquet::file::writer::SerializedFileWriter;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::tmp_path;
use crate::error::{Error, Result};

/// Renames of finished shards running beside the writer, at most.
const MAX_RENAMES_AT_ONCE: usize = 4;

/// Bytes gathered before each write to an output file.
const WRITE_BUFFER_BYTES: usize = 4 << 20;

/// Rows per row group: small enough to bound the writer's memory, large enough for good scans.
const ROW_GROUP_ROWS: usize = 128 * 1024;

/// Pieces of fewer rows are gathered and copied together into one batch ([`Open::gather`]) before
/// they join a row group: a slice keeps its whole source batch, whose buffers were sized for a
/// full chunk, so a row group of one-sample shards' chunks held tens of KB per row.
const SMALL_PIECE_ROWS: usize = 1024;

/// Small pieces held (with their source batches) before they are copied together.
const SMALL_PIECES_AT_MOST: usize = 64;

/// Bytes of small pieces' rows copied together at most (beyond a piece of this size alone, which
/// is not copied): far from the 2 GiB that one text column's 32-bit offsets can address, which
/// a few malformed lines of hundreds of MB each in `raw` could otherwise pass.
const SMALL_BYTES_AT_MOST: usize = 64 << 20;

/// Columns whose values repeat (labels, split names): dictionary-encoded. Every other column
/// (ids, captions, URLs — mostly unique) is written plain, since trying a dictionary first and
/// giving up costs time and saves nothing there.
const DICTIONARY_COLUMNS: [&str; 9] =
    ["source", "split", "shard", "label", "label_text", "reason", "stage", "detail", "source_file"];

/// Free-text columns: no min/max statistics. Nobody prunes row groups by the alphabetical range
/// of captions or URLs, and keeping them costs two string comparisons per value.
const NO_STATISTICS_COLUMNS: [&str; 4] = ["caption", "original_caption", "url", "raw"];

fn properties(metadata: &[(String, String)]) -> WriterProperties {
    let mut b = WriterProperties::builder().set_dictionary_enabled(false);
    for c in DICTIONARY_COLUMNS {
        b = b.set_column_dictionary_enabled(c.into(), true);
    }
    for c in NO_STATISTICS_COLUMNS {
        b = b.set_column_statistics_enabled(c.into(), EnabledStatistics::None);
    }
    b.set_compression(Compression::LZ4_RAW)
        .set_max_row_group_size(ROW_GROUP_ROWS)
        .set_key_value_metadata(Some(metadata.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())).collect()))
        .build()
}

/// One finished output file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ShardInfo {
    pub file: String,
    pub rows: u64,
}

/// Row groups of one file being encoded at once, at most. Each full row group goes to the pool
/// and the writer goes on; it waits only past this many, so encoding runs beside the
/// transforms and the appends instead of between them.
const ENCODING_AT_MOST: usize = 4;

/// One row group's column chunks, in schema order.
type Encoded = parquet::errors::Result<Vec<ArrowColumnChunk>>;

/// `batch` copied into buffers of its size (a slice's rows only).
fn copy_of(batch: &RecordBatch) -> Result<RecordBatch> {
    let all = arrow_array::UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    let columns: std::result::Result<Vec<_>, _> =
        batch.columns().iter().map(|c| arrow_select::take::take(c.as_ref(), &all, None)).collect();
    Ok(RecordBatch::try_new(batch.schema(), columns?)?)
}

struct Open {
    file: SerializedFileWriter<BufWriter<File>>,
    factory: ArrowRowGroupWriterFactory,
    /// Rows of the row group being filled.
    pending: Vec<RecordBatch>,
    pending_rows: usize,
    /// Small pieces at the end of `pending`'s rows, not yet copied into it (see
    /// [`SMALL_PIECE_ROWS`]); their rows count in `pending_rows`.
    small: Vec<RecordBatch>,
    small_rows: usize,
    small_bytes: usize,
    /// Row groups handed to the pool, oldest first: appended to the file in this order.
    encoding: VecDeque<Receiver<Encoded>>,
    /// Row groups handed to the pool so far (the next one's index in the file).
    row_groups: usize,
    tmp: PathBuf,
    path: PathBuf,
    rows: usize,
}

impl Open {
    /// Adds `piece` to the row group being filled: a small one is held with the small pieces
    /// before it until they are many or long enough to copy together.
    fn push(&mut self, piece: RecordBatch, schema: &SchemaRef) -> Result<()> {
        let rows = piece.num_rows();
        self.pending_rows += rows;
        // The bytes of a small piece's rows (a slice's share of its buffers).
        let bytes = |p: &RecordBatch| -> usize {
            p.columns().iter().map(|c| c.to_data().get_slice_memory_size().unwrap_or(SMALL_BYTES_AT_MOST)).sum()
        };
        let bytes = if rows >= SMALL_PIECE_ROWS { SMALL_BYTES_AT_MOST } else { bytes(&piece) };
        if bytes >= SMALL_BYTES_AT_MOST {
            self.gather(schema)?;
            self.pending.push(piece);
            return Ok(());
        }
        self.small.push(piece);
        self.small_rows += rows;
        self.small_bytes += bytes;
        if self.small.len() >= SMALL_PIECES_AT_MOST
            || self.small_rows >= SMALL_PIECE_ROWS
            || self.small_bytes >= SMALL_BYTES_AT_MOST
        {
            self.gather(schema)?;
        }
        Ok(())
    }

    /// Copies the small pieces held into one batch of buffers of its size, which lets their
    /// source batches go.
    fn gather(&mut self, schema: &SchemaRef) -> Result<()> {
        match self.small.len() {
            0 => {}
            1 => self.pending.push(copy_of(&self.small[0])?),
            _ => self.pending.push(arrow_select::concat::concat_batches(schema, &self.small)?),
        }
        self.small.clear();
        self.small_rows = 0;
        self.small_bytes = 0;
        Ok(())
    }

    /// Closes the row group being filled and hands it to the pool: each column is encoded and
    /// compressed as a job of its own.
    fn end_row_group(&mut self, schema: &SchemaRef) -> Result<()> {
        if self.pending_rows == 0 {
            return Ok(());
        }
        self.gather(schema)?;
        let batches = std::mem::take(&mut self.pending);
        self.pending_rows = 0;
        let writers = self.factory.create_column_writers(self.row_groups)?;
        self.row_groups += 1;
        let mut leaves: Vec<Vec<ArrowLeafColumn>> = (0..writers.len()).map(|_| Vec::new()).collect();
        for batch in &batches {
            let mut k = 0;
            for (field, column) in schema.fields().iter().zip(batch.columns()) {
                for leaf in compute_leaves(field, column)? {
                    leaves[k].push(leaf);
                    k += 1;
                }
            }
        }
        let (tx, rx) = sync_channel::<Encoded>(1);
        rayon::spawn(move || {
            // `collect` keeps the columns in schema order.
            let chunks = writers
                .into_par_iter()
                .zip(leaves)
                .map(|(mut w, leaves)| {
                    for leaf in &leaves {
                        w.write(leaf)?;
                    }
                    w.close()
                })
                .collect();
            // The receiver is gone only if the writer stopped on an error.
            let _ = tx.send(chunks);
        });
        self.encoding.push_back(rx);
        self.append_encoded(ENCODING_AT_MOST)
    }

    /// Appends encoded row groups to the file in order: those already done, and more, waiting,
    /// until at most `keep` are left in the pool.
    fn append_encoded(&mut self, keep: usize) -> Result<()> {
        while let Some(front) = self.encoding.front() {
            let chunks = if self.encoding.len() > keep {
                super::recv_in_pool(front)
            } else {
                match front.try_recv() {
                    Ok(c) => Some(c),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => None,
                }
            };
            let chunks = chunks.ok_or_else(|| Error::data("a Parquet encoding job stopped"))??;
            self.encoding.pop_front();
            let mut rg = self.file.next_row_group()?;
            for chunk in chunks {
                chunk.append_to_row_group(&mut rg)?;
            }
            rg.close()?;
        }
        Ok(())
    }
}

/// Writes a stream of batches into numbered Parquet shards.
pub struct ShardedWriter {
    dir: PathBuf,
    stem: String,
    schema: SchemaRef,
    rows_per_shard: usize,
    props: WriterProperties,
    current: Option<Open>,
    shards: Vec<ShardInfo>,
    /// Renames of finished shards still running (see [`ShardedWriter::close_current`]).
    renames: Vec<std::thread::JoinHandle<Result<()>>>,
}

impl ShardedWriter {
    pub fn new(
        dir: &Path,
        stem: &str,
        schema: SchemaRef,
        rows_per_shard: usize,
        metadata: &[(String, String)],
    ) -> Result<Self> {
        Self::after(dir, stem, schema, rows_per_shard, metadata, Vec::new())
    }

    /// A writer that goes on after `shards`, finished by an earlier (killed or failed) run of
    /// the same output: the next shard is numbered after them, and they count as this writer's.
    pub fn after(
        dir: &Path,
        stem: &str,
        schema: SchemaRef,
        rows_per_shard: usize,
        metadata: &[(String, String)],
        shards: Vec<ShardInfo>,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("cannot create folder", dir, e))?;
        Ok(ShardedWriter {
            dir: dir.to_owned(),
            stem: stem.to_owned(),
            schema,
            rows_per_shard: rows_per_shard.max(1),
            props: properties(metadata),
            current: None,
            shards,
            renames: Vec::new(),
        })
    }

    /// Rows the shard being written can still take before it is full (a whole shard's when
    /// none is open).
    pub fn room(&self) -> usize {
        self.current.as_ref().map_or(self.rows_per_shard, |o| self.rows_per_shard.saturating_sub(o.rows))
    }

    /// Ends the shard being written, if any, however many rows it has, and waits until every
    /// finished shard has its final name: they are all in place when this returns.
    pub fn end_shard(&mut self) -> Result<()> {
        self.close_current().map_err(|e| self.in_folder(e))?;
        for rename in self.renames.drain(..) {
            rename.join().expect("rename thread does not panic")?;
        }
        Ok(())
    }

    /// The shards finished so far.
    pub fn shards(&self) -> &[ShardInfo] {
        &self.shards
    }

    fn open_next(&mut self) -> Result<()> {
        let name = format!("{}-{:05}.parquet", self.stem, self.shards.len());
        let path = self.dir.join(&name);
        let tmp = tmp_path(&path);
        let file = File::create(&tmp).map_err(|e| Error::io("cannot create", &tmp, e))?;
        // The Parquet writer copies column chunks out in 8 KiB writes; gathered into large ones,
        // the kernel fills whole pages of the file instead of zeroing each new one first.
        let file = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        // The Arrow writer sets up the Parquet schema and the embedded Arrow schema; its
        // lower-level parts let row groups be encoded column-parallel.
        let (file, factory) =
            ArrowWriter::try_new(file, self.schema.clone(), Some(self.props.clone()))?.into_serialized_writer()?;
        self.current = Some(Open {
            file,
            factory,
            pending: Vec::new(),
            pending_rows: 0,
            small: Vec::new(),
            small_rows: 0,
            small_bytes: 0,
            encoding: VecDeque::new(),
            row_groups: 0,
            tmp,
            path,
            rows: 0,
        });
        Ok(())
    }

    fn close_current(&mut self) -> Result<()> {
        if let Some(mut open) = self.current.take() {
            open.end_row_group(&self.schema)?;
            open.append_encoded(0)?;
            open.file.close()?;
            // Renaming over an earlier run's shard frees that file's cached pages, ~0.1 s for
            // 100 MB, which would stall the stream: it runs beside the next shard instead.
            let (tmp, path) = (open.tmp, open.path.clone());
            // At most a few at once: a run with tens of thousands of small shards must not
            // pile up a thread (and its stack mapping) per shard.
            while self.renames.len() >= MAX_RENAMES_AT_ONCE {
                self.renames.remove(0).join().expect("rename thread does not panic")?;
            }
            let rename = std::thread::Builder::new()
                .name("curate-rename".into())
                .spawn(move || sync_into_place(&tmp, &path))
                .map_err(|e| Error::io("cannot start a thread", "curate-rename", e))?;
            self.renames.push(rename);
            self.shards.push(ShardInfo { file: super::file_name(&open.path), rows: open.rows as u64 });
        }
        Ok(())
    }

    pub fn write(&mut self, batch: &RecordBatch) -> Result<()> {
        let written = self.write_rows(batch);
        written.map_err(|e| self.in_folder(e))
    }

    /// An Arrow/Parquet error (a full disk comes as one) with the folder being written named.
    fn in_folder(&self, e: Error) -> Error {
        match e {
            // The parquet crate wraps an I/O error as `External: ...`: the cause is what helps.
            Error::Arrow(m) => Error::data(format!(
                "cannot write Parquet shards in `{}`: {}",
                self.dir.display(),
                m.strip_prefix("External: ").unwrap_or(&m)
            )),
            e => e,
        }
    }

    fn write_rows(&mut self, batch: &RecordBatch) -> Result<()> {
        let mut offset = 0;
        while offset < batch.num_rows() {
            if self.current.as_ref().is_some_and(|o| o.rows >= self.rows_per_shard) {
                self.close_current()?;
            }
            if self.current.is_none() {
                self.open_next()?;
            }
            let open = self.current.as_mut().expect("opened above");
            let take = (self.rows_per_shard - open.rows)
                .min(ROW_GROUP_ROWS - open.pending_rows)
                .min(batch.num_rows() - offset);
            open.push(batch.slice(offset, take), &self.schema)?;
            open.rows += take;
            offset += take;
            if open.pending_rows == ROW_GROUP_ROWS {
                open.end_row_group(&self.schema)?;
            }
        }
        Ok(())
    }

    /// Gives up: the shard being written is dropped and the shards finished so far but the
    /// first `keep` (a checkpoint's) are removed, so a run that failed leaves no part of its
    /// output that a checkpoint does not vouch for. Removal is best effort (the run is failing
    /// already).
    pub fn abort(mut self, keep: usize) {
        if let Some(open) = self.current.take() {
            drop(open.file);
            // Encoding jobs still running send to receivers that are gone: they just stop.
            let _ = std::fs::remove_file(&open.tmp);
        }
        for rename in self.renames.drain(..) {
            let _ = rename.join();
        }
        for shard in self.shards.iter().skip(keep) {
            let _ = std::fs::remove_file(self.dir.join(&shard.file));
        }
    }

    /// Closes the last shard. An empty output still gets one (empty) shard carrying the schema.
    pub fn finish(mut self) -> Result<Vec<ShardInfo>> {
        if self.current.is_none() && self.shards.is_empty() {
            self.open_next().map_err(|e| self.in_folder(e))?;
        }
        self.close_current().map_err(|e| self.in_folder(e))?;
        for rename in self.renames.drain(..) {
            rename.join().expect("rename thread does not panic")?;
        }
        // The renames themselves. Some file systems cannot sync a folder; the shards are whole
        // there all the same.
        let _ = File::open(&self.dir).and_then(|d| d.sync_all());
        Ok(std::mem::take(&mut self.shards))
    }
}

/// Writes `batches` to one Parquet file atomically.
pub fn write_file(
    path: &Path,
    schema: SchemaRef,
    batches: &[RecordBatch],
    metadata: &[(String, String)],
) -> Result<u64> {
    let tmp = tmp_path(path);
    let file = File::create(&tmp).map_err(|e| Error::io("cannot create", &tmp, e))?;
    let mut w = ArrowWriter::try_new(file, schema, Some(properties(metadata)))?;
    let mut rows = 0;
    for b in batches {
        w.write(b)?;
        rows += b.num_rows() as u64;
    }
    w.close()?;
    sync_into_place(&tmp, path)?;
    Ok(rows)
}

/// Syncs the finished file `tmp` to disk, then renames it to `path`: a crash leaves the old file
/// or the whole new one (and a disk that fills up late says so here).
fn sync_into_place(tmp: &Path, path: &Path) -> Result<()> {
    File::open(tmp).and_then(|f| f.sync_all()).map_err(|e| Error::io("cannot write", tmp, e))?;
    std::fs::rename(tmp, path).map_err(|e| Error::io("cannot rename into place", path, e))
}

/// A Parquet or Arrow error while reading `path`, naming the file.
fn unreadable(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::data(format!("cannot read Parquet file `{}`: {e}", path.display()))
}

/// Reads a whole Parquet file (inputs of readers, tests). Any codec Parquet writers use by
/// default is read: Snappy (pyarrow), ZSTD (polars), GZIP, Brotli, LZ4 and LZ4_RAW.
pub fn read_file(path: &Path) -> Result<Vec<RecordBatch>> {
    read_batches(path, 1024)?.collect()
}

/// The record batches of a Parquet file, `batch_rows` rows each (the last one of each row group
/// may be shorter), read as they are asked for: a file of any size streams.
pub fn read_batches(
    path: &Path,
    batch_rows: usize,
) -> Result<impl Iterator<Item = Result<RecordBatch>> + Send + 'static> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let reader = decoding(path, || {
        ParquetRecordBatchReaderBuilder::try_new(file)
            .and_then(|b| b.with_batch_size(batch_rows).build())
            .map_err(|e| unreadable(path, e))
    })?;
    Ok(batches(path, reader))
}

/// `f`, a call into the parquet crate on the file at `path`, with a panic in it made an error
/// naming the file: the crate panics on some damaged files (`Decoder for dict should have been
/// set`) where it should fail.
fn decoding<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
    crate::error::catch_quietly(f).unwrap_or_else(|panic| {
        Err(unreadable(path, format!("the Parquet decoder failed ({panic}); the file is probably damaged")))
    })
}

/// The record batches of `reader`, errors naming `path`; after a panic in the decoder (see
/// [`decoding`]), that error and nothing more.
fn batches(
    path: &Path,
    mut reader: parquet::arrow::arrow_reader::ParquetRecordBatchReader,
) -> impl Iterator<Item = Result<RecordBatch>> + Send + 'static {
    let path = path.to_owned();
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed {
            return None;
        }
        let next = decoding(&path, || Ok(reader.next())).and_then(|b| b.transpose().map_err(|e| unreadable(&path, e)));
        failed = next.is_err();
        next.transpose()
    })
}

/// [`read_batches`] with every top-level text column (Arrow `Utf8`, `LargeUtf8`, `Utf8View`
/// or a dictionary of them) read as bytes, unchecked: Arrow's reader fails a whole file on one
/// value that is not UTF-8, where a reader rejects that row and goes on. The readers cast to
/// text themselves (Arrow's cast, which makes a null of a value that is not UTF-8, tells them
/// which). Other columns come as the file's Arrow schema has them (a dictionary of text comes
/// as plain bytes).
pub fn read_batches_text_unchecked(
    path: &Path,
    batch_rows: usize,
) -> Result<impl Iterator<Item = Result<RecordBatch>> + Send + 'static> {
    use arrow_schema::{DataType, Field};
    use parquet::arrow::arrow_reader::{ArrowReaderMetadata, ArrowReaderOptions};
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let meta = decoding(path, || {
        ArrowReaderMetadata::load(&file, ArrowReaderOptions::new()).map_err(|e| unreadable(path, e))
    })?;
    let bytes_of = |t: &DataType| match t {
        DataType::Utf8 => Some(DataType::Binary),
        DataType::LargeUtf8 => Some(DataType::LargeBinary),
        DataType::Utf8View => Some(DataType::BinaryView),
        DataType::Dictionary(_, v) if matches!(**v, DataType::Utf8 | DataType::LargeUtf8) => Some(DataType::Binary),
        _ => None,
    };
    let schema = meta.schema();
    // Top-level Arrow fields are the Parquet root's fields, in order.
    let text: Vec<bool> = schema.fields().iter().map(|f| bytes_of(f.data_type()).is_some()).collect();
    let parquet_meta = text_as_bytes(meta.metadata(), &text).map_err(|e| unreadable(path, e))?;
    let fields: Vec<Field> = schema
        .fields()
        .iter()
        .map(|f| match bytes_of(f.data_type()) {
            Some(t) => f.as_ref().clone().with_data_type(t),
            None => f.as_ref().clone(),
        })
        .collect();
    let supplied = Arc::new(Schema::new_with_metadata(fields, schema.metadata().clone()));
    let meta = ArrowReaderMetadata::try_new(Arc::new(parquet_meta), ArrowReaderOptions::new().with_schema(supplied))
        .map_err(|e| unreadable(path, e))?;
    let reader = ParquetRecordBatchReaderBuilder::new_with_metadata(file, meta)
        .with_batch_size(batch_rows)
        .build()
        .map_err(|e| unreadable(path, e))?;
    Ok(batches(path, reader))
}

/// `meta` with the text annotation taken off the top-level byte-array columns marked in
/// `text`, so that Arrow reads them as bytes. Pages are decoded by their physical type, which
/// stays.
fn text_as_bytes(
    meta: &parquet::file::metadata::ParquetMetaData,
    text: &[bool],
) -> parquet::errors::Result<parquet::file::metadata::ParquetMetaData> {
    use parquet::basic::Type as Physical;
    use parquet::file::metadata::{FileMetaData, ParquetMetaData};
    use parquet::schema::types::{SchemaDescriptor, Type};
    let fm = meta.file_metadata();
    let root = fm.schema_descr().root_schema();
    let fields = root
        .get_fields()
        .iter()
        .zip(text.iter().chain(std::iter::repeat(&false)))
        .map(|(f, &text)| {
            if !text || !f.is_primitive() || f.get_physical_type() != Physical::BYTE_ARRAY {
                return Ok(f.clone());
            }
            let info = f.get_basic_info();
            let mut b = Type::primitive_type_builder(info.name(), Physical::BYTE_ARRAY)
                .with_id(info.has_id().then(|| info.id()));
            if info.has_repetition() {
                b = b.with_repetition(info.repetition());
            }
            b.build().map(Arc::new)
        })
        .collect::<parquet::errors::Result<Vec<_>>>()?;
    let root = Type::group_type_builder(root.name()).with_fields(fields).build()?;
    let schema = Arc::new(SchemaDescriptor::new(Arc::new(root)));
    let fm = FileMetaData::new(
        fm.version(),
        fm.num_rows(),
        fm.created_by().map(str::to_owned),
        fm.key_value_metadata().cloned(),
        schema,
        fm.column_orders().cloned(),
    );
    Ok(ParquetMetaData::new(fm, meta.row_groups().to_vec()))
}

/// The Arrow schema stored in a Parquet file's footer (no data is read).
pub fn read_schema(path: &Path) -> Result<SchemaRef> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    decoding(path, || {
        Ok(ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(path, e))?.schema().clone())
    })
}

/// The rows of a Parquet file, from its footer (no data is read).
pub fn row_count(path: &Path) -> Result<u64> {
    let file = File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let builder = decoding(path, || ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| unreadable(path, e)))?;
    Ok(builder.metadata().file_metadata().num_rows().max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::{pairs, PairRow, PairsBuilder};

    /// `pairs` rows `id0`, `id1`, … with the caption "a dog".
    fn dogs(n: usize) -> RecordBatch {
        let mut b = PairsBuilder::new("test");
        for i in 0..n {
            b.push(PairRow { sample_id: &format!("id{i}"), caption: Some("a dog"), ..Default::default() });
        }
        b.finish()
    }

    #[test]
    fn shards_split_at_the_row_limit_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let batch = dogs(5);
        let mut w = ShardedWriter::new(dir.path(), "part", pairs(), 2, &[]).unwrap();
        w.write(&batch).unwrap();
        let shards = w.finish().unwrap();
        assert_eq!(shards.iter().map(|s| s.rows).collect::<Vec<_>>(), [2, 2, 1]);
        assert_eq!(shards[2].file, "part-00002.parquet");
        let back = read_file(&dir.path().join("part-00001.parquet")).unwrap();
        assert_eq!(back[0].slice(0, 2), batch.slice(2, 2));
    }

    #[test]
    fn a_writer_after_earlier_shards_numbers_on_and_ends_shards_on_demand() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = ShardedWriter::new(dir.path(), "part", pairs(), 3, &[]).unwrap();
        assert_eq!(w.room(), 3);
        w.write(&dogs(2)).unwrap();
        assert_eq!(w.room(), 1);
        // Ended early, and in place (renamed) when `end_shard` returns.
        w.end_shard().unwrap();
        assert_eq!(w.shards(), [ShardInfo { file: "part-00000.parquet".into(), rows: 2 }]);
        assert!(dir.path().join("part-00000.parquet").exists());
        assert_eq!(w.room(), 3);
        w.end_shard().unwrap();
        assert_eq!(w.shards().len(), 1, "no shard open: nothing to end");
        drop(w);
        // A later writer keeps that shard and goes on with `part-00001`.
        let kept = vec![ShardInfo { file: "part-00000.parquet".into(), rows: 2 }];
        let mut w = ShardedWriter::after(dir.path(), "part", pairs(), 3, &[], kept).unwrap();
        w.write(&dogs(4)).unwrap();
        let shards = w.finish().unwrap();
        assert_eq!(
            shards.iter().map(|s| (s.file.as_str(), s.rows)).collect::<Vec<_>>(),
            [("part-00000.parquet", 2), ("part-00001.parquet", 3), ("part-00002.parquet", 1)]
        );
        assert_eq!(read_file(&dir.path().join("part-00002.parquet")).unwrap()[0], dogs(4).slice(3, 1));
    }

    #[test]
    fn a_shard_that_cannot_be_written_names_its_folder() {
        // Rows of another schema than the writer's fail to encode (as a full disk fails to
        // write): the error says where.
        let dir = tempfile::tempdir().unwrap();
        let other =
            arrow_schema::Schema::new(vec![arrow_schema::Field::new("x", arrow_schema::DataType::Int64, false)]);
        let x: arrow_array::ArrayRef = std::sync::Arc::new(arrow_array::Int64Array::from(vec![1, 2]));
        let batch = RecordBatch::try_new(std::sync::Arc::new(other), vec![x]).unwrap();
        let mut w = ShardedWriter::new(dir.path(), "part", pairs(), 10, &[]).unwrap();
        let err = w.write(&batch).and_then(|_| w.finish().map(|_| ())).unwrap_err().to_string();
        assert!(err.starts_with(&format!("cannot write Parquet shards in `{}`: ", dir.path().display())), "{err}");
    }

    /// The text column `name` of the Parquet file `path`, every row in order.
    fn strings_of(path: &Path, name: &str) -> Vec<String> {
        let batches = read_file(path).unwrap();
        batches.iter().flat_map(|b| crate::schema::str_col(b, name).iter().map(|v| v.unwrap().to_owned())).collect()
    }

    #[test]
    fn small_pieces_do_not_keep_their_source_batches() {
        // One-row chunks (one-sample tar shards), each in buffers sized for a full chunk, as a
        // reader's are: the open row group holds copies of their rows, not the chunks.
        use arrow_array::builder::StringBuilder;
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![arrow_schema::Field::new("id", arrow_schema::DataType::Utf8, false)]));
        let mut w = ShardedWriter::new(dir.path(), "part", schema.clone(), 1_000_000, &[]).unwrap();
        let chunks = 3000;
        let mut source_bytes = 0;
        for i in 0..chunks {
            let mut b = StringBuilder::with_capacity(8192, 64 * 1024);
            b.append_value(format!("id{i}"));
            let chunk = RecordBatch::try_new(schema.clone(), vec![Arc::new(b.finish()) as _]).unwrap();
            source_bytes += chunk.get_array_memory_size();
            w.write(&chunk).unwrap();
        }
        let open = w.current.as_ref().unwrap();
        let held: usize = open.pending.iter().chain(&open.small).map(RecordBatch::get_array_memory_size).sum();
        assert_eq!(open.pending_rows, chunks);
        assert!(source_bytes > 200 << 20 && held < 8 << 20, "{held} bytes held of {source_bytes}");
        // And the rows are all there, in order.
        let shards = w.finish().unwrap();
        let ids = strings_of(&dir.path().join(&shards[0].file), "id");
        assert_eq!(ids, (0..chunks).map(|i| format!("id{i}")).collect::<Vec<_>>());
    }

    #[test]
    fn small_pieces_are_copied_together_up_to_a_byte_limit() {
        // A text column's offsets address 2 GiB: pieces of long values are copied together in
        // groups of at most SMALL_BYTES_AT_MOST (plus the last piece), and one of that size alone
        // is not copied at all.
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::new(vec![arrow_schema::Field::new("raw", arrow_schema::DataType::Utf8, false)]));
        let mut w = ShardedWriter::new(dir.path(), "part", schema.clone(), 1_000_000, &[]).unwrap();
        let piece = |bytes: usize| {
            let column = arrow_array::StringArray::from(vec!["x".repeat(bytes)]);
            RecordBatch::try_new(schema.clone(), vec![Arc::new(column) as _]).unwrap()
        };
        let held = |w: &ShardedWriter| {
            let open = w.current.as_ref().unwrap();
            (open.pending.len(), open.small.len())
        };
        let third = SMALL_BYTES_AT_MOST / 3 + 1;
        w.write(&piece(third)).unwrap();
        w.write(&piece(third)).unwrap();
        assert_eq!(held(&w), (0, 2));
        w.write(&piece(third)).unwrap();
        assert_eq!(held(&w), (1, 0), "three thirds make the limit: copied together");
        w.write(&piece(10)).unwrap();
        let big = piece(SMALL_BYTES_AT_MOST);
        w.write(&big).unwrap();
        assert_eq!(held(&w), (3, 0), "the small one gathered, then the big one as it is");
        let open = w.current.as_ref().unwrap();
        assert!(open.pending[2].column(0).to_data().buffers()[1].ptr_eq(&big.column(0).to_data().buffers()[1]));
        assert_eq!(open.pending_rows, 5);
        let shards = w.finish().unwrap();
        let lens: Vec<usize> = strings_of(&dir.path().join(&shards[0].file), "raw").iter().map(String::len).collect();
        assert_eq!(lens, [third, third, third, 10, SMALL_BYTES_AT_MOST]);
    }

    #[test]
    fn many_small_shards_keep_few_renames_in_flight() {
        let dir = tempfile::tempdir().unwrap();
        let batch = dogs(300);
        let mut w = ShardedWriter::new(dir.path(), "part", pairs(), 1, &[]).unwrap();
        for i in 0..batch.num_rows() {
            w.write(&batch.slice(i, 1)).unwrap();
            assert!(w.renames.len() <= MAX_RENAMES_AT_ONCE, "{} renames in flight", w.renames.len());
        }
        let shards = w.finish().unwrap();
        assert_eq!(shards.len(), 300);
        assert!(shards.iter().all(|s| dir.path().join(&s.file).is_file() && s.rows == 1));
    }

    #[test]
    fn row_groups_encoded_in_the_pool_keep_order_sizes_and_bytes() {
        // Enough rows for more than ENCODING_AT_MOST row groups in flight, with a shard closing
        // on full row groups plus a partial one. In the one-thread pool the writer runs on the
        // pool's only thread: it must run the encoding jobs itself while it waits.
        use arrow_array::{Int64Array, StringArray};
        use std::sync::Arc;
        let schema = Arc::new(Schema::new(vec![
            arrow_schema::Field::new("sample_id", arrow_schema::DataType::Utf8, false),
            arrow_schema::Field::new("n", arrow_schema::DataType::Int64, false),
        ]));
        let rows = 8 * ROW_GROUP_ROWS + 17;
        let per_shard = 6 * ROW_GROUP_ROWS + 5;
        let ids: Vec<String> = (0..rows).map(|i| format!("s{i}")).collect();
        let write = |dir: &Path, threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let mut w = ShardedWriter::new(dir, "part", schema.clone(), per_shard, &[]).unwrap();
                // Batches of an awkward size, so row groups are assembled from slices.
                for start in (0..rows).step_by(50_000) {
                    let end = (start + 50_000).min(rows);
                    let cols: Vec<arrow_array::ArrayRef> = vec![
                        Arc::new(StringArray::from_iter_values(ids[start..end].iter())),
                        Arc::new(Int64Array::from_iter_values(start as i64..end as i64)),
                    ];
                    w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap()).unwrap();
                }
                w.finish().unwrap()
            })
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let shards = write(a.path(), 1);
        assert_eq!(shards.iter().map(|s| s.rows as usize).collect::<Vec<_>>(), [per_shard, rows - per_shard]);
        assert_eq!(write(b.path(), 3), shards);
        let mut next = 0i64;
        for s in &shards {
            let path = a.path().join(&s.file);
            assert_eq!(std::fs::read(&path).unwrap(), std::fs::read(b.path().join(&s.file)).unwrap());
            let reader = parquet::file::reader::SerializedFileReader::new(File::open(&path).unwrap()).unwrap();
            let sizes: Vec<i64> = parquet::file::reader::FileReader::metadata(&reader)
                .row_groups()
                .iter()
                .map(|g| g.num_rows())
                .collect();
            let full = ROW_GROUP_ROWS as i64;
            let want = if next == 0 { vec![full, full, full, full, full, full, 5] } else { vec![full, full, 12] };
            assert_eq!(sizes, want);
            for batch in read_file(&path).unwrap() {
                let n = batch.column(1).as_any().downcast_ref::<Int64Array>().unwrap();
                let id = batch.column(0).as_any().downcast_ref::<StringArray>().unwrap();
                for r in 0..batch.num_rows() {
                    assert_eq!((n.value(r), id.value(r)), (next, ids[next as usize].as_str()));
                    next += 1;
                }
            }
        }
        assert_eq!(next as usize, rows);
    }

    #[test]
    fn empty_output_still_has_a_schema_file() {
        let dir = tempfile::tempdir().unwrap();
        let w = ShardedWriter::new(dir.path(), "part", pairs(), 10, &[]).unwrap();
        let shards = w.finish().unwrap();
        assert_eq!(shards, vec![ShardInfo { file: "part-00000.parquet".into(), rows: 0 }]);
        assert_eq!(read_schema(&dir.path().join("part-00000.parquet")).unwrap().fields().len(), pairs().fields().len());
    }
    #[test]
    fn a_damaged_file_is_an_error_naming_it_never_a_panic() {
        // The parquet crate panics on some corrupt pages and footers (`Option::unwrap()` on a
        // `None`, "capacity overflow", …) where it should fail. Every one-byte damage of a small
        // Snappy file with dictionary pages must read as rows or fail with an error naming the
        // file; some of them go through such a panic, which must come back as that error.
        use arrow_array::{ArrayRef, StringArray};
        use parquet::basic::Compression;
        use parquet::file::properties::WriterProperties;
        let dir = tempfile::tempdir().unwrap();
        let words = ["a dog", "two cats", "a red car", "the sea", "grey sky"];
        let ids: Vec<String> = (0..400).map(|i| format!("id{i:05}")).collect();
        let captions: Vec<&str> = (0..400).map(|i| words[(i * 7) % 5]).collect();
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(StringArray::from(ids)) as ArrayRef),
            ("caption", Arc::new(StringArray::from(captions)) as ArrayRef),
        ])
        .unwrap();
        let props = WriterProperties::builder().set_compression(Compression::SNAPPY).build();
        let good = dir.path().join("good.parquet");
        let mut w = ArrowWriter::try_new(File::create(&good).unwrap(), batch.schema(), Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let bytes = std::fs::read(&good).unwrap();
        let bad = dir.path().join("bad.parquet");
        let mut through_a_panic = 0;
        for at in 4..bytes.len() - 8 {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            std::fs::write(&bad, &damaged).unwrap();
            let read = std::panic::catch_unwind(|| {
                read_batches_text_unchecked(&bad, 64).and_then(|b| b.collect::<Result<Vec<_>>>())
            });
            let footer = std::panic::catch_unwind(|| (read_schema(&bad).is_ok(), row_count(&bad).is_ok()));
            assert!(footer.is_ok(), "byte {at}: reading the footer panicked");
            match read {
                Err(_) => panic!("byte {at}: the reader panicked"),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => {
                    let e = e.to_string();
                    assert!(e.starts_with(&format!("cannot read Parquet file `{}`", bad.display())), "byte {at}: {e}");
                    through_a_panic += e.contains("the Parquet decoder failed (") as usize;
                }
            }
        }
        assert!(through_a_panic > 0, "no damage went through a decoder panic: the test no longer tests it");
    }
}
