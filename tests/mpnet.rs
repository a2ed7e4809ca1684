//! MPNet (all-mpnet-base-v2's architecture, CUSA's text teacher) against its references: a
//! random-weight `MPNetModel` from transformers and the sentence-transformers folder around it
//! (fixtures made by `tests/fixtures/models/make_mpnet_fixtures.py`); the relative position
//! buckets; a checkpoint that does not fit refused with every problem; the real-size layout.

mod common;

use std::path::{Path, PathBuf};

use burn::tensor::{Device, Int, Tensor, TensorData};
use curate::models::mpnet::{relative_position_bucket, MpNet, MpNetConfig};
use curate::models::text_encoder::TextEncoder;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models")
}

fn expected() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixtures().join("tiny_mpnet_expected.json")).unwrap()).unwrap()
}

fn flat_i64(v: &serde_json::Value) -> Vec<i64> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(flat_i64).collect(),
        x => vec![x.as_i64().unwrap()],
    }
}

#[test]
fn buckets_match_transformers_for_every_offset() {
    // Python: MPNetEncoder.relative_position_bucket(torch.arange(-400, 401)) (32 buckets, 128).
    let e = expected();
    let first = e["bucket_offsets"][0].as_i64().unwrap();
    let want = flat_i64(&e["buckets"]);
    let got: Vec<i64> = (0..want.len() as i64).map(|i| relative_position_bucket(first + i) as i64).collect();
    assert_eq!(got, want);
}

#[test]
fn tiny_mpnet_matches_transformers_token_states() {
    // Python: MPNetModel(...)(input_ids=ids, attention_mask=mask).last_hidden_state[:3], with
    // the padded ids (`<pad>` = 1) of the fixture; positions come from the ids.
    let e = expected();
    for (name, device) in common::test_devices() {
        let (model, config) = MpNet::load(&fixtures().join("tiny_mpnet"), &device).unwrap();
        assert_eq!(model.max_tokens(), config.max_position_embeddings - 2);
        let ids = flat_i64(&e["ids"]);
        let mask = flat_i64(&e["mask"]);
        let rows = e["states_rows"].as_u64().unwrap() as usize;
        let s = ids.len() / e["ids"].as_array().unwrap().len();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids[..rows * s].to_vec(), [rows, s]), &device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(mask[..rows * s].to_vec(), [rows, s]), &device);
        let got = model.forward(ids, mask).into_data().try_to_vec::<f32>().unwrap();
        // Padded positions too: transformers computes them like any other query.
        let tol = common::tolerance(name, 1e-4);
        let worst =
            common::assert_close(&got, &common::flat_f32(&e["states"]), tol, &format!("{name} last_hidden_state"));
        eprintln!("{name}: tiny MPNet token states: max |error| {worst:e}");
    }
}

#[test]
fn tiny_mpnet_folder_matches_sentence_transformers() {
    // Python: SentenceTransformer("tiny_mpnet").encode(captions) — Transformer (max_seq_length
    // 20) → Pooling(mean) → Normalize, as in all-mpnet-base-v2's modules.json.
    let e = expected();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    for (name, device) in common::test_devices() {
        let enc = TextEncoder::load(&fixtures().join("tiny_mpnet"), None, None, &device).unwrap();
        assert_eq!((enc.dim, enc.max_tokens()), (16, e["max_seq_length"].as_u64().unwrap() as usize));
        let (ids, mask, [b, s]) = enc.tokenize(&captions).unwrap();
        assert_eq!((b, s), (captions.len(), e["ids"][0].as_array().unwrap().len()), "padded to longest, truncated");
        assert_eq!(ids, flat_i64(&e["ids"]), "token ids as sentence-transformers, padded with <pad> = 1");
        assert_eq!(mask, flat_i64(&e["mask"]));
        let got = enc.encode(&captions).unwrap();
        let tol = common::tolerance(name, 1e-4);
        let worst = common::assert_close(&got, &common::flat_f32(&e["embeddings"]), tol, &format!("{name} embeddings"));
        eprintln!("{name}: tiny MPNet sentence embeddings: max |error| {worst:e}");
        // One caption at a time (no padding) gives the same embedding as in the padded batch.
        for (i, c) in captions.iter().enumerate() {
            let one = enc.encode(&[c]).unwrap();
            common::assert_close(
                &one,
                &got[i * enc.dim..(i + 1) * enc.dim],
                common::tolerance(name, 1e-5),
                &format!("{name} caption {i} alone"),
            );
        }
    }
}

#[test]
fn an_mpnet_checkpoint_that_does_not_fit_is_refused_with_every_problem() {
    // Missing, mis-shaped (one row short) and unexpected tensors, all in one checkpoint.
    let dir = tempfile::tempdir().unwrap();
    common::write_broken_model_folder(
        &fixtures().join("tiny_mpnet"),
        dir.path(),
        "encoder.layer.1.attention.attn.o.bias",
        "encoder.relative_attention_bias.weight",
        "encoder.layer.0.attention.attn.extra.weight",
    );
    let err = TextEncoder::load(dir.path(), None, None, &Device::flex()).err().expect("refused").to_string();
    assert!(err.contains("1 missing:\n    encoder.layer.1.attention.attn.o.bias [16]"), "{err}");
    assert!(
        err.contains("1 mis-shaped:\n    encoder.relative_attention_bias.weight: [31, 4], expected [32, 4]"),
        "{err}"
    );
    assert!(err.contains("1 unexpected:\n    encoder.layer.0.attention.attn.extra.weight"), "{err}");
    assert!(err.contains("hint:"), "{err}");
}

#[test]
fn mpnet_base_has_all_mpnet_base_v2s_exact_layout() {
    // Every tensor of transformers' MPNetModel(vocab 30527, 514 positions) state dict, by name
    // and shape (mpnet_base_layout.json): nothing missing, mis-shaped or unexpected (`pooler`
    // is left out on purpose).
    let layout: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixtures().join("mpnet_base_layout.json")).unwrap()).unwrap();
    let w = common::zeros_of_layout(&layout);
    let model = MpNet::from_weights(&MpNetConfig::base(), &w, &Device::flex());
    w.finish(&MpNet::IGNORED).unwrap();
    assert_eq!(model.max_tokens(), 512);
}

#[test]
fn unknown_model_types_are_refused_with_the_supported_list() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), r#"{"model_type": "gpt2"}"#).unwrap();
    let err = TextEncoder::load(dir.path(), None, None, &Device::flex()).err().expect("refused").to_string();
    assert!(err.contains("model_type `gpt2`") && err.contains("`mpnet`") && err.contains("`roberta`"), "{err}");
}
