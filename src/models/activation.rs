//! The transformers' MLP activations on the CPU: GELU (the exact, erf form BERT and MPNet use),
//! QuickGELU `x·σ(1.702x)` (OpenAI CLIP's ViT and text tower) and ReLU6 (Unicom's ViT, in
//! inference only, see [`relu6`]). burn's CPU backend evaluates
//! them with a scalar libm call per element (`erf`; `exp` in the sigmoid) on one pass per
//! operation: a fifth of a MiniLM forward pass, about 12% of a CLIP ViT-B/32 one. Here each is
//! one pass of a branch-free formula the compiler vectorises, split over rayon's threads. In
//! training the values and slopes are computed together on the host and the gradient flows
//! through the slope (see [`gelu`]). Other devices use burn's own operations.

use burn::backend::Flex;
use burn::tensor::activation::sigmoid;
use burn::tensor::{Device, Tensor, TensorData};
use rayon::prelude::*;

/// `0.5·x·(1 + erf(x/√2))`, within 2e-7·(1 + |x|) of the exact value.
///
/// On an autodiff CPU device the values `g(x)` and slopes `g'(x) = Φ(x) + x·φ(x)` are computed
/// on the host and joined as `g(x) + (x − detach(x))·g'(x)`: the same values (the second term is
/// exactly zero) with the gradient `g'(x)·upstream`. burn's `gelu` evaluates erf by a scalar libm
/// call forward and erf and exp again backward: for the tiny training preset's BERT (2 layers,
/// FFN 128, batch 64 of 12 tokens) that was about 6% of a training step's CPU time.
pub fn gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    on_host(x, Activation::Gelu, burn::tensor::activation::gelu)
}

/// QuickGELU, `x·σ(1.702·x)`, within 2e-7·(1 + |x|) of the exact value; on the CPU as [`gelu`]
/// (values and slopes `σ(a) + 1.702·x·σ(a)·(1 − σ(a))`, `a = 1.702·x`, in training), elsewhere
/// burn's `x·sigmoid(1.702·x)`.
pub fn quick_gelu<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    on_host(x, Activation::QuickGelu, |x| x.clone() * sigmoid(x.mul_scalar(QUICK_GELU_SCALE)))
}

/// ReLU6, `min(max(x, 0), 6)` (Unicom's MLP), NaN kept as in PyTorch. On the CPU without autodiff
/// one pass in place on rayon's threads (burn's `clamp` is a scalar loop on one thread: 6% of a
/// Unicom ViT-B/32 forward pass); in training, and on other devices, burn's `clamp`, whose
/// gradient needs no host values.
pub fn relu6<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    if x.device().is_autodiff() {
        return x.clamp(0.0, 6.0);
    }
    on_host(x, Activation::Relu6, |x| x.clamp(0.0, 6.0))
}

/// QuickGELU's sigmoid scale (OpenAI CLIP's `x * torch.sigmoid(1.702 * x)`).
const QUICK_GELU_SCALE: f32 = 1.702;

/// The activations computed on the host.
#[derive(Clone, Copy)]
enum Activation {
    Gelu,
    QuickGelu,
    Relu6,
}

impl Activation {
    #[inline(always)]
    fn value(self, x: f32) -> f32 {
        match self {
            Activation::Gelu => gelu_f32(x),
            Activation::QuickGelu => quick_gelu_f32(x),
            Activation::Relu6 => x.clamp(0.0, 6.0),
        }
    }

    #[inline(always)]
    fn value_slope(self, x: f32) -> (f32, f32) {
        match self {
            Activation::Gelu => gelu_slope_f32(x),
            Activation::QuickGelu => quick_gelu_slope_f32(x),
            Activation::Relu6 => unreachable!("relu6 trains through burn's clamp"),
        }
    }
}

