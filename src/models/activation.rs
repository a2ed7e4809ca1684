//! GELU (the exact, erf form BERT and MPNet use) for inference on the CPU. burn's CPU backend
//! evaluates `erf` with a scalar libm call per element, a fifth of a MiniLM forward pass; here
//! the erf is a branch-free formula the compiler vectorises. Other devices, and autodiff
//! devices (training needs the backward pass), use burn's own `gelu`.

use burn::tensor::{Device, Tensor, TensorData};

/// `0.5·x·(1 + erf(x/√2))`, within 2e-7·(1 + |x|) of the exact value.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let device = x.device();
    if device.is_autodiff() || !is_host(&device) || x.dtype() != burn::tensor::DType::F32 {
        return burn::tensor::activation::gelu(x);
    }
    let shape = x.shape();
    let mut values = x.into_data().try_into_vec::<f32>().expect("checked to be f32");
    values.iter_mut().for_each(|v| *v = gelu_f32(*v));
    Tensor::from_data(TensorData::new(values, shape), &device)
}

fn is_host(device: &Device) -> bool {
    #[cfg(feature = "ndarray")]
    #[allow(deprecated)]
    if *device == Device::ndarray() {
        return true;
    }
    *device == Device::flex()
}

// Abramowitz & Stegun 7.1.26: erf(z) = 1 − t·(a1 + a2·t + … + a5·t⁴)·e^(−z²), t = 1/(1 + p·z),
// for z ≥ 0, absolute error ≤ 1.5e-7.
const P: f32 = 0.327_591_1;
const A1: f32 = 0.254_829_6;
const A2: f32 = -0.284_496_74;
const A3: f32 = 1.421_413_7;
const A4: f32 = -1.453_152;
const A5: f32 = 1.061_405_4;

#[inline]
fn gelu_f32(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let tail = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5)))) * exp_neg(z * z);
    // 1 + erf(x): 2 − tail for x ≥ 0, and the tail itself (no cancellation) for x < 0.
    let one_plus_erf = if x >= 0.0 { 2.0 - tail } else { tail };
    0.5 * x * one_plus_erf
}

/// `e^(−y)` for `y ≥ 0` (0 beyond f32's range), branch-free: `−y = n·ln 2 + r` with `n` an
/// integer and `|r| ≤ ln 2 / 2` (ln 2 split in two parts so `r` is exact), `e^r` by its degree-7
/// Taylor polynomial (truncation below 6e-9), and `2^n` put straight into the exponent bits.
#[inline]
fn exp_neg(y: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    let x = (-y).max(-87.0);
    let n = (x * std::f32::consts::LOG2_E).round();
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
    let scale = f32::from_bits(((n as i32 + 127) as u32) << 23);
    p * scale
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf in f64 by its Taylor series (|z| ≤ 3) or continued fraction for erfc (z > 3).
    fn erf64(z: f64) -> f64 {
        if z < 0.0 {
            return -erf64(-z);
        }
        if z <= 3.0 {
            let (mut term, mut sum, mut n) = (z, z, 0.0);
            while term.abs() > 1e-17 {
                n += 1.0;
                term *= -z * z / n;
                sum += term / (2.0 * n + 1.0);
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let mut f = 0.0;
            for k in (1..60).rev() {
                f = (k as f64 / 2.0) / (z + f);
            }
            1.0 - (-z * z).exp() / (std::f64::consts::PI.sqrt() * (z + f))
        }
    }

    #[test]
    fn gelu_matches_the_exact_erf_form() {
        let mut worst: f64 = 0.0;
        let mut x = -12.0f64;
        while x <= 12.0 {
            let exact = 0.5 * x * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            let got = gelu_f32(x as f32) as f64;
            worst = worst.max((got - exact).abs() / (1.0 + x.abs()));
            x += 0.0007;
        }
        assert!(worst < 2e-7, "worst error {worst}");
        assert_eq!(gelu_f32(0.0), 0.0);
        assert!(gelu_f32(-100.0).abs() < 1e-30);
        assert_eq!(gelu_f32(100.0), 100.0);
    }

    #[test]
    fn exp_neg_is_accurate_over_the_range_used() {
        for i in 0..2000 {
            let y = i as f32 * 0.05;
            let want = (-(y as f64)).exp();
            let got = exp_neg(y) as f64;
            assert!((got - want).abs() <= 4e-7 * want + 1e-37, "e^-{y}: {got} vs {want}");
        }
    }

    #[test]
    fn tensor_gelu_equals_burns_on_the_cpu() {
        let device = Device::flex();
        let data: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) * 0.21).collect();
        let x = Tensor::<2>::from_data(TensorData::new(data.clone(), [8, 8]), &device);
        let ours = gelu(x.clone()).into_data().try_into_vec::<f32>().unwrap();
        let burns = burn::tensor::activation::gelu(x).into_data().try_into_vec::<f32>().unwrap();
        for ((a, b), x) in ours.iter().zip(&burns).zip(&data) {
            assert!((a - b).abs() <= 3e-7 * (1.0 + x.abs()), "gelu({x}): {a} vs {b}");
        }
    }
}
