//! Knowledge distillation, OTTER's second baseline (spec `bow-and-otter.md` §5.6 and A12): the
//! hard-label InfoNCE of [`super::infonce`] mixed with a KL term towards the row softmax of an
//! (EMA) teacher's similarities, with no diagonal masking and no Sinkhorn (compare
//! [`super::otter`]).
//!
//! ```text
//! paper (eq. 8, §3.5):    S^v = Ẑ_v Ẑ_tᵀ                          S^t = Ẑ_t Ẑ_vᵀ
//! released script:        S^v = Ẑ_v Ẑ_vᵀ + Ẑ_t Ẑ_tᵀ + Ẑ_v Ẑ_tᵀ    S^t = … + Ẑ_t Ẑ_vᵀ   (intra_modal)
//! P^v = row-softmax(S^v / τ_t),  P^t = row-softmax(S^t / τ_t)       (τ_t = 0.01)
//! L = α·[CE(s_c A_v, I) + CE(s_c A_t, I)] + (1 − α)·[KL(P^v ‖ softmax(s_d A_v)) + KL(P^t ‖ softmax(s_d A_t))]
//! ```
//!
//! `A_v = Z_v Z_tᵀ`, `A_t = A_vᵀ` on L2-normalised student embeddings; `s_c`, `s_d` the two
//! learnable clamped logit scales of the OTTER reference; KL "batchmean". Defaults `α = 0.5`.

use burn::tensor::activation::softmax;
use burn::tensor::Tensor;
use serde::{Deserialize, Serialize};

use super::common::{cosine_matrix, diagonal_cross_entropy, kl_batchmean, l2_normalize, scale_by};
use super::infonce::{default_max_scale, default_min_scale};
use super::label_smoothing::default_log_scale;

/// `loss.type = "kd"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KdConfig {
    /// Weight of the hard-label InfoNCE term (spec §5.6: 0.5).
    #[serde(default = "default_alpha")]
    pub alpha: f64,
    /// Teacher temperature τ_t (spec §5.6: 0.01; reference `T_t = 100`).
    #[serde(default = "default_teacher_temperature")]
    pub teacher_temperature: f64,
    /// Add the image–image and text–text teacher similarities (the released KD script, spec
    /// A12); `false` is the paper's cross-modal-only form.
    #[serde(default)]
    pub intra_modal: bool,
    /// Initial log logit scales θ_c (InfoNCE) and θ_d (distillation), OTTER: 3.9 each.
    #[serde(default = "default_log_scale")]
    pub init_log_scale: f64,
    /// Lower clamp of both logit scales.
    #[serde(default = "default_min_scale")]
    pub min_logit_scale: f64,
    /// Upper clamp of both logit scales.
    #[serde(default = "default_max_scale")]
    pub max_logit_scale: f64,
    /// EMA decay of the teacher (with OTTER's warm-up, see `memory_bank::ema_decay`).
    #[serde(default = "super::memory_bank::default_momentum")]
    pub teacher_momentum: f64,
}

fn default_alpha() -> f64 {
    0.5
}
fn default_teacher_temperature() -> f64 {
    0.01
}

impl Default for KdConfig {
    fn default() -> Self {
        KdConfig {
            alpha: default_alpha(),
            teacher_temperature: default_teacher_temperature(),
            intra_modal: false,
            init_log_scale: default_log_scale(),
            min_logit_scale: default_min_scale(),
            max_logit_scale: default_max_scale(),
            teacher_momentum: super::memory_bank::default_momentum(),
        }
    }
}

/// The teacher targets `(P^v, P^t)`, without gradient.
///
/// # Shapes
/// - `teacher_image`, `teacher_text`: `[N, D']` (normalised here) → two `[N, N]`
pub fn kd_targets(
    teacher_image: Tensor<2>,
    teacher_text: Tensor<2>,
    teacher_temperature: f64,
    intra_modal: bool,
) -> (Tensor<2>, Tensor<2>) {
    let hv = l2_normalize(teacher_image.detach());
    let ht = l2_normalize(teacher_text.detach());
    let cross = hv.clone().matmul(ht.clone().transpose());
    let (sv, st) = if intra_modal {
        let same = hv.clone().matmul(hv.transpose()) + ht.clone().matmul(ht.transpose());
        (same.clone() + cross.clone(), same + cross.transpose())
    } else {
        (cross.clone(), cross.transpose())
    };
    let inv = 1.0 / teacher_temperature;
    (softmax(sv.mul_scalar(inv), 1), softmax(st.mul_scalar(inv), 1))
}

/// The KD loss.
///
/// # Shapes
/// - `image`, `text`: `[N, D]` student embeddings; `teacher_image`, `teacher_text`: `[N, D']`;
///   `scale_nce`, `scale_kd`: `[1]` → `[1]`
#[allow(clippy::too_many_arguments)]
pub fn kd(
    image: Tensor<2>,
    text: Tensor<2>,
    teacher_image: Tensor<2>,
    teacher_text: Tensor<2>,
    scale_nce: Tensor<1>,
    scale_kd: Tensor<1>,
    alpha: f64,
    teacher_temperature: f64,
    intra_modal: bool,
) -> Tensor<1> {
    let (pv, pt) = kd_targets(teacher_image, teacher_text, teacher_temperature, intra_modal);
    let a = cosine_matrix(image, text);
    let nce_logits = scale_by(a.clone(), scale_nce);
    let l_nce = diagonal_cross_entropy(nce_logits.clone()) + diagonal_cross_entropy(nce_logits.transpose());
    let kd_logits = scale_by(a, scale_kd);
    let l_kd = kl_batchmean(pv, kd_logits.clone()) + kl_batchmean(pt, kd_logits.transpose());
    l_nce.mul_scalar(alpha) + l_kd.mul_scalar(1.0 - alpha)
}
