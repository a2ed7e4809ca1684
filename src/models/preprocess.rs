//! Image preprocessing for the image encoders: decode (JPEG, PNG, WebP with the `image` crate),
//! convert to RGB, resize the shorter side, centre-crop, scale to [0, 1] and normalise, giving
//! a `[3, crop, crop]` f32 tensor. Named presets: `imagenet` — torchvision's ResNet evaluation
//! transform `Resize(256) + CenterCrop(224)`, bilinear, ImageNet mean/std (spec
//! `bow-and-otter.md` §4, §5.8) — and `clip` — `Resize(224, bicubic) + CenterCrop(224)` with
//! CLIP's constants, the Unicom teacher's own transform (spec `cusa-and-pcmepp.md` §1.1).
//!
//! The resampler is curate's own and reproduces what torchvision does with PIL images (PIL's
//! antialiased convolution resize): separable, horizontal pass first; for output pixel `i`
//! along an axis with `scale = in / out`, the window is centred at `(i + 0.5) · scale` with
//! half-width `support · max(scale, 1)`, each input pixel `j` weighted by
//! `filter((j − centre + 0.5) / max(scale, 1))`, weights normalised to sum 1. Like PIL, weights
//! are fixed point with 22 fractional bits and each pass rounds and clamps to `u8`, so results
//! equal torchvision's bit for bit on the same decoded pixels. `image::imageops::resize` is a
//! different resampler and does not match.
//!
//! The stage `encode_image` (src/stages/encode_image.rs) calls [`Preprocess::bytes_to_chw`] on
//! rayon threads and stacks the results into a batch.

use serde::{Deserialize, Serialize};

/// Interpolation filter of the resize, as torchvision names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interpolation {
    /// Triangle filter, support 1.
    Bilinear,
    /// Keys cubic with `a = −0.5`, support 2 (PIL's and torchvision's bicubic).
    Bicubic,
}

impl Interpolation {
    fn support(self) -> f64 {
        match self {
            Interpolation::Bilinear => 1.0,
            Interpolation::Bicubic => 2.0,
        }
    }

    fn weight(self, x: f64) -> f64 {
        let x = x.abs();
        match self {
            Interpolation::Bilinear => (1.0 - x).max(0.0),
            Interpolation::Bicubic => {
                const A: f64 = -0.5;
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
        }
    }
}

/// A named preprocessing preset (the `preprocess` key of `encode_image`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PreprocessPreset {
    /// torchvision ResNet evaluation: shorter side 256 (bilinear), centre crop 224, ImageNet
    /// mean/std.
    Imagenet,
    /// CLIP / Unicom: shorter side 224 (bicubic), centre crop 224, CLIP mean/std.
    Clip,
}

impl PreprocessPreset {
    pub fn build(self) -> Preprocess {
        match self {
            PreprocessPreset::Imagenet => Preprocess::imagenet(),
            PreprocessPreset::Clip => Preprocess::clip(),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            PreprocessPreset::Imagenet => "imagenet",
            PreprocessPreset::Clip => "clip",
        }
    }
}

/// An RGB image, 8 bits per channel, rows of interleaved `r, g, b`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
}

/// Decodes JPEG, PNG or WebP bytes (format from the magic bytes) to RGB. Grayscale is
/// replicated to three channels and an alpha channel dropped, as PIL's `convert("RGB")` does
/// (torchvision's image-folder loader). EXIF orientation is not applied (neither does PIL's
/// `open`).
pub fn decode(bytes: &[u8]) -> Result<Rgb8, String> {
    if jpeg_cut_short(bytes) {
        // The decoder would fill the missing part with grey, as PIL refuses to.
        return Err("JPEG data cut short (no end-of-image marker after its last scan)".into());
    }
    let img = image::load_from_memory(bytes).map_err(|e| e.to_string().trim_end().to_owned())?;
    let rgb = img.into_rgb8();
    let (width, height) = (rgb.width() as usize, rgb.height() as usize);
    if width == 0 || height == 0 {
        return Err(format!("empty image ({width}x{height})"));
    }
    Ok(Rgb8 { width, height, data: rgb.into_raw() })
}

