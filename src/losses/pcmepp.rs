//! PCME++, probabilistic cross-modal embeddings (spec `cusa-and-pcmepp.md` §3.2–3.8, §5 items
//! 7 and 9): each side is a diagonal Gaussian `N(μ, diag(exp(v)))` from the mean and uncertainty
//! heads (μ L2-normalised by the head, `v` the log-variance); the loss is a binary cross entropy
//! on the matching probability of every image–caption pair, with pseudo-positives and a VIB
//! regulariser. The labels `m` come from [`pair_labels`] or, for mixed (Mixup/CutMix) images,
//! [`msda_labels`].
//!
//! ```text
//! §3.2 d(Z_v, Z_t) = ‖μ_v − μ_t‖² + Σ_k exp(v_v,k) + Σ_k exp(v_t,k)      (closed-form sampled distance)
//! §3.3 logit[i,j] = −a·d(Z_v_i, Z_t_j) + b,  p = sigmoid(logit);  a, b learnable (init 5, 5)
//!      L_match = mean over B×B of BCE(logit, m),  BCE(x, y) = max(x, 0) − x·y + ln(1 + e^{−|x|})
//! §3.5 per row i: g_i = first argmax_j m[i,j], y_i = m[i,g_i], PP_i = { j : logit[i,j] ≥ logit[i,g_i] }
//!      m'[i,j] = y_i for j ∈ PP_i, else m[i,j];  L_pp_i2t = mean BCE(logit, m')
//!      L_pp_t2i: the same on logitᵀ with mᵀ
//! §3.6 KL_mod = −½ mean over B×D of (1 + v − μ² − exp(v))   (0 if above 10000);  L_vib = KL_img + KL_txt
//! §3.7 L = 2·L_match + α (L_pp_i2t + L_pp_t2i) + β L_vib      (α = 0.1, β = 1e-4; the reference form)
//! ```
//!
//! `‖μ_v − μ_t‖²` is the definition of §3.2; for unit μ it equals the spec's `2 − 2 μ_v·μ_t`, and
//! the head's normalisation removes the radial part of its gradient, so both train alike. The
//! pseudo-positive selection is not differentiable and is made on the host from the logit values.

use burn::module::{Module, Param, ParamId};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::common::{scalar, value};

/// `loss.type = "pcmepp"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PcmeppConfig {
    /// Initial `a` ("negative_scale") of the matching logit `−a·d + b` (spec: 5).
    #[serde(default = "five")]
    pub init_a: f64,
    /// Initial `b` ("shift") (spec: 5).
    #[serde(default = "five")]
    pub init_b: f64,
    /// Factor on L_match (reference: 2, the two identical directions; paper eq. 3: 1).
    #[serde(default = "two")]
    pub match_weight: f64,
    /// Weight α of the pseudo-positive terms (0.1; 0.01 at 20% noise, 0 at 50%).
    #[serde(default = "default_pp_weight")]
    pub pseudo_positive_weight: f64,
    /// Weight β of L_vib (1e-4).
    #[serde(default = "default_vib_weight")]
    pub vib_weight: f64,
    /// A VIB term above this value is replaced by 0 (reference safety guard: 10000).
    #[serde(default = "default_vib_guard")]
    pub vib_guard: f64,
    /// Label smoothing `e` of MSDA labels and of plain labels (1e-4).
    #[serde(default = "default_smoothing")]
    pub label_smoothing: f64,
    /// Keep in-batch duplicate images as positives when MSDA is on (the reference drops them;
    /// spec §5 item 9).
    #[serde(default)]
    pub keep_duplicate_positives: bool,
}

fn five() -> f64 {
    5.0
}
fn two() -> f64 {
    2.0
}
fn default_pp_weight() -> f64 {
    0.1
}
fn default_vib_weight() -> f64 {
    1e-4
}
fn default_vib_guard() -> f64 {
    10000.0
}
fn default_smoothing() -> f64 {
    1e-4
}

