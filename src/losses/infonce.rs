//! Symmetric InfoNCE (CLIP's contrastive loss; the `L_nce` term of OTTER, spec
//! `bow-and-otter.md` §5.5, and the in-batch form of the BoW paper's loss, §4) on L2-normalised
//! image and text embeddings, with a fixed or learnable temperature kept as a clamped log logit
//! scale ([`LogitScale`]). The memory-bank variant is [`super::memory_bank`]; the soft-target
//! variants (label smoothing, KD, OTTER) reuse [`nce_terms`].
//!
//! ```text
//! A_v = s · norm(U) norm(V)ᵀ        (row i: image i against every text)
//! A_t = A_vᵀ                        (row i: text i against every image)
//! L_i2t = −(1/B) Σ_i log softmax_j(A_v[i, :])[i]      L_t2i likewise with A_t
//! L = (L_i2t + L_t2i) / 2   (direction_reduction = mean: CLIP, BoW paper)
//!   =  L_i2t + L_t2i        (direction_reduction = sum: OTTER reference)
//! s = clamp(exp(θ), min_logit_scale, max_logit_scale),  θ = ln(1/temperature) at init
//! ```

use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::common::{cosine_matrix, diagonal_cross_entropy, scale_by, DirectionReduction, LogitScale};

/// `loss.type = "infonce"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InfonceConfig {
    /// Initial (or fixed) temperature τ; the logit scale is `1/τ`. CLIP: 0.07.
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Learn the temperature (as CLIP's log logit scale) instead of keeping it fixed.
    #[serde(default = "default_learnable")]
    pub learnable_temperature: bool,
    /// Lower clamp of the logit scale `1/τ` (OTTER: 1).
    #[serde(default = "default_min_scale")]
    pub min_logit_scale: f64,
    /// Upper clamp of the logit scale `1/τ` (CLIP, OTTER: 100).
    #[serde(default = "default_max_scale")]
    pub max_logit_scale: f64,
    /// `mean` averages the image→text and text→image terms (CLIP, BoW paper); `sum` adds them
    /// (OTTER reference).
    #[serde(default)]
    pub direction_reduction: DirectionReduction,
}

fn default_temperature() -> f64 {
    0.07
}
fn default_learnable() -> bool {
    true
}
pub(crate) fn default_min_scale() -> f64 {
    1.0
}
pub(crate) fn default_max_scale() -> f64 {
    100.0
}

impl Default for InfonceConfig {
    fn default() -> Self {
        InfonceConfig {
            temperature: default_temperature(),
            learnable_temperature: default_learnable(),
            min_logit_scale: default_min_scale(),
            max_logit_scale: default_max_scale(),
            direction_reduction: DirectionReduction::Mean,
        }
    }
}

impl InfonceConfig {
    /// The logit scale this config starts from.
    pub fn init_scale(&self, device: &Device) -> LogitScale {
        LogitScale::from_temperature(
            self.temperature,
            self.learnable_temperature,
            self.min_logit_scale,
            self.max_logit_scale,
            device,
        )
    }
}

/// The two InfoNCE directions, `(L_i2t, L_t2i)`, each a mean over rows of the hard-label cross
/// entropy of `scale · cos(image_i, text_j)`.
///
/// # Shapes
/// - `image`, `text`: `[B, D]` (any norm; normalised here), `scale`: `[1]`
/// - output: two `[1]` tensors
pub fn nce_terms(image: Tensor<2>, text: Tensor<2>, scale: Tensor<1>) -> (Tensor<1>, Tensor<1>) {
    let logits = scale_by(cosine_matrix(image, text), scale);
    let i2t = diagonal_cross_entropy(logits.clone());
    let t2i = diagonal_cross_entropy(logits.transpose());
    (i2t, t2i)
}

/// Symmetric InfoNCE.
///
/// # Shapes
/// - `image`, `text`: `[B, D]`, `scale`: `[1]` (see [`LogitScale::scale`]) → `[1]`
pub fn infonce(image: Tensor<2>, text: Tensor<2>, scale: Tensor<1>, reduction: DirectionReduction) -> Tensor<1> {
    let (i2t, t2i) = nce_terms(image, text, scale);
    reduction.combine(i2t, t2i)
}

/// A configured InfoNCE loss with its (possibly learnable) temperature.
#[derive(Debug)]
pub struct Infonce {
    pub config: InfonceConfig,
    pub scale: LogitScale,
}

impl Infonce {
    pub fn new(config: InfonceConfig, device: &Device) -> Infonce {
        let scale = config.init_scale(device);
        Infonce { config, scale }
    }

    /// # Shapes
    /// - `image`, `text`: `[B, D]` → `[1]`
    pub fn forward(&self, image: Tensor<2>, text: Tensor<2>) -> Tensor<1> {
        infonce(image, text, self.scale.scale(), self.config.direction_reduction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::common::{scalar, value};

    #[test]
    fn two_orthogonal_pairs_by_hand() {
        // B = 2, U = V = I₂, s = 10: logits = [[10, 0], [0, 10]].
        // Each row: −log(e¹⁰ / (e¹⁰ + 1)) = ln(1 + e⁻¹⁰) = 4.5399e-5; both directions alike.
        // >>> import torch; F = torch.nn.functional
        // >>> F.cross_entropy(10 * torch.eye(2), torch.arange(2))  # tensor(4.5399e-05)
        let d = Device::flex();
        let u = Tensor::<2>::eye(2, &d);
        let mean = infonce(u.clone(), u.clone(), scalar(10.0, &d), DirectionReduction::Mean);
        let sum = infonce(u.clone(), u, scalar(10.0, &d), DirectionReduction::Sum);
        let want = (1.0f64 + (-10.0f64).exp()).ln();
        // float32 log-softmax of [10, 0]: absolute error ~1e-7.
        assert!((value(&mean) as f64 - want).abs() < 1e-6);
        assert!((value(&sum) as f64 - 2.0 * want).abs() < 2e-6);
    }

    #[test]
    fn identical_embeddings_give_ln_b() {
        // All embeddings equal: every logit equal, loss = ln B in each direction.
        let d = Device::flex();
        let x = Tensor::<2>::ones([3, 4], &d);
        let l = infonce(x.clone(), x, scalar(50.0, &d), DirectionReduction::Mean);
        assert!((value(&l) - 3f32.ln()).abs() < 1e-6);
    }
}
