//! Multi-head scaled dot-product attention for inference on burn's CPU backend, straight from the
//! fused `qkv` projection: `softmax(Q·Kᵀ/√d_h + mask)·V` per (item, head), with Q, K and V read in
//! place through their strides (no split, transpose or copy of them), each item and head one task
//! on rayon's threads. burn's path (narrow, reshape, swap, batched products that copy their strided
//! operands, a softmax of four passes with a scalar `exp`) took 7–10% of a ViT-B/32 forward pass,
//! this 2.5 times less. Used by the ViT and CLIP text blocks ([`super::vit::VitBlock`]); with
//! autodiff, or on another device, they keep burn's operations.
//!
//! Each (item, head) is computed on one thread in a fixed order, so the values depend neither on
//! the number of threads nor on the other items of the batch (tested).

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::activation::{exp_neg, in_widest_vectors, Kernel};
use super::host_autodiff::{contiguous, product};

/// The attention of `qkv` (`[batch, tokens, 3·width]`: Q, K, V side by side, each `heads` blocks
/// of `width / heads`) under an additive `mask` (`[tokens, tokens]`, `-inf` where a query may not
/// look), as `[batch, tokens, width]` with the heads side by side, when the tensors are `f32`
/// tensors of burn's CPU backend without autodiff (`Device::flex()`); `None` otherwise, so that
/// the caller takes burn's operations.
///
/// # Shapes
/// - `qkv`: `[batch, tokens, 3·width]` → `[batch, tokens, width]`
pub fn attention(qkv: &Tensor<3>, heads: usize, mask: Option<&Tensor<2>>) -> Option<Tensor<3>> {
    let [b, n, three_d] = qkv.dims();
    let d = three_d / 3;
    if heads == 0 || three_d % 3 != 0 || d % heads != 0 || mask.is_some_and(|m| m.dims() != [n, n]) {
        return None;
    }
    let plain = |t: FlexTensor| (t.dtype() == DType::F32).then(|| contiguous(&t));
    let qkv = plain(qkv.clone().try_into_primitive::<Flex>().ok()?)?;
    let mask = match mask {
        Some(m) => Some(plain(m.clone().try_into_primitive::<Flex>().ok()?)?),
        None => None,
    };
    let values = qkv.as_slice::<f32>().expect("contiguous");
    let mask = mask.as_ref().map(|m| m.as_slice::<f32>().expect("contiguous"));
    let out = heads_side_by_side(values, mask, Dims { b, n, d, heads });
    Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(out, [b, n, d]))))
}

/// Batch, tokens, width and heads of one [`attention`] call.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    n: usize,
    d: usize,
    heads: usize,
}

/// [`attention`] on the values: each (item, head) into its own `[tokens, d_h]` block of a
/// `[batch, heads, tokens, d_h]` buffer, then the blocks interleaved into `[batch, tokens, width]`.
fn heads_side_by_side(qkv: &[f32], mask: Option<&[f32]>, s: Dims) -> Vec<f32> {
    let Dims { b, n, d, heads } = s;
    let dh = d / heads;
    if n == 0 || dh == 0 {
        return vec![0f32; b * n * d];
    }
    let mut per_head = vec![0f32; b * heads * n * dh];
    per_head.par_chunks_mut(n * dh).enumerate().for_each_init(
        || vec![0f32; n * n],
        |scores, (task, context)| {
            let (item, head) = (task / heads, task % heads);
            let at = item * n * 3 * d + head * dh;
            one_head(&qkv[at..], mask, scores, context, n, d, dh);
        },
    );
    let mut out = vec![0f32; b * n * d];
    out.par_chunks_mut(n * d).zip(per_head.par_chunks(heads * n * dh)).for_each(|(out, item)| {
        for (t, row) in out.chunks_exact_mut(d).enumerate() {
            for (h, dst) in row.chunks_exact_mut(dh).enumerate() {
                dst.copy_from_slice(&item[(h * n + t) * dh..][..dh]);
            }
        }
    });
    out
}

/// One head of one item: `qkv` starts at its Q block (K is `width` further, V `2·width`; rows
/// `3·width` apart); `context` (`[tokens, d_h]`) gets the result, `scores` is scratch.
fn one_head(qkv: &[f32], mask: Option<&[f32]>, scores: &mut [f32], context: &mut [f32], n: usize, d: usize, dh: usize) {
    let row = 3 * d;
    // scores[i][j] = Σ_c Q[i][c]·K[j][c]: Kᵀ read through its strides.
    product(scores, n, n, n, dh, (qkv, row, 1), (&qkv[d..], 1, row));
    let scale = (dh as f32).sqrt().recip();
    in_widest_vectors(SoftmaxRows { scores, n, scale, mask });
    product(context, dh, n, dh, n, (scores, n, 1), (&qkv[2 * d..], row, 1));
}

