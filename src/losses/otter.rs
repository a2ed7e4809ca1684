//! OTTER (spec `bow-and-otter.md` §5.2–5.5): soft image–text targets from an entropic optimal
//! transport plan over the teacher's similarities, computed by Sinkhorn-Knopp with the dataset
//! pair masked exactly, and mixed with the hard InfoNCE target by `α`. The teacher is an EMA copy
//! of the student ([`super::memory_bank::ema_update`] with [`super::memory_bank::ema_decay`]'s
//! warm-up); this module sees only its embeddings. Baselines: [`super::label_smoothing`] (uniform
//! plan), [`super::kd`] (row softmax, no mask).
//!
//! ```text
//! §5.3  S^v = γ_v Ẑ_v Ẑ_vᵀ + γ_t Ẑ_t Ẑ_tᵀ + Ẑ_v Ẑ_tᵀ,   S^t = γ_v Ẑ_v Ẑ_vᵀ + γ_t Ẑ_t Ẑ_tᵀ + Ẑ_t Ẑ_vᵀ
//!       (η = ∞: the pair (i, i) is removed exactly, whatever γ — not the reference's 100·γ)
//! §5.4  Q_ij = exp((S_ij − max S)/λ), Q_ii = 0;  Q ← Q / Σ Q;
//!       L times: Q_ij ← Q_ij / (N Σ_k Q_ik);  Q_ij ← Q_ij / (N Σ_k Q_kj)
//!       M_ij = Q_ij / Σ_k Q_ik          (L = 0: row softmax of S/λ without the diagonal)
//! §5.5  L_nce = CE(s_c A_v, I) + CE(s_c A_t, I)
//!       L_ot  = KL(M^v ‖ softmax(s_d A_v)) + KL(M^t ‖ softmax(s_d A_t))   (batchmean, 0·log 0 = 0)
//!       L     = α L_nce + (1 − α) L_ot
//! ```
//!
//! With `s_c = s_d` this equals the paper's cross entropy against `q = α I + (1 − α) M`
//! ([`soft_target`]) up to the target entropy. Sinkhorn runs without gradient in float32;
//! [`sinkhorn`] shifts each row by its own off-diagonal maximum instead of the global one, which
//! the first row normalisation cancels exactly and which keeps every row representable.

use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::common::{cosine_matrix, diagonal_cross_entropy, kl_batchmean, l2_normalize, scale_by};
use super::infonce::{default_max_scale, default_min_scale};
use super::label_smoothing::default_log_scale;

/// `loss.type = "otter"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtterConfig {
    /// Prior probability that the dataset pairing is right: weight of `L_nce` (spec: 0.5).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Weight γ_v of the teacher image–image similarity (spec: 1).
    #[serde(default = "one")]
    pub gamma_v: f64,
    /// Weight γ_t of the teacher text–text similarity (spec: 1).
    #[serde(default = "one")]
    pub gamma_t: f64,
    /// Entropic regularisation λ of Sinkhorn-Knopp (paper main runs: 0.15).
    #[serde(default = "default_lambda")]
    pub sinkhorn_lambda: f64,
    /// Sinkhorn iterations; 0 gives the row softmax (paper main runs: 5).
    #[serde(default = "default_iterations")]
    pub sinkhorn_iterations: usize,
    /// Use one logit scale for `L_nce` and `L_ot` (the paper's form); the reference learns two.
    #[serde(default)]
    pub tie_temperatures: bool,
    /// Initial log logit scales θ_c and θ_d (reference: 3.9).
    #[serde(default = "default_log_scale")]
    pub init_log_scale: f64,
    /// Lower clamp of the logit scales.
    #[serde(default = "default_min_scale")]
    pub min_logit_scale: f64,
    /// Upper clamp of the logit scales.
    #[serde(default = "default_max_scale")]
    pub max_logit_scale: f64,
    /// EMA decay of the teacher (spec §5.6: 0.999, reached through `min(m, (1+n)/(10+n))`).
    #[serde(default = "super::memory_bank::default_momentum")]
    pub teacher_momentum: f64,
}

