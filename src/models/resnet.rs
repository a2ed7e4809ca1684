//! ResNet in torchvision's layout (`conv1`, `bn1`, `layer1.0.conv1`, `...downsample.0/1`,
//! `fc`; timm's ResNets share it) with Bottleneck blocks, stride on the 3×3 convolution
//! ("ResNet v1.5", as torchvision, BYOL and most published ResNet-50 checkpoints), their wide
//! form (Wide ResNet-50-2: the Bottleneck's inner width doubled), or BasicBlocks (ResNet-18/34:
//! two 3×3 convolutions). The image encoder of "A Fistful of Words" and OTTER (spec
//! `bow-and-otter.md` §4, §5.8; OTTER's Table 2 also trains ResNet-34 and Wide ResNet-50-2):
//! global-average-pooled features, 2048-d for ResNet-50, 512-d for ResNet-34; the classifier
//! `fc` is left out (a new projection replaces it).
//!
//! On burn's CPU backend a convolution is one operation of matrix products ([`convolve`],
//! [`super::host_conv`]: over groups of images in training and in an EMA teacher's forward pass
//! beside it, image by image in inference), a training BatchNorm one operation of fused host loops
//! ([`super::host_batch_norm`]), and in inference a BatchNorm with the residual sum and ReLU after
//! it one pass ([`batch_norm_relu`]) and the stem's max pooling a host loop
//! ([`super::host_max_pool`]); the ndarray backend takes burn's kernels. On a GPU they are lowered to one
//! matrix product over the input's patches ([`ConvLowering::Im2col`]): without burn's autotuning
//! (plain `--features cuda`), burn-cubecl convolves with a direct kernel, which gave ResNet-50 85
//! images/s on an H100 at batch 32 against 927 with im2col (README, "GPU build"). The GPU's
//! products run in TF32, so im2col features there agree with the CPU's to about 1e-3 relative.
//! The same lowering computes a training BatchNorm's batch statistics as staged sums
//! ([`batch_norm`]): burn-cubecl reduces with one GPU thread per output without autotuning, and
//! a channel's statistics over `batch × H × W` values took 80% of a ResNet-50 training step.

use std::path::Path;

use burn::module::Module;
use burn::nn::conv::Conv2d;
use burn::nn::{BatchNorm, PaddingConfig2d};
use burn::tensor::module::adaptive_avg_pool2d;
use burn::tensor::{Device, Slice, Tensor, TensorData};

use super::host_batch_norm::After;
use super::weights::{ConvSpec, Weights};
use crate::error::Result;

/// A residual block's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockKind {
    /// 1×1 → 3×3 (stride) → 1×1, four times the stage's width out (ResNet-50 and up).
    Bottleneck,
    /// 3×3 (stride) → 3×3, the stage's width out (ResNet-18/34).
    Basic,
}

/// Blocks per stage, the stem width (torchvision: 64), the block kind and the Bottleneck's
/// inner width per 64 of stage width (torchvision's `width_per_group`: 64, and 128 in the wide
/// ResNets).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResNetConfig {
    pub layers: [usize; 4],
    pub width: usize,
    pub block: BlockKind,
    pub width_per_group: usize,
}

impl ResNetConfig {
    /// ResNet-50: [3, 4, 6, 3] Bottleneck blocks, 2048-d features.
    pub fn resnet50() -> Self {
        ResNetConfig { layers: [3, 4, 6, 3], width: 64, block: BlockKind::Bottleneck, width_per_group: 64 }
    }

    /// ResNet-101.
    pub fn resnet101() -> Self {
        ResNetConfig { layers: [3, 4, 23, 3], ..Self::resnet50() }
    }

    /// Wide ResNet-50-2: ResNet-50 with the Bottlenecks' inner width doubled (2048-d).
    pub fn wide_resnet50_2() -> Self {
        ResNetConfig { width_per_group: 128, ..Self::resnet50() }
    }

    /// ResNet-18: [2, 2, 2, 2] BasicBlocks, 512-d features.
    pub fn resnet18() -> Self {
        ResNetConfig { layers: [2, 2, 2, 2], block: BlockKind::Basic, ..Self::resnet50() }
    }

    /// ResNet-34: [3, 4, 6, 3] BasicBlocks, 512-d features.
    pub fn resnet34() -> Self {
        ResNetConfig { block: BlockKind::Basic, ..Self::resnet50() }
    }

    /// A tiny ResNet for tests: one block per stage, stem width 8 (256-d features).
    pub fn tiny() -> Self {
        ResNetConfig { layers: [1, 1, 1, 1], width: 8, ..Self::resnet50() }
    }

    /// Output channels of a block over its stage's width: 4 for a Bottleneck, 1 for a BasicBlock.
    pub fn expansion(&self) -> usize {
        match self.block {
            BlockKind::Bottleneck => 4,
            BlockKind::Basic => 1,
        }
    }

