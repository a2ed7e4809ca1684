//! The training file (`curate train FILE`): model, data, loss, optimiser, schedule, evaluation —
//! one TOML document read with the pipeline's [`ConfigDoc`], so `--set key.path=value`
//! overrides (`--set loss.type=otter`, `--set output_dir=out/x`) and every error is reported at
//! once with file, line and a hint, before any data is read. The `[loss]` table is
//! [`LossConfig`] (tagged by `type`, each loss with its paper's defaults).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::Value;

use crate::error::{Diagnostic, Error, Result};
use crate::io::PathPatterns;
use crate::losses::LossConfig;
use crate::models::pooling::Pooling;
use crate::pipeline::config::ConfigDoc;
use crate::train::transform::ImageTransformKind;

/// The most slots a memory bank may have: 2^20, 6 GiB for the two banks at 768 dimensions (the
/// paper's K is 8192). Past it the banks are refused before the run starts, not left to fail
/// allocating.
const MAX_BANK_SIZE: usize = 1 << 20;
/// The most Sinkhorn iterations OTTER's loss takes.
const MAX_SINKHORN_ITERATIONS: usize = 1000;

/// A whole training file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// A name for the run (shown in logs).
    #[serde(default = "default_name")]
    pub name: String,
    /// Where the resolved config, `metrics.jsonl`, checkpoints and the final model go.
    pub output_dir: PathBuf,
    /// Seeds the random initialisation, the data order and the augmentations.
    #[serde(default)]
    pub seed: u64,
    /// Optimiser steps to take (one batch each). Exactly one of `steps` and `epochs`.
    #[serde(default)]
    pub steps: Option<u64>,
    /// Passes over the training set (the last incomplete batch of an epoch is dropped).
    #[serde(default)]
    pub epochs: Option<u64>,
    /// Image-caption pairs per step.
    #[serde(default = "default_batch")]
    pub batch_size: usize,
    /// Write a `metrics.jsonl` line every this many steps.
    #[serde(default = "default_log_every")]
    pub log_every: u64,
    /// Write a checkpoint every this many steps (0: only the final model).
    #[serde(default = "default_checkpoint_every")]
    pub checkpoint_every: u64,
    /// How many of the newest checkpoints to keep.
    #[serde(default = "default_keep")]
    pub keep_checkpoints: usize,
    pub model: ModelConfig,
    pub data: DataConfig,
    pub loss: LossConfig,
    #[serde(default)]
    pub optim: OptimConfig,
    #[serde(default)]
    pub eval: Option<ZeroShotConfig>,
}

fn default_name() -> String {
    "train".into()
}
fn default_batch() -> usize {
    512
}
fn default_log_every() -> u64 {
    10
}
fn default_checkpoint_every() -> u64 {
    1000
}
fn default_keep() -> usize {
    2
}

/// The dual encoder: an image tower + linear projection, a text tower + pooling (+ projection).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Width of the joint embedding space (the paper: 768, DistilBERT's width).
    #[serde(default = "default_embed_dim")]
    pub embed_dim: usize,
    /// Side of the square training crops and evaluation images.
    #[serde(default = "default_image_size")]
    pub image_size_px: usize,
    /// Every key has a default: `[model.image]` may be left out (a tiny random ResNet).
    #[serde(default)]
    pub image: ImageModelConfig,
    /// The BERT-family text tower; one of `[model.text]` and `[model.clip]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<TextModelConfig>,
    /// CLIP's image and text towers from an open_clip model folder (the CUSA and PCME++
    /// students), in place of `[model.image]` and `[model.text]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip: Option<ClipModelConfig>,
    /// Initial bias of PCME++'s log-variance heads (the reference: 0). With `D` dimensions the
    /// initial `Σ exp(v)` is `D·e^bias`; at 0 every matching logit starts deeply negative, the
    /// negatives give no gradient and a short run collapses (the reference trains 25 epochs).
    #[serde(default)]
    pub log_variance_bias: f64,
    /// Pool with GPO (VSE∞'s generalised pooling; PCME++'s heads, spec `cusa-and-pcmepp.md`
    /// §3.1): the cross-modal embedding (and PCME++'s log-variance) is projected from every token
    /// (the image tower's grid cells, the text tower's tokens) and pooled by a GPO of its own.
    /// Off (the default): the towers' pooled features are projected. CUSA's uni-modal heads
    /// always project the pooled features.
    #[serde(default)]
    pub gpo: bool,
    /// The new heads' structure and initialisation: `linear` (the default: one Linear, PyTorch's
    /// default init), `cusa` (spec `cusa-and-pcmepp.md` §2.1: `Linear(LayerNorm(f))` for the
    /// cross-modal and uni-modal heads, Linear weights ~ N(0, 0.02), biases PyTorch's default,
    /// LayerNorm (1, 0)) or `pcmepp` (§3.1: the image tower's Linears Xavier-uniform with bias 0,
    /// the text tower's PyTorch's default; the log-variance heads' bias stays
    /// `log_variance_bias`). With `cusa` or `pcmepp` the text tower gets its cross-modal head
    /// unless `model.text.projection = false`, as in both references.
    #[serde(default)]
    pub head_style: HeadStyle,
    /// PCME++'s image token dropping (VSE∞'s size augmentation, spec §3.9; the reference: 0.2),
    /// with `gpo` only: in training, an image draws `q ~ U(0, 1)` and, when `q` is above this
    /// rate, each grid cell is left out of its GPOs with probability `rate · q`. 0 (the default):
    /// off.
    #[serde(default)]
    pub image_token_drop: f64,
    /// PCME++'s log-variance branches (spec `cusa-and-pcmepp.md` §3.1, `n_unc_layers = 1`),
    /// with `[model.clip]`, `gpo` and PCME++'s loss: each tower's last block is shared no
    /// more; the log-variance tokens come from a new block of the same width on the states
    /// before it (the image branch with PyTorch's init, the text branch with CLIP's and no
    /// `ln_final`). Off (the default): the log-variance heads take μ's tokens.
    #[serde(default)]
    pub log_variance_block: bool,
}

/// See [`ModelConfig::head_style`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadStyle {
    #[default]
    Linear,
    Cusa,
    Pcmepp,
}

fn default_embed_dim() -> usize {
    768
}
fn default_image_size() -> usize {
    224
}

/// A torchvision-layout ResNet or a mobile-vision FBNetV3.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageModelConfig {
    /// `tiny` (one Bottleneck per stage, stem width 8: 256-d), `resnet18`, `resnet34` (512-d),
    /// `resnet50`, `resnet101`, `wide_resnet50_2` (2048-d), `fbnetv3_a`, `fbnetv3_c` (1984-d),
    /// `tiny_fbnet` (64-d).
    #[serde(default = "default_image_preset")]
    pub preset: ImagePreset,
    /// Overrides a ResNet preset's blocks per stage.
    #[serde(default)]
    pub layers: Option<[usize; 4]>,
    /// Overrides a ResNet preset's stem width (features: 32 × width).
    #[serde(default)]
    pub width: Option<usize>,
    /// A torchvision-layout state dict (safetensors or a PyTorch `.pth`/`.pth.tar`, e.g.
    /// ImageNet or BYOL ResNet-50), or for FBNetV3 mobile-vision's model zoo `model.pth`;
    /// absent: random initialisation from `seed`.
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
    /// Read only `checkpoint`'s tensors under this prefix, without it (a MoCo checkpoint's
    /// `module.encoder_q.`). Left out of `config.json` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_prefix: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImagePreset {
    Tiny,
    Resnet18,
    Resnet34,
    Resnet50,
    Resnet101,
    #[serde(rename = "wide_resnet50_2")]
    WideResnet50_2,
    #[serde(rename = "fbnetv3_a")]
    FbnetV3A,
    #[serde(rename = "fbnetv3_c")]
    FbnetV3C,
    TinyFbnet,
}

