//! A convolution in training on the host (burn's CPU backend under autodiff) as one autodiff
//! operation: the batch's images are taken in fixed groups; a group's patches form one
//! `[C·k·k, images·Ho·Wo]` matrix, and each of the three products (the output, the weights'
//! gradient, the patches' gradient) is one matrix product per group, in parallel over the groups.
//! burn-flex convolves image by image, one small product each with its operands packed anew, and
//! takes the weights' gradient as a convolution over the batch axis (for the tiny training
//! preset's 7×7 stem, 9.8 of the 13.4 ms its forward and backward passes took); a
//! `[batch·Ho·Wo, C·k·k]` patch matrix built once for the whole batch (9.6 MB for that stem at
//! batch 64) took it to 3.9 ms, and this operation to 1.9–2.1 ms. A group's patches are built
//! again in the backward pass rather than kept, and stay in the cache. Forward and backward at
//! batch 64 on the 2-core development machine, against burn's kernel: 8 → 8 channels 3×3 at 8×8
//! 0.89 → 0.38 ms, 16 → 16 3×3 at stride 2 0.75 → 0.33 ms, 32 → 64 1×1 at stride 2 0.92 → 0.23
//! ms, 128 → 64 1×1 at 2×2 0.75 → 0.22 ms (the `probe` test prints them).
//!
//! Without autodiff (inference) each image is a group of its own, so that its output does not
//! depend on the batch; ResNet-50's forward pass at 224 px, batch 16, went from 10.9–11.1 images/s
//! with burn's convolution to 12.8–13.4 (`examples/resnet_bench`, 3 alternating runs).
//!
//! The weights' gradient sums the groups' products in group order, so it does not depend on the
//! number of threads. Only what ResNet needs: a square kernel and stride, the same padding on
//! every side, no dilation, groups or bias (the caller takes burn's convolution otherwise).

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::host_autodiff::{contiguous, primitive, product};

/// `x` (`[batch, C, H, W]`) convolved with `weight` (`[out, C, k, k]`) at stride `stride`
/// with `padding` zeros on each side, when both are `f32` tensors of burn's CPU backend, under
/// autodiff (`Device::flex().autodiff()`: training, an EMA teacher's forward pass) or without
/// (`Device::flex()`: inference, one image per group); `None` otherwise, so that the caller takes
/// burn's convolution.
pub fn conv2d(x: &Tensor<4>, weight: &Tensor<4>, stride: usize, padding: usize) -> Option<Tensor<4>> {
    let [n, c, h, w] = x.dims();
    let [o, wc, k, kw] = weight.dims();
    if wc != c || kw != k || stride == 0 || h + 2 * padding < k || w + 2 * padding < k {
        return None;
    }
    let geo = Geometry::new(n, c, h, w, o, k, stride, padding);
    if let (Ok(xp), Ok(wp)) = (x.clone().try_into_primitive::<Flex>(), weight.clone().try_into_primitive::<Flex>()) {
        if xp.dtype() != DType::F32 || wp.dtype() != DType::F32 {
            return None;
        }
        let (input, weights) = (contiguous(&xp), contiguous(&wp));
        // One image per group: an image's output is then the same in any batch (the product's
        // blocking depends on its width), as with burn's convolution, image by image.
        let out = forward(
            input.as_slice::<f32>().expect("contiguous"),
            weights.as_slice::<f32>().expect("contiguous"),
            geo,
            1,
        );
        return Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(
            out,
            [n, o, geo.ho, geo.wo],
        ))));
    }
    let (xa, wa) = (primitive(x)?, primitive(weight)?);
    let input = contiguous(xa.primitive());
    let weights = contiguous(wa.primitive()).as_slice::<f32>().expect("contiguous").to_vec();
    let out = forward(input.as_slice::<f32>().expect("contiguous"), &weights, geo, geo.images_per_group());
    let out = FlexTensor::from_data(TensorData::new(out, [n, o, geo.ho, geo.wo]));
    let nodes = [xa.node(), wa.node()];
    let output = match HostConv.prepare::<NoCheckpointing>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(State { input, weights, geo }, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(Tensor::from_primitive::<Autodiff<Flex>>(output))
}

/// A convolution's sizes: input `[n, c, h, w]`, `o` outputs, a `k×k` kernel at stride `s` with
/// `p` zeros on each side, output `[n, o, ho, wo]`.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    o: usize,
    k: usize,
    s: usize,
    p: usize,
    ho: usize,
    wo: usize,
}