/// Whether `bytes` are a JPEG whose last scan has no end-of-image marker (`FF D9`) after it: a
/// file cut short. In a scan's entropy-coded data a `FF` byte is followed by `00` or a restart
/// marker, so `FF D9` there is the end; an EXIF thumbnail's own `FF D9` comes before the scans.
fn jpeg_cut_short(bytes: &[u8]) -> bool {
    if !bytes.starts_with(&[0xFF, 0xD8]) {
        return false;
    }
    let Some(last_scan) = bytes.windows(2).rposition(|w| w == [0xFF, 0xDA]) else {
        return false;
    };
    !bytes[last_scan..].windows(2).any(|w| w == [0xFF, 0xD9])
}

/// Resize + centre crop + normalisation, configured once.
#[derive(Debug, Clone, PartialEq)]
pub struct Preprocess {
    /// Length of the shorter side after resizing (the longer side keeps the aspect ratio).
    pub resize_px: usize,
    /// Side of the square centre crop; at most `resize_px`.
    pub crop_px: usize,
    pub interpolation: Interpolation,
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

/// ImageNet channel statistics (torchvision's ResNet weights).
pub const IMAGENET_MEAN: [f32; 3] = [0.485, 0.456, 0.406];
pub const IMAGENET_STD: [f32; 3] = [0.229, 0.224, 0.225];
/// CLIP's channel statistics (also Unicom's, `cusa-and-pcmepp.md` §1.1), digits as published.
#[allow(clippy::excessive_precision)]
pub const CLIP_MEAN: [f32; 3] = [0.481_454_66, 0.457_827_5, 0.408_210_73];
#[allow(clippy::excessive_precision)]
pub const CLIP_STD: [f32; 3] = [0.268_629_54, 0.261_302_58, 0.275_777_11];

/// Fractional bits of the fixed-point weights (PIL's choice for 8-bit images: 32 − 8 − 2, so a
/// sum of 255 × weights with up to ~4× total magnitude fits an i32).
const PRECISION_BITS: u32 = 22;

impl Preprocess {
    /// torchvision's ResNet evaluation transform.
    pub fn imagenet() -> Self {
        Preprocess {
            resize_px: 256,
            crop_px: 224,
            interpolation: Interpolation::Bilinear,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
        }
    }

    /// CLIP's (and Unicom's) evaluation transform.
    pub fn clip() -> Self {
        Preprocess {
            resize_px: 224,
            crop_px: 224,
            interpolation: Interpolation::Bicubic,
            mean: CLIP_MEAN,
            std: CLIP_STD,
        }
    }

    /// Values per preprocessed image: `3 · crop_px²`.
    pub fn len(&self) -> usize {
        3 * self.crop_px * self.crop_px
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Size after resizing the shorter side to `resize_px`, as torchvision computes it: the
    /// longer side is `floor(resize_px · long / short)`.
    pub fn resized_size(&self, width: usize, height: usize) -> (usize, usize) {
        let (short, long) = if width <= height { (width, height) } else { (height, width) };
        let new_long = ((self.resize_px * long) as f64 / short as f64) as usize;
        if width <= height {
            (self.resize_px, new_long)
        } else {
            (new_long, self.resize_px)
        }
    }

    /// Resize + centre crop, still 8-bit (what torchvision holds before `ToTensor`).
    pub fn resize_crop(&self, img: &Rgb8) -> Rgb8 {
        let (rw, rh) = self.resized_size(img.width, img.height);
        let c = self.crop_px;
        assert!(rw >= c && rh >= c, "crop {c} larger than the resized image {rw}x{rh}");
        // torchvision's CenterCrop: offset `round((size − crop) / 2)`, Python's round (half to
        // even).
        self.resize_crop_at(img, round_half_even(rw - c), round_half_even(rh - c))
    }

    /// Resize, then the `crop_px` square whose top-left corner is `(left, top)` in the resized
    /// image (torchvision's `RandomCrop` after `Resize` when the offsets are drawn). Only the
    /// pixels of the square are computed, and they equal those of the whole resized image.
    pub fn resize_crop_at(&self, img: &Rgb8, left: usize, top: usize) -> Rgb8 {
        let (rw, rh) = self.resized_size(img.width, img.height);
        let c = self.crop_px;
        assert!(left + c <= rw && top + c <= rh, "crop {c} at ({left}, {top}) outside the resized image {rw}x{rh}");
        resample(img, (rw, rh), (left, top), (c, c), self.interpolation)
    }

    /// The normalised `[3, crop_px, crop_px]` tensor of an image, row-major.
    ///
    /// # Shapes
    /// - output: `[3, crop_px, crop_px]` flattened
    pub fn to_chw(&self, img: &Rgb8) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.len());
        push_normalised(&self.resize_crop(img), self.mean, self.std, false, &mut out);
        out
    }

