//! CUSA, cross-modal and uni-modal soft-label alignment (spec `cusa-and-pcmepp.md` §2.2–2.5, §5):
//! the contrastive ITC loss with duplicate-image targets, plus two KL terms whose targets are the
//! softmax of frozen uni-modal teacher similarities (Unicom image features, Sentence-BERT text
//! features, joined to the batch by `sample_id`; extracted by `stages::encode_*`).
//!
//! ```text
//! S_i2t = Î T̂ᵀ, S_t2i = S_i2tᵀ, S_i2i = Ĩ Ĩᵀ, S_t2t = T̃ T̃ᵀ     (rows L2-normalised; diagonals kept)
//! §2.2 Y[i,j] = [img(i) = img(j)] / Σ_k [img(i) = img(k)]
//!      CE(S) = (1/B) Σ_i −Σ_j Y[i,j] log softmax_j(S[i,:]/τ)          (itc_reduction = sum, paper)
//!            = that / B                                              (itc_reduction = mean, released configs)
//!      L_itc = (CE(S_i2t) + CE(S_t2i)) / 2
//! §2.3 P_i2i = softmax(r_i2i/τ_T), P_t2t = softmax(r_t2t/τ_T)          (teacher cosines, τ_T = 1)
//!      L_CSA = (KL(P_i2i ‖ softmax(S_i2t/τ_c)) + KL(P_t2t ‖ softmax(S_t2i/τ_c))) / 2
//! §2.4 L_USA = (KL(P_i2i ‖ softmax(S_i2i/τ_ui)) + KL(P_t2t ‖ softmax(S_t2t/τ_ut))) / 2
//! §2.5 L = w_itc L_itc + α L_CSA + β L_USA                            (CLIP: 1, 0.1, 0.5)
//! ```
//!
//! KL is "batchmean" (sum over B×B entries / B). The four student temperatures are learnable
//! scalars ([`CusaTemperatures`]) clamped to their ranges before every forward, as the reference
//! does in place: τ ∈ [0.01, 0.10] from 0.05, τ_c ∈ [0.10, 0.99] from 0.45, τ_ui, τ_ut ∈ [0.10, 1]
//! from 0.45.

use burn::module::{Module, Param, ParamId};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::common::{cosine_matrix, kl_batchmean, l2_normalize, scalar};

/// How the ITC cross entropy is reduced over the columns (spec §2.2, §5 item 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ItcReduction {
    /// The released configs' `contrastive_loss_mode: "mean"`: the cross entropy divided by B.
    #[default]
    Mean,
    /// The paper's standard cross entropy.
    Sum,
}

/// `loss.type = "cusa"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CusaConfig {
    /// ITC reduction: `mean` reproduces the released numbers, `sum` is the paper's formula.
    #[serde(default)]
    pub itc_reduction: ItcReduction,
    /// Weight of L_itc (1).
    #[serde(default = "one")]
    pub itc_weight: f64,
    /// Weight α of L_CSA (CLIP ViT-B/32: 0.1).
    #[serde(default = "default_csa_weight")]
    pub csa_weight: f64,
    /// Weight β of L_USA (CLIP ViT-B/32: 0.5).
    #[serde(default = "default_usa_weight")]
    pub usa_weight: f64,
    /// ITC temperature τ: initial value and clamp range (0.05 in [0.01, 0.10]).
    #[serde(default = "default_itc_tau")]
    pub itc_temperature: [f64; 3],
    /// CSA student temperature τ_c, shared by both directions (0.45 in [0.10, 0.99]).
    #[serde(default = "default_csa_tau")]
    pub csa_temperature: [f64; 3],
    /// USA student temperatures τ_ui and τ_ut, one per modality (0.45 in [0.10, 1.00]).
    #[serde(default = "default_usa_tau")]
    pub usa_temperature: [f64; 3],
    /// Teacher temperature τ_T (frozen; 1.0).
    #[serde(default = "one")]
    pub teacher_temperature: f64,
}

fn one() -> f64 {
    1.0
}
fn default_csa_weight() -> f64 {
    0.1
}
fn default_usa_weight() -> f64 {
    0.5
}
fn default_itc_tau() -> [f64; 3] {
    [0.05, 0.01, 0.10]
}
fn default_csa_tau() -> [f64; 3] {
    [0.45, 0.10, 0.99]
}
fn default_usa_tau() -> [f64; 3] {
    [0.45, 0.10, 1.00]
}

impl Default for CusaConfig {
    fn default() -> Self {
        CusaConfig {
            itc_reduction: ItcReduction::Mean,
            itc_weight: one(),
            csa_weight: default_csa_weight(),
            usa_weight: default_usa_weight(),
            itc_temperature: default_itc_tau(),
            csa_temperature: default_csa_tau(),
            usa_temperature: default_usa_tau(),
            teacher_temperature: one(),
        }
    }
}

