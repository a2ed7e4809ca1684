//! `encode_text`: teacher text features — sentence embeddings of a text column with a
//! BERT-family model folder (e.g. all-MiniLM-L6-v2; CUSA §1 uses Sentence-BERT), in batches.
//! Output: `sample_id`, the text column, and `embedding` as `FixedSizeList<Float32, D>`, in
//! input order; the model is recorded in the Parquet metadata and the manifest. A row without
//! text (null, or blank) is a `no_caption` reject.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_array::builder::{FixedSizeListBuilder, Float32Builder, StringBuilder};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use burn::tensor::Device;
use serde::{Deserialize, Serialize};

use super::{has_words, Problems, StageStats, Transform};
use crate::error::Result;
use crate::models::pooling::Pooling;
use crate::models::text_encoder::TextEncoder;
use crate::schema::{self, str_col, Chunk, Reject};

pub const TYPE: &str = "encode_text";

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EncodeTextConfig {
    /// A Hugging Face / sentence-transformers model folder (`config.json`, `model.safetensors`
    /// or `pytorch_model.bin` or a sharded checkpoint, `tokenizer.json` or a BERT `vocab.txt`).
    pub model: String,
    /// The text column to embed.
    #[serde(default = "default_column")]
    pub column: String,
    /// Texts per forward pass.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// `mean` or `cls`; default: the folder's sentence-transformers pooling, else `mean`.
    #[serde(default)]
    pub pooling: Option<Pooling>,
    /// L2-normalise; default: as the folder's sentence-transformers modules say.
    #[serde(default)]
    pub normalize: Option<bool>,
    /// Embed each text after CUSA's `pre_caption` ([`crate::text::pre_caption`], at most 64
    /// words): the input CUSA's text teacher sees (spec `cusa-and-pcmepp.md` §1.2). The output
    /// column keeps the text as read.
    #[serde(default)]
    pub pre_caption: bool,
}

fn default_column() -> String {
    schema::CAPTION.into()
}
fn default_batch() -> usize {
    64
}

impl EncodeTextConfig {
    pub fn build(&self, input: &SchemaRef, device: &Device, problems: &mut Problems) -> Option<EncodeText> {
        match input.field_with_name(&self.column) {
            // The output has `sample_id`, the text column and `embedding`: each once.
            Ok(_) if ["sample_id", "embedding"].contains(&self.column.as_str()) => problems.push(
                "column",
                format!("`{}` is a column of the output already: it cannot be the text too", self.column),
                Some("embed a text column, e.g. `column = \"caption\"`".into()),
            ),
            Ok(f) if f.data_type() == &DataType::Utf8 => {}
            Ok(f) => {
                problems.push("column", format!("column `{}` is {}, expected text", self.column, f.data_type()), None)
            }
            Err(_) => {
                let names: Vec<&str> = input.fields().iter().map(|f| f.name().as_str()).collect();
                problems.push(
                    "column",
                    format!("missing column `{}`", self.column),
                    Some(crate::error::column_hint(&self.column, &names)),
                );
            }
        }
        super::check_no_embedding_yet(input, problems);
        if self.batch_size == 0 {
            problems.push("batch_size", "batch_size must be at least 1", None);
        }
        let dir = PathBuf::from(&self.model);
        if !dir.join("config.json").is_file() {
            problems.push(
                "model",
                format!("`{}` is not a model folder (no config.json)", self.model),
                Some("for all-MiniLM-L6-v2 run `models/fetch_minilm.sh`".into()),
            );
        }
        if !problems.is_empty() {
            return None;
        }
        match TextEncoder::load(&dir, self.pooling, self.normalize, device) {
            Ok(encoder) => {
                let schema = Arc::new(Schema::new(vec![
                    Field::new(schema::SAMPLE_ID, DataType::Utf8, false),
                    Field::new(&self.column, DataType::Utf8, false),
                    Field::new(
                        "embedding",
                        DataType::FixedSizeList(
                            Arc::new(Field::new("item", DataType::Float32, false)),
                            encoder.dim as i32,
                        ),
                        false,
                    ),
                ]));
                Some(EncodeText { config: self.clone(), encoder, schema })
            }
            Err(e) => {
                let (message, hint) = e.into_message_and_hint();
                problems.push("model", message, hint);
                None
            }
        }
    }
}

