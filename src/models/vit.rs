//! Vision Transformer (ViT-B/32 and tiny test sizes) in two published checkpoint layouts, one
//! module: patch embedding → (+ class token) + learned positions → pre-LayerNorm blocks
//! [x + attn(LN(x)); x + MLP(LN(x))] → a head that differs per layout.
//!
//! - [`VitLayout::Clip`], OpenAI CLIP's image tower (the CLIP ViT-B/32 student of CUSA and
//!   PCME++, spec `cusa-and-pcmepp.md` §2.6, §3.10): `conv1` (no bias), `class_embedding`,
//!   `positional_embedding`, `ln_pre`, `transformer.resblocks.N.{ln_1, attn.in_proj_*,
//!   attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}` with QuickGELU, then the class token →
//!   `ln_post` → `@ proj`. A whole CLIP state dict is accepted: the image tower under `visual.`,
//!   the text tower's tensors ignored.
//! - [`VitLayout::Unicom`], deepglint/unicom's ViT, CUSA's image teacher (spec §1.1):
//!   `patch_embed.proj` (with bias), `pos_embed`, `blocks.N.{norm1, attn.qkv (no bias),
//!   attn.proj, norm2, mlp.fc1, mlp.fc2}` with ReLU6, no class token; the final `norm`ed token
//!   grid is flattened and mapped by `feature` = Linear(no bias) → BatchNorm1d(eps 2e-5) →
//!   Linear(no bias) → BatchNorm1d(eps 2e-5), from running statistics. Unicom releases `.pt`
//!   files (state dicts), which load as they are (`super::torch_checkpoint`).
//!
//! Output: one `[D]` vector per image, not normalised. Image pre-processing is in
//! [`super::preprocess`].

use std::path::Path;

use burn::module::{Module, Param};
use burn::nn::conv::Conv2d;
use burn::nn::{BatchNorm, LayerNorm, Linear};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::bert;
use super::host_attention;
use super::host_linear::apply;
use super::weights::{ConvSpec, Weights};
use crate::error::Result;

/// Which published checkpoint family the tensor names and head follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VitLayout {
    /// OpenAI CLIP / open_clip image tower.
    Clip,
    /// deepglint/unicom.
    Unicom,
}

/// The MLP's activation in a transformer block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MlpActivation {
    /// `x·σ(1.702x)`: OpenAI's CLIP (open_clip's `quick_gelu = true`).
    QuickGelu,
    /// Exact (erf) GELU: open_clip's own models (`quick_gelu = false`).
    Gelu,
    /// `min(max(x, 0), 6)`: Unicom.
    Relu6,
}

impl MlpActivation {
    pub(crate) fn apply<const D: usize>(self, h: Tensor<D>) -> Tensor<D> {
        match self {
            MlpActivation::QuickGelu => super::activation::quick_gelu(h),
            MlpActivation::Gelu => super::activation::gelu(h),
            MlpActivation::Relu6 => super::activation::relu6(h),
        }
    }
}

/// Sizes of a ViT; `image_size` is fixed by the learned position table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VitConfig {
    pub layout: VitLayout,
    /// QuickGELU for OpenAI's CLIP, ReLU6 for Unicom ([`VitConfig::vit_b32_clip`] and the
    /// other constructors set it); exact GELU for open_clip's non-OpenAI models.
    pub activation: MlpActivation,
    pub image_size: usize,
    pub patch_size: usize,
    pub width: usize,
    pub layers: usize,
    pub heads: usize,
    pub mlp_dim: usize,
    pub output_dim: usize,
}

/// LayerNorm epsilon of both layouts (PyTorch's default).
const LN_EPS: f64 = 1e-5;
/// BatchNorm1d epsilon of Unicom's `feature` head.
const BN_EPS: f64 = 2e-5;

impl VitConfig {
    /// OpenAI CLIP ViT-B/32's image tower: 224 px, 32 px patches, width 768, 12 layers of 12
    /// heads, 512-d output.
    pub fn vit_b32_clip() -> Self {
        Self::b32(VitLayout::Clip)
    }