/// [`softmax_row`] on each row of a `[tokens, tokens]` score matrix, as one [`Kernel`].
struct SoftmaxRows<'a> {
    scores: &'a mut [f32],
    n: usize,
    scale: f32,
    mask: Option<&'a [f32]>,
}

impl Kernel for SoftmaxRows<'_> {
    #[inline(always)]
    fn run(self) {
        let n = self.n;
        for (i, s) in self.scores.chunks_exact_mut(n).enumerate() {
            softmax_row(s, self.scale, self.mask.map(|m| &m[i * n..(i + 1) * n]));
        }
    }
}

/// `s ← softmax(s·scale + mask)` in place, as `exp(x − max) / Σ exp(x − max)` (burn's and
/// PyTorch's form). A masked `-inf` gets exactly 0, and so does a score 87 or more below the
/// row's maximum (transformers' `f32::MIN` padding mask); a row masked throughout, or with a NaN
/// score (masked or not), is NaN, as in PyTorch. The maximum and the sum run in [`LANES`] partial
/// results, so that they vectorise.
#[inline(always)]
fn softmax_row(s: &mut [f32], scale: f32, mask: Option<&[f32]>) {
    match mask {
        Some(m) => s.iter_mut().zip(m).for_each(|(x, m)| *x = *x * scale + m),
        None => s.iter_mut().for_each(|x| *x *= scale),
    }
    let mut max = [f32::NEG_INFINITY; LANES];
    let mut chunks = s.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &x) in max.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    for (m, &x) in max.iter_mut().zip(chunks.remainder()) {
        *m = if x > *m { x } else { *m };
    }
    let max = max.into_iter().fold(f32::NEG_INFINITY, f32::max);
    // `exp_neg` stops at e^−87; beyond it (a masked `-inf`, or a score far below the maximum)
    // the weight is 0, where f32's `exp` gives at most 1.7e-38: nothing beside the row's sum,
    // which is at least 1 (the maximum's own weight).
    let exp = |x: f32| {
        let y = max - x;
        let e = if y > 87.0 { 0.0 } else { exp_neg(y) };
        if y.is_nan() {
            y
        } else {
            e
        }
    };
    let mut sum = [0f32; LANES];
    let mut chunks = s.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for (acc, x) in sum.iter_mut().zip(c) {
            *x = exp(*x);
            *acc += *x;
        }
    }
    for (acc, x) in sum.iter_mut().zip(chunks.into_remainder()) {
        *x = exp(*x);
        *acc += *x;
    }
    let sum: f32 = sum.iter().sum();
    s.iter_mut().for_each(|x| *x /= sum);
}

/// Partial results of [`softmax_row`]'s reductions: one AVX2 vector (two SSE ones).
const LANES: usize = 8;

#[cfg(test)]
mod tests {
    use burn::tensor::Device;

    use super::*;
    use crate::models::vit::burn_attention;