/// The four learnable temperatures (τ, τ_c, τ_ui, τ_ut), stored as temperatures (not logs).
#[derive(Module, Debug)]
pub struct CusaTemperatures {
    pub itc: Param<Tensor<1>>,
    pub csa: Param<Tensor<1>>,
    pub usa_image: Param<Tensor<1>>,
    pub usa_text: Param<Tensor<1>>,
}

impl CusaTemperatures {
    pub fn init(config: &CusaConfig, device: &Device) -> CusaTemperatures {
        let p = |v: f64| Param::initialized(ParamId::new(), scalar(v, device).set_require_grad(device.is_autodiff()));
        CusaTemperatures {
            itc: p(config.itc_temperature[0]),
            csa: p(config.csa_temperature[0]),
            usa_image: p(config.usa_temperature[0]),
            usa_text: p(config.usa_temperature[0]),
        }
    }

    /// Clamps every temperature to its range, as the reference does in place at the start of
    /// every forward (the values change, the parameters stay leaves).
    pub fn clamp(self, config: &CusaConfig) -> CusaTemperatures {
        let c = |p: Param<Tensor<1>>, r: [f64; 3]| {
            // Rebuilt from the value: on an autodiff device `detach().clamp()` is not a leaf, and
            // a parameter must stay one.
            p.map(|t| {
                let rg = t.is_require_grad();
                let device = t.device();
                let v = t.into_scalar::<f32>() as f64;
                scalar(v.clamp(r[1], r[2]), &device).set_require_grad(rg)
            })
        };
        CusaTemperatures {
            itc: c(self.itc, config.itc_temperature),
            csa: c(self.csa, config.csa_temperature),
            usa_image: c(self.usa_image, config.usa_temperature),
            usa_text: c(self.usa_text, config.usa_temperature),
        }
    }
}

/// The ITC target `Y` from the image id of every batch element (rows sum to 1).
///
/// # Shapes
/// - output: `[B, B]`
pub fn duplicate_targets(image_ids: &[u64], device: &Device) -> Tensor<2> {
    let b = image_ids.len();
    let mut y = vec![0f32; b * b];
    for (i, a) in image_ids.iter().enumerate() {
        let count = image_ids.iter().filter(|x| *x == a).count() as f32;
        for (j, c) in image_ids.iter().enumerate() {
            if a == c {
                y[i * b + j] = 1.0 / count;
            }
        }
    }
    Tensor::from_data(TensorData::new(y, [b, b]), device)
}

fn over(s: Tensor<2>, tau: Tensor<1>) -> Tensor<2> {
    s / tau.reshape([1, 1])
}

/// L_itc (§2.2).
///
/// # Shapes
/// - `s_i2t`: `[B, B]` cosines, `tau`: `[1]` → `[1]`
pub fn itc(s_i2t: Tensor<2>, image_ids: &[u64], tau: Tensor<1>, reduction: ItcReduction) -> Tensor<1> {
    let b = s_i2t.dims()[0];
    assert_eq!(image_ids.len(), b, "one image id per batch element");
    let y = duplicate_targets(image_ids, &s_i2t.device());
    let ce = |s: Tensor<2>| {
        let per_row = (log_softmax(over(s, tau.clone()), 1) * y.clone()).sum().neg().div_scalar(b as f64);
        match reduction {
            ItcReduction::Sum => per_row,
            ItcReduction::Mean => per_row.div_scalar(b as f64),
        }
    };
    (ce(s_i2t.clone()) + ce(s_i2t.transpose())).div_scalar(2.0)
}

/// The teacher targets `(P_i2i, P_t2t)` (§2.3), without gradient.
///
/// # Shapes
/// - `teacher_image`: `[B, D_i]`, `teacher_text`: `[B, D_t]` → two `[B, B]`
pub fn teacher_targets(teacher_image: Tensor<2>, teacher_text: Tensor<2>, tau_teacher: f64) -> (Tensor<2>, Tensor<2>) {
    let ti = l2_normalize(teacher_image.detach());
    let tt = l2_normalize(teacher_text.detach());
    let inv = 1.0 / tau_teacher;
    (
        softmax(ti.clone().matmul(ti.transpose()).mul_scalar(inv), 1),
        softmax(tt.clone().matmul(tt.transpose()).mul_scalar(inv), 1),
    )
}

