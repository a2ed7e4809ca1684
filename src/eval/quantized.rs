//! 16-bit integer screens of the exact scores, for [`super::screen`] (issue 5: the COCO 5K x 25K
//! evaluation in seconds).
//!
//! Each embedding is rounded to 16-bit integers at one scale `S` per side,
//! `q = round(S·x)`, and an image x caption tile holds the integer dot products `q_a·q_b`,
//! exact in 32 bits. With AVX-512 VNNI (`vpdpwssd`: 32 multiply-adds per instruction, twice
//! f32 FMA's 16, at the same rate on this machine) a tile costs about half the exact f32 one.
//!
//! The screen is only ever used through a proven bound. With `e = q − S·x` and `r = ‖e‖ / S`,
//! `q_a·q_b / (S_a S_b) − a·b = (a·e_b)/S_b + (b·e_a)/S_a + (e_a·e_b)/(S_a S_b)`, which
//! Cauchy–Schwarz bounds by `‖a‖ r_b + ‖b‖ r_a + r_a r_b`; the exact score (the f32
//! fused-multiply-add chain of [`super::product`]) differs from `a·b` by at most
//! `γ_d ‖a‖ ‖b‖` (`γ_d = d u / (1 − d u)`, `u = 2⁻²⁴`) plus `d · 2⁻¹⁴⁹` for subnormals.
//! [`Quantized::bound`] adds these up for one query against the worst row of the other side.
//! The scales are chosen so that `‖q_a‖ ‖q_b‖ < 2³¹`: no dot product of two rows, nor any
//! partial sum of one, leaves the 32-bit range.

use std::ops::Range;

use rayon::prelude::*;

use super::embeddings::Matrix;
use super::product::{Panels, RowGroups};

pub use super::product::{MR, NR};
/// Depth block in pairs of dimensions: a 64 x 128-pair slice of a panel is 32 KB, within L1.
const KP: usize = 128;

/// `‖q‖` stays below this on each side, so that `‖q_a‖ ‖q_b‖ < 46,340² < 2³¹`.
const NORM_LIMIT: f64 = 46_340.0;

/// Whether [`tile`] runs the VNNI kernel here (otherwise a portable loop, for tests).
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// One side (images or captions) rounded to 16-bit integers.
#[derive(Debug, Clone)]
pub struct Quantized {
    /// Rows of `2 * pairs` values (an odd width padded with a 0), row-major.
    data: Vec<i16>,
    pub rows: usize,
    /// Width in pairs of dimensions.
    pairs: usize,
    /// The embedding width `d`.
    pub dim: usize,
    /// `S`: `q = round(S·x)`.
    pub scale: f64,
    /// Per row, rounded up: `‖x‖`.
    pub norm: Vec<f64>,
    /// Per row, rounded up: `‖q − S·x‖ / S`.
    pub err: Vec<f64>,
    pub max_norm: f64,
    pub max_err: f64,
}

/// Relative margin added to every computed norm and bound (f64 rounding is ~1e-16).
const MARGIN: f64 = 1e-9;

impl Quantized {
    /// `None` when a value is not finite, every value is 0, or the norms are so large that an
    /// f32 score could overflow (the caller ranks exactly instead).
    pub fn new(m: &Matrix) -> Option<Quantized> {
        let d = m.dim;
        if m.rows == 0 || d == 0 {
            return None;
        }
        // Per row: ‖x‖ (None if a value is not finite) and max |x|.
        let stats: Vec<Option<(f64, f32)>> = (0..m.rows).into_par_iter().map(|i| row_stats(m.row(i))).collect();
        let stats: Vec<(f64, f32)> = stats.into_iter().collect::<Option<_>>()?;
        let norm: Vec<f64> = stats.iter().map(|s| s.0).collect();
        let max_norm = norm.iter().copied().fold(0.0, f64::max);
        let amax = stats.iter().fold(0.0f32, |a, s| a.max(s.1)) as f64;
        if amax == 0.0 || max_norm > 1e18 {
            return None;
        }
        // The largest scale with |q| <= 32,767 and ‖q‖ <= ‖S·x‖ + ‖e‖ <= NORM_LIMIT
        // (‖e‖ <= √d / 2), less a hair for the rounding of S·x.
        let room = (32_767.0 / amax).min((NORM_LIMIT - 0.5 * (d as f64).sqrt()) / max_norm);
        let scale = room * (1.0 - 1e-6);
        let pairs = d.div_ceil(2);
        let mut data = vec![0i16; m.rows * 2 * pairs];
        let err: Vec<f64> =
            data.par_chunks_mut(2 * pairs).enumerate().map(|(i, q)| quantize_row(m.row(i), scale, q)).collect();
        let max_err = err.iter().copied().fold(0.0, f64::max);
        Some(Quantized { data, rows: m.rows, pairs, dim: d, scale, norm, err, max_norm, max_err })
    }