impl Default for PcmeppConfig {
    fn default() -> Self {
        PcmeppConfig {
            init_a: five(),
            init_b: five(),
            match_weight: two(),
            pseudo_positive_weight: default_pp_weight(),
            vib_weight: default_vib_weight(),
            vib_guard: default_vib_guard(),
            label_smoothing: default_smoothing(),
            keep_duplicate_positives: false,
        }
    }
}

/// The learnable `a` and `b` of the matching probability (no weight decay in the reference).
#[derive(Module, Debug)]
pub struct MatchScale {
    pub a: Param<Tensor<1>>,
    pub b: Param<Tensor<1>>,
}

impl MatchScale {
    pub fn init(config: &PcmeppConfig, device: &Device) -> MatchScale {
        let p = |v: f64| Param::initialized(ParamId::new(), scalar(v, device).set_require_grad(device.is_autodiff()));
        MatchScale { a: p(config.init_a), b: p(config.init_b) }
    }
}

/// Closed-form sampled distance of every image–caption pair (§3.2).
///
/// # Shapes
/// - `mu_v`, `v_v`: `[B_v, D]`; `mu_t`, `v_t`: `[B_t, D]` → `[B_v, B_t]`
pub fn csd(mu_v: Tensor<2>, v_v: Tensor<2>, mu_t: Tensor<2>, v_t: Tensor<2>) -> Tensor<2> {
    let sq_v = mu_v.clone().powi_scalar(2).sum_dim(1); // [B_v, 1]
    let sq_t = mu_t.clone().powi_scalar(2).sum_dim(1).transpose(); // [1, B_t]
    let cross = mu_v.matmul(mu_t.transpose());
    let var_v = v_v.exp().sum_dim(1);
    let var_t = v_t.exp().sum_dim(1).transpose();
    sq_v + sq_t - cross.mul_scalar(2.0) + var_v + var_t
}

/// `−a·d + b`.
///
/// # Shapes
/// - `d`: `[n, m]`, `a`, `b`: `[1]` → `[n, m]`
pub fn match_logits(d: Tensor<2>, a: Tensor<1>, b: Tensor<1>) -> Tensor<2> {
    b.reshape([1, 1]) - d * a.reshape([1, 1])
}

/// Mean over all entries of `BCE(x, y) = max(x, 0) − x·y + ln(1 + e^{−|x|})`.
///
/// # Shapes
/// - `logits`, `labels`: `[n, m]` → `[1]`
pub fn bce_with_logits(logits: Tensor<2>, labels: Tensor<2>) -> Tensor<1> {
    let x = logits;
    (x.clone().clamp_min(0.0) - x.clone() * labels.detach() + x.abs().neg().exp().log1p()).mean()
}

fn host(t: &Tensor<2>) -> Vec<f32> {
    t.clone().into_data().try_to_vec::<f32>().expect("float tensor")
}

/// Labels with pseudo-positives (§3.5) for the rows of `logits`, and the number of
/// pseudo-positives added (`|PP| − B`).
///
/// # Shapes
/// - `logits`, `labels`: `[B, B]` → `[B, B]`
pub fn pseudo_positive_labels(logits: &Tensor<2>, labels: &Tensor<2>) -> (Tensor<2>, usize) {
    let [b, c] = labels.dims();
    let (x, m) = (host(logits), host(labels));
    let mut out = m.clone();
    let mut count = 0;
    for i in 0..b {
        let row = &m[i * c..(i + 1) * c];
        // First maximum, as torch.argmax.
        let g = (0..c).fold(0, |best, j| if row[j] > row[best] { j } else { best });
        let (y, threshold) = (row[g], x[i * c + g]);
        for j in 0..c {
            if x[i * c + j] >= threshold {
                out[i * c + j] = y;
                // `g` itself is no pseudo-positive (and a NaN logit passes no threshold).
                count += usize::from(j != g);
            }
        }
    }
    (Tensor::from_data(TensorData::new(out, [b, c]), &labels.device()), count)
}

