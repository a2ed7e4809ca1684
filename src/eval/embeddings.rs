//! Reading the embeddings `curate eval` scores (issue 5): an images table (`coco_image_id` int64,
//! `embedding` FixedSizeList<Float32, D>) and a captions table (`coco_caption_id`, `coco_image_id`,
//! `embedding`). Row order is kept: it is the gallery position that breaks score ties
//! ([`super::ranking`]) and, for images, what defines the COCO 1K folds ([`super::coco`]).
//! Every problem that makes the tables unusable as a whole (missing column, wrong type, null,
//! non-finite value, widths that differ, duplicate id) is an error naming the file and column.
//! With `--similarity csd` both tables also hold `uncertainty` (float64 or float32, each row's
//! `‖σ²‖₁`; [`read_uncertainty`]).
//!
//! `curate eval RUN_DIR` reads the same galleries before they are embedded ([`ImageList`]:
//! `coco_image_id` + `path`; [`CaptionList`]: `coco_caption_id`, `coco_image_id` + `caption`)
//! and builds [`Images`] / [`Captions`] from the model's output ([`Images::from_rows`]).

use std::path::Path;

use arrow_array::cast::AsArray;
use arrow_array::types::{Float32Type, Float64Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use rustc_hash::FxHashMap;

use crate::error::{Error, Result};

/// Row-major `rows x dim` float32 matrix, one embedding per row.
#[derive(Debug, Clone, PartialEq)]
pub struct Matrix {
    pub rows: usize,
    pub dim: usize,
    pub data: Vec<f32>,
}

impl Matrix {
    /// # Shapes
    /// `data`: `[rows * dim]`, row-major.
    pub fn new(rows: usize, dim: usize, data: Vec<f32>) -> Self {
        assert_eq!(data.len(), rows * dim, "matrix data is not rows x dim");
        Matrix { rows, dim, data }
    }

    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.dim..(i + 1) * self.dim]
    }

    /// Each row divided by its L2 norm (rows of norm 0 stay 0), for cosine similarity.
    /// Rows whose values are all zero (no direction to normalise to).
    pub fn zero_rows(&self) -> usize {
        match self.dim {
            0 => self.rows,
            d => self.data.chunks(d).filter(|r| r.iter().all(|&x| x == 0.0)).count(),
        }
    }

    pub fn l2_normalized(&self) -> Matrix {
        let mut data = self.data.clone();
        if self.dim > 0 {
            for row in data.chunks_mut(self.dim) {
                let n = row.iter().map(|&x| (x as f64) * (x as f64)).sum::<f64>().sqrt();
                if n > 0.0 {
                    row.iter_mut().for_each(|x| *x = (*x as f64 / n) as f32);
                }
            }
        }
        Matrix { rows: self.rows, dim: self.dim, data }
    }
}

/// The image gallery: COCO image ids in row order and their embeddings.
#[derive(Debug, Clone)]
pub struct Images {
    pub ids: Vec<i64>,
    pub embeddings: Matrix,
}

/// The caption gallery: COCO caption (annotation) ids, the image each caption belongs to (the COCO
/// ground truth) and the embeddings, in row order.
#[derive(Debug, Clone)]
pub struct Captions {
    pub ids: Vec<i64>,
    pub image_ids: Vec<i64>,
    pub embeddings: Matrix,
}

/// Reads an images table (`coco_image_id`, `embedding`).
pub fn read_images(path: &Path) -> Result<Images> {
    if let Some((mut ids, embeddings)) = read_clean(path, &["coco_image_id"], "embedding") {
        let ids = ids.remove(0);
        check_unique(path, "coco_image_id", &ids)?;
        return Ok(Images { ids, embeddings });
    }
    let batches = crate::io::parquet::read_file(path)?;
    let ids = int64_column(path, &batches, "coco_image_id")?;
    let embeddings = embedding_column(path, &batches, "embedding")?;
    check_unique(path, "coco_image_id", &ids)?;
    Ok(Images { ids, embeddings })
}

