//! BatchNorm on the host (burn's CPU backend), in training and in inference.
//!
//! Training ([`train`], under autodiff): one autodiff operation whose forward and backward passes
//! are each a few fused loops over the `[batch, C, H, W]` values. burn's own `batch_norm_train` on
//! the CPU is a composition of generic operations (the batch and channel axes swapped and copied,
//! a mean, a subtraction, a product, another copy and mean, then the affine map; about twice as
//! many in the backward pass), each allocating its output: on the tiny training preset, leaving
//! the ResNet's 17 BatchNorms out took a third off its forward pass and a fifth off its backward
//! pass (12.2 → 7.9 and 13.2 → 10.6 ms a step on the 2-core development machine); with this
//! operation they took 12.2 → 10.9–11.0 and 14.0 → 12.0–12.3 ms (medians of 60 steps, alternating
//! runs). The values are the same up to rounding: the channel sums here are accumulated in `f64`
//! (see the tests against burn's operation).
//!
//! Inference ([`inference`], without autodiff): the running statistics' affine map and what a
//! block does next (the residual sum; ResNet's ReLU or FBNet's hard-swish, [`After`]) in one pass
//! over the values, in the tensor's own buffer, with burn's arithmetic value for value (the same
//! bits). burn's `batch_norm` is four
//! passes over the tensor (a subtraction, a division, a product and a sum, each broadcasting a
//! `[C]` parameter), and the residual sum and the ReLU one more each.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::BatchNorm;
use burn::tensor::activation::{hard_swish as burn_hard_swish, relu as burn_relu};
use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use super::activation::{in_widest_vectors, Kernel};
use super::host_autodiff::{contiguous, primitive};

/// The output of [`train`]: the normalised values (on the autodiff device, differentiable with
/// respect to the input, `gamma` and `beta`) and the batch's per-channel mean and biased
/// variance (what a training path feeds its running statistics).
pub struct BatchNormTrain {
    pub output: Tensor<4>,
    pub mean: Vec<f32>,
    pub biased_variance: Vec<f32>,
}

/// `(x − mean) / sqrt(variance + epsilon) · gamma + beta` over each channel of `x`
/// (`[batch, C, H, W]`) with the batch's statistics, when `x`, `gamma` and `beta` are `f32`
/// tensors of burn's CPU backend under autodiff without gradient checkpointing (what
/// `Device::flex().autodiff()` makes); `None` otherwise, with nothing consumed, so that the
/// caller takes burn's operation.
pub fn train(x: &Tensor<4>, gamma: &Tensor<1>, beta: &Tensor<1>, epsilon: f64) -> Option<BatchNormTrain> {
    let (x4, gamma, beta) = (primitive(x)?, primitive(gamma)?, primitive(beta)?);
    let [n, c, h, w] = x.dims();
    let shape = Shape { n, c, hw: h * w };
    let input = contiguous(x4.primitive());
    let values = input.as_slice::<f32>().expect("contiguous");
    let gamma_values = contiguous(gamma.primitive()).as_slice::<f32>().expect("contiguous").to_vec();
    let beta_values = contiguous(beta.primitive()).as_slice::<f32>().expect("contiguous").to_vec();
    let (mean, variance) = moments(values, shape);
    let inv_std: Vec<f32> = variance.iter().map(|v| 1.0 / (*v as f64 + epsilon).sqrt() as f32).collect();
    let out = normalise(values, shape, &mean, &inv_std, &gamma_values, &beta_values);
    let out = FlexTensor::from_data(TensorData::new(out, [n, c, h, w]));

    let nodes = [x4.node(), gamma.node(), beta.node()];
    let output = match HostBatchNorm.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let state = State { input, dims: [n, c, h, w], mean: mean.clone(), inv_std, gamma: gamma_values };
            prep.finish(state, out)
        }
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(BatchNormTrain { output: Tensor::from_primitive::<Autodiff<Flex>>(output), mean, biased_variance: variance })
}

/// What follows an inference BatchNorm (and its residual sum) in the same pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    Nothing,
    /// burn's `relu` (NaN kept, as in PyTorch): ResNet's blocks.
    Relu,
    /// burn's `hard_swish`, `y · clamp(y/6 + 1/2, 0, 1)`: FBNet's blocks.
    HardSwish,
}

