//! The image transforms of training and evaluation (`data.image_transform`), as each paper
//! defines them: how a training crop is drawn from a decoded image, and how an evaluation image
//! (zero-shot, `curate eval`) is prepared, both as normalised `[3, size, size]` CHW tensors.
//!
//! | `image_transform` | training view | evaluation view | mean/std |
//! | --- | --- | --- | --- |
//! | `random_resized_crop` (default) | RandomResizedCrop(`crop_scale`, `crop_ratio`) + flip | whole image to `size × size` | ImageNet |
//! | `otter` (`bow-and-otter.md` §5.8, §7 A9) | shorter side to `size · 256/224` (bicubic), random `size` crop, no flip | same resize, centre crop | CLIP |
//! | `pcmepp` (`cusa-and-pcmepp.md` §3.9) | crop of `r·W × r·H`, `r ~ U(0.6, 1)`, at a random place, to `size × size` (OpenCV's bilinear, aspect not kept) + flip | whole image to `size × size` (the same) | ImageNet |
//! | `clip` (`cusa-and-pcmepp.md` §2.6) | CLIP's evaluation transform: shorter side to `size` (bicubic), centre crop | the same | CLIP |
//!
//! `otter` and `clip` resample with [`crate::models::preprocess`]'s PIL-exact resampler, so a
//! view equals torchvision's on a PIL image given the same crop. `pcmepp` resamples as its
//! reference data loader does: `cv2.resize(..., INTER_LINEAR)` on the float32 crop (no
//! antialiasing, no rounding to 8 bits; [`cv2_linear`]). The default
//! keeps the trainer's first sampler (bilinear at pixel centres, no antialiasing), so runs made
//! before the key existed evaluate as they trained; with `data.antialias` it resamples with PIL's
//! antialiased bilinear filter, so that a view equals torchvision's `RandomResizedCrop` on a PIL
//! image given the same crop. `flip` (probability 0.5) is each
//! transform's paper's unless set: on for `random_resized_crop` and `pcmepp`, off for `otter`
//! and `clip`. Every draw comes from the row's [`RowRng`], so a view is a function of
//! `(seed, epoch, sample_id)`.

use serde::{Deserialize, Serialize};

use crate::models::preprocess::{
    self, Interpolation, Preprocess, Rgb8, CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD,
};
use crate::rng::RowRng;

use super::config::DataConfig;
use super::data::{crop_to_chw, random_resized_crop, unit};

/// The transform a training file names (`data.image_transform`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageTransformKind {
    /// torchvision's RandomResizedCrop crop rule + RandomHorizontalFlip, the crop resampled
    /// bilinearly at pixel centres (no antialiasing), ImageNet mean/std; evaluation resizes the
    /// whole image the same way.
    #[default]
    RandomResizedCrop,
    /// OTTER's recipe, which *A Fistful of Words* trains with (its §7 A9).
    Otter,
    /// PCME++'s reference augmentation.
    Pcmepp,
    /// CUSA's: CLIP's evaluation transform for training and test, no augmentation.
    Clip,
}

impl ImageTransformKind {
    /// The name a training file gives it.
    pub fn name(self) -> &'static str {
        match self {
            ImageTransformKind::RandomResizedCrop => "random_resized_crop",
            ImageTransformKind::Otter => "otter",
            ImageTransformKind::Pcmepp => "pcmepp",
            ImageTransformKind::Clip => "clip",
        }
    }

    /// Whether training views are mirrored at random when `flip` is not set.
    pub fn flips_by_default(self) -> bool {
        matches!(self, ImageTransformKind::RandomResizedCrop | ImageTransformKind::Pcmepp)
    }
}

/// The range of PCME++'s crop side ratio `r`.
pub const PCMEPP_CROP_RANGE: [f64; 2] = [0.6, 1.0];

/// A configured transform for images of side `size`.
#[derive(Debug, Clone, PartialEq)]
pub struct ImageTransform {
    pub kind: ImageTransformKind,
    pub size: usize,
    pub crop_scale: [f64; 2],
    pub crop_ratio: [f64; 2],
    pub flip: bool,
    /// `random_resized_crop` with PIL's antialiased bilinear resampler (`data.antialias`).
    pub antialias: bool,
}