/// Reads a captions table (`coco_caption_id`, `coco_image_id`, `embedding`).
pub fn read_captions(path: &Path) -> Result<Captions> {
    if let Some((mut ids, embeddings)) = read_clean(path, &["coco_caption_id", "coco_image_id"], "embedding") {
        let (image_ids, ids) = (ids.remove(1), ids.remove(0));
        check_unique(path, "coco_caption_id", &ids)?;
        return Ok(Captions { ids, image_ids, embeddings });
    }
    let batches = crate::io::parquet::read_file(path)?;
    let ids = int64_column(path, &batches, "coco_caption_id")?;
    let image_ids = int64_column(path, &batches, "coco_image_id")?;
    let embeddings = embedding_column(path, &batches, "embedding")?;
    check_unique(path, "coco_caption_id", &ids)?;
    Ok(Captions { ids, image_ids, embeddings })
}

/// Levels decoded per call in [`embedding_values`]: two i16 buffers of 1 MB stay in cache
/// (a 16 MB pair made the read 25% slower).
const LEVELS_PER_CALL: usize = 1 << 19;

/// The fast path of [`read_images`] / [`read_captions`] for a well-formed table: the id columns
/// through Arrow, the embedding column (`FixedSizeList<Float32>`) straight from the Parquet
/// column chunks, which takes less than half the time of assembling Arrow list arrays (issue 5:
/// 52 MB of COCO 25K caption embeddings in ~75 ms instead of ~170 ms). `None` at the first
/// thing out of the ordinary — a missing column, another type, a null anywhere, a non-finite
/// value, no rows — and the caller reads the file again the general way, which reports it.
/// A panic in the parquet crate (it panics on some damaged files) is `None` too: the general
/// path, which turns such a panic into an error naming the file, reads it again.
fn read_clean(path: &Path, id_columns: &[&str], embedding: &str) -> Option<(Vec<Vec<i64>>, Matrix)> {
    crate::error::catch_quietly(|| read_clean_unguarded(path, id_columns, embedding)).ok().flatten()
}

fn read_clean_unguarded(path: &Path, id_columns: &[&str], embedding: &str) -> Option<(Vec<Vec<i64>>, Matrix)> {
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use parquet::arrow::ProjectionMask;

    let builder = ParquetRecordBatchReaderBuilder::try_new(std::fs::File::open(path).ok()?).ok()?;
    let schema = builder.schema().clone();
    let DataType::FixedSizeList(item, d) = schema.field_with_name(embedding).ok()?.data_type() else {
        return None;
    };
    let rows = usize::try_from(builder.metadata().file_metadata().num_rows()).ok()?;
    if item.data_type() != &DataType::Float32 || *d <= 0 || rows == 0 {
        return None;
    }
    let roots: Vec<usize> = id_columns.iter().map(|c| schema.index_of(c).ok()).collect::<Option<_>>()?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let batches: Vec<RecordBatch> =
        builder.with_projection(mask).build().ok()?.collect::<std::result::Result<_, _>>().ok()?;
    let ids: Vec<Vec<i64>> = id_columns.iter().map(|c| int64_column(path, &batches, c).ok()).collect::<Option<_>>()?;
    if ids.iter().any(|v| v.len() != rows) {
        return None;
    }
    let embeddings = embedding_values(path, embedding, *d as usize, rows)?;
    Some((ids, embeddings))
}