/// `−½ mean(1 + v − μ² − exp(v))`, replaced by 0 above `guard` (§3.6).
///
/// # Shapes
/// - `mu`, `v`: `[B, D]` → `[1]`
pub fn vib(mu: Tensor<2>, v: Tensor<2>, guard: f64) -> Tensor<1> {
    let kl = (v.clone().add_scalar(1.0) - mu.powi_scalar(2) - v.exp()).mean().mul_scalar(-0.5);
    if value(&kl) as f64 > guard {
        kl.mul_scalar(0.0)
    } else {
        kl
    }
}

/// Labels without MSDA (§3.4): 1 for the pair and for repeated images, smoothed to
/// `(1 − e)·m + e·(1 − m)` when `e > 0`.
///
/// # Shapes
/// - output: `[B, B]`
pub fn pair_labels(image_ids: &[u64], smoothing: f64, device: &Device) -> Tensor<2> {
    let b = image_ids.len();
    let e = smoothing as f32;
    let m: Vec<f32> = (0..b * b).map(|k| if image_ids[k / b] == image_ids[k % b] { 1.0 - e } else { e }).collect();
    Tensor::from_data(TensorData::new(m, [b, b]), device)
}

/// Labels of a mixed batch (§3.8 step 4): row `i` is `λ_i·1hot_e(i) + (1 − λ_i)·1hot_e(B−1−i)`,
/// `1hot_e(k)` having `1 − e` at `k` and `e` elsewhere; `λ_i = 1` for unmixed rows. With
/// `duplicates` (the `keep_duplicate_positives` fix), columns of the same image as the row's
/// own get the row's own weight too.
///
/// # Shapes
/// - output: `[B, B]`, `B = lambdas.len()`
pub fn msda_labels(lambdas: &[f64], smoothing: f64, duplicates: Option<&[u64]>, device: &Device) -> Tensor<2> {
    let b = lambdas.len();
    let e = smoothing;
    let mut m = vec![0f32; b * b];
    for (i, &lam) in lambdas.iter().enumerate() {
        let partner = b - 1 - i;
        for j in 0..b {
            let own = duplicates.map_or(j == i, |ids| ids[j] == ids[i]);
            let hot = |on: bool| if on { 1.0 - e } else { e };
            m[i * b + j] = (lam * hot(own) + (1.0 - lam) * hot(j == partner)) as f32;
        }
    }
    Tensor::from_data(TensorData::new(m, [b, b]), device)
}

/// The PCME++ loss and its parts.
#[derive(Debug, Clone)]
pub struct PcmeppTerms {
    /// `w_match L_match + α (L_pp_i2t + L_pp_t2i) + β L_vib`.
    pub loss: Tensor<1>,
    pub matching: Tensor<1>,
    pub pp_i2t: Tensor<1>,
    pub pp_t2i: Tensor<1>,
    pub vib: Tensor<1>,
    /// Pseudo-positives added per direction (image→text, text→image).
    pub pseudo_positives: (usize, usize),
}

