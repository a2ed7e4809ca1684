//! The image transforms of training and evaluation (`data.image_transform`), as each paper
//! defines them: how a training crop is drawn from a decoded image, and how an evaluation image
//! (zero-shot, `curate eval`) is prepared, both as normalised `[3, size, size]` CHW tensors.
//!
//! | `image_transform` | training view | evaluation view | mean/std |
//! | --- | --- | --- | --- |
//! | `random_resized_crop` (default) | RandomResizedCrop(`crop_scale`, `crop_ratio`) + flip | whole image to `size × size` | ImageNet |
//! | `otter` (`bow-and-otter.md` §5.8, §7 A9) | shorter side to `size · 256/224` (bicubic), random `size` crop, no flip | same resize, centre crop | CLIP |
//! | `pcmepp` (`cusa-and-pcmepp.md` §3.9) | crop of `r·W × r·H`, `r ~ U(0.6, 1)`, at a random place, to `size × size` (bilinear, aspect not kept) + flip | whole image to `size × size` (bilinear) | ImageNet |
//! | `clip` (`cusa-and-pcmepp.md` §2.6) | CLIP's evaluation transform: shorter side to `size` (bicubic), centre crop | the same | CLIP |
//!
//! `otter`, `pcmepp` and `clip` resample with [`crate::models::preprocess`]'s PIL-exact
//! resampler, so a view equals torchvision's on a PIL image given the same crop. The default
//! keeps the trainer's first sampler (bilinear at pixel centres, no antialiasing), so runs made
//! before the key existed evaluate as they trained. `flip` (probability 0.5) is each
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
    /// torchvision's RandomResizedCrop + RandomHorizontalFlip, ImageNet mean/std; evaluation
    /// resizes the whole image.
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
}

impl ImageTransform {
    /// The transform of a training file's `[data]` for the model's `image_size_px`.
    pub fn new(data: &DataConfig, size: usize) -> ImageTransform {
        let kind = data.image_transform;
        ImageTransform {
            kind,
            size,
            crop_scale: data.crop_scale.unwrap_or(super::config::DEFAULT_CROP_SCALE),
            crop_ratio: data.crop_ratio.unwrap_or(super::config::DEFAULT_CROP_RATIO),
            flip: data.flip.unwrap_or_else(|| kind.flips_by_default()),
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
                crop_to_chw(img, crop, self.size, flip, mean, std, dst);
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
                let (x, y, w, h) = pcmepp_crop(img.width, img.height, rng);
                let part = preprocess::crop(img, x, y, w, h);
                let view = preprocess::resize_to(&part, self.size, self.size, Interpolation::Bilinear);
                let flip = self.flip && rng.below(2) == 1;
                preprocess::push_normalised(&view, mean, std, flip, dst);
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
            ImageTransformKind::RandomResizedCrop => {
                crop_to_chw(img, (0, 0, img.width, img.height), self.size, false, mean, std, dst)
            }
            ImageTransformKind::Pcmepp => {
                let view = preprocess::resize_to(img, self.size, self.size, Interpolation::Bilinear);
                preprocess::push_normalised(&view, mean, std, false, dst);
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
        let (mean, std) = self.normalisation();
        crop_to_chw(img, crop, self.size, false, mean, std, dst);
    }
}

/// PCME++'s crop of an image `width × height`: one side ratio `r ~ U(0.6, 1)` for both sides
/// (`int(r · side)`, at least 1), at a uniform position. Returns `(x, y, w, h)`.
pub fn pcmepp_crop(width: usize, height: usize, rng: &mut RowRng) -> (usize, usize, usize, usize) {
    let [lo, hi] = PCMEPP_CROP_RANGE;
    let r = lo + (hi - lo) * unit(rng);
    let w = ((width as f64 * r) as usize).clamp(1, width);
    let h = ((height as f64 * r) as usize).clamp(1, height);
    let y = rng.below((height - h + 1) as u64) as usize;
    let x = rng.below((width - w + 1) as u64) as usize;
    (x, y, w, h)
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
}