impl ImagePreset {
    /// The FBNetV3 architecture of an FBNetV3 preset; `None` for the ResNets.
    pub fn fbnet(self) -> Option<crate::models::fbnet::FbNetConfig> {
        use crate::models::fbnet::FbNetConfig;
        match self {
            ImagePreset::FbnetV3A => Some(FbNetConfig::fbnetv3_a()),
            ImagePreset::FbnetV3C => Some(FbNetConfig::fbnetv3_c()),
            ImagePreset::TinyFbnet => Some(FbNetConfig::tiny()),
            _ => None,
        }
    }
}

impl Default for ImageModelConfig {
    fn default() -> Self {
        ImageModelConfig {
            preset: default_image_preset(),
            layers: None,
            width: None,
            checkpoint: None,
            checkpoint_prefix: None,
        }
    }
}

fn default_image_preset() -> ImagePreset {
    ImagePreset::Tiny
}

/// A BERT-family text tower from a Hugging Face folder: `config.json` + `tokenizer.json`, and
/// `model.safetensors` (or `pytorch_model.bin`) when `pretrained`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TextModelConfig {
    /// The model folder (BERT, MiniLM or DistilBERT layout).
    pub dir: PathBuf,
    /// Load the folder's weights (the paper: `distilbert-base-uncased`); false: random
    /// initialisation from `seed` with the folder's `config.json` sizes.
    #[serde(default = "yes")]
    pub pretrained: bool,
    /// Token pooling: `mean` over the attention mask (the paper) or `cls`.
    #[serde(default = "default_pooling")]
    pub pooling: Pooling,
    /// Truncation length in tokens (OTTER: 60).
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    /// Add a linear projection after pooling; default: only when the text width differs from
    /// `embed_dim` (the paper has none: DistilBERT is 768-d).
    #[serde(default)]
    pub projection: Option<bool>,
    /// The text tower's dropout rate in training (hidden and attention probabilities alike);
    /// default: the folder's `config.json` rates (`hidden_dropout_prob`,
    /// `attention_probs_dropout_prob`, DistilBERT's `dropout`, `attention_dropout`;
    /// transformers' 0.1 where absent), as the papers' Hugging Face towers train. 0: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dropout: Option<f64>,
}

/// CLIP's towers (`[model.clip]`) from an open_clip model folder, as open_clip's Hugging Face
/// repositories ship them: `open_clip_config.json` (the sizes), `tokenizer.json` (CLIP's BPE)
/// and, when `pretrained`, `open_clip_model.safetensors` or `open_clip_pytorch_model.bin`
/// (OpenAI's layout: `visual.*` and the text tower).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClipModelConfig {
    pub dir: PathBuf,
    /// Load the folder's weights; false: both towers random from `seed`.
    #[serde(default = "yes")]
    pub pretrained: bool,
    /// Tokens per caption, start and end of text included; default (and at most): the model's
    /// context length (77 in every released CLIP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    /// QuickGELU (OpenAI's weights) or exact GELU in the MLPs; default: the folder's
    /// `quick_gelu` (false where absent, open_clip's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quick_gelu: Option<bool>,
}

impl ClipModelConfig {
    /// The folder's sizes, with `quick_gelu` applied.
    pub fn open_clip(&self) -> crate::error::Result<crate::models::clip_text::OpenClipConfig> {
        use crate::models::clip_text::OpenClipConfig;
        use crate::models::vit::MlpActivation;
        let mut c = OpenClipConfig::from_file(&self.dir.join(OpenClipConfig::FILE))?;
        if let Some(q) = self.quick_gelu {
            let a = if q { MlpActivation::QuickGelu } else { MlpActivation::Gelu };
            (c.vision.activation, c.text.activation) = (a, a);
        }
        Ok(c)
    }
}

impl ModelConfig {
    /// The same model with every tower drawn at random instead of read from its checkpoint:
    /// what a finished run's saved weights are loaded into (they replace every tensor), so that
    /// evaluating a run needs neither the checkpoints it started from nor the time to read them.
    /// The model folders' `config.json` / `open_clip_config.json` (the sizes) and tokenizers
    /// are still read.
    pub fn architecture_only(&self) -> ModelConfig {
        let mut m = self.clone();
        m.image.checkpoint = None;
        m.image.checkpoint_prefix = None;
        if let Some(t) = &mut m.text {
            t.pretrained = false;
        }
        if let Some(c) = &mut m.clip {
            c.pretrained = false;
        }
        m
    }

    /// The folder of the text tower's `tokenizer.json`.
    pub fn tokenizer_dir(&self) -> &Path {
        match (&self.text, &self.clip) {
            (Some(t), _) => &t.dir,
            (None, Some(c)) => &c.dir,
            // Refused when the config is checked.
            (None, None) => Path::new(""),
        }
    }

    /// Tokens per caption (`[model.clip]`: resolved to the context length when checked).
    pub fn max_tokens(&self) -> usize {
        match (&self.text, &self.clip) {
            (Some(t), _) => t.max_tokens,
            (None, Some(c)) => c.max_tokens.unwrap_or(77),
            (None, None) => default_max_tokens(),
        }
    }
}

fn yes() -> bool {
    true
}
fn default_pooling() -> Pooling {
    Pooling::Mean
}
fn default_max_tokens() -> usize {
    60
}

/// Training tables: any `curate run` output with `sample_id`, a caption and an image path.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataConfig {
    /// Parquet files or globs; all rows of all tables form one training set (e.g. aligned and
    /// pseudo-captioned pairs).
    pub tables: PathPatterns,
    #[serde(default = "default_caption")]
    pub caption_column: String,
    #[serde(default = "default_path")]
    pub image_column: String,
    /// Image paths are relative to this folder (default: as stored, i.e. the working directory).
    #[serde(default)]
    pub image_root: Option<PathBuf>,
    /// Folder of img2dataset webdataset shards: rows without an image path are read from
    /// `<shards_dir>/<shard>.tar` member `<key>.jpg|jpeg|png|webp` (columns `shard`, `key`).
    #[serde(default)]
    pub shards_dir: Option<PathBuf>,
    /// Apply CUSA's `pre_caption` (lower-case, punctuation to spaces, at most 64 words; spec
    /// `cusa-and-pcmepp.md` §1.2) to every training caption before tokenising, as its student's
    /// tokenizer sees them; pair it with teacher text features made by `encode_text` with
    /// `pre_caption = true`. The zero-shot prompts and `curate eval RUN_DIR`'s retrieval
    /// captions get it too.
    /// Rows it empties are left out (a note counts them).
    #[serde(default)]
    pub pre_caption: bool,
    /// How training views are drawn and evaluation images prepared, as a paper defines it
    /// ([`crate::train::transform`]): `random_resized_crop` (the default), `otter` (the BoW
    /// paper's, §7 A9), `pcmepp` or `clip` (CUSA's).
    #[serde(default)]
    pub image_transform: ImageTransformKind,
    /// RandomResizedCrop area fraction range (torchvision: [0.08, 1]); `random_resized_crop`
    /// only (filled in for it when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crop_scale: Option<[f64; 2]>,
    /// RandomResizedCrop aspect-ratio range ([3/4, 4/3]); `random_resized_crop` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub crop_ratio: Option<[f64; 2]>,
    /// Random horizontal flip with probability 0.5. Default: as the transform's paper (yes for
    /// `random_resized_crop` and `pcmepp`, no for `otter` and `clip`); filled in when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flip: Option<bool>,
    /// `random_resized_crop` only: resample with PIL's antialiased bilinear filter (what
    /// torchvision's `RandomResizedCrop` does to a PIL image: the crop, then `resize((size,
    /// size), BILINEAR)`; evaluation resizes the whole image so). Off (the default): bilinear at
    /// pixel centres without antialiasing, the trainer's first sampler, so that earlier runs
    /// evaluate as they trained.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub antialias: bool,
    /// PCME++'s noisy-correspondence setting (spec `cusa-and-pcmepp.md` §3.9): the captions of
    /// a random `floor(r · N)` of the training rows are permuted among those rows (seeded by
    /// `seed`), so about that share of pairs no longer match. 0 (the default): off.
    #[serde(default)]
    pub noise_ratio: f64,
    /// PCME++'s caption augmentation, as its loader does it (spec `cusa-and-pcmepp.md` §3.9):
    /// each unit with probability 0.2 is masked (half of those), replaced by random tokens (a
    /// tenth) or deleted (the rest); the unit is a word masked with `[MASK]` for a BERT-family
    /// tokenizer (`process_caption`), a token masked with the BPE symbol `M` for CLIP's
    /// (`process_caption_vit`). Off by default.
    #[serde(default)]
    pub caption_augment: bool,
    /// PCME++'s mixed sample data augmentation (Mixup / CutMix on images, soft labels; spec
    /// `cusa-and-pcmepp.md` §3.8); absent: off. Only with `loss.type = "pcmepp"`.
    #[serde(default)]
    pub msda: Option<MsdaConfig>,
    /// Teacher image features (CUSA): Parquet with `sample_id` and `embedding`, joined by
    /// `sample_id`.
    #[serde(default)]
    pub teacher_image: Option<PathPatterns>,
    /// Teacher text features (CUSA), as `teacher_image`.
    #[serde(default)]
    pub teacher_text: Option<PathPatterns>,
}