/// The values of a `FixedSizeList<Float32, d>` column without nulls, decoded with the Parquet
/// column reader; `None` unless every level says "present" and every record holds `d` values.
fn embedding_values(path: &Path, name: &str, d: usize, rows: usize) -> Option<Matrix> {
    use parquet::column::reader::ColumnReader;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    let reader = SerializedFileReader::new(std::fs::File::open(path).ok()?).ok()?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let leaves: Vec<usize> = (0..schema.num_columns())
        .filter(|&i| schema.column(i).path().parts().first().map(String::as_str) == Some(name))
        .collect();
    let [leaf] = leaves[..] else { return None };
    let descr = schema.column(leaf);
    if descr.physical_type() != parquet::basic::Type::FLOAT || descr.max_rep_level() != 1 {
        return None;
    }
    let max_def = descr.max_def_level();
    let mut data: Vec<f32> = Vec::with_capacity(rows * d);
    let (mut def, mut rep) = (Vec::new(), Vec::new());
    for g in 0..reader.num_row_groups() {
        let group = reader.get_row_group(g).ok()?;
        let ColumnReader::FloatColumnReader(mut column) = group.get_column_reader(leaf).ok()? else {
            return None;
        };
        let mut left = usize::try_from(group.metadata().num_rows()).ok()?;
        while left > 0 {
            def.clear();
            rep.clear();
            let start = data.len();
            let (records, values, levels) = column
                .read_records(left.min((LEVELS_PER_CALL / d).max(1)), Some(&mut def), Some(&mut rep), &mut data)
                .ok()?;
            let whole = |r: &[i16]| r[0] == 0 && r[1..].iter().all(|&x| x == 1);
            if records == 0
                || values != records * d
                || levels != values
                || data.len() - start != values
                || def.iter().any(|&x| x != max_def)
                || !rep.chunks_exact(d).all(whole)
            {
                return None;
            }
            left -= records;
        }
    }
    if data.len() != rows * d || !data.iter().all(|x| x.is_finite()) {
        return None;
    }
    Some(Matrix::new(rows, d, data))
}

/// An image list to embed (`curate eval RUN_DIR`): `coco_image_id` and `path`, in row order.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageList {
    pub ids: Vec<i64>,
    pub paths: Vec<String>,
}

/// A caption list to embed: `coco_caption_id`, `coco_image_id` and `caption`, in row order.
#[derive(Debug, Clone, PartialEq)]
pub struct CaptionList {
    pub ids: Vec<i64>,
    pub image_ids: Vec<i64>,
    pub texts: Vec<String>,
}

/// Reads an image list (`coco_image_id` int64, `path` string).
pub fn read_image_list(path: &Path) -> Result<ImageList> {
    let batches = crate::io::parquet::read_file(path)?;
    let ids = int64_column(path, &batches, "coco_image_id")?;
    let paths = string_column(path, &batches, "path")?;
    check_unique(path, "coco_image_id", &ids)?;
    Ok(ImageList { ids, paths })
}

/// Reads a caption list (`coco_caption_id`, `coco_image_id` int64, `caption` string).
pub fn read_caption_list(path: &Path) -> Result<CaptionList> {
    let batches = crate::io::parquet::read_file(path)?;
    let ids = int64_column(path, &batches, "coco_caption_id")?;
    let image_ids = int64_column(path, &batches, "coco_image_id")?;
    let texts = string_column(path, &batches, "caption")?;
    check_unique(path, "coco_caption_id", &ids)?;
    Ok(CaptionList { ids, image_ids, texts })
}

impl Images {
    /// The gallery from embeddings made in memory (a trained run's image tower).
    ///
    /// # Shapes
    /// `data`: `[ids.len() * dim]`, row-major, row `i` the embedding of `ids[i]`.
    pub fn from_rows(ids: Vec<i64>, dim: usize, data: Vec<f32>) -> Images {
        let rows = ids.len();
        Images { ids, embeddings: Matrix::new(rows, dim, data) }
    }
}

impl Captions {
    /// The gallery from embeddings made in memory (a trained run's text tower).
    ///
    /// # Shapes
    /// `data`: `[ids.len() * dim]`, row-major; `image_ids`: `[ids.len()]`.
    pub fn from_rows(ids: Vec<i64>, image_ids: Vec<i64>, dim: usize, data: Vec<f32>) -> Captions {
        assert_eq!(ids.len(), image_ids.len(), "one image id per caption");
        let rows = ids.len();
        Captions { ids, image_ids, embeddings: Matrix::new(rows, dim, data) }
    }
}