    /// Unicom ViT-B/32 (`FP16-ViT-B-32.pt`): the same trunk, 512-d output.
    pub fn vit_b32_unicom() -> Self {
        Self::b32(VitLayout::Unicom)
    }

    fn b32(layout: VitLayout) -> Self {
        VitConfig {
            layout,
            activation: Self::activation_of(layout),
            image_size: 224,
            patch_size: 32,
            width: 768,
            layers: 12,
            heads: 12,
            mlp_dim: 3072,
            output_dim: 512,
        }
    }

    /// A tiny CLIP-layout ViT for tests: 32 px, 8 px patches, width 16, 2 layers of 4 heads.
    pub fn tiny_clip() -> Self {
        Self::tiny(VitLayout::Clip)
    }

    /// The tiny ViT in Unicom's layout.
    pub fn tiny_unicom() -> Self {
        Self::tiny(VitLayout::Unicom)
    }

    fn tiny(layout: VitLayout) -> Self {
        VitConfig {
            layout,
            activation: Self::activation_of(layout),
            image_size: 32,
            patch_size: 8,
            width: 16,
            layers: 2,
            heads: 4,
            mlp_dim: 64,
            output_dim: 8,
        }
    }

    fn activation_of(layout: VitLayout) -> MlpActivation {
        match layout {
            VitLayout::Clip => MlpActivation::QuickGelu,
            VitLayout::Unicom => MlpActivation::Relu6,
        }
    }

    /// Patch tokens per image (49 for ViT-B/32 at 224 px).
    pub fn patches(&self) -> usize {
        (self.image_size / self.patch_size).pow(2)
    }
}

/// A pre-LayerNorm transformer block: `x + attn(LN(x))`, then `x + MLP(LN(x))` (CLIP's
/// `ResidualAttentionBlock`, also its text tower's).
#[derive(Module, Debug)]
pub struct VitBlock {
    norm1: LayerNorm,
    /// Query, key and value stacked along the output (PyTorch's `[3·width, width]`).
    qkv: Linear,
    out: Linear,
    norm2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
}

/// How [`VitBlock::fresh`] draws a new block (PCME++'s log-variance branch, spec
/// `cusa-and-pcmepp.md` §3.1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FreshInit {
    /// PyTorch's defaults for a `ResidualAttentionBlock`: `in_proj` Xavier-uniform with bias 0,
    /// `out_proj` its Linear default with bias 0, the MLP's Linears their defaults (the image
    /// branch).
    PyTorch,
    /// CLIP's text-transformer init for a tower of `layers` blocks: `in_proj` N(0, w^−½),
    /// `out_proj` and `c_proj` N(0, w^−½ (2·layers)^−½), `c_fc` N(0, (2w)^−½); attention biases
    /// 0, the MLP's PyTorch's (the text branch).
    ClipText { layers: usize },
}

impl VitBlock {
    /// A new block of width `d` drawn from `w` (a [`Weights::random`]) under `prefix`.
    pub(crate) fn fresh(
        w: &Weights,
        prefix: &str,
        d: usize,
        mlp_dim: usize,
        init: FreshInit,
        device: &Device,
    ) -> VitBlock {
        use super::weights::LinearInit;
        let t = |part: &str| format!("{prefix}{part}");
        let zero_bias = |mut l: Linear, n: usize| {
            l.bias = Some(Param::from_tensor(Tensor::zeros([n], device)));
            l
        };
        let (qkv, out, fc1, fc2) = match init {
            FreshInit::PyTorch => (
                w.linear_init(&t("attn.in_proj"), d, 3 * d, LinearInit::XavierUniform, device),
                zero_bias(w.linear_init(&t("attn.out_proj"), d, d, LinearInit::PyTorch, device), d),
                w.linear_init(&t("mlp.c_fc"), d, mlp_dim, LinearInit::PyTorch, device),
                w.linear_init(&t("mlp.c_proj"), mlp_dim, d, LinearInit::PyTorch, device),
            ),
            FreshInit::ClipText { layers } => {
                let width = d as f64;
                let attn = width.powf(-0.5);
                let proj = attn * (2.0 * layers.max(1) as f64).powf(-0.5);
                let fc = (2.0 * width).powf(-0.5);
                (
                    zero_bias(w.linear_init(&t("attn.in_proj"), d, 3 * d, LinearInit::Normal(attn), device), 3 * d),
                    zero_bias(w.linear_init(&t("attn.out_proj"), d, d, LinearInit::Normal(proj), device), d),
                    w.linear_init(&t("mlp.c_fc"), d, mlp_dim, LinearInit::Normal(fc), device),
                    w.linear_init(&t("mlp.c_proj"), mlp_dim, d, LinearInit::Normal(proj), device),
                )
            }
        };
        VitBlock {
            norm1: w.layer_norm(&t("ln_1"), d, LN_EPS, device),
            qkv,
            out,
            norm2: w.layer_norm(&t("ln_2"), d, LN_EPS, device),
            fc1,
            fc2,
        }
    }