impl ImageTransform {
    /// The transform of a training file's `[data]` for the model's `image_size_px`.
    pub fn new(data: &DataConfig, size: usize) -> ImageTransform {
        let d = ImageTransform::of_kind(data.image_transform, size);
        ImageTransform {
            crop_scale: data.crop_scale.unwrap_or(d.crop_scale),
            crop_ratio: data.crop_ratio.unwrap_or(d.crop_ratio),
            flip: data.flip.unwrap_or(d.flip),
            antialias: data.antialias,
            ..d
        }
    }

    /// `kind` for images of side `size` with its defaults (torchvision's crop ranges, the
    /// paper's flip).
    pub fn of_kind(kind: ImageTransformKind, size: usize) -> ImageTransform {
        ImageTransform {
            kind,
            size,
            crop_scale: super::config::DEFAULT_CROP_SCALE,
            crop_ratio: super::config::DEFAULT_CROP_RATIO,
            flip: kind.flips_by_default(),
            antialias: false,
        }
    }

    /// Channel mean and standard deviation the views are normalised with.
    pub fn normalisation(&self) -> ([f32; 3], [f32; 3]) {
        match self.kind {
            ImageTransformKind::RandomResizedCrop | ImageTransformKind::Pcmepp => (IMAGENET_MEAN, IMAGENET_STD),
            ImageTransformKind::Otter | ImageTransformKind::Clip => (CLIP_MEAN, CLIP_STD),
        }
    }

    /// The resize + centre crop of `otter` and `clip` (evaluation, and `clip`'s training).
    fn resize_then_crop(&self) -> Preprocess {
        let (mean, std) = self.normalisation();
        let resize_px = match self.kind {
            // 256 for 224, as the paper's; rounded for other sizes.
            ImageTransformKind::Otter => (self.size as f64 * 256.0 / 224.0).round() as usize,
            _ => self.size,
        };
        Preprocess { resize_px, crop_px: self.size, interpolation: Interpolation::Bicubic, mean, std }
    }

    /// Appends the training view of `img` to `dst`, drawing from `rng`.
    ///
    /// # Shapes
    /// - appends `[3, size, size]` flattened
    pub fn train(&self, img: &Rgb8, rng: &mut RowRng, dst: &mut Vec<f32>) {
        let (mean, std) = self.normalisation();
        match self.kind {
            ImageTransformKind::RandomResizedCrop => {
                let crop = random_resized_crop(img.width, img.height, self.crop_scale, self.crop_ratio, rng);
                let flip = self.flip && rng.below(2) == 1;
                self.crop_view(img, crop, flip, dst);
            }
            ImageTransformKind::Otter => {
                let p = self.resize_then_crop();
                let (rw, rh) = p.resized_size(img.width, img.height);
                // torchvision's RandomCrop.get_params: the row offset first.
                let top = rng.below((rh - self.size + 1) as u64) as usize;
                let left = rng.below((rw - self.size + 1) as u64) as usize;
                let flip = self.flip && rng.below(2) == 1;
                preprocess::push_normalised(&p.resize_crop_at(img, left, top), mean, std, flip, dst);
            }
            ImageTransformKind::Pcmepp => {
                let crop = pcmepp_crop(img.width, img.height, rng);
                let flip = self.flip && rng.below(2) == 1;
                push_normalised_f32(&cv2_linear(img, crop, self.size), self.size, mean, std, flip, dst);
            }
            ImageTransformKind::Clip => {
                let flip = self.flip && rng.below(2) == 1;
                preprocess::push_normalised(&self.resize_then_crop().resize_crop(img), mean, std, flip, dst);
            }
        }
    }