/// Checks, before anything is embedded, that there is something to evaluate and that every
/// caption's image is in the image gallery (otherwise its COCO positive could never be retrieved).
pub fn check_ids(
    image_ids: &[i64],
    caption_ids: &[i64],
    caption_image_ids: &[i64],
    images_path: &Path,
    captions_path: &Path,
) -> Result<()> {
    if image_ids.is_empty() || caption_ids.is_empty() {
        return Err(Error::data(format!(
            "nothing to evaluate: {} image(s) in `{}`, {} caption(s) in `{}`",
            image_ids.len(),
            images_path.display(),
            caption_ids.len(),
            captions_path.display()
        )));
    }
    let known: rustc_hash::FxHashSet<i64> = image_ids.iter().copied().collect();
    let missing: Vec<(i64, i64)> = caption_ids
        .iter()
        .zip(caption_image_ids)
        .filter(|(_, im)| !known.contains(im))
        .map(|(&c, &im)| (c, im))
        .collect();
    if let Some(&(c, im)) = missing.first() {
        return Err(Error::Data {
            message: format!(
                "{} caption(s) of `{}` belong to images absent from `{}` (first: caption {c}, image {im})",
                missing.len(),
                captions_path.display(),
                images_path.display()
            ),
            hint: Some("embed the images of every caption (the COCO 5K test split has 5,000 images)".into()),
        });
    }
    Ok(())
}

/// Checks that the two galleries can be scored against each other and that every caption's
/// image is in the image gallery (otherwise its COCO positive could never be retrieved).
pub fn check_pair(images: &Images, captions: &Captions, images_path: &Path, captions_path: &Path) -> Result<()> {
    // An empty table has no width (0 is a stand-in): say there is nothing to evaluate before
    // comparing widths, or "widths differ: 0 and 16" sends the reader after the wrong fault.
    if images.ids.is_empty() || captions.ids.is_empty() {
        return check_ids(&images.ids, &captions.ids, &captions.image_ids, images_path, captions_path);
    }
    if images.embeddings.dim != captions.embeddings.dim {
        return Err(Error::Data {
            message: format!(
                "embedding widths differ: `{}` has {} and `{}` has {}",
                images_path.display(),
                images.embeddings.dim,
                captions_path.display(),
                captions.embeddings.dim
            ),
            hint: Some("image and caption embeddings must come from the same dual encoder".into()),
        });
    }
    check_ids(&images.ids, &captions.ids, &captions.image_ids, images_path, captions_path)
}

fn column<'a>(path: &Path, batches: &'a [RecordBatch], name: &str) -> Result<Vec<&'a dyn Array>> {
    let mut out = Vec::with_capacity(batches.len());
    for b in batches {
        let Some(c) = b.column_by_name(name) else {
            let have: Vec<String> = b.schema().fields().iter().map(|f| format!("`{}`", f.name())).collect();
            return Err(Error::Schema {
                message: format!("`{}` has no column `{name}` (columns: {})", path.display(), have.join(", ")),
                hint: crate::error::did_you_mean(name, b.schema().fields().iter().map(|f| f.name().as_str())),
            });
        };
        if c.null_count() > 0 {
            return Err(Error::Data {
                message: format!("column `{name}` of `{}` has {} null value(s)", path.display(), c.null_count()),
                hint: None,
            });
        }
        out.push(c.as_ref());
    }
    Ok(out)
}

fn int64_column(path: &Path, batches: &[RecordBatch], name: &str) -> Result<Vec<i64>> {
    let mut out = Vec::new();
    for c in column(path, batches, name)? {
        if c.data_type() != &DataType::Int64 {
            return Err(Error::Schema {
                message: format!("column `{name}` of `{}` is {}, not Int64", path.display(), c.data_type()),
                hint: Some(format!("write `{name}` as int64 (COCO ids)")),
            });
        }
        out.extend_from_slice(c.as_primitive::<Int64Type>().values());
    }
    Ok(out)
}