/// Mixup / CutMix per batch element with the reversed batch as partner (PCME++ §3.8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MsdaConfig {
    /// Probability that an element is mixed (`mix_batch_ratio`, 0.25).
    #[serde(default = "default_mix_ratio")]
    pub mix_ratio: f64,
    /// Probability that a mixed element uses CutMix rather than Mixup (`switch_prob`, 0.5).
    #[serde(default = "default_cutmix_prob")]
    pub cutmix_prob: f64,
    /// `λ ~ Beta(beta, beta)` (2).
    #[serde(default = "default_beta")]
    pub beta: f64,
}

fn default_mix_ratio() -> f64 {
    0.25
}
fn default_cutmix_prob() -> f64 {
    0.5
}
fn default_beta() -> f64 {
    2.0
}

fn default_caption() -> String {
    "caption".into()
}
fn default_path() -> String {
    "path".into()
}
/// RandomResizedCrop's area fraction range when `crop_scale` is absent (torchvision's).
pub const DEFAULT_CROP_SCALE: [f64; 2] = [0.08, 1.0];
/// RandomResizedCrop's aspect-ratio range when `crop_ratio` is absent (torchvision's).
pub const DEFAULT_CROP_RATIO: [f64; 2] = [0.75, 4.0 / 3.0];

/// Optimiser and learning-rate schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimConfig {
    /// `sgd` (with momentum; the BoW paper and OTTER), `adamw`, or `adamp` (PCME++'s, spec
    /// `cusa-and-pcmepp.md` §3.10: Adam that takes the radial part out of the update of
    /// scale-invariant weights; `src/train/adamp.rs`).
    #[serde(default = "default_optimizer")]
    pub optimizer: OptimizerKind,
    /// Peak learning rate (the papers: 3e-3 with SGD).
    #[serde(default = "default_lr")]
    pub lr: f64,
    /// SGD momentum (0.9).
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// AdamW / AdamP betas.
    #[serde(default = "default_betas")]
    pub betas: [f64; 2],
    /// AdamP: a tensor counts as scale-invariant when every row's `|cos(grad, weight)|` is below
    /// `adamp_delta / √(row length)` (0.1, the package's and PCME++'s).
    #[serde(default = "default_adamp_delta")]
    pub adamp_delta: f64,
    /// AdamP: the weight decay's factor for a projected tensor (0.1).
    #[serde(default = "default_adamp_wd_ratio")]
    pub adamp_wd_ratio: f64,
    /// Weight decay of the encoders (decoupled for AdamW, L2 for SGD); the loss's temperatures
    /// and scales never decay.
    #[serde(default)]
    pub weight_decay: f64,
    /// No weight decay for the encoders' parameters of one dimension (biases, LayerNorm and
    /// BatchNorm weights): CUSA's recipe (spec `cusa-and-pcmepp.md` §2.6: "parameters with 1-D
    /// shape or a name ending in `.bias` get no decay"; every bias here is 1-D). Off (the
    /// default): every encoder parameter decays, as PCME++'s recipe has it.
    #[serde(default)]
    pub no_weight_decay_1d: bool,
    /// Clip the gradients to this L2 norm, as `grad_clip_scope` says.
    #[serde(default)]
    pub grad_clip_norm: Option<f64>,
    /// `global` (the default: PyTorch's `clip_grad_norm_`, one norm over every trainable
    /// parameter, the loss's included, scaled by `min(1, max / (norm + 1e-6))`; PCME++'s, spec
    /// §3.10) or `tensor` (each parameter's gradient clipped to the norm on its own: burn's,
    /// and what runs made before this key did).
    #[serde(default = "default_clip_scope")]
    pub grad_clip_scope: ClipScope,
    /// Layer-wise learning-rate decay (spec `cusa-and-pcmepp.md` §3.10, 0.7 there): block `k`
    /// of a tower of `L` transformer blocks (the text tower, CLIP's ViT) gets its
    /// `*_backbone_lr_scale · layer_decay^(L − k)` of the rate, PCME++'s new log-variance
    /// blocks that of the last block; the tower's other weights (embeddings, their norms) get
    /// the scale alone, as in the reference. A ResNet tower has no transformer blocks and gets
    /// its scale alone (the reference's block pattern does not match a ResNet either). 1 (the
    /// default): off.
    #[serde(default = "one")]
    pub layer_decay: f64,
    /// The image tower's share of the rate (its projection and heads get the whole rate):
    /// PCME++'s 0.01. 1: the default.
    #[serde(default = "one")]
    pub image_backbone_lr_scale: f64,
    /// The text tower's share of the rate (its projection and heads get the whole rate):
    /// PCME++'s 0.1. 1: the default.
    #[serde(default = "one")]
    pub text_backbone_lr_scale: f64,
    /// Linear warm-up steps from 0 to `lr`.
    #[serde(default)]
    pub warmup_steps: u64,
    /// After warm-up: `cosine` (per step, towards `min_lr`, which the step after the last would
    /// reach), `cosine_per_epoch` (one value per epoch, `min_lr + ½(lr − min_lr)(1 + cos(π·e/E))` for epoch `e` of `E`: the
    /// BoW paper's and OTTER's, spec `bow-and-otter.md` §5.8, §7 A9; CUSA's with `min_lr =
    /// 1e-6`, `cusa-and-pcmepp.md` §2.6), `step` (`lr` times
    /// `step_factor` for each of `step_epochs` reached: PCME++'s ×0.1 from epoch 15, spec
    /// `cusa-and-pcmepp.md` §3.10) or `constant`.
    #[serde(default = "default_schedule")]
    pub schedule: Schedule,
    /// The learning rate at the end of the cosine decay.
    #[serde(default)]
    pub min_lr: f64,
    /// PCME++'s start (spec `cusa-and-pcmepp.md` §3.10 \[ref\]): the image tower (not its
    /// projection or heads) gets no update in epochs `0..F`, and in epoch `F`, the first after
    /// unfreezing, the loss is scaled by `(step_in_epoch + 1) / steps_per_epoch` (its reference's
    /// warm-up). 0 (the default): off; the reference: 2.
    #[serde(default)]
    pub freeze_image_epochs: u64,
    /// PCME++'s SWA (spec `cusa-and-pcmepp.md` §3.10): the weights (encoders and the loss's
    /// parameters) averaged over the ends of the complete epochs `swa_start_epoch..` (0-based; the reference:
    /// 16 of 25, its epochs 17 to 25), written as `model_swa.bpk` beside `model.bpk` and scored
    /// with `curate eval RUN_DIR --swa`. Absent: off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub swa_start_epoch: Option<u64>,
    /// `step`: the epochs (0-based) from which the rate is multiplied by `step_factor` again.
    #[serde(default = "default_step_epochs")]
    pub step_epochs: Vec<u64>,
    /// `step`: the factor per epoch of `step_epochs` reached.
    #[serde(default = "default_step_factor")]
    pub step_factor: f64,
}

