//! Helpers of the models' unit tests: a tensor's values or their bit patterns, and element-wise
//! closeness with a relative tolerance.

use burn::tensor::Tensor;

/// `t`'s values (`f32`), in its logical order.
pub(crate) fn values<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// `t`'s values as bit patterns, so that NaNs compare and the sign of zero counts.
pub(crate) fn bits<const D: usize>(t: Tensor<D>) -> Vec<u32> {
    values(t).iter().map(|v| v.to_bits()).collect()
}

/// Panics, naming `what` and the first position, unless every `|got − want| ≤ tolerance·(1 +
/// |want|)`.
pub(crate) fn assert_close(got: &[f32], want: &[f32], tolerance: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tolerance * (1.0 + b.abs()), "{what} [{i}]: {a} vs {b}");
    }
}
