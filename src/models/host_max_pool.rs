//! ResNet's stem max pooling in inference on the host (burn's CPU backend without autodiff): each
//! output is a tight loop over its window, the windows of a `[H, W]` plane one after another,
//! planes on rayon's threads. burn-flex pools through its generic 3-D kernel, which recomputes
//! each window's bounds and records each maximum's index (of no use without a backward pass):
//! 8.6% of a ResNet-50 forward pass at batch 32 (perf, 2-core development machine), for one
//! operation. Values are burn's, bit for bit (tested): the window is read in the same order, a
//! later value replaces the maximum only when greater or NaN (so a NaN propagates, as in PyTorch,
//! and of equal values the first stays).

use burn::backend::Flex;
use burn::tensor::module::max_pool2d as burn_max_pool2d;
use burn::tensor::ops::MaxPoolOptions;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use super::host_autodiff::contiguous;

/// Max pooling of `x` (`[batch, C, H, W]`) over `kernel × kernel` windows at `stride`, with
/// `padding` on each side that never wins (no dilation, output sizes rounded down): on the host
/// on burn's CPU backend without autodiff for `f32` values, burn's `max_pool2d` elsewhere (with
/// autodiff, its backward pass needs the maxima's indices).
///
/// # Shapes
/// - `x`: `[batch, C, H, W]` → `[batch, C, (H + 2·padding − kernel) / stride + 1, (W + …) / stride + 1]`
pub fn max_pool2d(x: Tensor<4>, kernel: usize, stride: usize, padding: usize) -> Tensor<4> {
    let device = x.device();
    let [n, c, h, w] = x.dims();
    let fits = kernel > 0 && stride > 0 && h + 2 * padding >= kernel && w + 2 * padding >= kernel;
    if !fits || device.is_autodiff() || device != Device::flex() || x.dtype() != DType::F32 {
        return burn_max_pool2d(x, options(kernel, stride, padding));
    }
    let g = Geometry::new(h, w, kernel, stride, padding);
    let input = contiguous(&x.try_into_primitive::<Flex>().expect("a float tensor on the flex device"));
    let values = input.as_slice::<f32>().expect("contiguous");
    let mut out = vec![0f32; n * c * g.ho * g.wo];
    let columns: Vec<(usize, usize)> = (0..g.wo).map(|o| g.span(o, w)).collect();
    let plane_in = h * w;
    let plane_out = g.ho * g.wo;
    if plane_out > 0 {
        out.par_chunks_mut(plane_out)
            .zip(values.par_chunks(plane_in.max(1)))
            .for_each(|(out, plane)| pool_plane(plane, out, g, w, &columns));
    }
    Tensor::from_data(TensorData::new(out, [n, c, g.ho, g.wo]), &device)
}

/// burn's options for [`max_pool2d`]'s pooling.
fn options(kernel: usize, stride: usize, padding: usize) -> MaxPoolOptions<2> {
    MaxPoolOptions {
        kernel_size: [kernel, kernel],
        stride: [stride, stride],
        padding: [(padding, padding), (padding, padding)],
        dilation: [1, 1],
        ceil_mode: false,
    }
}

/// A pooling's window and output sizes along the two axes.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    kernel: usize,
    stride: usize,
    padding: usize,
    ho: usize,
    wo: usize,
    h: usize,
}

impl Geometry {
    fn new(h: usize, w: usize, kernel: usize, stride: usize, padding: usize) -> Geometry {
        let size = |len: usize| (len + 2 * padding - kernel) / stride + 1;
        Geometry { kernel, stride, padding, ho: size(h), wo: size(w), h }
    }

    /// The input positions `[start, end)` of output `o`'s window along an axis of `len`
    /// values, the padding left out.
    fn span(&self, o: usize, len: usize) -> (usize, usize) {
        let first = (o * self.stride) as isize - self.padding as isize;
        let start = first.max(0) as usize;
        let end = ((first + self.kernel as isize).max(0) as usize).min(len);
        (start.min(end), end)
    }
}

/// One `[H, W]` plane's outputs, row by row; `columns` holds each output column's window span.
fn pool_plane(plane: &[f32], out: &mut [f32], g: Geometry, w: usize, columns: &[(usize, usize)]) {
    for (oh, row) in out.chunks_exact_mut(g.wo).enumerate() {
        let (r0, r1) = g.span(oh, g.h);
        for (o, &(c0, c1)) in row.iter_mut().zip(columns) {
            let mut m = f32::NEG_INFINITY;
            for ih in r0..r1 {
                for &v in &plane[ih * w + c0..ih * w + c1] {
                    if v > m || v.is_nan() {
                        m = v;
                    }
                }
            }
            *o = m;
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::module::max_pool2d;
    use burn::tensor::{Device, Distribution, Tensor, TensorData};

    use crate::models::test_support::{bits, values};

    fn burns(x: Tensor<4>, kernel: usize, stride: usize, padding: usize) -> Tensor<4> {
        max_pool2d(x, super::options(kernel, stride, padding))
    }

    /// burn's values bit for bit: ResNet's 3×3 / 2 / 1 and other windows, strides and paddings,
    /// odd and even sizes, planes smaller than the window with padding, a strided input, and NaN
    /// (of either sign), ±0 and −∞ among the values (ties of −0 and +0 keep the first).
    #[test]
    fn pools_as_burn_does() {
        let device = Device::flex();
        for (dims, (kernel, stride, padding), transposed) in [
            ([2, 3, 9, 11], (3, 2, 1), false),
            ([2, 3, 8, 8], (3, 2, 1), true),
            ([1, 2, 7, 6], (2, 2, 0), false),
            ([1, 2, 5, 5], (3, 1, 1), false),
            ([2, 1, 10, 9], (5, 3, 2), false),
            ([1, 2, 1, 2], (3, 2, 1), false),
            ([1, 1, 4, 4], (1, 1, 0), false),
        ] {
            let [n, c, h, w] = dims;
            let count = n * c * h * w;
            let mut v = values(Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &device));
            // Small integers make ties common; then the special values.
            for (i, x) in v.iter_mut().enumerate() {
                *x = (*x * 2.0).round();
                match i % 17 {
                    3 => *x = -0.0,
                    5 => *x = 0.0,
                    8 if i % 3 == 0 => *x = f32::NAN,
                    8 => *x = -f32::NAN,
                    11 => *x = f32::NEG_INFINITY,
                    _ => {}
                }
            }
            assert_eq!(v.len(), count);
            let x = if transposed {
                Tensor::<4>::from_data(TensorData::new(v, [n, c, w, h]), &device).swap_dims(2, 3)
            } else {
                Tensor::<4>::from_data(TensorData::new(v, dims), &device)
            };
            let want = burns(x.clone(), kernel, stride, padding);
            let got = super::max_pool2d(x, kernel, stride, padding);
            assert_eq!(got.dims(), want.dims(), "{dims:?} {kernel}/{stride}/{padding}");
            assert_eq!(bits(got), bits(want), "{dims:?} {kernel}/{stride}/{padding} transposed {transposed}");
        }
    }

    /// Under autodiff the pooling is burn's, and its gradient flows to each window's maximum.
    #[test]
    fn trains_through_burns_pooling() {
        let device = Device::flex().autodiff();
        let x = Tensor::<4>::random([1, 2, 6, 6], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let got = super::max_pool2d(x.clone(), 3, 2, 1);
        assert_eq!(bits(got.clone()), bits(burns(x.clone(), 3, 2, 1)));
        let grad = x.grad(&got.sum().backward()).expect("a gradient");
        assert_eq!(values(grad.sum()), [18.0], "one unit of gradient per output");
    }
}