    fn row(&self, i: usize) -> &[i16] {
        &self.data[i * 2 * self.pairs..(i + 1) * 2 * self.pairs]
    }

    /// Row `i` as packed pairs: `lo = x[2p]`, `hi = x[2p + 1]`.
    fn pair(&self, i: usize, p: usize) -> u32 {
        let r = self.row(i);
        (r[2 * p] as u16 as u32) | ((r[2 * p + 1] as u16 as u32) << 16)
    }

    /// ε for query row `i` of this side against every row of `other`: for each pair,
    /// `|exact chain score − screen score| <= ε`, where the screen score is the integer
    /// product divided by [`Quantized::product_scale`].
    pub fn bound(&self, i: usize, other: &Quantized) -> f64 {
        let d = self.dim as f64;
        let u = 2f64.powi(-24);
        let gamma = d * u / (1.0 - d * u);
        let (na, ra, nb, rb) = (self.norm[i], self.err[i], other.max_norm, other.max_err);
        (gamma * na * nb + na * rb + nb * ra + ra * rb + d * 2f64.powi(-149)) * (1.0 + MARGIN)
    }

    /// `S_a S_b`: an integer product times `1 / product_scale` is the screen score.
    pub fn product_scale(&self, other: &Quantized) -> f64 {
        self.scale * other.scale
    }

    /// Integer thresholds for an exact score `v` of a query with bound `eps` (see
    /// [`Quantized::bound`]): an item whose integer score is above `hi` scores exactly above
    /// `v`; one below `lo` scores exactly below `v`; `lo..=hi` is the band to resolve.
    pub fn thresholds(v: f32, eps: f64, product_scale: f64) -> (i32, i32) {
        let clamp = |x: f64| x.clamp(i32::MIN as f64, i32::MAX as f64) as i32;
        // One integer unit of margin each side covers the f64 rounding of the products.
        let hi = ((v as f64 + eps) * product_scale).floor() + 1.0;
        let lo = ((v as f64 - eps) * product_scale).ceil() - 1.0;
        (clamp(lo), clamp(hi))
    }

    /// Exact integer dot product of row `i` with row `j` of `other` (tests and checks).
    pub fn dot(&self, i: usize, other: &Quantized, j: usize) -> i64 {
        self.row(i).iter().zip(other.row(j)).map(|(&a, &b)| a as i64 * b as i64).sum()
    }
}

/// `(‖x‖, max |x|)` of one row, rounded up; `None` if a value is not finite.
fn row_stats(x: &[f32]) -> Option<(f64, f32)> {
    // Eight lanes of running values: the loop vectorises (a sum's order is fixed otherwise).
    let (mut acc, mut amax) = ([0.0f64; 8], [0.0f32; 8]);
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for l in 0..8 {
            acc[l] += c[l] as f64 * c[l] as f64;
            // `>` is false for NaN: a NaN never becomes the maximum, the check below finds it.
            let a = c[l].abs();
            amax[l] = if a > amax[l] { a } else { amax[l] };
        }
    }
    for (l, &v) in tail.iter().enumerate() {
        acc[l] += v as f64 * v as f64;
        amax[l] = if v.abs() > amax[l] { v.abs() } else { amax[l] };
    }
    let n2: f64 = acc.iter().sum();
    // Any NaN or infinity makes the sum of squares NaN or infinite.
    n2.is_finite().then(|| (n2.sqrt() * (1.0 + MARGIN), amax.iter().fold(0.0f32, |a, &b| a.max(b))))
}

/// Rounds `S·x` into `q` (`q` may be one longer: its padding stays 0) and returns
/// `‖q − S·x‖ / S`, rounded up. `S·x` is computed in f64 (relative error 2⁻⁵³, so below
/// 4e-12 for |S·x| <= 32,767, covered by an absolute 1e-9 on `‖e‖`).
fn quantize_row(x: &[f32], scale: f64, q: &mut [i16]) -> f64 {
    // Adding and subtracting 1.5 · 2^52 rounds an f64 below 2^51 to the nearest integer
    // (ties to even) without a library call.
    let magic = 1.5 * 2f64.powi(52);
    let mut e2 = [0.0f64; 8];
    let round = |v: f32| {
        let sx = v as f64 * scale;
        let r = (sx + magic) - magic;
        // |r| <= 32,767 by the choice of the scale: the conversion is exact.
        (r as i32 as i16, r - sx)
    };
    let (xc, qc) = (x.chunks_exact(8), q.chunks_exact_mut(8));
    let tail = xc.remainder();
    for (c, out) in xc.zip(qc) {
        for l in 0..8 {
            let (r, e) = round(c[l]);
            out[l] = r;
            e2[l] += e * e;
        }
    }
    let done = x.len() - tail.len();
    for (l, (&v, slot)) in tail.iter().zip(&mut q[done..]).enumerate() {
        let (r, e) = round(v);
        *slot = r;
        e2[l] += e * e;
    }
    (e2.iter().sum::<f64>().sqrt() * (1.0 + MARGIN) + 1e-9) / scale
}