/// `after(batch_norm(x) + residual?)` with `bn`'s running statistics (inference): on burn's CPU
/// backend without autodiff, when every tensor is `f32` and `residual` has `x`'s shape, one pass
/// in `x`'s buffer (copied first only if shared or strided) on rayon's threads, each value
/// `((x − mean) / sqrt(variance + ε)) · gamma + beta`, then `+ residual`, then the activation, in
/// burn's order and precision, so the bits are those of burn's `batch_norm`, `+`, `relu` and
/// `hard_swish` (tested); elsewhere those operations.
///
/// # Shapes
/// - `x`, `residual`: `[batch, C, H, W]` → `[batch, C, H, W]`
pub fn inference(bn: &BatchNorm, x: Tensor<4>, residual: Option<Tensor<4>>, after: After) -> Tensor<4> {
    let device = x.device();
    let on_host = !device.is_autodiff()
        && device == Device::flex()
        && x.dtype() == DType::F32
        && residual.as_ref().is_none_or(|r| r.dims() == x.dims() && r.dtype() == DType::F32);
    let Some(params) = on_host.then(|| Affine::of(bn)).flatten() else {
        let mut y = bn.forward(x);
        if let Some(r) = residual {
            y = y + r;
        }
        return after.burns(y);
    };
    let [n, c, h, w] = x.dims();
    let shape = Shape { n, c, hw: h * w };
    let mut t = x.try_into_primitive::<Flex>().expect("a float tensor on the flex device");
    if !t.is_contiguous() {
        t = t.to_contiguous();
    }
    let residual =
        residual.map(|r| contiguous(&r.try_into_primitive::<Flex>().expect("a float tensor on the flex device")));
    let (start, end) = t.layout().contiguous_offsets().expect("contiguous");
    let values = &mut t.storage_mut::<f32>()[start..end];
    let residual = residual.as_ref().map(|r| r.as_slice::<f32>().expect("contiguous"));
    affine_in_place(values, residual, shape, &params.per_channel(), after);
    Tensor::from_primitive::<Flex>(t)
}

impl After {
    /// burn's operation on `y`.
    pub fn burns<const D: usize>(self, y: Tensor<D>) -> Tensor<D> {
        match self {
            After::Nothing => y,
            After::Relu => burn_relu(y),
            After::HardSwish => burn_hard_swish(y),
        }
    }

    /// The operation on one value, as burn-flex computes it: its ReLU keeps NaN; its hard sigmoid
    /// is `(α·y + β).clamp(0, 1)` with `α = 1/6` and `β = 1/2` rounded to `f32`, then `y ·` it.
    #[inline(always)]
    fn value(self, y: f32) -> f32 {
        const ALPHA: f32 = (1.0f64 / 6.0) as f32;
        match self {
            After::Nothing => y,
            After::Relu if y.is_nan() || y > 0.0 => y,
            After::Relu => 0.0,
            After::HardSwish => y * (ALPHA * y + 0.5).clamp(0.0, 1.0),
        }
    }
}

/// An inference BatchNorm's parameters, per channel.
struct Affine {
    mean: Vec<f32>,
    variance: Vec<f32>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
    epsilon: f32,
}

impl Affine {
    /// `bn`'s parameters, when they are `f32` values.
    fn of(bn: &BatchNorm) -> Option<Affine> {
        let values = |t: Tensor<1>| t.into_data().try_into_vec::<f32>().ok();
        Some(Affine {
            mean: values(bn.running_mean.value())?,
            variance: values(bn.running_var.value())?,
            gamma: values(bn.gamma.val())?,
            beta: values(bn.beta.val())?,
            // burn adds ε as an `f32` scalar.
            epsilon: bn.epsilon as f32,
        })
    }

    /// `[mean, sqrt(variance + ε), gamma, beta]` of each channel, in `f32` as burn computes them.
    fn per_channel(&self) -> Vec<[f32; 4]> {
        (0..self.mean.len())
            .map(|ch| [self.mean[ch], (self.variance[ch] + self.epsilon).sqrt(), self.gamma[ch], self.beta[ch]])
            .collect()
    }
}

