//! Training data: the rows of one or more `curate run` output tables (`sample_id`, caption,
//! image `path`, or img2dataset's `shard` + `key` into webdataset tar shards under
//! `data.shards_dir`) as one training set, teacher features joined by `sample_id` (CUSA), and
//! batches made on worker threads ahead of the model.
//!
//! Determinism (DESIGN "Invariants"): the order of epoch `e` is a Fisher–Yates shuffle keyed by
//! `(seed, "epoch", e)`, and the augmentation of a row (`data.image_transform`, see
//! [`super::transform`]) by
//! `(seed, "augment/e", sample_id)`, so batch `s` is a pure function of `(seed, s)` — the same
//! whatever the worker count, and a resumed run sees exactly the batches an uninterrupted one
//! would. Worker `w` of `W` makes batches `w, w + W, ...` into its own bounded channel; the
//! trainer takes them round-robin, so the prefetch depth is bounded and the order fixed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;

use arrow_array::{Array, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
use arrow_schema::DataType;
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::config::TrainConfig;
use crate::error::{Error, Result};
use crate::io::PathPatterns;
use crate::models::preprocess::{decode, Rgb8};
use crate::rng::RowRng;

/// Where an image's bytes are: a file, or a member of a webdataset tar shard (found once by
/// indexing the shard, then read with one seek).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    File(PathBuf),
    Tar { shard: Arc<PathBuf>, offset: u64, len: u64 },
}

impl ImageSource {
    pub fn read(&self) -> Result<Vec<u8>> {
        match self {
            ImageSource::File(p) => std::fs::read(p).map_err(|e| Error::io("cannot read image", p, e)),
            ImageSource::Tar { shard, offset, len } => {
                use std::io::{Read, Seek, SeekFrom};
                let mut f =
                    std::fs::File::open(shard.as_path()).map_err(|e| Error::io("cannot open", shard.as_path(), e))?;
                let mut buf = vec![0u8; *len as usize];
                f.seek(SeekFrom::Start(*offset))
                    .and_then(|_| f.read_exact(&mut buf))
                    .map_err(|e| Error::io("cannot read tar member in", shard.as_path(), e))?;
                Ok(buf)
            }
        }
    }

    /// A stable name (for image ids and error messages).
    pub fn name(&self) -> String {
        match self {
            ImageSource::File(p) => p.to_string_lossy().into_owned(),
            ImageSource::Tar { shard, offset, .. } => format!("{}@{offset}", shard.display()),
        }
    }
}

/// `key` → (data offset, length) of the image members of a webdataset shard.
type ShardIndex = HashMap<String, (u64, u64)>;

/// The shard's images by key, as the pipeline's image stages take them
/// ([`crate::stages::images`]): regular or contiguous members with an image extension, the
/// first image of the key's sample (a run of consecutive members with that key). A key with
/// different images in two samples is left out (its rows count as missing images): which is a
/// row's cannot be told by its key.
fn index_shard(path: &Path) -> Result<ShardIndex> {
    use std::io::{Read, Seek, SeekFrom};
    let file = std::fs::File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut archive = tar::Archive::new(file);
    let mut out: ShardIndex = HashMap::new();
    // The sample (run of consecutive members with one key) each key's image was taken from, and
    // the keys with different images in two samples.
    let (mut sample, mut previous_key) = (0usize, None::<String>);
    let mut taken_from: HashMap<String, usize> = HashMap::new();
    let mut ambiguous = Vec::new();
    let read_at = |offset: u64, len: u64| -> Result<Vec<u8>> {
        let mut f = std::fs::File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
        f.seek(SeekFrom::Start(offset)).map_err(|e| Error::io("cannot read", path, e))?;
        let mut buf = vec![0; len as usize];
        f.read_exact(&mut buf).map_err(|e| Error::io("cannot read", path, e))?;
        Ok(buf)
    };
    for entry in archive.entries_with_seek().map_err(|e| Error::io("cannot read tar", path, e))? {
        let mut entry = entry.map_err(|e| Error::io("corrupt tar member in", path, e))?;
        let kind = entry.header().entry_type();
        if !(kind.is_file() || kind.is_contiguous()) {
            continue;
        }
        let name = entry.path().map_err(|e| Error::io("bad member name in", path, e))?.to_string_lossy().into_owned();
        let (key, ext) = crate::io::tar_shards::member_key(&name);
        if previous_key.as_deref() != Some(key.as_str()) {
            sample += 1;
            previous_key = Some(key.clone());
        }
        if !crate::stages::images::TAR_IMAGE_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str()) {
            continue;
        }
        match (taken_from.get(&key), out.get(&key)) {
            (Some(&first), Some(&(offset, len))) if first != sample => {
                let mut again = Vec::new();
                entry.read_to_end(&mut again).map_err(|e| Error::io("cannot read tar member in", path, e))?;
                if read_at(offset, len)? != again {
                    ambiguous.push(key);
                }
            }
            (Some(_), _) => {}
            (None, _) => {
                taken_from.insert(key.clone(), sample);
                out.insert(key, (entry.raw_file_position(), entry.size()));
            }
        }
    }
    for key in ambiguous {
        out.remove(&key);
    }
    Ok(out)
}

/// One image-caption pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub sample_id: String,
    pub caption: String,
    pub image: ImageSource,
}

/// The training set: every row of every table, in table order.
#[derive(Debug, Clone)]
pub struct TrainSet {
    pub samples: Vec<Sample>,
    /// Teacher image / text features, row-aligned with `samples` (`[n, d]` row-major).
    pub teacher_image: Option<(Vec<f32>, usize)>,
    pub teacher_text: Option<(Vec<f32>, usize)>,
    /// Rows left out because their image file does not exist.
    pub missing_images: usize,
    /// Rows left out because their `sample_id` or caption is null (or the caption blank), or
    /// they name no image at all (no path, no shard and key).
    pub incomplete_rows: usize,
    /// Rows left out because `data.pre_caption` left nothing of their caption.
    pub emptied_captions: usize,
    /// Rows whose caption `data.noise_ratio` took from another row.
    pub noisy_rows: usize,
}

impl TrainSet {
    /// Rows whose caption is also the caption of a row with another image: the false negatives
    /// of in-batch and memory-bank contrast (spec `bow-and-otter.md` §4: BoW captions are short,
    /// so identical strings for different images are common; log the rate, do not dedupe).
    pub fn shared_captions(&self) -> usize {
        // Caption → its first row's image, and whether another image has it too.
        let mut seen: HashMap<&str, (String, bool)> = HashMap::with_capacity(self.samples.len());
        for s in &self.samples {
            let image = s.image.name();
            match seen.get_mut(s.caption.as_str()) {
                Some((first, shared)) => *shared |= *first != image,
                None => {
                    seen.insert(&s.caption, (image, false));
                }
            }
        }
        self.samples.iter().filter(|s| seen[s.caption.as_str()].1).count()
    }
}

/// PCME++'s noisy correspondence, as its loader draws it: `floor(ratio · n)` positions chosen at
/// random, their captions shuffled among them. Returns, per row, the row whose caption it gets.
pub fn noisy_correspondence(n: usize, ratio: f64, seed: u64) -> Vec<usize> {
    let k = ((ratio * n as f64).floor() as usize).min(n);
    let mut rng = RowRng::new(seed, "noise_ratio", "captions");
    let mut order: Vec<usize> = (0..n).collect();
    rng.shuffle(&mut order);
    let chosen: Vec<usize> = (0..n).filter(|&i| order[i] < k).collect();
    let mut shuffled = chosen.clone();
    rng.shuffle(&mut shuffled);
    let mut from: Vec<usize> = (0..n).collect();
    for (&i, &j) in chosen.iter().zip(&shuffled) {
        from[i] = j;
    }
    from
}

/// A column of a table as strings (any Arrow string type).
pub(crate) fn string_column(batch: &RecordBatch, name: &str, file: &Path) -> Result<Vec<Option<String>>> {
    let col = batch.column_by_name(name).ok_or_else(|| Error::Schema {
        message: format!("`{}` has no column `{name}`", file.display()),
        hint: Some(crate::error::column_hint(
            name,
            &batch.schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>(),
        )),
    })?;
    let col = arrow_cast::cast(col, &DataType::Utf8)?;
    let s = col.as_any().downcast_ref::<StringArray>().expect("cast to Utf8");
    Ok((0..s.len()).map(|i| s.is_valid(i).then(|| s.value(i).to_owned())).collect())
}