/// The `uncertainty` column of an embeddings table (`--similarity csd`): each row's
/// `‖σ²‖₁ = Σ_k exp(v_k)` (float64 or float32), finite and non-negative, one per row.
pub fn read_uncertainty(path: &Path, rows: usize) -> Result<Vec<f64>> {
    let hint = "`--similarity csd` scores PCME++ embeddings: add an `uncertainty` column holding each row's \
                ‖σ²‖₁ = Σ exp(log σ²) (float64), or score by `cosine`";
    let batches = crate::io::parquet::read_file(path)?;
    let mut out = Vec::with_capacity(rows);
    let cols = column(path, &batches, "uncertainty").map_err(|e| match e {
        Error::Schema { message, .. } => Error::Schema { message, hint: Some(hint.into()) },
        e => e,
    })?;
    for c in cols {
        match c.data_type() {
            DataType::Float64 => out.extend_from_slice(c.as_primitive::<Float64Type>().values()),
            DataType::Float32 => out.extend(c.as_primitive::<Float32Type>().values().iter().map(|&v| v as f64)),
            other => {
                return Err(Error::Schema {
                    message: format!("column `uncertainty` of `{}` is {other}, not Float64", path.display()),
                    hint: Some(hint.into()),
                })
            }
        }
    }
    if let Some(row) = out.iter().position(|u| !(u.is_finite() && *u >= 0.0)) {
        return Err(Error::Data {
            message: format!(
                "`uncertainty` of `{}` is {} at row {row}: ‖σ²‖₁ is finite and non-negative",
                path.display(),
                out[row]
            ),
            hint: None,
        });
    }
    assert_eq!(out.len(), rows, "the table was read whole before");
    Ok(out)
}

fn string_column(path: &Path, batches: &[RecordBatch], name: &str) -> Result<Vec<String>> {
    let mut out = Vec::new();
    for c in column(path, batches, name)? {
        if !matches!(c.data_type(), DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) {
            return Err(Error::Schema {
                message: format!("column `{name}` of `{}` is {}, not a string", path.display(), c.data_type()),
                hint: None,
            });
        }
        let c = arrow_cast::cast(c, &DataType::Utf8)?;
        out.extend(c.as_string::<i32>().iter().map(|s| s.unwrap_or_default().to_owned()));
    }
    Ok(out)
}

fn embedding_column(path: &Path, batches: &[RecordBatch], name: &str) -> Result<Matrix> {
    let mut dim = None;
    let mut data = Vec::new();
    let mut rows = 0;
    for c in column(path, batches, name)? {
        let d = match c.data_type() {
            DataType::FixedSizeList(item, d) if item.data_type() == &DataType::Float32 => *d as usize,
            other => {
                return Err(Error::Schema {
                    message: format!("column `{name}` of `{}` is {other}, not FixedSizeList<Float32>", path.display()),
                    hint: Some("store embeddings as fixed-size lists of float32 (what `curate run` writes)".into()),
                })
            }
        };
        if dim.is_some_and(|x| x != d) {
            return Err(Error::data(format!(
                "column `{name}` of `{}` changes width between row groups",
                path.display()
            )));
        }
        dim = Some(d);
        let list = c.as_fixed_size_list();
        let values = list.values().as_primitive::<Float32Type>();
        if values.null_count() > 0 {
            return Err(Error::data(format!("column `{name}` of `{}` has null elements", path.display())));
        }
        // A sliced list array starts at an offset into its values.
        let start = list.offset() * d;
        let vals = &values.values()[start..start + list.len() * d];
        if let Some(i) = vals.iter().position(|x| !x.is_finite()) {
            return Err(Error::data(format!(
                "column `{name}` of `{}` has a non-finite value (row {})",
                path.display(),
                rows + i / d.max(1)
            )));
        }
        data.extend_from_slice(vals);
        rows += list.len();
    }
    let dim = dim.unwrap_or(0);
    if rows > 0 && dim == 0 {
        return Err(Error::data(format!("column `{name}` of `{}` has width 0", path.display())));
    }
    Ok(Matrix::new(rows, dim, data))
}