/// [`inference`]'s pass: each `H·W` plane of `values` with its channel's parameters, plus the
/// same plane of `residual`, then `after`; groups of whole planes on rayon's threads.
fn affine_in_place(values: &mut [f32], residual: Option<&[f32]>, shape: Shape, params: &[[f32; 4]], after: After) {
    let hw = shape.hw.max(1);
    let group = GROUP_VALUES.div_ceil(hw) * hw;
    let run = |(g, values): (usize, &mut [f32])| {
        let first = g * group;
        for (i, plane) in values.chunks_mut(hw).enumerate() {
            let at = first + i * hw;
            let p = params[(at / hw) % shape.c];
            let residual = residual.map(|r| &r[at..at + plane.len()]);
            in_widest_vectors(AffinePlane { plane, residual, p, after });
        }
    };
    if values.len() <= group {
        run((0, values));
    } else {
        values.par_chunks_mut(group).enumerate().for_each(run);
    }
}

/// One plane of [`affine_in_place`], compiled for the widest vectors the CPU has (no fused
/// multiply-add: Rust does not contract `a * b + c`, so every width gives the same bits).
struct AffinePlane<'a> {
    plane: &'a mut [f32],
    residual: Option<&'a [f32]>,
    p: [f32; 4],
    after: After,
}

impl Kernel for AffinePlane<'_> {
    #[inline(always)]
    fn run(self) {
        let [mean, std, gamma, beta] = self.p;
        let norm = |x: f32| (x - mean) / std * gamma + beta;
        // One loop per case, so that each compiles to straight vector code.
        macro_rules! pass {
            ($after:expr) => {
                match self.residual {
                    Some(r) => self.plane.iter_mut().zip(r).for_each(|(x, r)| *x = $after.value(norm(*x) + r)),
                    None => self.plane.iter_mut().for_each(|x| *x = $after.value(norm(*x))),
                }
            };
        }
        match self.after {
            After::Nothing => pass!(After::Nothing),
            After::Relu => pass!(After::Relu),
            After::HardSwish => pass!(After::HardSwish),
        }
    }
}

/// A `[batch, C, H·W]` layout.
#[derive(Debug, Clone, Copy)]
struct Shape {
    n: usize,
    c: usize,
    hw: usize,
}

impl Shape {
    fn count(&self) -> usize {
        self.n * self.hw
    }
}

/// The values of one group of whole images: the unit of the parallel loops (a group is one task)
/// and of the channel sums' order (each group's sums are added in group order, so the result does
/// not depend on how many threads ran the groups). A loop over fewer values runs on the calling
/// thread.
const GROUP_VALUES: usize = 65_536;

/// The values of a group of whole images (at least one image).
fn group_len(shape: Shape) -> usize {
    let image = (shape.c * shape.hw).max(1);
    GROUP_VALUES.div_ceil(image) * image
}

/// `f` on each group of whole images of `a` and `b` (the same layout), in parallel where there are
/// several groups; the groups' results in order.
fn per_group<T: Send>(a: &[f32], b: &[f32], shape: Shape, f: impl Fn(&[f32], &[f32]) -> T + Sync + Send) -> Vec<T> {
    let group = group_len(shape);
    if a.len() <= group {
        return vec![f(a, b)];
    }
    a.par_chunks(group).zip(b.par_chunks(group)).map(|(a, b)| f(a, b)).collect()
}

/// Per channel, `Σ f(channel, a_i, b_i)` over that channel's values in every image, accumulated
/// in `f64` group by group. Runs of at least [`SHORT_RUN`] values are each summed in `f32` (eight
/// lanes, which the compiler vectorises); shorter runs (the last stages' 2×2 and 1×1 maps, where a
/// loop per run would cost more than its values) are summed position by position over the images,
/// each image one loop over all its values.
fn channel_sums(a: &[f32], b: &[f32], shape: Shape, f: impl Fn(usize, f32, f32) -> f32 + Sync + Send) -> Vec<f64> {
    let (c, hw) = (shape.c, shape.hw);
    let image = c * hw;
    let channels: Vec<usize> = if hw < SHORT_RUN { (0..image).map(|i| i / hw.max(1)).collect() } else { Vec::new() };
    let groups = per_group(a, b, shape, |a, b| {
        let mut sums = vec![0f64; c];
        if hw < SHORT_RUN {
            let mut positions = vec![0f64; image];
            for (a, b) in a.chunks_exact(image).zip(b.chunks_exact(image)) {
                for (((p, a), b), ch) in positions.iter_mut().zip(a).zip(b).zip(&channels) {
                    *p += f(*ch, *a, *b) as f64;
                }
            }
            for (p, ch) in positions.iter().zip(&channels) {
                sums[*ch] += p;
            }
        } else {
            for (a, b) in a.chunks_exact(image).zip(b.chunks_exact(image)) {
                for (ch, sum) in sums.iter_mut().enumerate() {
                    let run = ch * hw..(ch + 1) * hw;
                    *sum += lane_sum(&a[run.clone()], &b[run], |a, b| f(ch, a, b)) as f64;
                }
            }
        }
        sums
    });
    let mut total = vec![0f64; c];
    for sums in groups {
        for (t, s) in total.iter_mut().zip(sums) {
            *t += s;
        }
    }
    total
}

