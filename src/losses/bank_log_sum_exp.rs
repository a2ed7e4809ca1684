//! The denominator of the memory-bank loss (Fistful eqs. 1–2, spec `bow-and-otter.md` §4),
//! `log Σ_j exp(s · q_i·k_j)` of each query `q_i` against every bank row `k_j`, `s = 1/τ`. On
//! burn's CPU backend under autodiff it is one autodiff operation: the similarities of a group of
//! queries are one matrix product, each row's exponentials are taken in one pass and kept, and the
//! backward pass is one more product per group. The composition of burn's operations (a product,
//! the scale, a log-softmax and a one-hot product, each allocating a `[B, K]` tensor, with more
//! such passes backward) took 16.3 ms forward and backward for the loss's two directions at the
//! demo's `B = 64, K = 8192, D = 64` on the 2-core development machine, and this operation 3.1–6.0
//! ms (the `probe` test; its composition, without the one-hot product, 12.7–15.0 ms). Elsewhere
//! (a GPU, ndarray, no autodiff) the function composes burn's operations.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{Tensor, TensorData};
use rayon::prelude::*;

use super::common::scale_by;
use crate::models::host_autodiff::{contiguous, primitive, product};

/// `log Σ_j exp(s · q_i·k_j)` for each row `q_i` of `queries`; `keys` carry no gradient (the bank
/// is detached), `queries` and `scale` may.
///
/// # Shapes
/// - `queries`: `[B, D]`, `keys`: `[K, D]`, `scale`: `[1]` → `[B]`
pub fn log_sum_exp(queries: Tensor<2>, keys: Tensor<2>, scale: Tensor<1>) -> Tensor<1> {
    let [b, d] = queries.dims();
    let [k, dk] = keys.dims();
    assert!(d == dk && k > 0, "log_sum_exp: queries [{b}, {d}] against keys [{k}, {dk}]");
    host(&queries, &keys, &scale).unwrap_or_else(|| composed(queries, keys, scale))
}

/// [`log_sum_exp`] composed of burn's operations (any device).
fn composed(queries: Tensor<2>, keys: Tensor<2>, scale: Tensor<1>) -> Tensor<1> {
    let b = queries.dims()[0];
    let logits = scale_by(queries.matmul(keys.detach().transpose()), scale);
    let max = logits.clone().max_dim(1).detach();
    ((logits - max.clone()).exp().sum_dim(1).log() + max).reshape([b])
}

/// Queries per task: the unit of the parallel loops. Each query's row is computed alone, so the
/// values do not depend on the number of threads.
const ROWS: usize = 8;

/// Keys per task of the products: each task's product reads its keys once.
const KEYS: usize = 1024;

/// A pointer shared by tasks that write disjoint parts of its buffer.
#[derive(Clone, Copy)]
struct SyncPtr(*mut f32);
// SAFETY: the tasks write disjoint elements (see the uses).
unsafe impl Send for SyncPtr {}
unsafe impl Sync for SyncPtr {}

impl SyncPtr {
    /// The pointer `offset` values on (a method, so that closures capture the whole `SyncPtr`).
    ///
    /// # Safety
    /// `offset` lies within the buffer.
    unsafe fn at(self, offset: usize) -> *mut f32 {
        unsafe { self.0.add(offset) }
    }
}

/// Each row's exponentials are summed in blocks of this many values (eight `f32` lanes), and the
/// blocks' sums in `f64`.
const BLOCK: usize = 256;