    /// CLIP's block `{prefix}{ln_1, attn.in_proj_*, attn.out_proj, ln_2, mlp.c_fc, mlp.c_proj}`.
    pub(crate) fn clip(w: &Weights, prefix: &str, d: usize, mlp_dim: usize, device: &Device) -> VitBlock {
        let t = |part: &str| format!("{prefix}{part}");
        VitBlock {
            norm1: w.layer_norm(&t("ln_1"), d, LN_EPS, device),
            qkv: w.linear_named(&t("attn.in_proj_weight"), Some(&t("attn.in_proj_bias")), d, 3 * d, device),
            out: w.linear(&t("attn.out_proj"), d, d, device),
            norm2: w.layer_norm(&t("ln_2"), d, LN_EPS, device),
            fc1: w.linear(&t("mlp.c_fc"), d, mlp_dim, device),
            fc2: w.linear(&t("mlp.c_proj"), mlp_dim, d, device),
        }
    }

    /// The block on `x`, with `heads` attention heads; `mask` is added to the attention scores
    /// (`[tokens, tokens]`: CLIP text's causal mask, `-inf` above the diagonal).
    ///
    /// # Shapes
    /// - `x`: `[batch, tokens, width]` → `[batch, tokens, width]`
    pub(crate) fn forward(
        &self,
        x: Tensor<3>,
        heads: usize,
        activation: MlpActivation,
        mask: Option<&Tensor<2>>,
    ) -> Tensor<3> {
        let x = x.clone() + self.attention(self.norm1.forward(x), heads, mask);
        let h = activation.apply(apply(&self.fc1, self.norm2.forward(x.clone())));
        x + apply(&self.fc2, h)
    }

    /// Multi-head self-attention: on the host ([`host_attention::attention`]) in inference on the
    /// CPU, [`burn_attention`] elsewhere.
    ///
    /// # Shapes
    /// - `x`: `[batch, tokens, width]` → `[batch, tokens, width]`
    fn attention(&self, x: Tensor<3>, heads: usize, mask: Option<&Tensor<2>>) -> Tensor<3> {
        let qkv = apply(&self.qkv, x);
        let context = host_attention::attention(&qkv, heads, mask).unwrap_or_else(|| burn_attention(qkv, heads, mask));
        apply(&self.out, context)
    }
}

/// `softmax(Q·Kᵀ/√d_h + mask)·V` per head, from the fused projection, in burn's operations (with
/// autodiff, and on every device): [`bert::burn_attention`] on its three parts.
///
/// # Shapes
/// - `qkv`: `[batch, tokens, 3·width]` (Q, K, V side by side) → `[batch, tokens, width]`
/// - `mask`: `[tokens, tokens]`, added to the scores
pub(crate) fn burn_attention(qkv: Tensor<3>, heads: usize, mask: Option<&Tensor<2>>) -> Tensor<3> {
    let d = qkv.dims()[2] / 3;
    let part = |i: usize| qkv.clone().narrow(2, i * d, d);
    let mask = mask.map(|m| m.clone().unsqueeze_dim::<3>(0).unsqueeze_dim::<4>(0));
    bert::burn_attention(part(0), part(1), part(2), heads, mask.as_ref(), None, 0.0)
}