/// Runs of `H·W` values shorter than this are handled position by position (see
/// [`channel_sums`], [`map_values`]).
const SHORT_RUN: usize = 16;

/// `Σ f(a_i, b_i)` in eight `f32` lanes, then the lanes summed.
#[inline(always)]
fn lane_sum(a: &[f32], b: &[f32], f: impl Fn(f32, f32) -> f32) -> f32 {
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(a, b)| f(*a, *b)).sum();
    if a.len() < 8 {
        return tail;
    }
    let mut lanes = [0f32; 8];
    for (a, b) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += f(a[l], b[l]);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Each channel's mean and biased variance (two passes: the mean, then the squared deviations
/// from it).
fn moments(x: &[f32], shape: Shape) -> (Vec<f32>, Vec<f32>) {
    let count = shape.count() as f64;
    let mean: Vec<f32> = channel_sums(x, x, shape, |_, a, _| a).into_iter().map(|s| (s / count) as f32).collect();
    let variance = channel_sums(x, x, shape, |ch, a, _| (a - mean[ch]) * (a - mean[ch]));
    (mean, variance.into_iter().map(|s| (s / count) as f32).collect())
}

/// A new tensor of `a`'s layout with `out_i = f(p_i, a_i, b_i)`, where `p_i` holds the
/// per-channel parameters (`params[channel]`) of value `i`'s channel; in parallel over groups of
/// images. With runs of [`SHORT_RUN`] values or more, each run is one loop with its channel's
/// parameters; with shorter runs the parameters are first spread over an image's positions, and
/// each image is one loop.
fn map_values<P: Copy + Send + Sync>(
    a: &[f32],
    b: &[f32],
    shape: Shape,
    params: &[P],
    f: impl Fn(P, f32, f32) -> f32 + Sync + Send,
) -> Vec<f32> {
    let mut out = vec![0f32; a.len()];
    let (c, hw) = (shape.c, shape.hw);
    let image = c * hw;
    let spread: Vec<P> = if hw < SHORT_RUN { (0..image).map(|i| params[i / hw.max(1)]).collect() } else { Vec::new() };
    let run = |(o, (a, b)): (&mut [f32], (&[f32], &[f32]))| {
        for (o, (a, b)) in o.chunks_exact_mut(image).zip(a.chunks_exact(image).zip(b.chunks_exact(image))) {
            if hw < SHORT_RUN {
                for (((o, a), b), p) in o.iter_mut().zip(a).zip(b).zip(&spread) {
                    *o = f(*p, *a, *b);
                }
                continue;
            }
            for (ch, p) in params.iter().enumerate() {
                let r = ch * hw..(ch + 1) * hw;
                for ((o, a), b) in o[r.clone()].iter_mut().zip(&a[r.clone()]).zip(&b[r]) {
                    *o = f(*p, *a, *b);
                }
            }
        }
    };
    let group = group_len(shape);
    if a.len() <= group {
        run((&mut out, (a, b)));
    } else {
        out.par_chunks_mut(group).zip(a.par_chunks(group).zip(b.par_chunks(group))).for_each(run);
    }
    out
}

/// `(x − mean) · inv_std · gamma + beta`, channel by channel.
fn normalise(x: &[f32], shape: Shape, mean: &[f32], inv_std: &[f32], gamma: &[f32], beta: &[f32]) -> Vec<f32> {
    let params: Vec<[f32; 3]> = (0..shape.c).map(|ch| [mean[ch], inv_std[ch] * gamma[ch], beta[ch]]).collect();
    map_values(x, x, shape, &params, |[m, scale, shift], x, _| (x - m) * scale + shift)
}

/// The backward step of [`train`].
#[derive(Debug)]
struct HostBatchNorm;

