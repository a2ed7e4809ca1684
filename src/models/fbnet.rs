//! FBNetV3 (Dai et al. 2020) in mobile-vision's layout, OTTER's FBNetV3-A and FBNetV3-C image
//! inits (spec `bow-and-otter.md` §5.8, OTTER's Table 2 and O-T3): a hard-swish stem, inverted
//! residual blocks ("IRF": 1×1 expansion, depthwise k×k, optional squeeze-excitation with a
//! hard-sigmoid gate, 1×1 projection) and mobile-vision's pooling head, giving 1984-d pooled
//! features. Tensor names are those of mobile-vision's `fbnet("FBNetV3_A")`
//! (`backbone.stages.xif{stage}_{block}.{pw,dw,se,pwl}`), or of its backbone alone
//! (`stages.xif...`); the classifier's ImageNet head `head.conv` is left out (a new projection
//! replaces it). The input must be at least [`FbNetConfig::min_side`] pixels a side.
//!
//! Each IRF block, from `in` to `out` channels at stride `s`:
//! - `pw`: 1×1 convolution to `mid = divisible(in · expansion, 8)` channels, BatchNorm,
//!   hard-swish (absent when `mid = in`);
//! - `dw`: depthwise k×k convolution at stride `s` (padding `k / 2` unless the architecture
//!   says otherwise: FBNetV3-A's two downsampling blocks of stages 4 and 5 pad by 1 and 0, so
//!   a 224² input is 13² then 6² there), BatchNorm, hard-swish;
//! - `se` (the `sehsig` blocks): the channels' means through a 1×1 convolution to
//!   `divisible(⌊mid · 0.25 / expansion⌋, 8)` channels, hard-swish, a 1×1 convolution back to
//!   `mid`, and `hsigmoid(x) = relu6(x + 3) / 6`, which scales each channel;
//! - `pwl`: 1×1 convolution to `out`, BatchNorm, no activation;
//! - the input added back when `in = out` and `s = 1`.
//!
//! The head (`xif6_0`, mobile-vision's `ir_pool_hs`): a 1×1 convolution to `6 · in` channels,
//! BatchNorm, hard-swish, the spatial mean, then a 1×1 convolution to 1984 without bias or
//! BatchNorm, and hard-swish. The stem convolution has a bias (PyTorch's default); the others
//! have none except the squeeze-excitation's. BatchNorm epsilon is PyTorch's 1e-5.
//!
//! `divisible(x, 8)` is mobile-vision's `get_divisible_by`: `x` itself if a multiple of 8, else
//! the nearest multiple (ties away from zero), 8 more if that falls below 0.95 x, at least 8.
//!
//! The pretrained files are mobile-vision's model zoo `model.pth` (a training checkpoint whose
//! `model_ema` entry, or else `state_dict`, holds the model under `module.`); the reader takes
//! `model_ema` where both are there, as mobile-vision's loader does.

use std::path::Path;

use burn::module::Module;
use burn::nn::conv::Conv2d;
use burn::nn::BatchNorm;
use burn::tensor::activation::{hard_sigmoid, hard_swish};
use burn::tensor::{Device, Tensor};

use super::host_batch_norm::After;
use super::resnet::{batch_norm_then, convolve, ConvLowering};
use super::weights::{ConvSpec, Weights};
use crate::error::Result;

/// One row of an FBNetV3 architecture: `repeats` IRF blocks of kernel `kernel` to `out`
/// channels, the first at `stride`, each expanding by `expansion`, with squeeze-excitation when
/// `se`, and the depthwise padding `dw_padding` (default `kernel / 2`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IrfRow {
    pub stage: usize,
    pub kernel: usize,
    pub out: usize,
    pub stride: usize,
    pub repeats: usize,
    pub expansion: f64,
    pub se: bool,
    pub dw_padding: Option<usize>,
}

/// An FBNetV3 architecture: the stem's width, the IRF rows in order, the head's expansion and
/// the width of the pooled features.
#[derive(Debug, Clone, PartialEq)]
pub struct FbNetConfig {
    pub stem: usize,
    pub rows: Vec<IrfRow>,
    pub head_expansion: usize,
    pub feature_dim: usize,
}

/// A row of the architecture tables below: (stage, kernel, out, stride, repeats, expansion, se).
type Row = (usize, usize, usize, usize, usize, f64, bool);

fn rows(table: &[Row], paddings: &[(usize, usize)]) -> Vec<IrfRow> {
    table
        .iter()
        .enumerate()
        .map(|(i, &(stage, kernel, out, stride, repeats, expansion, se))| IrfRow {
            stage,
            kernel,
            out,
            stride,
            repeats,
            expansion,
            se,
            dw_padding: paddings.iter().find(|(row, _)| *row == i).map(|(_, p)| *p),
        })
        .collect()
}