pub struct EncodeText {
    config: EncodeTextConfig,
    encoder: TextEncoder,
    schema: SchemaRef,
}

impl Transform for EncodeText {
    fn parallel_inside(&self) -> bool {
        true
    }

    fn side_inputs(&self) -> Vec<PathBuf> {
        // What `TextEncoder::load` reads.
        let names = [
            "config.json",
            "model.safetensors",
            "pytorch_model.bin",
            "tokenizer.json",
            "vocab.txt",
            "tokenizer_config.json",
            "sentence_bert_config.json",
            "1_Pooling/config.json",
            "modules.json",
        ];
        let dir = std::path::Path::new(&self.config.model);
        let mut files = crate::io::model_files(dir, &names);
        files.extend(crate::models::weights::shard_files(dir));
        files
    }

    fn apply(&self, chunk: Chunk, first_row: u64) -> Result<(Chunk, StageStats)> {
        let Chunk { batch, mut rejects, skipped } = chunk;
        let ids = str_col(&batch, schema::SAMPLE_ID);
        let texts = str_col(&batch, &self.config.column);
        let mut keep_ids = StringBuilder::new();
        let mut keep_texts = StringBuilder::new();
        // The texts to embed: as read, or after `pre_caption` (kept alive here).
        let normalised: Vec<Option<String>> = (0..batch.num_rows())
            .map(|r| {
                (self.config.pre_caption && texts.is_valid(r))
                    .then(|| crate::text::pre_caption(texts.value(r), crate::text::PRE_CAPTION_WORDS))
                    .flatten()
            })
            .collect();
        let mut todo: Vec<&str> = Vec::new();
        for (r, pre) in normalised.iter().enumerate() {
            // Null or blank (no words, as Python's `str.split()` finds them): nothing to embed.
            // Readers already reject blank captions; a label column can still hold "".
            let empty = if texts.is_null(r) {
                Some("is null")
            } else if !has_words(texts.value(r)) {
                Some("is blank")
            } else if self.config.pre_caption && pre.is_none() {
                Some("has nothing left after pre_caption")
            } else {
                None
            };
            if let Some(what) = empty {
                rejects.push(Reject {
                    stage: TYPE,
                    source_file: String::new(),
                    row: first_row + r as u64,
                    sample_id: Some(ids.value(r).to_owned()),
                    reason: "no_caption",
                    detail: format!("`{}` {what}", self.config.column).into(),
                    raw: schema::caption_bytes(&batch, r),
                });
                continue;
            }
            keep_ids.append_value(ids.value(r));
            keep_texts.append_value(texts.value(r));
            todo.push(pre.as_deref().unwrap_or(texts.value(r)));
        }
        let dim = self.encoder.dim;
        let mut emb = FixedSizeListBuilder::with_capacity(
            Float32Builder::with_capacity(todo.len() * dim),
            dim as i32,
            todo.len(),
        )
        .with_field(Arc::new(Field::new("item", DataType::Float32, false)));
        // Chunks already run in parallel; batches within one run in order.
        let values = self.encoder.encode_many(&todo, self.config.batch_size, false)?;
        for row in values.chunks(dim) {
            emb.values().append_slice(row);
            emb.append(true);
        }
        let cols: Vec<ArrayRef> =
            vec![Arc::new(keep_ids.finish()), Arc::new(keep_texts.finish()), Arc::new(emb.finish())];
        Ok((Chunk { batch: RecordBatch::try_new(self.schema.clone(), cols)?, rejects, skipped }, StageStats::None))
    }

    fn output_schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn metadata(&self) -> Vec<(String, String)> {
        vec![("curate.model".into(), self.config.model.clone())]
    }

    fn report(&self, _stats: &StageStats) -> serde_json::Value {
        serde_json::json!({ "model": self.config.model, "dim": self.encoder.dim, "max_tokens": self.encoder.max_tokens() })
    }
}
