//! Exact image x caption score tiles for [`super::ranking`] (issue 5: the COCO 5K x 25K
//! evaluation in seconds).
//!
//! A score is one fused multiply-add chain in embedding order,
//! `s = fma(a[d-1], b[d-1], ... fma(a[1], b[1], fma(a[0], b[0], 0)))`, so it is a function of
//! its two vectors alone: the same bits whichever tile, thread or depth block computed it. The
//! score of any pair on its own ([`chains`]) therefore equals its value inside a tile
//! ([`tile`]), and the rankings can be counted tile by tile against scores computed
//! beforehand, without ever holding the 500 MB matrix. gemm, which scored the whole matrix
//! before, gives these same bits for d <= 512 (its depth block) and may differ in the last bit
//! beyond; the 5K x 25K tests and benchmark use d = 512.
//!
//! The tile kernel is the AVX-512 register block of a classic blocked product: 6 image rows x 64
//! captions (24 accumulators). Both operands are packed so that each depth step reads contiguous
//! memory — the images once into groups of 6 rows ([`RowGroups`]), each unit's captions into
//! 64-wide panels ([`Panels`]) — and depth goes in blocks of 128, so that a panel slice (32 KB)
//! stays in L1: ~85% of this machine's FMA peak, about the speed of gemm's own kernel. Without
//! AVX-512 ([`available`] is false) the caller scores the whole matrix with gemm instead.

use std::ops::Range;

use rayon::prelude::*;

use super::embeddings::Matrix;

/// Image rows per register block.
pub const MR: usize = 6;
/// Captions per packed panel: four 16-lane registers.
pub const NR: usize = 64;
/// Depth block: a 64 x 128 slice of a panel is 32 KB, within L1.
const KC: usize = 128;

/// For tests of the tiles: whether this CPU lacks them, so the test has nothing to check. It
/// says so on stderr, and fails instead where `CURATE_REQUIRE_AVX512` is set (for a machine
/// that must run them).
#[cfg(test)]
pub(crate) fn tiles_missing(test: &str) -> bool {
    if available() {
        return false;
    }
    assert!(std::env::var_os("CURATE_REQUIRE_AVX512").is_none(), "{test}: this CPU has no AVX-512F + FMA");
    eprintln!("{test}: the tile checks are skipped (this CPU has no AVX-512F + FMA)");
    true
}

/// Whether `Packed::tile` can run here.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Captions in panels of 64 rows, each stored depth-major (`[d][64]`) so that one depth step of
/// the kernel reads 64 contiguous values; rows past the end are zero. A worker packs the
/// captions of its current unit into its own buffer ([`Panels::pack`]): a few MB reused, where
/// packing all 25K captions at once meant a fresh 51 MB and its page faults. The values are f32
/// here, u32 words of two 16-bit integers for [`super::quantized`].
#[derive(Default)]
pub struct Panels<T = f32> {
    pub(super) data: Vec<T>,
    panels: usize,
    /// Depth steps per row.
    pub(super) dim: usize,
}

impl<T: Copy + Default> Panels<T> {
    /// Packs `rows` of a source `depth` steps wide, `value(row, k)` (at most 64 rows per panel,
    /// the last panel zero-padded).
    ///
    /// # Shapes
    /// -> `ceil(rows.len() / 64)` panels of `[depth, 64]`.
    pub fn pack_with(&mut self, rows: Range<usize>, depth: usize, value: impl Fn(usize, usize) -> T) {
        self.panels = rows.len().div_ceil(NR);
        self.dim = depth;
        self.data.clear();
        self.data.resize(self.panels * NR * depth, T::default());
        for (jj, j) in rows.enumerate() {
            let panel = &mut self.data[jj / NR * NR * depth..][..NR * depth];
            for k in 0..depth {
                panel[k * NR + jj % NR] = value(j, k);
            }
        }
    }

    /// Number of panels.
    pub fn len(&self) -> usize {
        self.panels
    }

    pub fn is_empty(&self) -> bool {
        self.panels == 0
    }
}

impl Panels<f32> {
    /// Packs captions `rows`.
    ///
    /// # Shapes
    /// `captions`: `[n, d]` -> `ceil(rows.len() / 64)` panels of `[d, 64]`.
    pub fn pack(&mut self, captions: &Matrix, rows: Range<usize>) {
        let d = captions.dim;
        self.pack_with(rows, d, |j, k| captions.data[j * d + k]);
    }
}

