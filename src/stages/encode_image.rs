//! `encode_image`: image features of a `pairs` table — each row's image read from `path`
//! (as the readers store it: reachable from where curate runs) or, for img2dataset webdataset
//! rows, from `<shards_dir>/<shard>.tar` member `<key>.<jpg|png|webp>`; decoded and
//! preprocessed on rayon threads (src/models/preprocess.rs), encoded in batches by an image
//! model (src/models/image_encoder.rs: ResNet-50 for "A Fistful of Words"/OTTER §4, the
//! Unicom ViT-B/32 teacher for CUSA §1.1, CLIP's ViT-B/32, the tiny test ResNet). Output: `sample_id`, the image reference columns (`path`, `shard`, `key`) and
//! `embedding` as `FixedSizeList<Float32, D>`, in input order; the model, architecture and
//! preprocessing are recorded in the Parquet metadata and the manifest. A row whose image
//! cannot be found is a `missing_image` reject, one that does not decode an
//! `undecodable_image` reject.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use burn::tensor::Device;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::{Problems, Transform};
use crate::error::{Error, Result};
use crate::models::image_encoder::{ImageArch, ImageEncoder};
use crate::models::preprocess::PreprocessPreset;
use crate::schema::{self, str_col, Chunk, Reject};

pub const TYPE: &str = "encode_image";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncodeImageConfig {
    /// The checkpoint: a safetensors file in the architecture's published layout (torchvision
    /// for ResNets).
    pub model: String,
    /// `resnet50`, `resnet101`, `tiny_resnet`, `vit_b32_clip` or `vit_b32_unicom`.
    pub arch: ImageArch,
    /// `imagenet` (Resize 256 bilinear + CenterCrop 224, ImageNet mean/std) or `clip` (Resize
    /// 224 bicubic + CenterCrop 224, CLIP mean/std); default: the architecture's own
    /// (`imagenet` for ResNets, `clip` for the ViTs).
    #[serde(default)]
    pub preprocess: Option<PreprocessPreset>,
    /// Images per forward pass.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Folder holding img2dataset's `<shard>.tar` files, for rows without a `path`.
    #[serde(default)]
    pub shards_dir: Option<String>,
}

fn default_batch() -> usize {
    32
}

/// Reference columns copied to the output, in this order, when the input has them.
const REFERENCE_COLUMNS: [&str; 3] = [schema::PATH, schema::SHARD, schema::KEY];

/// Extensions of image members in webdataset shards.
const TAR_IMAGE_EXTENSIONS: [&str; 4] = ["jpg", "jpeg", "png", "webp"];

impl EncodeImageConfig {
    pub fn build(&self, input: &SchemaRef, device: &Device, problems: &mut Problems) -> Option<EncodeImage> {
        let names: Vec<&str> = input.fields().iter().map(|f| f.name().as_str()).collect();
        let mut references = Vec::new();
        for col in REFERENCE_COLUMNS {
            match input.field_with_name(col) {
                Ok(f) if f.data_type() == &DataType::Utf8 => references.push(col),
                Ok(f) => problems.push("type", format!("column `{col}` is {}, expected text", f.data_type()), None),
                Err(_) => {}
            }
        }
        let by_path = references.contains(&schema::PATH);
        let by_tar = references.contains(&schema::SHARD) && references.contains(&schema::KEY);
        if !by_path && !by_tar {
            problems.push(
                "type",
                "the input has no image reference: `encode_image` needs a `path` column, or `shard` and `key`",
                Some(format!("columns here: {}", names.join(", "))),
            );
        }
        if input.field_with_name(schema::SAMPLE_ID).is_err() {
            problems.push("type", "the input has no `sample_id` column", None);
        }
        if self.batch_size == 0 {
            problems.push("batch_size", "batch_size must be at least 1", None);
        }
        if let Some(dir) = &self.shards_dir {
            if !Path::new(dir).is_dir() {
                problems.push(
                    "shards_dir",
                    format!("`{dir}` is not a folder"),
                    Some("point `shards_dir` at the folder of img2dataset's `.tar` shards".into()),
                );
            }
        }
        if !Path::new(&self.model).is_file() {
            problems.push(
                "model",
                format!("`{}` is not a file", self.model),
                Some("`model` is a safetensors checkpoint, e.g. torchvision's resnet50 state dict".into()),
            );
        }
        if !problems.is_empty() {
            return None;
        }
        match ImageEncoder::load(Path::new(&self.model), self.arch, self.preprocess, device) {
            Ok(encoder) => {
                let mut fields = vec![Field::new(schema::SAMPLE_ID, DataType::Utf8, false)];
                fields.extend(references.iter().map(|c| Field::new(*c, DataType::Utf8, true)));
                fields.push(Field::new(
                    "embedding",
                    DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), encoder.dim as i32),
                    false,
                ));
                let preset = self.preprocess.unwrap_or(self.arch.spec().1);
                Some(EncodeImage {
                    config: self.clone(),
                    encoder,
                    preset,
                    references,
                    schema: Arc::new(Schema::new(fields)),
                    encoded: AtomicU64::new(0),
                })
            }
            Err(e) => {
                problems.push("model", e.to_string(), None);
                None
            }
        }
    }
}