/// What the backward pass needs: the input (contiguous), its batch statistics and `gamma`.
#[derive(Debug, Clone)]
struct State {
    input: FlexTensor,
    dims: [usize; 4],
    mean: Vec<f32>,
    inv_std: Vec<f32>,
    gamma: Vec<f32>,
}

impl Backward<Flex, 3> for HostBatchNorm {
    type State = State;

    fn backward(self, ops: Ops<State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_gamma, node_beta] = ops.parents;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let State { input, dims, mean, inv_std, gamma } = ops.state;
        let shape = Shape { n: dims[0], c: dims[1], hw: dims[2] * dims[3] };
        let (x, g) = (input.as_slice::<f32>().expect("contiguous"), grad.as_slice::<f32>().expect("contiguous"));
        let gradients = gradients(x, g, shape, &mean, &inv_std, &gamma, node_x.is_some());
        let tensor = |v: Vec<f32>, dims: &[usize]| FlexTensor::from_data(TensorData::new(v, dims.to_vec()));
        if let (Some(node), Some(x_grad)) = (node_x, gradients.x) {
            grads.register::<Flex>(node.id, tensor(x_grad, &dims));
        }
        if let Some(node) = node_gamma {
            grads.register::<Flex>(node.id, tensor(gradients.gamma, &[shape.c]));
        }
        if let Some(node) = node_beta {
            grads.register::<Flex>(node.id, tensor(gradients.beta, &[shape.c]));
        }
    }
}

/// The gradients of [`train`]'s output with respect to its input (when `with_x`), `gamma` and
/// `beta`, given the output's gradient `g`.
struct Grads {
    x: Option<Vec<f32>>,
    gamma: Vec<f32>,
    beta: Vec<f32>,
}