    /// Decodes and preprocesses encoded image bytes.
    pub fn bytes_to_chw(&self, bytes: &[u8]) -> Result<Vec<f32>, String> {
        Ok(self.to_chw(&decode(bytes)?))
    }
}

/// `img` resized to exactly `width × height` (aspect not kept), as PIL's `resize((width,
/// height))` — torchvision's `Resize((h, w))` on a PIL image. (Only tests need it.)
#[cfg(test)]
pub(crate) fn resize_to(img: &Rgb8, width: usize, height: usize, filter: Interpolation) -> Rgb8 {
    resample(img, (width, height), (0, 0), (width, height), filter)
}

/// The `w × h` part of `img` whose top-left corner is `(x, y)`, as PIL's `crop((x, y, x + w,
/// y + h))` inside the image. (Only tests need it.)
#[cfg(test)]
pub(crate) fn crop(img: &Rgb8, x: usize, y: usize, w: usize, h: usize) -> Rgb8 {
    assert!(
        x + w <= img.width && y + h <= img.height,
        "crop {w}x{h} at ({x}, {y}) outside {}x{}",
        img.width,
        img.height
    );
    let mut data = Vec::with_capacity(w * h * 3);
    for row in y..y + h {
        let start = (row * img.width + x) * 3;
        data.extend_from_slice(&img.data[start..start + w * 3]);
    }
    Rgb8 { width: w, height: h, data }
}

/// Appends the normalised CHW tensor of `img` to `dst`, mirrored left-right when `flip`: as
/// torchvision's `ToTensor` (`x / 255` in f32) then `Normalize` (`(x − mean) / std` in f32),
/// the same operations, so the same rounding.
///
/// # Shapes
/// - appends `[3, img.height, img.width]` flattened
pub fn push_normalised(img: &Rgb8, mean: [f32; 3], std: [f32; 3], flip: bool, dst: &mut Vec<f32>) {
    let (w, plane) = (img.width, img.width * img.height);
    let start = dst.len();
    dst.resize(start + 3 * plane, 0.0);
    let out = &mut dst[start..];
    for (y, row) in img.data.chunks_exact(w * 3).enumerate() {
        for (x, px) in row.chunks_exact(3).enumerate() {
            let at = y * w + if flip { w - 1 - x } else { x };
            for ch in 0..3 {
                out[ch * plane + at] = (px[ch] as f32 / 255.0 - mean[ch]) / std[ch];
            }
        }
    }
}

/// The `w × h` part of `img` at `(x, y)` resized to `size × size` with `filter` (PIL's
/// `img.crop((x, y, x + w, y + h)).resize((size, size), filter)`: torchvision's `resized_crop`
/// on a PIL image, which its `RandomResizedCrop` calls).
pub fn crop_resize(img: &Rgb8, (x, y, w, h): (usize, usize, usize, usize), size: usize, filter: Interpolation) -> Rgb8 {
    assert!(x + w <= img.width && y + h <= img.height && w > 0 && h > 0, "crop outside the image");
    let mut data = Vec::with_capacity(w * h * 3);
    for row in y..y + h {
        let at = (row * img.width + x) * 3;
        data.extend_from_slice(&img.data[at..at + w * 3]);
    }
    let crop = Rgb8 { width: w, height: h, data };
    resample(&crop, (size, size), (0, 0), (size, size), filter)
}

/// The `size` window at `offset` of `img` resized to `resized` (PIL's resampler, see the
/// module docs): only the input rows the window reads go through the horizontal pass.
fn resample(
    img: &Rgb8,
    resized: (usize, usize),
    offset: (usize, usize),
    size: (usize, usize),
    filter: Interpolation,
) -> Rgb8 {
    let cols = Coefficients::new(img.width, resized.0, offset.0, size.0, filter);
    let rows = Coefficients::new(img.height, resized.1, offset.1, size.1, filter);
    let first = rows.starts.first().copied().unwrap_or(0);
    let last = rows.starts.iter().zip(&rows.lens).map(|(s, n)| s + n).max().unwrap_or(0);
    let wide = horizontal(img, first, last, &cols);
    vertical(&wide, first, &rows)
}

