//! Smaller chunks for slow stages: a reader whose chunks are cut into pieces of at most a set
//! number of rows, for pipelines with a model stage (an encoder, pseudo-BoW mining).
//!
//! Readers cut their input into chunks of up to [`super::CHUNK_ROWS`] rows (or a block of lines).
//! A model stage takes minutes for one such chunk on a CPU, and the writer gets a chunk's rows
//! only once all of them are transformed. Cut into [`MODEL_CHUNK_ROWS`]-row pieces, the stream
//! reaches the writer, the progress bar and the checkpoints (at the ends of data shards) every
//! piece, and a resumed run transforms again from its checkpoint's piece rather than from the
//! start of its chunk. The rows, their order and their rejects are the reader's: a chunk's
//! rejects and skip counts go with its first piece, so the rejects table keeps its order.
//! [`SplitChunks`] forwards every [`Reader`] method: one added to the trait belongs here too.

use std::path::PathBuf;

use super::{ChunkIter, Fingerprinter, Reader};
use crate::schema::{Chunk, Rejects};

/// Rows per piece where a model stage runs: on a GPU, a few seconds of work at most, and 16 or
/// more of its batches.
pub const MODEL_CHUNK_ROWS: usize = 2048;

/// `inner`'s chunks cut into pieces of at most `rows` rows.
pub struct SplitChunks {
    inner: Box<dyn Reader>,
    rows: usize,
}

impl SplitChunks {
    pub fn new(inner: Box<dyn Reader>, rows: usize) -> SplitChunks {
        assert!(rows > 0, "pieces of at least one row");
        SplitChunks { inner, rows }
    }
}

/// `chunk` cut into pieces of at most `rows` rows (one piece when it has no more, or none).
pub fn split(chunk: Chunk, rows: usize) -> Vec<Chunk> {
    let n = chunk.batch.num_rows();
    if n <= rows {
        return vec![chunk];
    }
    let Chunk { batch, rejects, skipped } = chunk;
    let mut pieces = Vec::with_capacity(n.div_ceil(rows));
    let (mut rejects, mut skipped) = (Some(rejects), Some(skipped));
    for start in (0..n).step_by(rows) {
        pieces.push(Chunk {
            batch: batch.slice(start, rows.min(n - start)),
            rejects: rejects.take().unwrap_or_else(Rejects::default),
            skipped: skipped.take().unwrap_or_default(),
        });
    }
    pieces
}

impl Reader for SplitChunks {
    fn inputs(&self) -> Vec<PathBuf> {
        self.inner.inputs()
    }
    fn open(&self) -> crate::error::Result<ChunkIter<'_>> {
        let rows = self.rows;
        let chunks = self.inner.open()?;
        Ok(Box::new(chunks.flat_map(move |c| -> Vec<crate::error::Result<Chunk>> {
            match c {
                Ok(c) => split(c, rows).into_iter().map(Ok).collect(),
                Err(e) => vec![Err(e)],
            }
        })))
    }
    fn prepare(&self) -> crate::error::Result<()> {
        self.inner.prepare()
    }
    fn fingerprinter(&self) -> Fingerprinter {
        self.inner.fingerprinter()
    }
    fn folder_stamp(&self) -> Option<u128> {
        self.inner.folder_stamp()
    }
    fn fills(&self, column: &str) -> bool {
        self.inner.fills(column)
    }
    fn image_refs(&self) -> super::ImageRefs {
        self.inner.image_refs()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::{Int64Array, RecordBatch};
    use arrow_schema::{DataType, Field, Schema};

    use super::split;
    use crate::schema::{Chunk, Reject};

    fn chunk(rows: i64, rejects: usize) -> Chunk {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int64, false)]));
        let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from_iter_values(0..rows))]).unwrap();
        let rejects: Vec<Reject> = (0..rejects)
            .map(|i| Reject {
                stage: "read_cc_tsv",
                source_file: "a.tsv".into(),
                row: i as u64,
                sample_id: None,
                reason: "wrong_field_count",
                detail: "".into(),
                raw: vec![b'x'],
            })
            .collect();
        let mut c = crate::stages::chunk_of(batch, rejects);
        c.skipped.insert("video", 3);
        c
    }

    fn values(c: &Chunk) -> Vec<i64> {
        use arrow_array::cast::AsArray;
        c.batch.column(0).as_primitive::<arrow_array::types::Int64Type>().values().to_vec()
    }

    #[test]
    fn pieces_keep_every_row_in_order_and_the_rejects_go_with_the_first() {
        for (rows, at_most) in [(10, 3), (9, 3), (3, 3), (2, 3), (0, 3), (7, 1)] {
            let pieces = split(chunk(rows, 2), at_most);
            assert_eq!(pieces.len(), (rows as usize).div_ceil(at_most).max(1), "{rows} rows by {at_most}");
            assert!(pieces.iter().all(|p| p.batch.num_rows() <= at_most), "{rows} by {at_most}");
            let all: Vec<i64> = pieces.iter().flat_map(values).collect();
            assert_eq!(all, (0..rows).collect::<Vec<_>>(), "{rows} by {at_most}");
            assert_eq!(pieces[0].rejects.len(), 2);
            assert_eq!(pieces[0].skipped.get("video"), Some(&3));
            assert!(pieces[1..].iter().all(|p| p.rejects.is_empty() && p.skipped.is_empty()));
        }
    }
}
