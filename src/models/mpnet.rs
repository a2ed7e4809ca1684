//! MPNet in the Hugging Face `MPNetModel` layout: the encoder of Sentence-BERT
//! `all-mpnet-base-v2`, CUSA's text teacher (spec `cusa-and-pcmepp.md` §1.2). Post-LayerNorm
//! transformer like BERT ([`super::bert`]), with two differences that change every output:
//!
//! - no token-type embeddings, and absolute positions counted from the padding index as
//!   fairseq/RoBERTa do: a real token's position is `1 + (its rank among non-padding tokens)`,
//!   a `<pad>` token's is 1 (transformers' `create_position_ids_from_input_ids`);
//! - a learned relative position bias (`encoder.relative_attention_bias`, 32 buckets × heads,
//!   T5-style bidirectional log buckets up to distance 128) added to the attention scores of
//!   every layer, one table shared by all layers.
//!
//! Pooling (mean over the mask) and L2 normalisation are in [`super::pooling`]; the tokenizer
//! in [`super::text_encoder`], which picks this model for `"model_type": "mpnet"`.

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::{LayerNorm, Linear};

use super::activation::gelu;
use super::bert::{burn_attention, padding_mask};
use super::host_attention;
use super::host_linear::apply;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Deserialize;

use super::weights::Weights;
use crate::error::{Error, Result};

/// Token id whose position is the padding position (transformers hard-codes 1, MPNet's `<pad>`).
pub const PADDING_IDX: i64 = 1;

/// Buckets and largest distance of the relative position bias (transformers computes the
/// buckets with these constants whatever the config says).
const BUCKETS: usize = 32;
const MAX_DISTANCE: usize = 128;
// The integer form of the log buckets below needs 2·log₂(128 / 8) = 16 / 2 − 8.
const _: () = assert!(2 * (MAX_DISTANCE / 8).ilog2() as usize == BUCKETS / 2 - 8);

/// The subset of a Hugging Face MPNet `config.json` the model needs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct MpNetConfig {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    /// Includes the two offsets below the first real position (514 for a 512-token model).
    pub max_position_embeddings: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    #[serde(default = "default_buckets")]
    pub relative_attention_num_buckets: usize,
}

fn default_model_type() -> String {
    "mpnet".into()
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_buckets() -> usize {
    BUCKETS
}

impl MpNetConfig {
    /// all-mpnet-base-v2 (and microsoft/mpnet-base): 12 layers, hidden 768, 12 heads.
    pub fn base() -> Self {
        MpNetConfig {
            model_type: "mpnet".into(),
            vocab_size: 30527,
            hidden_size: 768,
            num_hidden_layers: 12,
            num_attention_heads: 12,
            intermediate_size: 3072,
            max_position_embeddings: 514,
            layer_norm_eps: 1e-5,
            hidden_act: "gelu".into(),
            relative_attention_num_buckets: BUCKETS,
        }
    }

    pub fn from_file(path: &Path) -> Result<MpNetConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("cannot read model config", path, e))?;
        let c: MpNetConfig = serde_json::from_str(&text).map_err(|e| Error::Model {
            message: format!("`{}` is not an MPNet config: {e}", path.display()),
            hint: Some("expected a Hugging Face config.json of an MPNet model (e.g. all-mpnet-base-v2)".into()),
        })?;
        if c.model_type != "mpnet" {
            return Err(Error::Model {
                message: format!("`{}`: model_type `{}` is not `mpnet`", path.display(), c.model_type),
                hint: None,
            });
        }
        if c.hidden_act != "gelu" || c.relative_attention_num_buckets != BUCKETS {
            return Err(Error::Model {
                message: format!(
                    "`{}`: hidden_act `{}` / relative_attention_num_buckets {} are not supported",
                    path.display(),
                    c.hidden_act,
                    c.relative_attention_num_buckets
                ),
                hint: Some(format!("curate's MPNet supports `gelu` with {BUCKETS} relative position buckets")),
            });
        }
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) || c.max_position_embeddings < 3 {
            return Err(Error::Model {
                message: format!(
                    "`{}`: hidden_size {} with {} heads, {} positions",
                    path.display(),
                    c.hidden_size,
                    c.num_attention_heads,
                    c.max_position_embeddings
                ),
                hint: Some("hidden_size must be divisible by the head count".into()),
            });
        }
        Ok(c)
    }

    /// Longest input the position table allows: positions start at `PADDING_IDX + 1`.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings - PADDING_IDX as usize - 1
    }
}

