//! CLIP's text transformer in OpenAI's checkpoint layout (the text tower of the CLIP students of
//! CUSA and PCME++, spec `cusa-and-pcmepp.md` §2.1, §3.1): `token_embedding` + learned
//! `positional_embedding` → pre-LayerNorm blocks under a causal mask
//! (`transformer.resblocks.N.*`, as the image tower's, [`VitBlock`]) → `ln_final` → the
//! end-of-text token's state `@ text_projection`.
//!
//! [`OpenClipConfig`] reads the sizes of both towers from an open_clip model folder's
//! `open_clip_config.json` (open_clip's Hugging Face repositories ship that file beside
//! `open_clip_model.safetensors` or `open_clip_pytorch_model.bin` and a `tokenizer.json` of CLIP's
//! BPE). A whole CLIP state dict
//! is accepted: the image tower's tensors (`visual.`) and `logit_scale` are left to others.
//!
//! Pooling takes the token at `length − 1` of each row, the end-of-text token of CLIP's
//! tokenisation (`[SOT] words [EOT]`, truncated with EOT kept last): OpenAI's `argmax` of the ids
//! finds the same place, and padding after it (any id) changes nothing under the causal mask.

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::LayerNorm;
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::Deserialize;

use super::vit::{MlpActivation, VitBlock, VitConfig, VitLayout};
use super::weights::Weights;
use crate::error::{Error, Result};

/// Sizes of a CLIP text tower.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClipTextConfig {
    /// Positions of `positional_embedding` (77 in every released CLIP).
    pub context_length: usize,
    pub vocab_size: usize,
    pub width: usize,
    pub heads: usize,
    pub layers: usize,
    /// `text_projection`'s output, the joint space (512 for ViT-B/32).
    pub output_dim: usize,
    pub activation: MlpActivation,
}

impl ClipTextConfig {
    /// OpenAI CLIP ViT-B/32's text tower: 77 positions, 49,408 BPE tokens, width 512, 12
    /// layers of 8 heads, 512-d output, QuickGELU.
    pub fn vit_b32() -> Self {
        ClipTextConfig {
            context_length: 77,
            vocab_size: 49_408,
            width: 512,
            heads: 8,
            layers: 12,
            output_dim: 512,
            activation: MlpActivation::QuickGelu,
        }
    }
}

/// `open_clip_config.json`: `{"model_cfg": {embed_dim, quick_gelu, vision_cfg, text_cfg}}`.
#[derive(Debug, Clone)]
pub struct OpenClipConfig {
    pub vision: VitConfig,
    pub text: ClipTextConfig,
}

#[derive(Deserialize)]
struct RawFile {
    model_cfg: RawModel,
}

#[derive(Deserialize)]
struct RawModel {
    embed_dim: usize,
    #[serde(default)]
    quick_gelu: bool,
    vision_cfg: RawVision,
    text_cfg: RawText,
}

/// A side, or `[height, width]` (square only here).
#[derive(Deserialize)]
#[serde(untagged)]
enum Side {
    One(usize),
    Two([usize; 2]),
}

#[derive(Deserialize)]
struct RawVision {
    image_size: Side,
    layers: usize,
    width: usize,
    patch_size: Side,
    #[serde(default = "default_head_width")]
    head_width: usize,
    #[serde(default = "default_mlp_ratio")]
    mlp_ratio: f64,
}

#[derive(Deserialize)]
struct RawText {
    #[serde(default = "default_context")]
    context_length: usize,
    #[serde(default = "default_vocab")]
    vocab_size: usize,
    #[serde(default = "default_text_width")]
    width: usize,
    #[serde(default = "default_text_heads")]
    heads: usize,
    #[serde(default = "default_text_layers")]
    layers: usize,
}

// open_clip's `CLIPVisionCfg` / `CLIPTextCfg` defaults.
fn default_head_width() -> usize {
    64
}
fn default_mlp_ratio() -> f64 {
    4.0
}
fn default_context() -> usize {
    77
}
fn default_vocab() -> usize {
    49_408
}
fn default_text_width() -> usize {
    512
}
fn default_text_heads() -> usize {
    8
}
fn default_text_layers() -> usize {
    12
}

impl OpenClipConfig {
    /// The file's name in an open_clip model folder.
    pub const FILE: &'static str = "open_clip_config.json";