pub struct EncodeImage {
    config: EncodeImageConfig,
    encoder: ImageEncoder,
    preset: PreprocessPreset,
    references: Vec<&'static str>,
    schema: SchemaRef,
    encoded: AtomicU64,
}

/// Where one row's image lives.
enum Source<'a> {
    File(&'a str),
    Tar { shard: &'a str, key: &'a str },
    Nowhere,
}

/// Why a row's image could not be used: reason and detail.
type Failure = (&'static str, String);

impl EncodeImage {
    fn source<'a>(&self, cols: &[Option<&'a StringArray>; 3], r: usize) -> Source<'a> {
        let get = |i: usize| cols[i].filter(|c| c.is_valid(r)).map(|c| c.value(r));
        match (get(0), get(1), get(2)) {
            (Some(p), _, _) => Source::File(p),
            (None, Some(shard), Some(key)) => Source::Tar { shard, key },
            _ => Source::Nowhere,
        }
    }

    /// Image bytes of the tar rows of a chunk, by `(shard, key)`: each shard needed is read
    /// once, keeping only the image members asked for.
    fn tar_images(&self, wanted: &[(&str, &str)]) -> HashMap<(String, String), std::result::Result<Vec<u8>, String>> {
        let mut by_shard: HashMap<&str, Vec<&str>> = HashMap::new();
        for (shard, key) in wanted {
            by_shard.entry(shard).or_default().push(key);
        }
        let mut out = HashMap::new();
        for (shard, keys) in by_shard {
            let Some(dir) = &self.config.shards_dir else { continue };
            let path = PathBuf::from(dir).join(format!("{shard}.tar"));
            match read_tar_images(&path, &keys) {
                Ok(found) => {
                    for (k, v) in found {
                        out.insert((shard.to_owned(), k), Ok(v));
                    }
                }
                Err(e) => {
                    for k in keys {
                        out.insert((shard.to_owned(), k.to_owned()), Err(e.to_string()));
                    }
                }
            }
        }
        out
    }
}

/// The image members of `path` whose key is in `keys` (first image member per key).
fn read_tar_images(path: &Path, keys: &[&str]) -> Result<HashMap<String, Vec<u8>>> {
    let file = std::fs::File::open(path).map_err(|e| Error::io("cannot open", path, e))?;
    let mut archive = tar::Archive::new(file);
    let mut out = HashMap::new();
    let wanted: std::collections::HashSet<&str> = keys.iter().copied().collect();
    for entry in archive.entries().map_err(|e| Error::io("cannot read tar", path, e))? {
        let mut entry = entry.map_err(|e| Error::io("corrupt tar member in", path, e))?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path().map_err(|e| Error::io("bad member name in", path, e))?.to_string_lossy().into_owned();
        // The key is the member path up to the first `.` of its file name (webdataset).
        let (dir, base) = name.rsplit_once('/').map_or(("", name.as_str()), |(d, b)| (d, b));
        let (stem, ext) = base.split_once('.').unwrap_or((base, ""));
        let key = if dir.is_empty() { stem.to_owned() } else { format!("{dir}/{stem}") };
        if !TAR_IMAGE_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str())
            || !wanted.contains(key.as_str())
            || out.contains_key(&key)
        {
            continue;
        }
        let mut buf = Vec::new();
        entry.read_to_end(&mut buf).map_err(|e| Error::io("cannot read tar member in", path, e))?;
        out.insert(key, buf);
    }
    Ok(out)
}

