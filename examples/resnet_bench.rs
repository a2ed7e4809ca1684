//! Throughput of curate's ResNet-50 forward pass (random weights, burn's CPU backend or
//! `CURATE_BENCH_DEVICE=cuda` with the `cuda` feature): images/s at a batch size, after warm-up;
//! `--conv native|im2col` overrides the device's way of convolving; `--check N` first compares
//! the features of N images with burn's CPU backend (`host_conv`'s convolutions). Run by
//! `benches/resnet_bench.py`, which times torchvision on the same shapes and prints the ratio;
//! standalone: `cargo run --release --example resnet_bench -- --batch 32 --iters 5`.
//! `--train 1` times a training step's forward and backward instead (an autodiff device,
//! BatchNorm on batch statistics; no optimizer step).
//!
//! The last line of stdout is `images_per_s <value>`.

use burn::tensor::{Device, Tensor, TensorData};
use curate::models::resnet::{ConvLowering, ResNet, ResNetConfig};

#[path = "support/mod.rs"]
mod support;
use support::{flag_pairs, layout, number, random_weights, time_runs, Rng};

struct Args {
    batch: usize,
    iters: usize,
    warmup: usize,
    side: usize,
    lowering: Option<ConvLowering>,
    check: usize,
    train: bool,
}

fn parse() -> Args {
    let mut a = Args { batch: 32, iters: 5, warmup: 1, side: 224, lowering: None, check: 0, train: false };
    for (flag, value) in flag_pairs() {
        let v = || number(&flag, value.as_deref());
        match flag.as_str() {
            "--batch" => a.batch = v(),
            "--iters" => a.iters = v(),
            "--warmup" => a.warmup = v(),
            "--side" => a.side = v(),
            "--check" => a.check = v(),
            "--train" => a.train = v() != 0,
            "--conv" => {
                a.lowering = Some(match value.as_deref() {
                    Some("native") => ConvLowering::Native,
                    Some("im2col") => ConvLowering::Im2col,
                    _ => panic!("`--conv` needs `native` or `im2col`"),
                })
            }
            other => {
                panic!("unknown argument `{other}` (--batch, --iters, --warmup, --side, --conv, --check, --train)")
            }
        }
    }
    a
}

fn main() {
    let args = parse();
    // Training BatchNorm normalises by the batch's statistics, the CPU reference by its running
    // ones: their features differ whatever the convolutions do.
    assert!(!(args.train && args.check > 0), "`--check` compares inference features: leave out `--train`");
    let device = match std::env::var("CURATE_BENCH_DEVICE").as_deref() {
        #[cfg(feature = "cuda")]
        Ok("cuda") => Device::cuda(0),
        _ => Device::flex(),
    };
    let device = if args.train { device.autodiff() } else { device };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // torchvision's `resnet50()` state dict, BatchNorm the identity.
    let w = random_weights(layout("resnet50_layout.json", None), &mut rng);
    let mut model = ResNet::from_weights(&ResNetConfig::resnet50(), &w, &device);
    let reference = (args.check > 0).then(|| ResNet::from_weights(&ResNetConfig::resnet50(), &w, &Device::flex()));
    w.finish(&ResNet::IGNORED).expect("resnet50 layout");
    let lowering = args.lowering.unwrap_or(ConvLowering::for_device(&device));
    model = model.with_conv_lowering(lowering);
    let n = args.batch * 3 * args.side * args.side;
    let input: Vec<f32> = (0..n).map(|_| rng.next()).collect();
    if let Some(reference) = reference {
        let shape = [args.check.min(args.batch), 3, args.side, args.side];
        let part = input[..shape.iter().product::<usize>()].to_vec();
        let features = |m: &ResNet, d: &Device| {
            m.forward(Tensor::<4>::from_data(TensorData::new(part.clone(), shape), d))
                .into_data()
                .try_to_vec::<f32>()
                .expect("features")
        };
        let (got, want) = (features(&model, &device), features(&reference, &Device::flex()));
        let (mut abs, mut rel) = (0f32, 0f32);
        for (g, r) in got.iter().zip(&want) {
            abs = abs.max((g - r).abs());
            rel = rel.max((g - r).abs() / (1.0 + r.abs()));
        }
        let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        println!("check {} images against the CPU: max |diff| {abs:.3e}, max |diff|/(1+|cpu|) {rel:.3e}, max |cpu| {scale:.3e}", shape[0]);
    }
    let run = || {
        let x = Tensor::<4>::from_data(TensorData::new(input.clone(), [args.batch, 3, args.side, args.side]), &device);
        if args.train {
            let loss = model.forward(x).powi_scalar(2).mean();
            assert!(loss.clone().into_scalar::<f32>().is_finite());
            let _grads = loss.backward();
            // Wait for the device to finish the backward pass.
            device.sync().expect("the device runs the backward pass");
        } else {
            let out = model.forward(x).into_data().try_to_vec::<f32>().expect("features");
            assert!(out.iter().all(|v| v.is_finite()));
        }
    };
    let secs = time_runs(args.warmup, args.iters, run);
    let rate = (args.batch * args.iters) as f64 / secs;
    eprintln!(
        "curate resnet50{}: batch {}, {lowering:?} convolutions, {} iterations in {secs:.2} s, {} threads",
        if args.train { " training (forward + backward)" } else { "" },
        args.batch,
        args.iters,
        rayon::current_num_threads()
    );
    println!("images_per_s {rate:.2}");
}
