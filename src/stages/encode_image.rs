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

use std::path::Path;
use std::sync::Arc;

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use burn::tensor::Device;
use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::images::{self, Failure, ImageRows};
use super::{Problems, StageStats, Transform};
use crate::error::Result;
use crate::models::image_encoder::{ImageArch, ImageEncoder};
use crate::models::preprocess::PreprocessPreset;
use crate::schema::{self, str_col, Chunk, Reject};

pub const TYPE: &str = "encode_image";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncodeImageConfig {
    /// The checkpoint: a safetensors file or a PyTorch `torch.save` file (`.pth`, `.pt`) in the
    /// architecture's published layout (torchvision for ResNets, mobile-vision for FBNetV3).
    pub model: String,
    /// `resnet18`, `resnet34`, `resnet50`, `resnet101`, `wide_resnet50_2`, `tiny_resnet`,
    /// `fbnetv3_a`, `fbnetv3_c`, `tiny_fbnet`, `vit_b32_clip` or `vit_b32_unicom`. Required;
    /// optional to serde only, so that a misspelt one does not keep `validate` from checking
    /// the rest of the stage (the model file above all).
    #[serde(default)]
    pub arch: Option<ImageArch>,
    /// `imagenet` (Resize 256 bilinear + CenterCrop 224, ImageNet mean/std) or `clip` (Resize
    /// 224 bicubic + CenterCrop 224, CLIP mean/std); default: the architecture's own
    /// (`imagenet` for ResNets and FBNetV3, `clip` for the ViTs).
    #[serde(default)]
    pub preprocess: Option<PreprocessPreset>,
    /// Images per forward pass.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Folder holding img2dataset's `<shard>.tar` files, for rows without a `path`.
    #[serde(default)]
    pub shards_dir: Option<String>,
    /// Read only the checkpoint's tensors under this prefix, without it: the encoder of a
    /// self-supervised training checkpoint (`module.encoder_q.` for MoCo, `online_backbone.`
    /// for some BYOL conversions). Left out of `config.json` when absent (config hashes of runs
    /// without it stay as they were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_prefix: Option<String>,
}

fn default_batch() -> usize {
    32
}

impl EncodeImageConfig {
    pub fn build(&self, input: &SchemaRef, device: &Device, problems: &mut Problems) -> Option<EncodeImage> {
        let references = images::reference_columns(input, TYPE, problems);
        super::check_no_embedding_yet(input, problems);
        if self.batch_size == 0 {
            problems.push("batch_size", "batch_size must be at least 1", None);
        }
        images::check_shards_dir(&self.shards_dir, problems);
        if !Path::new(&self.model).is_file() {
            problems.push(
                "model",
                format!("`{}` {}", self.model, crate::io::not_a(Path::new(&self.model), "file")),
                Some(
                    "`model` is a checkpoint file (safetensors or `.pth`), e.g. torchvision's resnet50 state dict"
                        .into(),
                ),
            );
        }
        let Some(arch) = self.arch else {
            problems.push(
                "arch",
                "missing required key `arch`",
                Some(
                    "add `arch = ...`: `resnet18`, `resnet34`, `resnet50`, `resnet101`, `wide_resnet50_2`, \
                     `tiny_resnet`, `fbnetv3_a`, `fbnetv3_c`, `tiny_fbnet`, `vit_b32_clip` or `vit_b32_unicom`"
                        .into(),
                ),
            );
            return None;
        };
        if !problems.is_empty() {
            return None;
        }
        let prefix = self.checkpoint_prefix.as_deref();
        match ImageEncoder::load_under(Path::new(&self.model), prefix, arch, self.preprocess, device) {
            Ok(encoder) => {
                let mut fields = vec![Field::new(schema::SAMPLE_ID, DataType::Utf8, false)];
                fields.extend(references.iter().map(|c| Field::new(*c, DataType::Utf8, true)));
                fields.push(Field::new(
                    "embedding",
                    DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float32, false)), encoder.dim as i32),
                    false,
                ));
                let preset = self.preprocess.unwrap_or(arch.spec().1);
                Some(EncodeImage {
                    config: self.clone(),
                    encoder,
                    preset,
                    references,
                    schema: Arc::new(Schema::new(fields)),
                })
            }
            Err(e) => {
                let (message, hint) = e.into_message_and_hint();
                problems.push("model", message, hint);
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
}

