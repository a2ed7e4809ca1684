//! AdamP (Heo et al., "AdamP: Slowing Down the Slowdown for Momentum Optimizers on
//! Scale-invariant Weights"), PCME++'s optimiser (spec `cusa-and-pcmepp.md` §3.10): Adam whose
//! update, for a tensor of two or more dimensions whose gradient is nearly orthogonal to its
//! weights (a scale-invariant weight, as before a normalisation), loses its radial component, and
//! whose decoupled weight decay is then scaled by `wd_ratio`.
//!
//! Per parameter `w` with gradient `g`, at step `t` (as the `adamp` package, whose order of
//! operations this follows so that float32 results agree; `tests/fixtures/optim/` holds its values):
//!
//! ```text
//! m = β1 m + (1 − β1) g        v = β2 v + (1 − β2) g²
//! u = m / (√v / √(1 − β2^t) + ε)
//! ratio = 1
//! if rank(w) ≥ 2, for the channel view (one row per output channel), then the whole tensor as
//! one row: if max_rows |cos(g_row, w_row)| < δ / √(row length):
//!       ŵ = w_row / (‖w_row‖ + ε);  u_row −= ŵ (ŵ · u_row);  ratio = wd_ratio;  stop
//! w = w (1 − lr · wd · ratio) − lr / (1 − β1^t) · u
//! ```
//!
//! A tensor of one dimension gets Adam with decoupled weight decay. burn stores a `Linear`
//! weight as `[in, out]`, PyTorch as `[out, in]`: the rows of the channel view are PyTorch's, so
//! a `Linear` weight's are its columns here ([`AdamP::linear_layout`]; the trainer gives
//! `Linear` weights their own group, see `optim::linear_weights`).

use burn::optim::{AdaptiveMomentumState, LearningRate, Optimizer};
use burn::tensor::{Bool, Device, Tensor};

/// AdamP's settings (the `adamp` package's defaults, PCME++'s values).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamP {
    pub beta_1: f64,
    pub beta_2: f64,
    pub epsilon: f64,
    /// Decoupled weight decay (`w *= 1 − lr · weight_decay · ratio`).
    pub weight_decay: f64,
    /// The threshold's numerator: a view counts as scale-invariant when every row's
    /// `|cos(g, w)|` is below `delta / √(row length)` (0.1).
    pub delta: f64,
    /// The weight decay's factor for a projected tensor (0.1).
    pub wd_ratio: f64,
    /// The tensor is a burn `Linear` weight, `[in, out]`: its output channels are its columns.
    pub linear_layout: bool,
}

impl Default for AdamP {
    fn default() -> Self {
        AdamP {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay: 0.0,
            delta: 0.1,
            wd_ratio: 0.1,
            linear_layout: false,
        }
    }
}

/// Which of AdamP's cases a step took (for tests and tracing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Projection {
    /// Every channel's gradient was nearly orthogonal to its weights.
    Channel,
    /// The whole tensor's was (the channels' were not).
    Layer,
    /// Neither: plain Adam, full weight decay.
    None,
}

impl AdamP {
    /// `tensor` as `[rows, row length]` with PyTorch's rows (output channels first), and back.
    fn channel_view<const D: usize>(&self, tensor: Tensor<D>) -> Tensor<2> {
        let dims = tensor.dims();
        if self.linear_layout && D == 2 {
            tensor.reshape([dims[0], dims[1]]).transpose()
        } else {
            let rows = dims[0];
            let len = dims.iter().product::<usize>() / rows.max(1);
            tensor.reshape([rows, len])
        }
    }

    fn unview<const D: usize>(&self, view: Tensor<2>, dims: [usize; D]) -> Tensor<D> {
        if self.linear_layout && D == 2 {
            view.transpose().reshape(dims)
        } else {
            view.reshape(dims)
        }
    }

    /// AdamP's projection of the update `perturb` (PyTorch's row layout, `[rows, len]`) for the
    /// weights `w` and gradient `g` in the same layout: the update with the radial component of
    /// the first view that passes the test taken out, and the test's verdicts.
    ///
    /// Both views are projected and the verdicts pick between them on the device, so that a step
    /// never waits to read a value back (on a GPU, one read per weight per step would stall the
    /// queue).
    pub fn project(&self, w: Tensor<2>, g: Tensor<2>, perturb: Tensor<2>) -> (Tensor<2>, Verdict) {
        let [rows, len] = w.dims();
        let mut out = Vec::with_capacity(2);
        for shape in [[rows, len], [1, rows * len]] {
            let (wv, gv) = (w.clone().reshape(shape), g.clone().reshape(shape));
            let eps = self.epsilon;
            // PyTorch's `cosine_similarity`: each norm clamped at ε on its own.
            let w_norm = wv.clone().square().sum_dim(1).sqrt();
            let g_norm = gv.clone().square().sum_dim(1).sqrt();
            let dot = (gv * wv.clone()).sum_dim(1);
            let cos = dot.div(g_norm.clamp_min(eps).mul(w_norm.clone().clamp_min(eps))).abs();
            let passes = cos.max().lower_elem(self.delta / (shape[1] as f64).sqrt()).reshape([1, 1]);
            let unit = wv.div(w_norm.add_scalar(eps));
            let p = perturb.clone().reshape(shape);
            let radial = (unit.clone() * p.clone()).sum_dim(1);
            out.push(((p - unit * radial).reshape([rows, len]), passes));
        }
        let (layer, layer_passes) = out.pop().expect("two views");
        let (channel, channel_passes) = out.pop().expect("two views");
        let projected = perturb
            .mask_where(layer_passes.clone().expand([rows, len]), layer)
            .mask_where(channel_passes.clone().expand([rows, len]), channel);
        (projected, Verdict { channel: channel_passes, layer: layer_passes })
    }