fn default_adamp_delta() -> f64 {
    0.1
}
fn default_adamp_wd_ratio() -> f64 {
    0.1
}
fn default_clip_scope() -> ClipScope {
    ClipScope::Global
}
fn one() -> f64 {
    1.0
}

fn default_step_epochs() -> Vec<u64> {
    vec![15]
}
fn default_step_factor() -> f64 {
    0.1
}

impl Default for OptimConfig {
    fn default() -> Self {
        OptimConfig {
            optimizer: default_optimizer(),
            lr: default_lr(),
            momentum: default_momentum(),
            betas: default_betas(),
            adamp_delta: default_adamp_delta(),
            adamp_wd_ratio: default_adamp_wd_ratio(),
            weight_decay: 0.0,
            no_weight_decay_1d: false,
            grad_clip_norm: None,
            grad_clip_scope: default_clip_scope(),
            layer_decay: 1.0,
            image_backbone_lr_scale: 1.0,
            text_backbone_lr_scale: 1.0,
            warmup_steps: 0,
            schedule: default_schedule(),
            min_lr: 0.0,
            freeze_image_epochs: 0,
            swa_start_epoch: None,
            step_epochs: default_step_epochs(),
            step_factor: default_step_factor(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    Sgd,
    Adamw,
    Adamp,
}

/// What `optim.grad_clip_norm` bounds: the norm of all the gradients together, or each one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClipScope {
    Global,
    Tensor,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Schedule {
    Cosine,
    CosinePerEpoch,
    Step,
    Constant,
}

fn default_optimizer() -> OptimizerKind {
    OptimizerKind::Sgd
}
fn default_lr() -> f64 {
    3e-3
}
fn default_momentum() -> f64 {
    0.9
}
fn default_betas() -> [f64; 2] {
    [0.9, 0.999]
}
fn default_schedule() -> Schedule {
    Schedule::Cosine
}

/// The `[eval]` table: zero-shot classification during training (spec `bow-and-otter.md`
/// §6.1–6.2: `images` and `classes`) and, in `[eval.retrieval]`, the retrieval set of `curate
/// eval RUN_DIR` and of `select_best`. Either may be left out, not both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ZeroShotConfig {
    /// Parquet with an image path column and a label column (with `classes`: zero-shot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<PathPatterns>,
    /// Class names, one class per line; synonyms of one class separated by `|` are joined into
    /// one prompt with `,or ` (OTTER's reference).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub classes: Option<PathBuf>,
    #[serde(default = "default_path")]
    pub image_column: String,
    /// The true class name(s) of an image; several (multi-label, flat hit@k) separated by `|`.
    #[serde(default = "default_label")]
    pub label_column: String,
    #[serde(default)]
    pub image_root: Option<PathBuf>,
    /// Prompt templates; `{}` is replaced by the class name. Several are averaged (CLIP's
    /// ensemble); default one, the BoW paper's: `a photo of a {}` (spec §6.1, A10; OTTER's is
    /// `a photo of {}.`, §6.2).
    #[serde(default = "default_templates")]
    pub templates: Vec<String>,
    /// PCME++'s prompt filtering (`cusa-and-pcmepp.md` §3.12, Table 5 "same top-K for all
    /// classes"): per class, only the `keep_prompts` templates whose prompts have the lowest text
    /// uncertainty `‖σ²‖₁` are averaged. A PCME++ run only (it needs the text log-variance head).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_prompts: Option<usize>,
    /// Evaluate every this many steps (and always at step 0 and at the end).
    #[serde(default = "default_eval_every")]
    pub every_steps: u64,
    /// Evaluate at the end of every this many epochs instead of every `every_steps` steps (the
    /// papers select their model per epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every_epochs: Option<u64>,
    /// The image-text retrieval set `curate eval RUN_DIR` embeds with the trained model when no
    /// `--images`/`--captions` are given (spec `cusa-and-pcmepp.md` §4), and, with
    /// `select_best`, the validation set of the training. Absent: `curate eval RUN_DIR` needs
    /// the flags. Left out of `config.json` when absent, so runs trained before it existed
    /// resume unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrieval: Option<RetrievalConfig>,
    /// Model selection as PCME++ and CUSA do it (spec §2.6, §3.10): at each evaluation the
    /// model's RSUM (R@1 + R@5 + R@10, both directions, over the whole `[eval.retrieval]` set,
    /// by the run's own similarity) is logged, and the best so far kept as `model_best.bpk`
    /// (`best.json` says its step). PCME++ picks on COCO dev, CUSA's reference on its test
    /// split; this picks on the set given here, which should be a validation split.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub select_best: bool,
}

/// A retrieval gallery in the COCO layout (`[eval.retrieval]`): the COCO 5K test split for the
/// papers' evaluation (a dev split for `select_best`), `data/train_sample/retrieval_*.parquet`
/// for the bundled sample. Row order matters:
/// the image rows in five consecutive fifths are the COCO 1K folds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RetrievalConfig {
    /// Parquet with `coco_image_id` (int64) and `path` (an image file).
    pub images: PathBuf,
    /// Parquet with `coco_caption_id`, `coco_image_id` (int64) and `caption`.
    pub captions: PathBuf,
    /// Image paths are relative to this folder (default: as stored, i.e. the working directory).
    #[serde(default)]
    pub image_root: Option<PathBuf>,
}

impl ZeroShotConfig {
    /// Whether step `step` (completed steps) is an evaluation point, with `per_epoch` steps an
    /// epoch (the end of training always is, step 0 too: the trainer sees to those).
    pub fn due(&self, step: u64, per_epoch: u64) -> bool {
        match self.every_epochs {
            Some(n) => step.is_multiple_of(per_epoch.max(1).saturating_mul(n)),
            None => step.is_multiple_of(self.every_steps),
        }
    }
}

fn default_label() -> String {
    "label".into()
}
fn default_templates() -> Vec<String> {
    vec!["a photo of a {}".into()]
}
fn default_eval_every() -> u64 {
    500
}

impl TrainConfig {
    /// Reads `path`, applies `overrides`, and checks everything that can be checked without
    /// reading data; every problem is reported at once ([`Error::Config`]).
    pub fn load(path: &Path, overrides: &[String]) -> Result<TrainConfig> {
        let doc = ConfigDoc::load(path, overrides).map_err(|mut diags| {
            // Syntax errors: the rest of the file is checked too, as far as it stands alone.
            if let Some((doc, lines)) = ConfigDoc::load_recovered(path, overrides) {
                if let Err(Error::Config(more)) = Self::check_doc(path, doc) {
                    diags.extend(more.into_iter().filter(|d| crate::pipeline::config::survives_recovery(d, &lines)));
                }
            }
            Error::Config(diags)
        })?;
        Self::check_doc(path, doc)
    }