    /// Appends the evaluation view of `img` to `dst` (no randomness).
    ///
    /// # Shapes
    /// - appends `[3, size, size]` flattened
    pub fn test(&self, img: &Rgb8, dst: &mut Vec<f32>) {
        let (mean, std) = self.normalisation();
        match self.kind {
            ImageTransformKind::RandomResizedCrop => self.crop_view(img, (0, 0, img.width, img.height), false, dst),
            ImageTransformKind::Pcmepp => {
                let whole = (0, 0, img.width, img.height);
                push_normalised_f32(&cv2_linear(img, whole, self.size), self.size, mean, std, false, dst);
            }
            ImageTransformKind::Otter | ImageTransformKind::Clip => {
                preprocess::push_normalised(&self.resize_then_crop().resize_crop(img), mean, std, false, dst)
            }
        }
    }

    /// Appends the crop `(x, y, w, h)` of `img` resampled to `size × size` (the trainer's
    /// bilinear sampler), normalised as this transform's views are: `mine_pseudo_bow`'s crops
    /// of a trained model.
    pub fn crop(&self, img: &Rgb8, crop: (usize, usize, usize, usize), dst: &mut Vec<f32>) {
        self.crop_view(img, crop, false, dst);
    }

    /// The crop `(x, y, w, h)` of `img` resampled to `size × size` by `random_resized_crop`'s
    /// sampler (PIL's antialiased bilinear with `antialias`, else bilinear at pixel centres).
    fn crop_view(&self, img: &Rgb8, crop: (usize, usize, usize, usize), flip: bool, dst: &mut Vec<f32>) {
        let (mean, std) = self.normalisation();
        if self.antialias {
            let view = preprocess::crop_resize(img, crop, self.size, Interpolation::Bilinear);
            preprocess::push_normalised(&view, mean, std, flip, dst);
        } else {
            crop_to_chw(img, crop, self.size, flip, mean, std, dst);
        }
    }
}

/// PCME++'s crop of an image `width × height`, as its data loader draws it: one side ratio
/// `r ~ U(0.6, 1)` for both sides (`int(r · side)`, at least 1), then the left edge uniform in
/// `0..width − w` and the top edge in `0..height − h` (NumPy's `randint(n)`, which excludes `n`;
/// 0 when the crop spans the side). Returns `(x, y, w, h)`.
pub fn pcmepp_crop(width: usize, height: usize, rng: &mut RowRng) -> (usize, usize, usize, usize) {
    let [lo, hi] = PCMEPP_CROP_RANGE;
    let r = lo + (hi - lo) * unit(rng);
    let w = ((width as f64 * r) as usize).clamp(1, width);
    let h = ((height as f64 * r) as usize).clamp(1, height);
    let mut start = |spare: usize| if spare == 0 { 0 } else { rng.below(spare as u64) as usize };
    let x = start(width - w);
    let y = start(height - h);
    (x, y, w, h)
}