    /// Width of the pooled features: `8 · width · expansion`.
    pub fn feature_dim(&self) -> usize {
        self.width * 8 * self.expansion()
    }
}

/// How the convolutions are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConvLowering {
    /// burn's convolution kernel (the CPU default); under autodiff on burn's CPU backend,
    /// `host_conv`'s matrix products over groups of images (see [`convolve`]).
    Native,
    /// Each output pixel's `k×k×C` patch as a column, times the weights as a `[out, C·k·k]`
    /// matrix: one batched matrix product per convolution, over the images or, in training, over
    /// groups of images (the GPU default; see `im2col`). A training
    /// BatchNorm's statistics are then staged sums ([`batch_norm`]).
    Im2col,
}

impl ConvLowering {
    /// The lowering for `device`: burn's kernel on the CPU, im2col elsewhere.
    pub fn for_device(device: &Device) -> ConvLowering {
        if super::activation::is_host(device) {
            ConvLowering::Native
        } else {
            ConvLowering::Im2col
        }
    }
}

/// `conv` applied to `x` (`[batch, C, H, W]`) with `lowering`. Im2col needs symmetric padding,
/// no dilation and no groups (all of ResNet's convolutions); a depthwise convolution (FBNet's)
/// in inference on the CPU is `host_depthwise`'s; anything else takes burn's kernel.
pub(crate) fn convolve(conv: &Conv2d, x: Tensor<4>, lowering: ConvLowering) -> Tensor<4> {
    let Some((k, s, p)) = square_geometry(conv) else {
        return conv.forward(x);
    };
    if conv.groups > 1 {
        let depthwise = match lowering {
            ConvLowering::Native => {
                let bias = conv.bias.as_ref().map(|b| b.val());
                super::host_depthwise::conv2d(&x, &conv.weight.val(), bias.as_ref(), s, p)
            }
            ConvLowering::Im2col => None,
        };
        return depthwise.unwrap_or_else(|| conv.forward(x));
    }
    let [n, _, h, w] = x.dims();
    let training = x.device().is_autodiff() && conv.weight.val().is_require_grad();
    match lowering {
        // Where a backward pass runs through these weights, the batch's columns in a few groups
        // (see `column_groups`); otherwise one group per image.
        ConvLowering::Im2col => {
            let groups = if training { column_groups(n, output_len(h, k, s, p) * output_len(w, k, s, p)) } else { n };
            im2col(conv, x, p, groups)
        }
        // burn-flex convolves image by image, one small matrix product each with its operands
        // packed anew, and takes the weights' gradient as a convolution over the batch axis. In
        // training on burn's CPU backend a convolution is one operation with a product per group
        // of images (`host_conv`, which gives figures), and so is the forward pass of a model
        // without gradients beside it (an EMA teacher's); elsewhere (ndarray) a training 1×1
        // convolution is one product over the whole batch (8 → 32 channels at 8×8, batch 64,
        // forward and backward: 0.55 → 0.40 ms). Without autodiff `host_conv` convolves each
        // image with one product, where burn's CPU backend takes it.
        ConvLowering::Native => match super::host_conv::conv2d(&x, &conv.weight.val(), s, p) {
            Some(out) => match &conv.bias {
                Some(bias) => out + bias.val().reshape([1, conv.weight.dims()[0], 1, 1]),
                None => out,
            },
            None if training && k == 1 && s == 1 => im2col(conv, x, p, 1),
            None => conv.forward(x),
        },
    }
}

/// `conv`'s kernel size, stride and padding `(k, s, p)` where the host paths apply: a square
/// kernel and stride, the same padding on every side, no dilation (the lowerings to matrix
/// products also need one group).
fn square_geometry(conv: &Conv2d) -> Option<(usize, usize, usize)> {
    let p = match conv.padding {
        PaddingConfig2d::Explicit(t, l, b, r) if t == l && l == b && b == r => t,
        PaddingConfig2d::Valid => 0,
        _ => return None,
    };
    let ([k, kw], [s, sw]) = (conv.kernel_size, conv.stride);
    (k == kw && s == sw && conv.dilation == [1, 1]).then_some((k, s, p))
}

/// The most columns (output pixels) one group of a training convolution's product holds.
const MAX_GROUP_COLUMNS: usize = 16_384;