    /// The checks of [`TrainConfig::load`] on a parsed document.
    fn check_doc(path: &Path, doc: ConfigDoc) -> Result<TrainConfig> {
        let mut diags = doc.override_errors.clone();
        // A pipeline file given to `train`: one error that says so, not one per key.
        if doc.root.contains_key("stage") && !doc.root.contains_key("model") {
            diags.push(
                Diagnostic::new(format!(
                    "`{}` is a pipeline file (it has `[[stage]]`), not a training file",
                    path.display()
                ))
                .at(doc.location(""))
                .hint(format!("run it with `curate run {}`", path.display())),
            );
            return Err(Error::Config(diags));
        }
        let root = Value::Table(doc.root.clone());
        // Keys of a wrong type or unknown are reported (an unknown one at the key, with its near
        // miss) and dropped; the rest is still checked, so one `validate` reports a quoted
        // number and a negative `lr` together. Problems of a dropped key (at its default now)
        // are left out.
        let (parsed, dropped) = doc.extract_recovering::<TrainConfig>("", &root, &mut diags);
        if let Some(c) = &parsed {
            let related = |a: &str, b: &str| a == b || [".", "["].iter().any(|s| a.starts_with(&format!("{b}{s}")));
            let skip = |path: &str| dropped.iter().any(|d| related(path, d) || related(d, path));
            c.check(&doc, &mut diags, &skip);
        }
        match parsed {
            Some(c) if diags.is_empty() && dropped.is_empty() => Ok(c.resolved()),
            _ => Err(Error::Config(diags)),
        }
    }

    /// The columns each table of `key` must have (`data.tables`: its image reference is checked
    /// beside these).
    fn columns_needed(&self, key: &str) -> Vec<String> {
        match key {
            "data.tables" => vec!["sample_id".into(), self.data.caption_column.clone()],
            "data.teacher_image" | "data.teacher_text" => vec!["sample_id".into(), "embedding".into()],
            "eval.images" => match &self.eval {
                Some(e) => vec![e.image_column.clone(), e.label_column.clone()],
                None => Vec::new(),
            },
            _ => Vec::new(),
        }
    }

    /// The defaults that depend on other keys, filled in, so that the run's `config.json` says
    /// what ran: the crop ranges of `random_resized_crop` and every transform's `flip`.
    pub(crate) fn resolved(mut self) -> TrainConfig {
        let d = &mut self.data;
        if d.image_transform == ImageTransformKind::RandomResizedCrop {
            d.crop_scale.get_or_insert(DEFAULT_CROP_SCALE);
            d.crop_ratio.get_or_insert(DEFAULT_CROP_RATIO);
        }
        d.flip.get_or_insert(d.image_transform.flips_by_default());
        if let Some(c) = &mut self.model.clip {
            if c.max_tokens.is_none() {
                c.max_tokens = c.open_clip().ok().map(|o| o.text.context_length);
            }
        }
        // The text tower's dropout as its folder says (one rate for both places, as the key
        // holds): config.json records what trained, and a resumed run keeps it.
        if let Some(t) = &mut self.model.text {
            if t.dropout.is_none() {
                let folder = crate::models::bert::BertConfig::from_file(&t.dir.join("config.json")).ok();
                t.dropout = folder
                    .filter(|b| b.hidden_dropout_prob == b.attention_probs_dropout_prob)
                    .map(|b| b.hidden_dropout_prob);
            }
        }
        self
    }