impl Transform for EncodeImage {
    fn parallel_inside(&self) -> bool {
        true
    }

    fn side_inputs(&self) -> Vec<std::path::PathBuf> {
        crate::io::model_files(std::path::Path::new(&self.config.model), &["model.safetensors", "config.json"])
    }

    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
        let Chunk { batch, mut rejects, skipped } = chunk;
        let ids = str_col(&batch, schema::SAMPLE_ID);
        // Counted in the chunk's statistics, which checkpoints save: a resumed run's report
        // counts the chunks the killed run encoded too.
        let mut encoded = 0u64;
        let refs = ImageRows::new(&batch, &self.references, self.config.shards_dir.as_deref());
        let preprocess = &self.encoder.preprocess;
        // Reads and preprocesses the rows `part` in parallel.
        let load = |part: &[usize]| -> Vec<std::result::Result<Vec<f32>, Failure>> {
            part.par_iter()
                .map(|&r| {
                    let bytes = refs.bytes(r)?;
                    preprocess
                        .bytes_to_chw(&bytes)
                        .map_err(|e| ("undecodable_image", format!("{}: {e}", refs.describe(r))))
                })
                .collect()
        };

        // An image that rows of the chunk share (COCO's five captions) is read and encoded once.
        let earlier = refs.earlier_same();
        let unique: Vec<usize> = (0..batch.num_rows()).filter(|&r| earlier[r].is_none()).collect();
        let parts: Vec<&[usize]> = unique.chunks(self.config.batch_size).collect();
        let dim = self.encoder.dim;
        // Per row of `unique`: where its embedding starts in `features`, or why it has none.
        let mut outcome: Vec<Option<std::result::Result<usize, Failure>>> = vec![None; batch.num_rows()];
        let mut features = Vec::with_capacity(unique.len() * dim);
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
                    Err(failure) => outcome[r] = Some(Err(failure)),
                }
            }
            let (encoded_part, ahead) =
                rayon::join(|| self.encoder.encode(pixels), || parts.get(i + 1).map(|rows| load(rows)));
            next = ahead;
            for (&r, row) in good.iter().zip(encoded_part?.chunks(dim)) {
                outcome[r] = Some(Ok(features.len()));
                features.extend_from_slice(row);
            }
        }
        let mut keep_ids = StringBuilder::new();
        let mut keep_refs: Vec<StringBuilder> = self.references.iter().map(|_| StringBuilder::new()).collect();
        let n = batch.num_rows();
        let mut emb = FixedSizeListBuilder::with_capacity(Float32Builder::with_capacity(n * dim), dim as i32, n)
            .with_field(Arc::new(Field::new("item", DataType::Float32, false)));
        // Every row in order, with its image's embedding or its failure.
        for r in 0..n {
            match outcome[earlier[r].unwrap_or(r)].as_ref().expect("every image was tried") {
                Ok(at) => {
                    keep_ids.append_value(ids.value(r));
                    for (b, c) in keep_refs.iter_mut().zip(&refs.columns) {
                        b.append_option(c.is_valid(r).then(|| c.value(r)));
                    }
                    emb.values().append_slice(&features[*at..*at + dim]);
                    emb.append(true);
                    encoded += 1;
                }
                Err((reason, detail)) => rejects.push(Reject {
                    stage: TYPE,
                    source_file: String::new(),
                    row: first_row + r as u64,
                    sample_id: Some(ids.value(r).to_owned()),
                    reason,
                    detail: detail.clone().into(),
                    raw: schema::caption_bytes(&batch, r),
                }),
            }
        }
        let mut out: Vec<ArrayRef> = vec![Arc::new(keep_ids.finish())];
        out.extend(keep_refs.iter_mut().map(|b| Arc::new(b.finish()) as ArrayRef));
        out.push(Arc::new(emb.finish()));
        let batch = RecordBatch::try_new(self.schema.clone(), out)?;
        Ok((Chunk { batch, rejects, skipped }, StageStats::Encoded(encoded)))
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

    fn report(&self, stats: &StageStats) -> serde_json::Value {
        let encoded = match stats {
            StageStats::Encoded(n) => *n,
            _ => 0,
        };
        serde_json::json!({
            "model": self.config.model,
            "arch": self.encoder.arch.name(),
            "preprocess": self.preset.name(),
            "dim": self.encoder.dim,
            "batch_size": self.config.batch_size,
            "images_encoded": encoded,
        })
    }
}