impl Geometry {
    #[allow(clippy::too_many_arguments)]
    fn new(n: usize, c: usize, h: usize, w: usize, o: usize, k: usize, s: usize, p: usize) -> Geometry {
        let (ho, wo) = ((h + 2 * p - k) / s + 1, (w + 2 * p - k) / s + 1);
        Geometry { n, c, h, w, o, k, s, p, ho, wo }
    }

    /// The rows of the patch matrix: `C·k·k`, in the weights' `(c, i, j)` order.
    fn patch(&self) -> usize {
        self.c * self.k * self.k
    }

    /// Images per group: enough for [`GROUP_VALUES`] input values (at least one image). Fixed by
    /// the shapes alone, so that the groups (and the order of the weights' gradient sums) do not
    /// depend on the number of threads.
    fn images_per_group(&self) -> usize {
        GROUP_VALUES.div_ceil((self.c * self.h * self.w).max(1)).min(self.n).max(1)
    }
}

/// The input values of one group of images.
const GROUP_VALUES: usize = 16_384;

/// Input columns `[x0, x1)` of output pixels `0..wo` whose tap `j` falls inside the image
/// (column `s·x + j − p`); the others read the padding's zeros.
fn inside(g: &Geometry, j: usize) -> (usize, usize) {
    let first = g.p.saturating_sub(j).div_ceil(g.s);
    let last = (g.w + g.p).saturating_sub(j).div_ceil(g.s).min(g.wo);
    (first.min(last), last)
}