    /// Checks values and files; a problem at a path `skip` names is left out.
    fn check(&self, doc: &ConfigDoc, diags: &mut Vec<Diagnostic>, skip: &dyn Fn(&str) -> bool) {
        let mut bad = |path: &str, message: String, hint: &str| {
            if !skip(path) {
                diags.push(Diagnostic::new(format!("`{path}`: {message}")).at(doc.location(path)).hint(hint));
            }
        };
        if self.output_dir.as_os_str().is_empty() {
            bad("output_dir", "is empty".into(), "name the run's folder, e.g. `output_dir = \"out/train\"`");
        }
        match (self.steps, self.epochs) {
            (Some(_), Some(_)) => bad("steps", "both `steps` and `epochs` are set".into(), "keep one of them"),
            // (One of them given with a wrong type is reported already.)
            (None, None) if !skip("epochs") && !skip("steps") => {
                bad("steps", "neither `steps` nor `epochs` is set".into(), "add `steps = 1000`")
            }
            (Some(0), _) => bad("steps", "must be at least 1".into(), "train for at least one step"),
            (_, Some(0)) => bad("epochs", "must be at least 1".into(), "train for at least one epoch"),
            _ => {}
        }
        if self.batch_size < 2 {
            bad("batch_size", format!("{} is too small", self.batch_size), "contrastive losses need at least 2 pairs");
        }
        if self.log_every == 0 {
            bad("log_every", "must be at least 1".into(), "log every step with `log_every = 1`");
        }
        let mut tables = vec![("data.tables", Some(&self.data.tables))];
        tables.push(("data.teacher_image", self.data.teacher_image.as_ref()));
        tables.push(("data.teacher_text", self.data.teacher_text.as_ref()));
        tables.push(("eval.images", self.eval.as_ref().and_then(|e| e.images.as_ref())));
        for (key, patterns) in tables {
            let Some(files) = patterns.map(PathPatterns::expand) else { continue };
            let files = match files {
                Ok(files) => files,
                Err(e) => {
                    bad(key, e, "list Parquet files or globs (e.g. the `data/*.parquet` of a `curate run` output)");
                    continue;
                }
            };
            if key == "data.tables" {
                if let Some(twice) = super::data::listed_twice(&files) {
                    bad(
                        key,
                        format!("`{}` is listed twice (two patterns name it)", twice.display()),
                        "list each table once: its rows would be trained on twice as often",
                    );
                }
            }
            // Their columns, from the footers (no data read): every table's problem at once.
            for file in files {
                let needed = self.columns_needed(key);
                let schema = match crate::io::parquet::read_schema(&file) {
                    Ok(schema) => schema,
                    Err(e) => {
                        bad(key, format!("`{}` cannot be read as Parquet: {e}", file.display()), "a Parquet table");
                        continue;
                    }
                };
                let has = |c: &str| schema.field_with_name(c).is_ok();
                let mut missing: Vec<String> = needed.iter().filter(|c| !has(c)).map(|c| format!("`{c}`")).collect();
                // A row names its image by path, or by tar shard and key with `data.shards_dir`.
                if key == "data.tables"
                    && !has(&self.data.image_column)
                    && !(self.data.shards_dir.is_some() && has("shard") && has("key"))
                {
                    missing.push(format!("`{}`", self.data.image_column));
                }
                if !missing.is_empty() {
                    let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
                    bad(
                        key,
                        format!("`{}` has no column {}", file.display(), missing.join(", ")),
                        &format!("its columns: {}", names.join(", ")),
                    );
                }
            }
        }
        if let Some([lo, hi]) = self.data.crop_scale {
            if !(0.0 < lo && lo <= hi && hi <= 1.0) {
                bad("data.crop_scale", format!("[{lo}, {hi}] is not within (0, 1]"), "e.g. `crop_scale = [0.08, 1.0]`");
            }
        }
        let transform = self.data.image_transform;
        if transform != ImageTransformKind::RandomResizedCrop {
            let name = transform.name();
            for (key, set) in [
                ("data.crop_scale", self.data.crop_scale.is_some()),
                ("data.crop_ratio", self.data.crop_ratio.is_some()),
                ("data.antialias", self.data.antialias),
            ] {
                if set {
                    bad(
                        key,
                        format!("is RandomResizedCrop's, and `image_transform = \"{name}\"` draws its own crops"),
                        "remove it, or set `image_transform = \"random_resized_crop\"`",
                    );
                }
            }
        }
        // Each at its own key: a wrong value elsewhere in `[model]` does not hide them.
        if self.model.embed_dim == 0 {
            bad("model.embed_dim", "must be positive".into(), "the paper's is 768");
        }
        if self.model.image_size_px < 8 {
            let size = self.model.image_size_px;
            bad("model.image_size_px", format!("{size} is below 8"), "the papers' images are 224 px");
        }
        match (&self.model.text, &self.model.clip) {
            (None, None) => bad(
                "model",
                "has no text tower".into(),
                "add `[model.text]` with `dir = \"MODEL_FOLDER\"` (a BERT-family model) or `[model.clip]`",
            ),
            (Some(_), Some(_)) => bad(
                "model.clip",
                "brings its own text tower: `[model.text]` is set too".into(),
                "keep one of `[model.text]` and `[model.clip]`",
            ),
            _ => {}
        }
        if let Some(text) = &self.model.text {
            let text_dir = &text.dir;
            for file in ["config.json", "tokenizer.json"] {
                let there = if file == "tokenizer.json" {
                    crate::models::text_encoder::has_tokenizer(text_dir)
                } else {
                    text_dir.join(file).is_file()
                };
                if !there {
                    bad(
                        "model.text.dir",
                        format!("`{}` has no `{file}`", text_dir.display()),
                        "a Hugging Face model folder",
                    );
                }
            }
            if text.pretrained && !crate::models::weights::hf_weights_file(text_dir).is_file() {
                bad(
                    "model.text.pretrained",
                    format!("`{}` has no `model.safetensors` (nor `pytorch_model.bin`)", text_dir.display()),
                    "download the checkpoint, or set `pretrained = false` to train from scratch",
                );
            }
        }
        if let Some(clip) = &self.model.clip {
            self.check_clip(clip, &mut bad);
        }
        // The tokenizer is read here only for this key: `validate` then says what `train` would.
        let tokenizer_dir = self.model.tokenizer_dir();
        if self.data.caption_augment && crate::models::text_encoder::has_tokenizer(tokenizer_dir) {
            let tokenizer = crate::models::text_encoder::load_tokenizer_file(tokenizer_dir);
            if tokenizer.is_ok_and(|(t, _)| super::data::augment_vocabulary(&t).is_none()) {
                bad("data.caption_augment", super::data::no_mask_token(tokenizer_dir), super::data::NO_MASK_TOKEN_HINT);
            }
        }
        if self.model.log_variance_block {
            let pcmepp = matches!(self.loss, crate::losses::LossConfig::Pcmepp(_));
            if self.model.clip.is_none() || !self.model.gpo || !pcmepp {
                bad(
                    "model.log_variance_block",
                    "is PCME++'s branch on CLIP's towers: it needs `[model.clip]`, `model.gpo = true` and \
                     `loss.type = \"pcmepp\"`"
                        .into(),
                    "set those, or leave it out",
                );
            }
        }
        if let Some(ck) = &self.model.image.checkpoint {
            if !ck.is_file() {
                bad(
                    "model.image.checkpoint",
                    format!("`{}` {}", ck.display(), crate::io::not_a(ck, "file")),
                    "a checkpoint file (safetensors or a PyTorch `.pth`)",
                );
            }
        }
        self.check_ranges(&mut bad);
        if let crate::losses::LossConfig::MemoryBank(m) = &self.loss {
            // (A `batch_size` of 0 is reported already.)
            if m.size == 0 || (self.batch_size > 0 && m.size % self.batch_size != 0) {
                bad(
                    "loss.size",
                    format!("bank size {} is not a positive multiple of batch_size {}", m.size, self.batch_size),
                    "the FIFO bank needs K mod B = 0 (spec §4)",
                );
            } else if m.size > MAX_BANK_SIZE {
                let gib = 2.0 * m.size as f64 * self.model.embed_dim as f64 * 4.0 / (1u64 << 30) as f64;
                bad(
                    "loss.size",
                    format!("a bank of {} slots is more than {MAX_BANK_SIZE} ({gib:.0} GiB for its two banks)", m.size),
                    "the paper's K is 8192; MoCo's 65,536",
                );
            }
        }
        if matches!(self.loss, crate::losses::LossConfig::Cusa(_))
            && (self.data.teacher_image.is_none() || self.data.teacher_text.is_none())
        {
            bad(
                "loss.type",
                "`cusa` needs teacher features".into(),
                "set `data.teacher_image` and `data.teacher_text` (outputs of encode_image / encode_text)",
            );
        }
        if self.model.image_token_drop > 0.0 && !self.model.gpo {
            bad(
                "model.image_token_drop",
                "dropping image tokens needs GPO: it drops the grid cells GPO pools".into(),
                "set `model.gpo = true` (PCME++'s heads), or leave `image_token_drop` at 0",
            );
        }
        if self.data.msda.is_some() {
            if !matches!(self.loss, crate::losses::LossConfig::Pcmepp(_)) {
                bad("data.msda", "mixed images need soft labels".into(), "MSDA is PCME++'s (`loss.type = \"pcmepp\"`)");
            }
            if !self.batch_size.is_multiple_of(2) {
                bad("batch_size", "MSDA pairs element i with B−1−i".into(), "use an even batch size");
            }
        }
        if let Some(e) = &self.eval {
            match (&e.images, &e.classes) {
                (Some(_), None) | (None, Some(_)) => bad(
                    if e.images.is_some() { "eval.images" } else { "eval.classes" },
                    "zero-shot needs both `images` and `classes`".into(),
                    "give both, or neither (the retrieval set alone)",
                ),
                (None, None) if e.retrieval.is_none() => bad(
                    "eval",
                    "has neither a zero-shot set (`images`, `classes`) nor `[eval.retrieval]`".into(),
                    "give one of them, or leave out `[eval]`",
                ),
                _ => {}
            }
            if let Some(classes) = e.classes.as_ref().filter(|c| !c.is_file()) {
                bad(
                    "eval.classes",
                    format!("`{}` {}", classes.display(), crate::io::not_a(classes, "file")),
                    "one class name per line",
                );
            }
            if e.images.is_some() && e.templates.is_empty() {
                bad("eval.templates", "no template".into(), "e.g. `templates = [\"a photo of a {}.\"]`");
            }
            if e.images.is_some() && e.templates.iter().any(|t| !t.contains("{}")) {
                bad("eval.templates", "a template has no `{}`".into(), "e.g. `a photo of a {}.`");
            }
            if let Some(k) = e.keep_prompts {
                if !matches!(self.loss, crate::losses::LossConfig::Pcmepp(_)) {
                    bad(
                        "eval.keep_prompts",
                        "ranks prompts by PCME++'s text uncertainty, and this run does not train `pcmepp`".into(),
                        "leave it out, or train with `loss.type = \"pcmepp\"`",
                    );
                } else if k == 0 || k > e.templates.len() {
                    bad(
                        "eval.keep_prompts",
                        format!("must be from 1 to the number of templates ({})", e.templates.len()),
                        "e.g. `keep_prompts = 10` of CLIP's 80 templates",
                    );
                }
            }
            if e.every_steps == 0 {
                bad("eval.every_steps", "must be at least 1".into(), "e.g. `every_steps = 100`");
            }
            if e.every_epochs == Some(0) {
                bad("eval.every_epochs", "must be at least 1".into(), "e.g. `every_epochs = 1`");
            }
            if e.select_best && e.retrieval.is_none() {
                bad(
                    "eval.select_best",
                    "selects on the retrieval set, and `[eval.retrieval]` is not given".into(),
                    "add `[eval.retrieval]` with `images` and `captions` (a validation split, COCO's layout)",
                );
            }
            // Checked here although only `curate eval` reads them: a typo should not surface
            // after the training.
            if let Some(r) = &e.retrieval {
                for (key, file, columns) in [
                    ("eval.retrieval.images", &r.images, "`coco_image_id` and `path`"),
                    ("eval.retrieval.captions", &r.captions, "`coco_caption_id`, `coco_image_id` and `caption`"),
                ] {
                    if !file.is_file() {
                        bad(
                            key,
                            format!("`{}` {}", file.display(), crate::io::not_a(file, "file")),
                            &format!("a Parquet file with {columns}"),
                        );
                    }
                }
                if let Some(root) = r.image_root.as_ref().filter(|d| !d.is_dir()) {
                    bad(
                        "eval.retrieval.image_root",
                        format!("`{}` {}", root.display(), crate::io::not_a(root, "folder")),
                        "the folder the `path` column is relative to",
                    );
                }
            }
        }
    }