/// `activation` of `x` on the host, or `elsewhere(x)` (burn's operations) where the device is not
/// this CPU or the values are not f32.
fn on_host<const D: usize>(
    x: Tensor<D>,
    activation: Activation,
    elsewhere: impl FnOnce(Tensor<D>) -> Tensor<D>,
) -> Tensor<D> {
    let device = x.device();
    if !is_host(&device) || x.dtype() != burn::tensor::DType::F32 {
        return elsewhere(x);
    }
    if device.is_autodiff() {
        let shape = x.shape();
        let mut values = x.clone().into_data().try_into_vec::<f32>().expect("checked to be f32");
        let mut slopes = vec![0f32; values.len()];
        values_and_slopes(activation, &mut values, &mut slopes);
        let values = Tensor::<D>::from_data(TensorData::new(values, shape.clone()), &device);
        let slopes = Tensor::<D>::from_data(TensorData::new(slopes, shape), &device);
        return (x.clone() - x.detach()) * slopes + values;
    }
    if device == Device::flex() {
        // In place in the tensor's own buffer (copied first only if shared). The activation is
        // elementwise, so a view's layout still reads the right values.
        let mut t = x.try_into_primitive::<Flex>().expect("a float tensor on the flex device");
        values_in_place(activation, t.storage_mut::<f32>());
        return Tensor::from_primitive::<Flex>(t);
    }
    let shape = x.shape();
    let mut values = x.into_data().try_into_vec::<f32>().expect("checked to be f32");
    values_in_place(activation, &mut values);
    Tensor::from_data(TensorData::new(values, shape), &device)
}

/// Values per rayon task of the host activations: a task's overhead is then noise (a 32 Ki-value
/// chunk takes some 10 µs), and a tensor of a few tasks still spreads over the cores.
const TASK: usize = 1 << 15;

/// `activation` in place of each value, in the widest vectors the CPU has (the same operations
/// in the same order at every width, so the same bits), chunks on rayon's threads.
fn values_in_place(activation: Activation, values: &mut [f32]) {
    values.par_chunks_mut(TASK).for_each(|chunk| in_widest_vectors(InPlace(activation, chunk)));
}

/// `activation` in place of each value and its slope into `slopes`, as [`values_in_place`].
fn values_and_slopes(activation: Activation, values: &mut [f32], slopes: &mut [f32]) {
    values
        .par_chunks_mut(TASK)
        .zip(slopes.par_chunks_mut(TASK))
        .for_each(|(values, slopes)| in_widest_vectors(WithSlopes(activation, values, slopes)));
}

/// A loop to compile for several vector widths. Its `run` is `#[inline(always)]`, so that it is
/// compiled inside each wrapper of [`in_widest_vectors`] with that wrapper's features (a closure
/// can be left out of line, compiled for the baseline: this happened to `values_in_place`).
pub(super) trait Kernel {
    fn run(self);
}

/// [`values_in_place`]'s loop over one chunk.
struct InPlace<'a>(Activation, &'a mut [f32]);

impl Kernel for InPlace<'_> {
    #[inline(always)]
    fn run(self) {
        for v in self.1.iter_mut() {
            *v = self.0.value(*v);
        }
    }
}

/// [`values_and_slopes`]'s loop over one chunk.
struct WithSlopes<'a>(Activation, &'a mut [f32], &'a mut [f32]);

impl Kernel for WithSlopes<'_> {
    #[inline(always)]
    fn run(self) {
        for (v, d) in self.1.iter_mut().zip(self.2.iter_mut()) {
            (*v, *d) = self.0.value_slope(*v);
        }
    }
}

