//! Image preprocessing against torchvision on PIL images (fixtures and the script that made
//! them: `tests/fixtures/images/make_preprocess_fixtures.py`).
//!
//! PNG decoding is lossless and the same in both, and the resampler reproduces PIL's
//! fixed-point arithmetic, so on PNGs the 8-bit image after Resize + CenterCrop must be
//! identical (sums, sums of squares, sampled pixels) and the normalised tensor equal to 1e-6
//! (the same f32 operations: `x / 255`, `- mean`, `/ std`; 1e-6 only allows for the JSON
//! round trip). JPEGs are decoded by different libraries (libjpeg-turbo in PIL, zune-jpeg in
//! the `image` crate), whose IDCT and chroma upsampling may round differently; there the
//! tolerance is the decoder's, see `jpeg_matches_within_the_decoders_rounding`.

use std::path::{Path, PathBuf};

use curate::models::preprocess::{decode, Preprocess};

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/images")
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir().join("preprocess_expected.json")).unwrap()).unwrap()
}

fn presets() -> [(&'static str, Preprocess); 2] {
    [("imagenet", Preprocess::imagenet()), ("clip", Preprocess::clip())]
}

/// Differences between curate and torchvision for one image and preset.
#[derive(Debug, Default)]
struct Diff {
    /// Largest |difference| of a sampled 8-bit pixel value.
    u8_max: i64,
    /// Largest |difference| of a channel's mean 8-bit value.
    u8_mean: f64,
    /// Largest |difference| of a sampled normalised value.
    f32_max: f32,
    /// Largest |difference| of a channel's sum of squares (exact integers).
    sum_sq: i64,
}

fn compare(name: &str, preset: &str, p: &Preprocess, e: &serde_json::Value) -> Diff {
    let bytes = std::fs::read(dir().join(name)).unwrap();
    let img = decode(&bytes).unwrap();
    let small = p.resize_crop(&img);
    assert_eq!((small.width, small.height), (224, 224), "{name} {preset}");
    let step_u8 = expected()["step_u8"].as_u64().unwrap() as usize;
    let step_f32 = expected()["step_f32"].as_u64().unwrap() as usize;
    let mut d = Diff::default();
    let px = |y: usize, x: usize, c: usize| small.data[(y * 224 + x) * 3 + c] as i64;
    for c in 0..3 {
        let (mut sum, mut sq) = (0i64, 0i64);
        for y in 0..224 {
            for x in 0..224 {
                sum += px(y, x, c);
                sq += px(y, x, c) * px(y, x, c);
            }
        }
        let want = e["u8_sum"][c].as_i64().unwrap();
        d.u8_mean = d.u8_mean.max((sum - want).abs() as f64 / (224.0 * 224.0));
        d.sum_sq = d.sum_sq.max((sq - e["u8_sum_sq"][c].as_i64().unwrap()).abs());
    }
    let hex = e["u8_sub"].as_str().unwrap().as_bytes();
    let mut k = 0;
    for y in (0..224).step_by(step_u8) {
        for x in (0..224).step_by(step_u8) {
            for c in 0..3 {
                let want = i64::from_str_radix(std::str::from_utf8(&hex[2 * k..2 * k + 2]).unwrap(), 16).unwrap();
                d.u8_max = d.u8_max.max((px(y, x, c) - want).abs());
                k += 1;
            }
        }
    }
    assert_eq!(2 * k, hex.len(), "{name} {preset}: sample count");
    let t = p.to_chw(&img);
    assert_eq!(t.len(), p.len());
    let want: Vec<f32> = e["f32_sub"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
    let mut k = 0;
    for c in 0..3 {
        for y in (0..224).step_by(step_f32) {
            for x in (0..224).step_by(step_f32) {
                d.f32_max = d.f32_max.max((t[c * 224 * 224 + y * 224 + x] - want[k]).abs());
                k += 1;
            }
        }
    }
    assert_eq!(k, want.len());
    eprintln!("{name} {preset}: {d:?}");
    d
}

#[test]
fn png_preprocessing_equals_torchvision_exactly() {
    // Python (make_preprocess_fixtures.py):
    //   img = Image.open(f).convert("RGB")
    //   small = Compose([Resize(256), CenterCrop(224)])(img)        # imagenet
    //   small = Compose([Resize(224, BICUBIC), CenterCrop(224)])(img) # clip
    //   tensor = Compose([ToTensor(), Normalize(mean, std)])(small)
    let e = expected();
    let mut checked = 0;
    for (name, entry) in e["images"].as_object().unwrap() {
        if !name.ends_with(".png") {
            continue;
        }
        checked += 1;
        for (preset, p) in presets() {
            let d = compare(name, preset, &p, &entry[preset]);
            assert_eq!((d.u8_max, d.u8_mean, d.sum_sq), (0, 0.0, 0), "{name} {preset}: 8-bit image differs: {d:?}");
            assert!(d.f32_max <= 1e-6, "{name} {preset}: normalised values differ: {d:?}");
            // The sum of the whole tensor, for every channel (f64 sums of the same f32 values).
            let t = p.to_chw(&decode(&std::fs::read(dir().join(name)).unwrap()).unwrap());
            for c in 0..3 {
                let s: f64 = t[c * 224 * 224..(c + 1) * 224 * 224].iter().map(|&v| v as f64).sum();
                let want = entry[preset]["f32_sum"][c].as_f64().unwrap();
                assert!((s - want).abs() < 1e-6 * want.abs().max(1.0), "{name} {preset} ch {c}: sum {s} vs {want}");
            }
        }
    }
    assert_eq!(checked, 4, "the fixture's PNGs");
}

#[test]
fn jpeg_matches_within_the_decoders_rounding() {
    // Same transforms as above. PIL decodes with libjpeg-turbo, curate with zune-jpeg. On a
    // grayscale JPEG the two agree but for a few ±1 IDCT roundings (1% of pixels). On a colour
    // (4:2:0) JPEG, chroma upsampling and YCbCr → RGB conversion round differently: measured on
    // `rgb_300x200.jpg`, 16% of decoded pixels differ, by at most 4 levels, with a bias of
    // +0.18 (R), −0.14 (G), +0.25 (B) levels on average. After resizing that leaves a sampled
    // pixel within 3/255 and a channel mean within 0.25/255 of torchvision's; the bounds below
    // allow that and no more — a real preprocessing mistake (a wrong filter, offset or
    // constant) moves the means by whole levels.
    let e = expected();
    let mut checked = 0;
    for (name, entry) in e["images"].as_object().unwrap() {
        if !name.ends_with(".jpg") {
            continue;
        }
        checked += 1;
        for (preset, p) in presets() {
            let d = compare(name, preset, &p, &entry[preset]);
            assert!(d.u8_max <= 3, "{name} {preset}: {d:?}");
            assert!(d.u8_mean <= 0.3, "{name} {preset}: {d:?}");
            assert!(d.f32_max <= 3.0 / 255.0 / 0.22 + 1e-6, "{name} {preset}: {d:?}");
        }
    }
    assert_eq!(checked, 2, "the fixture's JPEGs");
}

#[test]
fn cmyk_palette_and_16_bit_images_decode_as_pil_converts_them() {
    // make_decode_modes_fixture.py: PIL's `convert("RGB")` of each file. A CMYK JPEG agrees but
    // for the decoders' IDCT rounding; a palette PNG with a transparent index exactly. A 16-bit
    // grayscale PNG is scaled to 8 bits, where PIL clips it to white: on purpose.
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("decode_modes_expected.json")).unwrap()).unwrap();
    let hex = |s: &serde_json::Value| -> Vec<u8> {
        let s = s.as_str().unwrap();
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    };
    let decoded = |name: &str| decode(&std::fs::read(dir().join(name)).unwrap()).unwrap();
    let cmyk = decoded("cmyk_24x16.jpg");
    assert_eq!((cmyk.width, cmyk.height), (24, 16));
    let pil = hex(&e["cmyk_24x16.jpg"]["pil_rgb"]);
    let worst = cmyk.data.iter().zip(&pil).map(|(a, b)| a.abs_diff(*b)).max().unwrap();
    assert!(worst <= 2, "CMYK JPEG off by {worst}");
    assert_eq!(decoded("palette_24x16.png").data, hex(&e["palette_24x16.png"]["pil_rgb"]));
    let gray16 = decoded("gray16_24x16.png");
    assert_eq!(gray16.data, hex(&e["gray16_24x16.png"]["scaled_rgb"]));
    assert_ne!(gray16.data, hex(&e["gray16_24x16.png"]["pil_rgb"]), "PIL clips; curate scales");
}