/// How many groups of whole images a training convolution's `n · pixels` columns are split into:
/// the fewest that leave each group at most [`MAX_GROUP_COLUMNS`] columns (all `n` if none do). The
/// weights' gradient is a sum over the columns, one `[out, C·k·k]` product per group, summed
/// afterwards. In one group (the whole batch), that product's inner dimension is the whole batch's
/// pixels (1.6 M for ResNet-50's stem at batch 128) while its output holds only `out × C·k·k`
/// values, too few tiles to fill a GPU: on an H100 at batch 128, twelve products (by their timing
/// the early layers' weight gradients) took 19.5 to 88 ms each, and all products 0.49 s of a 0.77 s
/// ResNet-50 training step. In groups of at most 16,384 columns they took 0.09 s and the step
/// 0.38 s (limits of 4,096 and 65,536 columns: 0.38–0.42 and 0.45–0.46 s). One group per image
/// (inference's layout) sums `n` weight-sized products instead. Groups are equal, so a batch
/// size with few divisors (a prime such as 127) falls back to one group per image wherever its
/// whole batch exceeds the limit: slower and more memory-hungry, not wrong.
fn column_groups(n: usize, pixels: usize) -> usize {
    (1..=n).find(|g| n.is_multiple_of(*g) && (n / g) * pixels <= MAX_GROUP_COLUMNS).unwrap_or(n)
}

/// `conv` (square kernel and stride, no dilation or groups) with symmetric padding `p`, as
/// matrix products over `x`'s patches. The batch's images are split into `groups` equal groups
/// (`groups` divides the batch); each group's patches form one `[C·k·k, images·Ho·Wo]` matrix
/// (channels first), and the `[out, C·k·k]` weights, broadcast over the groups, multiply each.
/// One group per image is inference's layout, where a 1×1 convolution's columns are the input
/// itself. In training, fewer groups keep the weights' gradient, a stack of one weight-sized
/// product per group summed afterwards, small: with one group per image, 12 GB were allocated
/// over a ResNet-50 backward pass at batch 128, up to 1.2 GB at once (see [`column_groups`]).
fn im2col(conv: &Conv2d, x: Tensor<4>, p: usize, groups: usize) -> Tensor<4> {
    let (k, s) = (conv.kernel_size[0], conv.stride[0]);
    let [n, c, h, w] = x.dims();
    assert!(groups > 0 && n % groups == 0, "im2col: {groups} groups do not divide a batch of {n}");
    let (ho, wo) = (output_len(h, k, s, p), output_len(w, k, s, p));
    let (g, m) = (groups, n / groups);
    let x = if p > 0 { zero_pad(x, p) } else { x };
    let [_, _, hp, wp] = x.dims();
    // `[groups, C, images, H, W]`: each group's images after the channel axis.
    let x = x.reshape([g, m, c, hp, wp]).swap_dims(1, 2);
    // Row (c, i, j) of the column of output pixel (y, x) is input pixel (s·y + i, s·x + j) of
    // channel c: the k·k strided views (`[groups, C, images, Ho, Wo]`) stacked after the channel
    // axis, in the weights' [out, C, k, k] order.
    let view = |i: usize, j: usize| {
        let rows = Slice::new(i as isize, Some((i + s * (ho - 1) + 1) as isize), s as isize);
        let cols = Slice::new(j as isize, Some((j + s * (wo - 1) + 1) as isize), s as isize);
        x.clone().slice([Slice::from(..), Slice::from(..), Slice::from(..), rows, cols])
    };
    let shape = [g, c * k * k, m * ho * wo];
    let columns: Tensor<3> = match k {
        1 => view(0, 0).reshape(shape),
        _ => {
            let views = (0..k).flat_map(|i| (0..k).map(move |j| (i, j))).map(|(i, j)| view(i, j)).collect();
            Tensor::<5>::stack::<6>(views, 2).reshape(shape)
        }
    };
    let d_out = conv.weight.dims()[0];
    let weights = conv.weight.val().reshape([1, d_out, c * k * k]).expand([g, d_out, c * k * k]);
    let out = weights.matmul(columns).reshape([g, d_out, m, ho, wo]).swap_dims(1, 2).reshape([n, d_out, ho, wo]);
    match &conv.bias {
        Some(bias) => out + bias.val().reshape([1, d_out, 1, 1]),
        None => out,
    }
}

/// A convolution's output length along an axis of `len` pixels (kernel `k`, stride `s`, `p` zeros
/// on each side).
fn output_len(len: usize, k: usize, s: usize, p: usize) -> usize {
    (len + 2 * p - k) / s + 1
}

/// `x` (`[batch, C, H, W]`) with `p` zeros on each side of H and W, made on `x`'s device: a
/// zero tensor with `x` written into its middle. Not burn's `pad`, which builds the padded tensor
/// as host data and uploads it when the device is autodiff (burn 0.22's autodiff backend leaves
/// `float_full` to the host fallback). On an H100 at batch 128 that was ~100 MB built and copied
/// per convolution, and held a ResNet-50 training step's forward call for about 2 s (a sampling
/// profile: the device thread half its time in the host-to-device copy, the main thread in
/// `TensorData::full_dtype`).
fn zero_pad(x: Tensor<4>, p: usize) -> Tensor<4> {
    let [n, c, h, w] = x.dims();
    Tensor::zeros([n, c, h + 2 * p, w + 2 * p], &x.device()).slice_assign([0..n, 0..c, p..p + h, p..p + w], x)
}