/// [`log_sum_exp`] as one operation, when every tensor is an `f32` tensor of burn's CPU backend
/// under autodiff; `None` otherwise, with nothing consumed.
fn host(queries: &Tensor<2>, keys: &Tensor<2>, scale: &Tensor<1>) -> Option<Tensor<1>> {
    let (q, kp, sp) = (primitive(queries)?, primitive(keys)?, primitive(scale)?);
    let ([b, d], [k, _]) = (queries.dims(), keys.dims());
    let q_values = contiguous(q.primitive());
    let keys_values = contiguous(kp.primitive());
    let s = contiguous(sp.primitive()).as_slice::<f32>().expect("contiguous")[0];
    let (qv, kv) =
        (q_values.as_slice::<f32>().expect("contiguous"), keys_values.as_slice::<f32>().expect("contiguous"));

    // exps[i, j] = exp(s·q_i·k_j − m_i), with m_i the row's largest logit. The similarities
    // q·kᵀ are taken a block of keys at a time (each key read once; the keys are read transposed,
    // element (dim, j) at j·d + dim), then the rows a group at a time.
    let mut exps = vec![0f32; b * k];
    let blocks: Vec<(usize, &[f32])> = kv.chunks(KEYS * d).enumerate().map(|(i, c)| (i * KEYS, c)).collect();
    let out = SyncPtr(exps.as_mut_ptr());
    blocks.par_iter().for_each(|&(first, keys)| {
        let n = keys.len() / d.max(1);
        // SAFETY: block `first..first + n` writes columns `first..first + n` of each of the `b`
        // rows of `exps` (`b·k` values), and no other block writes them; `exps` outlives the loop.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.at(first), (b - 1) * k + n) };
        product(dst, k, b, n, d, (qv, d, 1), (keys, 1, d));
    });
    let rows: Vec<Row> = exps
        .par_chunks_mut(ROWS * k)
        .flat_map_iter(|e| e.chunks_exact_mut(k).map(|row| exponentials(row, s)).collect::<Vec<_>>())
        .collect();
    let out: Vec<f32> = rows.iter().map(|r| r.log_sum_exp).collect();
    let out = FlexTensor::from_data(TensorData::new(out, [b]));

    let output = match HostLogSumExp.prepare::<NoCheckpointing>([q.node(), sp.node()]).compute_bound().stateful() {
        OpsKind::Tracked(prep) => prep.finish(State { exps, rows, keys: keys_values, dims: [b, k, d], scale: s }, out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Some(Tensor::from_primitive::<Autodiff<Flex>>(output))
}

/// What a row of the forward pass leaves for the output and the backward pass.
#[derive(Debug, Clone, Copy)]
struct Row {
    log_sum_exp: f32,
    /// `1 / Σ_j exps[j]`: the softmax is `exps · inv_sum`.
    inv_sum: f32,
    /// `Σ_j softmax_j · q·k_j`: the derivative of the row's output with respect to `s`.
    expected_similarity: f32,
}

/// Turns a row of similarities into `exp(s·x − m)` in place, `m` the row's largest logit, and
/// returns the row's [`Row`]. A NaN among the similarities (or in `s`) makes the output NaN.
fn exponentials(row: &mut [f32], s: f32) -> Row {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let mut max = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, x| if s * x > m { s * x } else { m });
    for c in chunks {
        for l in 0..8 {
            let v = s * c[l];
            lanes[l] = if v > lanes[l] { v } else { lanes[l] };
        }
    }
    for l in lanes {
        max = if l > max { l } else { max };
    }
    let (mut sum, mut weighted) = (0f64, 0f64);
    for block in row.chunks_mut(BLOCK) {
        let (mut z, mut zx) = ([0f32; 8], [0f32; 8]);
        let mut chunks = block.chunks_exact_mut(8);
        for c in &mut chunks {
            for l in 0..8 {
                let e = exp(s * c[l] - max);
                z[l] += e;
                zx[l] += e * c[l];
                c[l] = e;
            }
        }
        for x in chunks.into_remainder() {
            let e = exp(s * *x - max);
            sum += e as f64;
            weighted += (e * *x) as f64;
            *x = e;
        }
        sum += z.iter().map(|v| *v as f64).sum::<f64>();
        weighted += zx.iter().map(|v| *v as f64).sum::<f64>();
    }
    Row {
        log_sum_exp: (max as f64 + sum.ln()) as f32,
        inv_sum: (1.0 / sum) as f32,
        expected_similarity: (weighted / sum) as f32,
    }
}

/// `e^x` in `f32` to within two units in the last place, in operations the compiler vectorises
/// (libm's `expf` is a call per value): `e^x = 2^k · e^r` with `k = round(x / ln 2)` and
/// `|r| ≤ ln 2 / 2`, `e^r` by its Taylor polynomial to degree 7 (remainder below 1e-8 relative).
/// Below −87 the result is `e^−87` (≈ 1.6e-38, where the true value is smaller still or
/// subnormal); a NaN stays NaN.
#[inline(always)]
fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 in two parts, the first with few enough bits that k·LN2_HI is exact.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 · 2^23: adding it rounds to an integer, which then sits in the low mantissa bits.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let k = shifted - ROUND;
    let r = x - k * LN2_HI - k * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    let k_int = shifted.to_bits() as i32 - ROUND.to_bits() as i32;
    p * f32::from_bits(((k_int + 127) << 23) as u32)
}

/// The backward step of [`host`].
#[derive(Debug)]
struct HostLogSumExp;

