//! What the image-encoder benchmarks (`resnet_bench`, `vit_bench`) share: a seeded generator for
//! values that do not matter, and random weights in a published checkpoint's layout.

use std::time::Instant;

use curate::models::weights::Weights;

/// The command line after the program name as `(flag, value)` pairs (`--batch 32 --iters 5`).
pub fn flag_pairs() -> Vec<(String, Option<String>)> {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    argv.chunks(2).map(|pair| (pair[0].clone(), pair.get(1).cloned())).collect()
}

/// `value` of `flag` as a count; panics naming the flag where it is missing or not a number.
pub fn number(flag: &str, value: Option<&str>) -> usize {
    value.and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("`{flag}` needs a number"))
}

/// Runs `run` `warmup` times untimed, then `iters` times; returns the seconds of the timed runs.
pub fn time_runs(warmup: usize, iters: usize, run: impl Fn()) -> f64 {
    for _ in 0..warmup {
        run();
    }
    let t = Instant::now();
    for _ in 0..iters {
        run();
    }
    t.elapsed().as_secs_f64()
}

/// xorshift64*: uniform in [-1, 1), enough for weights and pixels whose values do not matter.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40) as f32 / (1u64 << 23) as f32) - 1.0
    }
}

/// A layout fixture under `tests/fixtures/models/` (name → shape of every tensor of a published
/// state dict), the object under `key` when given.
pub fn layout(file: &str, key: Option<&str>) -> serde_json::Map<String, serde_json::Value> {
    let path = format!("{}/tests/fixtures/models/{file}", env!("CARGO_MANIFEST_DIR"));
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("layout fixture")).expect("layout JSON");
    if let Some(key) = key {
        v = v[key].take();
    }
    match v {
        serde_json::Value::Object(m) => m,
        _ => panic!("{path}: not a layout object"),
    }
}

/// Every tensor of `layout` as a checkpoint would hold it (PyTorch's `[out, in]` linear weights
/// included, so a model loads them as it loads a real checkpoint), filled so activations stay
/// finite: tensors of two or more axes uniform with He scale over all but the first axis,
/// normalisation scales and running variances 1, other vectors 0. BatchNorm's integer
/// `num_batches_tracked` is left out.
pub fn random_weights(layout: serde_json::Map<String, serde_json::Value>, rng: &mut Rng) -> Weights {
    let parts = layout
        .into_iter()
        .filter(|(k, _)| !k.ends_with("num_batches_tracked"))
        .map(|(k, v)| {
            let shape: Vec<usize> = v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
            let n: usize = shape.iter().product();
            let data = if shape.len() >= 2 {
                let scale = (6.0 / shape[1..].iter().product::<usize>() as f32).sqrt();
                (0..n).map(|_| rng.next() * scale).collect()
            } else if k.ends_with("running_var") || (k.ends_with("weight") && shape.len() == 1) {
                vec![1.0; n]
            } else {
                vec![0.0; n]
            };
            (k, shape, data)
        })
        .collect();
    Weights::from_parts(parts)
}