/// Bucket of the relative position bias for a key at `offset = key − query` tokens from the
/// query, as transformers' `MPNetEncoder.relative_position_bucket` (32 buckets, distance 128):
/// keys before the query use buckets 0..16, keys after it 16..32; within each half distances
/// 0..8 have their own bucket and 8..128 share 8 log-spaced ones, `8 + ⌊8·ln(n/8)/ln 16⌋`,
/// capped at 15.
///
/// `⌊8·ln(n/8)/ln 16⌋ = ⌊log₂(n²/64)⌋` is computed in integers: exact where float32 lands on
/// a boundary (n = 16, 32, 64, 128), and no integer n comes within 1e-2 of the others, so this
/// agrees with transformers' float32 arithmetic everywhere (checked in tests/mpnet.rs for
/// every offset in [−400, 400]).
pub fn relative_position_bucket(offset: i64) -> usize {
    let half = BUCKETS / 2;
    let exact = half / 2;
    // transformers negates: n = query − key.
    let n = -offset;
    let side = if n < 0 { half } else { 0 };
    let n = n.unsigned_abs() as usize;
    if n < exact {
        return side + n;
    }
    // (half − exact) log buckets over [exact, MAX_DISTANCE): ⌊ln(n/8)/ln(16)·8⌋ = ⌊2·log₂(n/8)⌋.
    let ratio = (n * n) / (exact * exact);
    let large = exact + ratio.ilog2() as usize;
    side + large.min(half - 1)
}

#[derive(Module, Debug)]
pub struct MpNetLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

#[derive(Module, Debug)]
pub struct MpNet {
    word_embeddings: Param<Tensor<2>>,
    position_embeddings: Param<Tensor<2>>,
    embeddings_norm: LayerNorm,
    /// `[buckets, heads]`, shared by every layer.
    relative_attention_bias: Param<Tensor<2>>,
    layers: Vec<MpNetLayer>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    max_tokens: usize,
}

impl MpNet {
    /// Builds the model from checkpoint tensors (with or without the `mpnet.` prefix of task
    /// models); call [`Weights::finish`] afterwards.
    pub fn from_weights(c: &MpNetConfig, w: &Weights, device: &Device) -> MpNet {
        let p = if w.contains("mpnet.embeddings.word_embeddings.weight") { "mpnet." } else { "" };
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        let layers = (0..w.blocks(&format!("{p}encoder.layer."), c.num_hidden_layers, "layers"))
            .map(|i| {
                let t = |part: &str| format!("{p}encoder.layer.{i}.{part}");
                MpNetLayer {
                    q: w.linear(&t("attention.attn.q"), h, h, device),
                    k: w.linear(&t("attention.attn.k"), h, h, device),
                    v: w.linear(&t("attention.attn.v"), h, h, device),
                    o: w.linear(&t("attention.attn.o"), h, h, device),
                    attention_norm: w.layer_norm(&t("attention.LayerNorm"), h, eps, device),
                    intermediate: w.linear(&t("intermediate.dense"), h, c.intermediate_size, device),
                    output: w.linear(&t("output.dense"), c.intermediate_size, h, device),
                    output_norm: w.layer_norm(&t("output.LayerNorm"), h, eps, device),
                }
            })
            .collect();
        let e = |part: &str| format!("{p}embeddings.{part}");
        MpNet {
            word_embeddings: w.param(&e("word_embeddings.weight"), [c.vocab_size, h], device),
            position_embeddings: w.param(&e("position_embeddings.weight"), [c.max_position_embeddings, h], device),
            embeddings_norm: w.layer_norm(&e("LayerNorm"), h, eps, device),
            relative_attention_bias: w.param(
                &format!("{p}encoder.relative_attention_bias.weight"),
                [c.relative_attention_num_buckets, c.num_attention_heads],
                device,
            ),
            layers,
            heads: c.num_attention_heads,
            max_tokens: c.max_tokens(),
        }
    }