/// Unicom's `feature` head.
#[derive(Module, Debug)]
pub struct UnicomHead {
    fc1: Linear,
    bn1: BatchNorm,
    fc2: Linear,
    bn2: BatchNorm,
}

#[derive(Module, Debug)]
pub struct Vit {
    patch_embed: Conv2d,
    /// CLIP only.
    class_embedding: Option<Param<Tensor<1>>>,
    /// `[tokens, width]` (tokens include the class token in CLIP).
    positional_embedding: Param<Tensor<2>>,
    /// CLIP only.
    ln_pre: Option<LayerNorm>,
    blocks: Vec<VitBlock>,
    /// `ln_post` (CLIP) or `norm` (Unicom).
    norm: LayerNorm,
    /// CLIP: `[width, output_dim]`.
    proj: Option<Param<Tensor<2>>>,
    /// Unicom.
    head: Option<UnicomHead>,
    #[module(skip)]
    heads: usize,
    #[module(skip)]
    activation: MlpActivation,
    #[module(skip)]
    whole_clip: bool,
    #[module(skip)]
    output_dim: usize,
}

/// Tensors of a whole CLIP state dict outside the image tower (text tower, logit scale).
const CLIP_TEXT_TOWER: [&str; 6] =
    ["transformer.", "token_embedding.", "positional_embedding", "text_projection", "logit_scale", "ln_final."];

impl Vit {
    /// Builds the model from checkpoint tensors; call [`Weights::finish`] with
    /// [`Vit::ignored`] afterwards.
    pub fn from_weights(c: &VitConfig, w: &Weights, device: &Device) -> Vit {
        match c.layout {
            VitLayout::Clip => Self::clip(c, w, device),
            VitLayout::Unicom => Self::unicom(c, w, device),
        }
    }

    fn clip(c: &VitConfig, w: &Weights, device: &Device) -> Vit {
        let whole_clip = w.contains("visual.conv1.weight");
        let p = if whole_clip { "visual." } else { "" };
        let (d, eps) = (c.width, LN_EPS);
        let blocks = (0..c.layers)
            .map(|i| VitBlock::clip(w, &format!("{p}transformer.resblocks.{i}."), d, c.mlp_dim, device))
            .collect();
        let patch = ConvSpec { d_in: 3, d_out: d, kernel: c.patch_size, stride: c.patch_size, padding: 0 };
        Vit {
            patch_embed: w.conv2d(&format!("{p}conv1"), patch, device),
            class_embedding: Some(w.param(&format!("{p}class_embedding"), [d], device)),
            positional_embedding: w.param(&format!("{p}positional_embedding"), [c.patches() + 1, d], device),
            ln_pre: Some(w.layer_norm(&format!("{p}ln_pre"), d, eps, device)),
            blocks,
            norm: w.layer_norm(&format!("{p}ln_post"), d, eps, device),
            proj: Some(w.param(&format!("{p}proj"), [d, c.output_dim], device)),
            head: None,
            heads: c.heads,
            activation: c.activation,
            whole_clip,
            output_dim: c.output_dim,
        }
    }

    fn unicom(c: &VitConfig, w: &Weights, device: &Device) -> Vit {
        let (d, eps) = (c.width, LN_EPS);
        let blocks = (0..c.layers)
            .map(|i| {
                let t = |part: &str| format!("blocks.{i}.{part}");
                VitBlock {
                    norm1: w.layer_norm(&t("norm1"), d, eps, device),
                    qkv: w.linear_named(&t("attn.qkv.weight"), None, d, 3 * d, device),
                    out: w.linear(&t("attn.proj"), d, d, device),
                    norm2: w.layer_norm(&t("norm2"), d, eps, device),
                    fc1: w.linear(&t("mlp.fc1"), d, c.mlp_dim, device),
                    fc2: w.linear(&t("mlp.fc2"), c.mlp_dim, d, device),
                }
            })
            .collect();
        let n = c.patches();
        let patch = ConvSpec { d_in: 3, d_out: d, kernel: c.patch_size, stride: c.patch_size, padding: 0 };
        Vit {
            patch_embed: w.conv2d_with_bias("patch_embed.proj", patch, device),
            class_embedding: None,
            positional_embedding: Param::from_tensor(w.tensor("pos_embed", [1, n, d], device).reshape([n, d])),
            ln_pre: None,
            blocks,
            norm: w.layer_norm("norm", d, eps, device),
            proj: None,
            head: Some(UnicomHead {
                fc1: w.linear_named("feature.0.weight", None, n * d, d, device),
                bn1: w.batch_norm("feature.1", d, BN_EPS, device),
                fc2: w.linear_named("feature.2.weight", None, d, c.output_dim, device),
                bn2: w.batch_norm("feature.3", c.output_dim, BN_EPS, device),
            }),
            heads: c.heads,
            activation: c.activation,
            whole_clip: false,
            output_dim: c.output_dim,
        }
    }