fn expand(p: &PathPatterns) -> Result<Vec<PathBuf>> {
    p.expand().map_err(Error::data)
}

/// Where feature tables come from (a hint).
const FEATURE_TABLES: &str = "feature tables are outputs of the encode_text / encode_image stages: `sample_id` and \
                              `embedding`, a list of floats of one width";

/// `embedding` as a fixed-width list: itself, or a variable-length list (what pandas and polars
/// write) whose rows all have the first row's length.
fn fixed_width(col: &arrow_array::ArrayRef, file: &Path) -> Result<arrow_array::ArrayRef> {
    use arrow_array::Array;
    let item = match col.data_type() {
        DataType::List(f) | DataType::LargeList(f) => f.clone(),
        _ => return Ok(col.clone()),
    };
    let lengths: Vec<usize> = match col.data_type() {
        DataType::List(_) => {
            let l = col.as_any().downcast_ref::<arrow_array::ListArray>().expect("a list");
            (0..l.len()).filter(|&i| l.is_valid(i)).map(|i| l.value_length(i) as usize).collect()
        }
        _ => {
            let l = col.as_any().downcast_ref::<arrow_array::LargeListArray>().expect("a large list");
            (0..l.len()).filter(|&i| l.is_valid(i)).map(|i| l.value_length(i) as usize).collect()
        }
    };
    let Some(&width) = lengths.first() else { return Ok(col.clone()) };
    if let Some(other) = lengths.iter().find(|&&w| w != width) {
        return Err(Error::Data {
            message: format!(
                "`{}`: the rows of `embedding` have different lengths ({width} and {other}); features have one width",
                file.display()
            ),
            hint: Some(FEATURE_TABLES.into()),
        });
    }
    Ok(arrow_cast::cast(col, &DataType::FixedSizeList(item, width as i32))?)
}

/// `sample_id` → embedding of the feature tables `files` (`encode_text` / `encode_image` output).
///
/// Every table must have the same width: rows are gathered by a fixed stride later (and mined
/// against one run's width), so a narrower table would be read past its end and a wider one
/// silently misaligned. A non-finite or null value is refused here, naming file, column and row,
/// as `curate eval` does: found later it only shows as a NaN loss that points at the learning
/// rate.
pub(crate) fn read_features(files: &[PathBuf]) -> Result<(HashMap<String, Vec<f32>>, usize)> {
    let mut out = HashMap::new();
    // The width and the file it was first seen in.
    let mut first: Option<(usize, &Path)> = None;
    for file in files {
        let mut row = 0;
        for batch in crate::io::parquet::read_file(file)? {
            let ids = string_column(&batch, "sample_id", file)?;
            let col = batch.column_by_name("embedding").ok_or_else(|| Error::Schema {
                message: format!("`{}` has no column `embedding`", file.display()),
                hint: Some(crate::error::column_hint(
                    "embedding",
                    &batch.schema().fields().iter().map(|f| f.name().as_str()).collect::<Vec<_>>(),
                )),
            })?;
            let fixed = fixed_width(col, file)?;
            let list = fixed.as_any().downcast_ref::<FixedSizeListArray>().ok_or_else(|| Error::Schema {
                message: format!("`{}`: `embedding` is {}, not a list of floats", file.display(), col.data_type()),
                hint: Some(FEATURE_TABLES.into()),
            })?;
            let d = list.value_length() as usize;
            // Float16 and Float64 features are read as Float32 (spec `cusa-and-pcmepp.md` §1.3:
            // fp16 is acceptable); curate's encode stages write Float32.
            let values = match list.values().data_type() {
                DataType::Float16 | DataType::Float64 => arrow_cast::cast(list.values(), &DataType::Float32)?,
                _ => list.values().clone(),
            };
            let values = values.as_any().downcast_ref::<Float32Array>().ok_or_else(|| Error::Schema {
                message: format!(
                    "`{}`: `embedding` values are {}, not Float32 (or Float16, Float64)",
                    file.display(),
                    list.values().data_type()
                ),
                hint: None,
            })?;
            match first {
                Some((w, at)) if w != d => {
                    return Err(Error::Data {
                        message: format!(
                            "feature widths differ: `{}` has {w}-d embeddings, `{}` has {d}-d",
                            at.display(),
                            file.display()
                        ),
                        hint: Some("list tables of one encoder only (the same `encode_*` stage's outputs)".into()),
                    })
                }
                Some(_) => {}
                None => first = Some((d, file.as_path())),
            }
            if d == 0 && list.len() > 0 {
                return Err(Error::Data {
                    message: format!("`{}`: column `embedding` has width 0", file.display()),
                    hint: Some(FEATURE_TABLES.into()),
                });
            }
            for (i, id) in ids.into_iter().enumerate() {
                let Some(id) = id else { continue };
                let start = (list.offset() + i) * d;
                let v = &values.values()[start..start + d];
                let null = list.is_null(i) || (start..start + d).any(|k| values.is_null(k));
                if null || v.iter().any(|x| !x.is_finite()) {
                    // A finite Float64 value that Float32 cannot hold is no NaN: say which.
                    let too_large = list
                        .values()
                        .as_any()
                        .downcast_ref::<arrow_array::Float64Array>()
                        .is_some_and(|f| f.values()[start..start + d].iter().all(|x| x.is_finite()));
                    let (what, read_as) = match (null, too_large) {
                        (true, _) => ("a null value", ""),
                        (false, true) => ("a value past Float32's range", "features are read as Float32: "),
                        (false, false) => ("a non-finite value", ""),
                    };
                    return Err(Error::Data {
                        message: format!(
                            "column `embedding` of `{}` has {what} (row {}, sample `{id}`)",
                            file.display(),
                            row + i
                        ),
                        hint: Some(format!("{read_as}re-encode that table, or leave that row out of it")),
                    });
                }
                if out.insert(id.clone(), v.to_vec()).is_some() {
                    return Err(Error::Data {
                        message: format!(
                            "sample `{id}` has features twice (the second in `{}`, row {})",
                            file.display(),
                            row + i
                        ),
                        hint: Some("list each feature table once, with one row per `sample_id`".into()),
                    });
                }
            }
            row += batch.num_rows();
        }
    }
    // No row to join (and no width: 0 would divide the readers' row counts by zero).
    if out.is_empty() {
        let names: Vec<String> = files.iter().take(3).map(|f| format!("`{}`", f.display())).collect();
        return Err(Error::Data {
            message: format!(
                "the feature tables hold no rows with a `sample_id` ({}{})",
                names.join(", "),
                if files.len() > 3 { format!(" and {} more", files.len() - 3) } else { String::new() }
            ),
            hint: Some(FEATURE_TABLES.into()),
        });
    }
    Ok((out, first.map_or(0, |(d, _)| d)))
}

/// The first file of `files` that an earlier one names too, however spelt (`data/x.parquet`,
/// `./data/x.parquet`, a link to it): the same file, by its canonical path.
pub fn listed_twice(files: &[PathBuf]) -> Option<&PathBuf> {
    let real: Vec<PathBuf> = files.iter().map(|f| f.canonicalize().unwrap_or_else(|_| f.clone())).collect();
    (0..files.len()).find(|&i| real[..i].contains(&real[i])).map(|i| &files[i])
}