/// L_CSA (§2.3).
///
/// # Shapes
/// - `s_i2t`, `p_i2i`, `p_t2t`: `[B, B]`, `tau_c`: `[1]` → `[1]`
pub fn csa(s_i2t: Tensor<2>, p_i2i: Tensor<2>, p_t2t: Tensor<2>, tau_c: Tensor<1>) -> Tensor<1> {
    let i2t = kl_batchmean(p_i2i, over(s_i2t.clone(), tau_c.clone()));
    let t2i = kl_batchmean(p_t2t, over(s_i2t.transpose(), tau_c));
    (i2t + t2i).div_scalar(2.0)
}

/// L_USA (§2.4).
///
/// # Shapes
/// - `s_i2i`, `s_t2t`, `p_i2i`, `p_t2t`: `[B, B]`, `tau_ui`, `tau_ut`: `[1]` → `[1]`
pub fn usa(
    s_i2i: Tensor<2>,
    s_t2t: Tensor<2>,
    p_i2i: Tensor<2>,
    p_t2t: Tensor<2>,
    tau_ui: Tensor<1>,
    tau_ut: Tensor<1>,
) -> Tensor<1> {
    (kl_batchmean(p_i2i, over(s_i2i, tau_ui)) + kl_batchmean(p_t2t, over(s_t2t, tau_ut))).div_scalar(2.0)
}

/// One batch of CUSA inputs: cross-modal and uni-modal head outputs of the student (any norm),
/// the teacher features of the same rows, and the image id of every row.
#[derive(Debug, Clone)]
pub struct CusaBatch<'a> {
    /// `[B, D]`: the image cross-modal head `h_img_cross`.
    pub image_cross: Tensor<2>,
    /// `[B, D]`: the text cross-modal head.
    pub text_cross: Tensor<2>,
    /// `[B, D]`: the image uni-modal head.
    pub image_uni: Tensor<2>,
    /// `[B, D]`: the text uni-modal head.
    pub text_uni: Tensor<2>,
    /// `[B, D_i]`: image teacher features (Unicom).
    pub teacher_image: Tensor<2>,
    /// `[B, D_t]`: text teacher features (Sentence-BERT).
    pub teacher_text: Tensor<2>,
    /// Image identity of every row (repeated images share an id).
    pub image_ids: &'a [u64],
}

/// The CUSA loss and its parts.
#[derive(Debug, Clone)]
pub struct CusaTerms {
    /// `w_itc L_itc + α L_CSA + β L_USA`.
    pub loss: Tensor<1>,
    pub itc: Tensor<1>,
    pub csa: Tensor<1>,
    pub usa: Tensor<1>,
}

/// The CUSA loss (§2.5) with the given temperatures (clamp them first, [`CusaTemperatures::clamp`]).
pub fn cusa(batch: CusaBatch<'_>, temps: &CusaTemperatures, config: &CusaConfig) -> CusaTerms {
    let s_i2t = cosine_matrix(batch.image_cross, batch.text_cross);
    let s_i2i = cosine_matrix(batch.image_uni.clone(), batch.image_uni);
    let s_t2t = cosine_matrix(batch.text_uni.clone(), batch.text_uni);
    let (p_i2i, p_t2t) = teacher_targets(batch.teacher_image, batch.teacher_text, config.teacher_temperature);
    let itc = itc(s_i2t.clone(), batch.image_ids, temps.itc.val(), config.itc_reduction);
    let csa = csa(s_i2t, p_i2i.clone(), p_t2t.clone(), temps.csa.val());
    let usa = usa(s_i2i, s_t2t, p_i2i, p_t2t, temps.usa_image.val(), temps.usa_text.val());
    let loss = itc.clone().mul_scalar(config.itc_weight)
        + csa.clone().mul_scalar(config.csa_weight)
        + usa.clone().mul_scalar(config.usa_weight);
    CusaTerms { loss, itc, csa, usa }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::common::value;

    #[test]
    fn duplicate_targets_spread_over_repeats() {
        // ids [0, 1, 1]: Y = [[1, 0, 0], [0, ½, ½], [0, ½, ½]].
        let y = duplicate_targets(&[0, 1, 1], &Device::flex()).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(y, vec![1.0, 0.0, 0.0, 0.0, 0.5, 0.5, 0.0, 0.5, 0.5]);
    }

    #[test]
    fn temperatures_are_clamped_to_their_ranges() {
        let d = Device::flex();
        let config = CusaConfig::default();
        let mut t = CusaTemperatures::init(&config, &d);
        t.itc = Param::initialized(ParamId::new(), scalar(0.5, &d));
        t.usa_text = Param::initialized(ParamId::new(), scalar(0.01, &d));
        let t = t.clamp(&config);
        assert!((value(&t.itc.val()) - 0.10).abs() < 1e-7);
        assert!((value(&t.usa_text.val()) - 0.10).abs() < 1e-7);
        assert!((value(&t.csa.val()) - 0.45).abs() < 1e-7);
    }
}