/// `bn` applied to `x` (`[batch, C, H, W]`). In training (an autodiff device and the layer's
/// training flag) with [`ConvLowering::Im2col`], the batch statistics are computed here as
/// staged sums (over W, then H, then the batch: every stage has many outputs and short rows),
/// and the running statistics are updated as PyTorch's `BatchNorm2d` does (unbiased variance, its
/// momentum). burn's own training path swaps the batch and channel axes and reduces each
/// channel's `batch·H·W` values in one row, which burn-cubecl gives to one GPU thread: 8.5 to
/// 32 ms per reduction at batch 64 on an H100, 80% of a ResNet-50 training step (with staged
/// sums, ResNet-50 trained at 62–65 samples/s there instead of 40–45). With the CPU's lowering
/// a training BatchNorm is one operation with fused host loops on burn's CPU backend
/// ([`super::host_batch_norm`]) and burn's `batch_norm_train` on another (ndarray), with the
/// running statistics updated here (PyTorch's way, not burn's `BatchNorm`'s biased one); in
/// inference it is [`super::host_batch_norm::inference`] (burn's `bn.forward(x)` off the CPU).
pub fn batch_norm(bn: &BatchNorm, x: Tensor<4>, lowering: ConvLowering) -> Tensor<4> {
    if !(x.device().is_autodiff() && bn.training.is_enabled()) {
        return super::host_batch_norm::inference(bn, x, None, After::Nothing);
    }
    if lowering == ConvLowering::Im2col {
        return staged_batch_norm(bn, x);
    }
    // The running statistics are updated here, as PyTorch does.
    let [b, c, h, w] = x.dims();
    // On burn's CPU backend, one operation with fused loops (see `host_batch_norm`).
    if let Some(r) = super::host_batch_norm::train(&x, &bn.gamma.val(), &bn.beta.val(), bn.epsilon) {
        update_running_stats_on_host(bn, r.mean, r.biased_variance, b * h * w);
        return r.output;
    }
    let r = burn::tensor::module::batch_norm_train(x, bn.gamma.val(), bn.beta.val(), bn.epsilon);
    update_running_stats(bn, r.mean.reshape([c]), r.variance.reshape([c]), b * h * w);
    r.output
}

/// `relu(batch_norm(x) + residual)`, or `relu(batch_norm(x))` without a residual: in inference
/// one pass on the CPU ([`super::host_batch_norm::inference`]); in training [`batch_norm`], then
/// burn's sum and ReLU.
pub fn batch_norm_relu(bn: &BatchNorm, x: Tensor<4>, residual: Option<Tensor<4>>, lowering: ConvLowering) -> Tensor<4> {
    batch_norm_then(bn, x, residual, After::Relu, lowering)
}

/// `after(batch_norm(x) + residual?)`: in inference one pass on the CPU
/// ([`super::host_batch_norm::inference`]); in training [`batch_norm`], then burn's sum and
/// activation.
pub(crate) fn batch_norm_then(
    bn: &BatchNorm,
    x: Tensor<4>,
    residual: Option<Tensor<4>>,
    after: After,
    lowering: ConvLowering,
) -> Tensor<4> {
    if !(x.device().is_autodiff() && bn.training.is_enabled()) {
        return super::host_batch_norm::inference(bn, x, residual, after);
    }
    let y = batch_norm(bn, x, lowering);
    after.burns(match residual {
        Some(r) => y + r,
        None => y,
    })
}

/// [`update_running_stats`] from statistics already on the host: the same arithmetic in `f32`,
/// without the dozen tensor operations (each a dispatch and an allocation) it takes on a device.
fn update_running_stats_on_host(bn: &BatchNorm, mean: Vec<f32>, biased_variance: Vec<f32>, count: usize) {
    let m = bn.momentum;
    let (keep, take) = ((1.0 - m) as f32, m as f32);
    let update = |state: &burn::module::RunningState<Tensor<1>>, batch: Vec<f32>| {
        let old = state.value_sync();
        let device = old.device();
        let old = old.into_data().try_into_vec::<f32>().expect("f32 running statistics");
        let new: Vec<f32> = old.iter().zip(&batch).map(|(o, b)| o * keep + b * take).collect();
        state.update(Tensor::from_data(TensorData::new(new, [batch.len()]), &device));
        // Folded in at once, as in `update_running_stats`.
        let _ = state.value_sync();
    };
    update(&bn.running_mean, mean);
    let unbias = (count as f64 / (count as f64 - 1.0).max(1.0)) as f32;
    update(&bn.running_var, biased_variance.into_iter().map(|v| v * unbias).collect());
}