/// The forward pass's exponentials and rows, the keys and `[B, K, D]`.
#[derive(Debug, Clone)]
struct State {
    exps: Vec<f32>,
    rows: Vec<Row>,
    keys: FlexTensor,
    dims: [usize; 3],
    scale: f32,
}

impl Backward<Flex, 2> for HostLogSumExp {
    type State = State;

    /// With `p_ij` row `i`'s softmax and `g_i` its output's gradient: `∂q_i = g_i·s·Σ_j p_ij k_j`
    /// and `∂s = Σ_i g_i Σ_j p_ij q_i·k_j`.
    fn backward(self, ops: Ops<State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_q, node_s] = ops.parents;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let g = grad.as_slice::<f32>().expect("contiguous");
        let State { exps, rows, keys, dims: [b, k, d], scale } = ops.state;
        if let Some(node) = node_q {
            let kv = keys.as_slice::<f32>().expect("contiguous");
            // Σ_j exps_ij k_j, a block of keys per task, the blocks' sums added in block order.
            let partials: Vec<Vec<f32>> = kv
                .par_chunks(KEYS * d)
                .enumerate()
                .map(|(i, keys)| {
                    let n = keys.len() / d.max(1);
                    let mut part = vec![0f32; b * d];
                    product(&mut part, d, b, d, n, (&exps[i * KEYS..], k, 1), (keys, d, 1));
                    part
                })
                .collect();
            let mut dq = vec![0f32; b * d];
            for part in partials {
                dq.iter_mut().zip(part).for_each(|(a, p)| *a += p);
            }
            for (out, (g, row)) in dq.chunks_exact_mut(d).zip(g.iter().zip(&rows)) {
                let factor = g * scale * row.inv_sum;
                out.iter_mut().for_each(|v| *v *= factor);
            }
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(dq, [b, d])));
        }
        if let Some(node) = node_s {
            let ds: f64 = g.iter().zip(&rows).map(|(g, r)| *g as f64 * r.expected_similarity as f64).sum();
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(vec![ds as f32], [1])));
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution, Tensor, TensorData};

    use super::composed;
    use crate::models::test_support::{assert_close, values};

    /// The output and the gradients of the queries and the scale (of a weighted sum of the
    /// output) equal burn's composition: row counts below, at and above a task's `ROWS`, keys of
    /// fewer and more than a `BLOCK` (and not a multiple of the eight lanes), a negative scale, a
    /// strided (transposed) query tensor, and a large scale whose logits span far more than
    /// `f32`'s exponent range.
    #[test]
    fn equals_burns_composition() {
        let device = Device::flex().autodiff();
        for (b, k, d, s, transposed) in [
            (3, 5, 4, 2.0f32, false),
            (8, 300, 7, 50.0, false),
            (21, 1000, 16, 14.3, true),
            (9, 37, 3, -3.0, false),
            (4, 600, 8, 500.0, false),
            // Several blocks of `KEYS`, the last one short.
            (6, 2500, 5, 20.0, false),
        ] {
            let base =
                Tensor::<2>::random(if transposed { [d, b] } else { [b, d] }, Distribution::Normal(0.0, 0.5), &device);
            let q = if transposed { base.transpose() } else { base }.detach().require_grad();
            let keys = Tensor::<2>::random([k, d], Distribution::Normal(0.0, 0.5), &device);
            let scale = Tensor::<1>::from_data(TensorData::new(vec![s], [1]), &device).require_grad();
            let weights = Tensor::<1>::random([b], Distribution::Normal(0.0, 1.0), &device);
            let got = super::log_sum_exp(q.clone(), keys.clone(), scale.clone());
            let want = composed(q.clone(), keys, scale.clone());
            let what = format!("B {b} K {k} D {d} s {s} transposed {transposed}");
            assert_close(&values(got.clone()), &values(want.clone()), 1e-5, &format!("output {what}"));
            let gradients = |out: Tensor<1>| {
                let g = (out * weights.clone()).sum().backward();
                [
                    q.grad(&g).map(values).expect("a query gradient"),
                    scale.grad(&g).map(values).expect("a scale gradient"),
                ]
            };
            let [gq, gs] = gradients(got);
            let [wq, ws] = gradients(want);
            assert_close(&gq, &wq, 1e-4, &format!("query gradient {what}"));
            assert_close(&gs, &ws, 1e-4, &format!("scale gradient {what}"));
        }
    }

    /// Untracked queries and scale: the output alone, equal to the composition.
    #[test]
    fn untracked_inputs_give_the_output_alone() {
        let device = Device::flex().autodiff();
        let q = Tensor::<2>::random([5, 6], Distribution::Normal(0.0, 1.0), &device);
        let keys = Tensor::<2>::random([40, 6], Distribution::Normal(0.0, 1.0), &device);
        let scale = Tensor::<1>::from_data(TensorData::new(vec![7f32], [1]), &device);
        let got = super::log_sum_exp(q.clone(), keys.clone(), scale.clone());
        assert_close(&values(got), &values(composed(q, keys, scale)), 1e-5, "untracked");
    }

    /// A NaN among the queries makes its row NaN (and only its row); off the host path (here
    /// without autodiff) burn's composition gives the same values.
    #[test]
    fn nan_propagates_and_other_devices_compose() {
        let device = Device::flex().autodiff();
        let mut v: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
        v[5] = f32::NAN;
        let q = Tensor::<2>::from_data(TensorData::new(v.clone(), [3, 4]), &device);
        let keys = Tensor::<2>::random([20, 4], Distribution::Normal(0.0, 1.0), &device);
        let scale = Tensor::<1>::from_data(TensorData::new(vec![3f32], [1]), &device);
        let out = values(super::log_sum_exp(q, keys.clone(), scale));
        assert!(out[0].is_finite() && out[1].is_nan() && out[2].is_finite(), "{out:?}");

        let plain = Device::flex();
        v[5] = 0.5;
        let q = Tensor::<2>::from_data(TensorData::new(v.clone(), [3, 4]), &plain);
        let keys_plain = Tensor::<2>::from_data(keys.into_data(), &plain);
        let scale = Tensor::<1>::from_data(TensorData::new(vec![3f32], [1]), &plain);
        let got = values(super::log_sum_exp(q.clone(), keys_plain.clone(), scale.clone()));
        let q_ad = Tensor::<2>::from_data(TensorData::new(v, [3, 4]), &device);
        let host = values(super::log_sum_exp(
            q_ad,
            Tensor::<2>::from_data(keys_plain.into_data(), &device),
            Tensor::<1>::from_data(TensorData::new(vec![3f32], [1]), &device),
        ));
        assert_close(&got, &host, 1e-5, "composed against host");
    }

    /// Timing probe (not a test of anything): the memory-bank loss's two directions, forward and
    /// backward, at the demo's `B = 64, K = 8192, D = 64`, this operation against burn's
    /// composition: `cargo test --release --lib bank_log_sum_exp::tests::probe -- --ignored
    /// --nocapture`.
    #[test]
    #[ignore]
    fn probe() {
        let device = Device::flex().autodiff();
        let (b, k, d) = (64, 8192, 64);
        let keys = [(); 2].map(|_| Tensor::<2>::random([k, d], Distribution::Normal(0.0, 0.1), &device));
        let q = [(); 2].map(|_| Tensor::<2>::random([b, d], Distribution::Normal(0.0, 0.1), &device).require_grad());
        let scale = Tensor::<1>::from_data(TensorData::new(vec![50f32], [1]), &device);
        for host in [true, false, true, false] {
            let t = std::time::Instant::now();
            for _ in 0..50 {
                let f = if host { super::log_sum_exp } else { composed };
                let loss =
                    (0..2).map(|i| f(q[i].clone(), keys[1 - i].clone(), scale.clone()).mean()).reduce(|a, b| a + b);
                let g = loss.expect("two directions").backward();
                let _ = q[0].grad(&g);
            }
            eprintln!("host {host}: {:.2} ms", t.elapsed().as_secs_f64() * 1e3 / 50.0);
        }
    }

    /// The vectorisable `exp` is within two units in the last place of the exact value over the
    /// range the rows use (`x ≤ 0`, down to the clamp at −87) and a little above.
    #[test]
    fn exp_is_within_two_ulp() {
        let mut worst = 0f64;
        for i in 0..=2_000_000 {
            let x = -87.0f32 + 95.0 * i as f32 / 2_000_000.0;
            let want = (x as f64).exp();
            let ulp = (want as f32).to_bits();
            let ulp = (f32::from_bits(ulp + 1) - want as f32) as f64;
            worst = worst.max((super::exp(x) as f64 - want).abs() / ulp);
        }
        assert!(worst <= 2.0, "worst error {worst} ulp");
        assert_eq!(super::exp(-200.0), super::exp(-87.0));
        assert!(super::exp(f32::NAN).is_nan());
    }
}