    /// Checkpoint tensors this encoder leaves out on purpose (the pooler, task heads).
    pub const IGNORED: [&'static str; 5] = ["pooler.", "mpnet.pooler.", "lm_head.", "classifier.", "qa_outputs."];

    /// Loads `config.json` + `model.safetensors` (or `pytorch_model.bin`) from a Hugging Face
    /// model folder.
    pub fn load(dir: &Path, device: &Device) -> Result<(MpNet, MpNetConfig)> {
        let config = MpNetConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::from_folder_file(&super::weights::hf_weights_file(dir))?;
        let model = MpNet::from_weights(&config, &weights, device);
        weights.finish(&Self::IGNORED)?;
        Ok((model, config))
    }

    /// Longest input the position table allows.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The relative position bias of a `seq`-token input, one `[seq, seq]` plane per head.
    ///
    /// # Shapes
    /// - output: `[1, heads, seq, seq]`
    fn position_bias(&self, seq: usize) -> Tensor<4> {
        let table = self.relative_attention_bias.val();
        let device = table.device();
        let buckets: Vec<i64> = (0..seq as i64)
            .flat_map(|q| (0..seq as i64).map(move |k| relative_position_bucket(k - q) as i64))
            .collect();
        let buckets = Tensor::<1, Int>::from_data(TensorData::new(buckets, [seq * seq]), &device);
        table.select(0, buckets).reshape([seq, seq, self.heads]).permute([2, 0, 1]).unsqueeze_dim::<4>(0)
    }

    /// Token states of the last layer.
    ///
    /// # Shapes
    /// - `ids`, `mask`: `[batch, seq]` (mask 1 for real tokens, 0 for padding; padding ids are
    ///   [`PADDING_IDX`], which also sets their positions, as in transformers)
    /// - output: `[batch, seq, hidden]`
    pub fn forward(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<3> {
        let [b, s] = ids.dims();
        let word = self.word_embeddings.val();
        let hidden = word.dims()[1];
        let real = ids.clone().not_equal_elem(PADDING_IDX).int();
        let positions = real.clone().cumsum(1).mul(real).add_scalar(PADDING_IDX);
        let tokens = word.select(0, ids.reshape([b * s])).reshape([b, s, hidden]);
        let positions = self.position_embeddings.val().select(0, positions.reshape([b * s])).reshape([b, s, hidden]);
        let mut x = self.embeddings_norm.forward(tokens + positions);
        let pad = padding_mask(mask.clone());
        let bias = self.position_bias(s);
        // `[heads, s, s]`, as the host attention takes it.
        let heads_bias = bias.clone().reshape([self.heads, s, s]);
        for layer in &self.layers {
            let q = apply(&layer.q, x.clone());
            let k = apply(&layer.k, x.clone());
            let v = apply(&layer.v, x.clone());
            let context = host_attention::attention_padded(&q, &k, &v, self.heads, &mask, Some(&heads_bias))
                .unwrap_or_else(|| burn_attention(q, k, v, self.heads, Some(&bias), Some(&pad), 0.0));
            x = layer.attention_norm.forward(apply(&layer.o, context) + x);
            let h = gelu(apply(&layer.intermediate, x.clone()));
            x = layer.output_norm.forward(apply(&layer.output, h) + x);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_split_before_and_after_the_query() {
        // transformers: relative_position_bucket(torch.tensor([0, -1, 1, -7, -8, -16, -127, -500, 8]))
        //   == [0, 1, 17, 7, 8, 10, 15, 15, 24]
        let got: Vec<usize> = [0, -1, 1, -7, -8, -16, -127, -500, 8].map(relative_position_bucket).to_vec();
        assert_eq!(got, [0, 1, 17, 7, 8, 10, 15, 15, 24]);
    }
}