impl TrainSet {
    /// Reads every table of `data.tables` (each once); rows without id, caption (or with a blank
    /// one) or image reference are counted in `incomplete_rows`, rows whose image file does not
    /// exist in `missing_images`. With teacher features, ids must be unique (the features join
    /// by them).
    pub fn load(c: &TrainConfig) -> Result<TrainSet> {
        let d = &c.data;
        let mut samples = Vec::new();
        let (mut missing_images, mut incomplete_rows, mut emptied_captions) = (0, 0, 0);
        let mut shards: HashMap<String, (Arc<PathBuf>, ShardIndex)> = HashMap::new();
        let files = expand(&d.tables)?;
        if let Some(twice) = listed_twice(&files) {
            return Err(Error::Data {
                message: format!("`{}` is listed twice in `data.tables` (two patterns match it)", twice.display()),
                hint: Some("list each table once: its rows would be trained on twice as often".into()),
            });
        }
        for file in files {
            for batch in crate::io::parquet::read_file(&file)? {
                let ids = string_column(&batch, "sample_id", &file)?;
                let captions = string_column(&batch, &d.caption_column, &file)?;
                let n = batch.num_rows();
                let has = |c: &str| batch.column_by_name(c).is_some();
                let paths = if has(&d.image_column) || d.shards_dir.is_none() {
                    string_column(&batch, &d.image_column, &file)?
                } else {
                    vec![None; n]
                };
                let (shard_col, key_col) = match &d.shards_dir {
                    Some(_) if has("shard") && has("key") => {
                        (string_column(&batch, "shard", &file)?, string_column(&batch, "key", &file)?)
                    }
                    // Neither reference: as without `shards_dir`, the table cannot train.
                    Some(_) if !has(&d.image_column) => {
                        return Err(Error::Schema {
                            message: format!(
                                "`{}` has no column `{}`, nor `shard` and `key`",
                                file.display(),
                                d.image_column
                            ),
                            hint: Some("each row names its image: a path, or a tar shard and key".into()),
                        })
                    }
                    _ => (vec![None; n], vec![None; n]),
                };
                for (i, ((id, caption), path)) in ids.into_iter().zip(captions).zip(paths).enumerate() {
                    // A blank caption is no caption, as the readers and `encode_text` take it.
                    let (Some(sample_id), Some(caption)) = (id, caption.filter(|c| !c.trim().is_empty())) else {
                        incomplete_rows += 1;
                        continue;
                    };
                    // CUSA's normalisation (spec `cusa-and-pcmepp.md` §1.2), what the student's
                    // tokenizer sees; the reference refuses a caption it empties.
                    let caption = match d.pre_caption {
                        true => match crate::text::pre_caption(&caption, crate::text::PRE_CAPTION_WORDS) {
                            Some(c) => c,
                            None => {
                                emptied_captions += 1;
                                continue;
                            }
                        },
                        false => caption,
                    };
                    let image = match (path, &shard_col[i], &key_col[i], &d.shards_dir) {
                        (Some(path), ..) => {
                            let image = match &d.image_root {
                                Some(root) => root.join(path),
                                None => PathBuf::from(path),
                            };
                            image.is_file().then_some(ImageSource::File(image))
                        }
                        (None, Some(shard), Some(key), Some(dir)) => {
                            if !shards.contains_key(shard) {
                                let p = dir.join(format!("{shard}.tar"));
                                let index = if p.is_file() { index_shard(&p)? } else { HashMap::new() };
                                shards.insert(shard.clone(), (Arc::new(p), index));
                            }
                            let (p, index) = &shards[shard];
                            index.get(key).map(|&(offset, len)| ImageSource::Tar { shard: p.clone(), offset, len })
                        }
                        _ => {
                            incomplete_rows += 1;
                            continue;
                        }
                    };
                    match image {
                        Some(image) => samples.push(Sample { sample_id, caption, image }),
                        None => missing_images += 1,
                    }
                }
            }
        }
        if samples.len() < c.batch_size {
            return Err(Error::Data {
                message: format!("{} usable training pairs, fewer than one batch of {}", samples.len(), c.batch_size),
                hint: Some("check `data.tables`, the image paths (relative to the working directory or `data.image_root`) and `batch_size`".into()),
            });
        }
        let join = |patterns: &Option<PathPatterns>, what: &str| -> Result<Option<(Vec<f32>, usize)>> {
            let Some(p) = patterns else { return Ok(None) };
            // Features join by `sample_id`: two rows with one id would get the same features.
            let mut seen = std::collections::HashSet::with_capacity(samples.len());
            if let Some(s) = samples.iter().find(|s| !seen.insert(s.sample_id.as_str())) {
                return Err(Error::Data {
                    message: format!(
                        "sample `{}` is in the training tables twice: teacher features join by `sample_id`",
                        s.sample_id
                    ),
                    hint: Some("give the tables distinct ids (for example a prefix per data set)".into()),
                });
            }
            let (table, dim) = read_features(&expand(p)?)?;
            // Every training row without features is counted, so that one run says how far the
            // tables are apart (a wrong file, or ids made another way), with a few of the ids.
            let missing: Vec<&str> =
                samples.iter().map(|s| s.sample_id.as_str()).filter(|id| !table.contains_key(*id)).collect();
            if !missing.is_empty() {
                let shown: Vec<String> = missing.iter().take(3).map(|id| format!("`{id}`")).collect();
                return Err(Error::Data {
                    message: format!(
                        "{} of {} training rows have no teacher {what} features (for example {}); the teacher \
                         tables hold {} ids",
                        missing.len(),
                        samples.len(),
                        shown.join(", "),
                        table.len()
                    ),
                    hint: Some(
                        "teacher tables must cover every training row (join by `sample_id`): extract them from \
                         the same tables as `data.tables`"
                            .into(),
                    ),
                });
            }
            let mut out = Vec::with_capacity(samples.len() * dim);
            for s in &samples {
                out.extend_from_slice(&table[&s.sample_id]);
            }
            // Every loss uses them L2-normalised: rows of any scale are as good.
            crate::models::pooling::scale_rows_for_normalising(&mut out, dim);
            Ok(Some((out, dim)))
        };
        let teacher_image = join(&d.teacher_image, "image")?;
        let mut teacher_text = join(&d.teacher_text, "text")?;
        let noisy_rows = if d.noise_ratio > 0.0 {
            let from = noisy_correspondence(samples.len(), d.noise_ratio, c.seed);
            let captions: Vec<String> = from.iter().map(|&j| samples[j].caption.clone()).collect();
            for (s, caption) in samples.iter_mut().zip(captions) {
                s.caption = caption;
            }
            // A caption's teacher features go with it.
            if let Some((v, dim)) = &mut teacher_text {
                *v = from.iter().flat_map(|&j| v[j * *dim..(j + 1) * *dim].to_vec()).collect();
            }
            from.iter().enumerate().filter(|&(i, &j)| i != j).count()
        } else {
            0
        };
        Ok(TrainSet {
            samples,
            teacher_image,
            teacher_text,
            missing_images,
            incomplete_rows,
            emptied_captions,
            noisy_rows,
        })
    }

    pub fn steps_per_epoch(&self, batch_size: usize) -> u64 {
        (self.samples.len() / batch_size) as u64
    }
}

/// The tokenizer of a model folder, truncating at `max_tokens` and padding to the longest text
/// of each batch with the model's `pad_token_id`.
pub fn load_tokenizer(dir: &Path, max_tokens: usize) -> Result<Tokenizer> {
    let model_err = |m: String| Error::Model { message: m, hint: None };
    let (mut tok, path) = crate::models::text_encoder::load_tokenizer_file(dir)?;
    tok.with_truncation(Some(TruncationParams { max_length: max_tokens, ..Default::default() }))
        .map_err(|e| model_err(format!("tokenizer truncation: {e}")))?;
    let config_path = dir.join("config.json");
    let config: Option<serde_json::Value> =
        std::fs::read_to_string(&config_path).ok().and_then(|t| serde_json::from_str(&t).ok());
    // An id past u32 saturates, to be refused below rather than wrapped to a valid one.
    let pad_id =
        config.as_ref().and_then(|v| v["pad_token_id"].as_u64()).map_or(0, |v| u32::try_from(v).unwrap_or(u32::MAX));
    let pad_token = tok.id_to_token(pad_id).unwrap_or_else(|| "[PAD]".into());
    tok.with_padding(Some(PaddingParams {
        strategy: PaddingStrategy::BatchLongest,
        pad_id,
        pad_token,
        ..Default::default()
    }));
    // Every id must index the text tower's embedding table, as `encode_text` checks: a stray
    // one would stop the run at the batch that meets it. (An open_clip folder has no
    // config.json: its pad id is 0, as open_clip pads, and its vocabulary is in
    // open_clip_config.json.)
    let open_clip_path = dir.join(crate::models::clip_text::OpenClipConfig::FILE);
    let (rows, rows_from) = match config.as_ref().and_then(|v| v["vocab_size"].as_u64()) {
        Some(rows) => (Some(rows), &config_path),
        None => {
            let open_clip: Option<serde_json::Value> =
                std::fs::read_to_string(&open_clip_path).ok().and_then(|t| serde_json::from_str(&t).ok());
            let rows = open_clip.and_then(|v| v["model_cfg"]["text_cfg"]["vocab_size"].as_u64());
            (rows, &open_clip_path)
        }
    };
    if let Some(rows) = rows {
        let rows = usize::try_from(rows).unwrap_or(usize::MAX);
        crate::models::text_encoder::check_ids_fit(&tok, &path, rows, (pad_id, &config_path), rows_from)?;
    }
    Ok(tok)
}