#[test]
fn undecodable_bytes_are_an_error_not_a_panic() {
    assert!(decode(b"not an image").is_err());
    let png = std::fs::read(dir().join("rgb_37x23.png")).unwrap();
    assert!(decode(&png[..png.len() / 2]).is_err(), "truncated PNG");
    let img = decode(&png).unwrap();
    assert_eq!((img.width, img.height, img.data.len()), (37, 23, 37 * 23 * 3));
    // A JPEG cut short: its decoder would fill the rest with grey (PIL refuses it, "image file
    // is truncated"). Bytes after the end-of-image marker are not a cut.
    let jpeg = std::fs::read(dir().join("rgb_300x200.jpg")).unwrap();
    for keep in [jpeg.len() / 2, jpeg.len() - 2] {
        let e = decode(&jpeg[..keep]).unwrap_err();
        assert!(e.contains("JPEG data cut short"), "{keep} bytes: {e}");
    }
    let mut trailing = jpeg.clone();
    trailing.extend_from_slice(b"\x00\x00trailer");
    assert_eq!(decode(&trailing).unwrap(), decode(&jpeg).unwrap());
}

/// The papers' training transforms (`src/train/transform.rs`) for given draws, against their
/// references (`tests/fixtures/images/make_transform_fixtures.py`): `otter` against PIL
/// (resize the shorter side bicubic, crop at an offset; CLIP mean/std; PNGs, so the 8-bit views
/// must be identical) and `pcmepp` against PCME++'s loader (the float32 crop through OpenCV's
/// `INTER_LINEAR` resize, mirrored; ImageNet mean/std). Training views from their pieces,
/// evaluation views through `ImageTransform::test`.
#[test]
fn the_papers_transforms_equal_their_references_for_given_draws() {
    use curate::models::preprocess::{self, Interpolation, Rgb8, CLIP_MEAN, CLIP_STD, IMAGENET_MEAN, IMAGENET_STD};
    use curate::train::transform::{cv2_linear, push_normalised_f32, ImageTransform, ImageTransformKind};

    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("transform_expected.json")).unwrap()).unwrap();
    let mut counts = std::collections::BTreeMap::new();
    let mut pcmepp_max = 0f32;
    for case in e["cases"].as_array().unwrap() {
        let name = case["image"].as_str().unwrap();
        let (kind, view) = (case["transform"].as_str().unwrap(), case["view"].as_str().unwrap());
        let size = case["size"].as_u64().unwrap() as usize;
        let img = decode(&std::fs::read(dir().join(name)).unwrap()).unwrap();
        *counts.entry(format!("{kind} {view}")).or_insert(0) += 1;
        let step_f32 = size / 6 + 1;
        let sampled = |t: &[f32]| -> Vec<f32> {
            let mut v = Vec::new();
            for c in 0..3 {
                for y in (0..size).step_by(step_f32) {
                    for x in (0..size).step_by(step_f32) {
                        v.push(t[c * size * size + y * size + x]);
                    }
                }
            }
            v
        };
        let want: Vec<f32> = case["f32_sub"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap() as f32).collect();
        if kind == "pcmepp" {
            // Float views, OpenCV's generic path (IPP off): the same float32 operations, so the
            // same values, at every `size / 6 + 1`-th pixel and on the last row and column.
            let mut p: Vec<usize> = (0..size).step_by(step_f32).collect();
            if p.last() != Some(&(size - 1)) {
                p.push(size - 1);
            }
            let mut t = Vec::new();
            if view == "train" {
                let c: Vec<usize> =
                    case["crop"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                let flip = case["flip"].as_bool().unwrap();
                push_normalised_f32(
                    &cv2_linear(&img, (c[0], c[1], c[2], c[3]), size),
                    size,
                    IMAGENET_MEAN,
                    IMAGENET_STD,
                    flip,
                    &mut t,
                );
            } else {
                ImageTransform::of_kind(ImageTransformKind::Pcmepp, size).test(&img, &mut t);
            }
            let mut got = Vec::new();
            for c in 0..3 {
                for &y in &p {
                    for &x in &p {
                        got.push(t[c * size * size + y * size + x]);
                    }
                }
            }
            assert_eq!(got.len(), want.len());
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                pcmepp_max = pcmepp_max.max((g - w).abs());
                assert_eq!(g, w, "{name} pcmepp {view} {size}: value {k}");
            }
            for c in 0..3 {
                let sum: f64 = t[c * size * size..(c + 1) * size * size].iter().map(|&v| v as f64).sum();
                let w = case["f32_sum"][c].as_f64().unwrap();
                assert!(
                    (sum - w).abs() <= 1e-4 * (size * size) as f64,
                    "{name} pcmepp {view} {size}: channel {c} sum {sum} vs {w}"
                );
            }
            continue;
        }
        let otter = Preprocess {
            resize_px: (size as f64 * 256.0 / 224.0).round() as usize,
            crop_px: size,
            interpolation: Interpolation::Bicubic,
            mean: CLIP_MEAN,
            std: CLIP_STD,
        };
        let rrc =
            ImageTransform { antialias: true, ..ImageTransform::of_kind(ImageTransformKind::RandomResizedCrop, size) };
        let (u8_view, tensor): (Rgb8, Vec<f32>) = match (kind, view) {
            ("otter", "train") => {
                let (left, top) = (case["left"].as_u64().unwrap() as usize, case["top"].as_u64().unwrap() as usize);
                let v = otter.resize_crop_at(&img, left, top);
                let mut t = Vec::new();
                preprocess::push_normalised(&v, CLIP_MEAN, CLIP_STD, false, &mut t);
                (v, t)
            }
            ("otter", _) => {
                let mut t = Vec::new();
                ImageTransform::of_kind(ImageTransformKind::Otter, size).test(&img, &mut t);
                (otter.resize_crop(&img), t)
            }
            ("rrc_antialias", "train") => {
                let c: Vec<usize> =
                    case["crop"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
                let crop = (c[0], c[1], c[2], c[3]);
                let mut t = Vec::new();
                rrc.crop(&img, crop, &mut t);
                (preprocess::crop_resize(&img, crop, size, Interpolation::Bilinear), t)
            }
            ("rrc_antialias", _) => {
                let mut t = Vec::new();
                rrc.test(&img, &mut t);
                (preprocess::crop_resize(&img, (0, 0, img.width, img.height), size, Interpolation::Bilinear), t)
            }
            _ => panic!("unknown case {kind} {view}"),
        };
        assert_eq!((u8_view.width, u8_view.height, tensor.len()), (size, size, 3 * size * size), "{name} {view}");
        let px = |y: usize, x: usize, c: usize| u8_view.data[(y * size + x) * 3 + c] as i64;
        for c in 0..3 {
            let (mut sum, mut sq) = (0i64, 0i64);
            for y in 0..size {
                for x in 0..size {
                    sum += px(y, x, c);
                    sq += px(y, x, c) * px(y, x, c);
                }
            }
            assert_eq!(sum, case["u8_sum"][c].as_i64().unwrap(), "{name} {kind} {view} {size}: channel {c} sum");
            assert_eq!(sq, case["u8_sum_sq"][c].as_i64().unwrap(), "{name} {kind} {view} {size}: channel {c} squares");
        }
        let hex = case["u8_sub"].as_str().unwrap();
        let mut k = 0;
        for y in (0..size).step_by(size / 16 + 1) {
            for x in (0..size).step_by(size / 16 + 1) {
                for c in 0..3 {
                    let want = i64::from_str_radix(&hex[2 * k..2 * k + 2], 16).unwrap();
                    assert_eq!(px(y, x, c), want, "{name} {kind} {view} {size}: pixel ({x}, {y}) channel {c}");
                    k += 1;
                }
            }
        }
        assert_eq!(2 * k, hex.len());
        assert_eq!(sampled(&tensor), want, "{name} {kind} {view} {size}: normalised values");
    }
    eprintln!("pcmepp: largest difference from OpenCV {pcmepp_max:e}");
    let want: std::collections::BTreeMap<String, i32> = [
        ("otter test", 6),
        ("otter train", 18),
        ("pcmepp test", 6),
        ("pcmepp train", 12),
        ("rrc_antialias test", 6),
        ("rrc_antialias train", 18),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(counts, want, "the fixture's cases");
}
