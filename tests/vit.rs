//! ViT in both checkpoint layouts against its references (fixtures made by
//! `tests/fixtures/models/make_vit_fixtures.py`): a tiny whole CLIP from open_clip (image tower
//! under `visual.`, text tower ignored) and a tiny Unicom ViT from a PyTorch module written from
//! the CUSA spec §1.1 with Unicom's tensor names; a checkpoint that does not fit refused with
//! every problem; the full-size ViT-B/32 layouts of both.

mod common;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Tensor, TensorData};
use curate::models::vit::{Vit, VitConfig};
use curate::models::weights::Weights;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models")
}

fn json(name: &str) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join(name)).unwrap()).unwrap()
}

/// Runs the fixture input through `model`; asserts every output within `tol·(1 + |want|)` and
/// returns the largest |error|.
fn check(model: &Vit, device: &Device, key: &str, tol: f32, what: &str) -> f32 {
    let e = json("tiny_vit_expected.json");
    let shape: Vec<usize> = e["input_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let x = Tensor::<4>::from_data(
        TensorData::new(common::flat_f32(&e["input"]), [shape[0], shape[1], shape[2], shape[3]]),
        device,
    );
    let got = model.forward(x).into_data().try_to_vec::<f32>().unwrap();
    let want = common::flat_f32(&e[key]);
    assert_eq!(got.len(), want.len(), "{what}: size");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: {g} vs {w}");
        worst = worst.max((g - w).abs());
    }
    worst
}

#[test]
fn tiny_clip_image_tower_matches_open_clip() {
    // Python: open_clip.model.CLIP(8, CLIPVisionCfg(width=16, layers=2, head_width=4,
    // patch_size=8, image_size=32), tiny text cfg, quick_gelu=True).encode_image(x)
    //   = ln_post(transformer(ln_pre(cat[cls, conv1(x)] + pos)))[:, 0] @ proj
    for (name, device) in common::test_devices() {
        let model = Vit::load(&fixtures().join("tiny_clip.safetensors"), &VitConfig::tiny_clip(), &device).unwrap();
        assert_eq!(model.output_dim(), 8);
        let worst = check(&model, &device, "clip", common::tolerance(name, 1e-4), &format!("{name} clip"));
        eprintln!("{name}: tiny CLIP ViT max |error| {worst:e}");
    }
}

#[test]
fn tiny_unicom_matches_the_pytorch_reference() {
    // Python (make_vit_fixtures.py, UnicomViT.eval()): feature(norm(blocks(patch_embed(x) +
    // pos_embed)).flatten(1)), blocks pre-LN with ReLU6, BatchNorm1d from running statistics.
    for (name, device) in common::test_devices() {
        let model = Vit::load(&fixtures().join("tiny_unicom.safetensors"), &VitConfig::tiny_unicom(), &device).unwrap();
        assert_eq!(model.output_dim(), 8);
        let worst = check(&model, &device, "unicom", common::tolerance(name, 1e-4), &format!("{name} unicom"));
        eprintln!("{name}: tiny Unicom ViT max |error| {worst:e}");
    }
}

#[test]
fn tiny_unicom_loads_from_its_pytorch_checkpoint() {
    // Unicom releases `.pt` files (`torch.save` of a state dict): the same tensors saved so
    // (torch/make_torch_checkpoints.py) give the same model, bit for bit.
    let device = Device::flex();
    let pt = Vit::load(&fixtures().join("torch/tiny_unicom.pt"), &VitConfig::tiny_unicom(), &device).unwrap();
    let st = Vit::load(&fixtures().join("tiny_unicom.safetensors"), &VitConfig::tiny_unicom(), &device).unwrap();
    let e = json("tiny_vit_expected.json");
    let shape: Vec<usize> = e["input_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let x = || {
        Tensor::<4>::from_data(
            TensorData::new(common::flat_f32(&e["input"]), [shape[0], shape[1], shape[2], shape[3]]),
            &device,
        )
    };
    let a = pt.forward(x()).into_data().try_to_vec::<f32>().unwrap();
    let b = st.forward(x()).into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(a, b);
    check(&pt, &device, "unicom", 1e-4, "unicom from .pt");
}

#[test]
fn a_torchscript_clip_as_openai_released_it_loads_its_image_tower() {
    // torch/make_torch_checkpoints.py: OpenAI's own `clip.model.CLIP` (vision width 64, one
    // head, 2 layers, 8-px patches of 32-px images), traced with `encode_image` and
    // `encode_text` and saved in half precision, as `ViT-B-32.pt` is. The archive's text tower
    // is passed over; the image tower equals `encode_image`.
    let e = json("torch/openai_clip_jit_expected.json");
    let c = VitConfig { width: 64, heads: 1, mlp_dim: 256, ..VitConfig::tiny_clip() };
    let device = Device::flex();
    let model = Vit::load(&fixtures().join("torch/openai_clip_jit.pt"), &c, &device).unwrap();
    assert_eq!(model.output_dim(), 8);
    let shape: Vec<usize> = e["input_shape"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let x = Tensor::<4>::from_data(
        TensorData::new(common::flat_f32(&e["input"]), [shape[0], shape[1], shape[2], shape[3]]),
        &device,
    );
    let got = model.forward(x).into_data().try_to_vec::<f32>().unwrap();
    let want = common::flat_f32(&e["encode_image"]);
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "element {i}: {g} vs {w}");
    }
}