impl FbNetConfig {
    /// mobile-vision's `FBNetV3_A` (8.6M parameters, 79.6% ImageNet top-1 at 224²).
    pub fn fbnetv3_a() -> Self {
        #[rustfmt::skip]
        let table: [Row; 12] = [
            (1, 3, 16, 1, 2, 1.0, false),
            (2, 5, 24, 2, 1, 4.0, false), (2, 5, 24, 1, 3, 2.0, false),
            (3, 5, 40, 2, 1, 5.0, true), (3, 5, 40, 1, 4, 3.0, true),
            (4, 5, 72, 2, 1, 5.0, false), (4, 3, 72, 1, 4, 3.0, false),
            (4, 3, 120, 1, 1, 5.0, true), (4, 5, 120, 1, 5, 3.0, true),
            (5, 3, 184, 2, 1, 6.0, true), (5, 5, 184, 1, 5, 4.0, true), (5, 5, 224, 1, 1, 6.0, true),
        ];
        FbNetConfig { stem: 16, rows: rows(&table, &[(5, 1), (9, 0)]), head_expansion: 6, feature_dim: 1984 }
    }

    /// mobile-vision's `FBNetV3_C` (10.0M parameters, 80.8% ImageNet top-1 at 248²).
    pub fn fbnetv3_c() -> Self {
        #[rustfmt::skip]
        let table: [Row; 12] = [
            (1, 3, 16, 1, 2, 1.0, false),
            (2, 5, 24, 2, 1, 5.0, false), (2, 3, 24, 1, 4, 3.0, false),
            (3, 5, 48, 2, 1, 5.0, true), (3, 5, 48, 1, 4, 2.0, true),
            (4, 5, 88, 2, 1, 4.0, false), (4, 3, 88, 1, 4, 3.0, false),
            (4, 3, 120, 1, 1, 4.0, true), (4, 5, 120, 1, 5, 3.0, true),
            (5, 5, 216, 2, 1, 5.0, true), (5, 5, 216, 1, 5, 5.0, true), (5, 5, 216, 1, 1, 6.0, true),
        ];
        FbNetConfig { stem: 16, rows: rows(&table, &[(5, 1), (9, 1)]), head_expansion: 6, feature_dim: 1984 }
    }

    /// A tiny FBNetV3 for tests: every kind of block (with and without expansion, residual and
    /// squeeze-excitation, both kernels, both padding overrides), 64-d features.
    pub fn tiny() -> Self {
        #[rustfmt::skip]
        let table: [Row; 6] = [
            (1, 3, 8, 1, 1, 1.0, false),
            (2, 5, 8, 2, 1, 3.0, false), (2, 3, 8, 1, 1, 2.0, true),
            (3, 5, 16, 2, 1, 3.0, true), (3, 3, 24, 1, 1, 2.0, true),
            (4, 3, 24, 2, 1, 2.0, false),
        ];
        FbNetConfig { stem: 8, rows: rows(&table, &[(3, 1), (5, 0)]), head_expansion: 2, feature_dim: 64 }
    }

    /// The smallest square input every convolution has a window for: each stride-2 convolution
    /// halves the side (rounding up), and one padded by less than `kernel / 2` needs at least
    /// `kernel − 2 · padding` pixels (49 for FBNetV3-A and -C: 7 pixels reach stage 4, 13²
    /// at 224).
    pub fn min_side(&self) -> usize {
        // The side after each layer, as a function of the side before it; `None`: no window.
        let out = |side: usize, kernel: usize, stride: usize, padding: usize| {
            (side + 2 * padding).checked_sub(kernel).map(|d| d / stride + 1)
        };
        let fits = |mut side: usize| -> bool {
            let Some(s) = out(side, 3, 2, 1) else { return false };
            side = s;
            for row in &self.rows {
                for r in 0..row.repeats {
                    let stride = if r == 0 { row.stride } else { 1 };
                    match out(side, row.kernel, stride, row.dw_padding.unwrap_or(row.kernel / 2)) {
                        Some(s) if s > 0 => side = s,
                        _ => return false,
                    }
                }
            }
            true
        };
        (1..4096).find(|&s| fits(s)).unwrap_or(4096)
    }
}

/// mobile-vision's `get_divisible_by(x, 8)` (see the module documentation).
pub fn divisible(x: f64, by: usize) -> usize {
    let by_f = by as f64;
    let mut ret = x as usize;
    if x % by_f != 0.0 {
        // Python 2's `round`: halves away from zero.
        ret = (((x / by_f).round() as usize).max(1)) * by;
        if (ret as f64) < 0.95 * x {
            ret += by;
        }
    }
    ret.max(by)
}

/// A convolution and its BatchNorm.
#[derive(Module, Debug)]
pub struct ConvBn {
    conv: Conv2d,
    bn: BatchNorm,
}