    /// Whether the file says `quick_gelu` at all (open_clip takes QuickGELU for OpenAI's weights
    /// from its pretrained tags, not from the model config: a folder saved from the plain
    /// `ViT-B-32` config leaves the key out, and the default, exact GELU, is wrong for them).
    pub fn names_quick_gelu(path: &Path) -> bool {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .is_some_and(|v| v["model_cfg"].get("quick_gelu").is_some())
    }

    /// Reads an open_clip model config. Only the plain CLIP ViT family is supported (no timm or
    /// Hugging Face towers, no attention pooling): other keys in `vision_cfg` / `text_cfg` are
    /// refused by name rather than ignored.
    pub fn from_file(path: &Path) -> Result<OpenClipConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("cannot read", path, e))?;
        let bad = |m: String| Error::Model {
            message: format!("`{}`: {m}", path.display()),
            hint: Some(
                "curate's CLIP towers are open_clip's plain ViT + text transformer (e.g. ViT-B-32, \
                 ViT-B-32-quickgelu)"
                    .into(),
            ),
        };
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        // Keys that change the architecture beyond what is built here.
        let known_vision = ["image_size", "layers", "width", "patch_size", "head_width", "mlp_ratio"];
        let known_text = ["context_length", "vocab_size", "width", "heads", "layers"];
        let mut unknown = Vec::new();
        for (table, known) in [("vision_cfg", &known_vision[..]), ("text_cfg", &known_text[..])] {
            if let Some(obj) = v["model_cfg"][table].as_object() {
                unknown.extend(obj.keys().filter(|k| !known.contains(&k.as_str())).map(|k| format!("{table}.{k}")));
            }
        }
        if !unknown.is_empty() {
            return Err(bad(format!("unsupported model settings: {}", unknown.join(", "))));
        }
        let raw: RawFile = serde_json::from_value(v).map_err(|e| bad(format!("not an open_clip model config: {e}")))?;
        let m = raw.model_cfg;
        let side = |s: &Side, what: &str| match *s {
            Side::One(n) => Ok(n),
            Side::Two([h, w]) if h == w => Ok(h),
            Side::Two([h, w]) => Err(bad(format!("{what} {h}x{w} is not square"))),
        };
        let (image_size, patch_size) =
            (side(&m.vision_cfg.image_size, "image_size")?, side(&m.vision_cfg.patch_size, "patch_size")?);
        let v = &m.vision_cfg;
        if patch_size == 0
            || !image_size.is_multiple_of(patch_size)
            || v.head_width == 0
            || !v.width.is_multiple_of(v.head_width)
        {
            return Err(bad(format!(
                "vision_cfg: image_size {image_size}, patch_size {patch_size}, width {}, head_width {} do not fit",
                v.width, v.head_width
            )));
        }
        if m.text_cfg.heads == 0 || !m.text_cfg.width.is_multiple_of(m.text_cfg.heads) {
            return Err(bad(format!(
                "text_cfg: width {} is not a multiple of {} heads",
                m.text_cfg.width, m.text_cfg.heads
            )));
        }
        let activation = if m.quick_gelu { MlpActivation::QuickGelu } else { MlpActivation::Gelu };
        Ok(OpenClipConfig {
            vision: VitConfig {
                layout: VitLayout::Clip,
                activation,
                image_size,
                patch_size,
                width: v.width,
                layers: v.layers,
                heads: v.width / v.head_width,
                mlp_dim: (v.width as f64 * v.mlp_ratio) as usize,
                output_dim: m.embed_dim,
            },
            text: ClipTextConfig {
                context_length: m.text_cfg.context_length,
                vocab_size: m.text_cfg.vocab_size,
                width: m.text_cfg.width,
                heads: m.text_cfg.heads,
                layers: m.text_cfg.layers,
                output_dim: m.embed_dim,
                activation,
            },
        })
    }
}

#[derive(Module, Debug)]
pub struct ClipText {
    /// `[vocab_size, width]`.
    token_embedding: Param<Tensor<2>>,
    /// `[context_length, width]`.
    positional_embedding: Param<Tensor<2>>,
    blocks: Vec<VitBlock>,
    ln_final: LayerNorm,
    /// `[width, output_dim]`.
    text_projection: Param<Tensor<2>>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    activation: MlpActivation,
    #[module(skip)]
    whole_clip: bool,
}