    /// Checkpoint tensors this model leaves out on purpose: the text tower when the checkpoint
    /// is a whole CLIP (only then, so that a stray tensor of a bare image tower is reported).
    pub fn ignored(&self) -> &'static [&'static str] {
        if self.whole_clip {
            &CLIP_TEXT_TOWER
        } else {
            &[]
        }
    }

    /// Loads a state dict (safetensors or PyTorch, TorchScript included) in the layout of `c`.
    pub fn load(path: &Path, c: &VitConfig, device: &Device) -> Result<Vit> {
        Self::load_under(path, None, c, device)
    }

    /// [`Vit::load`] of the tensors under `prefix` ([`Weights::under_prefix`]).
    pub fn load_under(path: &Path, prefix: Option<&str>, c: &VitConfig, device: &Device) -> Result<Vit> {
        Weights::load_model(path, prefix, |w| Vit::from_weights(c, w, device), Vit::ignored)
    }

    pub fn output_dim(&self) -> usize {
        self.output_dim
    }

    /// One embedding per image (not normalised).
    ///
    /// # Shapes
    /// - `images`: `[batch, 3, image_size, image_size]` (normalised)
    /// - output: `[batch, output_dim]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        self.pool(self.forward_tokens(images))
    }

    /// The token states after the last block (no final norm, no head): for CLIP the class token
    /// then the patches in row-major order (PCME++'s GPO input, spec `cusa-and-pcmepp.md` §3.1).
    ///
    /// # Shapes
    /// - `images`: `[batch, 3, image_size, image_size]` → `[batch, tokens, width]`
    pub fn forward_tokens(&self, images: Tensor<4>) -> Tensor<3> {
        self.forward_tokens_split(images).0
    }

    /// [`Vit::forward_tokens`], and the tokens before the last block (the input of PCME++'s
    /// log-variance branch, which runs a block of its own in the last one's place).
    ///
    /// # Shapes
    /// - `images`: `[batch, 3, image_size, image_size]` → 2 × `[batch, tokens, width]`
    pub fn forward_tokens_split(&self, images: Tensor<4>) -> (Tensor<3>, Tensor<3>) {
        let x = self.patch_embed.forward(images);
        let [b, d, gh, gw] = x.dims();
        // Patches in row-major grid order, as `flatten(2).transpose(1, 2)` in PyTorch.
        let mut x = x.reshape([b, d, gh * gw]).swap_dims(1, 2);
        if let Some(cls) = &self.class_embedding {
            let cls = cls.val().reshape([1, 1, d]).repeat_dim(0, b);
            x = Tensor::cat(vec![cls, x], 1);
        }
        x = x + self.positional_embedding.val().unsqueeze_dim::<3>(0);
        if let Some(ln) = &self.ln_pre {
            x = ln.forward(x);
        }
        let last = self.blocks.len().saturating_sub(1);
        for block in &self.blocks[..last] {
            x = block.forward(x, self.heads, self.activation, None);
        }
        let before = x.clone();
        for block in &self.blocks[last..] {
            x = block.forward(x, self.heads, self.activation, None);
        }
        (x, before)
    }

    /// `block` (a [`VitBlock::fresh`] of this width) on tokens, with this tower's heads and
    /// activation.
    pub fn run_block(&self, block: &VitBlock, x: Tensor<3>) -> Tensor<3> {
        block.forward(x, self.heads, self.activation, None)
    }

    /// The transformer blocks, first to last (for per-block learning rates).
    pub fn blocks(&self) -> &[VitBlock] {
        &self.blocks
    }

    /// Width of the token states.
    pub fn width(&self) -> usize {
        self.positional_embedding.dims()[1]
    }

    /// Hidden width of the blocks' MLPs.
    pub fn mlp_dim(&self) -> usize {
        self.blocks.first().map_or(4 * self.width(), |b| b.fc1.weight.dims()[1])
    }

    /// The head on [`Vit::forward_tokens`]'s output: CLIP's class token → `ln_post` → `@ proj`,
    /// or Unicom's `feature` head on the normed grid.
    ///
    /// # Shapes
    /// - `x`: `[batch, tokens, width]` → `[batch, output_dim]`
    pub fn pool(&self, x: Tensor<3>) -> Tensor<2> {
        let [b, n, d] = x.dims();
        match (&self.proj, &self.head) {
            (Some(proj), _) => {
                let cls = x.narrow(1, 0, 1).reshape([b, d]);
                self.norm.forward(cls).matmul(proj.val())
            }
            (None, Some(head)) => {
                let flat = self.norm.forward(x).reshape([b, n * d]);
                let h = head.bn1.forward(head.fc1.forward(flat));
                head.bn2.forward(head.fc2.forward(h))
            }
            (None, None) => unreachable!("every layout has a head"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(l: &Linear) -> (Vec<f32>, Vec<f32>) {
        let w = l.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let b = l.bias.as_ref().unwrap().val().into_data().try_to_vec::<f32>().unwrap();
        (w, b)
    }

    fn std(v: &[f32]) -> f64 {
        let n = v.len() as f64;
        let mean = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        (v.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt()
    }

    /// PCME++'s new blocks draw as §3.1 says: the image branch with PyTorch's defaults
    /// (in_proj Xavier-uniform, attention biases 0), the text branch with CLIP's normal init for
    /// a 12-block tower (width 64: in_proj std 1/8, out_proj and c_proj 1/8 · 24^−½, c_fc 128^−½).
    #[test]
    fn fresh_blocks_draw_with_their_branchs_init() {
        let device = Device::flex();
        let w = Weights::random(7);
        let d = 64;
        let image = VitBlock::fresh(&w, "i.", d, 4 * d, FreshInit::PyTorch, &device);
        let (qkv, qkv_bias) = values(&image.qkv);
        let bound = (6.0f64 / (d + 3 * d) as f64).sqrt();
        assert!(qkv.iter().all(|&x| (x as f64).abs() <= bound) && std(&qkv) > 0.9 * bound / 3f64.sqrt());
        assert!(qkv_bias.iter().all(|&x| x == 0.0) && values(&image.out).1.iter().all(|&x| x == 0.0));
        let (fc1, fc1_bias) = values(&image.fc1);
        let default = 1.0 / (d as f64).sqrt();
        assert!(
            fc1.iter().chain(&fc1_bias).all(|&x| (x as f64).abs() <= default) && fc1_bias.iter().any(|&x| x != 0.0)
        );
        let text = VitBlock::fresh(&w, "t.", d, 4 * d, FreshInit::ClipText { layers: 12 }, &device);
        let proj = (d as f64).powf(-0.5) / 24f64.sqrt();
        for (got, want) in [
            (std(&values(&text.qkv).0), (d as f64).powf(-0.5)),
            (std(&values(&text.out).0), proj),
            (std(&values(&text.fc1).0), (2.0 * d as f64).powf(-0.5)),
            (std(&values(&text.fc2).0), proj),
        ] {
            assert!((got / want - 1.0).abs() < 0.05, "std {got} against {want}");
        }
        assert!(values(&text.qkv).1.iter().all(|&x| x == 0.0) && values(&text.out).1.iter().all(|&x| x == 0.0));
        // LayerNorms at (1, 0).
        let gamma = text.norm1.gamma.val().into_data().try_to_vec::<f32>().unwrap();
        assert!(gamma.iter().all(|&x| x == 1.0));
    }
}