/// PyTorch's running-statistics update of a training BatchNorm from a batch of `count` values
/// per channel: `r ← (1 − m)·r + m·batch`, the variance unbiased (`count / (count − 1)` times
/// the batch's biased one). burn's own `BatchNorm` keeps the biased variance, which leaves the
/// evaluation-time variance low by `(count − 1) / count` (1.6% for 64 values).
fn update_running_stats(bn: &BatchNorm, mean: Tensor<1>, biased_variance: Tensor<1>, count: usize) {
    let device = mean.device();
    let m = bn.momentum;
    let update = |state: &burn::module::RunningState<Tensor<1>>, batch: Tensor<1>| {
        let old = state.value_sync().to_device(&device);
        state.update(old.mul_scalar(1.0 - m).add(batch.detach().mul_scalar(m)).detach());
        // burn keeps an update pending per thread and averages the threads' pending values
        // when they are read; folded in at once, the update is the same whichever thread ran
        // this forward pass (the towers may run on two, see `DualEncoder::forward_dropping`).
        let _ = state.value_sync();
    };
    update(&bn.running_mean, mean);
    let count = count as f64;
    update(&bn.running_var, biased_variance.mul_scalar(count / (count - 1.0).max(1.0)));
}

/// A training BatchNorm with its statistics as staged sums: see [`batch_norm`], which takes it.
pub fn staged_batch_norm(bn: &BatchNorm, x: Tensor<4>) -> Tensor<4> {
    let [b, c, h, w] = x.dims();
    let count = (b * h * w) as f64;
    // Per-channel sums of a `[batch, C, H, W]` tensor, as `[1, C, 1, 1]`.
    let channel_sum = |t: Tensor<4>| t.sum_dim(3).sum_dim(2).sum_dim(0);
    // Per-channel values spread over the input's shape explicitly: the backward of `expand` sums
    // one axis at a time, where that of a broadcasting operation sums all of them in one
    // reduction (80 ms for the stem's at batch 64 on an H100).
    let spread = |t: Tensor<4>| t.expand([b, c, h, w]);
    let mean = channel_sum(x.clone()).div_scalar(count);
    let centered = x - spread(mean.clone());
    let variance = channel_sum(centered.clone().square()).div_scalar(count);
    let scale = bn.gamma.val().reshape([1, c, 1, 1]) / variance.clone().add_scalar(bn.epsilon).sqrt();
    let out = centered * spread(scale) + spread(bn.beta.val().reshape([1, c, 1, 1]));
    update_running_stats(bn, mean.reshape([c]), variance.reshape([c]), b * h * w);
    out
}

/// A residual block: a Bottleneck (`conv1` 1×1, `conv2` 3×3, `conv3` 1×1) or a BasicBlock
/// (`conv1` and `conv2` 3×3, no `conv3`), each convolution followed by its BatchNorm.
#[derive(Module, Debug)]
pub struct Block {
    conv1: Conv2d,
    bn1: BatchNorm,
    conv2: Conv2d,
    bn2: BatchNorm,
    /// The Bottleneck's last 1×1 convolution and its BatchNorm; a BasicBlock has neither.
    /// (Two fields, not a pair, so that a Bottleneck's tensors keep the names runs saved before
    /// BasicBlocks existed: `blocks.N.conv3.weight`, `blocks.N.bn3.*`.)
    conv3: Option<Conv2d>,
    bn3: Option<BatchNorm>,
    downsample: Option<(Conv2d, BatchNorm)>,
}

impl Block {
    fn forward(&self, x: Tensor<4>, lowering: ConvLowering) -> Tensor<4> {
        let identity = match &self.downsample {
            Some((conv, bn)) => batch_norm(bn, convolve(conv, x.clone(), lowering), lowering),
            None => x.clone(),
        };
        let out = batch_norm_relu(&self.bn1, convolve(&self.conv1, x, lowering), None, lowering);
        match (&self.conv3, &self.bn3) {
            (Some(conv3), Some(bn3)) => {
                let out = batch_norm_relu(&self.bn2, convolve(&self.conv2, out, lowering), None, lowering);
                batch_norm_relu(bn3, convolve(conv3, out, lowering), Some(identity), lowering)
            }
            _ => batch_norm_relu(&self.bn2, convolve(&self.conv2, out, lowering), Some(identity), lowering),
        }
    }
}

#[derive(Module, Debug)]
pub struct ResNet {
    conv1: Conv2d,
    bn1: BatchNorm,
    blocks: Vec<Block>,
    #[module(skip)]
    feature_dim: usize,
    #[module(skip)]
    lowering: ConvLowering,
}

/// torchvision's BatchNorm2d epsilon.
const BN_EPS: f64 = 1e-5;