/// Causal attention: position i attends to positions ≤ i (`-inf` above the diagonal).
fn causal_mask(n: usize, device: &Device) -> Tensor<2> {
    let causal: Vec<f32> = (0..n * n).map(|k| if k % n > k / n { f32::NEG_INFINITY } else { 0.0 }).collect();
    Tensor::<2>::from_data(TensorData::new(causal, [n, n]), device)
}

/// Tensors of a whole CLIP state dict outside the text tower.
const CLIP_IMAGE_TOWER: [&str; 2] = ["visual.", "logit_scale"];

impl ClipText {
    /// Builds the tower from checkpoint tensors (or [`Weights::random`]); call
    /// [`Weights::finish`] with [`ClipText::ignored`] afterwards.
    pub fn from_weights(c: &ClipTextConfig, w: &Weights, device: &Device) -> ClipText {
        let d = c.width;
        let blocks = (0..c.layers)
            .map(|i| VitBlock::clip(w, &format!("transformer.resblocks.{i}."), d, 4 * d, device))
            .collect();
        ClipText {
            token_embedding: w.param("token_embedding.weight", [c.vocab_size, d], device),
            positional_embedding: w.param("positional_embedding", [c.context_length, d], device),
            blocks,
            ln_final: w.layer_norm("ln_final", d, 1e-5, device),
            text_projection: w.param("text_projection", [d, c.output_dim], device),
            heads: c.heads,
            activation: c.activation,
            whole_clip: w.contains("visual.conv1.weight"),
        }
    }

