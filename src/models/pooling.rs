//! Sentence embeddings from token states: mean over the attention mask (Sentence-BERT's
//! default, and the Fistful/OTTER text pooling) or the `[CLS]` token; optional L2
//! normalisation (sentence-transformers' `Normalize` module), and the scaling that keeps it
//! exact for features read from tables.

use burn::tensor::{Int, Tensor};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Pooling {
    /// Mean of the token states where the attention mask is 1 (special tokens included).
    Mean,
    /// The first token's state.
    Cls,
}

/// # Shapes
/// - `states`: `[batch, seq, hidden]`, `mask`: `[batch, seq]`
/// - output: `[batch, hidden]`
pub fn pool(states: Tensor<3>, mask: Tensor<2, Int>, pooling: Pooling) -> Tensor<2> {
    let [b, s, h] = states.dims();
    match pooling {
        Pooling::Cls => states.slice([0..b, 0..1, 0..h]).reshape([b, h]),
        Pooling::Mean => {
            let m = mask.float().reshape([b, s, 1]);
            let summed = (states * m.clone()).sum_dim(1).reshape([b, h]);
            // sentence-transformers clamps the token count at 1e-9.
            let count = m.sum_dim(1).reshape([b, 1]).clamp_min(1e-9);
            summed / count
        }
    }
}

/// Row-wise L2 normalisation, `x / max(‖x‖, 1e-12)` (torch.nn.functional.normalize).
///
/// # Shapes
/// - `x`: `[batch, dim]` → `[batch, dim]`
pub fn l2_normalize(x: Tensor<2>) -> Tensor<2> {
    let norm = x.clone().powf_scalar(2.0).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}

/// Scales each `dim`-wide row of `values` by a power of two that brings its largest |value|
/// into [1, 2), for rows read from a table that are only ever used L2-normalised (teacher
/// features, the noise diagnostic's embeddings, `aligned_features`): their direction is all
/// that counts. In f32 the squared norm of a row of ~1e20s overflows, and the norm of a row of
/// ~1e-13s or less falls under [`l2_normalize`]'s floor of 1e-12: either way the row would
/// normalise to (nearly) zero. A power of two scales exactly, so a
/// row that normalises well already normalises to the same values (to within rounding: the
/// test below finds the same bits); all-zero rows stay zero.
pub fn scale_rows_for_normalising(values: &mut [f32], dim: usize) {
    for row in values.chunks_mut(dim.max(1)) {
        let largest = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        if largest == 0.0 || !largest.is_finite() {
            continue;
        }
        // The exponent of `largest` (subnormals included), so `largest · 2^-e` is in [1, 2).
        let e = (largest as f64).log2().floor() as i32;
        let e = if (largest as f64) * 2f64.powi(-e) >= 2.0 { e + 1 } else { e };
        if e == 0 {
            continue;
        }
        // In f64: 2^-e may lie outside f32's range (a row of subnormals needs 2^149).
        let scale = 2f64.powi(-e);
        for x in row.iter_mut() {
            *x = (*x as f64 * scale) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;

    fn normalised(values: &[f32], dim: usize) -> Vec<f32> {
        let device = burn::tensor::Device::flex();
        let x = Tensor::<2>::from_data(TensorData::new(values.to_vec(), [values.len() / dim, dim]), &device);
        l2_normalize(x).into_data().try_to_vec::<f32>().unwrap()
    }

    #[test]
    fn rows_of_any_scale_normalise_as_they_would_at_unit_scale() {
        let dim = 5;
        let base: Vec<f32> = vec![0.3, -1.7, 0.0, 2.5, -0.01, 1.0, 1.0, -1.0, 0.5, 0.25];
        let want = normalised(&base, dim);
        for factor in [1.0f32, 3.0, 1e-3, 1e20, -1e25, 1e30, 1e-20, 1e-30, 1e-38] {
            let mut scaled: Vec<f32> = base.iter().map(|x| x * factor).collect();
            let raw = normalised(&scaled, dim);
            scale_rows_for_normalising(&mut scaled, dim);
            let got = normalised(&scaled, dim);
            let sign = factor.signum();
            for (g, w) in got.iter().zip(&want) {
                assert!((g - sign * w).abs() <= 2e-7, "×{factor}: {got:?} against {want:?}");
            }
            // Without the scaling, the far ends normalise to zero (what this guards against).
            if factor.abs() >= 1e20 || factor.abs() <= 1e-20 {
                assert!(raw.iter().all(|x| x.abs() < 1e-3), "×{factor}: {raw:?}");
            }
        }
        // Rows that normalise well keep their bits, and zero rows stay zero.
        let mut same = base.clone();
        scale_rows_for_normalising(&mut same, dim);
        assert_eq!(normalised(&same, dim), want);
        let mut zeros = vec![0.0f32; 2 * dim];
        scale_rows_for_normalising(&mut zeros, dim);
        assert!(zeros.iter().all(|&x| x == 0.0));
        // Every scaled row's largest |value| is in [1, 2).
        let mut rows: Vec<f32> = vec![3e-45, 0.0, 1e-40, 0.0, 0.0, 7e37, -3e38, 1.0, 0.0, 0.0];
        scale_rows_for_normalising(&mut rows, dim);
        for row in rows.chunks(dim) {
            let largest = row.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert!((1.0..2.0).contains(&largest), "{row:?}");
        }
    }
}