/// The PCME++ loss (§3.7) for a batch of image and caption distributions and labels `m`.
///
/// # Shapes
/// - `mu_v`, `v_v`, `mu_t`, `v_t`: `[B, D]` (μ unit-norm from the heads); `a`, `b`: `[1]`;
///   `labels`: `[B, B]` (row = image) → [`PcmeppTerms`] of `[1]`
#[allow(clippy::too_many_arguments)]
pub fn pcmepp(
    mu_v: Tensor<2>,
    v_v: Tensor<2>,
    mu_t: Tensor<2>,
    v_t: Tensor<2>,
    a: Tensor<1>,
    b: Tensor<1>,
    labels: Tensor<2>,
    config: &PcmeppConfig,
) -> PcmeppTerms {
    let logits = match_logits(csd(mu_v.clone(), v_v.clone(), mu_t.clone(), v_t.clone()), a, b);
    let matching = bce_with_logits(logits.clone(), labels.clone());
    let (m_i2t, n_i2t) = pseudo_positive_labels(&logits, &labels);
    let logits_t = logits.clone().transpose();
    let (m_t2i, n_t2i) = pseudo_positive_labels(&logits_t, &labels.transpose());
    let pp_i2t = bce_with_logits(logits, m_i2t);
    let pp_t2i = bce_with_logits(logits_t, m_t2i);
    let vib = vib(mu_v, v_v, config.vib_guard) + vib(mu_t, v_t, config.vib_guard);
    let loss = matching.clone().mul_scalar(config.match_weight)
        + (pp_i2t.clone() + pp_t2i.clone()).mul_scalar(config.pseudo_positive_weight)
        + vib.clone().mul_scalar(config.vib_weight);
    PcmeppTerms { loss, matching, pp_i2t, pp_t2i, vib, pseudo_positives: (n_i2t, n_t2i) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: &[f32], shape: [usize; 2]) -> Tensor<2> {
        Tensor::from_data(TensorData::new(v.to_vec(), shape), &Device::flex())
    }

    #[test]
    fn csd_of_a_pair_by_hand() {
        // μ_v = [1, 0], μ_t = [0.6, 0.8], v_v = [ln 0.1, ln 0.2], v_t = [ln 0.3, ln 0.4]:
        // ‖μ_v − μ_t‖² = 0.16 + 0.64 = 0.8; Σσ² = 0.3 + 0.7; d = 1.8.
        let d = csd(
            t(&[1.0, 0.0], [1, 2]),
            t(&[0.1f32.ln(), 0.2f32.ln()], [1, 2]),
            t(&[0.6, 0.8], [1, 2]),
            t(&[0.3f32.ln(), 0.4f32.ln()], [1, 2]),
        );
        assert!((d.into_data().try_to_vec::<f32>().unwrap()[0] - 1.8).abs() < 1e-6);
    }

    #[test]
    fn pseudo_positives_take_the_row_label_and_count_ties() {
        // Row 0: label argmax at 0 (logit 1.0); column 2 (1.0, a tie) and 1 (2.0) are PPs.
        let logits = t(&[1.0, 2.0, 1.0, 0.0, 3.0, 5.0, 0.0, 0.0, 0.0], [3, 3]);
        let labels = t(&[0.9, 0.05, 0.05, 0.0, 1.0, 0.0, 0.2, 0.3, 0.5], [3, 3]);
        let (m, n) = pseudo_positive_labels(&logits, &labels);
        let m = m.into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(n, 2 + 1 + 2);
        assert_eq!(&m[..3], &[0.9, 0.9, 0.9]);
        assert_eq!(&m[3..6], &[0.0, 1.0, 1.0]);
        assert_eq!(&m[6..], &[0.5, 0.5, 0.5]);
    }

    #[test]
    fn a_nan_logit_makes_no_pseudo_positive() {
        // A diverged run's NaN logits pass no threshold: the labels stay, none is counted (the
        // count once went below zero here).
        let logits = t(&[f32::NAN, 1.0, 2.0, f32::NAN], [2, 2]);
        let labels = t(&[1.0, 0.0, 0.0, 1.0], [2, 2]);
        let (m, n) = pseudo_positive_labels(&logits, &labels);
        assert_eq!(n, 0);
        assert_eq!(m.into_data().try_to_vec::<f32>().unwrap(), vec![1.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn msda_labels_mix_with_the_reversed_partner() {
        // B = 4, λ = [1, 0.6, 1, 0.3], e = 0: row 1 = 0.6·1hot(1) + 0.4·1hot(2).
        let m = msda_labels(&[1.0, 0.6, 1.0, 0.3], 0.0, None, &Device::flex()).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(&m[4..8], &[0.0, 0.6, 0.4, 0.0]);
        assert_eq!(&m[12..], &[0.7, 0.0, 0.0, 0.3]);
        // keep_duplicate_positives: images 0 and 2 are the same; row 0 marks both.
        let m = msda_labels(&[1.0, 1.0, 1.0, 1.0], 0.0, Some(&[7, 8, 7, 9]), &Device::flex());
        assert_eq!(&m.into_data().try_to_vec::<f32>().unwrap()[..4], &[1.0, 0.0, 1.0, 0.0]);
    }
}
