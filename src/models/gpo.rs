//! GPO, the generalised pooling operator of VSE∞ (Chen et al., CVPR 2021) that PCME++ pools its
//! mean and log-variance tokens with (spec `cusa-and-pcmepp.md` §3.1): a weighted sum of each
//! feature dimension's values sorted in descending order, with weights that depend only on the
//! number of tokens `n`:
//!
//! ```text
//! pe[k]    32-d sinusoidal encoding of position k = 0..n−1
//! g_k      mean of a bidirectional GRU's (32 → 32) forward and backward outputs over pe[0..n]
//! θ        softmax_k(w · g_k / 0.1)           (w: Linear 32 → 1, no bias)
//! pooled_d = Σ_k θ_k · sort_desc(x[0..n, d])_k
//! ```
//!
//! The backward direction of each sequence starts at its own last token (PyTorch's packed
//! sequences), not at the batch's longest. Weights are named as PyTorch's `nn.GRU`
//! (`gru.weight_ih_l0` `[96, 32]` with the gates stacked r, z, n; `_reverse` for the backward
//! direction) and `linear.weight`, and start as PyTorch's defaults (uniform in ±1/√32).

use std::collections::BTreeMap;

use burn::module::Module;
use burn::nn::gru::{Gru, GruConfig};
use burn::nn::{GateController, Linear};
use burn::tensor::activation::softmax;
use burn::tensor::{Bool, Device, Int, Tensor, TensorData};

use super::weights::Weights;

/// Width of the positional encoding and of the GRU's state.
pub const GPO_DIM: usize = 32;
/// The softmax temperature of the scores.
const TEMPERATURE: f64 = 0.1;

#[derive(Module, Debug)]
pub struct Gpo {
    forward: Gru,
    reverse: Gru,
    linear: Linear,
}

/// PyTorch's sinusoidal encoding of positions `0..n`, `[n, 32]` row-major, in float32 as
/// PyTorch computes it (`exp(2i · −ln(10000)/32)`, then `sin`/`cos` of `k` times it).
pub fn positional_encoding(n: usize) -> Vec<f32> {
    let c = -(10000f64.ln() / GPO_DIM as f64) as f32;
    let div: Vec<f32> = (0..GPO_DIM / 2).map(|i| ((2 * i) as f32 * c).exp()).collect();
    let mut pe = vec![0f32; n * GPO_DIM];
    for k in 0..n {
        for (i, d) in div.iter().enumerate() {
            let a = k as f32 * d;
            pe[k * GPO_DIM + 2 * i] = a.sin();
            pe[k * GPO_DIM + 2 * i + 1] = a.cos();
        }
    }
    pe
}

/// One direction of PyTorch's `nn.GRU` from its stacked tensors (`weight_ih{suffix}` `[96, 32]`,
/// rows r, z, n; `weight_hh`, `bias_ih`, `bias_hh`).
fn gru(w: &Weights, prefix: &str, suffix: &str, device: &Device) -> Gru {
    let h = GPO_DIM;
    let bound = (h as f64).sqrt().recip();
    let values = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().expect("f32 weights");
    let matrix =
        |kind: &str| values(w.tensor_uniform(&format!("{prefix}.{kind}_l0{suffix}"), [3 * h, h], bound, device));
    let vector = |kind: &str| {
        let t: Tensor<1> = w.tensor_uniform(&format!("{prefix}.{kind}_l0{suffix}"), [3 * h], bound, device);
        values(t.unsqueeze())
    };
    let (w_ih, w_hh) = (matrix("weight_ih"), matrix("weight_hh"));
    let (b_ih, b_hh) = (vector("bias_ih"), vector("bias_hh"));
    // Gate `g` (0 = r, 1 = z, 2 = n) as a burn Linear: the `[h, h]` block transposed to `[in, out]`.
    let linear = |weight: &[f32], bias: &[f32], g: usize| {
        let mut t = vec![0f32; h * h];
        for o in 0..h {
            for i in 0..h {
                t[i * h + o] = weight[(g * h + o) * h + i];
            }
        }
        Linear {
            weight: burn::module::Param::from_tensor(Tensor::from_data(TensorData::new(t, [h, h]), device)),
            bias: Some(burn::module::Param::from_tensor(Tensor::from_data(
                TensorData::new(bias[g * h..(g + 1) * h].to_vec(), [h]),
                device,
            ))),
        }
    };
    let gate =
        |g| GateController { input_transform: linear(&w_ih, &b_ih, g), hidden_transform: linear(&w_hh, &b_hh, g) };
    // PyTorch's GRU: the reset gate applied after the hidden state's product (`reset_after`).
    let base = GruConfig::new(h, h, true).with_reset_after(true).init(device);
    Gru { reset_gate: gate(0), update_gate: gate(1), new_gate: gate(2), ..base }
}