impl ConvBn {
    /// `after(bn(conv(x)) + residual?)`, in inference one pass after the convolution.
    fn forward(&self, x: Tensor<4>, residual: Option<Tensor<4>>, after: After, lowering: ConvLowering) -> Tensor<4> {
        batch_norm_then(&self.bn, convolve(&self.conv, x, lowering), residual, after, lowering)
    }
}

/// Squeeze-excitation with a hard-sigmoid gate.
#[derive(Module, Debug)]
pub struct SqueezeExcite {
    reduce: Conv2d,
    expand: Conv2d,
}

impl SqueezeExcite {
    fn forward(&self, x: Tensor<4>, lowering: ConvLowering) -> Tensor<4> {
        let gate = x.clone().mean_dim(3).mean_dim(2);
        let gate = hard_swish(convolve(&self.reduce, gate, lowering));
        let gate = hard_sigmoid(convolve(&self.expand, gate, lowering), 1.0 / 6.0, 0.5);
        x * gate
    }
}

/// An inverted residual block (see the module documentation).
#[derive(Module, Debug)]
pub struct Irf {
    pw: Option<ConvBn>,
    dw: ConvBn,
    se: Option<SqueezeExcite>,
    pwl: ConvBn,
    #[module(skip)]
    residual: bool,
}

impl Irf {
    fn forward(&self, x: Tensor<4>, lowering: ConvLowering) -> Tensor<4> {
        let mut y = match &self.pw {
            Some(pw) => pw.forward(x.clone(), None, After::HardSwish, lowering),
            None => x.clone(),
        };
        y = self.dw.forward(y, None, After::HardSwish, lowering);
        if let Some(se) = &self.se {
            y = se.forward(y, lowering);
        }
        self.pwl.forward(y, self.residual.then_some(x), After::Nothing, lowering)
    }
}

#[derive(Module, Debug)]
pub struct FbNet {
    stem: ConvBn,
    blocks: Vec<Irf>,
    head_pw: ConvBn,
    head_conv: Conv2d,
    #[module(skip)]
    feature_dim: usize,
    #[module(skip)]
    lowering: ConvLowering,
}

/// PyTorch's BatchNorm2d epsilon.
const BN_EPS: f64 = 1e-5;

impl FbNet {
    /// Builds the model from checkpoint tensors; call [`Weights::finish`] afterwards.
    pub fn from_weights(c: &FbNetConfig, w: &Weights, device: &Device) -> FbNet {
        let spec = |d_in, d_out, kernel, stride, padding| ConvSpec { d_in, d_out, kernel, stride, padding };
        let conv_bn = |prefix: &str, s: ConvSpec, groups: usize| ConvBn {
            conv: w.conv2d_grouped(&format!("{prefix}.conv"), s, groups, false, device),
            bn: w.batch_norm(&format!("{prefix}.bn"), s.d_out, BN_EPS, device),
        };
        // mobile-vision's classifier (`fbnet(...)`) holds the stages under `backbone.`; its
        // backbone alone (`fbnet_backbone(...)`, detection models) holds them at the top.
        let backbone_only =
            w.contains("stages.xif0_0.conv.weight") && !w.contains("backbone.stages.xif0_0.conv.weight");
        let root = if backbone_only { "stages" } else { "backbone.stages" };
        let stem = ConvBn {
            conv: w.conv2d_with_bias(&format!("{root}.xif0_0.conv"), spec(3, c.stem, 3, 2, 1), device),
            bn: w.batch_norm(&format!("{root}.xif0_0.bn"), c.stem, BN_EPS, device),
        };
        let mut blocks = Vec::new();
        let mut d_in = c.stem;
        let mut index = (0, 0);
        for row in &c.rows {
            for r in 0..row.repeats {
                // Blocks are numbered within their stage, across rows.
                index = if index.0 == row.stage { (row.stage, index.1 + 1) } else { (row.stage, 0) };
                let p = format!("{root}.xif{}_{}", index.0, index.1);
                let stride = if r == 0 { row.stride } else { 1 };
                let mid = divisible(d_in as f64 * row.expansion, 8);
                let padding = row.dw_padding.unwrap_or(row.kernel / 2);
                let se = row.se.then(|| {
                    let squeezed = divisible((mid as f64 * 0.25 / row.expansion).trunc(), 8);
                    SqueezeExcite {
                        reduce: w.conv2d_with_bias(&format!("{p}.se.se.0.conv"), spec(mid, squeezed, 1, 1, 0), device),
                        expand: w.conv2d_with_bias(&format!("{p}.se.se.1"), spec(squeezed, mid, 1, 1, 0), device),
                    }
                });
                blocks.push(Irf {
                    pw: (mid != d_in).then(|| conv_bn(&format!("{p}.pw"), spec(d_in, mid, 1, 1, 0), 1)),
                    dw: conv_bn(&format!("{p}.dw"), spec(mid, mid, row.kernel, stride, padding), mid),
                    se,
                    pwl: conv_bn(&format!("{p}.pwl"), spec(mid, row.out, 1, 1, 0), 1),
                    residual: d_in == row.out && stride == 1,
                });
                d_in = row.out;
            }
        }
        let head = format!("{root}.xif{}_0", index.0 + 1);
        let mid = d_in * c.head_expansion;
        FbNet {
            stem,
            blocks,
            head_pw: conv_bn(&format!("{head}.pw"), spec(d_in, mid, 1, 1, 0), 1),
            head_conv: w.conv2d(&format!("{head}.pwl.conv"), spec(mid, c.feature_dim, 1, 1, 0), device),
            feature_dim: c.feature_dim,
            lowering: ConvLowering::for_device(device),
        }
    }

