//! BERT-family text encoders: BERT and MiniLM in the Hugging Face `BertModel` layout (e.g.
//! all-MiniLM-L6-v2, the Sentence-BERT text teacher of CUSA, spec `cusa-and-pcmepp.md` §1;
//! DeCLUTR-sci-base, a SciBERT), DistilBERT (`DistilBertModel` layout: same computation, other
//! tensor names, no token-type embeddings; the best text init of "A Fistful of Words", spec
//! `bow-and-otter.md` §4) and RoBERTa (`RobertaModel`: BERT's computation and names under
//! `roberta.`, one token type, and positions counted from `pad_token_id + 1` as fairseq does;
//! the `roberta-base` init of the paper's Tables 2, 9 and 10). Post-LayerNorm transformer: embeddings (word + absolute position + token type) →
//! LayerNorm → N × [self-attention → add & LayerNorm → GELU MLP → add & LayerNorm]. Pooling
//! (mean over the attention mask, or the `[CLS]` token) and L2 normalisation are in
//! [`super::pooling`].
//!
//! Loaded from `config.json` + `model.safetensors`; tensor names as saved by `transformers`
//! (with or without the `bert.` prefix of task heads; `pooler.*` and `cls.*` are ignored).
//! In training (on an autodiff device) the config's dropout applies where transformers applies
//! it: after the embeddings' LayerNorm, on the attention probabilities, and on each sub-layer's
//! output before its residual sum (DistilBERT: the feed-forward's only, its attention output
//! has none).

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::{LayerNorm, Linear};
use burn::tensor::activation::softmax;

use super::activation::gelu;
use super::host_attention;
use super::host_linear::apply;
use burn::tensor::{Device, Int, Tensor};
use serde::Deserialize;

use super::weights::Weights;
use crate::error::{Error, Result};

/// The subset of a Hugging Face BERT / DistilBERT `config.json` the model needs (DistilBERT's
/// own key names are accepted as aliases).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BertConfig {
    #[serde(default = "default_model_type")]
    pub model_type: String,
    pub vocab_size: usize,
    #[serde(alias = "dim")]
    pub hidden_size: usize,
    #[serde(alias = "n_layers")]
    pub num_hidden_layers: usize,
    #[serde(alias = "n_heads")]
    pub num_attention_heads: usize,
    #[serde(alias = "hidden_dim")]
    pub intermediate_size: usize,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_act", alias = "activation")]
    pub hidden_act: String,
    #[serde(default = "default_position")]
    pub position_embedding_type: String,
    /// Dropout after the embeddings and on each sub-layer's output, in training (transformers'
    /// default 0.1 where the file has none).
    #[serde(default = "default_dropout", alias = "dropout")]
    pub hidden_dropout_prob: f64,
    /// Dropout on the attention probabilities, in training.
    #[serde(default = "default_dropout", alias = "attention_dropout")]
    pub attention_probs_dropout_prob: f64,
    /// RoBERTa's positions start past it (transformers' `padding_idx`).
    #[serde(default)]
    pub pad_token_id: Option<usize>,
}

