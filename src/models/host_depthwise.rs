//! A depthwise convolution (one `k×k` filter per channel: FBNet's `dw` convolutions) in inference
//! on the host (burn's CPU backend without autodiff). Each input row is first written with its
//! padding as zeros and split into its `stride` phases (every `stride`-th value), so that every
//! tap reads a contiguous run; then, with AVX-512, each run of up to 64 outputs is summed in
//! registers over all `k·k` taps and stored once (elsewhere each tap is added into the output
//! row in turn). burn-flex adds one tap at a time into the whole output plane (a load and a store
//! per tap and value), and at a stride above 1 one value at a time: its depthwise convolutions
//! took 44% of an FBNetV3-A forward pass at batch 8 (perf, 2-core development machine).
//!
//! Values are burn's, bit for bit (tested; of a NaN, only where it is): each output sums its taps
//! in burn's order (filter row, then column) from `+0`, a product then a sum (no fused
//! multiply-add), and the bias last. burn leaves the padding's taps out; their zero products here
//! change no sum (see [`Plane`]). Filters with a non-finite value and padding take burn's path
//! (burn marks the outputs whose skipped padding would have multiplied them NaN).

use burn::backend::Flex;
use burn::tensor::{DType, Device, Tensor, TensorData};
use rayon::prelude::*;

use super::activation::{in_widest_vectors, Kernel};
use super::host_autodiff::contiguous;

/// `x` (`[batch, C, H, W]`) convolved channel by channel with `weight` (`[C, 1, k, k]`) at
/// `stride`, with `padding` zeros on each side, plus `bias` (`[C]`) where given: on the host when
/// every tensor holds `f32` values on burn's CPU backend without autodiff; `None` otherwise (and
/// for non-finite filters with padding, and 1×1 filters), so that the caller takes burn's
/// convolution.
///
/// # Shapes
/// - output: `[batch, C, (H + 2·padding − k) / stride + 1, (W + 2·padding − k) / stride + 1]`
pub fn conv2d(
    x: &Tensor<4>,
    weight: &Tensor<4>,
    bias: Option<&Tensor<1>>,
    stride: usize,
    padding: usize,
) -> Option<Tensor<4>> {
    let [n, c, h, w] = x.dims();
    let [o, per_group, k, kw] = weight.dims();
    let fits = o == c && per_group == 1 && kw == k && k > 1 && stride > 0;
    if !fits || h + 2 * padding < k || w + 2 * padding < k || bias.is_some_and(|b| b.dims() != [c]) {
        return None;
    }
    let device = x.device();
    if device != Device::flex() {
        return None;
    }
    let plain = |t: burn::backend::flex::FlexTensor| (t.dtype() == DType::F32).then(|| contiguous(&t));
    let input = plain(x.clone().try_into_primitive::<Flex>().ok()?)?;
    let filters = plain(weight.clone().try_into_primitive::<Flex>().ok()?)?;
    let bias = match bias {
        Some(b) => Some(plain(b.clone().try_into_primitive::<Flex>().ok()?)?),
        None => None,
    };
    let filters = filters.as_slice::<f32>().expect("contiguous");
    if padding > 0 && filters.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let bias = bias.as_ref().map(|b| b.as_slice::<f32>().expect("contiguous"));
    let g = Geometry::new(h, w, k, stride, padding);
    let mut out = vec![0f32; n * c * g.ho * g.wo];
    if !out.is_empty() {
        let values = input.as_slice::<f32>().expect("contiguous");
        out.par_chunks_mut(g.ho * g.wo).zip(values.par_chunks(h * w)).enumerate().for_each_init(
            || vec![0f32; g.phases_len()],
            |phases, (i, (out, plane))| {
                let ch = i % c;
                g.split(plane, phases);
                Plane { g: &g, phases, filter: &filters[ch * k * k..(ch + 1) * k * k], bias: bias.map(|b| b[ch]), out }
                    .run();
            },
        );
    }
    Some(Tensor::from_data(TensorData::new(out, [n, c, g.ho, g.wo]), &device))
}

