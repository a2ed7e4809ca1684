//! Helpers for integration tests: run a pipeline written inline, read its outputs back by value.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::{Array, RecordBatch};
use curate::pipeline::{self, config::ConfigDoc, plan::compile_doc, RunOptions};

/// The devices the reference-equivalence tests run on: burn's flex CPU backend always, `ndarray`
/// when built with that feature, and the first GPU when built with `cuda` and run with
/// `CURATE_TEST_CUDA=1` (a cuda build on a machine without a GPU still runs the CPU checks).
pub fn test_devices() -> Vec<(&'static str, burn::tensor::Device)> {
    #[allow(unused_mut)]
    let mut devices = vec![("flex", burn::tensor::Device::flex())];
    #[cfg(feature = "ndarray")]
    devices.push(("ndarray", burn::tensor::Device::ndarray()));
    #[cfg(feature = "cuda")]
    if std::env::var_os("CURATE_TEST_CUDA").is_some_and(|v| v == "1") {
        devices.push(("cuda", burn::tensor::Device::cuda(0)));
    }
    devices
}

/// The tolerance of a reference comparison on the device named `device` (from [`test_devices`]),
/// given the one used on the CPU. On a GPU, cubecl multiplies f32 matrices on the tensor cores in
/// TF32 (10-bit mantissa, unit roundoff 2⁻¹¹ ≈ 4.9e-4) when the GPU has them, as PyTorch does
/// with `allow_tf32`: outputs then agree to a few 1e-4, and a wrong operation is still off by O(1).
pub fn tolerance(device: &str, cpu: f32) -> f32 {
    if device == "cuda" {
        cpu.max(5e-3)
    } else {
        cpu
    }
}

/// A checkpoint of zeros with every tensor of `layout` (name → shape, as the `*_layout.json`
/// fixtures list a published model's state dict), BatchNorm's integer `num_batches_tracked`
/// buffers left out: a model built from it must take exactly these names and shapes.
pub fn zeros_of_layout(layout: &serde_json::Map<String, serde_json::Value>) -> curate::models::weights::Weights {
    let parts: Vec<(String, Vec<usize>, Vec<f32>)> = layout
        .iter()
        .filter(|(k, _)| !k.ends_with("num_batches_tracked"))
        .map(|(k, v)| {
            let shape: Vec<usize> = v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            let n = shape.iter().product();
            (k.clone(), shape, vec![0.0; n])
        })
        .collect();
    curate::models::weights::Weights::from_parts(parts)
}

/// Every number of a (nested) JSON array, in order, as f32.
pub fn flat_f32(v: &serde_json::Value) -> Vec<f32> {
    match v {
        serde_json::Value::Array(a) => a.iter().flat_map(flat_f32).collect(),
        x => vec![x.as_f64().unwrap() as f32],
    }
}

/// Largest |got − want|, after asserting every element within `tol·(1 + |want|)`.
pub fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{what}: size");
    let mut worst = 0f32;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tol * (1.0 + w.abs()), "{what}: element {i}: {g} vs {w}");
        worst = worst.max((g - w).abs());
    }
    worst
}

pub fn fixture(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(rel).to_string_lossy().into_owned()
}

/// Runs the pipeline `toml` (with `{out}` replaced by a fresh temp folder) and returns the
/// folder, data rows and reject rows.
pub fn run_pipeline(toml: &str) -> (tempfile::TempDir, Vec<RecordBatch>, Vec<RecordBatch>) {
    let dir = tempfile::tempdir().unwrap();
    let text = toml.replace("{out}", &dir.path().join("out").to_string_lossy());
    let doc = ConfigDoc::parse(Path::new("test.toml"), text, &[]).unwrap_or_else(|d| panic!("{d:?}"));
    let plan = compile_doc(&doc).unwrap_or_else(|e| panic!("{e}"));
    pipeline::run(plan, &RunOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let data = read_dir(&dir.path().join("out/data"));
    let rejects = read_dir(&dir.path().join("out/rejects"));
    (dir, data, rejects)
}

/// `batch` written to `path` as one Parquet file.
pub fn write_parquet(path: &Path, batch: &RecordBatch) {
    let mut w =
        parquet::arrow::ArrowWriter::try_new(std::fs::File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Every file under `dir`, recursively (folders left out).
pub fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files_under(&p));
        } else {
            out.push(p);
        }
    }
    out
}

pub fn read_dir(dir: &Path) -> Vec<RecordBatch> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
    files.sort();
    files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "parquet"))
        .flat_map(|f| curate::io::parquet::read_file(f).unwrap())
        .collect()
}