    /// One step for one tensor, with the test's verdicts (`None` for a tensor of one dimension).
    fn step_on_device<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdaptiveMomentumState<D>>,
    ) -> (Tensor<D>, AdaptiveMomentumState<D>, Option<Verdict>) {
        let (b1, b2) = (self.beta_1 as f32, self.beta_2 as f32);
        let state = match state {
            Some(mut s) => {
                s.moment_1 = s.moment_1.mul_scalar(b1).add(grad.clone().mul_scalar(1.0 - b1));
                s.moment_2 = s.moment_2.mul_scalar(b2).add(grad.clone().square().mul_scalar(1.0 - b2));
                s.time += 1;
                s
            }
            None => AdaptiveMomentumState::new(
                1,
                grad.clone().mul_scalar(1.0 - b1),
                grad.clone().square().mul_scalar(1.0 - b2),
            ),
        };
        let t = state.time as i32;
        let correction_1 = 1.0 - self.beta_1.powi(t);
        let correction_2 = 1.0 - self.beta_2.powi(t);
        let denom =
            state.moment_2.clone().sqrt().div_scalar(correction_2.sqrt() as f32).add_scalar(self.epsilon as f32);
        let perturb = state.moment_1.clone().div(denom);
        let full_decay = (1.0 - lr * self.weight_decay) as f32;
        let (perturb, decayed, verdict) = if D >= 2 {
            let dims = tensor.dims();
            let (w, g) = (self.channel_view(tensor.clone()), self.channel_view(grad));
            let (p, verdict) = self.project(w, g, self.channel_view(perturb));
            let decayed = if self.weight_decay > 0.0 {
                // The decay factor chosen on the device: `wd_ratio` of it for a projected tensor.
                let device = tensor.device();
                let projected = verdict.channel.clone().bool_or(verdict.layer.clone()).reshape([1; D]);
                let factor = Tensor::<D>::full([1; D], full_decay, &device)
                    .mask_fill(projected, (1.0 - lr * self.weight_decay * self.wd_ratio) as f32);
                tensor.mul(factor.expand(dims))
            } else {
                tensor
            };
            (self.unview(p, dims), decayed, Some(verdict))
        } else if self.weight_decay > 0.0 {
            (perturb, tensor.mul_scalar(full_decay), None)
        } else {
            (perturb, tensor, None)
        };
        let updated = decayed.sub(perturb.mul_scalar((lr / correction_1) as f32));
        (updated, state, verdict)
    }

    /// One step for one tensor, with the case it took (reads the verdicts back: for tests and
    /// tracing, not for the training loop).
    pub fn step_traced<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<AdaptiveMomentumState<D>>,
    ) -> (Tensor<D>, AdaptiveMomentumState<D>, Projection) {
        let (updated, state, verdict) = self.step_on_device(lr, tensor, grad, state);
        (updated, state, verdict.map_or(Projection::None, |v| v.case()))
    }
}

/// AdamP's test for one tensor, as `[1, 1]` booleans on its device.
#[derive(Debug, Clone)]
pub struct Verdict {
    /// Every channel's gradient was nearly orthogonal to its weights.
    pub channel: Tensor<2, Bool>,
    /// The whole tensor's was.
    pub layer: Tensor<2, Bool>,
}

impl Verdict {
    /// The case taken (reads the verdicts back from the device).
    pub fn case(&self) -> Projection {
        let read = |t: &Tensor<2, Bool>| t.clone().into_data().iter::<bool>().next().unwrap_or(false);
        if read(&self.channel) {
            Projection::Channel
        } else if read(&self.layer) {
            Projection::Layer
        } else {
            Projection::None
        }
    }
}

impl Optimizer for AdamP {
    type State<const D: usize> = AdaptiveMomentumState<D>;

    fn step<const D: usize>(
        &self,
        lr: LearningRate,
        tensor: Tensor<D>,
        grad: Tensor<D>,
        state: Option<Self::State<D>>,
    ) -> (Tensor<D>, Option<Self::State<D>>) {
        let (tensor, state, _) = self.step_on_device(lr, tensor, grad, state);
        (tensor, Some(state))
    }

