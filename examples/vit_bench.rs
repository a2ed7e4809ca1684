//! Throughput of curate's ViT-B/32 forward pass on the CPU (burn's flex backend, every core):
//! Unicom's layout (CUSA's image teacher, `--model unicom`, the default) or OpenAI CLIP's image
//! tower (`--model clip`), random weights in the published checkpoint's layout (so the linear
//! layers are loaded as from a real checkpoint), 224-px images, images/s at a batch size after
//! warm-up. Run by `benches/vit_bench.py`, which times the PyTorch model on the same shapes and
//! prints the ratio; standalone: `cargo run --release --example vit_bench -- --batch 32`.
//!
//! The last line of stdout is `images_per_s <value>`.

use burn::tensor::{Device, Tensor, TensorData};
use curate::models::vit::{Vit, VitConfig};

#[path = "support/mod.rs"]
mod support;
use support::{flag_pairs, layout, number, random_weights, time_runs, Rng};

struct Args {
    model: String,
    batch: usize,
    iters: usize,
    warmup: usize,
}

fn parse() -> Args {
    let mut a = Args { model: "unicom".into(), batch: 32, iters: 5, warmup: 1 };
    for (flag, value) in flag_pairs() {
        let v = || number(&flag, value.as_deref());
        match flag.as_str() {
            "--batch" => a.batch = v(),
            "--iters" => a.iters = v(),
            "--warmup" => a.warmup = v(),
            "--model" => a.model = value.clone().unwrap_or_default(),
            other => panic!("unknown argument `{other}` (--model unicom|clip, --batch, --iters, --warmup)"),
        }
    }
    a
}

fn main() {
    let args = parse();
    let config = match args.model.as_str() {
        "unicom" => VitConfig::vit_b32_unicom(),
        "clip" => VitConfig::vit_b32_clip(),
        other => panic!("`--model` is `unicom` or `clip`, not `{other}`"),
    };
    let device = Device::flex();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let w = random_weights(layout("vit_b32_layout.json", Some(&args.model)), &mut rng);
    let model = Vit::from_weights(&config, &w, &device);
    w.finish(model.ignored()).expect("ViT-B/32 layout");
    let side = config.image_size;
    let input: Vec<f32> = (0..args.batch * 3 * side * side).map(|_| rng.next()).collect();
    let run = || {
        let x = Tensor::<4>::from_data(TensorData::new(input.clone(), [args.batch, 3, side, side]), &device);
        let out = model.forward(x).into_data().try_to_vec::<f32>().expect("features");
        assert!(out.iter().all(|v| v.is_finite()), "features are finite");
    };
    let secs = time_runs(args.warmup, args.iters, run);
    eprintln!(
        "curate ViT-B/32 ({}): batch {}, {} iterations in {secs:.2} s, {} threads",
        args.model,
        args.batch,
        args.iters,
        rayon::current_num_threads()
    );
    println!("images_per_s {:.2}", (args.batch * args.iters) as f64 / secs);
}