/// The images cut into blocks of rows (the tiles' heights), each block in groups of 6 rows
/// stored depth-major (`[d][6]`), so that one depth step reads 6 contiguous values; a short
/// last group repeats its last row.
pub struct RowGroups<T = f32> {
    pub(super) data: Vec<T>,
    /// Each block's rows and where its groups start in `data`.
    pub(super) blocks: Vec<(Range<usize>, usize)>,
    /// Depth steps per row.
    pub(super) dim: usize,
}

impl<T: Copy + Default + Send + Sync> RowGroups<T> {
    /// `blocks`: ranges of the `rows` rows of a source `depth` steps wide, `value(row, k)`.
    pub fn new_with(
        rows: usize,
        blocks: &[Range<usize>],
        depth: usize,
        value: impl Fn(usize, usize) -> T + Sync,
    ) -> Self {
        let mut at = 0;
        let blocks: Vec<(Range<usize>, usize)> = blocks
            .iter()
            .map(|b| {
                assert!(b.start <= b.end && b.end <= rows, "block {b:?} outside {rows} rows");
                let start = at;
                at += b.len().div_ceil(MR) * MR * depth;
                (b.clone(), start)
            })
            .collect();
        let mut data = vec![T::default(); at];
        // One group per chunk: `[depth][6]` values.
        let groups: Vec<(usize, usize)> =
            blocks.iter().flat_map(|(b, _)| (b.start..b.end).step_by(MR).map(move |i0| (i0, b.end))).collect();
        if depth > 0 {
            data.par_chunks_mut(MR * depth).zip(&groups).for_each(|(group, &(i0, end))| {
                for r in 0..MR {
                    let i = (i0 + r).min(end - 1);
                    for k in 0..depth {
                        group[k * MR + r] = value(i, k);
                    }
                }
            });
        }
        RowGroups { data, blocks, dim: depth }
    }

    /// The rows of block `b`.
    pub fn rows(&self, b: usize) -> Range<usize> {
        self.blocks[b].0.clone()
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }
}

impl RowGroups<f32> {
    /// # Shapes
    /// `images`: `[m, d]`; `blocks`: ranges of its rows.
    pub fn new(images: &Matrix, blocks: &[Range<usize>]) -> RowGroups {
        let d = images.dim;
        RowGroups::new_with(images.rows, blocks, d, |i, k| images.data[i * d + k])
    }
}

/// Scores of the rows of block `block` of `images` against the packed captions, row-major with
/// `64 * captions.len()` columns (column `c` = the `c`-th packed caption).
///
/// # Shapes
/// `out`: at least `[rows, 64 * captions.len()]` for the block's `rows`.
pub fn tile(images: &RowGroups, block: usize, captions: &Panels, out: &mut [f32]) {
    assert!(available(), "the tile kernel needs AVX-512F");
    assert_eq!(images.dim, captions.dim, "images and captions differ in width");
    let (rows, at) = images.blocks[block].clone();
    let w = captions.len() * NR;
    assert!(out.len() >= rows.len() * w, "tile buffer too small");
    if images.dim == 0 {
        out[..rows.len() * w].fill(0.0);
        return;
    }
    let groups = &images.data[at..at + rows.len().div_ceil(MR) * MR * images.dim];
    #[cfg(target_arch = "x86_64")]
    // SAFETY: AVX-512F is present (asserted); the slices hold what the kernel reads.
    unsafe {
        x86::tile(groups, rows.len(), &captions.data, captions.len(), images.dim, out)
    }
}

/// Exact scores of several (image, caption) pairs at once: independent chains, so that the
/// fused multiply-adds overlap.
///
/// # Shapes
/// each `pairs[j]`: (`[d]`, `[d]`) -> `[N]`.
pub fn chains<const N: usize>(pairs: [(&[f32], &[f32]); N]) -> [f32; N] {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has FMA.
            return unsafe { x86::chains(pairs) };
        }
    }
    chains_portable(pairs)
}

/// `f32::mul_add` is fused on every target (a library call where the CPU lacks FMA).
#[inline(always)]
fn chains_portable<const N: usize>(pairs: [(&[f32], &[f32]); N]) -> [f32; N] {
    let d = pairs.first().map_or(0, |p| p.0.len());
    let a: [&[f32]; N] = pairs.map(|p| &p.0[..d]);
    let b: [&[f32]; N] = pairs.map(|p| &p.1[..d]);
    let mut acc = [0.0f32; N];
    for k in 0..d {
        for j in 0..N {
            acc[j] = a[j][k].mul_add(b[j][k], acc[j]);
        }
    }
    acc
}

// AVX-512 target features and intrinsics are stable since Rust 1.89, which the crate needs
// anyway through gemm's `x86-v4` feature (pulp's AVX-512 kernels); `rust-version` predates it.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::incompatible_msrv)]
mod x86 {
    use std::arch::x86_64::*;