impl ResNet {
    /// Builds the model from checkpoint tensors; call [`Weights::finish`] afterwards.
    pub fn from_weights(c: &ResNetConfig, w: &Weights, device: &Device) -> ResNet {
        let mut blocks = Vec::new();
        let mut inplanes = c.width;
        for (stage, &n) in c.layers.iter().enumerate() {
            let planes = c.width << stage;
            // torchvision: `int(planes * (base_width / 64.)) * groups`, groups 1.
            let inner = planes * c.width_per_group / 64;
            for i in 0..n {
                let p = format!("layer{}.{i}", stage + 1);
                let stride = if i == 0 && stage > 0 { 2 } else { 1 };
                let out = planes * c.expansion();
                let downsample = (i == 0 && (stride != 1 || inplanes != out)).then(|| {
                    (
                        w.conv2d(
                            &format!("{p}.downsample.0"),
                            ConvSpec { d_in: inplanes, d_out: out, kernel: 1, stride, padding: 0 },
                            device,
                        ),
                        w.batch_norm(&format!("{p}.downsample.1"), out, BN_EPS, device),
                    )
                });
                let conv = |name: &str, d_in, d_out, kernel, stride| {
                    let padding = kernel / 2;
                    w.conv2d(&format!("{p}.{name}"), ConvSpec { d_in, d_out, kernel, stride, padding }, device)
                };
                let bn = |name: &str, channels| w.batch_norm(&format!("{p}.{name}"), channels, BN_EPS, device);
                blocks.push(match c.block {
                    BlockKind::Bottleneck => Block {
                        conv1: conv("conv1", inplanes, inner, 1, 1),
                        bn1: bn("bn1", inner),
                        conv2: conv("conv2", inner, inner, 3, stride),
                        bn2: bn("bn2", inner),
                        conv3: Some(conv("conv3", inner, out, 1, 1)),
                        bn3: Some(bn("bn3", out)),
                        downsample,
                    },
                    BlockKind::Basic => Block {
                        conv1: conv("conv1", inplanes, planes, 3, stride),
                        bn1: bn("bn1", planes),
                        conv2: conv("conv2", planes, planes, 3, 1),
                        bn2: bn("bn2", planes),
                        conv3: None,
                        bn3: None,
                        downsample,
                    },
                });
                inplanes = out;
            }
        }
        ResNet {
            conv1: w.conv2d("conv1", ConvSpec { d_in: 3, d_out: c.width, kernel: 7, stride: 2, padding: 3 }, device),
            bn1: w.batch_norm("bn1", c.width, BN_EPS, device),
            blocks,
            feature_dim: c.feature_dim(),
            lowering: ConvLowering::for_device(device),
        }
    }

    /// The same model with its convolutions computed by `lowering` (default: per device, see
    /// [`ConvLowering::for_device`]).
    pub fn with_conv_lowering(mut self, lowering: ConvLowering) -> ResNet {
        self.lowering = lowering;
        self
    }

    /// Tensors the feature extractor leaves out: the ImageNet classifier.
    pub const IGNORED: [&'static str; 1] = ["fc."];

    /// Loads a torchvision-layout state dict (safetensors, or torchvision's own `.pth`).
    pub fn load(path: &Path, c: &ResNetConfig, device: &Device) -> Result<ResNet> {
        Self::load_under(path, None, c, device)
    }

    /// [`ResNet::load`] of the tensors under `prefix` (an SSL checkpoint's encoder:
    /// [`Weights::under_prefix`]).
    pub fn load_under(path: &Path, prefix: Option<&str>, c: &ResNetConfig, device: &Device) -> Result<ResNet> {
        Weights::load_model(path, prefix, |w| ResNet::from_weights(c, w, device), |_| &Self::IGNORED)
    }

    pub fn feature_dim(&self) -> usize {
        self.feature_dim
    }

    /// Global-average-pooled features.
    ///
    /// # Shapes
    /// - `images`: `[batch, 3, height, width]` (normalised)
    /// - output: `[batch, feature_dim]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        let x = self.forward_grid(images);
        let [b, c, _, _] = x.dims();
        adaptive_avg_pool2d(x, [1, 1]).reshape([b, c])
    }

    /// The last stage's feature map, before pooling.
    ///
    /// # Shapes
    /// - `images`: `[batch, 3, height, width]` (normalised)
    /// - output: `[batch, feature_dim, height / 32, width / 32]` (rounded up)
    pub fn forward_grid(&self, images: Tensor<4>) -> Tensor<4> {
        let x = batch_norm_relu(&self.bn1, convolve(&self.conv1, images, self.lowering), None, self.lowering);
        // torchvision's `MaxPool2d(kernel_size=3, stride=2, padding=1)`.
        let mut x = super::host_max_pool::max_pool2d(x, 3, 2, 1);
        for block in &self.blocks {
            x = block.forward(x, self.lowering);
        }
        x
    }
}

#[cfg(test)]
mod tests {
    use burn::nn::conv::Conv2dConfig;
    use burn::nn::PaddingConfig2d;
    use burn::tensor::ops::PadMode;
    use burn::tensor::{Device, Distribution, Tensor};