fn check_unique(path: &Path, name: &str, ids: &[i64]) -> Result<()> {
    let mut first: FxHashMap<i64, usize> = FxHashMap::default();
    for (row, &id) in ids.iter().enumerate() {
        if let Some(prev) = first.insert(id, row) {
            return Err(Error::Data {
                message: format!("`{}`: {name} {id} appears twice (rows {prev} and {row})", path.display()),
                hint: Some("each gallery item must appear once; drop the duplicate rows".into()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow_array::builder::{FixedSizeListBuilder, Float32Builder};
    use arrow_array::{ArrayRef, Int64Array};
    use arrow_schema::{Field, Schema};
    use parquet::arrow::ArrowWriter;
    use parquet::file::properties::WriterProperties;

    use super::*;

    /// An images table of `rows` rows in row groups of 3 (`null_at`: a null embedding element).
    fn write(path: &Path, rows: usize, dim: usize, null_at: Option<usize>) {
        let mut b = FixedSizeListBuilder::new(Float32Builder::new(), dim as i32);
        for r in 0..rows {
            for k in 0..dim {
                if null_at == Some(r * dim + k) {
                    b.values().append_null();
                } else {
                    b.values().append_value((r * dim + k) as f32 / 7.0);
                }
            }
            b.append(true);
        }
        let cols: Vec<(&str, ArrayRef)> = vec![
            ("coco_image_id", Arc::new(Int64Array::from_iter_values(0..rows as i64))),
            ("embedding", Arc::new(b.finish())),
        ];
        let schema = Arc::new(Schema::new(
            cols.iter().map(|(n, a)| Field::new(*n, a.data_type().clone(), true)).collect::<Vec<_>>(),
        ));
        let batch = RecordBatch::try_new(schema.clone(), cols.into_iter().map(|c| c.1).collect()).unwrap();
        let props = WriterProperties::builder().set_max_row_group_size(3).build();
        let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    #[test]
    fn the_column_reader_path_equals_the_arrow_path() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("images.parquet");
        write(&p, 8, 5, None);
        let (ids, fast) = read_clean(&p, &["coco_image_id"], "embedding").expect("a clean table");
        let batches = crate::io::parquet::read_file(&p).unwrap();
        assert_eq!(ids, vec![int64_column(&p, &batches, "coco_image_id").unwrap()]);
        assert_eq!(fast, embedding_column(&p, &batches, "embedding").unwrap());
        assert_eq!((fast.rows, fast.dim, fast.data[12]), (8, 5, 12.0 / 7.0));
        // A null element: the general path reads the file and names the problem.
        write(&p, 8, 5, Some(17));
        assert!(read_clean(&p, &["coco_image_id"], "embedding").is_none());
        let e = read_images(&p).unwrap_err().to_string();
        assert!(e.contains("null"), "{e}");
    }

    #[test]
    fn a_damaged_table_is_read_or_refused_by_name_never_a_panic() {
        // The parquet crate panics on some damaged files, in the fast path's column reader too.
        let dir = tempfile::tempdir().unwrap();
        let (good, bad) = (dir.path().join("good.parquet"), dir.path().join("bad.parquet"));
        write(&good, 8, 5, None);
        let bytes = std::fs::read(&good).unwrap();
        for at in 4..bytes.len() - 8 {
            let mut damaged = bytes.clone();
            damaged[at] ^= 1;
            std::fs::write(&bad, &damaged).unwrap();
            match std::panic::catch_unwind(|| read_images(&bad)) {
                Err(_) => panic!("byte {at}: reading panicked"),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => assert!(e.to_string().contains(&bad.display().to_string()), "byte {at}: {e}"),
            }
        }
    }
}