/// OpenCV's `cv2.resize(crop, None, fx=out/w, fy=out/h, interpolation=cv2.INTER_LINEAR)` of
/// the `w × h` part of `img` at `(x, y)` converted to float32, as PCME++'s data loader calls
/// it: output pixel `d` of an axis reads `f = (d + 0.5) · s − 0.5` with `s = 1 / (out / w)`
/// (computed in float64, then `f` rounded to float32), the two pixels `⌊f⌋` and `⌊f⌋ + 1`
/// with weights `1 − (f − ⌊f⌋)` and `f − ⌊f⌋`; horizontally, before the first pixel or from the
/// last on, that pixel alone; vertically, the two rows clamped to the crop. Horizontal pass
/// first, float32 sums, no antialiasing, no rounding: OpenCV's generic path (with IPP off; IPP,
/// on by default in `opencv-python`, rounds otherwise by up to ~4e-3 of a level).
///
/// # Shapes
/// - returns `[out, out, 3]` (HWC) flattened, values in `[0, 255]`
pub fn cv2_linear(img: &Rgb8, (x0, y0, w, h): (usize, usize, usize, usize), out: usize) -> Vec<f32> {
    // Per output position: the two source positions and their weights. Horizontally OpenCV
    // moves a position outside the pixels onto the edge pixel with weights (1, 0); vertically
    // it clamps the two rows and keeps the weights as computed (the same value, other rounding).
    let taps = |len: usize, clamp_weights: bool| -> Vec<(usize, usize, f32, f32)> {
        let scale = 1.0 / (out as f64 / len as f64);
        let last = len as isize - 1;
        (0..out)
            .map(|d| {
                let f = ((d as f64 + 0.5) * scale - 0.5) as f32;
                let s = f.floor();
                let (i, frac) = (s as isize, f - s);
                if clamp_weights {
                    let (i, frac) = if i < 0 {
                        (0, 0.0)
                    } else if i >= last {
                        (last, 0.0)
                    } else {
                        (i, frac)
                    };
                    (i as usize, (i + 1).min(last) as usize, 1.0 - frac, frac)
                } else {
                    (i.clamp(0, last) as usize, (i + 1).clamp(0, last) as usize, 1.0 - frac, frac)
                }
            })
            .collect()
    };
    let (cols, rows) = (taps(w, true), taps(h, false));
    let px = |x: usize, y: usize, c: usize| img.data[((y0 + y) * img.width + x0 + x) * 3 + c] as f32;
    // Horizontal pass over the rows the vertical pass reads.
    let mut wide = vec![0f32; h * out * 3];
    let mut needed = vec![false; h];
    for &(a, b, _, _) in &rows {
        needed[a] = true;
        needed[b] = true;
    }
    for y in (0..h).filter(|&y| needed[y]) {
        for (d, &(a, b, wa, wb)) in cols.iter().enumerate() {
            for c in 0..3 {
                wide[(y * out + d) * 3 + c] = px(a, y, c) * wa + px(b, y, c) * wb;
            }
        }
    }
    let mut view = vec![0f32; out * out * 3];
    for (d, &(a, b, wa, wb)) in rows.iter().enumerate() {
        for k in 0..out * 3 {
            view[d * out * 3 + k] = wide[a * out * 3 + k] * wa + wide[b * out * 3 + k] * wb;
        }
    }
    view
}