fn default_model_type() -> String {
    "bert".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_act() -> String {
    "gelu".into()
}
fn default_position() -> String {
    "absolute".into()
}
fn default_dropout() -> f64 {
    0.1
}

impl BertConfig {
    pub fn from_file(path: &Path) -> Result<BertConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("cannot read model config", path, e))?;
        let c: BertConfig = serde_json::from_str(&text).map_err(|e| Error::Model {
            message: format!("`{}` is not a BERT config: {e}", path.display()),
            hint: Some("expected a Hugging Face config.json of a BERT/MiniLM model".into()),
        })?;
        if !matches!(c.model_type.as_str(), "bert" | "distilbert" | "roberta") {
            return Err(Error::Model {
                message: format!("`{}`: model_type `{}` is not a BERT-family model", path.display(), c.model_type),
                hint: Some("supported here: `bert` (BERT, MiniLM), `distilbert` and `roberta`".into()),
            });
        }
        if c.max_tokens() == 0 {
            return Err(Error::Model {
                message: format!(
                    "`{}`: max_position_embeddings {} leaves no position past pad_token_id {}",
                    path.display(),
                    c.max_position_embeddings,
                    c.pad_token_id.unwrap_or(1)
                ),
                hint: None,
            });
        }
        if c.hidden_act != "gelu" || c.position_embedding_type != "absolute" {
            return Err(Error::Model {
                message: format!(
                    "`{}`: hidden_act `{}` / position_embedding_type `{}` are not supported",
                    path.display(),
                    c.hidden_act,
                    c.position_embedding_type
                ),
                hint: Some("curate's BERT supports `gelu` with absolute positions".into()),
            });
        }
        for (key, p) in [
            ("hidden_dropout_prob", c.hidden_dropout_prob),
            ("attention_probs_dropout_prob", c.attention_probs_dropout_prob),
        ] {
            if !(0.0..1.0).contains(&p) {
                return Err(Error::Model {
                    message: format!("`{}`: {key} {p} is not a dropout rate in [0, 1)", path.display()),
                    hint: None,
                });
            }
        }
        if !c.hidden_size.is_multiple_of(c.num_attention_heads) {
            return Err(Error::Model {
                message: format!("hidden_size {} is not divisible by {} heads", c.hidden_size, c.num_attention_heads),
                hint: None,
            });
        }
        Ok(c)
    }

    /// The first position a token takes: 0, or RoBERTa's `pad_token_id + 1` (transformers'
    /// `create_position_ids_from_input_ids`: `padding_idx + cumsum(ids != padding_idx)`).
    pub fn position_offset(&self) -> usize {
        if self.model_type == "roberta" {
            self.pad_token_id.unwrap_or(1) + 1
        } else {
            0
        }
    }

    /// The longest token sequence the model has positions for.
    pub fn max_tokens(&self) -> usize {
        self.max_position_embeddings.saturating_sub(self.position_offset())
    }
}

#[derive(Module, Debug)]
pub struct BertLayer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
}

#[derive(Module, Debug)]
pub struct Bert {
    word_embeddings: Param<Tensor<2>>,
    position_embeddings: Param<Tensor<2>>,
    /// Absent in DistilBERT.
    token_type_embeddings: Option<Param<Tensor<2>>>,
    embeddings_norm: LayerNorm,
    layers: Vec<BertLayer>,
    #[module(skip)]
    heads: usize,
    /// Index of the first token's position embedding (RoBERTa: `pad_token_id + 1`).
    #[module(skip)]
    position_offset: usize,
    /// Hidden and attention-probability dropout rates, applied on an autodiff device only
    /// (training: the trainee and the EMA teacher, which the reference runs in train mode).
    #[module(skip)]
    dropout: (f64, f64),
    /// Whether the attention's output projection is followed by dropout: BERT's is
    /// (`BertSelfOutput`), DistilBERT's `out_lin` is not.
    #[module(skip)]
    attention_output_dropout: bool,
}

/// Inverted dropout at rate `p` on an autodiff device (training); the identity elsewhere or at
/// rate 0. The mask comes from the device's random stream, which the trainer seeds per step.
fn dropout<const D: usize>(x: Tensor<D>, p: f64) -> Tensor<D> {
    if p <= 0.0 || !x.device().is_autodiff() {
        return x;
    }
    let keep = x.random_like(burn::tensor::Distribution::Bernoulli(1.0 - p));
    (x * keep).mul_scalar(1.0 / (1.0 - p))
}

/// Where each tensor of a layer lives in one checkpoint family (names after `{layers}.{i}.`).
struct Names {
    /// Prefix that task models (`BertForMaskedLM`, ...) put before the encoder.
    task_prefix: &'static str,
    layers: &'static str,
    query: &'static str,
    key: &'static str,
    value: &'static str,
    attention_out: &'static str,
    attention_norm: &'static str,
    intermediate: &'static str,
    output: &'static str,
    output_norm: &'static str,
    token_types: bool,
}

