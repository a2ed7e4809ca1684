//! Multi-head scaled dot-product attention for inference on burn's CPU backend:
//! `softmax(Q·Kᵀ/√d_h + mask)·V` per (item, head), with Q, K and V read in place through their
//! strides (no split, transpose or copy of them), each item and head one task on rayon's threads.
//! burn's path (narrow or reshape, swap, batched products that copy their strided operands, a
//! softmax of four passes with a scalar `exp`) took 7–10% of a ViT-B/32 forward pass, this 2.5
//! times less. [`attention`] serves the ViT and CLIP text blocks ([`super::vit::VitBlock`]: one
//! fused projection, a causal mask or none), [`attention_padded`] BERT's and MPNet's (separate
//! projections, padding keys masked, MPNet's relative position bias); with autodiff, or on another
//! device, they keep burn's operations.
//!
//! Each (item, head) is computed on one thread in a fixed order, so the values depend neither on
//! the number of threads nor on the other items of the batch (tested).

use burn::backend::flex::FlexTensor;
use burn::backend::Flex;
use burn::tensor::{DType, Int, Tensor, TensorData};
use rayon::prelude::*;

use super::activation::{exp_neg, in_widest_vectors, Kernel};
use super::host_autodiff::{contiguous, product};

/// The attention of `qkv` (`[batch, tokens, 3·width]`: Q, K, V side by side, each `heads` blocks
/// of `width / heads`) under an additive `mask` (`[tokens, tokens]`, `-inf` where a query may not
/// look), as `[batch, tokens, width]` with the heads side by side, when the tensors are `f32`
/// tensors of burn's CPU backend without autodiff (`Device::flex()`); `None` otherwise, so that
/// the caller takes burn's operations. The ViT and CLIP text blocks' attention.
///
/// # Shapes
/// - `qkv`: `[batch, tokens, 3·width]` → `[batch, tokens, width]`
pub fn attention(qkv: &Tensor<3>, heads: usize, mask: Option<&Tensor<2>>) -> Option<Tensor<3>> {
    let [b, n, three_d] = qkv.dims();
    let d = three_d / 3;
    if heads == 0 || three_d % 3 != 0 || d % heads != 0 || mask.is_some_and(|m| m.dims() != [n, n]) {
        return None;
    }
    let qkv = host_values(qkv)?;
    let mask = match mask {
        Some(m) => Some(host_values(m)?),
        None => None,
    };
    let values = qkv.as_slice::<f32>().expect("contiguous");
    let (row, item) = (3 * d, n * 3 * d);
    let operand = |at: usize| Operand { values: &values[at..], row, item };
    let mask = Mask { scores: mask.as_ref().map(|m| (m.as_slice::<f32>().expect("contiguous"), 0)), keys: None };
    let out = heads_side_by_side([operand(0), operand(d), operand(2 * d)], mask, Dims { b, n, d, heads });
    Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(out, [b, n, d]))))
}

/// The attention of separate `q`, `k` and `v` (`[batch, tokens, width]` each, `heads` blocks of
/// `width / heads`) with padding keys masked out (`keys`: 1 for a token, 0 for padding), as
/// transformers does it: the most negative `f32` added to a padding key's scores, so that it
/// weighs exactly 0. MPNet adds its relative position `bias` (`[heads, tokens, tokens]`, the same
/// for every item) to the scores before the padding. `None` where [`attention`] gives `None`.
/// BERT's and MPNet's attention.
///
/// # Shapes
/// - `q`, `k`, `v`: `[batch, tokens, width]` → `[batch, tokens, width]`
/// - `keys`: `[batch, tokens]`
/// - `bias`: `[heads, tokens, tokens]`
pub fn attention_padded(
    q: &Tensor<3>,
    k: &Tensor<3>,
    v: &Tensor<3>,
    heads: usize,
    keys: &Tensor<2, Int>,
    bias: Option<&Tensor<3>>,
) -> Option<Tensor<3>> {
    let [b, n, d] = q.dims();
    if heads == 0
        || d % heads != 0
        || k.dims() != [b, n, d]
        || v.dims() != [b, n, d]
        || keys.dims() != [b, n]
        || bias.is_some_and(|t| t.dims() != [heads, n, n])
    {
        return None;
    }
    let (q, k, v) = (host_values(q)?, host_values(k)?, host_values(v)?);
    let bias = match bias {
        Some(t) => Some(host_values(t)?),
        None => None,
    };
    let pad: Vec<f32> = keys
        .clone()
        .into_data()
        .convert::<i64>()
        .try_into_vec::<i64>()
        .ok()?
        .into_iter()
        .map(|m| if m == 0 { f32::MIN } else { 0.0 })
        .collect();
    fn operand(t: &FlexTensor, row: usize, item: usize) -> Operand<'_> {
        Operand { values: t.as_slice::<f32>().expect("contiguous"), row, item }
    }
    let [q, k, v] = [&q, &k, &v].map(|t| operand(t, d, n * d));
    let scores = bias.as_ref().map(|t| (t.as_slice::<f32>().expect("contiguous"), n * n));
    let out = heads_side_by_side([q, k, v], Mask { scores, keys: Some(&pad) }, Dims { b, n, d, heads });
    Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(out, [b, n, d]))))
}