impl Gpo {
    /// A GPO from the tensors under `prefix` (`{prefix}.gru.*`, `{prefix}.linear.weight`).
    pub fn from_weights(w: &Weights, prefix: &str, device: &Device) -> Gpo {
        let g = format!("{prefix}.gru");
        Gpo {
            forward: gru(w, &g, "", device),
            reverse: gru(w, &g, "_reverse", device),
            linear: w.linear_named(&format!("{prefix}.linear.weight"), None, GPO_DIM, 1, device),
        }
    }

    /// The pooling weights θ of each sequence length in `lengths` (distinct, ascending),
    /// `[lengths.len(), max]`, zero past each length.
    pub fn weights(&self, lengths: &[usize], device: &Device) -> Tensor<2> {
        let (m, max) = (lengths.len(), lengths.last().copied().unwrap_or(0));
        let pe = positional_encoding(max);
        // Forward direction: position k's output depends on positions 0..=k only, so one run over
        // the longest serves every length.
        let x = Tensor::<3>::from_data(TensorData::new(pe.clone(), [1, max, GPO_DIM]), device);
        let forward = self.forward.forward(x, None).expand([m, max, GPO_DIM]);
        // Backward direction: each length's positions n−1, …, 0 as a sequence of its own (zeros
        // after), run forwards, then put back in position order.
        let mut rev = vec![0f32; m * max * GPO_DIM];
        let mut back = vec![0i64; m * max * GPO_DIM];
        for (r, &n) in lengths.iter().enumerate() {
            for j in 0..n {
                let k = n - 1 - j;
                rev[(r * max + j) * GPO_DIM..][..GPO_DIM].copy_from_slice(&pe[k * GPO_DIM..][..GPO_DIM]);
                back[(r * max + k) * GPO_DIM..][..GPO_DIM].fill(j as i64);
            }
        }
        let x = Tensor::<3>::from_data(TensorData::new(rev, [m, max, GPO_DIM]), device);
        let idx = Tensor::<3, Int>::from_data(TensorData::new(back, [m, max, GPO_DIM]), device);
        let reverse = self.reverse.forward(x, None).gather(1, idx);
        let scores = self.linear.forward((forward + reverse).div_scalar(2.0)).reshape([m, max]);
        let invalid = Self::invalid(lengths, max, device);
        softmax(scores.mask_fill(invalid, -10000.0).div_scalar(TEMPERATURE), 1)
    }

    /// `[rows, max]`: true at positions at or past each row's length.
    fn invalid(lengths: &[usize], max: usize, device: &Device) -> Tensor<2, Bool> {
        let v: Vec<bool> = lengths.iter().flat_map(|&n| (0..max).map(move |k| k >= n)).collect();
        Tensor::<2, Bool>::from_data(TensorData::new(v, [lengths.len(), max]), device)
    }

    /// Pools the first `lengths[b]` tokens of each row of `features`.
    ///
    /// # Shapes
    /// - `features`: `[B, N, D]`, `lengths`: `B` values in `1..=N` → `[B, D]`
    pub fn forward(&self, features: Tensor<3>, lengths: &[usize]) -> Tensor<2> {
        let [b, _, d] = features.dims();
        let device = features.device();
        let distinct: Vec<usize> =
            lengths.iter().copied().collect::<std::collections::BTreeSet<_>>().into_iter().collect();
        let row: BTreeMap<usize, usize> = distinct.iter().enumerate().map(|(i, &l)| (l, i)).collect();
        let theta = self.weights(&distinct, &device); // [m, max]
        let max = distinct.last().copied().unwrap_or(0);
        let pick: Vec<i64> = lengths.iter().map(|l| row[l] as i64).collect();
        let theta = theta.select(0, Tensor::<1, Int>::from_data(TensorData::new(pick, [b]), &device));
        let features = features.slice([0..b, 0..max, 0..d]);
        let invalid = Self::invalid(lengths, max, &device).unsqueeze_dim::<3>(2).expand([b, max, d]);
        let sorted = features.mask_fill(invalid.clone(), -10000.0).sort_descending(1).mask_fill(invalid, 0.0);
        (sorted * theta.unsqueeze_dim::<3>(2)).sum_dim(1).reshape([b, d])
    }
}

