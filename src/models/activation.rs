//! GELU (the exact, erf form BERT and MPNet use) on the CPU. burn's CPU backend evaluates `erf`
//! with a scalar libm call per element, a fifth of a MiniLM forward pass, and again in the
//! backward pass; here the erf is a branch-free formula the compiler vectorises. In training the
//! values and slopes are computed together on the host and the gradient flows through the slope
//! (see [`gelu`]). Other devices use burn's own `gelu`.

use burn::backend::Flex;
use burn::tensor::{Device, Tensor, TensorData};

/// `0.5·x·(1 + erf(x/√2))`, within 2e-7·(1 + |x|) of the exact value.
///
/// On an autodiff CPU device the values `g(x)` and slopes `g'(x) = Φ(x) + x·φ(x)` are computed
/// on the host and joined as `g(x) + (x − detach(x))·g'(x)`: the same values (the second term is
/// exactly zero) with the gradient `g'(x)·upstream`. burn's `gelu` evaluates erf by a scalar libm
/// call forward and erf and exp again backward: for the tiny training preset's BERT (2 layers,
/// FFN 128, batch 64 of 12 tokens) that was about 6% of a training step's CPU time.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    let device = x.device();
    if !is_host(&device) || x.dtype() != burn::tensor::DType::F32 {
        return burn::tensor::activation::gelu(x);
    }
    if device.is_autodiff() {
        let shape = x.shape();
        let mut values = x.clone().into_data().try_into_vec::<f32>().expect("checked to be f32");
        let mut slopes = vec![0f32; values.len()];
        gelu_slope_slice(&mut values, &mut slopes);
        let values = Tensor::<D>::from_data(TensorData::new(values, shape.clone()), &device);
        let slopes = Tensor::<D>::from_data(TensorData::new(slopes, shape), &device);
        return (x.clone() - x.detach()) * slopes + values;
    }
    if device == Device::flex() {
        // In place in the tensor's own buffer (copied first only if shared). GELU is elementwise,
        // so a view's layout still reads the right values.
        let mut t = x.try_into_primitive::<Flex>().expect("a float tensor on the flex device");
        gelu_slice(t.storage_mut::<f32>());
        return Tensor::from_primitive::<Flex>(t);
    }
    let shape = x.shape();
    let mut values = x.into_data().try_into_vec::<f32>().expect("checked to be f32");
    gelu_slice(&mut values);
    Tensor::from_data(TensorData::new(values, shape), &device)
}

/// [`gelu_f32`] over a slice, in the widest vectors the CPU has (the same operations in the
/// same order at every width, so the same bits).
fn gelu_slice(values: &mut [f32]) {
    in_widest_vectors(|| values.iter_mut().for_each(|v| *v = gelu_f32(*v)));
}

/// GELU in place of each value of `values`, and its slope `Φ(x) + x·φ(x)` into `slopes`
/// ([`gelu_slope_f32`]), in the widest vectors the CPU has.
fn gelu_slope_slice(values: &mut [f32], slopes: &mut [f32]) {
    in_widest_vectors(|| {
        for (v, d) in values.iter_mut().zip(slopes.iter_mut()) {
            (*v, *d) = gelu_slope_f32(*v);
        }
    });
}

/// Runs `f` compiled for the widest vectors this CPU has: AVX-512F, else AVX2, else the
/// baseline. `f` is inlined into each wrapper, so its loops vectorise at that width.
#[inline(always)]
fn in_widest_vectors(f: impl FnOnce()) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            unsafe { with_avx512(f) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { with_avx2(f) };
            return;
        }
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn with_avx512(f: impl FnOnce()) {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn with_avx2(f: impl FnOnce()) {
    f()
}

/// Whether `device` computes on this machine's CPU (flex, or ndarray when compiled in).
pub fn is_host(device: &Device) -> bool {
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

#[inline(always)]
fn gelu_f32(x: f32) -> f32 {
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let tail = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5)))) * exp_neg(z * z);
    // 1 + erf(x): 2 − tail for x ≥ 0, and the tail itself (no cancellation) for x < 0.
    let one_plus_erf = if x >= 0.0 { 2.0 - tail } else { tail };
    0.5 * x * one_plus_erf
}

/// [`gelu_f32`] (the same bits) and its slope `Φ(x) + x·φ(x)`, where `Φ(x) = (1 + erf(x/√2))/2`
/// and `φ(x) = e^(−x²/2)/√(2π)` share erf's exponential.
#[inline(always)]
fn gelu_slope_f32(x: f32) -> (f32, f32) {
    const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;
    let z = x.abs() * std::f32::consts::FRAC_1_SQRT_2;
    let t = 1.0 / (1.0 + P * z);
    let e = exp_neg(z * z);
    let tail = t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5)))) * e;
    let one_plus_erf = if x >= 0.0 { 2.0 - tail } else { tail };
    (0.5 * x * one_plus_erf, 0.5 * one_plus_erf + x * e * FRAC_1_SQRT_2PI)
}