/// `t`'s values in one contiguous run, when `t` is an `f32` tensor of burn's CPU backend without
/// autodiff.
fn host_values<const D: usize>(t: &Tensor<D>) -> Option<FlexTensor> {
    let p = t.clone().try_into_primitive::<Flex>().ok()?;
    (p.dtype() == DType::F32).then(|| contiguous(&p))
}

/// One of Q, K and V: the values from head 0 of item 0 on, rows `row` apart and items `item`.
#[derive(Debug, Clone, Copy)]
struct Operand<'a> {
    values: &'a [f32],
    row: usize,
    item: usize,
}

impl<'a> Operand<'a> {
    /// The values from `head` of `item` on.
    fn at(&self, item: usize, head: usize, dh: usize) -> &'a [f32] {
        &self.values[item * self.item + head * dh..]
    }
}

/// What is added to the scaled scores before the softmax, in this order.
#[derive(Debug, Clone, Copy)]
struct Mask<'a> {
    /// `[tokens, tokens]` matrices, one per head, starting this far apart (0: one for every head);
    /// the same for every item.
    scores: Option<(&'a [f32], usize)>,
    /// `[batch, tokens]`: per item, one value per key, the same for every query.
    keys: Option<&'a [f32]>,
}

impl<'a> Mask<'a> {
    /// Item `item`'s head `head`: its matrix and its keys' row.
    fn of(&self, item: usize, head: usize, n: usize) -> (Option<&'a [f32]>, Option<&'a [f32]>) {
        (
            self.scores.map(|(m, step)| &m[head * step..head * step + n * n]),
            self.keys.map(|m| &m[item * n..(item + 1) * n]),
        )
    }
}

/// Batch, tokens, width and heads of one call.
#[derive(Debug, Clone, Copy)]
struct Dims {
    b: usize,
    n: usize,
    d: usize,
    heads: usize,
}

/// The attention on the values: each (item, head) into its own `[tokens, d_h]` block of a
/// `[batch, heads, tokens, d_h]` buffer, then the blocks interleaved into `[batch, tokens, width]`.
fn heads_side_by_side(qkv: [Operand; 3], mask: Mask, s: Dims) -> Vec<f32> {
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
            let operands = qkv.map(|o| (o.at(item, head, dh), o.row));
            one_head(operands, mask.of(item, head, n), scores, context, n, dh);
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

/// One head of one item: Q, K and V as (values from the head's first row, row stride); the mask
/// as (its `[tokens, tokens]` matrix, its keys' row), see [`Mask`]; `context` (`[tokens, d_h]`)
/// gets the result, `scores` is scratch.
fn one_head(
    [(q, q_row), (k, k_row), (v, v_row)]: [(&[f32], usize); 3],
    (matrix, keys): (Option<&[f32]>, Option<&[f32]>),
    scores: &mut [f32],
    context: &mut [f32],
    n: usize,
    dh: usize,
) {
    // scores[i][j] = Σ_c Q[i][c]·K[j][c]: Kᵀ read through its strides.
    product(scores, n, n, n, dh, (q, q_row, 1), (k, 1, k_row));
    let scale = (dh as f32).sqrt().recip();
    in_widest_vectors(SoftmaxRows { scores, n, scale, matrix, keys });
    product(context, dh, n, dh, n, (scores, n, 1), (v, v_row, 1));
}

/// [`softmax_row`] on each row of a `[tokens, tokens]` score matrix, as one [`Kernel`].
struct SoftmaxRows<'a> {
    scores: &'a mut [f32],
    n: usize,
    scale: f32,
    /// `[tokens, tokens]`, added first.
    matrix: Option<&'a [f32]>,
    /// `[tokens]`, added to every row then.
    keys: Option<&'a [f32]>,
}