    use super::{column_groups, convolve, im2col, zero_pad, ConvLowering, MAX_GROUP_COLUMNS};

    use crate::models::test_support::values;

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        crate::models::test_support::assert_close(got, want, 1e-4, what);
    }

    #[test]
    fn zero_pad_equals_burns_pad_and_passes_the_gradient_of_the_middle() {
        // Values and, on an autodiff device, the input's gradient (a weighted sum, so that each
        // position's weight shows where it landed).
        let device = Device::flex().autodiff();
        let x = Tensor::<4>::random([2, 3, 5, 4], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let want = x.clone().pad((2, 2, 2, 2), PadMode::Constant(0.0));
        let got = zero_pad(x.clone(), 2);
        assert_eq!(got.dims(), [2, 3, 9, 8]);
        assert_close(&values(got.clone()), &values(want.clone()), "values");
        let weights = Tensor::<4>::random([2, 3, 9, 8], Distribution::Normal(0.0, 1.0), &device);
        let grad = |t: Tensor<4>| values(x.grad(&(t * weights.clone()).sum().backward()).unwrap());
        assert_close(&grad(got), &grad(want), "gradient");
    }

    #[test]
    fn im2col_trains_as_burns_convolution() {
        // The weights' and the input's gradients, with the batch's columns in one group, in two
        // and in one per image, equal those through burn's kernel, with padding (3×3 at stride 2,
        // the 7×7 stem) and without (1×1).
        let device = Device::flex().autodiff();
        for (k, s, p) in [(1, 1, 0), (3, 2, 1), (7, 2, 3)] {
            let conv = Conv2dConfig::new([4, 3], [k, k])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .init(&device);
            let x = Tensor::<4>::random([4, 4, 11, 9], Distribution::Normal(0.0, 1.0), &device).require_grad();
            let want = conv.forward(x.clone());
            // A weighted sum as the loss, so that each output's weight shows in the gradients.
            let weights = Tensor::<4>::random(want.dims(), Distribution::Normal(0.0, 1.0), &device);
            let grads = |y: Tensor<4>| {
                let g = (y * weights.clone()).sum().backward();
                (conv.weight.val().grad(&g).unwrap(), x.grad(&g).unwrap())
            };
            let (want_w, want_x) = grads(want);
            for groups in [1, 2, 4] {
                let (got_w, got_x) = grads(im2col(&conv, x.clone(), p, groups));
                let what = format!("k {k} s {s} groups {groups}");
                assert_close(&values(got_w), &values(want_w.clone()), &format!("{what}: weights"));
                assert_close(&values(got_x), &values(want_x.clone()), &format!("{what}: input"));
            }
        }
    }

    #[test]
    fn the_cpu_training_paths_train_as_burns_convolution() {
        // In training on the CPU a convolution is `host_conv`'s operation, with the bias added
        // after it: output, weight and bias gradients, on images without a gradient (a model's
        // first convolution) and with one, equal those through burn's kernel. The shapes are
        // odd and the patches cross every border: the 7×7 stem at stride 2, 3×3 at strides 1
        // and 2, a 5×5 with less padding than its half-width, and 1×1.
        let device = Device::flex().autodiff();
        for (k, s, p, bias) in [(7, 2, 3, false), (3, 2, 1, true), (3, 1, 1, false), (5, 2, 1, true), (1, 1, 0, true)] {
            let conv = Conv2dConfig::new([3, 5], [k, k])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .with_bias(bias)
                .init(&device);
            let x = Tensor::<4>::random([3, 3, 11, 9], Distribution::Normal(0.0, 1.0), &device);
            let want = conv.forward(x.clone());
            let weights = Tensor::<4>::random(want.dims(), Distribution::Normal(0.0, 1.0), &device);
            let grads = |y: Tensor<4>| {
                let g = (y * weights.clone()).sum().backward();
                let bias = conv.bias.as_ref().map(|b| values(b.val().grad(&g).unwrap()));
                (values(conv.weight.val().grad(&g).unwrap()), bias)
            };
            let what = format!("k {k} s {s} p {p}");
            let got = convolve(&conv, x.clone(), ConvLowering::Native);
            assert_close(&values(got.clone()), &values(want.clone()), &format!("{what}: output"));
            let ((got_w, got_b), (want_w, want_b)) = (grads(got), grads(want));
            assert_close(&got_w, &want_w, &format!("{what}: weights"));
            assert_eq!(got_b.is_some(), bias);
            if let (Some(got_b), Some(want_b)) = (got_b, want_b) {
                assert_close(&got_b, &want_b, &format!("{what}: bias"));
            }
            // Images marked `require_grad` get their gradient: the same as burn's convolution
            // gives.
            let x = x.require_grad();
            let got =
                x.grad(&(convolve(&conv, x.clone(), ConvLowering::Native) * weights.clone()).sum().backward()).unwrap();
            let want = x.grad(&(conv.forward(x.clone()) * weights.clone()).sum().backward()).unwrap();
            assert_close(&values(got), &values(want), &format!("{what}: input gradient"));
        }
    }

    #[test]
    fn im2col_in_one_group_or_one_per_image_equals_burns_convolution() {
        // ResNet's kinds of convolution (1×1 and 3×3 at stride 1 and 2, the 7×7 stem), on an odd,
        // non-square batch of 3, in one group and in one per image, against burn's kernel.
        let device = Device::flex();
        for (k, s, p) in [(1, 1, 0), (1, 2, 0), (3, 1, 1), (3, 2, 1), (7, 2, 3)] {
            let conv = Conv2dConfig::new([5, 4], [k, k])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .init(&device);
            let x = Tensor::<4>::random([3, 5, 13, 10], Distribution::Normal(0.0, 1.0), &device);
            let want = conv.forward(x.clone());
            let want_dims = want.dims();
            let want = values(want);
            for groups in [1, 3] {
                let got = im2col(&conv, x.clone(), p, groups);
                let what = format!("k {k} s {s} groups {groups}");
                assert_eq!(got.dims(), want_dims, "{what}");
                assert_close(&values(got), &want, &what);
            }
        }
    }

    #[test]
    fn training_batch_norm_keeps_pytorchs_unbiased_running_variance() {
        // One training step of BatchNorm2d(3, momentum 0.1) from running (0, 1) on a batch of
        // 2×3×2×2: PyTorch's running_var is 0.9 + 0.1 · var_unbiased (n = 8 values a channel),
        // running_mean 0.1 · mean; with both lowerings, and the outputs alike.
        use super::{batch_norm, ConvLowering};
        use burn::module::Module;
        use burn::nn::BatchNormConfig;
        use burn::tensor::TensorData;
        let device = Device::default().autodiff();
        let values: Vec<f32> = (0..24).map(|i| ((i * 7) % 11) as f32 * 0.5 - 2.0).collect();
        let (mut want_mean, mut want_var) = (Vec::new(), Vec::new());
        for ch in 0..3 {
            let v: Vec<f64> = (0..2)
                .flat_map(|b| (0..4).map(move |k| (b * 12 + ch * 4 + k) as usize))
                .map(|i| values[i] as f64)
                .collect();
            let mean = v.iter().sum::<f64>() / 8.0;
            let unbiased = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 7.0;
            want_mean.push(0.1 * mean);
            want_var.push(0.9 + 0.1 * unbiased);
        }
        let mut outputs = Vec::new();
        for lowering in [ConvLowering::Native, ConvLowering::Im2col] {
            let bn = BatchNormConfig::new(3).init(&device);
            let x = Tensor::<4>::from_data(TensorData::new(values.clone(), [2, 3, 2, 2]), &device);
            outputs.push(batch_norm(&bn, x, lowering).into_data().try_to_vec::<f32>().unwrap());
            let bn = bn.valid();
            let got_mean = bn.running_mean.value().into_data().try_to_vec::<f32>().unwrap();
            let got_var = bn.running_var.value().into_data().try_to_vec::<f32>().unwrap();
            for ch in 0..3 {
                assert!((got_mean[ch] as f64 - want_mean[ch]).abs() < 1e-6, "{lowering:?} mean {ch}: {got_mean:?}");
                assert!(
                    (got_var[ch] as f64 - want_var[ch]).abs() < 1e-5,
                    "{lowering:?} var {ch}: {got_var:?} {want_var:?}"
                );
            }
        }
        for (a, b) in outputs[0].iter().zip(&outputs[1]) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
    }

    #[test]
    fn column_groups_are_the_fewest_whole_image_groups_within_the_limit() {
        // ResNet-50 at batch 128: the stem's 112² pixels per image, layer 1's 56², layer 4's 7².
        assert_eq!(column_groups(128, 112 * 112), 128);
        assert_eq!(column_groups(128, 56 * 56), 32);
        assert_eq!(column_groups(128, 28 * 28), 8);
        assert_eq!(column_groups(128, 7 * 7), 1);
        // Groups divide the batch: 6 images of 4,000 pixels fit 4 a group but go 3 a group.
        assert_eq!(column_groups(6, 4_000), 2);
        // An image larger than the limit on its own: one group per image.
        assert_eq!(column_groups(5, MAX_GROUP_COLUMNS + 1), 5);
        for (n, pixels) in [(128, 3136), (6, 4_000), (7, 3_000), (1, 50_000)] {
            let g = column_groups(n, pixels);
            assert_eq!(n % g, 0);
            assert!((n / g) * pixels <= MAX_GROUP_COLUMNS || g == n);
        }
    }
}