/// Token ids and attention mask of `texts`, padded to the longest.
pub fn tokenize(tok: &Tokenizer, texts: &[&str]) -> Result<(Vec<i64>, Vec<i64>, usize)> {
    let enc = tok
        .encode_batch(texts.to_vec(), true)
        .map_err(|e| Error::Model { message: format!("tokenizer failed: {e}"), hint: None })?;
    let s = enc.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(texts.len() * s);
    let mut mask = Vec::with_capacity(texts.len() * s);
    for e in &enc {
        ids.extend(e.get_ids().iter().map(|&i| i as i64));
        mask.extend(e.get_attention_mask().iter().map(|&m| m as i64));
    }
    Ok((ids, mask, s))
}

/// PCME++'s caption augmentation (its loader's `process_caption` for BERT-family tokenizers and
/// `process_caption_vit` for CLIP's BPE, spec `cusa-and-pcmepp.md` §3.9 \[ref\]): each unit — a
/// word (BERT: the tokenizer's pre-tokenized words) or a token (CLIP) — is picked with
/// probability 0.2, and a picked unit has all its tokens made `mask_id` (half of them: BERT's
/// `[MASK]`, the BPE id of `M` for CLIP), each token made a uniformly random vocabulary entry
/// (a tenth; `vocab` lists the vocabulary's ids), or the unit deleted (the rest). Special tokens
/// are never touched. `word_ids` gives each token's unit (`None` for special tokens), as
/// `Encoding::get_word_ids` does for words ([`AugmentUnit`]).
pub fn augment_caption(
    ids: &[u32],
    word_ids: &[Option<u32>],
    mask_id: u32,
    vocab: &[u32],
    rng: &mut RowRng,
) -> Vec<u32> {
    let mut out = Vec::with_capacity(ids.len());
    let mut i = 0;
    while i < ids.len() {
        let Some(word) = word_ids[i] else {
            out.push(ids[i]);
            i += 1;
            continue;
        };
        let end = i + word_ids[i..].iter().take_while(|w| **w == Some(word)).count();
        let p = unit(rng);
        if p < 0.2 {
            let p = p / 0.2;
            if p < 0.5 {
                out.extend(std::iter::repeat_n(mask_id, end - i));
            } else if p < 0.6 {
                out.extend((i..end).map(|_| vocab[rng.below(vocab.len() as u64) as usize]));
            }
            // Otherwise the word is deleted.
        } else {
            out.extend_from_slice(&ids[i..end]);
        }
        i = end;
    }
    out
}

/// What [`augment_caption`] picks and masks: words (BERT-family tokenizers, `[MASK]`) or tokens
/// (CLIP's BPE, the id of `M`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AugmentUnit {
    Word,
    Token,
}

/// Why `data.caption_augment` cannot run with the tokenizer in `dir` ([`augment_vocabulary`]
/// found no mask token), said after the key's name; [`NO_MASK_TOKEN_HINT`] goes with it.
pub fn no_mask_token(dir: &Path) -> String {
    format!(
        "masks words with `[MASK]` (or CLIP's BPE tokens with `M`), and the tokenizer of `{}` has neither",
        dir.display()
    )
}

/// The hint that goes with [`no_mask_token`].
pub const NO_MASK_TOKEN_HINT: &str =
    "caption augmentation is PCME++'s for BERT-family and CLIP tokenizers; leave it off";

/// What [`augment_caption`] needs from a tokenizer: the mask id, its vocabulary's ids (sorted)
/// and the unit — `[MASK]` and words for a BERT-family tokenizer, the BPE symbol `M` and tokens
/// for CLIP's (one with `<|endoftext|>`); `None` for others.
pub fn augment_vocabulary(tok: &Tokenizer) -> Option<(u32, Vec<u32>, AugmentUnit)> {
    let (mask_id, unit) = match tok.token_to_id("[MASK]") {
        Some(id) => (id, AugmentUnit::Word),
        None if tok.token_to_id("<|endoftext|>").is_some() => (tok.token_to_id("M")?, AugmentUnit::Token),
        None => return None,
    };
    let mut ids: Vec<u32> = tok.get_vocab(true).into_values().collect();
    ids.sort_unstable();
    Some((mask_id, ids, unit))
}

/// PCME++'s caption augmentation of a batch maker: what [`augment_caption`] needs from the
/// tokenizer ([`augment_vocabulary`]), the tokenizer without truncation, and the cap.
pub struct CaptionAugment {
    pub mask_id: u32,
    pub vocab: Vec<u32>,
    pub unit: AugmentUnit,
    /// The text tower's tokenizer, truncating nothing: a caption is augmented whole, then capped
    /// (spec §3.9: the reference truncates nothing; curate caps, keeping the last token), so that
    /// the room its deleted words free is filled by the words that follow.
    pub tokenizer: Tokenizer,
    pub max_tokens: usize,
}

impl CaptionAugment {
    /// Token ids and attention mask of `texts`, each augmented by its own draws (`rngs[k]` for
    /// text `k`), then capped at `max_tokens` (the first `max_tokens − 1` tokens and the last,
    /// `[SEP]`), padded to the longest with the tokenizer's pad id.
    pub fn tokenize(&self, texts: &[&str], rngs: &mut [RowRng]) -> Result<(Vec<i64>, Vec<i64>, usize)> {
        let tok = &self.tokenizer;
        let pad = tok.get_padding().map_or(0, |p| p.pad_id);
        let mut rows = Vec::with_capacity(texts.len());
        for (text, rng) in texts.iter().zip(rngs) {
            let enc = tok
                .encode(*text, true)
                .map_err(|e| Error::Model { message: format!("tokenizer failed: {e}"), hint: None })?;
            // Single texts are not padded (BatchLongest pads a batch of one to itself).
            let tokens: Vec<Option<u32>>;
            let units = match self.unit {
                AugmentUnit::Word => enc.get_word_ids(),
                AugmentUnit::Token => {
                    let special = enc.get_special_tokens_mask();
                    tokens = (0..special.len()).map(|i| (special[i] == 0).then_some(i as u32)).collect();
                    &tokens
                }
            };
            let mut row = augment_caption(enc.get_ids(), units, self.mask_id, &self.vocab, rng);
            if row.len() > self.max_tokens && self.max_tokens > 0 {
                let last = row[row.len() - 1];
                row.truncate(self.max_tokens - 1);
                row.push(last);
            }
            rows.push(row);
        }
        let s = rows.iter().map(Vec::len).max().unwrap_or(0);
        let (mut ids, mut mask) = (Vec::with_capacity(rows.len() * s), Vec::with_capacity(rows.len() * s));
        for r in &rows {
            ids.extend(r.iter().map(|&i| i as i64).chain(std::iter::repeat_n(pad as i64, s - r.len())));
            mask.extend(std::iter::repeat_n(1, r.len()).chain(std::iter::repeat_n(0, s - r.len())));
        }
        Ok((ids, mask, s))
    }
}

