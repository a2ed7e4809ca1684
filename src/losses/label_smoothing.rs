//! Label smoothing, OTTER's first baseline (spec `bow-and-otter.md` §5.6): the InfoNCE logits of
//! [`super::infonce`] against a smoothed identity target, both directions summed as in the OTTER
//! reference. It is OTTER's loss with the uniform plan `M = (1 − I)/(N − 1)` (§5.2).
//!
//! ```text
//! T_ij = α if i = j, else (1 − α)/(N − 1)
//! L = CE(s·A_v, T) + CE(s·A_t, T),   CE(X, T) = −(1/N) Σ_i Σ_j T_ij log softmax_j(X_i)
//! ```
//!
//! Default `α = 0.9` (the paper's better value; reference flag `label_smoothing = 1 − α`).

use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::common::{cosine_matrix, scale_by, soft_cross_entropy};
use super::infonce::{default_max_scale, default_min_scale};

/// `loss.type = "label_smoothing"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabelSmoothingConfig {
    /// Target mass on the dataset pair (spec §5.6: 0.9).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Initial log logit scale θ, `s = clamp(exp(θ), 1, 100)` (OTTER: 3.9, learnable).
    #[serde(default = "default_log_scale")]
    pub init_log_scale: f64,
    /// Lower clamp of the logit scale.
    #[serde(default = "default_min_scale")]
    pub min_logit_scale: f64,
    /// Upper clamp of the logit scale.
    #[serde(default = "default_max_scale")]
    pub max_logit_scale: f64,
}

fn default_alpha() -> f64 {
    0.9
}
pub(crate) fn default_log_scale() -> f64 {
    3.9
}

impl Default for LabelSmoothingConfig {
    fn default() -> Self {
        LabelSmoothingConfig {
            alpha: default_alpha(),
            init_log_scale: default_log_scale(),
            min_logit_scale: default_min_scale(),
            max_logit_scale: default_max_scale(),
        }
    }
}

/// The smoothed identity target `α I + (1 − α)(1 − I)/(N − 1)`.
///
/// # Shapes
/// - output: `[n, n]`
pub fn smoothed_identity(n: usize, alpha: f64, device: &Device) -> Tensor<2> {
    assert!(n >= 2, "label smoothing needs at least two pairs");
    let off = ((1.0 - alpha) / (n - 1) as f64) as f32;
    let data: Vec<f32> = (0..n * n).map(|k| if k / n == k % n { alpha as f32 } else { off }).collect();
    Tensor::from_data(TensorData::new(data, [n, n]), device)
}

/// `CE(s·A_v, T) + CE(s·A_t, T)`.
///
/// # Shapes
/// - `image`, `text`: `[N, D]` (normalised here), `scale`: `[1]` → `[1]`
pub fn label_smoothing(image: Tensor<2>, text: Tensor<2>, scale: Tensor<1>, alpha: f64) -> Tensor<1> {
    let n = image.dims()[0];
    let target = smoothed_identity(n, alpha, &image.device());
    let logits = scale_by(cosine_matrix(image, text), scale);
    soft_cross_entropy(logits.clone(), target.clone()) + soft_cross_entropy(logits.transpose(), target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::common::DirectionReduction;
    use crate::losses::common::{scalar, value};
    use crate::losses::infonce::infonce;

    #[test]
    fn alpha_one_is_summed_infonce() {
        let d = Device::flex();
        let x =
            Tensor::<2>::from_data(TensorData::new(vec![1f32, 0.0, 0.3, 0.6, 0.8, 0.1, -1.0, 0.2, 0.0], [3, 3]), &d);
        let y = x.clone().flip([1]);
        let ls = label_smoothing(x.clone(), y.clone(), scalar(7.0, &d), 1.0);
        let nce = infonce(x, y, scalar(7.0, &d), DirectionReduction::Sum);
        assert!((value(&ls) - value(&nce)).abs() < 1e-6);
    }

    #[test]
    fn target_rows_sum_to_one() {
        // N = 4, α = 0.9: diagonal 0.9, off-diagonal 0.1/3.
        let t = smoothed_identity(4, 0.9, &Device::flex());
        let v = t.into_data().try_to_vec::<f32>().unwrap();
        assert!((v[0] - 0.9).abs() < 1e-7 && (v[1] - 0.1 / 3.0).abs() < 1e-7);
        assert!((v[..4].iter().sum::<f32>() - 1.0).abs() < 1e-6);
    }
}