impl Kernel for SoftmaxRows<'_> {
    #[inline(always)]
    fn run(self) {
        let n = self.n;
        for (i, s) in self.scores.chunks_exact_mut(n).enumerate() {
            softmax_row(s, self.scale, self.matrix.map(|m| &m[i * n..(i + 1) * n]), self.keys);
        }
    }
}

/// `s ← softmax(s·scale + matrix + keys)` in place (each added where given), as `exp(x − max) / Σ exp(x − max)` (burn's and
/// PyTorch's form). A masked `-inf` gets exactly 0, and so does a score 87 or more below the
/// row's maximum (transformers' `f32::MIN` padding mask); a row masked throughout, or with a NaN
/// score (masked or not), is NaN, as in PyTorch. The maximum and the sum run in [`LANES`] partial
/// results, so that they vectorise.
#[inline(always)]
fn softmax_row(s: &mut [f32], scale: f32, matrix: Option<&[f32]>, keys: Option<&[f32]>) {
    match matrix {
        Some(m) => s.iter_mut().zip(m).for_each(|(x, m)| *x = *x * scale + m),
        None => s.iter_mut().for_each(|x| *x *= scale),
    }
    if let Some(k) = keys {
        s.iter_mut().zip(k).for_each(|(x, k)| *x += k);
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
    use crate::models::test_support::bits;
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
        softmax_row(&mut row, 1.0, None, Some(&[0.0, f32::MIN, 0.0, 0.0]));
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
        let device = Device::flex();
        let tensor = |v: Vec<f32>, dims: [usize; 3]| Tensor::<3>::from_data(TensorData::new(v, dims), &device);
        let qkv = values(b * n * 3 * d, 7);
        let (q, k, v) = (values(b * n * d, 8), values(b * n * d, 9), values(b * n * d, 10));
        // Item i has n − 3·i tokens, then padding.
        let keys: Vec<i64> = (0..b * n).map(|j| i64::from(j % n < n - 3 * (j / n))).collect();
        let key_mask = |from: usize, items: usize| {
            Tensor::<2, Int>::from_data(
                TensorData::new(keys[from * n..(from + items) * n].to_vec(), [items, n]),
                &device,
            )
        };
        let causal = causal(n, &device);
        let runs = || {
            let fused = attention(&tensor(qkv.clone(), [b, n, 3 * d]), heads, Some(&causal)).unwrap();
            let [q, k, v] = [&q, &k, &v].map(|x| tensor(x.clone(), [b, n, d]));
            (bits(fused), bits(attention_padded(&q, &k, &v, heads, &key_mask(0, b), None).unwrap()))
        };
        let whole = runs();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        assert_eq!(one.install(runs), whole, "one thread");
        for item in 0..b {
            let part = |x: &[f32], width: usize| tensor(x[item * n * width..][..n * width].to_vec(), [1, n, width]);
            let fused = bits(attention(&part(&qkv, 3 * d), heads, Some(&causal)).unwrap());
            assert_eq!(fused, whole.0[item * n * d..][..n * d], "item {item}, fused");
            let [q, k, v] = [&q, &k, &v].map(|x| part(x, d));
            let padded = bits(attention_padded(&q, &k, &v, heads, &key_mask(item, 1), None).unwrap());
            assert_eq!(padded, whole.1[item * n * d..][..n * d], "item {item}, padded");
        }
    }

    #[test]
    fn the_padded_attention_is_bert_and_mpnets_within_float_error_and_padding_keys_weigh_nothing() {
        let device = Device::flex();
        for (b, n, d, heads) in [(3, 9, 48, 4), (2, 20, 384, 12), (1, 1, 8, 2)] {
            let tensor =
                |seed: u64| Tensor::<3>::from_data(TensorData::new(values(b * n * d, seed), [b, n, d]), &device);
            let (q, k, v) = (tensor(1), tensor(2), tensor(3));
            // The last item is all tokens; the others end in padding (at least one token each).
            let keys: Vec<i64> = (0..b * n).map(|j| i64::from(j / n == b - 1 || j % n <= (j / n) * 2)).collect();
            let keys = Tensor::<2, Int>::from_data(TensorData::new(keys, [b, n]), &device);
            let pad = crate::models::bert::padding_mask(keys.clone());
            // MPNet's form: a relative position bias per head before the padding.
            let bias = Tensor::<3>::from_data(TensorData::new(values(heads * n * n, 5), [heads, n, n]), &device);
            let burn_bias = bias.clone().unsqueeze_dim::<4>(0);
            let got = attention_padded(&q, &k, &v, heads, &keys, Some(&bias)).expect("flex f32");
            let want = crate::models::bert::burn_attention(
                q.clone(),
                k.clone(),
                v.clone(),
                heads,
                Some(&burn_bias),
                Some(&pad),
                0.0,
            );
            let (got, want) =
                (got.into_data().try_into_vec::<f32>().unwrap(), want.into_data().try_into_vec::<f32>().unwrap());
            let diff = max_diff(&got, &want);
            assert!(diff < 2e-6, "with a bias, b {b} n {n} d {d} heads {heads}: max diff {diff}");
            // BERT's: the padding alone.
            let got = attention_padded(&q, &k, &v, heads, &keys, None).expect("flex f32");
            let want =
                crate::models::bert::burn_attention(q.clone(), k.clone(), v.clone(), heads, None, Some(&pad), 0.0);
            let (got, want) =
                (got.into_data().try_into_vec::<f32>().unwrap(), want.into_data().try_into_vec::<f32>().unwrap());
            let diff = max_diff(&got, &want);
            assert!(diff < 2e-6, "b {b} n {n} d {d} heads {heads}: max diff {diff}");
            // A padding key's value changes nothing, to the bit.
            let mut v2 = v.clone().into_data().try_into_vec::<f32>().unwrap();
            let kd = keys.clone().into_data().convert::<i64>().try_into_vec::<i64>().unwrap();
            for (j, m) in kd.iter().enumerate() {
                if *m == 0 {
                    v2[j * d..(j + 1) * d].fill(1e6);
                }
            }
            let v2 = Tensor::<3>::from_data(TensorData::new(v2, [b, n, d]), &device);
            let again =
                attention_padded(&q, &k, &v2, heads, &keys, None).unwrap().into_data().try_into_vec::<f32>().unwrap();
            assert_eq!(again, got, "b {b} n {n}: a padding value leaked");
        }
    }

    #[test]
    fn other_shapes_and_autodiff_fall_back_to_burn() {
        let device = Device::flex();
        let qkv = Tensor::<3>::from_data(TensorData::new(values(2 * 4 * 12, 3), [2, 4, 12]), &device);
        assert!(attention(&qkv, 3, None).is_none(), "width 4 does not split into 3 heads");
        let wrong_mask = causal(3, &device);
        assert!(attention(&qkv, 2, Some(&wrong_mask)).is_none(), "mask of another size");
        let tracked =
            Tensor::<3>::from_data(TensorData::new(values(2 * 4 * 12, 3), [2, 4, 12]), &device.clone().autodiff());
        assert!(attention(&tracked, 2, None).is_none(), "autodiff keeps burn's operations");
        assert!(attention(&qkv, 2, None).is_some());
        let q = Tensor::<3>::from_data(TensorData::new(values(2 * 4 * 6, 4), [2, 4, 6]), &device);
        let keys = Tensor::<2, Int>::ones([2, 4], &device);
        assert!(attention_padded(&q, &q, &q, 4, &keys, None).is_none(), "width 6 does not split into 4 heads");
        assert!(
            attention_padded(&q, &q, &q, 2, &Tensor::<2, Int>::ones([2, 3], &device), None).is_none(),
            "keys of another size"
        );
        let tracked =
            Tensor::<3>::from_data(TensorData::new(values(2 * 4 * 6, 4), [2, 4, 6]), &device.clone().autodiff());
        assert!(
            attention_padded(&tracked, &tracked, &tracked, 2, &keys, None).is_none(),
            "autodiff keeps burn's operations"
        );
        assert!(attention_padded(&q, &q, &q, 2, &keys, None).is_some());
        let wrong_bias = Tensor::<3>::zeros([2, 4, 3], &device);
        assert!(attention_padded(&q, &q, &q, 2, &keys, Some(&wrong_bias)).is_none(), "bias of another size");
    }
}