/// A uniform float in `[0, 1)`.
pub(crate) fn unit(rng: &mut RowRng) -> f64 {
    (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64
}

/// torchvision's `RandomResizedCrop.get_params`: up to 10 tries of a random area fraction in
/// `scale` and log-uniform aspect ratio in `ratio`, falling back to the centre crop of the
/// clamped ratio. Returns `(x, y, width, height)` in pixels.
pub fn random_resized_crop(
    width: usize,
    height: usize,
    scale: [f64; 2],
    ratio: [f64; 2],
    rng: &mut RowRng,
) -> (usize, usize, usize, usize) {
    let area = (width * height) as f64;
    let (lr0, lr1) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target = area * (scale[0] + (scale[1] - scale[0]) * unit(rng));
        let aspect = (lr0 + (lr1 - lr0) * unit(rng)).exp();
        let w = (target * aspect).sqrt().round() as usize;
        let h = (target / aspect).sqrt().round() as usize;
        if 0 < w && w <= width && 0 < h && h <= height {
            let y = rng.below((height - h + 1) as u64) as usize;
            let x = rng.below((width - w + 1) as u64) as usize;
            return (x, y, w, h);
        }
    }
    let in_ratio = width as f64 / height as f64;
    let (w, h) = if in_ratio < ratio[0] {
        (width, ((width as f64 / ratio[0]).round() as usize).max(1))
    } else if in_ratio > ratio[1] {
        (((height as f64 * ratio[1]).round() as usize).max(1), height)
    } else {
        (width, height)
    };
    ((width - w) / 2, (height - h) / 2, w, h)
}

/// Bilinear resampling of the crop `(x, y, w, h)` of `img` to `out × out` (pixel centres,
/// as `align_corners=False`, no antialiasing), optionally mirrored, normalised with `mean` and
/// `std`, appended to `dst` as CHW.
pub fn crop_to_chw(
    img: &Rgb8,
    crop: (usize, usize, usize, usize),
    out: usize,
    flip: bool,
    mean: [f32; 3],
    std: [f32; 3],
    dst: &mut Vec<f32>,
) {
    let (x0, y0, w, h) = crop;
    let (sx, sy) = (w as f64 / out as f64, h as f64 / out as f64);
    let px = |x: usize, y: usize, c: usize| img.data[(y * img.width + x) * 3 + c] as f64;
    let start = dst.len();
    dst.resize(start + 3 * out * out, 0.0);
    for oy in 0..out {
        let fy = (y0 as f64 + (oy as f64 + 0.5) * sy - 0.5).clamp(0.0, (img.height - 1) as f64);
        let (ya, ty) = (fy.floor() as usize, fy - fy.floor());
        let yb = (ya + 1).min(img.height - 1);
        for ox in 0..out {
            let fx = (x0 as f64 + (ox as f64 + 0.5) * sx - 0.5).clamp(0.0, (img.width - 1) as f64);
            let (xa, tx) = (fx.floor() as usize, fx - fx.floor());
            let xb = (xa + 1).min(img.width - 1);
            let col = if flip { out - 1 - ox } else { ox };
            for c in 0..3 {
                let top = px(xa, ya, c) * (1.0 - tx) + px(xb, ya, c) * tx;
                let bottom = px(xa, yb, c) * (1.0 - tx) + px(xb, yb, c) * tx;
                let v = (top * (1.0 - ty) + bottom * ty) / 255.0;
                dst[start + c * out * out + oy * out + col] = ((v as f32) - mean[c]) / std[c];
            }
        }
    }
}

/// Reads and decodes one image.
pub fn read_image(source: &ImageSource) -> Result<Rgb8> {
    let bytes = source.read()?;
    decode(&bytes).map_err(|e| Error::data(format!("cannot decode image `{}`: {e}", source.name())))
}