    fn to_device<const D: usize>(mut state: Self::State<D>, device: &Device) -> Self::State<D> {
        state.moment_1 = state.moment_1.to_device(device);
        state.moment_2 = state.moment_2.to_device(device);
        state
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use serde_json::Value;

    fn fixture() -> Value {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/optim/adamp_reference.json");
        serde_json::from_str(&std::fs::read_to_string(p).expect("fixture")).expect("json")
    }

    fn floats(v: &Value) -> Vec<f32> {
        v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
    }

    /// `[r, c]` row-major values transposed (PyTorch's `Linear` layout to burn's, and back).
    fn transposed(v: &[f32], r: usize, c: usize) -> Vec<f32> {
        (0..c).flat_map(|j| (0..r).map(move |i| v[i * c + j])).collect()
    }

    fn replay<const D: usize>(case: &Value, lrs: &[f64], adamp: AdamP) {
        let name = case["name"].as_str().unwrap();
        let shape: Vec<usize> =
            case["shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
        let device = Device::default();
        // burn's Linear weight is the transpose of PyTorch's.
        let linear = adamp.linear_layout;
        let burn_shape = if linear { vec![shape[1], shape[0]] } else { shape.clone() };
        let to_burn = |v: Vec<f32>| if linear { transposed(&v, shape[0], shape[1]) } else { v };
        let dims: [usize; D] = burn_shape.try_into().unwrap();
        let tensor = |v: Vec<f32>| Tensor::<D>::from_data(TensorData::new(to_burn(v), dims), &device);
        let mut w = tensor(floats(&case["init"]));
        let mut state = None;
        for (t, lr) in lrs.iter().enumerate() {
            let g = tensor(floats(&case["grads"][t]));
            let (next, s, branch) = adamp.step_traced(*lr, w, g, state);
            let want_branch = match case["branch"][t].as_str().unwrap() {
                "channel" => Projection::Channel,
                "layer" => Projection::Layer,
                _ => Projection::None,
            };
            assert_eq!(branch, want_branch, "{name} step {}", t + 1);
            let got = next.clone().into_data().try_to_vec::<f32>().unwrap();
            let want = to_burn(floats(&case["after"][t]));
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-6 * (1.0 + b.abs()),
                    "{name} step {} [{i}]: {a} against torch's {b}",
                    t + 1
                );
            }
            (w, state) = (next, Some(s));
        }
    }

    /// The `adamp` package (0.3.0, on PyTorch 2.15) step by step: every case and branch
    /// (channel, layer, none, one-dimensional), a varying rate and weight decay, and a `Linear`
    /// weight in burn's transposed layout (`tests/fixtures/optim/make_adamp_fixture.py`).
    #[test]
    fn adamp_matches_the_adamp_package() {
        let f = fixture();
        let h = &f["hyper"];
        let adamp = AdamP {
            beta_1: h["betas"][0].as_f64().unwrap(),
            beta_2: h["betas"][1].as_f64().unwrap(),
            epsilon: h["eps"].as_f64().unwrap(),
            weight_decay: h["weight_decay"].as_f64().unwrap(),
            delta: h["delta"].as_f64().unwrap(),
            wd_ratio: h["wd_ratio"].as_f64().unwrap(),
            linear_layout: false,
        };
        let lrs: Vec<f64> = f["lr"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let mut seen = std::collections::HashSet::new();
        for case in f["cases"].as_array().unwrap() {
            for b in case["branch"].as_array().unwrap() {
                seen.insert(b.as_str().unwrap().to_string());
            }
            match (case["name"].as_str().unwrap(), case["shape"].as_array().unwrap().len()) {
                ("linear", 2) => {
                    replay::<2>(case, &lrs, AdamP { linear_layout: true, ..adamp });
                }
                (_, 1) => replay::<1>(case, &lrs, adamp),
                (_, 2) => replay::<2>(case, &lrs, adamp),
                (_, 4) => replay::<4>(case, &lrs, adamp),
                (n, d) => panic!("{n}: rank {d}"),
            }
        }
        assert_eq!(seen.len(), 4, "the fixture covers every branch: {seen:?}");
    }

    /// Read in PyTorch's layout, a `Linear` weight in burn's takes another branch: the layout
    /// matters (the fixture's first step is a channel projection in PyTorch's rows).
    #[test]
    fn a_linear_weight_read_in_the_wrong_layout_takes_another_branch() {
        let f = fixture();
        let case = &f["cases"][0];
        assert_eq!(case["name"], "linear");
        assert_eq!(case["branch"][0], "channel");
        let (r, c) = (6, 5);
        let d = Device::default();
        let t = |v: Vec<f32>| Tensor::<2>::from_data(TensorData::new(transposed(&v, r, c), [c, r]), &d);
        let (w, g) = (t(floats(&case["init"])), t(floats(&case["grads"][0])));
        let right = AdamP { linear_layout: true, ..AdamP::default() };
        let wrong = AdamP::default();
        let (_, _, a) = right.step_traced(0.01, w.clone(), g.clone(), None);
        let (_, _, b) = wrong.step_traced(0.01, w, g, None);
        assert_eq!(a, Projection::Channel);
        assert_ne!(b, Projection::Channel);
    }
}
