//! CLIP's towers from an open_clip model folder against open_clip itself (fixtures made by
//! `tests/fixtures/models/make_open_clip_fixtures.py`): the text transformer (causal mask,
//! end-of-text pooling) and the image tower with QuickGELU and with exact GELU, their token
//! states, the folder's BPE tokenizer against open_clip's ids, and ViT-B/32's full text layout.

mod common;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use curate::models::clip_text::{ClipText, ClipTextConfig, OpenClipConfig};
use curate::models::vit::{MlpActivation, Vit};

fn folder() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny_open_clip")
}

fn expected() -> serde_json::Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/tiny_open_clip_expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn config(activation: MlpActivation) -> OpenClipConfig {
    let mut c = OpenClipConfig::from_file(&folder().join("open_clip_config.json")).unwrap();
    assert_eq!(c.text.activation, MlpActivation::QuickGelu, "the folder says quick_gelu");
    c.text.activation = activation;
    c.vision.activation = activation;
    c
}

#[test]
fn the_text_tower_matches_open_clip_with_quick_gelu_and_gelu() {
    let e = expected();
    let ids: Vec<i64> = common::flat_f32(&e["ids"]).iter().map(|&x| x as i64).collect();
    let lengths: Vec<usize> = e["lengths"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let (b, n) = (lengths.len(), ids.len() / lengths.len());
    let weights = folder().join("open_clip_model.safetensors");
    for (name, device) in common::test_devices() {
        for (activation, key) in [(MlpActivation::QuickGelu, "text_quick_gelu"), (MlpActivation::Gelu, "text_gelu")] {
            let c = config(activation);
            let model = ClipText::load(&weights, &c.text, &device).unwrap();
            assert_eq!((model.width(), model.output_dim(), model.context_length()), (16, 8, 16));
            let input = || Tensor::<2, Int>::from_data(TensorData::new(ids.clone(), [b, n]), &device);
            let got = model.forward(input(), &lengths).into_data().try_to_vec::<f32>().unwrap();
            let tol = common::tolerance(name, 1e-4);
            let worst = common::assert_close(&got, &common::flat_f32(&e[key]), tol, &format!("{name} {key}"));
            eprintln!("{name} {key}: max |error| {worst:e}");
            if activation == MlpActivation::QuickGelu {
                let states = model.forward_tokens(input()).into_data().try_to_vec::<f32>().unwrap();
                common::assert_close(
                    &states,
                    &common::flat_f32(&e["text_tokens_quick_gelu"]),
                    tol,
                    &format!("{name} text tokens"),
                );
                // Padding is cut off: the rows' first tokens alone give the same embeddings
                // (the causal mask keeps later positions out of earlier ones).
                let short = lengths.iter().copied().max().unwrap();
                let cut: Vec<i64> = (0..b).flat_map(|r| ids[r * n..r * n + short].to_vec()).collect();
                let again = model
                    .forward(Tensor::<2, Int>::from_data(TensorData::new(cut, [b, short]), &device), &lengths)
                    .into_data()
                    .try_to_vec::<f32>()
                    .unwrap();
                common::assert_close(&again, &got, 1e-5, &format!("{name} without padding"));
            }
        }
    }
}

#[test]
fn the_image_tower_from_the_folder_matches_open_clip() {
    let e = expected();
    let shape: Vec<usize> =
        e["image_input_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let weights = folder().join("open_clip_model.safetensors");
    for (name, device) in common::test_devices() {
        let x = || {
            Tensor::<4>::from_data(
                TensorData::new(common::flat_f32(&e["image_input"]), [shape[0], shape[1], shape[2], shape[3]]),
                &device,
            )
        };
        for (activation, key) in [(MlpActivation::QuickGelu, "image_quick_gelu"), (MlpActivation::Gelu, "image_gelu")] {
            let c = config(activation);
            assert_eq!((c.vision.image_size, c.vision.patch_size, c.vision.heads, c.vision.output_dim), (32, 8, 4, 8));
            let model = Vit::load(&weights, &c.vision, &device).unwrap();
            let got = model.forward(x()).into_data().try_to_vec::<f32>().unwrap();
            let worst = common::assert_close(
                &got,
                &common::flat_f32(&e[key]),
                common::tolerance(name, 1e-4),
                &format!("{name} {key}"),
            );
            eprintln!("{name} {key}: max |error| {worst:e}");
            if activation == MlpActivation::QuickGelu {
                let tokens = model.forward_tokens(x()).into_data().try_to_vec::<f32>().unwrap();
                common::assert_close(
                    &tokens,
                    &common::flat_f32(&e["image_tokens_quick_gelu"]),
                    common::tolerance(name, 1e-4),
                    &format!("{name} image tokens"),
                );
            }
        }
    }
}

#[test]
fn the_folders_tokenizer_gives_open_clips_ids() {
    // CLIP's BPE in the folder's tokenizer.json, truncated at the context length with the
    // end-of-text token kept last, as open_clip's own tokenizer (ids padded with 0 there).
    let e = expected();
    let tok = curate::train::data::load_tokenizer(&folder(), 16).unwrap();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let (ids, mask, s) = curate::train::data::tokenize(&tok, &captions).unwrap();
    let want: Vec<i64> = common::flat_f32(&e["ids"]).iter().map(|&x| x as i64).collect();
    let lengths = e["lengths"].as_array().unwrap();
    assert_eq!(s, 16, "the longest caption fills the context");
    for (r, len) in lengths.iter().enumerate() {
        let len = len.as_u64().unwrap() as usize;
        assert_eq!(&ids[r * s..r * s + len], &want[r * 16..r * 16 + len], "caption {r}: {}", captions[r]);
        assert_eq!(mask[r * s..(r + 1) * s].iter().sum::<i64>() as usize, len, "caption {r}");
        // Padding with 0 (no `config.json` names a pad id), as open_clip pads.
        assert!(ids[r * s + len..(r + 1) * s].iter().all(|&i| i == 0), "caption {r}");
    }
    // SOT first, EOT (the largest id) last.
    assert_eq!((ids[0], ids[lengths[0].as_u64().unwrap() as usize - 1]), (812, 813));
}

#[test]
fn vit_b32_text_tower_has_the_published_layout() {
    // Every tensor of open_clip's ViT-B-32 state dict (vit_b32_layout.json, both towers), zeros
    // of those shapes: the text tower takes its own and leaves the image tower's.
    let layout: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/vit_b32_layout.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let w = common::zeros_of_layout(layout["clip"].as_object().unwrap());
    let model = ClipText::from_weights(&ClipTextConfig::vit_b32(), &w, &Device::flex());
    w.finish(model.ignored()).unwrap();
    assert_eq!((model.width(), model.output_dim(), model.context_length()), (512, 512, 77));
}