/// A `Gamma(shape, 1)` draw (Marsaglia & Tsang 2000; `shape < 1` through the `U^{1/shape}`
/// boost).
fn gamma(shape: f64, rng: &mut RowRng) -> f64 {
    if shape < 1.0 {
        return gamma(shape + 1.0, rng) * unit(rng).max(f64::MIN_POSITIVE).powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = (9.0 * d).sqrt().recip();
    loop {
        let (u1, u2) = (unit(rng).max(f64::MIN_POSITIVE), unit(rng));
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        let v = (1.0 + c * z).powi(3);
        if v <= 0.0 {
            continue;
        }
        let u = unit(rng).max(f64::MIN_POSITIVE);
        if u.ln() < 0.5 * z * z + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

/// PCME++'s MSDA (spec `cusa-and-pcmepp.md` §3.8) on a batch of CHW images in place: element
/// `i` is mixed with probability `mix_ratio` with its partner `B−1−i` of the unmodified batch,
/// by CutMix (probability `cutmix_prob`; λ corrected to the pasted area) or Mixup, `λ ~ Beta`.
/// Returns every element's λ (1 when unmixed), for [`crate::losses::pcmepp::msda_labels`].
pub fn mix_batch(images: &mut [f32], size: usize, c: &super::config::MsdaConfig, rng: &mut RowRng) -> Vec<f64> {
    let plane = size * size;
    let b = images.len() / (3 * plane);
    let source = images.to_vec();
    let mut lambdas = vec![1.0; b];
    for (i, lambda) in lambdas.iter_mut().enumerate() {
        if unit(rng) >= c.mix_ratio {
            continue;
        }
        let cutmix = unit(rng) < c.cutmix_prob;
        let (x, y) = (gamma(c.beta, rng), gamma(c.beta, rng));
        let lam = x / (x + y);
        let j = b - 1 - i;
        let (own, partner) = (i * 3 * plane, j * 3 * plane);
        if cutmix {
            let ratio = (1.0 - lam).sqrt();
            let (cut, cy, cx) =
                ((size as f64 * ratio) as usize, rng.below(size as u64) as usize, rng.below(size as u64) as usize);
            let (y0, y1) = (cy.saturating_sub(cut / 2), (cy + cut / 2).min(size));
            let (x0, x1) = (cx.saturating_sub(cut / 2), (cx + cut / 2).min(size));
            for ch in 0..3 {
                for row in y0..y1 {
                    let at = ch * plane + row * size;
                    images[own + at + x0..own + at + x1].copy_from_slice(&source[partner + at + x0..partner + at + x1]);
                }
            }
            *lambda = 1.0 - ((y1 - y0) * (x1 - x0)) as f64 / plane as f64;
        } else {
            for k in 0..3 * plane {
                images[own + k] = (lam * source[own + k] as f64 + (1.0 - lam) * source[partner + k] as f64) as f32;
            }
            *lambda = lam;
        }
    }
    lambdas
}

/// One training batch, ready to become tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub step: u64,
    /// `[B, 3, size, size]` row-major.
    pub images: Vec<f32>,
    /// `[B, seq]` token ids and attention mask.
    pub ids: Vec<i64>,
    pub mask: Vec<i64>,
    pub seq: usize,
    /// Indices into [`TrainSet::samples`].
    pub rows: Vec<usize>,
    /// A key per image (hash of its path), equal for repeated images (CUSA ITC, PCME++ labels).
    pub image_ids: Vec<u64>,
    /// MSDA's λ per element when images were mixed (PCME++).
    pub lambdas: Option<Vec<f64>>,
    /// Images this batch met that cannot be decoded (name and error), each left out and its
    /// place taken by another row (see [`BatchMaker::make`]).
    pub undecodable: Vec<(String, String)>,
    /// `[B, d]` teacher features when the set has them.
    pub teacher_image: Option<Vec<f32>>,
    pub teacher_text: Option<Vec<f32>>,
}

/// Makes batch `s` from `(seed, s)` alone.
pub struct BatchMaker {
    pub set: Arc<TrainSet>,
    pub tokenizer: Tokenizer,
    pub batch_size: usize,
    pub image_size: usize,
    pub seed: u64,
    pub transform: super::transform::ImageTransform,
    pub msda: Option<super::config::MsdaConfig>,
    /// PCME++'s caption augmentation ([`augment_caption`], `data.caption_augment`), when on.
    pub caption_augment: Option<CaptionAugment>,
    /// Rows whose image was found undecodable, so that no worker reads them again. Only a
    /// cache: whether a row is in it changes no batch, since its image fails every time.
    pub undecodable: std::sync::Mutex<HashMap<usize, String>>,
}

impl BatchMaker {
    pub fn new(set: Arc<TrainSet>, c: &TrainConfig) -> Result<BatchMaker> {
        let tokenizer = load_tokenizer(c.model.tokenizer_dir(), c.model.max_tokens())?;
        let caption_augment = match c.data.caption_augment {
            false => None,
            true => {
                let (mask_id, vocab, unit) = augment_vocabulary(&tokenizer).ok_or_else(|| Error::Model {
                    message: format!("`data.caption_augment` {}", no_mask_token(c.model.tokenizer_dir())),
                    hint: Some(NO_MASK_TOKEN_HINT.into()),
                })?;
                let mut whole = tokenizer.clone();
                whole
                    .with_truncation(None)
                    .map_err(|e| Error::Model { message: format!("tokenizer truncation: {e}"), hint: None })?;
                Some(CaptionAugment { mask_id, vocab, unit, tokenizer: whole, max_tokens: c.model.max_tokens() })
            }
        };
        Ok(BatchMaker {
            set,
            tokenizer,
            batch_size: c.batch_size,
            image_size: c.model.image_size_px,
            seed: c.seed,
            transform: super::transform::ImageTransform::new(&c.data, c.model.image_size_px),
            msda: c.data.msda.clone(),
            caption_augment,
            undecodable: Default::default(),
        })
    }

    /// What draws row `r`'s caption augmentation in `epoch`.
    pub fn caption_rng(&self, epoch: u64, r: usize) -> RowRng {
        RowRng::new(self.seed, &format!("caption/{epoch}"), &self.set.samples[r].sample_id)
    }

    /// The row order of `epoch`.
    pub fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.set.samples.len()).collect();
        RowRng::new(self.seed, "epoch", &epoch.to_string()).shuffle(&mut order);
        order
    }

    /// Row `r`'s image, or `None` (with the name and the error in `undecodable`) when its
    /// bytes are there but are not an image the decoder reads. A file that cannot be read is
    /// still an error: it was there when the set was loaded.
    fn decode_row(&self, r: usize, undecodable: &mut Vec<(String, String)>) -> Result<Option<Rgb8>> {
        let source = &self.set.samples[r].image;
        let known = self.undecodable.lock().ok().and_then(|bad| bad.get(&r).cloned());
        let error = match known {
            Some(error) => error,
            None => match decode(&source.read()?) {
                Ok(img) => return Ok(Some(img)),
                Err(e) => {
                    let error = e.to_string();
                    if let Ok(mut bad) = self.undecodable.lock() {
                        bad.insert(r, error.clone());
                    }
                    error
                }
            },
        };
        undecodable.push((source.name(), error));
        Ok(None)
    }

    /// Batch `step` given the order of its epoch (see [`BatchMaker::epoch_order`]).
    ///
    /// A row whose image cannot be decoded is left out, as a row whose file is missing is at
    /// load (decoding every image up front would cost a pass over the data set at every
    /// start): its place goes to the first row after this batch in the epoch's order (then
    /// from the epoch's start) that decodes and is not in the batch. That depends on the files
    /// only, so the batch stays a function of `(seed, step)` and a resumed run sees the same.
    pub fn make(&self, step: u64, order: &[usize]) -> Result<Batch> {
        let per_epoch = self.set.steps_per_epoch(self.batch_size);
        let (epoch, pos) = (step / per_epoch, (step % per_epoch) as usize);
        let (from, to) = (pos * self.batch_size, (pos + 1) * self.batch_size);
        let mut rows: Vec<usize> = order[from..to].to_vec();
        let mut undecodable = Vec::new();
        let mut decoded = Vec::with_capacity(rows.len());
        let mut spare = order[to..].iter().chain(&order[..from]).copied();
        for k in 0..rows.len() {
            loop {
                if let Some(img) = self.decode_row(rows[k], &mut undecodable)? {
                    decoded.push(img);
                    break;
                }
                rows[k] = spare.by_ref().find(|r| !rows.contains(r)).ok_or_else(|| {
                    // The failures are named here: the run's notes on them come after a batch.
                    // Every row but the batch's own untried ones was tried, each once.
                    let example = undecodable.first().map(|(name, e)| format!(", for example `{name}`: {e}"));
                    let files: HashSet<&str> = undecodable.iter().map(|(name, _)| name.as_str()).collect();
                    Error::Data {
                        message: format!(
                            "fewer than {} of the {} training rows have an image that decodes: {} rows tried do not \
                             ({} image file(s){})",
                            self.batch_size,
                            order.len(),
                            undecodable.len(),
                            files.len(),
                            example.unwrap_or_default()
                        ),
                        hint: Some("check the image files of `data.tables`".into()),
                    }
                })?;
            }
        }
        let tag = format!("augment/{epoch}");
        let mut images = Vec::with_capacity(rows.len() * 3 * self.image_size * self.image_size);
        let mut image_ids = Vec::with_capacity(rows.len());
        for (&r, img) in rows.iter().zip(decoded) {
            let s = &self.set.samples[r];
            let mut rng = RowRng::new(self.seed, &tag, &s.sample_id);
            self.transform.train(&img, &mut rng, &mut images);
            image_ids.push(crate::rng::row_key(0, "image", &s.image.name()));
        }
        let lambdas = self.msda.as_ref().map(|c| {
            let mut rng = RowRng::new(self.seed, "msda", &step.to_string());
            mix_batch(&mut images, self.image_size, c, &mut rng)
        });
        let texts: Vec<&str> = rows.iter().map(|&r| self.set.samples[r].caption.as_str()).collect();
        let (ids, mask, seq) = match &self.caption_augment {
            Some(augment) => {
                let mut rngs: Vec<RowRng> = rows.iter().map(|&r| self.caption_rng(epoch, r)).collect();
                augment.tokenize(&texts, &mut rngs)?
            }
            None => tokenize(&self.tokenizer, &texts)?,
        };
        let gather = |t: &Option<(Vec<f32>, usize)>| {
            t.as_ref().map(|(v, d)| rows.iter().flat_map(|&r| v[r * d..(r + 1) * d].iter().copied()).collect())
        };
        Ok(Batch {
            step,
            images,
            ids,
            mask,
            seq,
            teacher_image: gather(&self.set.teacher_image),
            teacher_text: gather(&self.set.teacher_text),
            rows,
            image_ids,
            lambdas,
            undecodable,
        })
    }
}

/// Batches `start..end` made on `workers` threads, handed out in order.
pub struct Loader {
    receivers: Vec<Receiver<Result<Batch>>>,
    next: u64,
    start: u64,
    end: u64,
}

impl Loader {
    pub fn new(maker: Arc<BatchMaker>, start: u64, end: u64, workers: usize) -> Loader {
        let workers = workers.max(1);
        let per_epoch = maker.set.steps_per_epoch(maker.batch_size);
        let mut receivers = Vec::with_capacity(workers);
        for w in 0..workers as u64 {
            let (tx, rx) = sync_channel(2);
            let maker = maker.clone();
            std::thread::spawn(move || {
                let mut cached: Option<(u64, Vec<usize>)> = None;
                let mut step = start + w;
                while step < end {
                    let epoch = step / per_epoch;
                    if cached.as_ref().map(|c| c.0) != Some(epoch) {
                        cached = Some((epoch, maker.epoch_order(epoch)));
                    }
                    let batch = maker.make(step, &cached.as_ref().expect("set above").1);
                    // The trainer hung up (finished or failed): stop.
                    if tx.send(batch).is_err() {
                        return;
                    }
                    step += workers as u64;
                }
            });
            receivers.push(rx);
        }
        Loader { receivers, next: start, start, end }
    }
}