    /// Values in about [-3, 3] from a fixed sequence.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 6.0 - 3.0
            })
            .collect()
    }

    fn causal(n: usize, device: &Device) -> Tensor<2> {
        let m: Vec<f32> = (0..n * n).map(|k| if k % n > k / n { f32::NEG_INFINITY } else { 0.0 }).collect();
        Tensor::from_data(TensorData::new(m, [n, n]), device)
    }

    fn max_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        a.iter().zip(b).map(|(x, y)| (x - y).abs() / (1.0 + y.abs())).fold(0.0, f32::max)
    }

    #[test]
    fn the_host_attention_is_burns_within_float_error() {
        let device = Device::flex();
        for (b, n, d, heads, masked) in [
            (3, 50, 96, 4, false),
            (2, 7, 24, 3, true),
            (1, 1, 8, 2, false),
            (4, 77, 64, 1, true),
            (2, 20, 48, 12, false),
        ] {
            let qkv = Tensor::<3>::from_data(TensorData::new(values(b * n * 3 * d, n as u64), [b, n, 3 * d]), &device);
            let mask = masked.then(|| causal(n, &device));
            let got = attention(&qkv, heads, mask.as_ref()).expect("flex f32");
            assert_eq!(got.dims(), [b, n, d]);
            let got = got.into_data().try_into_vec::<f32>().unwrap();
            let want = burn_attention(qkv, heads, mask.as_ref()).into_data().try_into_vec::<f32>().unwrap();
            let diff = max_diff(&got, &want);
            assert!(diff < 2e-6, "b {b} n {n} d {d} heads {heads} masked {masked}: max diff {diff}");
        }
    }

    #[test]
    fn masked_scores_get_exactly_no_weight_and_a_fully_masked_row_is_nan() {
        // One head, d_h 1, V = 1, 2, 3: under the causal mask the first query sees only the first
        // token, so its output is V[0] exactly.
        let device = Device::flex();
        let qkv = vec![0.5, 0.1, 1.0, -0.3, 0.7, 2.0, 0.2, -0.4, 3.0];
        let qkv = Tensor::<3>::from_data(TensorData::new(qkv, [1, 3, 3]), &device);
        let out = attention(&qkv, 1, Some(&causal(3, &device))).unwrap().into_data().try_into_vec::<f32>().unwrap();
        assert_eq!(out[0], 1.0);
        // transformers' padding mask, the most negative finite f32, weighs exactly 0 too, as does
        // a score far below the maximum (e^−87 and less).
        let mut row = [0.5, 0.0, 0.2, -100.0];
        softmax_row(&mut row, 1.0, Some(&[0.0, f32::MIN, 0.0, 0.0]));
        assert_eq!((row[1], row[3]), (0.0, 0.0), "{row:?}");
        assert!((row[0] + row[2] - 1.0).abs() < 1e-7 && row[0] > row[2], "{row:?}");
        assert!(out[1] > 1.0 && out[1] < 2.0 && out[2] > 1.0 && out[2] < 3.0, "{out:?}");
        let mut all = vec![0f32; 9];
        all[..3].fill(f32::NEG_INFINITY);
        let mask = Tensor::<2>::from_data(TensorData::new(all, [3, 3]), &device);
        let out = attention(&qkv, 1, Some(&mask)).unwrap().into_data().try_into_vec::<f32>().unwrap();
        assert!(out[0].is_nan() && out[1].is_finite() && out[2].is_finite(), "{out:?}");
        // A NaN key makes every row NaN, the first too: its score is NaN before the mask is
        // added, and NaN − ∞ is NaN (PyTorch's softmax and scaled_dot_product_attention agree).
        let mut nan_key = vec![0.5, 0.1, 1.0, -0.3, f32::NAN, 2.0, 0.2, -0.4, 3.0];
        let qkv = Tensor::<3>::from_data(TensorData::new(nan_key.clone(), [1, 3, 3]), &device);
        let out = attention(&qkv, 1, Some(&causal(3, &device))).unwrap().into_data().try_into_vec::<f32>().unwrap();
        assert!(out.iter().all(|x| x.is_nan()), "{out:?}");
        nan_key[4] = 0.7;
        let qkv = Tensor::<3>::from_data(TensorData::new(nan_key, [1, 3, 3]), &device);
        let out = attention(&qkv, 1, Some(&causal(3, &device))).unwrap().into_data().try_into_vec::<f32>().unwrap();
        assert!(out.iter().all(|x| x.is_finite()), "{out:?}");
    }

    #[test]
    fn an_items_output_depends_neither_on_the_batch_nor_on_the_threads() {
        let (b, n, d, heads) = (5, 33, 64, 4);
        let qkv = values(b * n * 3 * d, 7);
        let dims = Dims { b, n, d, heads };
        let whole = heads_side_by_side(&qkv, None, dims);
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let serial = one.install(|| heads_side_by_side(&qkv, None, dims));
        assert_eq!(
            whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            serial.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        for item in 0..b {
            let alone = heads_side_by_side(&qkv[item * n * 3 * d..][..n * 3 * d], None, Dims { b: 1, ..dims });
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&alone), bits(&whole[item * n * d..][..n * d]), "item {item}");
        }
    }

    #[test]
    fn other_shapes_and_autodiff_fall_back_to_burn() {
        let device = Device::flex();
        let qkv = Tensor::<3>::from_data(TensorData::new(values(2 * 4 * 12, 3), [2, 4, 12]), &device);
        assert!(attention(&qkv, 3, None).is_none(), "width 4 does not split into 3 heads");
        let wrong_mask = causal(3, &device);
        assert!(attention(&qkv, 2, Some(&wrong_mask)).is_none(), "mask of another size");
        let tracked = Tensor::<3>::from_data(TensorData::new(values(2 * 4 * 12, 3), [2, 4, 12]), &device.autodiff());
        assert!(attention(&tracked, 2, None).is_none(), "autodiff keeps burn's operations");
        assert!(attention(&qkv, 2, None).is_some());
    }
}