/// `round(n / 2)` with ties to even, as Python's `round` (torchvision's `CenterCrop`).
fn round_half_even(n: usize) -> usize {
    let half = n / 2;
    if n % 2 == 1 && half % 2 == 1 {
        half + 1
    } else {
        half
    }
}

/// Fixed-point weights of a subset of the output positions along one axis: output position
/// `first_out + k` reads input `starts[k] .. starts[k] + lens[k]` with
/// `weights[k * stride ..][.. lens[k]]`.
struct Coefficients {
    starts: Vec<usize>,
    lens: Vec<usize>,
    weights: Vec<i32>,
    stride: usize,
    /// Input and output sizes are equal: the pass is the identity and is skipped (as PIL does);
    /// output position `first_out + k` is input position `first_out + k`.
    identity: bool,
    first_out: usize,
}

impl Coefficients {
    /// Weights of output positions `first_out .. first_out + count` of a resize from `in_size` to
    /// `out_size`.
    fn new(in_size: usize, out_size: usize, first_out: usize, count: usize, filter: Interpolation) -> Self {
        let scale = in_size as f64 / out_size as f64;
        // Downscaling widens the filter by the scale factor (antialiasing).
        let filter_scale = scale.max(1.0);
        let support = filter.support() * filter_scale;
        let stride = support.ceil() as usize * 2 + 1;
        let mut c = Coefficients {
            starts: Vec::with_capacity(count),
            lens: Vec::with_capacity(count),
            weights: vec![0; count * stride],
            stride,
            identity: in_size == out_size,
            first_out,
        };
        let mut w = vec![0f64; stride];
        for (k, i) in (first_out..first_out + count).enumerate() {
            let centre = (i as f64 + 0.5) * scale;
            // `as` truncates toward zero, as C's cast does; negative starts are clamped anyway.
            let lo = ((centre - support + 0.5) as i64).max(0) as usize;
            let hi = ((centre + support + 0.5) as i64).min(in_size as i64) as usize;
            let n = hi - lo;
            let mut total = 0.0;
            for (j, wj) in w.iter_mut().enumerate().take(n) {
                *wj = filter.weight(((lo + j) as f64 - centre + 0.5) / filter_scale);
                total += *wj;
            }
            let one = (1u32 << PRECISION_BITS) as f64;
            for (fixed, &wj) in c.weights[k * stride..].iter_mut().zip(&w[..n]) {
                let v = if total != 0.0 { wj / total } else { wj };
                // Round half away from zero (C: `(int)(v * one ± 0.5)`).
                *fixed = if v < 0.0 { (v * one - 0.5) as i32 } else { (v * one + 0.5) as i32 };
            }
            c.starts.push(lo);
            c.lens.push(n);
        }
        c
    }

    fn row(&self, k: usize) -> &[i32] {
        &self.weights[k * self.stride..k * self.stride + self.lens[k]]
    }
}

/// A fixed-point sum back to `u8`: round (the sum started at one half), shift, clamp.
#[inline]
fn to_u8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

const HALF: i32 = 1 << (PRECISION_BITS - 1);

/// Horizontal pass over input rows `first .. last`: `[last − first, cols.len(), 3]`.
fn horizontal(img: &Rgb8, first: usize, last: usize, cols: &Coefficients) -> Rgb8 {
    let out_w = cols.starts.len();
    let mut data = vec![0u8; (last - first) * out_w * 3];
    for (y, out_row) in (first..last).zip(data.chunks_exact_mut(out_w * 3)) {
        let in_row = &img.data[y * img.width * 3..(y + 1) * img.width * 3];
        if cols.identity {
            out_row.copy_from_slice(&in_row[cols.first_out * 3..(cols.first_out + out_w) * 3]);
            continue;
        }
        for (x, px) in out_row.chunks_exact_mut(3).enumerate() {
            let start = cols.starts[x];
            let mut sum = [HALF; 3];
            for (j, &w) in cols.row(x).iter().enumerate() {
                let p = &in_row[(start + j) * 3..(start + j) * 3 + 3];
                sum[0] += p[0] as i32 * w;
                sum[1] += p[1] as i32 * w;
                sum[2] += p[2] as i32 * w;
            }
            px.copy_from_slice(&[to_u8(sum[0]), to_u8(sum[1]), to_u8(sum[2])]);
        }
    }
    Rgb8 { width: out_w, height: last - first, data }
}