    /// Checkpoint tensors left out on purpose: the image tower and `logit_scale` of a whole CLIP.
    pub fn ignored(&self) -> &'static [&'static str] {
        if self.whole_clip {
            &CLIP_IMAGE_TOWER
        } else {
            &[]
        }
    }

    /// Loads the tower from a state dict (safetensors or PyTorch; a whole CLIP or the text tower alone).
    pub fn load(path: &Path, c: &ClipTextConfig, device: &Device) -> Result<ClipText> {
        Weights::load_model(path, None, |w| ClipText::from_weights(c, w, device), ClipText::ignored)
    }

    /// The transformer blocks, first to last (for per-block learning rates).
    pub fn blocks(&self) -> &[VitBlock] {
        &self.blocks
    }

    pub fn width(&self) -> usize {
        self.positional_embedding.dims()[1]
    }

    pub fn output_dim(&self) -> usize {
        self.text_projection.dims()[1]
    }

    /// The most tokens a row may have.
    pub fn context_length(&self) -> usize {
        self.positional_embedding.dims()[0]
    }

    /// Every position's state after `ln_final` (PCME++'s GPO input).
    ///
    /// # Shapes
    /// - `ids`: `[batch, tokens]` (tokens ≤ `context_length`) → `[batch, tokens, width]`
    pub fn forward_tokens(&self, ids: Tensor<2, Int>) -> Tensor<3> {
        self.forward_tokens_split(ids).0
    }

    /// [`ClipText::forward_tokens`], and the states before the last block (the input of
    /// PCME++'s log-variance branch: a block of its own in the last one's place, no `ln_final`).
    ///
    /// # Shapes
    /// - `ids`: `[batch, tokens]` → 2 × `[batch, tokens, width]`
    pub fn forward_tokens_split(&self, ids: Tensor<2, Int>) -> (Tensor<3>, Tensor<3>) {
        let [b, n] = ids.dims();
        let d = self.width();
        let x = self.token_embedding.val().select(0, ids.reshape([b * n])).reshape([b, n, d]);
        let mut x = x + self.positional_embedding.val().narrow(0, 0, n).unsqueeze_dim::<3>(0);
        let mask = causal_mask(n, &x.device());
        let last = self.blocks.len().saturating_sub(1);
        for block in &self.blocks[..last] {
            x = block.forward(x, self.heads, self.activation, Some(&mask));
        }
        let before = x.clone();
        for block in &self.blocks[last..] {
            x = block.forward(x, self.heads, self.activation, Some(&mask));
        }
        (self.ln_final.forward(x), before)
    }

    /// `block` (a [`VitBlock::fresh`] of this width) on token states, with this tower's heads,
    /// activation and causal mask.
    pub fn run_block(&self, block: &VitBlock, x: Tensor<3>) -> Tensor<3> {
        let mask = causal_mask(x.dims()[1], &x.device());
        block.forward(x, self.heads, self.activation, Some(&mask))
    }

    /// Its number of transformer blocks.
    pub fn layers(&self) -> usize {
        self.blocks.len()
    }

    /// The end-of-text token's state (row `r`'s token `lengths[r] − 1`) `@ text_projection`.
    ///
    /// # Shapes
    /// - `states`: `[batch, tokens, width]` → `[batch, output_dim]`
    pub fn pool(&self, states: Tensor<3>, lengths: &[usize]) -> Tensor<2> {
        let [b, n, d] = states.dims();
        let at: Vec<i64> = lengths.iter().map(|&l| (l.clamp(1, n) - 1) as i64).collect();
        let index = Tensor::<1, Int>::from_data(TensorData::new(at, [b]), &states.device())
            .reshape([b, 1, 1])
            .expand([b, 1, d]);
        states.gather(1, index).reshape([b, d]).matmul(self.text_projection.val())
    }

    /// CLIP's `encode_text`: one embedding per row (not normalised).
    ///
    /// # Shapes
    /// - `ids`: `[batch, tokens]`, `lengths`: each row's tokens (SOT to EOT) → `[batch, output_dim]`
    pub fn forward(&self, ids: Tensor<2, Int>, lengths: &[usize]) -> Tensor<2> {
        self.pool(self.forward_tokens(ids), lengths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::models::vit::Vit;

    fn flat(v: &serde_json::Value) -> Vec<f32> {
        match v {
            serde_json::Value::Array(a) => a.iter().flat_map(flat).collect(),
            x => vec![x.as_f64().unwrap() as f32],
        }
    }

    /// PCME++'s log-variance branches (`n_unc_layers = 1`) against open_clip's
    /// `ResidualAttentionBlock` on the tiny CLIP (`make_pcmepp_branch_fixture.py`): each tower's
    /// states before its last block, through the new block (the text one under the causal
    /// mask), with no final norm.
    #[test]
    fn log_variance_branches_match_the_reference_composition() {
        let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        let folder = models.join("tiny_open_clip");
        let e: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(models.join("tiny_open_clip_expected.json")).unwrap())
                .unwrap();
        let want: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(models.join("tiny_pcmepp_branches_expected.json")).unwrap())
                .unwrap();
        let device = Device::flex();
        let c = OpenClipConfig::from_file(&folder.join(OpenClipConfig::FILE)).unwrap();
        let weights = folder.join("open_clip_model.safetensors");
        let (vit, text) =
            (Vit::load(&weights, &c.vision, &device).unwrap(), ClipText::load(&weights, &c.text, &device).unwrap());
        let w = Weights::from_safetensors(&models.join("tiny_pcmepp_branches.safetensors")).unwrap();
        let image_block = VitBlock::clip(&w, "image_log_var_block.", vit.width(), vit.mlp_dim(), &device);
        let text_block = VitBlock::clip(&w, "text_log_var_block.", text.width(), 4 * text.width(), &device);
        w.finish(&[]).unwrap();

        let shape: Vec<usize> =
            e["image_input_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let images = Tensor::<4>::from_data(
            TensorData::new(flat(&e["image_input"]), [shape[0], shape[1], shape[2], shape[3]]),
            &device,
        );
        let (_, before) = vit.forward_tokens_split(images);
        let ids: Vec<i64> = flat(&e["ids"]).iter().map(|&x| x as i64).collect();
        let rows = e["lengths"].as_array().unwrap().len();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [rows, ids.len() / rows]), &device);
        let (_, text_before) = text.forward_tokens_split(ids);
        for (got, key) in [
            (vit.run_block(&image_block, before), "image_tokens"),
            (text.run_block(&text_block, text_before), "text_tokens"),
        ] {
            let got = got.into_data().try_to_vec::<f32>().unwrap();
            let want = flat(&want[key]);
            assert_eq!(got.len(), want.len(), "{key}");
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()), "{key} [{i}]: {a} vs {b}");
            }
        }
    }
}