fn default_alpha() -> f64 {
    0.5
}
fn one() -> f64 {
    1.0
}
fn default_lambda() -> f64 {
    0.15
}
fn default_iterations() -> usize {
    5
}

impl Default for OtterConfig {
    fn default() -> Self {
        OtterConfig {
            alpha: default_alpha(),
            gamma_v: one(),
            gamma_t: one(),
            sinkhorn_lambda: default_lambda(),
            sinkhorn_iterations: default_iterations(),
            tie_temperatures: false,
            init_log_scale: default_log_scale(),
            min_logit_scale: default_min_scale(),
            max_logit_scale: default_max_scale(),
            teacher_momentum: super::memory_bank::default_momentum(),
        }
    }
}

/// `1` on the diagonal of an `n × n` matrix.
fn diagonal_mask(n: usize, device: &Device) -> Tensor<2, burn::tensor::Bool> {
    Tensor::<2>::eye(n, device).equal_elem(1.0)
}

/// Sinkhorn-Knopp with uniform marginals and the diagonal removed (§5.4); rows of the result
/// sum to 1 and its diagonal is exactly 0. No gradient.
///
/// # Shapes
/// - `s`: `[N, N]`, `N ≥ 2` → `[N, N]`
pub fn sinkhorn(s: Tensor<2>, lambda: f64, iterations: usize) -> Tensor<2> {
    let [n, m] = s.dims();
    assert!(n == m && n >= 2, "Sinkhorn needs a square similarity matrix with N ≥ 2, got {n}×{m}");
    let device = s.device();
    let masked = s.detach().mask_fill(diagonal_mask(n, &device), f32::NEG_INFINITY);
    let row_max = masked.clone().max_dim(1);
    // exp(−∞) = 0: the pair itself gets exactly no mass (η = ∞).
    let mut q = (masked - row_max).div_scalar(lambda).exp();
    q = q.clone() / q.clone().sum().reshape([1, 1]);
    let nf = n as f64;
    for _ in 0..iterations {
        q = q.clone() / q.clone().sum_dim(1).mul_scalar(nf);
        q = q.clone() / q.clone().sum_dim(0).mul_scalar(nf);
    }
    q.clone() / q.sum_dim(1)
}

/// Teacher similarities `(S^v, S^t)` of §5.3, diagonal kept (Sinkhorn masks it).
///
/// # Shapes
/// - `teacher_image`, `teacher_text`: `[N, D']` (normalised here) → two `[N, N]`
pub fn similarities(
    teacher_image: Tensor<2>,
    teacher_text: Tensor<2>,
    gamma_v: f64,
    gamma_t: f64,
) -> (Tensor<2>, Tensor<2>) {
    let hv = l2_normalize(teacher_image.detach());
    let ht = l2_normalize(teacher_text.detach());
    let same = hv.clone().matmul(hv.clone().transpose()).mul_scalar(gamma_v)
        + ht.clone().matmul(ht.clone().transpose()).mul_scalar(gamma_t);
    let cross = hv.matmul(ht.transpose());
    (same.clone() + cross.clone(), same + cross.transpose())
}

/// The transport targets `(M^v, M^t)`, each from its own Sinkhorn run (not a transpose).
///
/// # Shapes
/// - `teacher_image`, `teacher_text`: `[N, D']` → two `[N, N]`
pub fn otter_targets(
    teacher_image: Tensor<2>,
    teacher_text: Tensor<2>,
    config: &OtterConfig,
) -> (Tensor<2>, Tensor<2>) {
    let (sv, st) = similarities(teacher_image, teacher_text, config.gamma_v, config.gamma_t);
    (
        sinkhorn(sv, config.sinkhorn_lambda, config.sinkhorn_iterations),
        sinkhorn(st, config.sinkhorn_lambda, config.sinkhorn_iterations),
    )
}

