//! Throughput of curate's FBNetV3 forward pass on the CPU (burn's flex backend, every core):
//! FBNetV3-A (`--arch a`, the default) or FBNetV3-C (`--arch c`), random weights in mobile-vision's
//! checkpoint layout (`tests/fixtures/models/fbnet/`), 224-px images,
//! images/s at a batch size after warm-up. No PyTorch peer: mobile-vision, whose models these
//! are, is not on PyPI. Run: `cargo run --release --example fbnet_bench -- --batch 32`.
//!
//! The last line of stdout is `images_per_s <value>`.

use burn::tensor::{Device, Tensor, TensorData};
use curate::models::fbnet::{FbNet, FbNetConfig};

#[path = "support/mod.rs"]
mod support;
use support::{flag_pairs, layout, number, random_weights, time_runs, Rng};

fn main() {
    let (mut arch, mut batch, mut iters, mut warmup) = ("a".to_string(), 32, 5, 1);
    for (flag, value) in flag_pairs() {
        let v = || number(&flag, value.as_deref());
        match flag.as_str() {
            "--batch" => batch = v(),
            "--iters" => iters = v(),
            "--warmup" => warmup = v(),
            "--arch" => arch = value.clone().unwrap_or_default(),
            other => panic!("unknown argument `{other}` (--arch a|c, --batch, --iters, --warmup)"),
        }
    }
    let config = match arch.as_str() {
        "a" => FbNetConfig::fbnetv3_a(),
        "c" => FbNetConfig::fbnetv3_c(),
        other => panic!("`--arch` is `a` or `c`, not `{other}`"),
    };
    let device = Device::flex();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let w = random_weights(layout(&format!("fbnet/fbnetv3_{arch}_layout.json"), None), &mut rng);
    let model = FbNet::from_weights(&config, &w, &device);
    w.finish(&FbNet::IGNORED).expect("FBNetV3 layout");
    let input: Vec<f32> = (0..batch * 3 * 224 * 224).map(|_| rng.next()).collect();
    let run = || {
        let x = Tensor::<4>::from_data(TensorData::new(input.clone(), [batch, 3, 224, 224]), &device);
        let out = model.forward(x).into_data().try_to_vec::<f32>().expect("features");
        assert!(out.iter().all(|v| v.is_finite()), "features are finite");
    };
    let secs = time_runs(warmup, iters, run);
    eprintln!(
        "curate FBNetV3-{arch}: batch {batch}, {iters} iterations in {secs:.2} s, {} threads",
        rayon::current_num_threads()
    );
    println!("images_per_s {:.2}", (batch * iters) as f64 / secs);
}