    /// Values outside what the losses, the optimiser and the models can take: each would
    /// otherwise surface later as a NaN loss, a diverging run or a crash.
    fn check_ranges(&self, bad: &mut impl FnMut(&str, String, &str)) {
        use crate::losses::LossConfig;
        let mut within = |key: &str, v: f64, ok: bool, range: &str| {
            if !ok || !v.is_finite() {
                bad(key, format!("{v} is not {range}"), "see the defaults in README's training section");
            }
        };
        let o = &self.optim;
        within("optim.lr", o.lr, o.lr > 0.0, "positive");
        // (Against a valid `lr` only: a wrong one is reported already.)
        within(
            "optim.min_lr",
            o.min_lr,
            o.min_lr >= 0.0 && (!(o.lr.is_finite() && o.lr > 0.0) || o.min_lr <= o.lr),
            "within [0, lr]",
        );
        within("optim.momentum", o.momentum, (0.0..1.0).contains(&o.momentum), "in [0, 1)");
        within("optim.step_factor", o.step_factor, o.step_factor > 0.0 && o.step_factor <= 1.0, "in (0, 1]");
        for (i, b) in o.betas.iter().enumerate() {
            within(&format!("optim.betas[{i}]"), *b, (0.0..1.0).contains(b), "in [0, 1)");
        }
        within("optim.weight_decay", o.weight_decay, o.weight_decay >= 0.0, "at least 0");
        // exp(v) is the initial variance (PCME++ only): ±20 gives 2e-9 to 5e8, a conservative
        // bound; NaN or 1e30 made the first loss NaN.
        let v = self.model.log_variance_bias;
        within("model.log_variance_bias", v, (-20.0..=20.0).contains(&v), "in [-20, 20]");
        let t = self.model.image_token_drop;
        within("model.image_token_drop", t, (0.0..1.0).contains(&t), "in [0, 1)");
        if let Some(c) = o.grad_clip_norm {
            within("optim.grad_clip_norm", c, c > 0.0, "positive");
        }
        within("optim.adamp_delta", o.adamp_delta, o.adamp_delta > 0.0, "positive");
        within("optim.adamp_wd_ratio", o.adamp_wd_ratio, (0.0..=1.0).contains(&o.adamp_wd_ratio), "in [0, 1]");
        within("optim.layer_decay", o.layer_decay, o.layer_decay > 0.0 && o.layer_decay <= 1.0, "in (0, 1]");
        for (key, v) in [
            ("optim.image_backbone_lr_scale", o.image_backbone_lr_scale),
            ("optim.text_backbone_lr_scale", o.text_backbone_lr_scale),
        ] {
            within(key, v, v > 0.0, "positive (to keep a tower still, see `optim.freeze_image_epochs`)");
        }
        if let Some([lo, hi]) = self.data.crop_ratio {
            within("data.crop_ratio", lo, 0.0 < lo && lo <= hi && hi.is_finite(), "a range of positive ratios");
        }
        if let (f, Some(e)) = (o.freeze_image_epochs, self.epochs) {
            let range = format!("below `epochs` ({e}): the image tower would never train");
            within("optim.freeze_image_epochs", f as f64, f < e, &range);
        }
        if let (Some(s), Some(e)) = (o.swa_start_epoch, self.epochs) {
            let range = format!("an epoch of the {e} (0-based), so nothing would be averaged");
            within("optim.swa_start_epoch", s as f64, s < e, &range);
        }
        let r = self.data.noise_ratio;
        within("data.noise_ratio", r, (0.0..=1.0).contains(&r), "in [0, 1]");
        if let Some(m) = &self.data.msda {
            within("data.msda.mix_ratio", m.mix_ratio, (0.0..=1.0).contains(&m.mix_ratio), "in [0, 1]");
            within("data.msda.cutmix_prob", m.cutmix_prob, (0.0..=1.0).contains(&m.cutmix_prob), "in [0, 1]");
            // λ ~ Beta(beta, beta) is drawn as x / (x + y) of two Gamma(beta) draws: 0 / 0 at 0.
            within("data.msda.beta", m.beta, m.beta > 0.0, "positive");
        }
        let positive = |t: f64| t > 0.0;
        // A logit scale multiplies cosine similarities: a negative one ranks the worst pair
        // first, and a clamp whose low end is above its high end is no range at all.
        let mut scale_range = |lo: f64, hi: f64| {
            within("loss.min_logit_scale", lo, positive(lo), "positive");
            within("loss.max_logit_scale", hi, lo <= hi || !positive(lo), "at least `loss.min_logit_scale`");
        };
        match &self.loss {
            LossConfig::Infonce(c) => scale_range(c.min_logit_scale, c.max_logit_scale),
            LossConfig::LabelSmoothing(c) => scale_range(c.min_logit_scale, c.max_logit_scale),
            LossConfig::Kd(c) => scale_range(c.min_logit_scale, c.max_logit_scale),
            LossConfig::Otter(c) => scale_range(c.min_logit_scale, c.max_logit_scale),
            _ => {}
        }
        match &self.loss {
            LossConfig::Infonce(c) => within("loss.temperature", c.temperature, positive(c.temperature), "positive"),
            LossConfig::MemoryBank(c) => {
                within("loss.temperature", c.temperature, positive(c.temperature), "positive");
                within("loss.momentum", c.momentum, (0.0..=1.0).contains(&c.momentum), "in [0, 1]");
            }
            LossConfig::LabelSmoothing(c) => within("loss.alpha", c.alpha, (0.0..1.0).contains(&c.alpha), "in [0, 1)"),
            LossConfig::Kd(c) => {
                within("loss.alpha", c.alpha, (0.0..=1.0).contains(&c.alpha), "in [0, 1]");
                let t = c.teacher_temperature;
                within("loss.teacher_temperature", t, positive(t), "positive");
            }
            LossConfig::Otter(c) => {
                within("loss.alpha", c.alpha, (0.0..=1.0).contains(&c.alpha), "in [0, 1]");
                // Sinkhorn divides the similarities by λ (spec `bow-and-otter.md` §4).
                within("loss.sinkhorn_lambda", c.sinkhorn_lambda, positive(c.sinkhorn_lambda), "positive");
                // Each iteration is kept for the backward pass (the paper runs 5).
                let n = c.sinkhorn_iterations;
                within("loss.sinkhorn_iterations", n as f64, n <= MAX_SINKHORN_ITERATIONS, "at most 1000");
                within("loss.init_log_scale", c.init_log_scale, true, "finite");
                // The EMA teacher: `m·θ_teacher + (1 − m)·θ`, a convex mix only for m in [0, 1].
                within(
                    "loss.teacher_momentum",
                    c.teacher_momentum,
                    (0.0..=1.0).contains(&c.teacher_momentum),
                    "in [0, 1]",
                );
                // The teacher's similarities are added to the identity with these weights: a
                // negative one makes a pair's own image or caption count against it.
                within("loss.gamma_v", c.gamma_v, c.gamma_v >= 0.0, "at least 0");
                within("loss.gamma_t", c.gamma_t, c.gamma_t >= 0.0, "at least 0");
            }
            LossConfig::Cusa(c) => {
                let t = c.teacher_temperature;
                within("loss.teacher_temperature", t, positive(t), "positive");
                for (key, [init, lo, hi]) in [
                    ("loss.itc_temperature", c.itc_temperature),
                    ("loss.csa_temperature", c.csa_temperature),
                    ("loss.usa_temperature", c.usa_temperature),
                ] {
                    within(
                        key,
                        init,
                        0.0 < lo && lo <= init && init <= hi,
                        "[initial, low, high] with 0 < low <= initial <= high",
                    );
                }
            }
            LossConfig::Pcmepp(c) => {
                // BCE targets are `1 − e` and `e`: past 1 they leave [0, 1], at 1 they swap.
                let e = c.label_smoothing;
                within("loss.label_smoothing", e, (0.0..1.0).contains(&e), "in [0, 1)");
                // Negative weights would maximise their terms.
                for (key, w) in [
                    ("loss.match_weight", c.match_weight),
                    ("loss.pseudo_positive_weight", c.pseudo_positive_weight),
                    ("loss.vib_weight", c.vib_weight),
                ] {
                    within(key, w, w >= 0.0, "at least 0");
                }
                within("loss.vib_guard", c.vib_guard, positive(c.vib_guard), "positive");
                // `a` scales the distance in `−a·d + b`: at 0 or below, farther pairs match more.
                within("loss.init_a", c.init_a, positive(c.init_a), "positive");
                within("loss.init_b", c.init_b, true, "finite");
            }
        }
        let m = &self.model;
        if m.embed_dim > 1 << 16 || m.image_size_px > 4096 {
            bad(
                "model",
                format!("embed_dim {} or image_size_px {} is past what fits in memory", m.embed_dim, m.image_size_px),
                "embed_dim up to 65536, image_size_px up to 4096",
            );
        }
        if m.image.width == Some(0) || m.image.layers.is_some_and(|l| l.contains(&0)) {
            bad("model.image", "a ResNet needs a width and blocks in every stage".into(), "all at least 1");
        }
        // Far past any published ResNet (ResNet-152: [3, 8, 36, 3], stem 64; wide ResNets double
        // the inner width, not the stem), and short of sizes whose weights cannot be allocated.
        if let Some(w) = m.image.width.filter(|&w| w > 256) {
            bad("model.image.width", format!("{w} is past what fits in memory"), "up to 256 (ResNet-50: 64)");
        }
        if let Some(l) = m.image.layers.filter(|l| l.iter().any(|&n| n > 64)) {
            bad(
                "model.image.layers",
                format!("{l:?} is past what fits in memory"),
                "up to 64 blocks per stage (ResNet-152: [3, 8, 36, 3])",
            );
        }
        // (With `[model.clip]` the image tower is CLIP's, and `[model.image]` is refused as such.)
        if let Some(fbnet) = m.image.preset.fbnet().filter(|_| m.clip.is_none()) {
            for (key, set) in
                [("model.image.width", m.image.width.is_some()), ("model.image.layers", m.image.layers.is_some())]
            {
                if set {
                    bad(
                        key,
                        "sizes a ResNet; an FBNetV3 preset is one fixed architecture".into(),
                        "remove it, or use a ResNet preset",
                    );
                }
            }
            if m.gpo {
                bad(
                    "model.gpo",
                    "GPO pools a grid of features, and FBNetV3 pools inside its head (its 1984-d features \
                     have no grid)"
                        .into(),
                    "use a ResNet preset with `gpo`, or set `model.gpo = false`",
                );
            }
            let min = fbnet.min_side();
            if m.image_size_px < min {
                bad(
                    "model.image_size_px",
                    format!(
                        "{} pixels are too few for FBNetV3: its strided convolutions need at least {min}",
                        m.image_size_px
                    ),
                    &format!("`image_size_px = {min}` or more (OTTER trains at 224)"),
                );
            }
        }
        let Some(text) = &m.text else { return };
        // Longer token sequences than the text model has positions for cannot be embedded.
        let positions = crate::models::bert::BertConfig::from_file(&text.dir.join("config.json"))
            .ok()
            .map(|c| c.max_tokens() as u64);
        // The start and end tokens take 2: at 2, every caption would be `[CLS] [SEP]`.
        if let Some(p) = text.dropout.filter(|p| !(0.0..1.0).contains(p)) {
            bad("model.text.dropout", format!("{p} is not a dropout rate"), "a rate in [0, 1), e.g. 0.1; 0 for none");
        }
        if text.max_tokens < 3 || positions.is_some_and(|p| text.max_tokens as u64 > p) {
            bad(
                "model.text.max_tokens",
                format!("{} tokens do not fit the text model", text.max_tokens),
                &format!(
                    "at least 3 (the start and end tokens, and one of text){}",
                    positions.map(|p| format!(", at most its {p} positions")).unwrap_or_default()
                ),
            );
        }
    }