/// The paper's soft target `q = α I + (1 − α) M` (§5.2).
///
/// # Shapes
/// - `m`: `[N, N]` → `[N, N]`
pub fn soft_target(m: Tensor<2>, alpha: f64) -> Tensor<2> {
    let n = m.dims()[0];
    Tensor::<2>::eye(n, &m.device()).mul_scalar(alpha) + m.mul_scalar(1.0 - alpha)
}

/// The OTTER loss and its two parts.
#[derive(Debug, Clone)]
pub struct OtterTerms {
    /// `α L_nce + (1 − α) L_ot`.
    pub loss: Tensor<1>,
    pub nce: Tensor<1>,
    pub ot: Tensor<1>,
}

/// The OTTER loss (§5.5) for student embeddings and teacher embeddings of the same batch.
///
/// # Shapes
/// - `image`, `text`: `[N, D]`; `teacher_image`, `teacher_text`: `[N, D']`; `scale_nce`,
///   `scale_ot`: `[1]` (the same tensor when `tie_temperatures`) → [`OtterTerms`] of `[1]`
pub fn otter(
    image: Tensor<2>,
    text: Tensor<2>,
    teacher_image: Tensor<2>,
    teacher_text: Tensor<2>,
    scale_nce: Tensor<1>,
    scale_ot: Tensor<1>,
    config: &OtterConfig,
) -> OtterTerms {
    let (mv, mt) = otter_targets(teacher_image, teacher_text, config);
    let a = cosine_matrix(image, text);
    let nce_logits = scale_by(a.clone(), scale_nce);
    let nce = diagonal_cross_entropy(nce_logits.clone()) + diagonal_cross_entropy(nce_logits.transpose());
    let ot_logits = scale_by(a, scale_ot);
    let ot = kl_batchmean(mv, ot_logits.clone()) + kl_batchmean(mt, ot_logits.transpose());
    let loss = nce.clone().mul_scalar(config.alpha) + ot.clone().mul_scalar(1.0 - config.alpha);
    OtterTerms { loss, nce, ot }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::activation::softmax;
    use burn::tensor::TensorData;

    fn vec(t: Tensor<2>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn zero_iterations_is_the_masked_row_softmax() {
        // S = [[0, 1, 2], [3, 0, 1], [0.5, 0.5, 0]], λ = 0.5: row 0 → softmax([2, 4]) on
        // columns 1, 2 = [0, 0.11920, 0.88080].
        let d = Device::flex();
        let s = Tensor::<2>::from_data(TensorData::new(vec![0f32, 1.0, 2.0, 3.0, 0.0, 1.0, 0.5, 0.5, 0.0], [3, 3]), &d);
        let m = vec(sinkhorn(s.clone(), 0.5, 0));
        let masked = s.div_scalar(0.5).mask_fill(diagonal_mask(3, &d), -1e30);
        let want = vec(softmax(masked, 1));
        for (g, w) in m.iter().zip(&want) {
            assert!((g - w).abs() < 1e-6, "{m:?} vs {want:?}");
        }
        assert!((m[1] - 0.11920292).abs() < 1e-6 && m[0] == 0.0);
    }

    #[test]
    fn iterations_balance_the_columns_and_keep_the_diagonal_zero() {
        let d = Device::flex();
        let s = Tensor::<2>::from_data(
            TensorData::new(
                vec![0f32, 0.9, 0.1, 0.4, 0.2, 0.0, 0.8, 0.3, 0.7, 0.6, 0.0, 0.5, 0.1, 0.2, 0.9, 0.0],
                [4, 4],
            ),
            &d,
        );
        let m = vec(sinkhorn(s, 0.15, 50));
        for i in 0..4 {
            assert_eq!(m[i * 4 + i], 0.0);
            assert!((m[i * 4..i * 4 + 4].iter().sum::<f32>() - 1.0).abs() < 1e-5);
            let col: f32 = (0..4).map(|r| m[r * 4 + i]).sum();
            assert!((col - 1.0).abs() < 1e-3, "column {i} sums to {col}");
        }
    }
}