/// VSE∞'s size augmentation, PCME++'s image token dropping (spec `cusa-and-pcmepp.md` §3.9,
/// rate 0.2), for one training step: which tokens each image keeps, drawn from
/// `(seed, step, row)` alone, so that a resumed run drops the same ones.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenDrop {
    pub rate: f64,
    pub seed: u64,
    pub step: u64,
}

impl TokenDrop {
    /// The tokens (of `n`, ascending) that row `row` keeps. With `q ~ U(0, 1)`: when `q > rate`,
    /// token `k` stays iff `u_k > rate · q` (`u_k ~ U(0, 1)`); otherwise every token stays.
    /// Should every `u_k` fall below, the token with the largest stays: GPO pools at least one
    /// (the reference would pool none; with its 49 or more tokens that never happens, with the
    /// four cells of a 2 × 2 grid it is one draw in a few thousand).
    pub fn keep(&self, row: usize, n: usize) -> Vec<usize> {
        let mut rng = crate::rng::RowRng::new(self.seed, "image_token_drop", &format!("{}/{row}", self.step));
        let mut unit = || (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let q = unit();
        if q <= self.rate {
            return (0..n).collect();
        }
        let u: Vec<f64> = (0..n).map(|_| unit()).collect();
        let kept: Vec<usize> = (0..n).filter(|&k| u[k] > self.rate * q).collect();
        if kept.is_empty() {
            let best = (0..n).max_by(|&a, &b| u[a].total_cmp(&u[b])).into_iter().collect();
            return best;
        }
        kept
    }

    /// `tokens` with each row's kept tokens moved to the front, in order, and their counts (the
    /// rest of each row is padding, which GPO leaves out).
    ///
    /// # Shapes
    /// - `tokens`: `[B, N, D]` → `[B, N, D]`
    pub fn apply(&self, tokens: Tensor<3>) -> (Tensor<3>, Vec<usize>) {
        let [b, n, d] = tokens.dims();
        let mut index = Vec::with_capacity(b * n);
        let mut lengths = Vec::with_capacity(b);
        for row in 0..b {
            let kept = self.keep(row, n);
            lengths.push(kept.len());
            index.extend(kept.iter().map(|&k| k as i64));
            index.extend(std::iter::repeat_n(0i64, n - kept.len()));
        }
        let device = tokens.device();
        let index = Tensor::<2, Int>::from_data(TensorData::new(index, [b, n]), &device);
        (tokens.gather(1, index.unsqueeze_dim::<3>(2).expand([b, n, d])), lengths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    /// The draws follow §3.9, measured against closed forms. With rate r and
    /// `n` tokens, a token is dropped with probability `E[r q; q > r] = r (1 − r²) / 2` and a row
    /// keeps all its tokens with probability `r + ∫_r^1 (1 − r q)^n dq`.
    #[test]
    fn token_drop_draws_as_the_size_augmentation() {
        let (r, n, rows) = (0.2, 49, 20_000);
        let drop = TokenDrop { rate: r, seed: 7, step: 3 };
        let (mut dropped, mut whole) = (0usize, 0usize);
        for row in 0..rows {
            let kept = drop.keep(row, n);
            assert!(!kept.is_empty() && kept.windows(2).all(|w| w[0] < w[1]) && kept[kept.len() - 1] < n);
            dropped += n - kept.len();
            whole += usize::from(kept.len() == n);
        }
        let p_drop = dropped as f64 / (rows * n) as f64;
        assert!((p_drop - r * (1.0 - r * r) / 2.0).abs() < 0.004, "{p_drop}");
        // ∫_r^1 (1 − r q)^n dq = [(1 − r²)^(n+1) − (1 − r)^(n+1)] / (r (n + 1)).
        let m = (n + 1) as f64;
        let p_whole = r + ((1.0 - r * r).powf(m) - (1.0 - r).powf(m)) / (r * m);
        let got = whole as f64 / rows as f64;
        assert!((got - p_whole).abs() < 0.01, "{got} against {p_whole}");
        // From (seed, step, row) alone.
        assert_eq!(drop.keep(5, n), drop.keep(5, n));
        let moved = (0..50).filter(|&row| drop.keep(row, n) != TokenDrop { step: 4, ..drop }.keep(row, n)).count();
        assert!(moved > 30, "{moved}");
        // One token: it always stays.
        assert!((0..1000).all(|row| drop.keep(row, 1) == vec![0]));
    }

    #[test]
    fn dropped_tokens_leave_the_kept_ones_first_in_order() {
        let d = Device::default();
        let (b, n) = (64, 6);
        let values: Vec<f32> = (0..b * n * 2).map(|i| (i / 2) as f32).collect();
        let tokens = Tensor::<3>::from_data(TensorData::new(values, [b, n, 2]), &d);
        let drop = TokenDrop { rate: 0.5, seed: 1, step: 0 };
        let (out, lengths) = drop.apply(tokens);
        let out = out.into_data().try_to_vec::<f32>().unwrap();
        assert!(lengths.iter().any(|&l| l < n), "something was dropped: {lengths:?}");
        for (row, &len) in lengths.iter().enumerate() {
            let kept = drop.keep(row, n);
            assert_eq!(len, kept.len());
            for (slot, &k) in kept.iter().enumerate() {
                let at = (row * n + slot) * 2;
                assert_eq!(out[at..at + 2], [(row * n + k) as f32; 2], "row {row} slot {slot}");
            }
        }
    }

    fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    fn close(got: &[f32], want: &[f32], tol: f32, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (a, b)) in got.iter().zip(want).enumerate() {
            assert!((a - b).abs() <= tol, "{what}[{i}]: {a} against PyTorch's {b}");
        }
    }

    /// GPO in PyTorch (`nn.GRU` on packed sequences; `tests/fixtures/gpo/make_gpo_fixture.py`):
    /// the encoding, the weights per length, the pooled features and their gradient, for rows
    /// of lengths 7, 4 and 1 (the backward direction of the length-4 row starting at its own end
    /// changes its weights by ~1e-2).
    #[test]
    fn gpo_matches_pytorch() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/gpo/gpo_reference.json");
        let f: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        close(&positional_encoding(7), &floats(&f["pe7"]), 2e-6, "pe");
        let mut parts = Vec::new();
        for (name, shape) in f["gru_shapes"].as_object().unwrap() {
            let shape: Vec<usize> = shape.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            parts.push((format!("gpo.gru.{name}"), shape, floats(&f["gru"][name])));
        }
        parts.push(("gpo.linear.weight".into(), vec![1, GPO_DIM], floats(&f["linear_weight"])));
        let w = Weights::from_parts(parts);
        let device = Device::default().autodiff();
        let gpo = Gpo::from_weights(&w, "gpo", &device);
        w.finish(&[]).unwrap();
        let lengths: Vec<usize> =
            f["lengths"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let x = Tensor::<3>::from_data(TensorData::new(floats(&f["features"]), [3, 7, 5]), &device).require_grad();
        let pooled = gpo.forward(x.clone(), &lengths);
        close(&pooled.clone().into_data().try_to_vec::<f32>().unwrap(), &floats(&f["pooled"]), 2e-5, "pooled");
        // The weights per row (rows of distinct lengths, ascending: 1, 4, 7).
        let theta = gpo.weights(&[1, 4, 7], &device).into_data().try_to_vec::<f32>().unwrap();
        let want = floats(&f["weights"]);
        for (row, len) in [(2, 0), (1, 1), (0, 2)] {
            close(&theta[len * 7..][..7], &want[row * 7..][..7], 2e-6, &format!("weights of row {row}"));
        }
        // Gradients flow to the features through the sort (and to the GRU, which trains).
        let c = Tensor::<2>::from_data(TensorData::new(floats(&f["C"]), [3, 5]), &device);
        let grads = (pooled * c).sum().backward();
        let g = x.grad(&grads).unwrap().into_data().try_to_vec::<f32>().unwrap();
        close(&g, &floats(&f["grad_features"]), 2e-6, "grad");
        let w_grad = gpo.linear.weight.val().grad(&grads).unwrap();
        assert!(w_grad.abs().sum().into_scalar::<f32>() > 0.0, "no gradient reaches the scores");
    }
}