/// A convolution's sizes, and where each filter column reads.
#[derive(Debug)]
struct Geometry {
    h: usize,
    w: usize,
    k: usize,
    stride: usize,
    padding: usize,
    ho: usize,
    wo: usize,
    /// Values per phase row: `⌈(W + 2·padding) / stride⌉`.
    row_len: usize,
    /// For filter column `kw`, where its values start among an input row's phase rows: output
    /// column `ow` reads padded column `ow·stride + kw`, value `ow + kw / stride` of phase
    /// `kw % stride`.
    taps: Vec<usize>,
}

impl Geometry {
    fn new(h: usize, w: usize, k: usize, stride: usize, padding: usize) -> Geometry {
        let size = |len: usize| (len + 2 * padding - k) / stride + 1;
        let row_len = (w + 2 * padding).div_ceil(stride);
        let taps = (0..k).map(|kw| kw % stride * row_len + kw / stride).collect();
        Geometry { h, w, k, stride, padding, ho: size(h), wo: size(w), row_len, taps }
    }

    /// The values the phase rows take: `H · stride` rows, and a run of [`LANES`] more, so that
    /// a row's last run can be read whole (its extra values are left out of the output).
    fn phases_len(&self) -> usize {
        self.h * self.stride * self.row_len + LANES
    }

    /// Writes `plane`'s rows, with `padding` zeros on each side, into `phases`, each row as its
    /// `stride` phase rows (phase `r`: padded columns `r, r + stride, …`), [`Geometry::row_len`]
    /// values apart. Only the input's own values are written: the padding's places keep the
    /// zeros the buffer was made with.
    fn split(&self, plane: &[f32], phases: &mut [f32]) {
        let (s, p) = (self.stride, self.padding);
        for (ih, row) in plane.chunks_exact(self.w).enumerate() {
            for r in 0..s {
                // Padded column `j·s + r` is input column `j·s + r − p`, from `j0` on.
                let j0 = p.saturating_sub(r).div_ceil(s);
                let iw0 = j0 * s + r - p;
                if iw0 < self.w {
                    let count = (self.w - iw0).div_ceil(s);
                    let dst = &mut phases[(ih * s + r) * self.row_len + j0..][..count];
                    if s == 1 {
                        dst.copy_from_slice(row);
                    } else {
                        for (j, d) in dst.iter_mut().enumerate() {
                            *d = row[iw0 + j * s];
                        }
                    }
                }
            }
        }
    }

    /// The filter rows `[first, end)` that fall inside the input for output row `oh`.
    fn rows(&self, oh: usize) -> (usize, usize) {
        let top = (oh * self.stride) as isize - self.padding as isize;
        let first = (-top).max(0) as usize;
        let end = (self.h as isize - top).clamp(0, self.k as isize) as usize;
        (first.min(end), end)
    }
}

/// One `[H, W]` plane's outputs, row by row: each tap added into the whole output row in turn,
/// from a contiguous run of its phase row. The padding's columns add products of zero, which
/// leave every sum as it was: a sum from `+0` is never `−0` (`+0 + −0 = +0`), and the filters
/// are finite where there is padding. Its rows are left out.
/// One `[H, W]` plane's outputs, row by row, each output summing its taps from the phase rows.
/// The padding's columns add products of zero, which leave every sum as it was: a sum from `+0`
/// is never `−0` (`+0 + −0 = +0`), and the filters are finite where there is padding. Its rows
/// are left out.
struct Plane<'a> {
    g: &'a Geometry,
    phases: &'a [f32],
    filter: &'a [f32],
    bias: Option<f32>,
    out: &'a mut [f32],
}

impl Plane<'_> {
    fn run(self) {
        assert!(self.phases.len() >= self.g.phases_len() && self.filter.len() == self.g.k * self.g.k);
        assert_eq!(self.out.len(), self.g.ho * self.g.wo);
        #[cfg(test)]
        let portable_only = tests::portable_only();
        #[cfg(not(test))]
        let portable_only = false;
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") && !portable_only {
            // SAFETY: the CPU has AVX-512F; the sizes are checked above.
            unsafe { x86::plane(self) };
            return;
        }
        in_widest_vectors(self);
    }
}