/// Vertical pass over `wide`, whose row 0 is input row `first`.
fn vertical(wide: &Rgb8, first: usize, rows: &Coefficients) -> Rgb8 {
    let out_h = rows.starts.len();
    let stride = wide.width * 3;
    let mut data = vec![0u8; out_h * stride];
    let mut sum = vec![0i32; stride];
    for (y, out_row) in data.chunks_exact_mut(stride).enumerate() {
        if rows.identity {
            let src = rows.first_out + y - first;
            out_row.copy_from_slice(&wide.data[src * stride..(src + 1) * stride]);
            continue;
        }
        let start = rows.starts[y] - first;
        sum.fill(HALF);
        for (j, &w) in rows.row(y).iter().enumerate() {
            let in_row = &wide.data[(start + j) * stride..(start + j + 1) * stride];
            for (s, &p) in sum.iter_mut().zip(in_row) {
                *s += p as i32 * w;
            }
        }
        for (o, &s) in out_row.iter_mut().zip(&sum) {
            *o = to_u8(s);
        }
    }
    Rgb8 { width: wide.width, height: out_h, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resized_size_truncates_the_long_side_as_torchvision() {
        // torchvision: int(256 * 300 / 200) = 384; int(256 * 37 / 23) = 411 (411.8...)
        let p = Preprocess::imagenet();
        assert_eq!(p.resized_size(300, 200), (384, 256));
        assert_eq!(p.resized_size(23, 37), (256, 411));
        assert_eq!(p.resized_size(224, 224), (256, 256));
    }

    #[test]
    fn centre_crop_offsets_round_half_to_even() {
        // Python: [round(n / 2) for n in range(6)] == [0, 0, 1, 2, 2, 2]
        assert_eq!((0..6).map(round_half_even).collect::<Vec<_>>(), vec![0, 0, 1, 2, 2, 2]);
    }

    #[test]
    fn weights_sum_to_one_in_fixed_point_and_identity_is_exact() {
        for filter in [Interpolation::Bilinear, Interpolation::Bicubic] {
            let c = Coefficients::new(37, 256, 0, 256, filter);
            for k in 0..256 {
                let s: i32 = c.row(k).iter().sum();
                assert!((s - (1 << PRECISION_BITS)).abs() <= 4, "{filter:?} {k}: {s}");
            }
        }
        // Same size in and out: the image passes unchanged.
        let img = Rgb8 { width: 4, height: 4, data: (0..48).map(|v| (v * 5) as u8).collect() };
        let p = Preprocess { resize_px: 4, crop_px: 4, ..Preprocess::clip() };
        assert_eq!(p.resize_crop(&img), img);
        // Only a crop (the bicubic window starts one pixel left of the crop; the copy must not).
        let wide = Rgb8 { width: 7, height: 4, data: (0..84).map(|v| v as u8).collect() };
        let cropped = p.resize_crop(&wide);
        // Python: round((7 - 4) / 2) == 2
        assert_eq!(&cropped.data[..12], &wide.data[6..18]);
    }

    #[test]
    fn a_flat_image_stays_flat_through_resize_and_normalises_to_known_values() {
        // (200 / 255 - 0.485) / 0.229 = 1.30691...
        let img = Rgb8 { width: 30, height: 17, data: [200u8, 100, 0].repeat(30 * 17) };
        let p = Preprocess::imagenet();
        let t = p.to_chw(&img);
        assert_eq!(t.len(), 3 * 224 * 224);
        let plane = 224 * 224;
        assert!((t[0] - (200.0 / 255.0 - 0.485) / 0.229).abs() < 1e-6);
        assert!(t[..plane].iter().all(|&v| v == t[0]));
        assert!(t[plane..2 * plane].iter().all(|&v| v == (100.0f32 / 255.0 - 0.456) / 0.224));
        assert!(t[2 * plane..].iter().all(|&v| v == (0.0f32 - 0.406) / 0.225));
    }
}