/// Runs `kernel` compiled for the widest vectors this CPU has: AVX-512F, else AVX2, else the
/// baseline.
#[inline(always)]
pub(super) fn in_widest_vectors(kernel: impl Kernel) {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            // SAFETY: the CPU has AVX-512F (checked above).
            unsafe { with_avx512(kernel) };
            return;
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked above).
            unsafe { with_avx2(kernel) };
            return;
        }
    }
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn with_avx512(kernel: impl Kernel) {
    kernel.run()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn with_avx2(kernel: impl Kernel) {
    kernel.run()
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

/// QuickGELU `x·σ(a)`, `a = 1.702·x`, with `σ(a) = 1/(1 + e^−a)` for `a ≥ 0` and `e^a/(1 + e^a)`
/// below, so that the one exponential is of `−|a|` and never overflows.
#[inline(always)]
fn quick_gelu_f32(x: f32) -> f32 {
    x * quick_sigmoid(x).0
}

/// [`quick_gelu_f32`] (the same bits) and its slope `σ(a) + 1.702·x·σ(a)·(1 − σ(a))`.
#[inline(always)]
fn quick_gelu_slope_f32(x: f32) -> (f32, f32) {
    let (s, s_one_minus_s) = quick_sigmoid(x);
    (x * s, s + QUICK_GELU_SCALE * x * s_one_minus_s)
}

/// `σ(a)` and `σ(a)·(1 − σ(a))` for `a = 1.702·x` (see [`quick_gelu_f32`]). With `e = e^−|a|`,
/// `p = 1/(1 + e)` and `q = e·p`, `σ` is `p` or `q` and `1 − σ` the other one, so the product
/// is `p·q` on both sides, without the cancellation of `1 − σ` near 1.
#[inline(always)]
fn quick_sigmoid(x: f32) -> (f32, f32) {
    let a = QUICK_GELU_SCALE * x;
    let e = exp_neg(a.abs());
    let p = 1.0 / (1.0 + e);
    let q = e * p;
    (if a >= 0.0 { p } else { q }, p * q)
}

/// `e^(−y)` for `y ≥ 0` (0 beyond f32's range), branch-free: `−y = n·ln 2 + r` with `n` an
/// integer and `|r| ≤ ln 2 / 2` (ln 2 split in two parts so `r` is exact), `e^r` by its degree-7
/// Taylor polynomial (truncation below 6e-9), and `2^n` put straight into the exponent bits.
/// `n` is rounded by adding and subtracting 1.5·2²³ (exact for |n| < 2²²; `round` would be a
/// libm call that keeps the loop from vectorising on baseline x86-64), and `n ≥ −126` here.
#[inline(always)]
pub(super) fn exp_neg(y: f32) -> f32 {
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

    /// A (value, slope) pair's bits.
    fn bits((v, d): (f32, f32)) -> (u32, u32) {
        (v.to_bits(), d.to_bits())
    }

    /// [`values_and_slopes`] of `xs` (the vector paths, on the pool), as bits.
    fn vector_values_and_slopes(activation: Activation, xs: &[f32]) -> Vec<(u32, u32)> {
        let (mut v, mut d) = (xs.to_vec(), vec![0f32; xs.len()]);
        values_and_slopes(activation, &mut v, &mut d);
        v.into_iter().zip(d).map(bits).collect()
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
        let scalar: Vec<(u32, u32)> = xs.iter().map(|&x| bits(gelu_slope_f32(x))).collect();
        assert_eq!(vector_values_and_slopes(Activation::Gelu, &xs), scalar);
    }

    /// `ours` against burn's composition `burns` on the CPU: in training, the values (equal to
    /// `ours` in inference, bit for bit) and the input's gradient under upstream gradients that
    /// differ per element.
    fn check_against_burn(ours: fn(Tensor<2>) -> Tensor<2>, burns: fn(Tensor<2>) -> Tensor<2>, step: f32, what: &str) {
        let device = Device::flex().autodiff();
        let data: Vec<f32> = (0..96).map(|i| (i as f32 - 48.0) * step).collect();
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
        let (got, got_grad) = run(ours(x.clone()));
        let (want, want_grad) = run(burns(x.clone()));
        let inference = ours(Tensor::<2>::from_data(TensorData::new(data.clone(), [8, 12]), &Device::flex()));
        assert_eq!(got, inference.into_data().try_into_vec::<f32>().unwrap(), "{what}: training and inference values");
        for (i, x) in data.iter().enumerate() {
            assert!((got[i] - want[i]).abs() <= 3e-7 * (1.0 + x.abs()), "{what}({x}): {} vs {}", got[i], want[i]);
            assert!(
                (got_grad[i] - want_grad[i]).abs() <= 2e-6,
                "{what} gradient at {x}: {} vs {}",
                got_grad[i],
                want_grad[i]
            );
        }
        assert!(want_grad.iter().any(|g| g.abs() > 0.5), "an upstream gradient that shows");
    }

    #[test]
    fn training_gelu_has_burns_values_and_gradient() {
        check_against_burn(gelu, burn::tensor::activation::gelu, 0.13, "gelu");
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
        values_in_place(Activation::Gelu, &mut v);
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), scalar);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let mut v = xs.clone();
            // SAFETY: AVX2 checked above.
            unsafe { with_avx2(InPlace(Activation::Gelu, &mut v)) };
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

    /// `x·σ(1.702x)` in f64.
    fn quick_gelu64(x: f64) -> f64 {
        x / (1.0 + (-1.702 * x).exp())
    }

    #[test]
    fn quick_gelu_matches_the_exact_form_and_its_slope_the_derivative() {
        let (mut worst, mut worst_slope): (f64, f64) = (0.0, 0.0);
        let mut x = -40.0f64;
        while x <= 40.0 {
            let (value, slope) = quick_gelu_slope_f32(x as f32);
            assert_eq!(value.to_bits(), quick_gelu_f32(x as f32).to_bits(), "quick_gelu({x})");
            // The exact value and derivative at the f32 input.
            let xf = x as f32 as f64;
            let s = 1.0 / (1.0 + (-1.702 * xf).exp());
            worst = worst.max((value as f64 - quick_gelu64(xf)).abs() / (1.0 + xf.abs()));
            worst_slope = worst_slope.max((slope as f64 - (s + 1.702 * xf * s * (1.0 - s))).abs());
            x += 0.0011;
        }
        assert!(worst < 2e-7, "worst error {worst}");
        assert!(worst_slope < 3e-7, "worst slope error {worst_slope}");
        assert_eq!(quick_gelu_f32(0.0), 0.0);
        assert_eq!(quick_gelu_f32(100.0), 100.0);
        assert!(quick_gelu_f32(-100.0).abs() < 1e-30);
        assert_eq!(quick_gelu_slope_f32(100.0).1, 1.0);
        assert!(quick_gelu_slope_f32(-100.0).1.abs() < 1e-30);
        assert!(quick_gelu_f32(f32::NAN).is_nan() && quick_gelu_slope_f32(f32::NAN).1.is_nan());
    }

    #[test]
    fn quick_gelus_vector_paths_give_the_scalar_bits() {
        // More values than one task holds, so that several chunks run on the pool.
        let xs: Vec<f32> = (0..80_001).map(|i| (i as f32 - 40_000.0) * 3e-4).chain([-100.0, 100.0, -0.0]).collect();
        let scalar: Vec<(u32, u32)> = xs.iter().map(|&x| bits(quick_gelu_slope_f32(x))).collect();
        assert_eq!(vector_values_and_slopes(Activation::QuickGelu, &xs), scalar);
        let mut v = xs.clone();
        values_in_place(Activation::QuickGelu, &mut v);
        assert_eq!(v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), scalar.iter().map(|s| s.0).collect::<Vec<_>>());
    }

    #[test]
    fn quick_gelu_has_burns_values_and_gradient() {
        check_against_burn(quick_gelu, |x| x.clone() * sigmoid(x.mul_scalar(1.702)), 0.17, "quick_gelu");
    }

    #[test]
    fn relu6_is_burns_clamp_bit_for_bit_and_keeps_nan() {
        let xs: Vec<f32> = (0..70_001)
            .map(|i| (i as f32 - 35_000.0) * 3e-4)
            .chain([-0.0, 0.0, 6.0, 6.000_001, f32::INFINITY, f32::NEG_INFINITY, f32::NAN])
            .collect();
        let n = xs.len();
        let device = Device::flex();
        let x = Tensor::<1>::from_data(TensorData::new(xs.clone(), [n]), &device);
        let ours = relu6(x.clone()).into_data().try_into_vec::<f32>().unwrap();
        let burns = x.clamp(0.0, 6.0).into_data().try_into_vec::<f32>().unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ours[..n - 1]), bits(&burns[..n - 1]));
        assert!(ours[n - 1].is_nan(), "NaN stays NaN, as torch.nn.functional.relu6 keeps it");
        assert_eq!((ours[n - 4], ours[n - 3], ours[n - 2]), (6.0, 6.0, 0.0));
        assert!(ours.iter().all(|v| v.is_nan() || (0.0..=6.0).contains(v)));
        // Training keeps burn's clamp, with its gradient.
        let tracked = Tensor::<1>::from_data(TensorData::new(xs[..n - 1].to_vec(), [n - 1]), &device.autodiff());
        let trained = relu6(tracked).into_data().try_into_vec::<f32>().unwrap();
        assert_eq!(bits(&trained), bits(&burns[..n - 1]));
    }
}