/// `e^(−y)` for `y ≥ 0` (0 beyond f32's range), branch-free: `−y = n·ln 2 + r` with `n` an
/// integer and `|r| ≤ ln 2 / 2` (ln 2 split in two parts so `r` is exact), `e^r` by its degree-7
/// Taylor polynomial (truncation below 6e-9), and `2^n` put straight into the exponent bits.
/// `n` is rounded by adding and subtracting 1.5·2²³ (exact for |n| < 2²²; `round` would be a
/// libm call that keeps the loop from vectorising on baseline x86-64), and `n ≥ −126` here.
#[inline(always)]
fn exp_neg(y: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0;
    let x = (-y).max(-87.0);
    // `shifted` = 1.5·2²³ + n exactly, so its bits are ROUND's plus n.
    let shifted = x * std::f32::consts::LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5 + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
    // 2^n from n's integer bits (integer lanes: an `as i32` conversion would not vectorise).
    let scale = f32::from_bits(shifted.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23);
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
    fn the_slope_is_the_exact_derivative_and_the_values_are_gelus_bits() {
        // g'(x) = Φ(x) + x·φ(x), in f64 from the series erf.
        let mut worst: f64 = 0.0;
        let mut x = -12.0f64;
        while x <= 12.0 {
            let cdf = 0.5 * (1.0 + erf64(x / std::f64::consts::SQRT_2));
            let pdf = (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
            let (value, slope) = gelu_slope_f32(x as f32);
            assert_eq!(value.to_bits(), gelu_f32(x as f32).to_bits(), "gelu({x})");
            worst = worst.max((slope as f64 - (cdf + x * pdf)).abs());
            x += 0.0007;
        }
        assert!(worst < 4e-7, "worst slope error {worst}");
        // Far out: the slope is 0 on the left (e^(−x²/2) stops at e^−87) and 1 on the right.
        assert!(gelu_slope_f32(-100.0).1.abs() < 1e-30, "{:?}", gelu_slope_f32(-100.0));
        assert_eq!(gelu_slope_f32(100.0).1, 1.0);
        // The vector paths give the scalar bits.
        let xs: Vec<f32> = (0..40_001).map(|i| (i as f32 - 20_000.0) * 6e-4).chain([-100.0, 100.0, -0.0]).collect();
        let scalar: Vec<(u32, u32)> =
            xs.iter().map(|&x| gelu_slope_f32(x)).map(|(v, d)| (v.to_bits(), d.to_bits())).collect();
        let (mut v, mut d) = (xs.clone(), vec![0f32; xs.len()]);
        gelu_slope_slice(&mut v, &mut d);
        assert_eq!(v.iter().zip(&d).map(|(v, d)| (v.to_bits(), d.to_bits())).collect::<Vec<_>>(), scalar);
    }

    #[test]
    fn training_gelu_has_burns_values_and_gradient() {
        // On an autodiff CPU device: the values of the inference path, and the input's gradient
        // (upstream gradients that differ per element) equal to that through burn's own `gelu`.
        let device = Device::flex().autodiff();
        let data: Vec<f32> = (0..96).map(|i| (i as f32 - 48.0) * 0.13).collect();
        let upstream: Vec<f32> = (0..96).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.3).collect();
        let x = Tensor::<2>::from_data(TensorData::new(data.clone(), [8, 12]), &device).require_grad();
        let up = Tensor::<2>::from_data(TensorData::new(upstream, [8, 12]), &device);
        let run = |y: Tensor<2>| {
            let grads = (y.clone() * up.clone()).sum().backward();
            (
                y.into_data().try_into_vec::<f32>().unwrap(),
                x.grad(&grads).unwrap().into_data().try_into_vec::<f32>().unwrap(),
            )
        };
        let (ours, our_grad) = run(gelu(x.clone()));
        let (burns, burn_grad) = run(burn::tensor::activation::gelu(x.clone()));
        let inference = gelu(Tensor::<2>::from_data(TensorData::new(data.clone(), [8, 12]), &Device::flex()));
        assert_eq!(ours, inference.into_data().try_into_vec::<f32>().unwrap());
        for (i, x) in data.iter().enumerate() {
            assert!((ours[i] - burns[i]).abs() <= 3e-7 * (1.0 + x.abs()), "gelu({x}): {} vs {}", ours[i], burns[i]);
            assert!((our_grad[i] - burn_grad[i]).abs() <= 2e-6, "gradient at {x}: {} vs {}", our_grad[i], burn_grad[i]);
        }
        assert!(burn_grad.iter().any(|g| g.abs() > 0.5), "an upstream gradient that shows");
    }

    #[test]
    fn in_place_gelu_leaves_shared_tensors_and_views_right() {
        let device = Device::flex();
        let data: Vec<f32> = (0..48).map(|i| (i as f32 - 24.0) * 0.3).collect();
        let x = Tensor::<2>::from_data(TensorData::new(data.clone(), [6, 8]), &device);
        let kept = x.clone();
        // A transposed, narrowed view of a shared buffer.
        let view = x.swap_dims(0, 1).narrow(0, 2, 5);
        let want: Vec<f32> =
            (2..7).flat_map(|c| (0..6).map(move |r| (r, c))).map(|(r, c)| gelu_f32(data[r * 8 + c])).collect();
        assert_eq!(gelu(view).into_data().try_into_vec::<f32>().unwrap(), want);
        assert_eq!(kept.into_data().try_into_vec::<f32>().unwrap(), data, "the shared input was changed");
    }

    #[test]
    fn vector_paths_give_the_scalar_bits() {
        let xs: Vec<f32> = (0..40_001).map(|i| (i as f32 - 20_000.0) * 6e-4).chain([-100.0, 100.0, -0.0]).collect();
        let scalar: Vec<u32> = xs.iter().map(|&x| gelu_f32(x).to_bits()).collect();
        let mut v = xs.clone();
        gelu_slice(&mut v);
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), scalar);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut v = xs.clone();
            // SAFETY: AVX2 checked above.
            unsafe { with_avx2(|| v.iter_mut().for_each(|x| *x = gelu_f32(*x))) };
            assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), scalar);
        }
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