/// Appends the normalised CHW tensor of an `[size, size, 3]` float view (values 0–255) to
/// `dst`, mirrored when `flip`: `x / 255`, then `(x − mean) / std`, in float32.
pub fn push_normalised_f32(view: &[f32], size: usize, mean: [f32; 3], std: [f32; 3], flip: bool, dst: &mut Vec<f32>) {
    let plane = size * size;
    let start = dst.len();
    dst.resize(start + 3 * plane, 0.0);
    let out = &mut dst[start..];
    for y in 0..size {
        for x in 0..size {
            let at = y * size + if flip { size - 1 - x } else { x };
            for c in 0..3 {
                out[c * plane + at] = (view[(y * size + x) * 3 + c] / 255.0 - mean[c]) / std[c];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(w: usize, h: usize) -> Rgb8 {
        Rgb8 { width: w, height: h, data: (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect() }
    }

    fn transform(kind: ImageTransformKind, size: usize) -> ImageTransform {
        ImageTransform::of_kind(kind, size)
    }

    #[test]
    fn every_view_has_the_model_size_and_draws_follow_the_row() {
        let img = image(53, 31);
        for kind in [
            ImageTransformKind::RandomResizedCrop,
            ImageTransformKind::Otter,
            ImageTransformKind::Pcmepp,
            ImageTransformKind::Clip,
        ] {
            let t = transform(kind, 16);
            let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
            t.train(&img, &mut RowRng::new(1, "augment/0", "x"), &mut a);
            t.train(&img, &mut RowRng::new(1, "augment/0", "x"), &mut b);
            t.test(&img, &mut c);
            assert_eq!((a.len(), c.len()), (3 * 16 * 16, 3 * 16 * 16), "{kind:?}");
            assert_eq!(a, b, "{kind:?}: the same row draws the same view");
            // Another row's draws differ, except for `clip`, which draws nothing but the flip
            // (off by default).
            let mut other = Vec::new();
            t.train(&img, &mut RowRng::new(1, "augment/0", "y"), &mut other);
            assert_eq!(kind == ImageTransformKind::Clip, a == other, "{kind:?}");
            if kind == ImageTransformKind::Clip {
                assert_eq!(a, c, "clip trains on its evaluation view");
            }
        }
    }

    #[test]
    fn otter_crops_lie_inside_the_resized_image_and_the_test_view_is_centred() {
        let t = transform(ImageTransformKind::Otter, 224);
        assert_eq!(t.resize_then_crop().resize_px, 256, "the paper's 256 for 224");
        assert_eq!(transform(ImageTransformKind::Otter, 32).resize_then_crop().resize_px, 37);
        // A view at each corner offset equals that part of the fully resized image.
        let img = image(300, 200);
        let p = Preprocess { crop_px: 224, ..t.resize_then_crop() };
        let (rw, rh) = p.resized_size(300, 200);
        assert_eq!((rw, rh), (384, 256));
        let full = preprocess::resize_to(&img, rw, rh, Interpolation::Bicubic);
        for (left, top) in [(0, 0), (rw - 224, rh - 224), (77, 13)] {
            let view = p.resize_crop_at(&img, left, top);
            assert_eq!(view, preprocess::crop(&full, left, top, 224, 224), "at ({left}, {top})");
        }
        // The centre crop of the evaluation view: offsets round((384 − 224) / 2) = 80, 16.
        let mut test = Vec::new();
        t.test(&img, &mut test);
        let mut want = Vec::new();
        preprocess::push_normalised(&preprocess::crop(&full, 80, 16, 224, 224), CLIP_MEAN, CLIP_STD, false, &mut want);
        assert_eq!(test, want);
    }

    #[test]
    fn pcmepp_crops_keep_one_ratio_for_both_sides_within_its_range() {
        let mut rng = RowRng::new(3, "t", "x");
        let mut ratios = Vec::new();
        for _ in 0..2000 {
            let (x, y, w, h) = pcmepp_crop(400, 300, &mut rng);
            assert!(x + w <= 400 && y + h <= 300);
            let (rw, rh) = (w as f64 / 400.0, h as f64 / 300.0);
            assert!((rw - rh).abs() < 1.0 / 300.0 + 1e-12, "one ratio: {w}x{h}");
            assert!((0.6 - 1.0 / 300.0..=1.0).contains(&rh), "{rh}");
            ratios.push(rw);
        }
        // Uniform on [0.6, 1): the mean is near 0.8 and both ends are reached.
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        assert!((mean - 0.8).abs() < 0.01, "{mean}");
        assert!(ratios.iter().any(|&r| r < 0.61) && ratios.iter().any(|&r| r > 0.99));
        // A 1-pixel side stays 1 pixel.
        assert_eq!(pcmepp_crop(1, 1, &mut rng), (0, 0, 1, 1));
    }

    #[test]
    fn flip_mirrors_the_view_and_only_when_drawn() {
        let img = image(40, 40);
        let mut t = transform(ImageTransformKind::Clip, 8);
        let mut plain = Vec::new();
        t.train(&img, &mut RowRng::new(0, "a", "x"), &mut plain);
        t.flip = true;
        let (mut flipped, mut kept) = (0, 0);
        for k in 0..64 {
            let mut v = Vec::new();
            t.train(&img, &mut RowRng::new(0, "a", &k.to_string()), &mut v);
            if v == plain {
                kept += 1;
            } else {
                // Mirrored: column x of every row is column 7 − x of the plain view.
                for (i, &value) in v.iter().enumerate() {
                    let (row, x) = (i / 8, i % 8);
                    assert_eq!(value, plain[row * 8 + 7 - x]);
                }
                flipped += 1;
            }
        }
        assert!(flipped > 16 && kept > 16, "about half each: {flipped} / {kept}");
    }

    #[test]
    fn training_views_are_their_pieces_at_the_drawn_offsets_and_reach_both_extremes() {
        // otter at 32 px: shorter side to 37, so a 40 x 37 image gives tops 0..=5, lefts 0..=8.
        let img = image(40, 37);
        let t = transform(ImageTransformKind::Otter, 32);
        let p = t.resize_then_crop();
        let (rw, rh) = p.resized_size(40, 37);
        assert_eq!((rw, rh), (40, 37));
        let (mut tops, mut lefts) = (std::collections::BTreeSet::new(), std::collections::BTreeSet::new());
        for k in 0..300 {
            let mut got = Vec::new();
            t.train(&img, &mut RowRng::new(2, "augment/0", &k.to_string()), &mut got);
            // The same draws, by hand: row offset, then column offset (flip is off).
            let mut rng = RowRng::new(2, "augment/0", &k.to_string());
            let top = rng.below((rh - 32 + 1) as u64) as usize;
            let left = rng.below((rw - 32 + 1) as u64) as usize;
            let mut want = Vec::new();
            preprocess::push_normalised(&p.resize_crop_at(&img, left, top), CLIP_MEAN, CLIP_STD, false, &mut want);
            assert_eq!(got, want, "row {k}");
            tops.insert(top);
            lefts.insert(left);
        }
        assert_eq!((tops.first(), tops.last(), lefts.first(), lefts.last()), (Some(&0), Some(&5), Some(&0), Some(&8)));

        // pcmepp: NumPy's randint(spare) never gives `spare`, so a crop narrower than the image
        // never touches its right or bottom edge; both ends of 0..spare are reached.
        let mut rng = RowRng::new(4, "t", "x");
        let (mut first, mut last) = (false, false);
        for _ in 0..2000 {
            let (x, y, w, h) = pcmepp_crop(10, 10, &mut rng);
            assert!(w == 10 || x + w < 10, "{x} + {w}");
            assert!(h == 10 || y + h < 10, "{y} + {h}");
            first |= x == 0 && w < 10;
            last |= w < 10 && x + w == 9;
        }
        assert!(first && last);
        // And the training view is the reference's pipeline on the drawn crop.
        let t = transform(ImageTransformKind::Pcmepp, 16);
        let img = image(23, 19);
        let mut got = Vec::new();
        t.train(&img, &mut RowRng::new(1, "augment/0", "x"), &mut got);
        let mut rng = RowRng::new(1, "augment/0", "x");
        let crop = pcmepp_crop(23, 19, &mut rng);
        let flip = rng.below(2) == 1;
        let mut want = Vec::new();
        push_normalised_f32(&cv2_linear(&img, crop, 16), 16, IMAGENET_MEAN, IMAGENET_STD, flip, &mut want);
        assert_eq!(got, want);
    }

    #[test]
    fn cv2_linear_samples_at_pixel_centres_without_antialiasing() {
        // 4 -> 2: output pixel 0 reads f = 0.5 · 2 − 0.5 = 0.5, halfway between pixels 0 and 1
        // (no wider window); 2 -> 4: f = −0.25 is clamped to pixel 0, f = 0.25 mixes 0 and 1.
        let row = |v: &[u8]| Rgb8 { width: v.len(), height: 1, data: v.iter().flat_map(|&x| [x, x, x]).collect() };
        let down = cv2_linear(&row(&[0, 100, 200, 250]), (0, 0, 4, 1), 2);
        // Vertically 1 -> 2 rows: both read the one row.
        assert_eq!(down.iter().step_by(3).copied().collect::<Vec<f32>>(), [50.0, 225.0, 50.0, 225.0]);
        let up = cv2_linear(&row(&[0, 100]), (0, 0, 2, 1), 4);
        assert_eq!(up.iter().step_by(3).take(4).copied().collect::<Vec<f32>>(), [0.0, 25.0, 75.0, 100.0]);
        // A crop reads inside itself only: at its edge the last pixel alone, not the next one.
        // Vertically the same positions: a 1 x 2 column to 1 x 3 mixes rows 0 and 1 halfway.
        let column = Rgb8 { width: 1, height: 3, data: [10u8, 20, 250].iter().flat_map(|&x| [x, x, x]).collect() };
        let v = cv2_linear(&column, (0, 0, 1, 2), 3);
        assert_eq!(v.chunks(9).map(|r| r[0]).collect::<Vec<f32>>(), [10.0, 15.0, 20.0]);
        // 2 -> 3: f = −1/6 (pixel 0), 1/2 (halfway), 7/6 (past the crop's last pixel: it alone).
        let edge = cv2_linear(&row(&[10, 20, 250]), (0, 0, 2, 1), 3);
        assert_eq!(edge.iter().step_by(3).take(3).copied().collect::<Vec<f32>>(), [10.0, 15.0, 20.0]);
    }
}
