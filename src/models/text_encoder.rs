//! A sentence encoder: `tokenizer.json` (the `tokenizers` crate) + a BERT-family model +
//! pooling (+ normalisation), loaded from a Hugging Face / sentence-transformers model folder.
//! Truncation to the model's maximum length (sentence-transformers' `max_seq_length` when the
//! folder has `sentence_bert_config.json`), padding to the longest caption of each batch.

use std::path::Path;

use burn::tensor::{Device, Int, Tensor, TensorData};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::bert::Bert;
use super::pooling::{l2_normalize, pool, Pooling};
use crate::error::{Error, Result};

pub struct TextEncoder {
    model: Bert,
    tokenizer: Tokenizer,
    pooling: Pooling,
    normalize: bool,
    max_tokens: usize,
    device: Device,
    /// Width of the embeddings.
    pub dim: usize,
}

fn model_err(message: String) -> Error {
    Error::Model { message, hint: None }
}

impl TextEncoder {
    /// Loads a model folder. `pooling`/`normalize` of `None` follow the folder's
    /// sentence-transformers files (`1_Pooling/config.json`, a `Normalize` module in
    /// `modules.json`), defaulting to mean pooling without normalisation.
    pub fn load(dir: &Path, pooling: Option<Pooling>, normalize: Option<bool>, device: &Device) -> Result<TextEncoder> {
        let (model, config) = Bert::load(dir, device)?;
        let tok_path = dir.join("tokenizer.json");
        let mut tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| model_err(format!("cannot load tokenizer `{}`: {e}", tok_path.display())))?;
        let st_max = read_json(&dir.join("sentence_bert_config.json"))
            .and_then(|v| v["max_seq_length"].as_u64())
            .map(|v| v as usize);
        let max_tokens = st_max.unwrap_or(config.max_position_embeddings).min(config.max_position_embeddings);
        tokenizer
            .with_truncation(Some(TruncationParams { max_length: max_tokens, ..Default::default() }))
            .map_err(|e| model_err(format!("tokenizer truncation: {e}")))?;
        tokenizer.with_padding(Some(PaddingParams { strategy: PaddingStrategy::BatchLongest, ..Default::default() }));
        let st_pool = read_json(&dir.join("1_Pooling/config.json")).map(|v| {
            if v["pooling_mode_cls_token"].as_bool() == Some(true) {
                Pooling::Cls
            } else {
                Pooling::Mean
            }
        });
        let st_norm = read_json(&dir.join("modules.json")).map(|v| v.to_string().contains("Normalize"));
        Ok(TextEncoder {
            model,
            tokenizer,
            pooling: pooling.or(st_pool).unwrap_or(Pooling::Mean),
            normalize: normalize.or(st_norm).unwrap_or(false),
            max_tokens,
            device: device.clone(),
            dim: config.hidden_size,
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Token ids and attention mask of a batch, padded to its longest text.
    pub fn tokenize(&self, texts: &[&str]) -> Result<(Vec<i64>, Vec<i64>, [usize; 2])> {
        let enc = self
            .tokenizer
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| model_err(format!("tokenizer failed: {e}")))?;
        let s = enc.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
        let mut ids = Vec::with_capacity(texts.len() * s);
        let mut mask = Vec::with_capacity(texts.len() * s);
        for e in &enc {
            ids.extend(e.get_ids().iter().map(|&i| i as i64));
            mask.extend(e.get_attention_mask().iter().map(|&m| m as i64));
        }
        Ok((ids, mask, [texts.len(), s]))
    }

    /// Sentence embeddings, `[texts.len(), dim]` row-major.
    pub fn encode(&self, texts: &[&str]) -> Result<Vec<f32>> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (ids, mask, shape) = self.tokenize(texts)?;
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, shape), &self.device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(mask, shape), &self.device);
        let states = self.model.forward(ids, mask.clone());
        let mut e = pool(states, mask, self.pooling);
        if self.normalize {
            e = l2_normalize(e);
        }
        e.into_data().try_to_vec::<f32>().map_err(|e| model_err(format!("reading embeddings: {e:?}")))
    }
}

fn read_json(path: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}