    /// The same model with its convolutions computed by `lowering` (see [`ConvLowering`]).
    pub fn with_conv_lowering(mut self, lowering: ConvLowering) -> FbNet {
        self.lowering = lowering;
        self
    }

    /// Tensors the feature extractor leaves out: the ImageNet classifier.
    pub const IGNORED: [&'static str; 1] = ["head."];

    /// Loads a mobile-vision state dict (safetensors, or the model zoo's `model.pth`).
    pub fn load(path: &Path, c: &FbNetConfig, device: &Device) -> Result<FbNet> {
        Self::load_under(path, None, c, device)
    }

    /// [`FbNet::load`] of the tensors under `prefix` ([`Weights::under_prefix`]).
    pub fn load_under(path: &Path, prefix: Option<&str>, c: &FbNetConfig, device: &Device) -> Result<FbNet> {
        Weights::load_model(path, prefix, |w| FbNet::from_weights(c, w, device), |_| &Self::IGNORED)
    }

    pub fn feature_dim(&self) -> usize {
        self.feature_dim
    }

    /// The pooled features (the head's output).
    ///
    /// # Shapes
    /// - `images`: `[batch, 3, height, width]` (normalised)
    /// - output: `[batch, feature_dim]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let l = self.lowering;
        let mut x = self.stem.forward(images, None, After::HardSwish, l);
        for block in &self.blocks {
            x = block.forward(x, l);
        }
        let x = self.head_pw.forward(x, None, After::HardSwish, l);
        let pooled = x.mean_dim(3).mean_dim(2);
        let out = hard_swish(convolve(&self.head_conv, pooled, l));
        let [b, c, _, _] = out.dims();
        out.reshape([b, c])
    }
}

#[cfg(test)]
mod tests {
    use super::{divisible, FbNetConfig};

    #[test]
    fn divisible_rounds_as_mobile_vision() {
        // Values from mobile-vision's `get_divisible_by(x, 8)`: the squeeze widths of
        // FBNetV3-A (6 → 8, 18 → 24, 30 → 32, 46 → 48) and of FBNetV3-C (54 → 56), halves away
        // from zero (12 → 16, 20 → 24), the 0.95 rule (18 → 16 is below 17.1, so 24), at least 8.
        for (x, want) in [(6.0, 8), (18.0, 24), (30.0, 32), (46.0, 48), (54.0, 56), (12.0, 16), (20.0, 24)] {
            assert_eq!(divisible(x, 8), want, "{x}");
        }
        for (x, want) in [(0.0, 8), (3.0, 8), (64.0, 64), (1104.0, 1104), (10.0, 16), (36.0, 40)] {
            assert_eq!(divisible(x, 8), want, "{x}");
        }
    }

    #[test]
    fn the_smallest_input_has_a_window_for_every_convolution() {
        // FBNetV3-A at 49²: 25, 13, 7 at stage 4's input, then (7 + 2 − 5) / 2 + 1 = 3 and
        // stage 5's unpadded 3×3 gives 1. At 48²: 6 there, 2, and no 3×3 window.
        assert_eq!(FbNetConfig::fbnetv3_a().min_side(), 49);
        assert_eq!(FbNetConfig::fbnetv3_c().min_side(), 49);
        // The tiny one: 13, 7, 3 (5×5 padded by 1), 1 (3×3 unpadded); at 24², 2 before the last.
        assert_eq!(FbNetConfig::tiny().min_side(), 25);
    }

    #[test]
    fn architectures_have_mobile_visions_block_counts() {
        let blocks = |c: &FbNetConfig| c.rows.iter().map(|r| r.repeats).sum::<usize>();
        assert_eq!(blocks(&FbNetConfig::fbnetv3_a()), 29);
        assert_eq!(blocks(&FbNetConfig::fbnetv3_c()), 30);
    }
}