    /// `[model.clip]`: the folder's files and sizes, and the keys that do not go with it.
    fn check_clip(&self, clip: &ClipModelConfig, bad: &mut impl FnMut(&str, String, &str)) {
        use crate::models::clip_text::OpenClipConfig;
        let dir = &clip.dir;
        let hint = "an open_clip model folder: open_clip_config.json, tokenizer.json, open_clip_model.safetensors (or \
                    open_clip_pytorch_model.bin)";
        for file in [OpenClipConfig::FILE, "tokenizer.json"] {
            if !dir.join(file).is_file() {
                bad("model.clip.dir", format!("`{}` has no `{file}`", dir.display()), hint);
            }
        }
        if clip.pretrained && !crate::models::weights::open_clip_weights_file(dir).is_file() {
            bad(
                "model.clip.pretrained",
                format!("`{}` has no `open_clip_model.safetensors` (nor `open_clip_pytorch_model.bin`)", dir.display()),
                "download the checkpoint into the folder, or set `pretrained = false` to train from scratch",
            );
        }
        if self.model.image != ImageModelConfig::default() {
            bad(
                "model.image",
                "sets a ResNet or FBNet image tower, and `[model.clip]` brings CLIP's ViT".into(),
                "remove `[model.image]`",
            );
        }
        let Ok(oc) = clip.open_clip() else {
            if dir.join(OpenClipConfig::FILE).is_file() {
                let e = clip.open_clip().err().map(|e| e.to_string()).unwrap_or_default();
                bad("model.clip.dir", e, "an open_clip model config (`model_cfg` with `vision_cfg` and `text_cfg`)");
            }
            return;
        };
        let size = oc.vision.image_size;
        if self.model.image_size_px != size {
            bad(
                "model.image_size_px",
                format!("is {}, and the CLIP ViT's positions are for {size} px", self.model.image_size_px),
                &format!("set `image_size_px = {size}`"),
            );
        }
        let context = oc.text.context_length;
        if let Some(n) = clip.max_tokens.filter(|&n| n < 3 || n > context) {
            bad(
                "model.clip.max_tokens",
                format!("{n} tokens do not fit the text tower"),
                &format!("at least 3 (start and end of text, and one of text), at most its {context} positions"),
            );
        }
    }

    /// Total optimiser steps for a training set of `rows` pairs (an error where `epochs` of them
    /// are more steps than a `u64` counts).
    pub fn total_steps(&self, rows: usize) -> Result<u64> {
        match (self.steps, self.epochs) {
            (Some(s), _) => Ok(s),
            (None, Some(e)) => e.checked_mul((rows / self.batch_size) as u64).ok_or_else(|| Error::Data {
                message: format!(
                    "{e} epochs of {rows} pairs in batches of {} are too many steps to count",
                    self.batch_size
                ),
                hint: Some("lower `epochs`, or set `steps`".into()),
            }),
            (None, None) => Ok(0),
        }
    }
}