/// Values of a string column over all batches (None for nulls).
pub fn col(batches: &[RecordBatch], name: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for b in batches {
        let c = b.column_by_name(name).unwrap_or_else(|| panic!("no column {name}"));
        let s = c.as_string::<i32>();
        for i in 0..s.len() {
            out.push(s.is_valid(i).then(|| s.value(i).to_owned()));
        }
    }
    out
}

/// Non-null values of a string column.
pub fn strs(batches: &[RecordBatch], name: &str) -> Vec<String> {
    col(batches, name).into_iter().map(|v| v.unwrap_or_else(|| panic!("null in {name}"))).collect()
}

/// `(reason, row)` of every reject.
pub fn reasons(rejects: &[RecordBatch]) -> Vec<(String, u64)> {
    let mut out = Vec::new();
    for b in rejects {
        let r = b.column_by_name("reason").unwrap().as_string::<i32>();
        let row = b.column_by_name("row").unwrap().as_primitive::<arrow_array::types::UInt64Type>();
        for i in 0..b.num_rows() {
            out.push((r.value(i).to_owned(), row.value(i)));
        }
    }
    out
}

/// A reader-only pipeline: `stage` (TOML of one read stage) then `write_parquet`.
pub fn read_only(stage: &str) -> String {
    format!("output_dir = \"{{out}}\"\n\n[[stage]]\n{stage}\n\n[[stage]]\ntype = \"write_parquet\"\n")
}

/// Copies the model folder `src` (`config.json`, `tokenizer.json`) into `dst` with its
/// `model.safetensors` broken three ways: tensor `missing` left out, tensor `misshaped` without
/// the last row of its first dimension, and a 2-element tensor `unexpected` added.
pub fn write_broken_model_folder(src: &Path, dst: &Path, missing: &str, misshaped: &str, unexpected: &str) {
    use safetensors::tensor::{Dtype, TensorView};
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut kept: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for (name, view) in st.tensors() {
        if name == missing {
            continue;
        }
        let shape = view.shape().to_vec();
        if name == misshaped {
            let keep = (shape[0] - 1) * shape[1..].iter().product::<usize>() * 4;
            let mut smaller = shape.clone();
            smaller[0] -= 1;
            kept.push((name, smaller, view.data()[..keep].to_vec()));
        } else {
            kept.push((name, shape, view.data().to_vec()));
        }
    }
    kept.push((unexpected.into(), vec![2], vec![0u8; 8]));
    let views: Vec<(String, TensorView)> =
        kept.iter().map(|(n, s, d)| (n.clone(), TensorView::new(Dtype::F32, s.clone(), d).unwrap())).collect();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dst.join(f)).unwrap();
    }
    safetensors::serialize_to_file(views, None, &dst.join("model.safetensors")).unwrap();
}

/// The model and data part of the tiny training configs (tiny ResNet, the bundled 2-layer BERT,
/// 16-px images, the bundled sample table). It ends inside `[data]`, so a config can add data
/// keys after it.
#[macro_export]
macro_rules! tiny_model_and_data {
    () => {
        r#"
[model]
embed_dim = 16
image_size_px = 16

[model.image]
preset = "tiny"

[model.text]
dir = "data/train_sample/text_model"
pretrained = false
max_tokens = 16

[data]
tables = ["data/train_sample/train.parquet"]
crop_scale = [0.5, 1.0]
"#
    };
}

/// A tiny run on the bundled sample (4 steps of 16): enough for tests that need a finished
/// `curate train` run, not for learning.
pub const TINY_RUN: &str = concat!(
    r#"
seed = 1
steps = 4
batch_size = 16
log_every = 1
checkpoint_every = 0
"#,
    tiny_model_and_data!(),
    r#"
[loss]
type = "infonce"

[optim]
optimizer = "adamw"
lr = 1e-3
"#
);

/// Trains the training file `toml` into `dir/run` (config in `dir/train.toml`); returns the run.
pub fn train_run(dir: &Path, toml: &str) -> PathBuf {
    let file = dir.join("train.toml");
    std::fs::write(&file, toml).unwrap();
    let run = dir.join("run");
    let c = curate::train::TrainConfig::load(&file, &[format!("output_dir={}", run.display())])
        .unwrap_or_else(|e| panic!("{e}"));
    curate::train::train(&c, &curate::train::TrainOptions { progress: false, ..Default::default() })
        .unwrap_or_else(|e| panic!("{e}"));
    run
}