/// Packs captions `rows` into panels of `[pairs][64]` words (two 16-bit integers each), so that
/// one depth step of the kernel reads 64 contiguous words.
pub fn pack(panels: &mut Panels<u32>, captions: &Quantized, rows: Range<usize>) {
    panels.pack_with(rows, captions.pairs, |j, k| captions.pair(j, k));
}

/// The images in blocks of rows, each in groups of 6 rows stored `[pairs][6]`.
pub fn row_groups(images: &Quantized, blocks: &[Range<usize>]) -> RowGroups<u32> {
    RowGroups::new_with(images.rows, blocks, images.pairs, |i, k| images.pair(i, k))
}

/// Integer products of the rows of block `block` against the packed captions, row-major with
/// `64 * captions.len()` columns (column `c` = the `c`-th packed caption).
///
/// # Shapes
/// `out`: at least `[rows, 64 * captions.len()]` for the block's `rows`.
pub fn tile(images: &RowGroups<u32>, block: usize, captions: &Panels<u32>, out: &mut [i32]) {
    assert_eq!(images.dim, captions.dim, "images and captions differ in width");
    let (rows, at) = images.blocks[block].clone();
    let w = captions.len() * NR;
    assert!(out.len() >= rows.len() * w, "tile buffer too small");
    let groups = &images.data[at..at + rows.len().div_ceil(MR) * MR * images.dim];
    #[cfg(target_arch = "x86_64")]
    {
        if available() {
            // SAFETY: AVX-512F and VNNI are present; the slices hold what the kernel reads.
            unsafe { x86::tile(groups, rows.len(), &captions.data, captions.len(), images.dim, out) };
            return;
        }
    }
    tile_portable(groups, rows.len(), &captions.data, captions.len(), images.dim, out);
}

/// The kernel's arithmetic in plain Rust: per 32-bit lane, `acc += lo·lo + hi·hi`, wrapping.
fn tile_portable(groups: &[u32], rows: usize, packed: &[u32], panels: usize, p: usize, out: &mut [i32]) {
    let w = panels * NR;
    let dot =
        |a: u32, b: u32| (a as i16 as i32) * (b as i16 as i32) + ((a >> 16) as i16 as i32) * ((b >> 16) as i16 as i32);
    for r in 0..rows {
        let (g, rr) = (r / MR, r % MR);
        for c in 0..w {
            let panel = &packed[c / NR * NR * p..];
            let mut acc = 0i32;
            for k in 0..p {
                acc = acc.wrapping_add(dot(groups[g * MR * p + k * MR + rr], panel[k * NR + c % NR]));
            }
            out[r * w + c] = acc;
        }
    }
}

