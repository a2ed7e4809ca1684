//! Numeric building blocks shared by the loss modules: row normalisation, row-wise soft cross
//! entropy, KL divergence with the `0·log 0 = 0` convention (spec `bow-and-otter.md` §7.2 item 8),
//! scalar helpers and the learnable logit scale of CLIP / OTTER (spec `bow-and-otter.md` §5.5).
//! Every function works on any burn device and keeps the autodiff graph of its inputs.

use burn::module::{Module, Param, ParamId};
use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

pub use crate::models::pooling::l2_normalize;

/// A scalar tensor (shape `[1]`) on `device`, without gradient.
pub fn scalar(value: f64, device: &Device) -> Tensor<1> {
    Tensor::from_data(TensorData::new(vec![value as f32], [1]), device)
}

/// The value of a one-element tensor.
pub fn value(t: &Tensor<1>) -> f32 {
    t.clone().into_scalar::<f32>()
}

/// Multiplies every entry of `x` by the scalar tensor `s` (keeping the gradient of `s`).
///
/// # Shapes
/// - `x`: `[rows, cols]`, `s`: `[1]` → `[rows, cols]`
pub fn scale_by(x: Tensor<2>, s: Tensor<1>) -> Tensor<2> {
    x * s.reshape([1, 1])
}

/// Cosine similarities of the rows of `a` against the rows of `b` after L2 normalisation.
///
/// # Shapes
/// - `a`: `[n, d]`, `b`: `[m, d]` → `[n, m]`
pub fn cosine_matrix(a: Tensor<2>, b: Tensor<2>) -> Tensor<2> {
    l2_normalize(a).matmul(l2_normalize(b).transpose())
}

/// Row-wise cross entropy against soft targets, averaged over rows:
/// `(1/n) Σ_i −Σ_j T_ij · log_softmax_j(logits_i)`.
///
/// # Shapes
/// - `logits`, `targets`: `[n, m]` → `[1]`
pub fn soft_cross_entropy(logits: Tensor<2>, targets: Tensor<2>) -> Tensor<1> {
    let n = logits.dims()[0] as f64;
    (log_softmax(logits, 1) * targets).sum().neg().div_scalar(n)
}

/// Row-wise cross entropy with the pairing as label (row `i` → column `i`), averaged over rows
/// (`torch.nn.functional.cross_entropy(logits, arange(n))`).
///
/// # Shapes
/// - `logits`: `[n, n]` → `[1]`
pub fn diagonal_cross_entropy(logits: Tensor<2>) -> Tensor<1> {
    let [n, m] = logits.dims();
    assert_eq!(n, m, "diagonal cross entropy needs a square logit matrix");
    let eye = Tensor::<2>::eye(n, &logits.device());
    soft_cross_entropy(logits, eye)
}

/// `Σ_ij T_ij (ln T_ij − log_softmax_j(logits_i)) / n` — KL from the target rows to the softmax
/// of the logit rows, "batchmean" reduction, with `0·ln 0 = 0` so that exactly-zero targets (the
/// masked OTTER diagonal) contribute nothing. Targets carry no gradient.
///
/// # Shapes
/// - `targets`, `logits`: `[n, m]` → `[1]`
pub fn kl_batchmean(targets: Tensor<2>, logits: Tensor<2>) -> Tensor<1> {
    let n = logits.dims()[0] as f64;
    let t = targets.detach();
    // clamp_min keeps ln finite where T = 0; the product is then exactly 0.
    let entropy_term = (t.clone() * t.clone().clamp_min(f32::MIN_POSITIVE).log()).sum();
    let cross = (t * log_softmax(logits, 1)).sum();
    (entropy_term - cross).div_scalar(n)
}

/// How the two retrieval directions (image→text, text→image) are combined: the BoW paper and
/// CLIP average them (`mean`), OTTER's reference sums them (`sum`; spec `bow-and-otter.md` §7.2
/// item 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum DirectionReduction {
    #[default]
    Mean,
    Sum,
}

impl DirectionReduction {
    /// Combines the image→text and text→image terms.
    pub fn combine(self, i2t: Tensor<1>, t2i: Tensor<1>) -> Tensor<1> {
        match self {
            DirectionReduction::Mean => (i2t + t2i).div_scalar(2.0),
            DirectionReduction::Sum => i2t + t2i,
        }
    }
}

/// A logit scale `s = clamp(exp(θ), min, max)` with `θ` stored in log space (CLIP; OTTER's two
/// temperatures, spec `bow-and-otter.md` §5.5). Learnable or fixed; clamping gives zero gradient
/// outside the range.
#[derive(Module, Debug)]
pub struct LogitScale {
    log_scale: Param<Tensor<1>>,
    #[module(skip)]
    min: f64,
    #[module(skip)]
    max: f64,
}

impl LogitScale {
    /// A scale of `1/tau` (stored as `θ = ln(1/tau)`), clamped to `[min, max]`.
    pub fn from_temperature(tau: f64, learnable: bool, min: f64, max: f64, device: &Device) -> LogitScale {
        LogitScale::from_log_scale(-tau.ln(), learnable, min, max, device)
    }

    /// A scale `exp(θ)` from `θ` directly (OTTER initialises `θ = 3.9`).
    pub fn from_log_scale(log_scale: f64, learnable: bool, min: f64, max: f64, device: &Device) -> LogitScale {
        let t = scalar(log_scale, device).set_require_grad(learnable && device.is_autodiff());
        LogitScale { log_scale: Param::initialized(ParamId::new(), t), min, max }
    }

    /// `clamp(exp(θ), min, max)`.
    ///
    /// # Shapes
    /// - output: `[1]`
    pub fn scale(&self) -> Tensor<1> {
        self.log_scale.val().exp().clamp(self.min, self.max)
    }

    /// The stored `θ` (for gradient checks and logging).
    pub fn log_scale(&self) -> Tensor<1> {
        self.log_scale.val()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logit_scale_clamps_and_stops_the_gradient_outside_its_range() {
        // θ = ln(1/0.07): s = 14.2857, ds/dθ = s. θ = 5: exp(5) = 148.4 → s = 100, ds/dθ = 0.
        let d = Device::flex().autodiff();
        let inside = LogitScale::from_temperature(0.07, true, 1.0, 100.0, &d);
        let s = inside.scale();
        assert!((value(&s) - 1.0 / 0.07).abs() < 1e-4);
        let g = inside.log_scale().grad(&s.backward()).unwrap();
        assert!((value(&g) - 1.0 / 0.07).abs() < 1e-4);
        let outside = LogitScale::from_log_scale(5.0, true, 1.0, 100.0, &d);
        let s = outside.scale();
        assert_eq!(value(&s), 100.0);
        assert_eq!(value(&outside.log_scale().grad(&s.backward()).unwrap()), 0.0);
        let fixed = LogitScale::from_temperature(0.02, false, 1.0, 100.0, &d);
        assert!(!fixed.log_scale().is_require_grad());
    }

    #[test]
    fn kl_treats_zero_targets_as_zero() {
        // T = [[0, 1]], logits [[0, 0]]: KL = 1·(ln 1 − ln ½) = ln 2, no NaN from 0·ln 0.
        let d = Device::flex();
        let t = Tensor::<2>::from_data(TensorData::new(vec![0f32, 1.0], [1, 2]), &d);
        let kl = kl_batchmean(t, Tensor::zeros([1, 2], &d));
        assert!((value(&kl) - 2f32.ln()).abs() < 1e-6);
    }
}