impl Transform for EncodeImage {
    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<Chunk> {
        let Chunk { batch, mut rejects, skipped } = chunk;
        let ids = str_col(&batch, schema::SAMPLE_ID);
        let col = |name: &str| self.references.contains(&name).then(|| str_col(&batch, name));
        let cols = [col(schema::PATH), col(schema::SHARD), col(schema::KEY)];
        let sources: Vec<Source> = (0..batch.num_rows()).map(|r| self.source(&cols, r)).collect();
        let tar_rows: Vec<(&str, &str)> = sources
            .iter()
            .filter_map(|s| match s {
                Source::Tar { shard, key } => Some((*shard, *key)),
                _ => None,
            })
            .collect();
        let tar = if tar_rows.is_empty() { HashMap::new() } else { self.tar_images(&tar_rows) };
        let preprocess = &self.encoder.preprocess;
        // Reads and preprocesses the rows `rows` in parallel.
        let load = |rows: &[usize]| -> Vec<std::result::Result<Vec<f32>, Failure>> {
            rows.par_iter()
                .map(|&r| {
                    let bytes = match &sources[r] {
                        Source::File(p) => std::fs::read(p).map_err(|e| ("missing_image", format!("`{p}`: {e}")))?,
                        Source::Tar { shard, key } => match tar.get(&((*shard).to_owned(), (*key).to_owned())) {
                            Some(Ok(b)) => b.clone(),
                            Some(Err(e)) => return Err(("missing_image", e.clone())),
                            None if self.config.shards_dir.is_none() => {
                                return Err((
                                    "missing_image",
                                    format!("`{shard}`/`{key}` is in a tar shard, and no `shards_dir` is set"),
                                ))
                            }
                            None => {
                                return Err(("missing_image", format!("no image member `{key}.*` in `{shard}.tar`")))
                            }
                        },
                        Source::Nowhere => {
                            return Err(("missing_image", "no `path`, and no `shard` + `key`".to_owned()));
                        }
                    };
                    preprocess
                        .bytes_to_chw(&bytes)
                        .map_err(|e| ("undecodable_image", format!("{}: {e}", describe(&sources[r]))))
                })
                .collect()
        };

        let all: Vec<usize> = (0..batch.num_rows()).collect();
        let parts: Vec<&[usize]> = all.chunks(self.config.batch_size).collect();
        let dim = self.encoder.dim;
        let mut keep_ids = StringBuilder::new();
        let mut keep_refs: Vec<StringBuilder> = self.references.iter().map(|_| StringBuilder::new()).collect();
        let mut emb =
            FixedSizeListBuilder::with_capacity(Float32Builder::with_capacity(all.len() * dim), dim as i32, all.len())
                .with_field(Arc::new(Field::new("item", DataType::Float32, false)));
        // Batch `i + 1` is read and preprocessed while batch `i` runs through the model.
        let mut next = parts.first().map(|rows| load(rows));
        for (i, rows) in parts.iter().enumerate() {
            let loaded = next.take().expect("loaded ahead");
            let mut pixels = Vec::with_capacity(rows.len() * preprocess.len());
            let mut good = Vec::with_capacity(rows.len());
            for (&r, result) in rows.iter().zip(loaded) {
                match result {
                    Ok(t) => {
                        pixels.extend_from_slice(&t);
                        good.push(r);
                    }
                    Err((reason, detail)) => rejects.push(Reject {
                        stage: TYPE,
                        source_file: match &sources[r] {
                            Source::Tar { shard, .. } => format!("{shard}.tar"),
                            _ => String::new(),
                        },
                        row: first_row + r as u64,
                        sample_id: Some(ids.value(r).to_owned()),
                        reason,
                        detail,
                        raw: Vec::new(),
                    }),
                }
            }
            let (features, ahead) =
                rayon::join(|| self.encoder.encode(pixels), || parts.get(i + 1).map(|rows| load(rows)));
            next = ahead;
            let features = features?;
            for (&r, row) in good.iter().zip(features.chunks(dim)) {
                keep_ids.append_value(ids.value(r));
                for (b, c) in keep_refs.iter_mut().zip(cols.iter().filter_map(|c| *c)) {
                    b.append_option(c.is_valid(r).then(|| c.value(r)));
                }
                emb.values().append_slice(row);
                emb.append(true);
            }
            self.encoded.fetch_add(good.len() as u64, Ordering::Relaxed);
        }
        let mut out: Vec<ArrayRef> = vec![Arc::new(keep_ids.finish())];
        out.extend(keep_refs.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        out.push(Arc::new(emb.finish()));
        Ok(Chunk { batch: RecordBatch::try_new(self.schema.clone(), out)?, rejects, skipped })
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn metadata(&self) -> Vec<(String, String)> {
        vec![
            ("curate.model".into(), self.config.model.clone()),
            ("curate.image_arch".into(), self.encoder.arch.name()),
            ("curate.preprocess".into(), self.preset.name().into()),
        ]
    }

    fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.config.model,
            "arch": self.encoder.arch.name(),
            "preprocess": self.preset.name(),
            "dim": self.encoder.dim,
            "batch_size": self.config.batch_size,
            "images_encoded": self.encoded.load(Ordering::Relaxed),
        })
    }
}

fn describe(s: &Source) -> String {
    match s {
        Source::File(p) => format!("`{p}`"),
        Source::Tar { shard, key } => format!("`{shard}.tar` member `{key}`"),
        Source::Nowhere => String::new(),
    }
}