impl Iterator for Loader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        if self.next >= self.end {
            return None;
        }
        let w = ((self.next - self.start) % self.receivers.len() as u64) as usize;
        self.next += 1;
        Some(self.receivers[w].recv().unwrap_or_else(|_| Err(Error::data("a data worker stopped unexpectedly"))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_captions_count_rows_whose_text_another_image_has() {
        let row = |caption: &str, image: &str| Sample {
            sample_id: format!("{caption}{image}"),
            caption: caption.into(),
            image: ImageSource::File(PathBuf::from(image)),
        };
        let set = |samples: Vec<Sample>| TrainSet {
            samples,
            teacher_image: None,
            teacher_text: None,
            missing_images: 0,
            incomplete_rows: 0,
            emptied_captions: 0,
            noisy_rows: 0,
        };
        // `dog` twice for one image (COCO's five captions may repeat): not a false negative.
        // `cat` for two images, a third time for the first: all three rows count.
        let s = set(vec![
            row("dog", "1.jpg"),
            row("dog", "1.jpg"),
            row("cat", "1.jpg"),
            row("cat", "2.jpg"),
            row("cat", "1.jpg"),
            row("bird", "3.jpg"),
        ]);
        assert_eq!(s.shared_captions(), 3);
        assert_eq!(set(Vec::new()).shared_captions(), 0);
    }

    #[test]
    fn float16_and_float64_teacher_features_read_as_float32() {
        // The same two 3-d rows stored as Float16, Float32 and Float64 (values exact in f16).
        use arrow_array::{ArrayRef, Float16Array, Float64Array};
        let dir = tempfile::tempdir().unwrap();
        let want = [0.5f32, -1.25, 3.0, 0.0, 2.5, -0.125];
        let table = |name: &str, values: ArrayRef| {
            let field = Arc::new(arrow_schema::Field::new("item", values.data_type().clone(), true));
            let list = FixedSizeListArray::new(field, 3, values, None);
            let batch = RecordBatch::try_from_iter([
                ("sample_id", Arc::new(StringArray::from(vec!["a", "b"])) as ArrayRef),
                ("embedding", Arc::new(list) as ArrayRef),
            ])
            .unwrap();
            let path = dir.path().join(name);
            crate::io::parquet::write_file(&path, batch.schema(), &[batch], &[]).unwrap();
            path
        };
        let f16: Vec<half::f16> = want.iter().map(|&v| half::f16::from_f32(v)).collect();
        let f64s: Vec<f64> = want.iter().map(|&v| v as f64).collect();
        for (name, values) in [
            ("f16.parquet", Arc::new(Float16Array::from(f16)) as ArrayRef),
            ("f32.parquet", Arc::new(Float32Array::from(want.to_vec())) as ArrayRef),
            ("f64.parquet", Arc::new(Float64Array::from(f64s)) as ArrayRef),
        ] {
            let (features, width) = read_features(&[table(name, values)]).unwrap();
            assert_eq!(width, 3, "{name}");
            assert_eq!((features["a"].as_slice(), features["b"].as_slice()), (&want[..3], &want[3..]), "{name}");
        }
        // A Float64 value Float32 cannot hold is named as such, not as a NaN.
        for (value, what) in [(1e39, "a value past Float32's range"), (f64::NAN, "a non-finite value")] {
            let values = Arc::new(Float64Array::from(vec![0.5, -1.25, 3.0, 0.0, value, -0.125])) as ArrayRef;
            let e = read_features(&[table("f64_far.parquet", values)]).unwrap_err().to_string();
            assert!(e.contains(&format!("has {what} (row 1, sample `b`)")), "{e}");
        }
        // Integers are not features.
        let ints = Arc::new(arrow_array::Int32Array::from(vec![1, 2, 3, 4, 5, 6])) as ArrayRef;
        let e = read_features(&[table("int.parquet", ints)]).unwrap_err().to_string();
        assert!(e.contains("`embedding` values are Int32, not Float32 (or Float16, Float64)"), "{e}");
        // Tables of no rows (of any width, 0 included) hold no features; an empty shard beside
        // others is read.
        for width in [0, 3] {
            let field = Arc::new(arrow_schema::Field::new("item", DataType::Float32, true));
            let list = FixedSizeListArray::new(field, width, Arc::new(Float32Array::from(Vec::<f32>::new())), None);
            let batch = RecordBatch::try_from_iter([
                ("sample_id", Arc::new(StringArray::from(Vec::<&str>::new())) as ArrayRef),
                ("embedding", Arc::new(list) as ArrayRef),
            ])
            .unwrap();
            let empty = dir.path().join(format!("empty{width}.parquet"));
            crate::io::parquet::write_file(&empty, batch.schema(), &[batch], &[]).unwrap();
            let e = read_features(std::slice::from_ref(&empty)).unwrap_err().to_string();
            assert!(e.contains("the feature tables hold no rows with a `sample_id`"), "{e}");
            if width == 3 {
                let (features, w) = read_features(&[empty, dir.path().join("f32.parquet")]).unwrap();
                assert_eq!((features.len(), w), (2, 3));
            }
        }
    }

    #[test]
    fn a_shard_is_indexed_as_the_image_stages_read_it() {
        // `a`: a BMP; `b`: two images in one sample (the first stands); `c`: different images in
        // two samples (left out); `d`: the same image in two samples (a shard written twice);
        // `e`: a contiguous file; a folder and a link are no members to read.
        use std::io::{Read, Seek, SeekFrom};
        let dir = tempfile::tempdir().unwrap();
        let mut b = tar::Builder::new(Vec::new());
        let mut add = |name: &str, data: &[u8], kind: tar::EntryType| {
            let mut h = tar::Header::new_gnu();
            h.set_size(if kind.is_dir() || kind.is_symlink() { 0 } else { data.len() as u64 });
            h.set_mode(0o644);
            h.set_entry_type(kind);
            if kind.is_symlink() {
                h.set_link_name("a.bmp").unwrap();
            }
            h.set_cksum();
            let data = if kind.is_dir() || kind.is_symlink() { &[][..] } else { data };
            b.append_data(&mut h, name, data).unwrap();
        };
        use tar::EntryType::{Continuous, Directory, Regular, Symlink};
        add("a.bmp", b"bmp a", Regular);
        add("a.txt", b"caption", Regular);
        add("b.png", b"png b", Regular);
        add("b.webp", b"webp b", Regular);
        add("c.jpg", b"first c", Regular);
        add("x.txt", b"caption", Regular);
        add("c.jpg", b"second c", Regular);
        add("d.jpg", b"d", Regular);
        add("y.txt", b"caption", Regular);
        add("d.jpg", b"d", Regular);
        add("e.jpg", b"contiguous e", Continuous);
        add("f", b"", Directory);
        add("g.jpg", b"", Symlink);
        let path = dir.path().join("00000.tar");
        std::fs::write(&path, b.into_inner().unwrap()).unwrap();
        let index = index_shard(&path).unwrap();
        let bytes = |key: &str| {
            let (offset, len) = index[key];
            let mut f = std::fs::File::open(&path).unwrap();
            f.seek(SeekFrom::Start(offset)).unwrap();
            let mut v = vec![0; len as usize];
            f.read_exact(&mut v).unwrap();
            String::from_utf8(v).unwrap()
        };
        let mut keys: Vec<&str> = index.keys().map(String::as_str).collect();
        keys.sort();
        assert_eq!(keys, ["a", "b", "d", "e"]);
        assert_eq!(
            (bytes("a"), bytes("b"), bytes("d"), bytes("e")),
            ("bmp a".into(), "png b".into(), "d".into(), "contiguous e".into())
        );
    }

    #[test]
    fn a_missing_column_names_the_file_and_the_near_miss_or_the_columns() {
        let batch = RecordBatch::try_from_iter([
            ("path", Arc::new(StringArray::from(vec!["a.jpg"])) as arrow_array::ArrayRef),
            ("caption", Arc::new(StringArray::from(vec!["a dog"])) as arrow_array::ArrayRef),
        ])
        .unwrap();
        let file = Path::new("t.parquet");
        assert_eq!(string_column(&batch, "caption", file).unwrap(), vec![Some("a dog".to_string())]);
        let hint = |name: &str| match string_column(&batch, name, file) {
            Err(Error::Schema { message, hint }) => {
                assert_eq!(message, format!("`t.parquet` has no column `{name}`"));
                hint.unwrap()
            }
            other => panic!("{other:?}"),
        };
        assert_eq!(hint("captoin"), "did you mean `caption`?");
        assert_eq!(hint("label"), "columns here: `path`, `caption`");
    }

    #[test]
    fn crops_stay_inside_and_follow_the_scale() {
        let mut rng = RowRng::new(1, "t", "x");
        for _ in 0..200 {
            let (x, y, w, h) = random_resized_crop(40, 30, [0.5, 1.0], [0.75, 4.0 / 3.0], &mut rng);
            assert!(x + w <= 40 && y + h <= 30 && w > 0 && h > 0);
            let frac = (w * h) as f64 / 1200.0;
            assert!(frac > 0.4 && frac <= 1.0, "{frac}");
        }
    }

    #[test]
    fn cutmix_lambda_is_the_kept_area_and_mixup_is_convex() {
        // 4 images of 8×8, image i filled with the value i.
        let (size, b) = (8, 4);
        let fill = || (0..b).flat_map(|i| vec![i as f32; 3 * size * size]).collect::<Vec<f32>>();
        let cut = super::super::config::MsdaConfig { mix_ratio: 1.0, cutmix_prob: 1.0, beta: 2.0 };
        let mut x = fill();
        let l = mix_batch(&mut x, size, &cut, &mut RowRng::new(5, "t", "cut"));
        for i in 0..b {
            let img = &x[i * 3 * size * size..(i + 1) * 3 * size * size];
            let own = img.iter().filter(|&&v| v == i as f32).count() as f64 / img.len() as f64;
            assert!((own - l[i]).abs() < 1e-12 || (i == b - 1 - i), "{own} {}", l[i]);
            assert!(img.iter().all(|&v| v == i as f32 || v == (b - 1 - i) as f32));
        }
        let mix = super::super::config::MsdaConfig { cutmix_prob: 0.0, ..cut };
        let mut x = fill();
        let l = mix_batch(&mut x, size, &mix, &mut RowRng::new(5, "t", "mix"));
        // Element 0 with partner 3: λ·0 + (1 − λ)·3.
        assert!(l[0] > 0.0 && l[0] < 1.0);
        assert!((x[0] as f64 - 3.0 * (1.0 - l[0])).abs() < 1e-5);
        let mean: f64 = (0..2000)
            .map(|k| {
                let mut r = RowRng::new(9, "beta", &k.to_string());
                let (a, b) = (gamma(2.0, &mut r), gamma(2.0, &mut r));
                a / (a + b)
            })
            .sum::<f64>()
            / 2000.0;
        assert!((mean - 0.5).abs() < 0.02, "{mean}");
    }

    #[test]
    fn identity_crop_normalises_and_flip_mirrors() {
        // A 2×1 image: left pixel black, right pixel white.
        let img = Rgb8 { width: 2, height: 1, data: vec![0, 0, 0, 255, 255, 255] };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        use crate::models::preprocess::{IMAGENET_MEAN, IMAGENET_STD};
        crop_to_chw(&img, (0, 0, 2, 1), 2, false, IMAGENET_MEAN, IMAGENET_STD, &mut a);
        crop_to_chw(&img, (0, 0, 2, 1), 2, true, IMAGENET_MEAN, IMAGENET_STD, &mut b);
        // Output 2×2; row 0 of channel 0: [black, white] normalised.
        let black = -IMAGENET_MEAN[0] / IMAGENET_STD[0];
        let white = (1.0 - IMAGENET_MEAN[0]) / IMAGENET_STD[0];
        assert!((a[0] - black).abs() < 1e-6 && (a[1] - white).abs() < 1e-6);
        assert!((b[0] - white).abs() < 1e-6 && (b[1] - black).abs() < 1e-6);
    }

    #[test]
    fn clip_caption_augmentation_picks_tokens_and_masks_with_m() {
        // CLIP's BPE (the tiny open_clip folder's tokenizer): the unit is a token, the mask the
        // BPE symbol `M`; SOT and EOT stay, and a token is kept with probability 0.8, masked 0.1,
        // deleted 0.08 (a random id, 0.02, is counted with the kept ones it may equal).
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/models/tiny_open_clip");
        let tok = load_tokenizer(Path::new(dir), 77).unwrap();
        let (mask_id, vocab, unit) = augment_vocabulary(&tok).unwrap();
        assert_eq!((unit, Some(mask_id)), (AugmentUnit::Token, tok.token_to_id("M")));
        let mut whole = tok.clone();
        whole.with_truncation(None).unwrap();
        let aug = CaptionAugment { mask_id, vocab, unit, tokenizer: whole, max_tokens: 77 };
        let text = "a dog runs on the beach";
        let plain = tok.encode(text, true).unwrap().get_ids().to_vec();
        let (sot, eot, body) = (plain[0], plain[plain.len() - 1], plain.len() - 2);
        assert!(body >= 6, "{plain:?}");
        let (mut masked, mut total, mut lengths) = (0usize, 0usize, 0usize);
        let n = 2000;
        let mut rngs: Vec<RowRng> = (0..n).map(|k| RowRng::new(0, "caption", &k.to_string())).collect();
        let (ids, mask, s) = aug.tokenize(&vec![text; n], &mut rngs).unwrap();
        for r in 0..n {
            let len = mask[r * s..(r + 1) * s].iter().sum::<i64>() as usize;
            let row = &ids[r * s..r * s + len];
            assert_eq!((row[0], row[len - 1]), (sot as i64, eot as i64), "SOT and EOT stay");
            masked += row[1..len - 1].iter().filter(|&&t| t == mask_id as i64).count();
            lengths += len - 2;
            total += body;
        }
        let (masked, kept) = (masked as f64 / total as f64, lengths as f64 / total as f64);
        assert!((masked - 0.1).abs() < 0.01, "masked {masked}");
        assert!((kept - 0.92).abs() < 0.01, "tokens left {kept} (deleted 0.08)");
    }

    #[test]
    fn caption_augmentation_masks_replaces_or_deletes_a_fifth_of_the_words() {
        // [CLS] w0 .. w39 [SEP], one piece each: kept pieces are 1000 + w, the mask 900, random
        // ids below the vocabulary of 100, so each word's outcome is told apart.
        let (cls, sep, mask) = (101u32, 102u32, 900u32);
        let ids: Vec<u32> = std::iter::once(cls).chain(1000..1040).chain([sep]).collect();
        let words: Vec<Option<u32>> = std::iter::once(None).chain((0..40).map(Some)).chain([None]).collect();
        let (mut masked, mut random, mut deleted, mut kept) = (0, 0, 0, 0);
        for k in 0..500 {
            let mut rng = RowRng::new(0, "caption/0", &k.to_string());
            let out = augment_caption(&ids, &words, mask, &(0..100).collect::<Vec<u32>>(), &mut rng);
            assert_eq!((out.first(), out.last()), (Some(&cls), Some(&sep)), "special tokens stay");
            let body = &out[1..out.len() - 1];
            let mut j = 0;
            for &id in &ids[1..41] {
                match body.get(j) {
                    Some(&t) if t == id => kept += 1,
                    Some(&t) if t == mask => masked += 1,
                    Some(&t) if t < 100 => random += 1,
                    _ => {
                        deleted += 1;
                        continue;
                    }
                }
                j += 1;
            }
            assert_eq!(j, body.len(), "every output token accounted for: {out:?}");
        }
        // A word of several pieces is masked, replaced or deleted whole.
        let mut seen = [false; 4];
        for k in 0..400 {
            let mut rng = RowRng::new(0, "caption/0", &k.to_string());
            let vocab: Vec<u32> = (0..100).collect();
            let out = augment_caption(&[cls, 2000, 2001, sep], &[None, Some(0), Some(0), None], mask, &vocab, &mut rng);
            let outcome = match &out[1..out.len() - 1] {
                [2000, 2001] => 0,
                [a, b] if *a == mask && *b == mask => 1,
                [a, b] if *a < 100 && *b < 100 => 2,
                [] => 3,
                other => panic!("a word split: {other:?}"),
            };
            seen[outcome] = true;
        }
        assert_eq!(seen, [true; 4]);
        let total = (masked + random + deleted + kept) as f64;
        assert_eq!(total, 500.0 * 40.0);
        let share = |n: i32| n as f64 / total;
        // Expected 0.8 kept, 0.1 masked, 0.02 random, 0.08 deleted (20,000 words).
        assert!((share(kept) - 0.8).abs() < 0.015, "kept {}", share(kept));
        assert!((share(masked) - 0.1).abs() < 0.01, "masked {}", share(masked));
        assert!((share(random) - 0.02).abs() < 0.005, "random {}", share(random));
        assert!((share(deleted) - 0.08).abs() < 0.01, "deleted {}", share(deleted));
    }
}