const BERT_NAMES: Names = Names {
    task_prefix: "bert.",
    layers: "encoder.layer",
    query: "attention.self.query",
    key: "attention.self.key",
    value: "attention.self.value",
    attention_out: "attention.output.dense",
    attention_norm: "attention.output.LayerNorm",
    intermediate: "intermediate.dense",
    output: "output.dense",
    output_norm: "output.LayerNorm",
    token_types: true,
};

const ROBERTA_NAMES: Names = Names { task_prefix: "roberta.", ..BERT_NAMES };

const DISTILBERT_NAMES: Names = Names {
    task_prefix: "distilbert.",
    layers: "transformer.layer",
    query: "attention.q_lin",
    key: "attention.k_lin",
    value: "attention.v_lin",
    attention_out: "attention.out_lin",
    attention_norm: "sa_layer_norm",
    intermediate: "ffn.lin1",
    output: "ffn.lin2",
    output_norm: "output_layer_norm",
    token_types: false,
};

impl Bert {
    /// The transformer blocks, first to last (for per-block learning rates).
    pub fn layers(&self) -> &[BertLayer] {
        &self.layers
    }

    /// Builds the model from checkpoint tensors (BERT/MiniLM, DistilBERT or RoBERTa names, by
    /// `model_type`); call [`Weights::finish`] afterwards.
    pub fn from_weights(c: &BertConfig, w: &Weights, device: &Device) -> Bert {
        let n = match c.model_type.as_str() {
            "distilbert" => &DISTILBERT_NAMES,
            "roberta" => &ROBERTA_NAMES,
            _ => &BERT_NAMES,
        };
        let p =
            if w.contains(&format!("{}embeddings.word_embeddings.weight", n.task_prefix)) { n.task_prefix } else { "" };
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        let layers = (0..w.blocks(&format!("{p}{}.", n.layers), c.num_hidden_layers, "layers"))
            .map(|i| {
                let t = |part: &str| format!("{p}{}.{i}.{part}", n.layers);
                BertLayer {
                    query: w.linear(&t(n.query), h, h, device),
                    key: w.linear(&t(n.key), h, h, device),
                    value: w.linear(&t(n.value), h, h, device),
                    attention_out: w.linear(&t(n.attention_out), h, h, device),
                    attention_norm: w.layer_norm(&t(n.attention_norm), h, eps, device),
                    intermediate: w.linear(&t(n.intermediate), h, c.intermediate_size, device),
                    output: w.linear(&t(n.output), c.intermediate_size, h, device),
                    output_norm: w.layer_norm(&t(n.output_norm), h, eps, device),
                }
            })
            .collect();
        let e = |part: &str| format!("{p}embeddings.{part}");
        Bert {
            word_embeddings: w.param(&e("word_embeddings.weight"), [c.vocab_size, h], device),
            position_embeddings: w.param(&e("position_embeddings.weight"), [c.max_position_embeddings, h], device),
            token_type_embeddings: n
                .token_types
                .then(|| w.param(&e("token_type_embeddings.weight"), [c.type_vocab_size, h], device)),
            embeddings_norm: w.layer_norm(&e("LayerNorm"), h, eps, device),
            layers,
            heads: c.num_attention_heads,
            position_offset: c.position_offset(),
            dropout: (c.hidden_dropout_prob, c.attention_probs_dropout_prob),
            attention_output_dropout: c.model_type != "distilbert",
        }
    }

    /// The same model with other dropout rates (hidden, attention probabilities).
    pub fn with_dropout(mut self, hidden: f64, attention: f64) -> Bert {
        self.dropout = (hidden, attention);
        self
    }

    /// Its dropout rates (hidden, attention probabilities).
    pub fn dropout(&self) -> (f64, f64) {
        self.dropout
    }