/// The tensors of a safetensors file as `(name, shape, values)`.
fn parts(file: &str) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(fixtures().join(file)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .filter(|(_, v)| v.dtype() == safetensors::Dtype::F32)
        .map(|(n, v)| {
            let data = v.data().chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
            (n, v.shape().to_vec(), data)
        })
        .collect()
}

/// Loads `parts` after removing `drop`, truncating the first axis of `shrink` by one and adding
/// `extra`; returns the refusal.
fn refusal(c: &VitConfig, file: &str, drop: &str, shrink: &str, extra: &str) -> String {
    let mut kept = Vec::new();
    for (n, mut shape, data) in parts(file) {
        if n == drop {
            continue;
        }
        if n == shrink {
            let row: usize = shape[1..].iter().product();
            shape[0] -= 1;
            kept.push((n, shape, data[row..].to_vec()));
        } else {
            kept.push((n, shape, data));
        }
    }
    kept.push((extra.to_owned(), vec![2], vec![0.0; 2]));
    let w = Weights::from_parts(kept);
    let model = Vit::from_weights(c, &w, &Device::flex());
    w.finish(model.ignored()).expect_err("refused").to_string()
}

#[test]
fn vit_checkpoints_that_do_not_fit_are_refused_with_every_problem() {
    let err = refusal(
        &VitConfig::tiny_clip(),
        "tiny_clip.safetensors",
        "visual.transformer.resblocks.1.mlp.c_proj.bias",
        "visual.transformer.resblocks.0.attn.in_proj_weight",
        "visual.transformer.resblocks.2.ln_1.weight",
    );
    assert!(err.contains("1 missing:\n    visual.transformer.resblocks.1.mlp.c_proj.bias [16]"), "{err}");
    assert!(
        err.contains(
            "1 mis-shaped:\n    visual.transformer.resblocks.0.attn.in_proj_weight: [47, 16], expected [48, 16]"
        ),
        "{err}"
    );
    // A third layer under `visual.` is not a text-tower tensor: reported, not ignored.
    assert!(err.contains("1 unexpected:\n    visual.transformer.resblocks.2.ln_1.weight"), "{err}");
    assert!(err.contains("hint:"), "{err}");

    let err = refusal(
        &VitConfig::tiny_unicom(),
        "tiny_unicom.safetensors",
        "feature.3.running_var",
        "feature.0.weight",
        "head.weight",
    );
    assert!(err.contains("1 missing:\n    feature.3.running_var [8]"), "{err}");
    assert!(err.contains("1 mis-shaped:\n    feature.0.weight: [15, 256], expected [16, 256]"), "{err}");
    assert!(err.contains("1 unexpected:\n    head.weight"), "{err}");
}

#[test]
fn a_bare_clip_image_tower_loads_and_reports_text_tower_names_as_unexpected() {
    // The image tower's tensors without `visual.` (as `model.visual.state_dict()`): the same
    // model; a text-tower tensor in such a file is not expected.
    let mut bare: Vec<_> = parts("tiny_clip.safetensors")
        .into_iter()
        .filter_map(|(n, s, d)| n.strip_prefix("visual.").map(|n| (n.to_owned(), s, d)))
        .collect();
    let w = Weights::from_parts(bare.clone());
    let model = Vit::from_weights(&VitConfig::tiny_clip(), &w, &Device::flex());
    w.finish(model.ignored()).unwrap();
    check(&model, &Device::flex(), "clip", 1e-4, "bare visual state dict");
    bare.push(("text_projection".into(), vec![2], vec![0.0; 2]));
    let w = Weights::from_parts(bare);
    let model = Vit::from_weights(&VitConfig::tiny_clip(), &w, &Device::flex());
    let err = w.finish(model.ignored()).expect_err("refused").to_string();
    assert!(err.contains("1 unexpected:\n    text_projection"), "{err}");
}

#[test]
fn vit_b32_presets_have_the_published_layouts() {
    // Every tensor of open_clip's ViT-B-32 CLIP state dict (both towers) and of Unicom's
    // ViT-B/32 (vit_b32_layout.json), zeros of exactly those shapes: nothing missing,
    // mis-shaped or unexpected (`num_batches_tracked` are integer buffers, never read).
    let layout = json("vit_b32_layout.json");
    for (key, config) in [("clip", VitConfig::vit_b32_clip()), ("unicom", VitConfig::vit_b32_unicom())] {
        let w = common::zeros_of_layout(layout[key].as_object().unwrap());
        let model = Vit::from_weights(&config, &w, &Device::flex());
        w.finish(model.ignored()).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!((model.output_dim(), config.patches()), (512, 49), "{key}");
    }
}