// AVX-512 target features and intrinsics are stable since Rust 1.89 (see `product.rs`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KP, MR, NR};

    /// The register block: a group of 6 rows (`[pairs][6]` from `a`) against one panel, pairs
    /// `k0..k1`, continuing from the partial sums in `c` unless `k0 == 0`; the first `live`
    /// rows are stored.
    ///
    /// # Safety
    /// AVX-512F + VNNI; `a` valid for `6 * k1` words, `panel` for `64 * k1`, `c` for `live`
    /// rows of 64 at stride `ldc`.
    #[target_feature(enable = "avx512f,avx512vnni")]
    unsafe fn block(a: *const u32, panel: *const u32, k0: usize, k1: usize, c: *mut i32, ldc: usize, live: usize) {
        let mut acc = [[_mm512_setzero_si512(); 4]; MR];
        if k0 > 0 {
            for (r, row) in acc.iter_mut().enumerate().take(live) {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_loadu_si512(c.add(r * ldc + 16 * v) as *const _);
                }
            }
        }
        for k in k0..k1 {
            let b: [__m512i; 4] = std::array::from_fn(|v| _mm512_loadu_si512(panel.add(k * NR + 16 * v) as *const _));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_epi32(*a.add(k * MR + r) as i32);
                for (v, y) in row.iter_mut().enumerate() {
                    *y = _mm512_dpwssd_epi32(*y, x, b[v]);
                }
            }
        }
        for (r, row) in acc.iter().enumerate().take(live) {
            for (v, x) in row.iter().enumerate() {
                _mm512_storeu_si512(c.add(r * ldc + 16 * v) as *mut _, *x);
            }
        }
    }

    /// # Safety
    /// AVX-512F + VNNI; `groups` of `6 * p` words each, `packed` of `64 * p` words per panel,
    /// `out` holding the tile.
    #[target_feature(enable = "avx512f,avx512vnni")]
    pub unsafe fn tile(groups: &[u32], rows: usize, packed: &[u32], panels: usize, p: usize, out: &mut [i32]) {
        let w = panels * NR;
        for q in 0..panels {
            let panel = packed.as_ptr().add(q * NR * p);
            for k0 in (0..p).step_by(KP) {
                let k1 = (k0 + KP).min(p);
                for (g, i0) in (0..rows).step_by(MR).enumerate() {
                    let c = out.as_mut_ptr().add(i0 * w + q * NR);
                    block(groups.as_ptr().add(g * MR * p), panel, k0, k1, c, w, (rows - i0).min(MR));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::product;

    fn random(rows: usize, dim: usize, seed: u64, amp: f32) -> Matrix {
        let mut x = seed;
        let data = (0..rows * dim)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * amp
            })
            .collect();
        Matrix::new(rows, dim, data)
    }

    #[test]
    fn tiles_hold_the_exact_integer_products() {
        // Odd depth 301 (a padded pair) spans two depth blocks; 13 rows and 150 captions leave
        // partial register blocks and a partial panel. Large values make the 32-bit sums wrap
        // in between; the final sums fit.
        let (im, cap) = (random(13, 301, 1, 2.0), random(150, 301, 2, 2.0));
        let (qi, qc) = (Quantized::new(&im).unwrap(), Quantized::new(&cap).unwrap());
        let mut panels = Panels::default();
        pack(&mut panels, &qc, 64..150);
        let groups = row_groups(&qi, &[0..2, 2..11, 11..13]);
        let mut out = vec![i32::MIN; 9 * 128];
        tile(&groups, 1, &panels, &mut out);
        let mut portable = vec![0; 9 * 128];
        let b = &groups.blocks[1];
        let g = &groups.data[b.1..b.1 + 12 * groups.dim];
        tile_portable(g, 9, &panels.data, 2, groups.dim, &mut portable);
        for (r, i) in (2..11).enumerate() {
            for c in 0..128 {
                let j = 64 + c;
                let want = if j < 150 { qi.dot(i, &qc, j) } else { 0 };
                assert_eq!(out[r * 128 + c] as i64, want, "image {i}, caption {j}");
                assert_eq!(portable[r * 128 + c] as i64, want, "portable: image {i}, caption {j}");
            }
        }
    }

    #[test]
    fn the_bound_holds_for_every_pair() {
        // Unit-norm-like and wildly scaled rows, small and odd widths: the exact chain score is
        // within ε of the screen score, and ε is small where the values are well scaled.
        for (dim, amp_a, amp_b) in [(512, 0.1f32, 0.1f32), (7, 3.0, 1e-3), (1, 1.0, 1.0), (33, 1e4, 1e-4)] {
            let (a, b) = (random(20, dim, 3, amp_a), random(30, dim, 4, amp_b));
            let (qa, qb) = (Quantized::new(&a).unwrap(), Quantized::new(&b).unwrap());
            assert!(qa.max_norm * qa.scale + 0.5 * (dim as f64).sqrt() <= NORM_LIMIT);
            let c = qa.product_scale(&qb);
            for i in 0..20 {
                let eps = qa.bound(i, &qb);
                assert!(eps <= 1e-3 * qa.max_norm * qb.max_norm, "ε {eps} loose for width {dim}");
                for j in 0..30 {
                    let v = product::chains([(a.row(i), b.row(j))])[0];
                    let s = qa.dot(i, &qb, j);
                    assert!(((s as f64) / c - v as f64).abs() <= eps, "pair ({i}, {j}) width {dim}");
                    let (lo, hi) = Quantized::thresholds(v, eps, c);
                    assert!(lo as i64 <= s && s <= hi as i64, "a pair lies in its own band");
                }
            }
        }
        assert!(Quantized::new(&Matrix::new(2, 2, vec![0.0, f32::NAN, 1.0, 1.0])).is_none());
        assert!(Quantized::new(&Matrix::new(1, 2, vec![0.0, 0.0])).is_none());
    }
}