    /// Checkpoint tensors this encoder leaves out on purpose (task heads, the pooler).
    pub const IGNORED: [&'static str; 9] = [
        "pooler.",
        "bert.pooler.",
        "roberta.pooler.",
        "cls.",
        "lm_head.",
        "vocab_transform.",
        "vocab_layer_norm.",
        "vocab_projector.",
        "qa_outputs.",
    ];

    /// Loads `config.json` + `model.safetensors` (or `pytorch_model.bin`) from a Hugging Face
    /// model folder.
    pub fn load(dir: &Path, device: &Device) -> Result<(Bert, BertConfig)> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let weights = Weights::from_folder_file(&super::weights::hf_weights_file(dir))?;
        let model = Bert::from_weights(&config, &weights, device);
        weights.finish(&Self::IGNORED)?;
        Ok((model, config))
    }

    /// Token states of the last layer.
    ///
    /// # Shapes
    /// - `ids`, `mask`: `[batch, seq]` (mask 1 for real tokens, 0 for padding, which comes last;
    ///   token type 0)
    /// - output: `[batch, seq, hidden]`
    ///
    /// Token `j` takes position `offset + j`. For RoBERTa transformers gives padding the
    /// position `pad_token_id` instead; padding is masked out of every token's attention, so
    /// no real token's state can tell.
    pub fn forward(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<3> {
        let [b, s] = ids.dims();
        let word = self.word_embeddings.val();
        let hidden = word.dims()[1];
        let tokens = word.select(0, ids.reshape([b * s])).reshape([b, s, hidden]);
        let positions = self.position_embeddings.val().narrow(0, self.position_offset, s).unsqueeze_dim::<3>(0);
        let mut x = tokens + positions;
        if let Some(tt) = &self.token_type_embeddings {
            x = x + tt.val().narrow(0, 0, 1).unsqueeze_dim::<3>(0);
        }
        let (p_hidden, p_attention) = self.dropout;
        let mut x = dropout(self.embeddings_norm.forward(x), p_hidden);
        let pad = padding_mask(mask.clone());
        for layer in &self.layers {
            let q = apply(&layer.query, x.clone());
            let k = apply(&layer.key, x.clone());
            let v = apply(&layer.value, x.clone());
            let context = host_attention::attention_padded(&q, &k, &v, self.heads, &mask, None)
                .unwrap_or_else(|| burn_attention(q, k, v, self.heads, None, Some(&pad), p_attention));
            let attended = apply(&layer.attention_out, context);
            let attended = if self.attention_output_dropout { dropout(attended, p_hidden) } else { attended };
            x = layer.attention_norm.forward(attended + x);
            let h = gelu(apply(&layer.intermediate, x.clone()));
            x = layer.output_norm.forward(dropout(apply(&layer.output, h), p_hidden) + x);
        }
        x
    }
}

/// The additive attention mask, as transformers builds it from `mask` (`[batch, tokens]`, 1 for a
/// token, 0 for padding): 0 for tokens, the most negative f32 for padding, as `[batch, 1, 1,
/// tokens]` to broadcast over heads and query positions.
pub(crate) fn padding_mask(mask: Tensor<2, Int>) -> Tensor<4> {
    let [b, s] = mask.dims();
    mask.float().neg().add_scalar(1.0).mul_scalar(f32::MIN).reshape([b, 1, 1, s])
}