/// With `x̂ = (x − mean)·inv_std`: `∂beta = Σ g`, `∂gamma = Σ g·x̂` (per channel) and
/// `∂x = gamma·inv_std·(g − ∂beta/count − x̂·∂gamma/count)`.
fn gradients(x: &[f32], g: &[f32], shape: Shape, mean: &[f32], inv_std: &[f32], gamma: &[f32], with_x: bool) -> Grads {
    let beta: Vec<f32> = channel_sums(g, g, shape, |_, g, _| g).into_iter().map(|s| s as f32).collect();
    let gamma_grad: Vec<f32> = channel_sums(g, x, shape, |ch, g, x| g * (x - mean[ch]))
        .into_iter()
        .zip(inv_std)
        .map(|(s, i)| (s * *i as f64) as f32)
        .collect();
    let count = shape.count() as f32;
    let x_grad = with_x.then(|| {
        // ∂x = gamma·inv_std·(g − ∂beta/count − (x − mean)·inv_std·∂gamma/count).
        let params: Vec<[f32; 4]> = (0..shape.c)
            .map(|ch| [gamma[ch] * inv_std[ch], beta[ch] / count, inv_std[ch] * gamma_grad[ch] / count, mean[ch]])
            .collect();
        map_values(x, g, shape, &params, |[scale, shift, slope, m], x, g| scale * (g - shift - (x - m) * slope))
    });
    Grads { x: x_grad, gamma: gamma_grad, beta }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution, Tensor};

    use crate::models::test_support::{assert_close, bits, values};

    /// The output, the statistics and the gradients of the input, `gamma` and `beta` (of a
    /// weighted sum of the output, so that every position's gradient differs) equal those of
    /// burn's `batch_norm_train`: runs of `H·W` shorter and longer than the eight lanes and
    /// `SHORT_RUN`, one value per channel and image, a strided input, a shifted input (mean ≫
    /// spread), inputs of several groups.
    #[test]
    fn trains_as_burns_batch_norm() {
        let device = Device::flex().autodiff();
        for (dims, transposed, shift) in [
            ([4, 3, 5, 6], false, 0.0),
            ([3, 5, 1, 1], false, 0.0),
            ([6, 3, 2, 2], false, 0.0),
            ([2, 4, 3, 7], true, 0.0),
            ([5, 2, 4, 4], false, 40.0),
            // Several groups of images (`GROUP_VALUES`), with long runs and with short ones.
            ([40, 8, 16, 16], false, 0.0),
            ([300, 64, 2, 2], false, 0.0),
        ] {
            let [n, c, h, w] = dims;
            let base = Tensor::<4>::random(
                if transposed { [n, c, w, h] } else { dims },
                Distribution::Normal(shift, 2.0),
                &device,
            );
            let x = if transposed { base.swap_dims(2, 3) } else { base }.detach().require_grad();
            let gamma = Tensor::<1>::random([c], Distribution::Normal(1.0, 0.5), &device).require_grad();
            let beta = Tensor::<1>::random([c], Distribution::Normal(0.0, 0.5), &device).require_grad();
            let weights = Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &device);
            let want = burn::tensor::module::batch_norm_train(x.clone(), gamma.clone(), beta.clone(), 1e-5);
            let got = super::train(&x, &gamma, &beta, 1e-5).expect("the host path on a flex autodiff device");
            let what = format!("{dims:?} transposed {transposed} shift {shift}");
            assert_close(&values(got.output.clone()), &values(want.output.clone()), 1e-5, &format!("output {what}"));
            assert_close(&got.mean, &values(want.mean), 1e-5, &format!("mean {what}"));
            assert_close(&got.biased_variance, &values(want.variance), 1e-4, &format!("variance {what}"));
            let gradients = |out: Tensor<4>| {
                let g = (out * weights.clone()).sum().backward();
                [x.grad(&g).map(values), gamma.grad(&g).map(values), beta.grad(&g).map(values)]
            };
            for (name, (a, b)) in
                ["x", "gamma", "beta"].iter().zip(gradients(got.output).into_iter().zip(gradients(want.output)))
            {
                assert_close(
                    &a.expect("a gradient"),
                    &b.expect("a gradient"),
                    1e-4,
                    &format!("{name} gradient {what}"),
                );
            }
        }
    }

    /// Off burn's CPU backend under autodiff (here: without autodiff), the host path declines,
    /// and the caller takes burn's operation.
    #[test]
    fn declines_tensors_outside_flex_autodiff() {
        let device = Device::flex();
        let x = Tensor::<4>::random([2, 3, 2, 2], Distribution::Normal(0.0, 1.0), &device);
        let (gamma, beta) = (Tensor::<1>::ones([3], &device), Tensor::<1>::zeros([3], &device));
        assert!(super::train(&x, &gamma, &beta, 1e-5).is_none());
    }

    /// A BatchNorm of `c` channels with random affine parameters and running statistics (the
    /// variance positive, some of it below ε's scale).
    fn random_inference_norm(c: usize, device: &Device) -> burn::nn::BatchNorm {
        use burn::module::{Param, RunningState};
        let mut bn = burn::nn::BatchNormConfig::new(c).init(device);
        let random = |mean, std| Tensor::<1>::random([c], Distribution::Normal(mean, std), device);
        bn.gamma = Param::from_tensor(random(1.0, 0.5));
        bn.beta = Param::from_tensor(random(0.0, 0.5));
        bn.running_mean = RunningState::new(random(0.0, 2.0));
        bn.running_var = RunningState::new(random(0.0, 1.0).abs() + 1e-6);
        bn
    }

    /// Inference on the host gives burn's `batch_norm` (then `+ residual`, then `relu` or
    /// `hard_swish`) bit for bit: with and without a residual and each activation, planes of one value, short and long ones,
    /// several groups of planes (`GROUP_VALUES`), a strided input and residual, an input whose
    /// buffer another tensor shares (left as it was), NaN and ±0 among the values.
    #[test]
    fn inference_gives_burns_bits() {
        let device = Device::flex();
        for (dims, transposed) in [
            ([2, 3, 4, 5], false),
            ([3, 7, 1, 1], false),
            ([2, 4, 3, 6], true),
            ([4, 16, 40, 40], false),
            ([64, 40, 5, 7], true),
        ] {
            let [n, c, h, w] = dims;
            let bn = random_inference_norm(c, &device);
            let random = |std| {
                let t = Tensor::<4>::random(
                    if transposed { [n, c, w, h] } else { dims },
                    Distribution::Normal(0.0, std),
                    &device,
                );
                if transposed {
                    t.swap_dims(2, 3)
                } else {
                    t
                }
            };
            let mut x_values = values(random(2.0));
            x_values[0] = f32::NAN;
            x_values[1] = -0.0;
            x_values[2] = 0.0;
            // A strided input (a transposed view, copied by the host path) as well as contiguous ones.
            let x = if transposed {
                Tensor::<4>::from_data(burn::tensor::TensorData::new(x_values, [n, c, w, h]), &device).swap_dims(2, 3)
            } else {
                Tensor::<4>::from_data(burn::tensor::TensorData::new(x_values, dims), &device)
            };
            let residual = random(1.0);
            for (with_residual, after) in [false, true]
                .into_iter()
                .flat_map(|r| [super::After::Nothing, super::After::Relu, super::After::HardSwish].map(move |a| (r, a)))
            {
                let r = with_residual.then(|| residual.clone());
                let mut want = bn.forward(x.clone());
                if let Some(r) = r.clone() {
                    want = want + r;
                }
                want = match after {
                    super::After::Nothing => want,
                    super::After::Relu => burn::tensor::activation::relu(want),
                    super::After::HardSwish => burn::tensor::activation::hard_swish(want),
                };
                let before = bits(x.clone());
                // `x` stays alive: its buffer is shared, so the host path writes a copy.
                let got = super::inference(&bn, x.clone(), r, after);
                assert_eq!(bits(x.clone()), before, "{dims:?}: the shared input is unchanged");
                assert_eq!(
                    bits(got),
                    bits(want),
                    "{dims:?} transposed {transposed} residual {with_residual} {after:?}"
                );
            }
        }
    }

    /// The host pass writes into the input's own buffer when nothing else holds it, and the values
    /// are those of a fresh pass on a shared copy.
    #[test]
    fn inference_reuses_an_unshared_buffer() {
        let device = Device::flex();
        let bn = random_inference_norm(3, &device);
        let data = Tensor::<4>::random([2, 3, 4, 4], Distribution::Normal(0.0, 1.0), &device).into_data();
        let shared = Tensor::<4>::from_data(data.clone(), &device);
        let want = bits(super::inference(&bn, shared.clone(), None, super::After::Relu));
        let x = Tensor::<4>::from_data(data, &device);
        let buffer =
            |t: &Tensor<4>| t.clone().try_into_primitive::<super::Flex>().expect("flex").bytes().as_ptr() as usize;
        let at = buffer(&x);
        let got = super::inference(&bn, x, None, super::After::Relu);
        assert_eq!(buffer(&got), at, "written in place");
        assert_eq!(bits(got), want);
    }

    /// Under autodiff (as on any other device) the result is burn's operations' (`bn.forward`, the
    /// sum, `relu` or `hard_swish`), and gradients flow through it.
    #[test]
    fn inference_elsewhere_takes_burns_operations() {
        let device = Device::flex().autodiff();
        let bn = random_inference_norm(3, &device);
        let x = Tensor::<4>::random([2, 3, 2, 2], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let r = Tensor::<4>::random([2, 3, 2, 2], Distribution::Normal(0.0, 1.0), &device);
        let want = burn::tensor::activation::relu(bn.forward(x.clone()) + r.clone());
        let got = super::inference(&bn, x.clone(), Some(r), super::After::Relu);
        assert_eq!(bits(got.clone()), bits(want));
        assert!(x.grad(&got.sum().backward()).is_some(), "differentiable");
        let want = burn::tensor::activation::hard_swish(bn.forward(x.clone()));
        let got = super::inference(&bn, x.clone(), None, super::After::HardSwish);
        assert_eq!(bits(got.clone()), bits(want));
        assert!(x.grad(&got.sum().backward()).is_some(), "differentiable");
    }

    /// Timing probe (not a test of anything): `cargo test --release --lib host_batch_norm::tests::probe -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn probe() {
        let device = Device::flex().autodiff();
        for dims in [[64, 8, 16, 16], [64, 8, 8, 8], [64, 32, 8, 8], [64, 16, 4, 4], [64, 256, 1, 1]] {
            let x = Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &device).require_grad();
            let gamma = Tensor::<1>::ones([dims[1]], &device).require_grad();
            let beta = Tensor::<1>::zeros([dims[1]], &device).require_grad();
            let w = Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &device);
            for host in [true, false, true, false] {
                let t = std::time::Instant::now();
                for _ in 0..200 {
                    let out = if host {
                        super::train(&x, &gamma, &beta, 1e-5).unwrap().output
                    } else {
                        burn::tensor::module::batch_norm_train(x.clone(), gamma.clone(), beta.clone(), 1e-5).output
                    };
                    let g = (out * w.clone()).sum().backward();
                    let _ = x.grad(&g);
                }
                eprintln!("{dims:?} host {host}: {:.1} us", t.elapsed().as_secs_f64() * 1e6 / 200.0);
            }
        }
    }
}