/// Elsewhere: each tap added into the whole output row in turn (the values start at +0, as
/// `out` was made), a loop the compiler vectorises.
impl Kernel for Plane<'_> {
    #[inline(always)]
    fn run(self) {
        let Plane { g, phases, filter, bias, out } = self;
        for (oh, row) in out.chunks_exact_mut(g.wo).enumerate() {
            let (first, end) = g.rows(oh);
            for kh in first..end {
                let base = (oh * g.stride + kh - g.padding) * g.stride * g.row_len;
                for (&tap, &wv) in g.taps.iter().zip(&filter[kh * g.k..(kh + 1) * g.k]) {
                    for (o, &x) in row.iter_mut().zip(&phases[base + tap..base + tap + g.wo]) {
                        *o += x * wv;
                    }
                }
            }
            if let Some(b) = bias {
                row.iter_mut().for_each(|o| *o += b);
            }
        }
    }
}

/// The values a row's last run may read past the phase rows (their results are not stored).
const LANES: usize = 64;

// AVX-512 target features and intrinsics are stable since Rust 1.89 (see `eval::product`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
mod x86 {
    use std::arch::x86_64::*;

    use super::Plane;

    /// The plane in runs of `16·N` outputs, `N` vector sums per run kept in registers over all
    /// the taps (independent sums, so that the additions overlap), stored once.
    ///
    /// # Safety
    /// AVX-512F; `plane`'s buffers as [`Plane::run`] checks them.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn plane(plane: Plane) {
        // Wide rows in runs of 64, narrow ones in runs that waste few values past the row's end.
        match plane.g.wo {
            48.. => rows::<4>(plane),
            24.. => rows::<2>(plane),
            _ => rows::<1>(plane),
        }
    }

    /// # Safety
    /// As [`plane`].
    #[target_feature(enable = "avx512f")]
    unsafe fn rows<const N: usize>(plane: Plane) {
        let Plane { g, phases, filter, bias, out } = plane;
        let src = phases.as_ptr();
        for (oh, row) in out.chunks_exact_mut(g.wo).enumerate() {
            let (first, end) = g.rows(oh);
            for ow in (0..g.wo).step_by(16 * N) {
                let mut acc = [_mm512_setzero_ps(); N];
                for kh in first..end {
                    let base = (oh * g.stride + kh - g.padding) * g.stride * g.row_len + ow;
                    for (&tap, &wv) in g.taps.iter().zip(&filter[kh * g.k..(kh + 1) * g.k]) {
                        let x = _mm512_set1_ps(wv);
                        // SAFETY: `base + tap` is a phase row's value `ow + kw / stride` (below
                        // `row_len` for every output column), and the buffer holds `LANES`
                        // values past the last row (`phases_len`), at least the `16·N` read.
                        let at = unsafe { src.add(base + tap) };
                        for (v, sum) in acc.iter_mut().enumerate() {
                            // A product, then a sum: burn's rounding (no fused multiply-add).
                            let product = _mm512_mul_ps(unsafe { _mm512_loadu_ps(at.add(16 * v)) }, x);
                            *sum = _mm512_add_ps(*sum, product);
                        }
                    }
                }
                for (v, &sum) in acc.iter().enumerate() {
                    let start = ow + 16 * v;
                    if start >= g.wo {
                        break;
                    }
                    let sum = match bias {
                        Some(b) => _mm512_add_ps(sum, _mm512_set1_ps(b)),
                        None => sum,
                    };
                    let mask = if g.wo - start >= 16 { u16::MAX } else { (1u16 << (g.wo - start)) - 1 };
                    // SAFETY: the masked lanes are `row[start..min(start + 16, wo)]`.
                    unsafe { _mm512_mask_storeu_ps(row.as_mut_ptr().add(start), mask, sum) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::nn::conv::Conv2dConfig;
    use burn::nn::PaddingConfig2d;
    use std::sync::atomic::{AtomicBool, Ordering};

    use burn::tensor::{Device, Distribution, Tensor, TensorData};

    use crate::models::test_support::{bits, values};

    /// Bit patterns with every NaN as one: where two NaNs meet in a sum, which one it keeps (its
    /// sign and payload) depends on the order the compiler gave the operands.
    fn canonical_nan(bits: Vec<u32>) -> Vec<u32> {
        bits.into_iter().map(|b| if f32::from_bits(b).is_nan() { f32::NAN.to_bits() } else { b }).collect()
    }

    /// burn's depthwise convolution of `x` by `weight` (`[C, 1, k, k]`).
    fn burns(x: Tensor<4>, weight: Tensor<4>, bias: Option<Tensor<1>>, stride: usize, padding: usize) -> Tensor<4> {
        let [c, _, k, _] = weight.dims();
        let mut conv = Conv2dConfig::new([c, c], [k, k])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(padding, padding, padding, padding))
            .with_groups(c)
            .with_bias(bias.is_some())
            .init(&x.device());
        conv.weight = burn::module::Param::from_tensor(weight);
        conv.bias = bias.map(burn::module::Param::from_tensor);
        conv.forward(x)
    }

    /// burn's values bit for bit: FBNet's 3×3 and 5×5 filters at strides 1 and 2 with their
    /// paddings (k/2, and FBNetV3-A's 1 and 0 at stride 2), a stride of 3, planes narrower than a
    /// run and wider than several, rows shorter than the filter with padding, a strided input, a
    /// bias, and ±0, NaN and ±∞ among the inputs.
    #[test]
    fn convolves_as_burn_does() {
        convolves_as_burn_does_in_every_case();
    }

    /// While set, [`super::Plane::run`] takes its portable loop, which this machine's AVX-512
    /// would otherwise always skip. Both loops give burn's bits, so the other tests, which may
    /// run meanwhile, pass with either.
    static PORTABLE_ONLY: AtomicBool = AtomicBool::new(false);

    pub(super) fn portable_only() -> bool {
        PORTABLE_ONLY.load(Ordering::Relaxed)
    }

    /// The portable loop (the one CPUs without AVX-512 take) gives burn's bits too.
    #[test]
    fn the_portable_loop_convolves_as_burn_does() {
        PORTABLE_ONLY.store(true, Ordering::Relaxed);
        let result = std::panic::catch_unwind(convolves_as_burn_does_in_every_case);
        PORTABLE_ONLY.store(false, Ordering::Relaxed);
        result.expect("the portable loop gives burn's bits");
    }

    fn convolves_as_burn_does_in_every_case() {
        let device = Device::flex();
        for (dims, (k, stride, padding), bias, transposed) in [
            ([2, 3, 9, 11], (3, 1, 1), false, false),
            ([1, 2, 13, 13], (5, 2, 1), false, false),
            ([1, 2, 13, 13], (3, 2, 0), true, false),
            ([2, 2, 12, 70], (5, 2, 2), false, false),
            ([1, 3, 40, 75], (3, 1, 1), true, false),
            ([1, 2, 8, 8], (3, 1, 1), false, true),
            ([1, 2, 7, 7], (3, 2, 1), false, false),
            ([1, 1, 10, 9], (5, 3, 2), false, false),
            ([1, 2, 2, 3], (3, 1, 1), false, false),
            ([1, 2, 1, 1], (3, 2, 1), true, false),
            // Output planes above 8,192 values, where burn changes its loop order.
            ([1, 1, 96, 100], (3, 1, 1), false, false),
            ([1, 1, 190, 190], (5, 2, 2), true, false),
        ] {
            let [n, c, h, w] = dims;
            let mut v = values(Tensor::<4>::random(dims, Distribution::Normal(0.0, 1.0), &device));
            for (i, x) in v.iter_mut().enumerate() {
                match i % 29 {
                    3 => *x = -0.0,
                    5 => *x = 0.0,
                    17 if i % 3 == 0 => *x = f32::NAN,
                    23 if i % 5 == 0 => *x = f32::INFINITY,
                    _ => {}
                }
            }
            let x = if transposed {
                Tensor::<4>::from_data(TensorData::new(v, [n, c, w, h]), &device).swap_dims(2, 3)
            } else {
                Tensor::<4>::from_data(TensorData::new(v, dims), &device)
            };
            let mut f = values(Tensor::<4>::random([c, 1, k, k], Distribution::Normal(0.0, 1.0), &device));
            f[0] = -0.0;
            let weight = Tensor::<4>::from_data(TensorData::new(f, [c, 1, k, k]), &device);
            let bias = bias.then(|| Tensor::<1>::random([c], Distribution::Normal(0.0, 1.0), &device));
            let case = format!("{dims:?} k {k} stride {stride} padding {padding} bias {}", bias.is_some());
            let want = burns(x.clone(), weight.clone(), bias.clone(), stride, padding);
            let got = super::conv2d(&x, &weight, bias.as_ref(), stride, padding).expect("the host path");
            assert_eq!(got.dims(), want.dims(), "{case}");
            assert_eq!(canonical_nan(bits(got)), canonical_nan(bits(want)), "{case}");
        }
    }

    /// Sums start from +0, as burn's: an input of −0 gives +0 everywhere (each product is −0),
    /// in the border columns and the interior runs alike.
    #[test]
    fn sums_start_from_positive_zero() {
        let device = Device::flex();
        let x = Tensor::<4>::from_data(TensorData::new(vec![-0.0f32; 2 * 9 * 40], [1, 2, 9, 40]), &device);
        let weight = Tensor::<4>::random([2, 1, 3, 3], Distribution::Uniform(0.5, 1.0), &device);
        for stride in [1, 2] {
            let got = super::conv2d(&x, &weight, None, stride, 1).expect("the host path");
            let want = burns(x.clone(), weight.clone(), None, stride, 1);
            assert_eq!(bits(got.clone()), bits(want), "stride {stride}");
            assert!(bits(got).iter().all(|&b| b == 0), "stride {stride}: +0 everywhere");
        }
    }

    /// Where the host path does not apply it says so, and the caller takes burn's: under autodiff,
    /// a filter with a non-finite value and padding, a grouped (not depthwise) weight, a 1×1
    /// filter (burn's 1×1 path multiplies without summing from +0).
    #[test]
    fn declines_what_it_does_not_cover() {
        let x = |d: &Device| Tensor::<4>::random([1, 2, 6, 6], Distribution::Normal(0.0, 1.0), d);
        let w = |d: &Device| Tensor::<4>::random([2, 1, 3, 3], Distribution::Normal(0.0, 1.0), d);
        let device = Device::flex();
        assert!(super::conv2d(&x(&device), &w(&device), None, 1, 1).is_some());
        let autodiff = Device::flex().autodiff();
        assert!(super::conv2d(&x(&autodiff), &w(&autodiff), None, 1, 1).is_none());
        let infinite = Tensor::<4>::from_data(TensorData::new(vec![f32::INFINITY; 18], [2, 1, 3, 3]), &device);
        assert!(super::conv2d(&x(&device), &infinite, None, 1, 1).is_none());
        assert!(super::conv2d(&x(&device), &infinite, None, 1, 0).is_some(), "no padding: no skipped taps");
        let grouped = Tensor::<4>::random([2, 2, 3, 3], Distribution::Normal(0.0, 1.0), &device);
        assert!(super::conv2d(&x(&device), &grouped, None, 1, 1).is_none());
        let one = Tensor::<4>::random([2, 1, 1, 1], Distribution::Normal(0.0, 1.0), &device);
        assert!(super::conv2d(&x(&device), &one, None, 1, 0).is_none());
    }
}