/// Multi-head attention of `q`, `k` and `v` (`[batch, tokens, width]`) in burn's operations: the
/// scaled scores plus `bias` (broadcast from `[1 or batch, 1 or heads, tokens, tokens]`: MPNet's
/// relative positions, CLIP text's causal mask) plus `pad` ([`padding_mask`]), and dropout at rate
/// `p` on the probabilities in training. Every transformer's attention with autodiff, and on every
/// device ([`host_attention`] in CPU inference).
pub(crate) fn burn_attention(
    q: Tensor<3>,
    k: Tensor<3>,
    v: Tensor<3>,
    heads: usize,
    bias: Option<&Tensor<4>>,
    pad: Option<&Tensor<4>>,
    p: f64,
) -> Tensor<3> {
    let [b, s, hidden] = q.dims();
    let dh = hidden / heads;
    let split = |t: Tensor<3>| t.reshape([b, s, heads, dh]).swap_dims(1, 2);
    let mut scores = split(q).matmul(split(k).swap_dims(2, 3)).mul_scalar((dh as f64).sqrt().recip());
    for add in [bias, pad].into_iter().flatten() {
        scores = scores + add.clone();
    }
    let probs = dropout(softmax(scores, 3), p);
    probs.matmul(split(v)).swap_dims(1, 2).reshape([b, s, hidden])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' dropout places: BERT's attention output (`BertSelfOutput`) drops, and
    /// DistilBERT's `out_lin` does not; both read their rates under their own key names.
    #[test]
    fn dropout_follows_each_familys_config_and_places() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        for (folder, drops_attention_output) in [("tiny_bert", true), ("tiny_distilbert", false)] {
            let mut text: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(dir.join(folder).join("config.json")).unwrap()).unwrap();
            let (hidden, attention) = if folder == "tiny_bert" {
                ("hidden_dropout_prob", "attention_probs_dropout_prob")
            } else {
                ("dropout", "attention_dropout")
            };
            text[hidden] = 0.25.into();
            text[attention] = 0.5.into();
            let tmp = tempfile::tempdir().unwrap();
            let path = tmp.path().join("config.json");
            std::fs::write(&path, text.to_string()).unwrap();
            let c = BertConfig::from_file(&path).unwrap();
            let model = Bert::from_weights(&c, &Weights::random(0), &Device::flex());
            assert_eq!(model.dropout(), (0.25, 0.5), "{folder}");
            assert_eq!(model.attention_output_dropout, drops_attention_output, "{folder}");
        }
    }

    /// Where the masks fall, by their effect: with the embeddings' LayerNorm at (0, 0) and the
    /// feed-forward's output Linear at 0, the only non-zero value that can meet hidden dropout is
    /// the attention output. DistilBERT's forward pass then does not depend on the random
    /// stream, BERT's does (the same weights under `model_type = "bert"`).
    #[test]
    fn only_berts_attention_output_meets_hidden_dropout() {
        use burn::module::Param;
        let device = Device::default().autodiff();
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny_distilbert");
        let mut c = BertConfig::from_file(&dir.join("config.json")).unwrap();
        (c.hidden_dropout_prob, c.attention_probs_dropout_prob) = (0.5, 0.0);
        let outputs = |model_type: &str| {
            let c = BertConfig { model_type: model_type.into(), ..c.clone() };
            let mut m = Bert::from_weights(&c, &Weights::random(3), &device);
            let h = c.hidden_size;
            m.embeddings_norm.gamma = Param::from_tensor(Tensor::zeros([h], &device));
            m.embeddings_norm.beta = Some(Param::from_tensor(Tensor::zeros([h], &device)));
            for layer in &mut m.layers {
                layer.output.weight = Param::from_tensor(Tensor::zeros([c.intermediate_size, h], &device));
                layer.output.bias = Some(Param::from_tensor(Tensor::zeros([h], &device)));
            }
            let ids = Tensor::<2, Int>::from_data(burn::tensor::TensorData::new(vec![1i64, 2, 3, 4], [1, 4]), &device);
            let mask = Tensor::<2, Int>::ones([1, 4], &device);
            [1u64, 2].map(|seed| {
                device.seed(seed);
                m.forward(ids.clone(), mask.clone()).into_data().try_to_vec::<f32>().unwrap()
            })
        };
        let [a, b] = outputs("distilbert");
        assert_eq!(a, b, "DistilBERT: no mask reaches a non-zero value");
        let [a, b] = outputs("bert");
        assert_ne!(a, b, "BERT: its attention output is dropped");
    }
}