/// The patch matrix of `images` (a group's `[m, c, h, w]` values): `[C·k·k, m·Ho·Wo]`, row
/// `(c, i, j)`, column `(image, y, x)` holding input pixel `(s·y + i − p, s·x + j − p)` of
/// channel `c` (zero outside the image). The images are first copied into a zero frame `p` wide,
/// so that every patch run is a plain copy (stride 1) or gather (stride `s`) without edge cases:
/// the runs are short (`Wo` values), and their bounds logic cost more than their values.
fn patches(images: &[f32], g: &Geometry, cols: &mut [f32]) {
    let m = images.len() / (g.c * g.h * g.w);
    let (pixels, width) = (g.ho * g.wo, m * g.ho * g.wo);
    let framed;
    let (source, ph, pw) = if g.p == 0 {
        (images, g.h, g.w)
    } else {
        framed = frame(images, m, g);
        (&framed[..], g.h + 2 * g.p, g.w + 2 * g.p)
    };
    for ch in 0..g.c {
        for i in 0..g.k {
            for j in 0..g.k {
                let row = &mut cols[((ch * g.k + i) * g.k + j) * width..][..width];
                for b in 0..m {
                    let plane = &source[(b * g.c + ch) * ph * pw..][..ph * pw];
                    for (y, out) in row[b * pixels..][..pixels].chunks_exact_mut(g.wo).enumerate() {
                        let line = &plane[(g.s * y + i) * pw + j..];
                        if g.s == 1 {
                            out.copy_from_slice(&line[..g.wo]);
                        } else {
                            let line = &line[..g.s * (g.wo - 1) + 1];
                            for (t, o) in out.iter_mut().enumerate() {
                                *o = line[g.s * t];
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `images` (`m` images of `[c, h, w]`) inside a zero frame `p` wide: `[m, c, h + 2p, w + 2p]`.
fn frame(images: &[f32], m: usize, g: &Geometry) -> Vec<f32> {
    let (ph, pw) = (g.h + 2 * g.p, g.w + 2 * g.p);
    let mut framed = vec![0f32; m * g.c * ph * pw];
    for (plane, framed) in images.chunks_exact(g.h * g.w).zip(framed.chunks_exact_mut(ph * pw)) {
        for (line, target) in plane.chunks_exact(g.w).zip(framed[g.p * pw..].chunks_exact_mut(pw)) {
            target[g.p..g.p + g.w].copy_from_slice(line);
        }
    }
    framed
}

/// The adjoint of [`patches`]: each patch entry's gradient added to its input pixel's (`grad`, a
/// group's `[m, c, h, w]`, starts at zero). The runs are cut to the image here ([`inside`]):
/// scattering into a zero frame and copying its middle out, as [`patches`] gathers, was slower on
/// the small maps (2×2 at batch 64: 0.66 against 0.59 ms forward and backward).
fn unpatch(cols: &[f32], g: &Geometry, grad: &mut [f32]) {
    let m = grad.len() / (g.c * g.h * g.w);
    let pixels = g.ho * g.wo;
    let width = m * pixels;
    for ch in 0..g.c {
        for i in 0..g.k {
            for j in 0..g.k {
                let row = &cols[((ch * g.k + i) * g.k + j) * width..][..width];
                let (x0, x1) = inside(g, j);
                if x0 >= x1 {
                    continue;
                }
                for b in 0..m {
                    let plane = &mut grad[(b * g.c + ch) * g.h * g.w..][..g.h * g.w];
                    for y in 0..g.ho {
                        let iy = (g.s * y + i) as isize - g.p as isize;
                        if iy < 0 || iy >= g.h as isize {
                            continue;
                        }
                        let from = &row[b * pixels + y * g.wo..][x0..x1];
                        let line = &mut plane[iy as usize * g.w..][..g.w];
                        let start = g.s * x0 + j - g.p;
                        if g.s == 1 {
                            for (l, v) in line[start..start + from.len()].iter_mut().zip(from) {
                                *l += v;
                            }
                        } else {
                            let target = &mut line[start..start + g.s * (from.len() - 1) + 1];
                            for (t, v) in from.iter().enumerate() {
                                target[g.s * t] += v;
                            }
                        }
                    }
                }
            }
        }
    }
}

/// `[o, m·pixels]` (channel-major, a product's layout) to `[m, o, pixels]` (NCHW); [`from_images`]
/// is its inverse.
fn to_images(from: &[f32], o: usize, pixels: usize, to: &mut [f32]) {
    let m = to.len() / (o * pixels);
    for b in 0..m {
        for oc in 0..o {
            to[(b * o + oc) * pixels..][..pixels].copy_from_slice(&from[oc * m * pixels + b * pixels..][..pixels]);
        }
    }
}

/// `[m, o, pixels]` (NCHW) to `[o, m·pixels]`: the inverse of [`to_images`].
fn from_images(from: &[f32], o: usize, pixels: usize, to: &mut [f32]) {
    let m = from.len() / (o * pixels);
    for b in 0..m {
        for oc in 0..o {
            to[oc * m * pixels + b * pixels..][..pixels].copy_from_slice(&from[(b * o + oc) * pixels..][..pixels]);
        }
    }
}

/// The convolution's output, `[n, o, ho, wo]`, in groups of `group` images.
fn forward(x: &[f32], weights: &[f32], g: Geometry, group: usize) -> Vec<f32> {
    let (image_in, pixels) = (g.c * g.h * g.w, g.ho * g.wo);
    let mut out = vec![0f32; g.n * g.o * pixels];
    out.par_chunks_mut(group * g.o * pixels).zip(x.par_chunks(group * image_in)).for_each(|(out, images)| {
        let m = images.len() / image_in;
        let width = m * pixels;
        // One image's `[c, h·w]` values are its own patch matrix for a 1×1 kernel at stride 1
        // without padding, and its `[o, ho·wo]` output the product's layout.
        let built;
        let cols = if m == 1 && g.k == 1 && g.s == 1 && g.p == 0 {
            images
        } else {
            let mut cols = vec![0f32; g.patch() * width];
            patches(images, &g, &mut cols);
            built = cols;
            &built[..]
        };
        let product_into =
            |dst: &mut [f32]| product(dst, width, g.o, width, g.patch(), (weights, g.patch(), 1), (cols, width, 1));
        if m == 1 {
            product_into(out);
        } else {
            let mut product_out = vec![0f32; g.o * width];
            product_into(&mut product_out);
            to_images(&product_out, g.o, pixels, out);
        }
    });
    out
}

/// The backward step of [`conv2d`].
#[derive(Debug)]
struct HostConv;

/// What the backward pass needs: the input (contiguous; its patches are built again), the
/// weights' values (`[o, C·k·k]`) and the sizes.
#[derive(Debug, Clone)]
struct State {
    input: FlexTensor,
    weights: Vec<f32>,
    geo: Geometry,
}

impl Backward<Flex, 2> for HostConv {
    type State = State;

    fn backward(self, ops: Ops<State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let State { input, weights, geo: g } = ops.state;
        let x = input.as_slice::<f32>().expect("contiguous");
        let gy = grad.as_slice::<f32>().expect("contiguous");
        let (x_grad, w_grad) = gradients(x, gy, &weights, g, node_x.is_some(), node_w.is_some());
        if let (Some(node), Some(v)) = (node_x, x_grad) {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(v, [g.n, g.c, g.h, g.w])));
        }
        if let (Some(node), Some(v)) = (node_w, w_grad) {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(v, [g.o, g.c, g.k, g.k])));
        }
    }
}

/// The gradients of the input (when `with_x`) and of the weights (when `with_w`), given the
/// output's gradient `gy`: per group, the patches' gradient `Wᵀ · gy` folded back onto the input
/// ([`unpatch`]) and the weights' share `gy · patchesᵀ` (computed transposed), the shares summed in
/// group order.
fn gradients(
    x: &[f32],
    gy: &[f32],
    weights: &[f32],
    g: Geometry,
    with_x: bool,
    with_w: bool,
) -> (Option<Vec<f32>>, Option<Vec<f32>>) {
    let group = g.images_per_group();
    let (image_in, pixels, patch) = (g.c * g.h * g.w, g.ho * g.wo, g.patch());
    let mut x_grad = if with_x { vec![0f32; x.len()] } else { Vec::new() };
    let work = |(images, gy, x_grad): (&[f32], &[f32], &mut [f32])| -> Option<Vec<f32>> {
        let m = images.len() / image_in;
        let width = m * pixels;
        let mut g_cols = vec![0f32; g.o * width];
        from_images(gy, g.o, pixels, &mut g_cols);
        let mut w_share = None;
        if with_w {
            let mut cols = vec![0f32; patch * width];
            patches(images, &g, &mut cols);
            // The share transposed, `[patch, o]` = cols [patch, width] · gyᵀ [width, o]: gemm
            // took 6× longer for the `[o, patch]` orientation on the stem's shapes (8 × 147 from
            // 1,536 columns: 450 against 72 µs).
            let mut share = vec![0f32; patch * g.o];
            product(&mut share, g.o, patch, g.o, width, (&cols, width, 1), (&g_cols, 1, width));
            w_share = Some(share);
        }
        if with_x {
            let mut d_cols = vec![0f32; patch * width];
            // Wᵀ [patch, o] · gy [o, width].
            product(&mut d_cols, width, patch, width, g.o, (weights, 1, patch), (&g_cols, width, 1));
            unpatch(&d_cols, &g, x_grad);
        }
        w_share
    };
    let x_chunks: Vec<&mut [f32]> = if with_x {
        x_grad.chunks_mut(group * image_in).collect()
    } else {
        (0..g.n.div_ceil(group)).map(|_| &mut [][..]).collect()
    };
    let shares: Vec<Option<Vec<f32>>> = x
        .par_chunks(group * image_in)
        .zip(gy.par_chunks(group * g.o * pixels))
        .zip(x_chunks.into_par_iter())
        .map(|((images, gy), x_grad)| work((images, gy, x_grad)))
        .collect();
    let w_grad = with_w.then(|| {
        let mut total = vec![0f32; patch * g.o];
        for share in shares.into_iter().flatten() {
            for (t, s) in total.iter_mut().zip(share) {
                *t += s;
            }
        }
        // `[patch, o]` to the weights' `[o, patch]`.
        let mut w_grad = vec![0f32; g.o * patch];
        for (r, row) in total.chunks_exact(g.o).enumerate() {
            for (oc, v) in row.iter().enumerate() {
                w_grad[oc * patch + r] = *v;
            }
        }
        w_grad
    });
    (with_x.then_some(x_grad), w_grad)
}

#[cfg(test)]
mod tests {
    use burn::nn::conv::Conv2dConfig;
    use burn::nn::PaddingConfig2d;
    use burn::tensor::{Device, Distribution, Tensor};

    use crate::models::test_support::values;

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        crate::models::test_support::assert_close(got, want, 1e-4, what);
    }

    /// The output and the gradients of the input and the weights (of a weighted sum of the
    /// output) equal those of burn's convolution: ResNet's kernels (1×1, 3×3, 7×7), strides 1
    /// and 2, odd sizes where the last tap falls off the edge, a strided input, an input without
    /// a gradient (the stem's images), and batches of one group and of several.
    #[test]
    fn trains_as_burns_convolution() {
        let device = Device::flex().autodiff();
        for (n, c, o, h, w, k, s, p, grad_x) in [
            (3, 2, 4, 5, 5, 1, 1, 0, true),
            (2, 3, 2, 7, 6, 3, 1, 1, true),
            (3, 2, 3, 7, 8, 3, 2, 1, true),
            (2, 4, 2, 6, 5, 1, 2, 0, true),
            (2, 3, 4, 11, 9, 7, 2, 3, false),
            (2, 3, 4, 11, 9, 7, 2, 3, true),
            (40, 8, 4, 9, 9, 3, 2, 1, true),
            (70, 16, 3, 4, 4, 3, 1, 1, true),
        ] {
            let conv = Conv2dConfig::new([c, o], [k, k])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .with_bias(false)
                .init(&device);
            let base = Tensor::<4>::random([n, c, w, h], Distribution::Normal(0.0, 1.0), &device);
            let mut x = base.swap_dims(2, 3);
            if grad_x {
                x = x.detach().require_grad();
            }
            let want = conv.forward(x.clone());
            let got = super::conv2d(&x, &conv.weight.val(), s, p).expect("the host path on a flex autodiff device");
            let what = format!("n{n} c{c} o{o} {h}x{w} k{k} s{s} p{p} grad_x {grad_x}");
            assert_eq!(got.dims(), want.dims(), "{what}");
            assert_close(&values(got.clone()), &values(want.clone()), &format!("output {what}"));
            let weights = Tensor::<4>::random(want.dims(), Distribution::Normal(0.0, 1.0), &device);
            let gradients = |out: Tensor<4>| {
                let g = (out * weights.clone()).sum().backward();
                (x.grad(&g).map(values), conv.weight.grad(&g).map(values))
            };
            let ((gx, gw), (wx, ww)) = (gradients(got), gradients(want));
            assert_close(
                &gw.expect("a weight gradient"),
                &ww.expect("a weight gradient"),
                &format!("weight gradient {what}"),
            );
            assert_eq!(gx.is_some(), grad_x, "{what}");
            if let (Some(a), Some(b)) = (gx, wx) {
                assert_close(&a, &b, &format!("input gradient {what}"));
            }
        }
    }

    /// Without any gradient to track (an EMA teacher's forward pass: neither the weights nor the
    /// input require one), the output equals burn's convolution.
    #[test]
    fn a_forward_pass_without_gradients_equals_burns() {
        use burn::tensor::ops::ConvOptions;
        let device = Device::flex().autodiff();
        let x = Tensor::<4>::random([3, 3, 7, 6], Distribution::Normal(0.0, 1.0), &device);
        let w = Tensor::<4>::random([4, 3, 3, 3], Distribution::Normal(0.0, 1.0), &device);
        let got = super::conv2d(&x, &w, 2, 1).expect("the host path on a flex autodiff device");
        let want = burn::tensor::module::conv2d(x, w, None, ConvOptions::new([2, 2], [1, 1], [1, 1], 1));
        assert_close(&values(got), &values(want), "output");
    }

    /// Without autodiff (inference: `encode_image`, evaluation, mining) the output equals burn's
    /// convolution, and an image's output does not depend on the batch it is in: small and large
    /// images, a 1×1 kernel at stride 1 (which reads the image as its patch matrix), a strided
    /// input.
    #[test]
    fn infers_as_burns_convolution() {
        let device = Device::flex();
        for (n, c, o, h, w, k, s, p, transposed) in [
            (5, 3, 4, 7, 6, 3, 2, 1, false),
            (3, 64, 8, 16, 16, 1, 1, 0, false),
            (2, 64, 5, 16, 17, 3, 1, 1, false),
            (2, 64, 6, 17, 16, 1, 2, 0, true),
            (3, 2, 4, 11, 9, 7, 2, 3, true),
            (20, 16, 8, 8, 8, 3, 1, 1, false),
            (20, 32, 16, 4, 4, 3, 1, 1, false),
            (40, 64, 32, 2, 2, 1, 1, 0, false),
            (13, 3, 8, 32, 32, 7, 2, 3, false),
            (20, 32, 16, 2, 2, 3, 2, 1, false),
            (20, 64, 32, 1, 1, 1, 1, 0, false),
        ] {
            let conv = Conv2dConfig::new([c, o], [k, k])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .with_bias(false)
                .init(&device);
            let x = if transposed {
                Tensor::<4>::random([n, c, w, h], Distribution::Normal(0.0, 1.0), &device).swap_dims(2, 3)
            } else {
                Tensor::<4>::random([n, c, h, w], Distribution::Normal(0.0, 1.0), &device)
            };
            let want = conv.forward(x.clone());
            let got = super::conv2d(&x, &conv.weight.val(), s, p).expect("the host path on the flex device");
            let what = format!("n{n} c{c} o{o} {h}x{w} k{k} s{s} p{p} transposed {transposed}");
            assert_eq!(got.dims(), want.dims(), "{what}");
            assert_close(&values(got.clone()), &values(want), &format!("output {what}"));
            // An image's output is the same, bit for bit, alone and in the batch.
            let last = x.clone().slice([n - 1..n, 0..c, 0..h, 0..w]);
            let alone = super::conv2d(&last, &conv.weight.val(), s, p).expect("the host path");
            let [_, _, ho, wo] = got.dims();
            assert_eq!(values(alone), values(got.slice([n - 1..n, 0..o, 0..ho, 0..wo])), "alone {what}");
        }
    }

    /// Shapes it does not cover (a kernel that is not square, weights of other channels) and
    /// tensors that are not `f32` are declined, and the caller takes burn's convolution.
    #[test]
    fn declines_what_it_does_not_cover() {
        for device in [Device::flex(), Device::flex().autodiff()] {
            let x = Tensor::<4>::random([1, 2, 4, 4], Distribution::Normal(0.0, 1.0), &device);
            let w = Tensor::<4>::random([3, 2, 3, 3], Distribution::Normal(0.0, 1.0), &device);
            assert!(super::conv2d(&x, &w, 1, 1).is_some());
            assert!(super::conv2d(&x, &w.clone().slice([0..3, 0..2, 0..3, 0..2]), 1, 1).is_none());
            assert!(super::conv2d(&x.clone().slice([0..1, 0..1, 0..4, 0..4]), &w, 1, 1).is_none());
            assert!(super::conv2d(&x.cast(burn::tensor::DType::F16), &w.cast(burn::tensor::DType::F16), 1, 1).is_none());
        }
    }

    /// Timing probe (not a test): `cargo test --release --lib host_conv::tests::probe -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn probe() {
        let device = Device::flex().autodiff();
        for (n, ci, co, side, k, s, p, xg) in [
            (64, 3, 8, 32, 7, 2, 3, false),
            (64, 8, 8, 8, 1, 1, 0, true),
            (64, 8, 8, 8, 3, 1, 1, true),
            (64, 8, 32, 8, 1, 1, 0, true),
            (64, 32, 16, 8, 1, 1, 0, true),
            (64, 16, 16, 8, 3, 2, 1, true),
            (64, 32, 64, 8, 1, 2, 0, true),
            (64, 64, 32, 4, 1, 1, 0, true),
            (64, 32, 32, 4, 3, 2, 1, true),
            (64, 128, 64, 2, 1, 1, 0, true),
            (64, 64, 64, 2, 3, 2, 1, true),
            (64, 128, 256, 2, 1, 2, 0, true),
        ] {
            let conv = Conv2dConfig::new([ci, co], [k, k])
                .with_stride([s, s])
                .with_padding(PaddingConfig2d::Explicit(p, p, p, p))
                .with_bias(false)
                .init(&device);
            let mut x = Tensor::<4>::random([n, ci, side, side], Distribution::Normal(0.0, 1.0), &device);
            if xg {
                x = x.require_grad();
            }
            let mut line = format!("n{n} {ci}->{co} {side}px k{k} s{s}:");
            for host in [false, true] {
                let mut best = f64::MAX;
                for _ in 0..3 {
                    let t = std::time::Instant::now();
                    for _ in 0..50 {
                        let out = if host {
                            super::conv2d(&x, &conv.weight.val(), s, p).unwrap()
                        } else {
                            conv.forward(x.clone())
                        };
                        let g = out.sum().backward();
                        let _ = conv.weight.grad(&g);
                    }
                    best = best.min(t.elapsed().as_secs_f64() * 1e6 / 50.0);
                }
                line += &format!(" {} {best:.0} us", if host { "host" } else { "burn" });
            }
            eprintln!("{line}");
        }
    }
}