    use super::{KC, MR, NR};

    #[target_feature(enable = "fma")]
    pub fn chains<const N: usize>(pairs: [(&[f32], &[f32]); N]) -> [f32; N] {
        super::chains_portable(pairs)
    }

    /// The register block: a group of 6 rows (`[d][6]` from `a`) against one panel, depth
    /// `k0..k1`, continuing from the partial sums in `c` unless `k0 == 0`; the first `live`
    /// rows are stored.
    ///
    /// # Safety
    /// AVX-512F; `a` valid for `6 * k1` floats, `panel` for `64 * k1`, `c` for `live` rows of 64
    /// at stride `ldc`.
    #[target_feature(enable = "avx512f")]
    unsafe fn block(a: *const f32, panel: *const f32, k0: usize, k1: usize, c: *mut f32, ldc: usize, live: usize) {
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        if k0 > 0 {
            for (r, row) in acc.iter_mut().enumerate().take(live) {
                for (v, x) in row.iter_mut().enumerate() {
                    *x = _mm512_loadu_ps(c.add(r * ldc + 16 * v));
                }
            }
        }
        for k in k0..k1 {
            let b: [__m512; 4] = std::array::from_fn(|v| _mm512_loadu_ps(panel.add(k * NR + 16 * v)));
            for (r, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*a.add(k * MR + r));
                for (v, y) in row.iter_mut().enumerate() {
                    *y = _mm512_fmadd_ps(x, b[v], *y);
                }
            }
        }
        for (r, row) in acc.iter().enumerate().take(live) {
            for (v, x) in row.iter().enumerate() {
                _mm512_storeu_ps(c.add(r * ldc + 16 * v), *x);
            }
        }
    }

    /// [`super::tile`] with the bounds already checked: `groups` holds the block's
    /// `ceil(rows / 6)` groups, `packed` its `panels` panels.
    ///
    /// # Safety
    /// AVX-512F; `groups` of `6 * d` floats each, `packed` of `64 * d` floats per panel, `out`
    /// holding the tile.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile(groups: &[f32], rows: usize, packed: &[f32], panels: usize, d: usize, out: &mut [f32]) {
        let w = panels * NR;
        for p in 0..panels {
            let panel = packed.as_ptr().add(p * NR * d);
            for k0 in (0..d).step_by(KC) {
                let k1 = (k0 + KC).min(d);
                for (g, i0) in (0..rows).step_by(MR).enumerate() {
                    let c = out.as_mut_ptr().add(i0 * w + p * NR);
                    block(groups.as_ptr().add(g * MR * d), panel, k0, k1, c, w, (rows - i0).min(MR));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn random(rows: usize, dim: usize, seed: u64) -> Matrix {
        let mut x = seed;
        let data = (0..rows * dim)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
            })
            .collect();
        Matrix::new(rows, dim, data)
    }

    #[test]
    fn tiles_equal_single_chains_bit_for_bit() {
        // Depth 300 spans three depth blocks; 13 rows and 150 captions leave partial register
        // blocks and a partial panel.
        let (im, cap) = (random(13, 300, 1), random(150, 300, 2));
        let want = |i: usize, j: usize| {
            let mut acc = 0.0f32;
            for k in 0..300 {
                acc = im.row(i)[k].mul_add(cap.row(j)[k], acc);
            }
            acc
        };
        for i in 0..13 {
            for j in (0..150).step_by(3) {
                let (a, b, c) = (im.row(i), cap.row(j), im.row((i + 1) % 13));
                let [a, b, c] = chains([(a, b), (a, cap.row((j + 1) % 150)), (c, cap.row((j + 2) % 150))]);
                assert_eq!(
                    [a.to_bits(), b.to_bits(), c.to_bits()],
                    [want(i, j), want(i, (j + 1) % 150), want((i + 1) % 13, (j + 2) % 150)].map(f32::to_bits)
                );
            }
        }
        if tiles_missing("tiles_equal_single_chains_bit_for_bit") {
            return;
        }
        let mut panels = Panels::default();
        panels.pack(&cap, 64..150);
        assert_eq!(panels.len(), 2);
        let groups = RowGroups::new(&im, &[0..2, 2..11, 11..13]);
        let mut out = vec![f32::NAN; 9 * 128];
        tile(&groups, 1, &panels, &mut out);
        for (r, i) in (2..11).enumerate() {
            for c in 0..128 {
                let j = 64 + c;
                let expect = if j < 150 { want(i, j) } else { 0.0 };
                assert_eq!(out[r * 128 + c].to_bits(), expect.to_bits(), "image {i}, caption {j}");
            }
        }
    }
}
