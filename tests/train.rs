//! `curate train` on the bundled sample (`data/train_sample`, made by `data/gen_train_sample.py`)
//! with tiny sizes: 16-px crops, batches of 8, a few steps — seconds in a debug build.

#[macro_use]
mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Int, Tensor, TensorData};
use curate::error::Location;
use curate::losses::common::DirectionReduction;
use curate::losses::infonce::infonce;
use curate::losses::LossType;
use curate::train::data::{BatchMaker, Loader, TrainSet};
use curate::train::dual_encoder::{DualEncoder, Heads};
use curate::train::transform::{ImageTransform, ImageTransformKind};
use curate::train::zeroshot::{class_prompt, hit_at_k, parse_classes};
use curate::train::{train, TrainConfig, TrainOptions};
use curate::Error;

const BASE: &str = concat!(
    r#"
seed = 3
steps = 6
batch_size = 8
log_every = 1
checkpoint_every = 3
"#,
    tiny_model_and_data!(),
    r#"teacher_image = "data/train_sample/teacher_image.parquet"
teacher_text = "data/train_sample/teacher_text.parquet"

[loss]
type = "infonce"

[optim]
optimizer = "adamw"
lr = 1e-3
"#
);

/// The base config written into `dir`, with `--set` overrides; output under `dir/out`.
fn config(dir: &Path, sets: &[&str]) -> TrainConfig {
    let file = dir.join("train.toml");
    std::fs::write(&file, BASE).unwrap();
    let mut overrides = vec![format!("output_dir={}", dir.join("out").display())];
    overrides.extend(sets.iter().map(|s| s.to_string()));
    TrainConfig::load(&file, &overrides).unwrap_or_else(|e| panic!("{e}"))
}

/// [`config`] without the teacher feature tables.
fn config_without_teachers(dir: &Path, sets: &[&str]) -> TrainConfig {
    let file = dir.join("plain.toml");
    let text: String = BASE.lines().filter(|l| !l.starts_with("teacher_")).map(|l| format!("{l}\n")).collect();
    assert!(!text.contains("teacher_"));
    std::fs::write(&file, text).unwrap();
    let mut overrides = vec![format!("output_dir={}", dir.join("out").display())];
    overrides.extend(sets.iter().map(|s| s.to_string()));
    TrainConfig::load(&file, &overrides).unwrap_or_else(|e| panic!("{e}"))
}

/// A run of `sets` on [`config_without_teachers`] in `dir`: the model it started from (its seeded
/// initialisation) and the finished run.
fn start_and_end(dir: &Path, sets: &[&str]) -> (DualEncoder, curate::train::trained::TrainedRun) {
    let c = config_without_teachers(dir, sets);
    train(&c, &TrainOptions::default()).unwrap();
    let init = DualEncoder::init(&c.model, Heads::default(), c.seed, &Device::flex()).unwrap();
    let run = curate::train::trained::TrainedRun::load(&dir.join("out"), &Device::flex()).unwrap();
    (init, run)
}

/// `(step, loss)` lines of a run.
type Losses = Vec<(u64, f64)>;

/// A run made by `make` (given its folder) trained whole, and the same run stopped after `stop`
/// steps and resumed: the whole run's folder and the `(step, loss)` lines of both.
fn whole_and_resumed(make: impl Fn(&Path) -> TrainConfig, stop: u64) -> (tempfile::TempDir, Losses, Losses) {
    let whole = tempfile::tempdir().unwrap();
    train(&make(whole.path()), &TrainOptions::default()).unwrap();
    let parts = tempfile::tempdir().unwrap();
    let c = make(parts.path());
    train(&c, &TrainOptions { stop_after: Some(stop), ..Default::default() }).unwrap();
    train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    let (want, got) = (losses(&whole.path().join("out")), losses(&parts.path().join("out")));
    (whole, want, got)
}

/// `(step, loss)` of the training lines of `metrics.jsonl`.
fn losses(out: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("loss").is_some())
        .map(|v| (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap()))
        .collect()
}

/// The base config's first batch (from `dir`), and its model inputs on `device`.
fn first_batch(dir: &Path, device: &Device) -> (TrainConfig, impl Fn() -> (Tensor<4>, Tensor<2, Int>, Tensor<2, Int>)) {
    let c = config(dir, &[]);
    let set = Arc::new(TrainSet::load(&c).unwrap());
    let maker = BatchMaker::new(set, &c).unwrap();
    let batch = maker.make(0, &maker.epoch_order(0)).unwrap();
    let (b, s, device) = (batch.rows.len(), c.model.image_size_px, device.clone());
    let inputs = move || {
        let images = Tensor::<4>::from_data(TensorData::new(batch.images.clone(), [b, 3, s, s]), &device);
        let ids = Tensor::<2, Int>::from_data(TensorData::new(batch.ids.clone(), [b, batch.seq]), &device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(batch.mask.clone(), [b, batch.seq]), &device);
        (images, ids, mask)
    };
    (c, inputs)
}

#[test]
fn a_few_steps_reduce_the_loss_on_a_fixed_batch() {
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let (c, inputs) = first_batch(dir.path(), &device);
    let mut model = DualEncoder::init(&c.model, Heads::default(), 0, &device).unwrap();
    let mut optim = burn::optim::AdamWConfig::new().init();
    let mut values = Vec::new();
    for _ in 0..8 {
        let (images, ids, mask) = inputs();
        let e = model.forward(images, ids, mask);
        let scale = curate::losses::common::scalar(10.0, &device);
        let loss = infonce(e.image, e.text, scale, DirectionReduction::Mean);
        values.push(loss.clone().into_scalar::<f32>());
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model, grads);
    }
    assert!(values.iter().all(|v| v.is_finite()), "{values:?}");
    assert!(values[7] < values[0] * 0.8, "loss did not fall: {values:?}");
}

#[test]
fn every_loss_trains_and_writes_its_outputs() {
    for t in LossType::ALL {
        let dir = tempfile::tempdir().unwrap();
        let ty = format!("loss.type={t}");
        let mut sets = vec![ty.as_str(), "steps=2", "checkpoint_every=0"];
        if t == LossType::MemoryBank {
            sets.push("loss.size=16");
        }
        if t == LossType::Pcmepp {
            sets.push("data.msda={mix_ratio = 0.5}");
        }
        let c = config(dir.path(), &sets);
        let s = train(&c, &TrainOptions::default()).unwrap_or_else(|e| panic!("{t}: {e}"));
        assert!(s.last_loss.is_finite(), "{t}");
        let out = dir.path().join("out");
        assert_eq!(losses(&out).len(), 2, "{t}");
        assert!(out.join("config.json").is_file() && out.join("model.bpk").is_file(), "{t}");
        let resolved: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
        assert_eq!(resolved["loss"]["type"], t.name());
    }
}

#[test]
fn the_memory_banks_first_step_is_infonce_against_a_teacher_that_saw_the_same_batch() {
    // At step 1 the EMA teacher is still the trainee (a copy, averaged with itself) and the bank
    // holds only the teacher's features of this batch, so eqs. 1-3 reduce to InfoNCE at the same
    // temperature. A teacher that saw other images, other captions or another batch would part
    // the two losses; so would a teacher with other weights.
    let first_loss = |sets: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let mut all = vec!["steps=1", "checkpoint_every=0", "loss.temperature=0.05"];
        all.extend(sets);
        train(&config(dir.path(), &all), &TrainOptions::default()).unwrap();
        losses(&dir.path().join("out"))
    };
    let bank = first_loss(&["loss.type=memory_bank", "loss.size=16"]);
    let plain = first_loss(&["loss.type=infonce", "loss.learnable_temperature=false"]);
    assert_eq!((bank.len(), plain.len()), (1, 1));
    let (a, b) = (bank[0].1, plain[0].1);
    assert!(a.is_finite() && (a - b).abs() <= 1e-5 * b.abs(), "memory_bank {a} vs infonce {b}");
}

#[test]
fn an_ema_teachers_forward_leaves_the_students_batchnorm_statistics() {
    // At a rate of 1e-30 no weight moves (by more than a rounding), so the student's BatchNorm
    // running statistics depend on the batches alone: after OTTER, KD and memory-bank runs, whose EMA teacher (in training mode, spec §5.6) sees
    // every batch too, they must be those of an InfoNCE run. A teacher sharing them with the
    // student (burn's `clone`) would update them twice a step.
    let image_features = |loss: &str| {
        let dir = tempfile::tempdir().unwrap();
        let ty = format!("loss.type={loss}");
        let mut sets = vec![ty.as_str(), "steps=3", "checkpoint_every=0", "optim.lr=1e-30"];
        if loss == "memory_bank" {
            sets.push("loss.size=16");
        }
        let c = config(dir.path(), &sets);
        train(&c, &TrainOptions::default()).unwrap_or_else(|e| panic!("{loss}: {e}"));
        let run = curate::train::trained::TrainedRun::load(&dir.path().join("out"), &Device::flex()).unwrap();
        let s = run.image_size();
        let pixels: Vec<f32> = (0..2 * 3 * s * s).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect();
        run.embed_images(pixels, 2).unwrap()
    };
    let plain = image_features("infonce");
    for loss in ["otter", "kd", "memory_bank"] {
        let got = image_features(loss);
        let worst = got.iter().zip(&plain).map(|(a, b)| (a - b).abs() / (1e-3 + b.abs())).fold(0f32, f32::max);
        println!("{loss}: largest relative difference {worst:e}");
        assert!(worst < 1e-5, "{loss}: the teacher moved the student's statistics ({worst:e})");
    }
}

#[test]
fn resume_reproduces_the_losses_of_an_uninterrupted_run() {
    // Memory bank: the checkpoint must carry the model, both optimisers (SGD momentum), the EMA
    // teacher, the bank and the EMA count for the losses to match bit for bit.
    let sets = ["loss.type=memory_bank", "loss.size=16", "loss.momentum=0.9", "optim.optimizer=sgd", "optim.lr=0.05"];
    let whole = tempfile::tempdir().unwrap();
    let c = config(whole.path(), &sets);
    train(&c, &TrainOptions::default()).unwrap();
    let want = losses(&whole.path().join("out"));
    assert_eq!(want.len(), 6);

    let parts = tempfile::tempdir().unwrap();
    let c = config(parts.path(), &sets);
    let out = parts.path().join("out");
    train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    assert!(!out.join("model.bpk").exists(), "a stopped run has no final model");
    // The run stopped after step 4; the last checkpoint is step 3, so step 4 is trained again.
    assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 3);
    // Another worker count: batches do not depend on it.
    let s = train(&c, &TrainOptions { resume: true, workers: 3, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (3, 6), "steps 4 to 6 trained");
    assert_eq!(losses(&out), want);
    // And the same model, BatchNorm running statistics included (a checkpoint holds its own
    // step's, not the step before's): the saved models embed images alike, in eval mode.
    let embed = |dir: &Path| {
        let run = curate::train::trained::TrainedRun::load(&dir.join("out"), &Device::flex()).unwrap();
        let s = run.image_size();
        let pixels: Vec<f32> = (0..2 * 3 * s * s).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        run.embed_images(pixels, 2).unwrap()
    };
    assert_eq!(embed(parts.path()), embed(whole.path()), "the resumed run's model differs");

    // A changed config is refused on resume.
    let changed = config(parts.path(), &[&sets[..], &["optim.lr=0.01"]].concat());
    let e = train(&changed, &TrainOptions { resume: true, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("differs") && e.to_string().contains("`optim.lr`: 0.05 then, 0.01 now"), "{e}");

    // A checkpoint whose state was edited (or comes from another run) is refused, not used to
    // write outside the bank or to train no steps.
    let edited = tempfile::tempdir().unwrap();
    let c = config(edited.path(), &sets);
    train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    let state = edited.path().join("out/checkpoints/step-00000003/state.json");
    let text = std::fs::read_to_string(&state).unwrap();
    for (key, value, says) in [
        ("/bank/next", 16, "do not hold a memory bank of this run (16 slots of"),
        ("/bank/size", 17, "do not hold a memory bank of this run (16 slots of"),
        ("/step", 99, "its state.json is at step 99, its name at step 3, and the run has 6 steps"),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        *v.pointer_mut(key).unwrap() = value.into();
        std::fs::write(&state, v.to_string()).unwrap();
        let e = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap_err().to_string();
        assert!(e.contains(says), "{key}: {e}");
    }
}

/// The lines of `metrics.jsonl` without their timing (`samples_per_s`).
fn metric_lines(out: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object_mut().unwrap().remove("samples_per_s");
            v
        })
        .collect()
}

#[test]
fn a_resumed_run_logs_the_zero_shot_lines_of_an_uninterrupted_one() {
    // A checkpoint is saved before its step's zero-shot evaluation: a run killed between the
    // two lost that line for good, since a resumed run evaluated only from step 0.
    let sets = [
        "eval.images=data/train_sample/zeroshot.parquet",
        "eval.classes=data/train_sample/classes.txt",
        "eval.every_steps=3",
    ];
    let whole = tempfile::tempdir().unwrap();
    train(&config(whole.path(), &sets), &TrainOptions::default()).unwrap();
    let want = metric_lines(&whole.path().join("out"));
    let zeroshot_steps: Vec<u64> =
        want.iter().filter(|v| v.get("zeroshot_top1").is_some()).map(|v| v["step"].as_u64().unwrap()).collect();
    assert_eq!(zeroshot_steps, [0, 3, 6]);
    for killed_before_eval in [false, true] {
        let parts = tempfile::tempdir().unwrap();
        let c = config(parts.path(), &sets);
        let out = parts.path().join("out");
        train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
        assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 3);
        if killed_before_eval {
            // What a kill right after checkpoint 3 leaves: nothing of step 3's evaluation.
            let log = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
            let kept: String = log
                .lines()
                .filter(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    v["step"].as_u64().unwrap() <= 3 && !(v["step"] == 3 && v.get("zeroshot_top1").is_some())
                })
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(out.join("metrics.jsonl"), kept).unwrap();
        }
        train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
        assert_eq!(metric_lines(&out), want, "killed before step 3's evaluation: {killed_before_eval}");
    }
}

#[test]
fn a_second_run_into_a_folder_in_use_is_refused() {
    // Two runs in one folder would interleave their metrics and checkpoints.
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &["steps=2", "checkpoint_every=0"]);
    std::fs::create_dir_all(&c.output_dir).unwrap();
    let held = curate::io::lock_folder(&c.output_dir).unwrap();
    let e = train(&c, &TrainOptions::default()).unwrap_err().to_string();
    assert!(e.contains("another curate run is writing to"), "{e}");
    assert!(!c.output_dir.join("metrics.jsonl").exists(), "nothing written");
    drop(held);
    train(&c, &TrainOptions::default()).unwrap();
    assert_eq!(losses(&c.output_dir).len(), 2);
}

#[test]
fn resume_refuses_to_start_over_on_a_finished_run_without_checkpoints() {
    // Starting from step 0 would remove the final model that `--resume` asked to go on from.
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &["steps=2", "checkpoint_every=0"]);
    train(&c, &TrainOptions::default()).unwrap();
    let model = dir.path().join("out/model.bpk");
    let before = std::fs::read(&model).unwrap();
    let e = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("holds a finished run (model.bpk) and no checkpoint"), "{e}");
    assert!(e.contains("leave out `--resume`"), "{e}");
    assert_eq!(std::fs::read(&model).unwrap(), before, "the finished run is kept");
    // Into an empty folder, `--resume` starts from step 0, as before.
    let fresh = tempfile::tempdir().unwrap();
    let c = config(fresh.path(), &["steps=2", "checkpoint_every=0"]);
    train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!(losses(&fresh.path().join("out")).len(), 2);
}

#[test]
fn a_run_from_step_0_does_not_keep_an_earlier_runs_checkpoints() {
    // Seed 0 trains 6 steps into a folder (checkpoints at 2 and 4); seed 1 then stops after 3 in
    // the same folder (a checkpoint at 2): its resume must go on from its own step, not from
    // seed 0's checkpoints or model.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    train(&config(dir.path(), &["checkpoint_every=2"]), &TrainOptions::default()).unwrap();
    assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 4);
    // What `curate eval RUN_DIR` writes: the scores of seed 0's model.
    std::fs::create_dir_all(out.join("eval")).unwrap();
    std::fs::write(out.join("eval/metrics.json"), "{}").unwrap();
    // A run that fails on its data (batches larger than the set) leaves all of that be.
    let e = train(&config(dir.path(), &["batch_size=100000"]), &TrainOptions::default()).unwrap_err();
    assert!(e.to_string().contains("fewer than one batch of 100000"), "{e}");
    assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 4, "seed 0's checkpoints stay");
    assert!(out.join("model.bpk").exists() && out.join("eval/metrics.json").exists());
    let config_json = std::fs::read_to_string(out.join("config.json")).unwrap();
    assert!(!config_json.contains("100000"), "the failed run's config is not written");
    let other = config(dir.path(), &["checkpoint_every=2", "seed=1"]);
    train(&other, &TrainOptions { stop_after: Some(3), ..Default::default() }).unwrap();
    assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 2, "seed 0's step 4 is gone");
    assert!(!out.join("model.bpk").exists(), "seed 0's final model is gone");
    assert!(!out.join("eval").exists(), "seed 0's evaluation is gone");
    train(&other, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    let fresh = tempfile::tempdir().unwrap();
    train(&config(fresh.path(), &["checkpoint_every=2", "seed=1"]), &TrainOptions::default()).unwrap();
    assert_eq!(losses(&out), losses(&fresh.path().join("out")));
}

#[test]
fn a_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &["checkpoint_every=2"]);
    let e = train(&c, &TrainOptions { inject_nan_at: Some(5), ..Default::default() }).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("the loss is NaN at step 5"), "{msg}");
    assert!(msg.contains("step-00000004") && msg.contains("hint:"), "{msg}");
    let out = dir.path().join("out");
    assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 4);
    assert!(!out.join("model.bpk").exists());
    // The bad step was not applied: resuming continues from step 4.
    train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!(losses(&out).iter().map(|l| l.0).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5, 6]);
}

#[test]
fn config_errors_are_reported_at_once_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    let text = BASE
        .replace("batch_size = 8", "batch_size = \"eight\"")
        .replace("type = \"infonce\"", "type = \"infonce\"\ntemprature = 0.02")
        .replace("preset = \"tiny\"", "preset = \"tiny\"\ncheckpoint = \"nowhere.safetensors\"");
    std::fs::write(&file, format!("output_dir = \"out\"\n{text}")).unwrap();
    let e = TrainConfig::load(&file, &[]).unwrap_err();
    let Error::Config(diags) = &e else { panic!("{e}") };
    let line_of = |needle: &str| {
        let d = diags.iter().find(|d| d.message.contains(needle)).unwrap_or_else(|| panic!("{needle}: {e}"));
        match &d.location {
            Some(Location::File { line, path, .. }) if path == &file => *line,
            other => panic!("{needle}: {other:?}"),
        }
    };
    let source = std::fs::read_to_string(&file).unwrap();
    let line = |s: &str| source.lines().position(|l| l.contains(s)).unwrap() + 1;
    assert_eq!(line_of("batch_size"), line("batch_size = \"eight\""));
    assert_eq!(line_of("temprature"), line("temprature"));
    let d = diags.iter().find(|d| d.message.contains("temprature")).unwrap();
    assert_eq!(d.hint.as_deref(), Some("did you mean `temperature`?"));
    // Checks of the rest (paths, sizes) come in the same report; none of the dropped keys.
    let want = format!("bad.toml:{}:", line("nowhere.safetensors"));
    assert!(e.to_string().contains("nowhere.safetensors") && e.to_string().contains(&want), "{e}");
    assert_eq!(diags.len(), 3, "{e}");
    // Inside `[loss]` (a tagged table) a wrong key is dropped alone, named and placed, and the
    // rest of the table is still checked; so is a key named like its table.
    let tagged = dir.path().join("tagged.toml");
    let loss = "type = \"infonce\"\ntemperature = \"x\"\nmin_logit_scale = -1\nloss = 1";
    std::fs::write(&tagged, format!("output_dir = \"out\"\n{}", BASE.replace("type = \"infonce\"", loss))).unwrap();
    let e = TrainConfig::load(&tagged, &[]).unwrap_err().to_string();
    let text = std::fs::read_to_string(&tagged).unwrap();
    let at = |s: &str| format!("tagged.toml:{}:", text.lines().position(|l| l.contains(s)).unwrap() + 1);
    for (want, place) in [
        ("`loss.temperature`: wrong type: invalid type: string \"x\"", at("temperature = \"x\"")),
        ("unknown key `loss` in `loss`", at("loss = 1")),
        ("`loss.min_logit_scale`: -1 is not positive", at("min_logit_scale = -1")),
    ] {
        let found = e.find(want).unwrap_or_else(|| panic!("{want}: {e}"));
        assert!(e[found..].lines().nth(1).is_some_and(|l| l.contains(&place)), "{want} at {place}: {e}");
    }
    assert!(e.contains("3 configuration errors"), "{e}");
    // A wrong value equal to a right one's is blamed on its own key (a bool, an array, a float),
    // and an out-of-range element leaves no "too short" follow-on for its fixed-length array.
    for (loss, key, n) in [
        ("type = \"infonce\"\nlearnable_temperature = true\ntemperature = true", "temperature = true", 1),
        (
            "type = \"cusa\"\nitc_temperature = [0.05, 0.05, 0.05]\nteacher_temperature = [0.05, 0.05, 0.05]",
            "teacher_temperature = [",
            1,
        ),
        ("type = \"cusa\"\nteacher_temperature = 0.05\nitc_temperature = 0.05", "itc_temperature = 0.05", 1),
    ] {
        let text = format!("output_dir = \"out\"\n{}", BASE.replace("type = \"infonce\"", loss));
        std::fs::write(&tagged, &text).unwrap();
        let e = TrainConfig::load(&tagged, &[]).unwrap_err().to_string();
        let line = text.lines().position(|l| l.starts_with(key)).unwrap() + 1;
        let name = key.split(' ').next().unwrap();
        assert!(e.starts_with(&format!("error: `loss.{name}`: wrong type")), "{loss}: {e}");
        assert!(e.contains(&format!("tagged.toml:{line}:")), "{loss}: {e}");
        assert!(e.contains(&format!("{n} configuration error")), "{loss}: {e}");
    }
    let text =
        format!("output_dir = \"out\"\n{}", BASE).replace("crop_scale = [0.5, 1.0]", "crop_scale = [1e999, 1.0]");
    assert!(text.contains("crop_scale = [1e999, 1.0]"), "the base sets data.crop_scale");
    std::fs::write(&tagged, &text).unwrap();
    let e = TrainConfig::load(&tagged, &[]).unwrap_err().to_string();
    assert!(e.contains("number `1e999` is out of range") && e.contains("1 configuration error"), "{e}");
    let e = TrainConfig::load(&file, &["optim.foo=1".into(), "batch_size=0".into()]).unwrap_err().to_string();
    assert!(e.contains("unknown key `foo` in `optim`") && e.contains("`batch_size`: 0 is too small"), "{e}");
    let fixed = source.replace("\"eight\"", "8").replace("temprature = 0.02\n", "");
    std::fs::write(&file, &fixed).unwrap();
    let e = TrainConfig::load(&file, &[]).unwrap_err().to_string();
    let want = format!("bad.toml:{}:", line("nowhere.safetensors"));
    assert!(e.contains("nowhere.safetensors") && e.contains(&want), "{e}");
    let e = TrainConfig::load(&file, &["loss.type=infonse".into()]).unwrap_err().to_string();
    assert!(e.contains("unknown value `infonse`") && e.contains("did you mean `infonce`?"), "{e}");
    assert!(e.contains("--set loss.type=infonse"), "{e}");
}

#[test]
fn values_no_loss_optimiser_or_model_can_take_are_config_errors() {
    // Each of these crashed a run or made it diverge; all are reported at once, before anything
    // runs.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.toml");
    std::fs::write(&file, BASE).unwrap();
    let sets: Vec<String> = [
        "output_dir=out/never",
        "optim.lr=-1",
        "optim.betas=[1.5, 0.9]",
        "optim.weight_decay=-1",
        "loss.type=memory_bank",
        "loss.size=0",
        "loss.temperature=0.0",
        "model.text.max_tokens=1000",
        "model.image.width=0",
        "model.image_size_px=9223372036854775807",
        "model.log_variance_bias=nan",
        "data.crop_ratio=[0.0, -1.0]",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
    for want in [
        "`optim.lr`: -1 is not positive",
        "`optim.betas[0]`: 1.5 is not in [0, 1)",
        "`optim.weight_decay`: -1 is not at least 0",
        "`loss.size`: bank size 0 is not a positive multiple of batch_size",
        "`loss.temperature`: 0 is not positive",
        "`model.text.max_tokens`: 1000 tokens do not fit the text model",
        "`model.image`: a ResNet needs a width",
        "image_size_px 9223372036854775807 is past what fits in memory",
        "`model.log_variance_bias`: NaN is not in [-20, 20]",
        "`data.crop_ratio`: 0 is not a range of positive ratios",
    ] {
        assert!(e.contains(want), "wanted `{want}` in:\n{e}");
    }
    assert!(!e.contains("optim.min_lr"), "no follow-on of the wrong lr: {e}");
    // Two tokens hold only the start and end tokens: no caption would have a word.
    let e = TrainConfig::load(&file, &["output_dir=out/never".into(), "model.text.max_tokens=2".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`model.text.max_tokens`: 2 tokens do not fit") && e.contains("at least 3"), "{e}");
    // Sizes no machine holds, and a bank beside a batch of 0 (reported once, not divided by).
    let sets = [
        "output_dir=out/never",
        "batch_size=0",
        "loss.type=otter",
        "loss.sinkhorn_iterations=1000000",
        "model.image.width=9223372036854775807",
        "model.image.layers=[9223372036854775807, 1, 1, 1]",
    ];
    let e = TrainConfig::load(&file, &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap_err().to_string();
    for want in [
        "`batch_size`: 0 is too small",
        "`loss.sinkhorn_iterations`: 1000000 is not at most 1000",
        "`model.image.width`: 9223372036854775807 is past what fits in memory",
        "`model.image.layers`: [9223372036854775807, 1, 1, 1] is past what fits in memory",
    ] {
        assert!(e.contains(want), "wanted `{want}` in:\n{e}");
    }
    let sets = ["output_dir=out/never".into(), "batch_size=0".into(), "loss.type=memory_bank".into()];
    let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
    assert!(e.contains("`batch_size`: 0 is too small") && !e.contains("loss.size"), "{e}");
    // An unknown key whose value is a table holding a key of its name is one unknown key.
    let e = TrainConfig::load(&file, &["output_dir=out/never".into(), "model.a.a=1".into()]).unwrap_err().to_string();
    assert!(e.contains("unknown key `a` in `model`") && !e.contains("in `model.a`"), "{e}");
    // A NaN learning rate is one error, with no follow-on about `min_lr`.
    let e = TrainConfig::load(&file, &["output_dir=out/never".into(), "optim.lr=nan".into()]).unwrap_err().to_string();
    assert!(e.contains("`optim.lr`") && !e.contains("optim.min_lr"), "{e}");
    // A bank past 2^20 slots is refused before anything is allocated (it used to abort the
    // process after an earlier run's results had been removed).
    let sets = ["output_dir=out/never", "loss.type=memory_bank", "loss.size=1000000000000"].map(String::from);
    let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
    assert!(e.contains("`loss.size`: a bank of 1000000000000 slots is more than 1048576"), "{e}");
    // A folder where a file belongs is named as such, not as missing.
    let e = TrainConfig::load(&file, &["output_dir=out/never".into(), "model.image.checkpoint=data".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`model.image.checkpoint`: `data` is not a file"), "{e}");
    let e = TrainConfig::load(&file, &["output_dir=out/never".into(), "model.image.checkpoint=nowhere".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("`model.image.checkpoint`: `nowhere` does not exist"), "{e}");
    // `epochs`: zero is its own error; too many to count is an error, not an overflow.
    let epochs = dir.path().join("epochs.toml");
    std::fs::write(&epochs, BASE.replace("steps = 6\n", "epochs = 0\n")).unwrap();
    let e = TrainConfig::load(&epochs, &["output_dir=out/never".into()]).unwrap_err().to_string();
    assert!(e.contains("`epochs`: must be at least 1") && !e.contains("`steps`"), "{e}");
    let c = TrainConfig::load(&epochs, &["output_dir=out/never".into(), "epochs=9223372036854775807".into()]).unwrap();
    let e = c.total_steps(576).unwrap_err().to_string();
    assert!(e.contains("9223372036854775807 epochs of 576 pairs in batches of 8 are too many steps"), "{e}");
}

#[test]
fn loss_and_msda_settings_out_of_range_are_config_errors() {
    // Each was accepted, then showed as a NaN loss ("lower optim.lr") or trained on nonsense.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.toml");
    std::fs::write(&file, BASE).unwrap();
    let cases: [(&[&str], &[&str]); 8] = [
        (
            &["loss.type=pcmepp", "data.msda.cutmix_prob=-0.5", "loss.init_b=nan", "loss.match_weight=-1"],
            &[
                "`data.msda.cutmix_prob`: -0.5 is not in [0, 1]",
                "`loss.init_b`: NaN is not finite",
                "`loss.match_weight`: -1 is not at least 0",
            ],
        ),
        (
            &["loss.type=pcmepp", "loss.pseudo_positive_weight=-2"],
            &["`loss.pseudo_positive_weight`: -2 is not at least 0"],
        ),
        (&["loss.type=otter", "loss.sinkhorn_lambda=0"], &["`loss.sinkhorn_lambda`: 0 is not positive"]),
        (
            &[
                "loss.type=otter",
                "loss.teacher_momentum=1.5",
                "loss.gamma_v=-1",
                "loss.gamma_t=-0.5",
                "loss.init_log_scale=inf",
            ],
            &[
                "`loss.init_log_scale`: inf is not finite",
                "`loss.teacher_momentum`: 1.5 is not in [0, 1]",
                "`loss.gamma_v`: -1 is not at least 0",
                "`loss.gamma_t`: -0.5 is not at least 0",
            ],
        ),
        (
            &["loss.type=pcmepp", "data.msda.beta=0", "data.msda.mix_ratio=1.5"],
            &["`data.msda.beta`: 0 is not positive", "`data.msda.mix_ratio`: 1.5 is not in [0, 1]"],
        ),
        (
            &["loss.type=infonce", "loss.min_logit_scale=100", "loss.max_logit_scale=1"],
            &["`loss.max_logit_scale`: 1 is not at least `loss.min_logit_scale`"],
        ),
        (&["loss.type=kd", "loss.min_logit_scale=-5"], &["`loss.min_logit_scale`: -5 is not positive"]),
        (
            &["loss.type=pcmepp", "loss.label_smoothing=2", "loss.vib_weight=-1", "loss.vib_guard=0", "loss.init_a=0"],
            &[
                "`loss.label_smoothing`: 2 is not in [0, 1)",
                "`loss.vib_weight`: -1 is not at least 0",
                "`loss.vib_guard`: 0 is not positive",
                "`loss.init_a`: 0 is not positive",
            ],
        ),
    ];
    for (sets, wants) in cases {
        let mut sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        sets.push("output_dir=out/never".into());
        let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
        for want in wants {
            assert!(e.contains(want), "wanted `{want}` in:\n{e}");
        }
        assert!(e.contains("hint: "), "{e}");
    }
    // The defaults pass (the loss settings are checked, not just refused).
    for t in LossType::ALL {
        let ty = format!("loss.type={t}");
        let mut sets = vec![ty.as_str(), "output_dir=out/never"];
        if t == LossType::MemoryBank {
            sets.push("loss.size=16");
        }
        if t == LossType::Pcmepp {
            sets.push("data.msda={mix_ratio = 0.5}");
        }
        TrainConfig::load(&file, &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap_or_else(|e| panic!("{t}: {e}"));
    }
}

#[test]
fn rows_whose_image_is_not_there_are_counted() {
    // The sample's table with every 4th image path broken: those rows are left out, and
    // counted (the run says how many).
    let dir = tempfile::tempdir().unwrap();
    let table = train_table_with_paths(dir.path(), |i, p| if i % 4 == 0 { format!("{p}.gone") } else { p.to_owned() });
    let c = config(dir.path(), &[&format!("data.tables=[\"{}\"]", table.display()), "loss.type=infonce"]);
    let set = TrainSet::load(&c).unwrap();
    assert_eq!((set.samples.len(), set.missing_images), (432, 144));
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
        .arg("train")
        .arg(dir.path().join("train.toml"))
        .args(["--set", &format!("output_dir={}", dir.path().join("out").display()), "--set", "steps=1"])
        .args(["--set", &format!("data.tables=[\"{}\"]", table.display())])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    assert!(stderr.contains("note: 144 training row(s) left out: their image file is not there"), "{stderr}");
}

#[test]
fn trace_steps_prints_each_steps_phases_and_changes_no_result() {
    // `--trace-steps` prints one line per step with each phase's milliseconds, in order, and the
    // losses are those of an untraced run.
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &[]);
    let train = |out: &str, trace: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_curate"));
        cmd.arg("train").arg(dir.path().join("train.toml"));
        cmd.args(["--set", &format!("output_dir={}", dir.path().join(out).display()), "--set", "steps=3"]);
        cmd.args(["--set", "log_every=1", "--progress", "never"]);
        if trace {
            cmd.arg("--trace-steps");
        }
        let run = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        assert!(run.status.success(), "{stderr}");
        stderr
    };
    let plain = train("plain", false);
    let traced = train("traced", true);
    assert!(!plain.contains("step 1 ms:"), "{plain}");
    let lines: Vec<&str> = traced.lines().filter(|l| l.starts_with("step ")).collect();
    assert_eq!(lines.len(), 3, "{traced}");
    let phases = ["batch", "upload", "teacher", "forward", "loss_read", "backward", "optim", "drain"];
    for (i, line) in lines.iter().enumerate() {
        let (head, rest) = line.split_once(" ms: ").unwrap_or_else(|| panic!("{line}"));
        assert_eq!(head, format!("step {}", i + 1));
        let laps: Vec<(&str, f64)> = rest
            .split(", ")
            .map(|lap| {
                let (name, ms) = lap.rsplit_once(' ').unwrap_or_else(|| panic!("{line}"));
                (name, ms.parse::<f64>().unwrap_or_else(|_| panic!("{line}")))
            })
            .collect();
        assert_eq!(laps.iter().map(|l| l.0).collect::<Vec<_>>(), phases, "{line}");
        assert!(laps.iter().all(|l| l.1 >= 0.0), "{line}");
        // The forward and backward passes of a model take measurable time.
        assert!(laps[3].1 + laps[5].1 > 0.0, "{line}");
    }
    let (a, b) = (losses(&dir.path().join("plain")), losses(&dir.path().join("traced")));
    assert_eq!(a.len(), 3);
    assert_eq!(a, b);
}

/// The bundled training table (`sample_id`, `caption`, `path`) written to `dir/t.parquet` with
/// each row's image path `i, path` made `path_of(i, path)`.
fn train_table_with_paths(dir: &Path, path_of: impl Fn(usize, &str) -> String) -> PathBuf {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let batches = curate::io::parquet::read_file(Path::new("data/train_sample/train.parquet")).unwrap();
    let col = |name: &str| common::strs(&batches, name);
    let paths: Vec<String> = col("path").iter().enumerate().map(|(i, p)| path_of(i, p)).collect();
    let strings = |v: Vec<String>| -> ArrayRef { Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("sample_id", strings(col("sample_id"))),
        ("caption", strings(col("caption"))),
        ("path", strings(paths)),
    ])
    .unwrap();
    let table = dir.join("t.parquet");
    common::write_parquet(&table, &batch);
    table
}

/// What [`teacher_table`] puts in one row: a value, a null value, or a null row; or every
/// value of the table times a factor.
#[derive(Clone, Copy)]
enum Poison {
    Value(f32),
    NullValue,
    NullRow,
    Scale(f32),
}

/// The sample's teacher image features, rows `range`, each row cut to its first `width` values,
/// with `poison` (row, value) written over the first value of a row, saved as `file`.
fn teacher_table(file: &Path, range: std::ops::Range<usize>, width: usize, poison: Option<(usize, Poison)>) {
    use arrow_array::{Array, ArrayRef, FixedSizeListArray, Float32Array, RecordBatch, StringArray};
    let batches = curate::io::parquet::read_file(Path::new("data/train_sample/teacher_image.parquet")).unwrap();
    let ids = common::strs(&batches, "sample_id");
    let mut values = Vec::new();
    for b in &batches {
        let list = b.column_by_name("embedding").unwrap().as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        for i in 0..list.len() {
            let row = list.value(i);
            let row = row.as_any().downcast_ref::<Float32Array>().unwrap();
            values.push(row.values()[..width].to_vec());
        }
    }
    let (mut value_nulls, mut row_nulls) = (vec![true; range.len() * width], vec![true; range.len()]);
    match poison {
        Some((r, Poison::Value(v))) => values[r][0] = v,
        Some((r, Poison::NullValue)) => value_nulls[(r - range.start) * width + 1] = false,
        Some((r, Poison::NullRow)) => row_nulls[r - range.start] = false,
        Some((_, Poison::Scale(f))) => values.iter_mut().flatten().for_each(|x| *x *= f),
        None => {}
    }
    let flat: Vec<f32> = values[range.clone()].concat();
    let field = Arc::new(arrow_schema::Field::new("item", arrow_schema::DataType::Float32, true));
    let values = Float32Array::new(flat.into(), Some(value_nulls.into()));
    let list = FixedSizeListArray::new(field, width as i32, Arc::new(values), Some(row_nulls.into()));
    let batch = RecordBatch::try_from_iter([
        ("sample_id", Arc::new(StringArray::from(ids[range].to_vec())) as ArrayRef),
        ("embedding", Arc::new(list) as ArrayRef),
    ])
    .unwrap();
    common::write_parquet(file, &batch);
}

#[test]
fn tables_that_would_be_read_twice_or_join_features_wrongly_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let load = |sets: &[String]| {
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        TrainSet::load(&config(dir.path(), &sets))
    };
    // One table matched by two patterns, or named twice in two spellings: refused with the
    // config, before any data is read.
    config(dir.path(), &[]);
    let out = format!("output_dir={}", dir.path().join("out").display());
    for tables in [
        r#"data.tables=["data/train_sample/train.parquet", "data/train_sample/tra*.parquet"]"#,
        r#"data.tables=["data/train_sample/train.parquet", "./data/train_sample/train.parquet"]"#,
    ] {
        let e = TrainConfig::load(&dir.path().join("train.toml"), &[out.clone(), tables.into()]).unwrap_err();
        let e = e.to_string();
        assert!(e.contains("train.parquet` is listed twice (two patterns name it)"), "{tables}: {e}");
    }
    // Two data sets with the same ids: the teacher features would join to the wrong rows.
    let copy = dir.path().join("copy.parquet");
    std::fs::copy("data/train_sample/train.parquet", &copy).unwrap();
    let two = format!(r#"data.tables=["data/train_sample/train.parquet", {copy:?}]"#);
    let e = load(std::slice::from_ref(&two)).unwrap_err().to_string();
    assert!(e.contains("is in the training tables twice: teacher features join by `sample_id`"), "{e}");
    // Without teacher features the ids need not be unique.
    let set = TrainSet::load(&config_without_teachers(dir.path(), &[&two]));
    assert!(set.as_ref().is_ok_and(|s| s.samples.len() == 2 * 576), "{:?}", set.err());
    // A teacher table listed twice gives every id twice.
    let features =
        r#"data.teacher_image=["data/train_sample/teacher_image.parquet", "data/train_sample/teacher_image.parquet"]"#;
    let e = load(&[features.into()]).unwrap_err().to_string();
    assert!(e.contains("has features twice"), "{e}");
}

#[test]
fn rows_without_id_caption_or_image_reference_are_counted_and_a_table_without_references_refused() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, columns: Vec<(&str, Vec<Option<&str>>)>| {
        let columns: Vec<(&str, ArrayRef)> =
            columns.into_iter().map(|(n, v)| (n, Arc::new(StringArray::from(v)) as ArrayRef)).collect();
        let batch = RecordBatch::try_from_iter(columns).unwrap();
        let file = dir.path().join(name);
        common::write_parquet(&file, &batch);
        file
    };
    let image = "data/train_sample/images/train_blue_circle_00.png";
    assert!(Path::new(image).is_file());
    let n = 10;
    let ids: Vec<String> = (0..n).map(|i| format!("r{i}")).collect();
    let mut id_col: Vec<Option<&str>> = ids.iter().map(|s| Some(s.as_str())).collect();
    let mut caption: Vec<Option<&str>> = vec![Some("a red square"); n];
    let mut path: Vec<Option<&str>> = vec![Some(image); n];
    id_col[1] = None;
    caption[2] = None;
    path[3] = None;
    // Blank captions count as none, as the readers and `encode_text` take them.
    caption[4] = Some("");
    caption[5] = Some(" \t\u{3000}");
    let table = write("rows.parquet", vec![("sample_id", id_col), ("caption", caption), ("path", path)]);
    let tables = format!("data.tables=[{table:?}]");
    let set = TrainSet::load(&config_without_teachers(dir.path(), &[&tables, "batch_size=2"])).unwrap();
    assert_eq!((set.samples.len(), set.incomplete_rows, set.missing_images), (5, 5, 0));
    let kept: Vec<&str> = set.samples.iter().map(|s| s.sample_id.as_str()).collect();
    assert_eq!(kept, ["r0", "r6", "r7", "r8", "r9"]);
    // With `shards_dir`, a table with neither a path nor shard and key is refused, as without,
    // when the config is checked (from the table's footer, before any data is read).
    let bare = write("bare.parquet", vec![("sample_id", vec![Some("a"); 3]), ("caption", vec![Some("b"); 3])]);
    let out = format!("output_dir={}", dir.path().join("out").display());
    for shards in [format!("data.shards_dir={:?}", dir.path()), "seed=3".to_owned()] {
        let tables = format!("data.tables=[{bare:?}]");
        let e = TrainConfig::load(&dir.path().join("plain.toml"), &[out.clone(), tables, shards]).unwrap_err();
        assert!(e.to_string().contains("bare.parquet` has no column `path`"), "{e}");
    }
    // Every table's missing columns at once, and a teacher table's.
    let no_caption =
        write("no_caption.parquet", vec![("sample_id", vec![Some("a"); 3]), ("path", vec![Some(image); 3])]);
    let tables = format!("data.tables=[{bare:?}, {no_caption:?}]");
    let teacher = format!("data.teacher_text=[{no_caption:?}]");
    let e = TrainConfig::load(&dir.path().join("plain.toml"), &[out, tables, teacher]).unwrap_err().to_string();
    assert!(e.contains("bare.parquet` has no column `path`"), "{e}");
    assert!(e.contains("no_caption.parquet` has no column `caption`"), "{e}");
    assert!(e.contains("no_caption.parquet` has no column `embedding`") && e.contains("3 configuration errors"), "{e}");
}

#[test]
fn teacher_tables_of_other_widths_with_a_nan_or_short_of_rows_are_refused_at_load() {
    // Two tables of 64 and 32 values: in one order a data worker read past the narrow rows and
    // panicked, in the other the run trained on misaligned features. Both orders are refused
    // before training, naming both files and widths.
    let dir = tempfile::tempdir().unwrap();
    let (wide, narrow) = (dir.path().join("wide.parquet"), dir.path().join("narrow.parquet"));
    teacher_table(&wide, 0..300, 64, None);
    teacher_table(&narrow, 300..576, 32, None);
    for (a, b, wa, wb) in [(&wide, &narrow, 64, 32), (&narrow, &wide, 32, 64)] {
        let c = config(
            dir.path(),
            &["loss.type=cusa", &format!("data.teacher_image=[\"{}\", \"{}\"]", a.display(), b.display())],
        );
        let e = TrainSet::load(&c).unwrap_err().to_string();
        let want =
            format!("feature widths differ: `{}` has {wa}-d embeddings, `{}` has {wb}-d", a.display(), b.display());
        assert!(e.contains(&want), "wanted `{want}` in:\n{e}");
    }
    // A table that covers part of the training rows: the run says how many have none, with
    // examples, not only the first it meets.
    let c = config(dir.path(), &["loss.type=cusa", &format!("data.teacher_image=\"{}\"", wide.display())]);
    let e = TrainSet::load(&c).unwrap_err().to_string();
    assert!(
        e.contains("276 of 576 training rows have no teacher image features (for example `")
            && e.contains("the teacher tables hold 300 ids"),
        "{e}"
    );
    // A NaN, an inf, a null value or a null row 7 of a table: named by file, column and row,
    // not "the loss is NaN" (or zeros read as features).
    for bad in [Poison::Value(f32::NAN), Poison::Value(f32::INFINITY), Poison::NullValue, Poison::NullRow] {
        let poisoned = dir.path().join("poisoned.parquet");
        teacher_table(&poisoned, 0..576, 64, Some((7, bad)));
        let c = config(dir.path(), &["loss.type=cusa", &format!("data.teacher_image=\"{}\"", poisoned.display())]);
        let e = TrainSet::load(&c).unwrap_err().to_string();
        let what = if matches!(bad, Poison::Value(_)) { "a non-finite value" } else { "a null value" };
        let want = format!("column `embedding` of `{}` has {what} (row 7", poisoned.display());
        assert!(e.contains(&want), "wanted `{want}` in:\n{e}");
    }
}

#[test]
fn teacher_features_of_any_scale_give_the_same_directions() {
    // Features are used L2-normalised: rows of ~1e20s (whose squared norm overflows f32) or of
    // ~1e-25s (whose squares underflow) must not normalise to zeros.
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex();
    let directions = |factor: f32| {
        let table = dir.path().join(format!("teacher_{factor}.parquet"));
        teacher_table(&table, 0..576, 64, Some((0, Poison::Scale(factor))));
        let c = config(dir.path(), &["loss.type=cusa", &format!("data.teacher_image=\"{}\"", table.display())]);
        let (values, dim) = TrainSet::load(&c).unwrap().teacher_image.unwrap();
        let x = Tensor::<2>::from_data(TensorData::new(values, [576, dim]), &device);
        curate::models::pooling::l2_normalize(x).into_data().try_to_vec::<f32>().unwrap()
    };
    let want = directions(1.0);
    assert!(want.chunks(64).all(|r| (r.iter().map(|x| x * x).sum::<f32>() - 1.0).abs() < 1e-5));
    for factor in [1e20f32, 3e-25] {
        let got = directions(factor);
        let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0f32, f32::max);
        assert!(worst < 1e-6, "×{factor}: off by {worst}");
    }
}

#[test]
fn an_undecodable_image_is_left_out_and_resume_still_matches() {
    // The first two rows of epoch 0, and the first of its batch 4, point at a file that is not
    // an image: training aborted at the first batch met, and `--resume` again at the same place.
    let dir = tempfile::tempdir().unwrap();
    let plain = config(dir.path(), &[]);
    let maker = BatchMaker::new(Arc::new(TrainSet::load(&plain).unwrap()), &plain).unwrap();
    let order = maker.epoch_order(0);
    let first = [order[0], order[1], order[32]];
    let broken = dir.path().join("broken.png");
    std::fs::write(&broken, b"\x89PNG\r\n\x1a\n not really").unwrap();
    let table = train_table_with_paths(dir.path(), |i, p| {
        if first.contains(&i) {
            broken.display().to_string()
        } else {
            p.to_owned()
        }
    });
    let tables = format!("data.tables=[\"{}\"]", table.display());

    // Batch 0 keeps its size, without the two rows and without a repeat; they are reported.
    let c = config(dir.path(), &[&tables]);
    let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
    let b = maker.make(0, &maker.epoch_order(0)).unwrap();
    assert_eq!(b.rows.len(), 8);
    assert!(b.rows.iter().all(|r| !first.contains(r)), "{:?}", b.rows);
    let mut unique = b.rows.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 8, "{:?}", b.rows);
    assert_eq!(b.undecodable.len(), 2);
    assert!(b.undecodable.iter().all(|(name, _)| name == &broken.display().to_string()));

    // Trained whole, or stopped and resumed: the same losses; the run says what it left out.
    let whole = tempfile::tempdir().unwrap();
    let s = train(&config(whole.path(), &[&tables]), &TrainOptions::default()).unwrap();
    assert_eq!(s.undecodable_images, 1, "one file, named once");
    assert_eq!(s.undecodable_rows, 3, "the three rows naming it came up in batches 0 and 4");
    let want = losses(&whole.path().join("out"));
    assert_eq!(want.len(), 6);
    let parts = tempfile::tempdir().unwrap();
    let c = config(parts.path(), &[&tables]);
    // Stopped after step 4, resumed from checkpoint 3: batch 4 is made again after the resume.
    train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    let s = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.undecodable_images, s.undecodable_rows), (3, 1, 1), "batch 4's row");
    assert_eq!(losses(&parts.path().join("out")), want);

    let run = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
        .arg("train")
        .arg(dir.path().join("train.toml"))
        .args(["--set", &format!("output_dir={}", dir.path().join("out").display()), "--set", "steps=1"])
        .args(["--set", &tables])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    let note = format!("note: training image `{}` cannot be decoded", broken.display());
    assert!(stderr.contains(&note), "{stderr}");
    let summary = "1 training image(s) could not be decoded (named in the notes above): the 2 row(s) naming them \
                   that came up were left out";
    assert!(stderr.contains(summary), "{stderr}");
    // One step, checkpoints every 3: the folder has none, and the last line lists what it has.
    let listed = format!("output: `{}` (config.json, metrics.jsonl, model.bpk)", dir.path().join("out").display());
    assert!(stderr.contains(&listed) && !dir.path().join("out/checkpoints").exists(), "{stderr}");

    // Too few images decode to fill a batch: the error names one itself (the notes on them come
    // only after a batch, so there are none yet to point at).
    std::fs::create_dir_all(dir.path().join("mostly")).unwrap();
    let mostly = train_table_with_paths(&dir.path().join("mostly"), |i, p| {
        if i < 570 {
            broken.display().to_string()
        } else {
            p.to_owned()
        }
    });
    let tables = format!("data.tables=[\"{}\"]", mostly.display());
    let c = config(dir.path(), &[&tables]);
    let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
    let e = maker.make(0, &maker.epoch_order(0)).unwrap_err().to_string();
    let head = "fewer than 8 of the 576 training rows have an image that decodes: ";
    assert!(e.contains(head), "{e}");
    // Every row was tried but the batch's own untried ones (at most 7), each counted once.
    let tried: usize = e[e.find(head).unwrap() + head.len()..].split(' ').next().unwrap().parse().unwrap();
    assert!((563..=570).contains(&tried), "{e}");
    let files = format!(" rows tried do not (1 image file(s), for example `{}`: ", broken.display());
    assert!(e.contains(&files) && !e.contains("notes above"), "{e}");
}

#[test]
fn set_makes_an_optional_table_the_file_leaves_out() {
    // BASE has no `[eval]`: `--set eval.key=...` makes it, as it would a stage's key.
    let dir = tempfile::tempdir().unwrap();
    let c = config(
        dir.path(),
        &["eval.images=data/train_sample/zeroshot.parquet", "eval.classes=data/train_sample/classes.txt"],
    );
    let eval = c.eval.expect("an [eval] table from --set");
    assert_eq!(eval.classes, Some(PathBuf::from("data/train_sample/classes.txt")));
    // The BoW paper's template by default (spec §6.1, A10).
    assert_eq!(eval.templates, ["a photo of a {}"]);
    // The zero-shot table's columns are checked with the config (from its footer), named by
    // their keys: here `eval.label_column` names a column the table lacks.
    let file = dir.path().join("train.toml");
    let sets = [
        format!("output_dir={}", dir.path().join("out").display()),
        "eval.images=data/train_sample/zeroshot.parquet".into(),
        "eval.classes=data/train_sample/classes.txt".into(),
        "eval.label_column=class".into(),
    ];
    let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
    assert!(e.contains("eval.images") && e.contains("zeroshot.parquet` has no column `class`"), "{e}");
    assert!(e.contains("its columns: sample_id, path, label"), "{e}");
}

#[test]
fn an_empty_zero_shot_table_is_an_error_and_null_rows_are_counted() {
    // An empty table scored 0.0 at every evaluation (hit@k of no image) and the run exited 0;
    // rows with a null path or label were dropped unsaid.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    use curate::train::zeroshot::ZeroShot;
    let dir = tempfile::tempdir().unwrap();
    let batches = curate::io::parquet::read_file(Path::new("data/train_sample/zeroshot.parquet")).unwrap();
    let paths = common::strs(&batches, "path");
    let labels = common::strs(&batches, "label");
    let table = |file: &str, n: usize| {
        let opt = |v: &[String], null: usize| -> ArrayRef {
            Arc::new(StringArray::from((0..n).map(|i| (i != null).then(|| v[i].clone())).collect::<Vec<_>>()))
        };
        let batch = RecordBatch::try_from_iter([("path", opt(&paths, 1)), ("label", opt(&labels, 3))]).unwrap();
        let path = dir.path().join(file);
        common::write_parquet(&path, &batch);
        path
    };
    let eval_config = |file: &Path| {
        let c = config(
            dir.path(),
            &[&format!("eval.images=\"{}\"", file.display()), "eval.classes=data/train_sample/classes.txt"],
        );
        c.eval.unwrap()
    };
    let five = table("five.parquet", 5);
    let z =
        ZeroShot::load(&eval_config(&five), &ImageTransform::of_kind(ImageTransformKind::RandomResizedCrop, 16), false)
            .unwrap();
    assert_eq!(z.skipped, 2);
    // A run trained with `data.pre_caption` is scored on normalised prompts too.
    let mut templated = eval_config(&five);
    templated.templates = vec!["A photo of a {}.".into()];
    let t = ImageTransform::of_kind(ImageTransformKind::RandomResizedCrop, 16);
    let (raw, pre) = (ZeroShot::load(&templated, &t, false).unwrap(), ZeroShot::load(&templated, &t, true).unwrap());
    assert!(raw.prompts()[0].starts_with("A photo of a ") && raw.prompts()[0].ends_with('.'), "{:?}", raw.prompts());
    for (r, p) in raw.prompts().iter().zip(pre.prompts()) {
        assert_eq!(*p, curate::text::pre_caption(r, 64).unwrap());
        assert!(p.starts_with("a photo of a ") && !p.contains('.'), "{p}");
    }
    // A prompt it empties is an error, not a silent raw prompt.
    templated.templates = vec!["?!".into()];
    let e = ZeroShot::load(&templated, &t, true).err().expect("an empty prompt").to_string();
    assert!(e.contains("the zero-shot prompt `?!` has nothing left after `pre_caption`"), "{e}");
    let empty = table("empty.parquet", 0);
    let e = ZeroShot::load(
        &eval_config(&empty),
        &ImageTransform::of_kind(ImageTransformKind::RandomResizedCrop, 16),
        false,
    )
    .err()
    .expect("an empty table is refused")
    .to_string();
    let want = format!("no zero-shot images in `{}` (0 row(s) with a null `path` or `label`)", empty.display());
    assert!(e.contains(&want), "wanted `{want}` in:\n{e}");
    assert!(e.contains("hint: "), "{e}");
    // The binary stops before its first step, exit code 2.
    let run = std::process::Command::new(env!("CARGO_BIN_EXE_curate"))
        .arg("train")
        .arg(dir.path().join("train.toml"))
        .args(["--set", &format!("output_dir={}", dir.path().join("out").display()), "--set", "steps=1"])
        .args(["--set", &format!("eval.images=\"{}\"", empty.display())])
        .args(["--set", "eval.classes=data/train_sample/classes.txt"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no zero-shot images in"), "{stderr}");
}

#[test]
fn zero_shot_hit_at_k_by_hand() {
    // 3 images, 4 classes. Image 0: best class 2 (label 2) → top-1 hit. Image 1: best 0, second
    // 3 (label 3) → top-1 miss, top-2 hit. Image 2: labels {0, 1} (multi-label), best 1 → hit.
    let scores = [0.1, 0.2, 0.9, 0.0, 0.8, 0.1, 0.0, 0.5, 0.3, 0.7, 0.2, 0.1];
    let labels = vec![vec![2], vec![3], vec![0, 1]];
    assert!((hit_at_k(&scores, 4, &labels, 1) - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!(hit_at_k(&scores, 4, &labels, 2), 1.0);
    // Ties go to the lower class index: all-equal scores predict class 0 first.
    assert_eq!(hit_at_k(&[0.5; 4], 4, &[vec![0]], 1), 1.0);
    assert_eq!(hit_at_k(&[0.5; 4], 4, &[vec![3]], 3), 0.0);
    let classes = parse_classes("# comment\ntench | Tinca tinca\n\ngoldfish\n");
    assert_eq!(classes, vec![vec!["tench".to_string(), "Tinca tinca".into()], vec!["goldfish".into()]]);
    assert_eq!(class_prompt("a photo of {}.", &classes[0]), "a photo of tench,or Tinca tinca.");
}

#[test]
fn batches_depend_on_seed_and_step_only_not_on_workers() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &[]);
    let set = Arc::new(TrainSet::load(&c).unwrap());
    let maker = Arc::new(BatchMaker::new(set.clone(), &c).unwrap());
    // 576 rows / 8 = 72 steps per epoch: 70..75 crosses into epoch 1.
    let one: Vec<_> = Loader::new(maker.clone(), 70, 75, 1).map(Result::unwrap).collect();
    let three: Vec<_> = Loader::new(maker.clone(), 70, 75, 3).map(Result::unwrap).collect();
    assert_eq!(one, three);
    assert_eq!(one.iter().map(|b| b.step).collect::<Vec<_>>(), vec![70, 71, 72, 73, 74]);
    // Each epoch visits every row once.
    let epoch: Vec<usize> = (0..72).flat_map(|s| maker.make(s, &maker.epoch_order(0)).unwrap().rows).collect();
    let mut sorted = epoch.clone();
    sorted.sort();
    assert_eq!(sorted, (0..576).collect::<Vec<_>>());
    let other = config(dir.path(), &["seed=4"]);
    let maker4 = BatchMaker::new(set, &other).unwrap();
    assert_ne!(maker4.make(70, &maker4.epoch_order(0)).unwrap(), one[0]);
}

#[test]
fn random_initialisation_is_reproducible_and_checkpoints_reload_to_identical_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &[]);
    let device = Device::flex();
    let a = DualEncoder::init(&c.model, Heads::default(), 11, &device).unwrap();
    let b = DualEncoder::init(&c.model, Heads::default(), 11, &device).unwrap();
    let x = Tensor::<4>::ones([2, 3, 16, 16], &device);
    let out = |m: &DualEncoder| m.encode_image(x.clone()).into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(out(&a), out(&b));
    let path = PathBuf::from(dir.path()).join("m.bpk");
    a.clone().save_file(&path).unwrap();
    let c2 = DualEncoder::init(&c.model, Heads::default(), 12, &device).unwrap();
    assert_ne!(out(&a), out(&c2));
    let loaded = c2.load_file(&path);
    assert_eq!(out(&a), out(&loaded));
}

#[test]
fn webdataset_shards_give_the_same_batches_as_files() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    let dir = tempfile::tempdir().unwrap();
    let rows = &curate::io::parquet::read_file(Path::new("data/train_sample/train.parquet")).unwrap()[0];
    let col = |name: &str| -> Vec<String> {
        let a = rows.column_by_name(name).unwrap().as_any().downcast_ref::<StringArray>().unwrap().clone();
        (0..16).map(|i| a.value(i).to_owned()).collect()
    };
    let (ids, captions, paths) = (col("sample_id"), col("caption"), col("path"));
    let keys: Vec<String> = (0..16).map(|i| format!("{i:09}")).collect();
    let mut tar = tar::Builder::new(std::fs::File::create(dir.path().join("00000.tar")).unwrap());
    for (key, path) in keys.iter().zip(&paths) {
        let bytes = std::fs::read(path).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, format!("{key}.png"), &bytes[..]).unwrap();
        let mut h = tar::Header::new_gnu();
        h.set_size(3);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, format!("{key}.txt"), &b"cap"[..]).unwrap();
    }
    tar.finish().unwrap();
    let strings = |v: &[String]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
    let write = |name: &str, cols: Vec<(&str, ArrayRef)>| {
        let batch = RecordBatch::try_from_iter(cols).unwrap();
        let f = std::fs::File::create(dir.path().join(name)).unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(f, batch.schema(), None).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    };
    let shard = vec!["00000".to_string(); 16];
    write(
        "shards.parquet",
        vec![
            ("sample_id", strings(&ids)),
            ("caption", strings(&captions)),
            ("shard", strings(&shard)),
            ("key", strings(&keys)),
        ],
    );
    write(
        "files.parquet",
        vec![("sample_id", strings(&ids)), ("caption", strings(&captions)), ("path", strings(&paths))],
    );
    let d = dir.path().display();
    let from = |table: &str| {
        let c = config(dir.path(), &[&format!("data.tables=[\"{d}/{table}\"]"), &format!("data.shards_dir={d}")]);
        let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
        maker.make(1, &maker.epoch_order(0)).unwrap()
    };
    let (a, b) = (from("shards.parquet"), from("files.parquet"));
    assert_eq!((a.images, a.ids, a.rows), (b.images, b.ids, b.rows));
}

#[test]
fn the_binary_trains_and_reports_config_errors_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.toml");
    std::fs::write(&file, format!("output_dir = \"{}\"\n{BASE}", dir.path().join("out").display())).unwrap();
    let curate = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_curate")).args(args).output().expect("curate runs")
    };
    let f = file.to_str().unwrap();
    let ok = curate(&["train", f, "--set", "steps=2", "--progress", "never"]);
    let stderr = String::from_utf8_lossy(&ok.stderr);
    assert_eq!(ok.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("trained 2 steps on 576 pairs"), "{stderr}");
    assert!(ok.stdout.is_empty(), "stdout carries data only");
    assert_eq!(losses(&dir.path().join("out")).len(), 2);
    let bad = curate(&["train", f, "--set", "optim.optimizer=adam", "--set", "batch_size=1"]);
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("error: `optim.optimizer`: unknown value `adam`"), "{stderr}");
    assert!(stderr.contains("--> --set optim.optimizer=adam"), "{stderr}");
    assert!(stderr.contains("configuration error"), "{stderr}");
}

/// The training text tower's tokenizer is checked as `encode_text`'s is: an id past the
/// model's `vocab_size` (or a pad id past u32, which must not wrap) stops the run at load, not at
/// the batch that meets it.
#[test]
fn a_training_tokenizer_with_ids_past_the_vocabulary_is_refused_at_load() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("text_model");
    std::fs::create_dir_all(&model).unwrap();
    let src = Path::new("data/train_sample/text_model");
    std::fs::copy(src.join("config.json"), model.join("config.json")).unwrap();
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
    tok["model"]["vocab"]["a"] = 900.into();
    std::fs::write(model.join("tokenizer.json"), tok.to_string()).unwrap();
    let c = config(dir.path(), &[&format!("model.text.dir=\"{}\"", model.display())]);
    let set = Arc::new(TrainSet::load(&c).unwrap());
    let e = BatchMaker::new(set.clone(), &c).err().expect("refused").to_string();
    assert!(e.contains("token `a` has id 900") && e.contains("`vocab_size` is 67"), "{e}");
    // The bundled tokenizer, with a pad id past u32 in config.json.
    std::fs::copy(src.join("tokenizer.json"), model.join("tokenizer.json")).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).unwrap()).unwrap();
    config["pad_token_id"] = 4_294_967_296u64.into();
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let e = BatchMaker::new(set, &c).err().expect("refused").to_string();
    assert!(e.contains("4294967295") && e.contains("config.json"), "{e}");
}

#[test]
fn the_image_transform_key_picks_a_papers_views_and_fills_in_its_defaults() {
    use curate::models::preprocess::{CLIP_MEAN, CLIP_STD};
    use curate::train::config::{DEFAULT_CROP_RATIO, DEFAULT_CROP_SCALE};
    use curate::train::data::read_image;

    let dir = tempfile::tempdir().unwrap();
    let out = format!("output_dir={}", dir.path().join("out").display());
    // The base sets RandomResizedCrop's `crop_scale`: another transform draws its own crops.
    let with_scale = dir.path().join("train.toml");
    std::fs::write(&with_scale, BASE).unwrap();
    let e =
        TrainConfig::load(&with_scale, &[out.clone(), "data.image_transform=otter".into()]).unwrap_err().to_string();
    assert!(e.contains("`data.crop_scale`: is RandomResizedCrop's, and `image_transform = \"otter\"`"), "{e}");
    assert!(e.contains("train.toml:") && e.contains("1 configuration error"), "{e}");
    let e = TrainConfig::load(&with_scale, &[out.clone(), "data.image_transform=oter".into()]).unwrap_err().to_string();
    assert!(e.contains("did you mean `otter`?"), "{e}");

    // Without it, each transform's defaults are filled in, so `config.json` says what ran.
    let plain = dir.path().join("plain.toml");
    let text = BASE.replace("crop_scale = [0.5, 1.0]\n", "");
    assert_ne!(text, BASE);
    std::fs::write(&plain, &text).unwrap();
    let c = TrainConfig::load(&plain, std::slice::from_ref(&out)).unwrap();
    assert_eq!(c.data.image_transform, ImageTransformKind::RandomResizedCrop);
    assert_eq!(
        (c.data.crop_scale, c.data.crop_ratio, c.data.flip),
        (Some(DEFAULT_CROP_SCALE), Some(DEFAULT_CROP_RATIO), Some(true))
    );
    for (kind, name, flip) in [
        (ImageTransformKind::Otter, "otter", false),
        (ImageTransformKind::Pcmepp, "pcmepp", true),
        (ImageTransformKind::Clip, "clip", false),
    ] {
        let c = TrainConfig::load(&plain, &[out.clone(), format!("data.image_transform={name}")]).unwrap();
        assert_eq!(c.data.image_transform, kind);
        assert_eq!((c.data.crop_scale, c.data.crop_ratio, c.data.flip), (None, None, Some(flip)), "{name}");
        let json = serde_json::to_value(&c).unwrap();
        assert_eq!(json["data"]["image_transform"], name);
        assert!(json["data"].get("crop_scale").is_none(), "{name}: {}", json["data"]);
        // An explicit flip is kept.
        let c = TrainConfig::load(
            &plain,
            &[out.clone(), format!("data.image_transform={name}"), format!("data.flip={}", !flip)],
        )
        .unwrap();
        assert_eq!(c.data.flip, Some(!flip), "{name}");
    }

    // A `clip` batch (no draws, no flip) is each row's evaluation view: the batch maker uses the
    // key. Under the default it is not (the random crops of `random_resized_crop`).
    let per = 3 * 16 * 16;
    for (name, same) in [("clip", true), ("random_resized_crop", false)] {
        let c = TrainConfig::load(&plain, &[out.clone(), format!("data.image_transform={name}")]).unwrap();
        let t = ImageTransform::new(&c.data, c.model.image_size_px);
        let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
        let batch = maker.make(0, &maker.epoch_order(0)).unwrap();
        for (k, &r) in batch.rows.iter().enumerate() {
            let mut want = Vec::new();
            t.test(&read_image(&maker.set.samples[r].image).unwrap(), &mut want);
            assert_eq!(batch.images[k * per..(k + 1) * per] == want[..], same, "{name}: row {r}");
        }
        if same {
            // CLIP's constants: a black pixel would be −mean/std; every value is at least that.
            let floor = (0..3).map(|c| -CLIP_MEAN[c] / CLIP_STD[c]).fold(f32::INFINITY, f32::min);
            assert!(batch.images.iter().all(|&v| v >= floor - 1e-6));
        }
    }
}

#[test]
fn pre_caption_gives_the_student_cusas_normalised_captions_and_leaves_out_emptied_ones() {
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    use curate::text::pre_caption;

    let dir = tempfile::tempdir().unwrap();
    // The bundled table with two captions made punctuation only (nothing left after it).
    let batches = curate::io::parquet::read_file(Path::new("data/train_sample/train.parquet")).unwrap();
    let col = |name: &str| common::strs(&batches, name);
    let mut captions = col("caption");
    captions[3] = "?! ...".into();
    captions[7] = " - / ".into();
    let strings = |v: Vec<String>| -> ArrayRef { Arc::new(StringArray::from(v)) };
    let batch = RecordBatch::try_from_iter([
        ("sample_id", strings(col("sample_id"))),
        ("caption", strings(captions.clone())),
        ("path", strings(col("path"))),
    ])
    .unwrap();
    let table = dir.path().join("t.parquet");
    common::write_parquet(&table, &batch);
    let tables = format!("data.tables=[\"{}\"]", table.display());
    let plain = config_without_teachers(dir.path(), &[&tables]);
    let with = config_without_teachers(dir.path(), &[&tables, "data.pre_caption=true"]);
    assert!(with.data.pre_caption && !plain.data.pre_caption, "off by default");

    let (a, b) = (TrainSet::load(&plain).unwrap(), TrainSet::load(&with).unwrap());
    assert_eq!((a.emptied_captions, b.emptied_captions), (0, 2));
    assert_eq!(b.samples.len(), a.samples.len() - 2);
    let mut changed = 0;
    for s in &b.samples {
        let raw = &a.samples.iter().find(|r| r.sample_id == s.sample_id).unwrap().caption;
        assert_eq!(s.caption, pre_caption(raw, 64).unwrap(), "{raw}");
        changed += usize::from(&s.caption != raw);
    }
    assert!(changed >= 10, "some of the sample's captions have capitals or punctuation: {changed}");
    // The batches tokenize the normalised captions.
    let maker = BatchMaker::new(Arc::new(b), &with).unwrap();
    let batch = maker.make(0, &maker.epoch_order(0)).unwrap();
    let texts: Vec<&str> = batch.rows.iter().map(|&r| maker.set.samples[r].caption.as_str()).collect();
    let (ids, _, _) = curate::train::data::tokenize(&maker.tokenizer, &texts).unwrap();
    assert_eq!(batch.ids, ids);
    assert!(texts.iter().all(|t| !t.contains('.') && t.to_lowercase() == *t), "{texts:?}");
}

#[test]
fn resuming_a_run_whose_config_json_is_damaged_or_gone_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let c = config_without_teachers(dir.path(), &[]);
    let out = dir.path().join("out");
    let path = out.join("config.json");
    train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    let good = std::fs::read(&path).unwrap();
    let resume = || train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap_err().to_string();
    let mut latin1 = good.clone();
    latin1.extend_from_slice(b"\n\xe9\n");
    std::fs::write(&path, &latin1).unwrap();
    // Damaged, it is no run's config: refused, as in any folder, and said why.
    let e = resume();
    assert!(e.contains("holds a `config.json` that is not UTF-8 text, so no `curate train` run's"), "{e}");
    let e = train(&c, &TrainOptions::default()).unwrap_err().to_string();
    assert!(e.contains("not UTF-8 text") && e.contains("training would write over it"), "not taken for no file: {e}");
    std::fs::write(&path, &good[..good.len() / 2]).unwrap();
    let e = resume();
    assert!(e.contains("no `curate train` run's (EOF while parsing"), "{e}");
    std::fs::write(&path, "{\"steps\": 6}").unwrap();
    assert!(resume().contains("no `curate train` run's (missing field"), "{}", resume());
    // Gone, the checkpoints' config is unknown.
    std::fs::remove_file(&path).unwrap();
    assert!(resume().contains("holds checkpoints but no `config.json`"), "{}", resume());
    // Put back, the run goes on.
    std::fs::write(&path, &good).unwrap();
    let s = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (3, 6));
}

#[test]
fn a_run_checkpointed_by_an_earlier_curate_resumes_when_only_new_keys_at_their_defaults_differ() {
    let dir = tempfile::tempdir().unwrap();
    let c = config_without_teachers(dir.path(), &[]);
    let out = dir.path().join("out");
    train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    // The config.json an earlier build wrote: without `pre_caption` and `image_transform`, and
    // laid out by hand (another text).
    let path = out.join("config.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let data = v["data"].as_object_mut().unwrap();
    // (`flip` too: the earlier build wrote it, but the resolved config fills it in either way.)
    assert!(data.remove("pre_caption").is_some() && data.remove("image_transform").is_some());
    assert!(data.remove("flip").is_some());
    let optim = v["optim"].as_object_mut().unwrap();
    let keys = ["adamp_delta", "adamp_wd_ratio", "grad_clip_scope", "layer_decay", "image_backbone_lr_scale"];
    for key in keys.into_iter().chain(["text_backbone_lr_scale"]) {
        assert!(optim.remove(key).is_some(), "{key}");
    }
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let s = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (3, 6));
    // A key that changes what runs is still a difference.
    train(&c, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    let other = config_without_teachers(dir.path(), &["data.flip=false"]);
    let e = train(&other, &TrainOptions { resume: true, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("differs"), "{e}");

    // A run that clipped before `grad_clip_scope` existed clipped each tensor: the default
    // (global) would change it, so it resumes only with `tensor`.
    let clipped = config_without_teachers(dir.path(), &["optim.grad_clip_norm=1"]);
    // (Starting over on the unfinished run above: its checkpoints go first.)
    std::fs::remove_dir_all(out.join("checkpoints")).unwrap();
    train(&clipped, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(v["optim"]["grad_clip_scope"], "global");
    v["optim"].as_object_mut().unwrap().remove("grad_clip_scope");
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let e = train(&clipped, &TrainOptions { resume: true, ..Default::default() }).unwrap_err();
    assert!(e.to_string().contains("differs"), "{e}");
    assert!(format!("{e:?}").contains("--set optim.grad_clip_scope=tensor"), "{e:?}");
    let per_tensor = config_without_teachers(dir.path(), &["optim.grad_clip_norm=1", "optim.grad_clip_scope=tensor"]);
    let s = train(&per_tensor, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (3, 6));

    // A run from before `model.text.dropout` trained without dropout, whatever its folder said:
    // with a folder that names none (transformers' 0.1), it resumes only without dropout.
    let folder = dir.path().join("text_model");
    std::fs::create_dir(&folder).unwrap();
    std::fs::copy("data/train_sample/text_model/tokenizer.json", folder.join("tokenizer.json")).unwrap();
    let mut model: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("data/train_sample/text_model/config.json").unwrap()).unwrap();
    let m = model.as_object_mut().unwrap();
    assert!(m.remove("hidden_dropout_prob").is_some() && m.remove("attention_probs_dropout_prob").is_some());
    std::fs::write(folder.join("config.json"), model.to_string()).unwrap();
    let dir_set = format!("model.text.dir={}", folder.display());
    let default_dropout = config_without_teachers(dir.path(), &["model.text.pretrained=false", &dir_set]);
    assert_eq!(default_dropout.model.text.as_ref().unwrap().dropout, Some(0.1), "resolved from the folder");
    std::fs::remove_dir_all(out.join("checkpoints")).unwrap();
    train(&default_dropout, &TrainOptions { stop_after: Some(4), ..Default::default() }).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(v["model"].as_object_mut().unwrap().remove("log_variance_block").is_some());
    assert!(v["model"]["text"].as_object_mut().unwrap().remove("dropout").is_some());
    std::fs::write(&path, serde_json::to_string(&v).unwrap()).unwrap();
    let e = train(&default_dropout, &TrainOptions { resume: true, ..Default::default() }).unwrap_err();
    assert!(format!("{e:?}").contains("`model.text.dropout`: 0.0 then, 0.1 now"), "{e:?}");
    let without =
        config_without_teachers(dir.path(), &["model.text.pretrained=false", &dir_set, "model.text.dropout=0"]);
    let s = train(&without, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (3, 6));
}

#[test]
fn caption_augmentation_gives_masked_batches_and_needs_a_mask_token() {
    let dir = tempfile::tempdir().unwrap();
    // The bundled text model has no [MASK]: refused when the config is checked, so that
    // `validate` says it too, and by the batch maker of a config that skipped the check.
    let file = dir.path().join("train.toml");
    std::fs::write(&file, BASE).unwrap();
    let sets = ["output_dir=out/never".to_string(), "data.caption_augment=true".to_string()];
    let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
    assert!(e.contains("`data.caption_augment`: masks words with `[MASK]`") && e.contains("has neither"), "{e}");
    assert!(e.contains("1 configuration error"), "{e}");
    let mut c = config_without_teachers(dir.path(), &[]);
    c.data.caption_augment = true;
    let set = Arc::new(TrainSet::load(&c).unwrap());
    let e = BatchMaker::new(set.clone(), &c).err().expect("no [MASK] token").to_string();
    assert!(e.contains("`data.caption_augment` masks words with `[MASK]`"), "{e}");

    // The same model with a [MASK] token (id 67, one more embedding row).
    let model = dir.path().join("text_model");
    std::fs::create_dir(&model).unwrap();
    let mut tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("data/train_sample/text_model/tokenizer.json").unwrap()).unwrap();
    tok["model"]["vocab"]["[MASK]"] = 67.into();
    let added = serde_json::json!({"content": "[MASK]", "id": 67, "lstrip": false, "normalized": false,
        "rstrip": false, "single_word": false, "special": true});
    tok["added_tokens"].as_array_mut().unwrap().push(added);
    std::fs::write(model.join("tokenizer.json"), tok.to_string()).unwrap();
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("data/train_sample/text_model/config.json").unwrap()).unwrap();
    config["vocab_size"] = 68.into();
    std::fs::write(model.join("config.json"), config.to_string()).unwrap();
    let dir_set = format!("model.text.dir=\"{}\"", model.display());
    let plain = config_without_teachers(dir.path(), &[&dir_set]);
    let aug = config_without_teachers(dir.path(), &[&dir_set, "data.caption_augment=true"]);
    let make = |c: &TrainConfig, step: u64| {
        let maker = BatchMaker::new(set.clone(), c).unwrap();
        maker.make(step, &maker.epoch_order(0)).unwrap()
    };
    let (a, b) = (make(&plain, 0), make(&aug, 0));
    assert_eq!(a.rows, b.rows, "the same rows");
    assert_eq!(make(&aug, 0).ids, b.ids, "a function of (seed, step)");
    let (cls, sep) = (2, 3);
    let mut masks = 0;
    for r in 0..b.rows.len() {
        let row = &b.ids[r * b.seq..(r + 1) * b.seq];
        let m = &b.mask[r * b.seq..(r + 1) * b.seq];
        let len = m.iter().filter(|&&x| x == 1).count();
        assert!(m[..len].iter().all(|&x| x == 1) && row[len..].iter().all(|&x| x == 0), "padding after the text");
        assert_eq!((row[0], row[len - 1]), (cls, sep), "special tokens stay");
        masks += row.iter().filter(|&&x| x == 67).count();
    }
    assert!(masks > 0 && a.ids != b.ids, "some words are masked: {masks}");
    assert!(!a.ids.contains(&67), "none without augmentation");
    // Each row is its caption augmented by its own draws, keyed by (seed, epoch, sample_id):
    // not by its place in the batch, and drawn again in another epoch.
    let maker = BatchMaker::new(set.clone(), &aug).unwrap();
    let augment = maker.caption_augment.as_ref().unwrap();
    assert_eq!(augment.mask_id, 67);
    let mut redrawn = 0;
    for (k, &r) in b.rows.iter().enumerate() {
        let caption = [set.samples[r].caption.as_str()];
        let one = |epoch| augment.tokenize(&caption, &mut [maker.caption_rng(epoch, r)]).unwrap();
        let (ids, _, len) = one(0);
        assert_eq!(ids[..], b.ids[k * b.seq..k * b.seq + len], "row {k}");
        assert!(b.ids[k * b.seq + len..(k + 1) * b.seq].iter().all(|&x| x == 0));
        redrawn += usize::from(one(1).0 != ids);
    }
    assert!(redrawn > 0, "another epoch draws again");
    // A caption longer than `max_tokens` (16 here) is augmented whole, then capped: its first 15
    // tokens and `[SEP]`, so the words its deletions make room for are the ones that follow, and
    // every row is 16 long. (Truncated first, a row with a deleted word would be shorter.)
    let long = [set.samples[0].caption.as_str(); 10].join(" ");
    let whole = augment.tokenizer.encode(long.as_str(), true).unwrap().get_ids().len();
    assert!(whole > 3 * 16, "{whole} tokens");
    for r in 0..40 {
        let (ids, _, len) = augment.tokenize(&[long.as_str()], &mut [maker.caption_rng(0, r)]).unwrap();
        assert_eq!((len, ids[0], ids[15]), (16, cls, sep), "draw {r}: {ids:?}");
    }
}

#[test]
fn noise_ratio_shuffles_the_captions_of_that_share_of_rows_among_them() {
    use curate::train::data::noisy_correspondence;
    // The draw: floor(r · n) positions, their captions permuted among them, seeded.
    let from = noisy_correspondence(100, 0.37, 5);
    let chosen: Vec<usize> = (0..100).filter(|&i| from[i] != i).collect();
    assert!(chosen.len() <= 37 && chosen.len() >= 30, "{}", chosen.len());
    let mut sources: Vec<usize> = from.clone();
    sources.sort_unstable();
    assert_eq!(sources, (0..100).collect::<Vec<_>>(), "a permutation: no caption lost or doubled");
    assert_eq!(noisy_correspondence(100, 0.37, 5), from, "seeded");
    assert_ne!(noisy_correspondence(100, 0.37, 6), from);
    assert_eq!(noisy_correspondence(100, 0.0, 5), (0..100).collect::<Vec<_>>());

    // Through the training set, teacher text features follow their captions.
    let dir = tempfile::tempdir().unwrap();
    let clean = TrainSet::load(&config(dir.path(), &[])).unwrap();
    let noisy = TrainSet::load(&config(dir.path(), &["data.noise_ratio=0.5"])).unwrap();
    let n = clean.samples.len();
    let from = noisy_correspondence(n, 0.5, 3);
    assert_eq!(noisy.noisy_rows, (0..n).filter(|&i| from[i] != i).count());
    assert!(noisy.noisy_rows > n / 3, "{} of {n}", noisy.noisy_rows);
    let (tc, tn) = (clean.teacher_text.as_ref().unwrap(), noisy.teacher_text.as_ref().unwrap());
    let d = tc.1;
    for (i, &j) in from.iter().enumerate() {
        assert_eq!(noisy.samples[i].sample_id, clean.samples[i].sample_id, "rows stay");
        assert_eq!(noisy.samples[i].caption, clean.samples[j].caption);
        assert_eq!(tn.0[i * d..(i + 1) * d], tc.0[j * d..(j + 1) * d]);
    }
    assert_eq!(noisy.teacher_image, clean.teacher_image, "images keep their features");
    for bad in ["1.5", "-0.1", "nan"] {
        let file = dir.path().join("train.toml");
        let sets = ["output_dir=out".to_owned(), format!("data.noise_ratio={bad}")];
        let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
        assert!(e.contains("`data.noise_ratio`") && e.contains("is not in [0, 1]"), "{bad}: {e}");
    }
}

#[test]
fn the_schedule_reaches_the_optimiser_by_epoch() {
    // 576 pairs in batches of 64: 9 steps an epoch. `step` with a milestone at epoch 1: steps 1
    // to 9 at lr, 10 to 12 at lr / 10.
    let dir = tempfile::tempdir().unwrap();
    let sets = ["batch_size=64", "steps=12", "log_every=1", "optim.schedule=step", "optim.step_epochs=[1]"];
    let c = config_without_teachers(dir.path(), &sets);
    train(&c, &TrainOptions::default()).unwrap();
    let lrs: Vec<f64> =
        metric_lines(&dir.path().join("out")).iter().filter_map(|l| l.get("lr").and_then(|v| v.as_f64())).collect();
    assert_eq!(lrs.len(), 12);
    assert!(lrs[..9].iter().all(|&lr| (lr - 1e-3).abs() < 1e-12), "{lrs:?}");
    assert!(lrs[9..].iter().all(|&lr| (lr - 1e-4).abs() < 1e-12), "{lrs:?}");
}

#[test]
fn a_frozen_image_tower_keeps_its_initial_weights_through_train() {
    // One epoch of 9 steps, frozen or not, against the seeded initial model.
    let mut unchanged = Vec::new();
    for freeze in [0, 1] {
        let dir = tempfile::tempdir().unwrap();
        let sets = ["batch_size=64".to_owned(), "steps=9".to_owned(), format!("optim.freeze_image_epochs={freeze}")];
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let c = config_without_teachers(dir.path(), &sets);
        train(&c, &TrainOptions::default()).unwrap();
        let init = DualEncoder::init(&c.model, Heads::default(), c.seed, &Device::flex()).unwrap();
        let run = curate::train::trained::TrainedRun::load(&dir.path().join("out"), &Device::flex()).unwrap();
        let (a, b) = (param_values(&init.image), param_values(&run.model.image));
        unchanged.push(a.iter().zip(&b).filter(|(x, y)| x == y).count());
        assert!(param_values(&init.image_proj) != param_values(&run.model.image_proj));
    }
    // Frozen: every weight as initialised (BatchNorm's running statistics still move); not
    // frozen: none.
    assert_eq!(unchanged[0], 0, "{unchanged:?}");
    assert!(unchanged[1] >= 2 * unchanged[0] + 40, "{unchanged:?}");
}

#[test]
fn taking_the_image_towers_gradients_out_first_leaves_it_without_update() {
    // What `optim.freeze_image_epochs` relies on: extracting the image tower's gradients takes
    // them out of the gradients, so the encoder's then hold only the rest.
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let (c, inputs) = first_batch(dir.path(), &device);
    let model = DualEncoder::init(&c.model, Heads::default(), 0, &device).unwrap();
    let grads = || {
        let (images, ids, mask) = inputs();
        let e = model.forward(images, ids, mask);
        infonce(e.image, e.text, curate::losses::common::scalar(10.0, &device), DirectionReduction::Mean).backward()
    };
    let all = GradientsParams::from_module(&mut grads(), &model).len();
    let mut g = grads();
    let image = GradientsParams::from_module(&mut g, &model.image).len();
    let rest = GradientsParams::from_module(&mut g, &model).len();
    assert!(image > 0 && rest > 0, "{image} {rest}");
    assert_eq!(image + rest, all);
    // And an optimiser step with them leaves the image tower as it was, and moves the rest.
    let mut g = grads();
    let (image_before, proj_before) = (param_values(&model.image), param_values(&model.image_proj));
    let mut optim = burn::optim::AdamWConfig::new().init();
    let _ = GradientsParams::from_module(&mut g, &model.image);
    let stepped = optim.step(1e-2, model.clone(), GradientsParams::from_module(&mut g, &model));
    assert!(param_values(&stepped.image) == image_before, "the image tower moved");
    assert!(param_values(&stepped.image_proj) != proj_before, "the projection did not move");
    // (With all the gradients, the same step moves the tower.)
    let mut optim = burn::optim::AdamWConfig::new().init();
    let moved = optim.step(1e-2, model.clone(), GradientsParams::from_module(&mut grads(), &model));
    assert!(param_values(&moved.image) != image_before);
}

#[test]
fn swa_averages_the_epoch_ends_from_its_start_and_survives_a_resume() {
    use curate::train::trained::TrainedRun;
    let params = |dir: &Path, swa: bool| {
        param_values(&TrainedRun::load_weights(&dir.join("out"), &Device::flex(), swa).unwrap().model)
    };
    // 576 pairs in batches of 64: 9 steps an epoch; a constant rate, so that a 2-epoch run is
    // the first 18 steps of a 3-epoch one.
    let run_with = |dir: &Path, epochs: u64, swa: bool, opts: TrainOptions| {
        let text: String = BASE
            .lines()
            .filter(|l| !l.starts_with("teacher_"))
            .map(|l| if l == "steps = 6" { format!("epochs = {epochs}\n") } else { format!("{l}\n") })
            .collect();
        assert!(text.contains("epochs = "));
        let file = dir.join("train.toml");
        std::fs::write(&file, text).unwrap();
        let mut sets = vec![
            format!("output_dir={}", dir.join("out").display()),
            "batch_size=64".into(),
            "optim.schedule=constant".into(),
            "checkpoint_every=10".into(),
        ];
        if swa {
            sets.push("optim.swa_start_epoch=1".into());
        }
        let c = TrainConfig::load(&file, &sets).unwrap();
        train(&c, &opts).unwrap()
    };
    let run = |dir: &Path, epochs: u64, opts: TrainOptions| run_with(dir, epochs, true, opts);
    let (two, three) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(two.path(), 2, TrainOptions::default());
    run(three.path(), 3, TrainOptions::default());
    // Two epochs: one snapshot (the end of epoch 1), the final model itself.
    assert!(params(two.path(), true) == params(two.path(), false));
    // Three: the mean of the ends of epochs 1 (step 18, the 2-epoch run's model) and 2.
    let (a, b, swa) = (params(two.path(), false), params(three.path(), false), params(three.path(), true));
    assert!(a != b);
    // Every parameter is the mean of the two; BatchNorm's running statistics, which burn shares
    // between a model's copies, are the final model's (PCME++'s ViT has none).
    let (mut averaged, mut finals) = (0, 0);
    for ((x, y), s) in a.iter().zip(&b).zip(&swa) {
        let mean = |k: usize| 0.5 * x[k] + 0.5 * y[k];
        if (0..s.len()).all(|k| (s[k] - mean(k)).abs() <= 1e-6 * (1.0 + mean(k).abs())) {
            averaged += 1;
        } else {
            assert!(s == y, "neither the mean nor the final values");
            finals += 1;
        }
    }
    assert!(averaged >= 80 && finals <= averaged / 2, "{averaged} averaged, {finals} final");
    // Averaging leaves the trainee as it was: the final model equals a run's without SWA.
    let without = tempfile::tempdir().unwrap();
    run_with(without.path(), 3, false, TrainOptions::default());
    assert!(params(without.path(), false) == b, "SWA changed the trained model");
    // Stopped after step 22 (checkpoint 20, after the first snapshot) and resumed: the same.
    let parts = tempfile::tempdir().unwrap();
    run(parts.path(), 3, TrainOptions { stop_after: Some(22), ..Default::default() });
    assert!(!parts.path().join("out/model_swa.bpk").exists());
    run(parts.path(), 3, TrainOptions { resume: true, ..Default::default() });
    assert!(params(parts.path(), true) == swa, "the resumed run's average differs");
    // `curate eval RUN_DIR --swa` scores the average into RUN_DIR/eval_swa.
    use curate::eval::trained::{run_trained, RunEval};
    let eval = |swa: bool| {
        let args = RunEval {
            run: three.path().join("out"),
            images: Some("data/train_sample/retrieval_images.parquet".into()),
            captions: Some("data/train_sample/retrieval_captions.parquet".into()),
            swa,
            ..Default::default()
        };
        run_trained(&args, &Device::flex()).unwrap();
        let dir = three.path().join("out").join(if swa { "eval_swa" } else { "eval" });
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
        assert_eq!(config["swa"], swa);
        std::fs::read_to_string(dir.join("metrics.json")).unwrap()
    };
    assert_ne!(eval(true), eval(false), "the average scores otherwise than the final model");
    // An SWA start past the last epoch is a config error.
    let file = dir_for_config();
    let e = TrainConfig::load(&file, &["optim.swa_start_epoch=6".into()]).unwrap_err().to_string();
    assert!(e.contains("`optim.swa_start_epoch`: 6 is not an epoch of the 6 (0-based)"), "{e}");
    let e = TrainConfig::load(&file, &["optim.freeze_image_epochs=6".into()]).unwrap_err().to_string();
    assert!(e.contains("`optim.freeze_image_epochs`: 6 is not below `epochs` (6)"), "{e}");
    // A run without SWA has none to score, and says so; a new run into a folder removes the
    // earlier run's average with its final model.
    let plain = dir_without_swa();
    let e = TrainedRun::load_weights(&plain, &Device::flex(), true).err().expect("no SWA");
    assert!(e.to_string().contains("has no SWA average (model_swa.bpk)"), "{e}");
    std::fs::copy(three.path().join("out/model_swa.bpk"), plain.join("model_swa.bpk")).unwrap();
    std::fs::create_dir(plain.join("eval_swa")).unwrap();
    std::fs::write(plain.join("eval_swa/metrics.json"), "{}").unwrap();
    common::train_run(plain.parent().unwrap(), common::TINY_RUN);
    assert!(!plain.join("model_swa.bpk").exists(), "an earlier run's average stayed");
    assert!(!plain.join("eval_swa").exists(), "an earlier run's SWA scores stayed");
}

/// Every float parameter of `module` in visit order, values (BatchNorm running statistics
/// included).
fn param_values<M: burn::module::Module>(module: &M) -> Vec<Vec<f32>> {
    struct Values(Vec<Vec<f32>>);
    impl burn::module::ModuleVisitor for Values {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            self.0.push(param.val().into_data().try_to_vec::<f32>().unwrap());
        }
    }
    let mut v = Values(Vec::new());
    module.visit(&mut v);
    v.0
}

/// A training file of 6 epochs (BASE with `epochs` for `steps`) in a temporary folder.
fn dir_for_config() -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    let text = format!("output_dir = \"out\"\n{}", BASE.replace("steps = 6\n", "epochs = 6\n"));
    assert!(text.contains("epochs = 6"));
    let file = dir.join("train.toml");
    std::fs::write(&file, text).unwrap();
    file
}

/// A finished run without SWA (4 steps).
fn dir_without_swa() -> PathBuf {
    let dir = tempfile::tempdir().unwrap().keep();
    common::train_run(&dir, common::TINY_RUN)
}

/// Each float parameter of `module` by id: its values, and its gradient in `grads` if any.
fn values_by_id<M: Module>(
    module: &M,
    grads: Option<&GradientsParams>,
) -> std::collections::HashMap<burn::module::ParamId, (Vec<f32>, Option<Vec<f32>>)> {
    struct Values<'a>(
        std::collections::HashMap<burn::module::ParamId, (Vec<f32>, Option<Vec<f32>>)>,
        Option<&'a GradientsParams>,
    );
    impl burn::module::ModuleVisitor for Values<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            let v = |t: Tensor<D>| t.into_data().try_to_vec::<f32>().unwrap();
            let g = self.1.and_then(|g| g.get::<D>(param.id)).map(v);
            self.0.insert(param.id, (v(param.val()), g));
        }
    }
    let mut v = Values(Default::default(), grads);
    module.visit(&mut v);
    v.0
}

#[test]
fn tower_rates_and_layer_decay_give_each_parameter_its_rate_in_an_optimiser_step() {
    use curate::train::config::{OptimConfig, OptimizerKind};
    use curate::train::optim::{build, param_ids, LrGroups};
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let (c, inputs) = first_batch(dir.path(), &device);
    let model = DualEncoder::init(&c.model, Heads::default(), 0, &device).unwrap();
    // PCME++'s multiples (spec `cusa-and-pcmepp.md` §3.10) on plain SGD, so a step is −rate · grad.
    let oc = OptimConfig {
        optimizer: OptimizerKind::Sgd,
        momentum: 0.0,
        layer_decay: 0.7,
        image_backbone_lr_scale: 0.01,
        text_backbone_lr_scale: 0.1,
        ..Default::default()
    };
    let lr = 1.0;
    let policy = LrGroups::new(model.lr_groups(&oc)).policy(lr);
    let rate = |id| policy.lr_from_param(id, None);
    // The rates: the image tower at 0.01; the text tower's blocks k of L = 2 at 0.1 · 0.7^(L − k),
    // its embeddings and their norm at 0.1; the projection at the whole rate.
    assert!(param_ids(&model.image).into_iter().all(|id| rate(id) == 0.01));
    let blocks = model.text.as_ref().unwrap().layers();
    assert_eq!(blocks.len(), 2);
    let mut in_blocks = std::collections::HashSet::new();
    for (k, block) in blocks.iter().enumerate() {
        let want = 0.1 * 0.7f64.powi(2 - k as i32);
        for id in param_ids(block) {
            assert!((rate(id) - want).abs() < 1e-15, "block {k}: {} against {want}", rate(id));
            in_blocks.insert(id);
        }
    }
    let others: Vec<_> = param_ids(&model.text).into_iter().filter(|id| !in_blocks.contains(id)).collect();
    assert!(others.len() >= 4, "word, position, token-type embeddings and their norm: {}", others.len());
    assert!(others.iter().all(|&id| rate(id) == 0.1));
    assert!(param_ids(&model.image_proj).into_iter().all(|id| rate(id) == 1.0));

    // One step applies them, parameter by parameter: Δw = −rate · g.
    let (images, ids, mask) = inputs();
    let e = model.forward(images, ids, mask);
    let loss = infonce(e.image, e.text, curate::losses::common::scalar(10.0, &device), DirectionReduction::Mean);
    let grads = GradientsParams::from_grads(loss.backward(), &model);
    let before = values_by_id(&model, Some(&grads));
    let mut optim = build(&oc, 0.0, vec![], vec![]);
    let stepped = optim.step(policy.clone(), model.clone(), grads);
    let after = values_by_id(&stepped, None);
    let mut checked = std::collections::HashSet::new();
    for (id, (w, g)) in &before {
        let Some(g) = g else { continue };
        let gg: f64 = g.iter().map(|&x| (x as f64).powi(2)).sum();
        let dg: f64 = after[id].0.iter().zip(w).zip(g).map(|((a, b), &x)| (*a as f64 - *b as f64) * x as f64).sum();
        if gg < 1e-10 {
            continue;
        }
        let got = -dg / gg;
        assert!((got - rate(*id)).abs() <= 0.02 * rate(*id), "a step of {got} · g where the rate is {}", rate(*id));
        checked.insert((rate(*id) * 1e6).round() as u64);
    }
    assert_eq!(checked.len(), 5, "every rate checked on some parameter: {checked:?}");
}

#[test]
fn global_clipping_bounds_the_norm_of_all_the_updates_and_per_tensor_each_one() {
    // One SGD step (no momentum, rate 1): the update is the clipped gradient. The heads and the
    // text tower have no running statistics, so their change is all update.
    let step_norms = |sets: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let base = ["steps=1", "optim.optimizer=sgd", "optim.momentum=0", "optim.lr=1"];
        let (init, run) = start_and_end(dir.path(), &[&base[..], sets].concat());
        let mut norms = Vec::new();
        for (a, b) in [
            (param_values(&init.text), param_values(&run.model.text)),
            (param_values(&init.image_proj), param_values(&run.model.image_proj)),
        ] {
            for (x, y) in a.iter().zip(&b) {
                norms.push(x.iter().zip(y).map(|(p, q)| ((p - q) as f64).powi(2)).sum::<f64>().sqrt());
            }
        }
        norms
    };
    let total = |n: &[f64]| n.iter().map(|x| x * x).sum::<f64>().sqrt();
    // (The per-tower rates reach the trainer: the same step with the text tower at 0.1 of the
    // rate moves it a tenth as far; the projection, at the whole rate, as far.)
    let (free, tenth) = (step_norms(&[]), step_norms(&["optim.text_backbone_lr_scale=0.1"]));
    let last = free.len() - 1; // the projection's bias; the text tower's tensors come first
    let moved: Vec<_> = free.iter().zip(&tenth).enumerate().filter(|(_, (a, _))| **a > 1e-4).collect();
    assert!(moved.len() + 4 >= free.len(), "{} of {}", moved.len(), free.len());
    for (i, (a, b)) in moved {
        // (Tensors that barely move, such as the attention keys' biases, whose gradient is 0 in
        // exact arithmetic, are left out: rounding decides their step.)
        let want = if i >= last - 1 { 1.0 } else { 0.1 };
        assert!((b / a - want).abs() < 0.02 * want, "tensor {i}: {b} against {a}");
    }
    let max = 0.05;
    let free = step_norms(&[]);
    assert!(total(&free) > 4.0 * max, "the bound must bind: {}", total(&free));
    let global = step_norms(&["optim.grad_clip_norm=0.05"]);
    // One coefficient for every tensor.
    let coef: Vec<f64> = global.iter().zip(&free).filter(|(_, f)| **f > 1e-4).map(|(g, f)| g / f).collect();
    assert!(coef.iter().all(|c| (c / coef[0] - 1.0).abs() < 0.02), "{coef:?}");
    // These tensors are part of all the gradients: together at most the bound.
    assert!(total(&global) <= max * (1.0 + 1e-3), "{}", total(&global));
    assert!(total(&global) > 0.2 * max, "{}", total(&global));
    let per_tensor = step_norms(&["optim.grad_clip_norm=0.05", "optim.grad_clip_scope=tensor"]);
    assert!(per_tensor.iter().all(|&n| n <= max * (1.0 + 1e-3)), "{per_tensor:?}");
    assert!(total(&per_tensor) > 2.0 * max, "each tensor on its own: {}", total(&per_tensor));
}

#[test]
fn an_adamp_run_with_tower_rates_and_global_clipping_resumes_exactly() {
    // AdamP's state (both parameter groups: `Linear` weights read transposed), the per-tower
    // rates and the global clipping, through a checkpoint.
    // 40 steps, resumed at step 10 (AdamP's `Linear` group must be rebuilt from the
    // checkpoint's parameter ids, or the resumed run drifts by ~1e-6 from step 14).
    let sets = [
        "steps=40",
        "checkpoint_every=10",
        "loss.type=pcmepp",
        "optim.optimizer=adamp",
        "optim.weight_decay=1e-4",
        "optim.image_backbone_lr_scale=0.01",
        "optim.text_backbone_lr_scale=0.1",
        "optim.layer_decay=0.7",
        "optim.grad_clip_norm=2",
    ];
    let whole = tempfile::tempdir().unwrap();
    train(&config_without_teachers(whole.path(), &sets), &TrainOptions::default()).unwrap();
    let want = losses(&whole.path().join("out"));
    assert_eq!(want.len(), 40);
    assert!(want.iter().all(|(_, l)| l.is_finite()), "{want:?}");
    let parts = tempfile::tempdir().unwrap();
    let c = config_without_teachers(parts.path(), &sets);
    train(&c, &TrainOptions { stop_after: Some(12), ..Default::default() }).unwrap();
    let s = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (10, 40));
    assert_eq!(losses(&parts.path().join("out")), want);
    // And AdamP is not AdamW: the same run with AdamW has other losses after its first step.
    let adamw = tempfile::tempdir().unwrap();
    let other: Vec<&str> = sets.iter().map(|s| if s.contains("adamp") { "optim.optimizer=adamw" } else { s }).collect();
    train(&config_without_teachers(adamw.path(), &other), &TrainOptions::default()).unwrap();
    assert_ne!(losses(&adamw.path().join("out"))[1..], want[1..]);
}

#[test]
fn text_gpo_pools_a_caption_alike_with_or_without_padding() {
    // GPO pools the first `n` tokens (the mask's ones): a caption padded in a batch with a longer
    // one gets the embedding and log-variance it gets alone.
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path(), &["model.gpo=true"]);
    let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
    let device = Device::flex();
    let heads = Heads { log_variance: true, ..Default::default() };
    let model = DualEncoder::init(&c.model, heads, 0, &device).unwrap();
    assert!(model.text_gpo.is_some() && model.text_log_var_gpo.is_some() && model.image_gpo.is_some());
    let embed = |texts: &[&str]| {
        let (ids, mask, s) = curate::train::data::tokenize(&maker.tokenizer, texts).unwrap();
        let n = texts.len();
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, [n, s]), &device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(mask, [n, s]), &device);
        let (e, v) = model.encode_text_with_log_var(ids, mask);
        let row = |t: Tensor<2>| {
            let d = t.dims()[1];
            t.into_data().try_to_vec::<f32>().unwrap()[..d].to_vec()
        };
        (row(e), row(v.unwrap()), s)
    };
    let (alone, alone_v, s1) = embed(&["a red circle"]);
    let (padded, padded_v, s2) = embed(&["a red circle", "a big blue square on the left of a small green triangle"]);
    assert!(s2 > s1 + 4, "padded: {s1} → {s2} tokens");
    for (a, b) in alone.iter().chain(&alone_v).zip(padded.iter().chain(&padded_v)) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} against {b}");
    }
}

#[test]
fn a_gpo_run_trains_its_poolers_and_resumes_exactly() {
    // 64-px images: the tiny ResNet's grid is 2 × 2, so the image GPO pools four cells.
    let sets = ["model.gpo=true", "model.image_size_px=64", "loss.type=pcmepp", "optim.lr=5e-3"];
    let (whole, want, got) = whole_and_resumed(|d| config_without_teachers(d, &sets), 4);
    let c = config_without_teachers(whole.path(), &sets);
    assert!(want.len() == 6 && want.iter().all(|(_, l)| l.is_finite()), "{want:?}");
    assert_eq!(got, want);
    // Every pooler trained (its GRU and score weights moved from their seeded start).
    let heads = Heads { log_variance: true, ..Default::default() };
    let init = DualEncoder::init(&c.model, heads, c.seed, &Device::flex()).unwrap();
    let run = curate::train::trained::TrainedRun::load(&whole.path().join("out"), &Device::flex()).unwrap();
    let m = &run.model;
    for (name, a, b) in [
        ("image", &init.image_gpo, &m.image_gpo),
        ("text", &init.text_gpo, &m.text_gpo),
        ("image log-variance", &init.image_log_var_gpo, &m.image_log_var_gpo),
        ("text log-variance", &init.text_log_var_gpo, &m.text_log_var_gpo),
    ] {
        let (a, b) = (param_values(a.as_ref().unwrap()), param_values(b.as_ref().expect(name)));
        let moved = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(moved * 2 > a.len(), "{name}: {moved} of {} tensors moved", a.len());
    }
    // And the trained run embeds with them (what `curate eval` and zero-shot use).
    let s = run.image_size();
    let pixels: Vec<f32> = (0..2 * 3 * s * s).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    let e = run.embed_images(pixels, 2).unwrap();
    assert!(e.iter().all(|x| x.is_finite()));
}

#[test]
fn head_styles_build_the_heads_of_each_paper() {
    // CUSA (§2.1): Linear(LayerNorm(f)) on the cross-modal and uni-modal heads, weights
    // N(0, 0.02); PCME++ (§3.1): the image heads Xavier-uniform with bias 0. The tiny text tower is
    // 64-d, as the embedding here: only the papers' styles give it a head.
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex();
    let heads = Heads { uni: true, log_variance: true };
    let build = |style: &str| {
        let s = format!("model.head_style={style}");
        let c = config(dir.path(), &["model.embed_dim=64", "model.log_variance_bias=-2", &s]);
        (DualEncoder::init(&c.model, heads, 0, &device).unwrap(), c)
    };
    let flat = |l: &burn::nn::Linear| {
        let w = l.weight.val().into_data().try_to_vec::<f32>().unwrap();
        let b = l.bias.as_ref().unwrap().val().into_data().try_to_vec::<f32>().unwrap();
        (w, b)
    };
    let max_abs = |v: &[f32]| v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let std = |v: &[f32]| {
        let m = v.iter().sum::<f32>() / v.len() as f32;
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f32>() / v.len() as f32).sqrt()
    };
    // Uniform in ±bound: every value inside, the largest near it.
    let uniform = |v: &[f32], bound: f32| max_abs(v) <= bound && max_abs(v) > 0.95 * bound;

    let (linear, _) = build("linear");
    assert!(linear.text_proj.is_none() && linear.image_proj_norm.is_none() && linear.image_uni_norm.is_none());
    let (w, b) = flat(&linear.image_proj);
    assert!(uniform(&w, 1.0 / 16.0) && uniform(&b, 1.0 / 16.0), "PyTorch's default for 256 inputs");

    let (cusa, c) = build("cusa");
    for (name, l) in [
        ("image_proj", &cusa.image_proj),
        ("text_proj", cusa.text_proj.as_ref().unwrap()),
        ("image_uni", cusa.image_uni.as_ref().unwrap()),
        ("text_uni", cusa.text_uni.as_ref().unwrap()),
    ] {
        let (w, b) = flat(l);
        assert!((std(&w) - 0.02).abs() < 0.002 && max_abs(&w) < 0.2, "{name}: std {}", std(&w));
        assert!(max_abs(&b) > 0.0, "{name}: the bias keeps PyTorch's default");
    }
    for n in [&cusa.image_proj_norm, &cusa.text_proj_norm, &cusa.image_uni_norm, &cusa.text_uni_norm] {
        let n = n.as_ref().expect("a LayerNorm before each CUSA head");
        assert!(n.gamma.val().into_data().try_to_vec::<f32>().unwrap().iter().all(|&g| g == 1.0));
    }
    // The cross-modal head is the Linear of the features normalised per row.
    let x = Tensor::<4>::from_data(
        TensorData::new(
            (0..2 * 3 * 16 * 16).map(|i| ((i * 37 % 101) as f32 / 50.0) - 1.0).collect::<Vec<_>>(),
            [2, 3, 16, 16],
        ),
        &device,
    );
    let f = cusa.valid().image_features(x.clone());
    let centred = f.clone() - f.clone().mean_dim(1);
    let normed = centred.clone() / centred.square().mean_dim(1).add_scalar(1e-5).sqrt();
    let want = cusa.image_proj.forward(normed).into_data().try_to_vec::<f32>().unwrap();
    let got = cusa.valid().encode_image(x).into_data().try_to_vec::<f32>().unwrap();
    for (a, b) in got.iter().zip(&want) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{a} against {b}");
    }
    assert_eq!(c.model.head_style, curate::train::config::HeadStyle::Cusa);

    let (pcme, _) = build("pcmepp");
    assert!(pcme.image_proj_norm.is_none() && pcme.text_proj_norm.is_none());
    let xavier = (6.0f32 / (256.0 + 64.0)).sqrt();
    let (w, b) = flat(&pcme.image_proj);
    assert!(uniform(&w, xavier) && b.iter().all(|&x| x == 0.0), "image μ head: Xavier-uniform, bias 0");
    let (w, b) = flat(pcme.image_log_var.as_ref().unwrap());
    assert!(uniform(&w, xavier) && b.iter().all(|&x| x == -2.0), "image log-variance head: log_variance_bias");
    let (w, b) = flat(pcme.text_proj.as_ref().unwrap());
    assert!(uniform(&w, 1.0 / 8.0) && uniform(&b, 1.0 / 8.0), "text μ head: PyTorch's default");

    let file = dir.path().join("train.toml");
    let e = TrainConfig::load(&file, &["model.head_style=clip".into()]).unwrap_err().to_string();
    assert!(e.contains("head_style") && e.contains("cusa") && e.contains("pcmepp"), "{e}");
}

#[test]
fn runs_with_the_papers_heads_train_resume_and_reload() {
    for (style, loss) in [("cusa", "cusa"), ("pcmepp", "pcmepp")] {
        let sets = [format!("model.head_style={style}"), format!("loss.type={loss}")];
        let sets: Vec<&str> = sets.iter().map(String::as_str).collect();
        let (whole, want, got) = whole_and_resumed(|d| config(d, &sets), 4);
        assert!(want.len() == 6 && want.iter().all(|(_, l)| l.is_finite()), "{style}: {want:?}");
        assert_eq!(got, want, "{style}");
        let run = curate::train::trained::TrainedRun::load(&whole.path().join("out"), &Device::flex()).unwrap();
        assert_eq!(run.model.image_proj_norm.is_some(), style == "cusa", "{style}: rebuilt from config.json");
        let s = run.image_size();
        let pixels: Vec<f32> = (0..2 * 3 * s * s).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
        assert!(run.embed_images(pixels, 2).unwrap().iter().all(|x| x.is_finite()), "{style}");
    }
}

#[test]
fn image_token_dropping_trains_resumes_exactly_and_needs_gpo() {
    // 64-px images: a 2 × 2 grid, so the image GPOs pool two to four cells.
    let base = ["model.gpo=true", "model.image_size_px=64", "loss.type=pcmepp"];
    let with: Vec<&str> = base.iter().copied().chain(["model.image_token_drop=0.5"]).collect();
    let (_whole, want, got) = whole_and_resumed(|d| config_without_teachers(d, &with), 3);
    assert!(want.len() == 6 && want.iter().all(|(_, l)| l.is_finite()), "{want:?}");
    assert_eq!(got, want, "a resumed run drops the same cells");
    let plain = tempfile::tempdir().unwrap();
    train(&config_without_teachers(plain.path(), &base), &TrainOptions::default()).unwrap();
    assert_ne!(losses(&plain.path().join("out"))[0], want[0], "dropping changed the first loss");

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("train.toml");
    std::fs::write(&file, BASE).unwrap();
    let out = format!("output_dir={}", dir.path().join("out").display());
    let e = TrainConfig::load(&file, &[out.clone(), "model.image_token_drop=0.2".into()]).unwrap_err().to_string();
    assert!(e.contains("model.image_token_drop") && e.contains("model.gpo = true"), "{e}");
    let e = TrainConfig::load(&file, &[out, "model.gpo=true".into(), "model.image_token_drop=1".into()]).unwrap_err();
    assert!(e.to_string().contains("in [0, 1)"), "{e}");
}

#[test]
fn the_first_logged_cusa_and_pcmepp_losses_are_those_of_the_first_batch_wired_by_hand() {
    // The trainer's wiring of the heads into the losses, recomputed from the public pieces: the
    // cross-modal and uni-modal heads, each teacher's features, μ normalised, each tower's
    // log-variance, the labels from the image ids. A swap of any two (or a μ left unnormalised)
    // parts the two losses.
    use curate::losses::cusa::{cusa, CusaBatch, CusaTemperatures};
    use curate::losses::pcmepp::{pair_labels, pcmepp, MatchScale};
    use curate::losses::LossConfig;
    use curate::models::pooling::l2_normalize;
    for loss in ["cusa", "pcmepp"] {
        let dir = tempfile::tempdir().unwrap();
        let ty = format!("loss.type={loss}");
        let c = config(dir.path(), &[&ty, "steps=1", "checkpoint_every=0"]);
        train(&c, &TrainOptions::default()).unwrap();
        let logged = losses(&dir.path().join("out"))[0].1;

        let device = Device::flex().autodiff();
        let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
        let batch = maker.make(0, &maker.epoch_order(0)).unwrap();
        let (b, s) = (batch.rows.len(), c.model.image_size_px);
        let images = Tensor::<4>::from_data(TensorData::new(batch.images.clone(), [b, 3, s, s]), &device);
        let ids = Tensor::<2, Int>::from_data(TensorData::new(batch.ids.clone(), [b, batch.seq]), &device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(batch.mask.clone(), [b, batch.seq]), &device);
        let heads = Heads { uni: loss == "cusa", log_variance: loss == "pcmepp" };
        let model = DualEncoder::init(&c.model, heads, c.seed, &device).unwrap();
        let e = model.forward(images, ids, mask);
        let features = |v: &Option<Vec<f32>>| {
            let v = v.clone().unwrap();
            Tensor::<2>::from_data(TensorData::new(v.clone(), [b, v.len() / b]), &device)
        };
        let by_hand = match &c.loss {
            LossConfig::Cusa(cc) => {
                let batch_in = CusaBatch {
                    image_cross: e.image,
                    text_cross: e.text,
                    image_uni: e.image_uni.unwrap(),
                    text_uni: e.text_uni.unwrap(),
                    teacher_image: features(&batch.teacher_image),
                    teacher_text: features(&batch.teacher_text),
                    image_ids: &batch.image_ids,
                };
                cusa(batch_in, &CusaTemperatures::init(cc, &device), cc).loss
            }
            LossConfig::Pcmepp(pc) => {
                let m = MatchScale::init(pc, &device);
                let labels = pair_labels(&batch.image_ids, pc.label_smoothing, &device);
                let (mv, vv) = (l2_normalize(e.image), e.image_log_var.unwrap());
                let (mt, vt) = (l2_normalize(e.text), e.text_log_var.unwrap());
                pcmepp(mv, vv, mt, vt, m.a.val(), m.b.val(), labels, pc).loss
            }
            _ => unreachable!(),
        };
        let by_hand = by_hand.into_scalar::<f32>() as f64;
        assert!((logged - by_hand).abs() <= 1e-5 * by_hand.abs(), "{loss}: logged {logged}, by hand {by_hand}");
    }
}

#[test]
fn antialiased_views_differ_from_the_default_sampler_and_belong_to_random_resized_crop() {
    // The bundled images are 64 px and the views 16: the antialiased filter averages every pixel
    // of the crop where the default reads two rows and columns per output pixel, so the views
    // differ wherever the shapes' edges are (the images are mostly flat colour).
    let dir = tempfile::tempdir().unwrap();
    let view = |sets: &[&str]| {
        let c = config(dir.path(), sets);
        let maker = BatchMaker::new(Arc::new(TrainSet::load(&c).unwrap()), &c).unwrap();
        maker.make(0, &maker.epoch_order(0)).unwrap().images
    };
    let (plain, smooth) = (view(&[]), view(&["data.antialias=true"]));
    assert_eq!(plain.len(), smooth.len());
    let moved = plain.iter().zip(&smooth).filter(|(a, b)| (*a - *b).abs() > 1e-3).count();
    assert!(moved * 10 > plain.len(), "{moved} of {} values differ", plain.len());
    let file = dir.path().join("train.toml");
    let out = format!("output_dir={}", dir.path().join("out").display());
    let e = TrainConfig::load(&file, &[out, "data.image_transform=otter".into(), "data.antialias=true".into()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("data.antialias") && e.contains("random_resized_crop"), "{e}");
}

#[test]
fn no_weight_decay_1d_keeps_the_norms_weights_from_decay_in_a_run() {
    // One AdamW step at rate 1e-3 with weight decay 100: decay alone would take every weight to
    // 0.9 of itself, the Adam update moves each by about 1e-3. The text tower's LayerNorm gammas
    // (all ones at the start) stay near 1 with the key, and drop to about 0.9 without.
    let gammas = |sets: &[&str]| {
        let dir = tempfile::tempdir().unwrap();
        let base = ["steps=1", "optim.optimizer=adamw", "optim.lr=1e-3", "optim.weight_decay=100"];
        let (init, run) = start_and_end(dir.path(), &[&base[..], sets].concat());
        let (before, after) = (param_values(&init.text), param_values(&run.model.text));
        let moved: Vec<f32> = before
            .iter()
            .zip(&after)
            .filter(|(b, _)| b.iter().all(|&x| x == 1.0))
            .flat_map(|(_, a)| a.iter().copied())
            .collect();
        assert!(moved.len() >= 64 * 5, "the gammas of 5 LayerNorms: {}", moved.len());
        moved
    };
    assert!(gammas(&["optim.no_weight_decay_1d=true"]).iter().all(|g| (g - 1.0).abs() < 0.01));
    assert!(gammas(&[]).iter().all(|g| (g - 0.9).abs() < 0.01));
}

#[test]
fn training_does_not_write_over_what_it_was_not_asked_to_replace() {
    // A folder whose config.json is no training run's (a model folder, a pipeline's output):
    // refused, and the file is kept.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let hf = r#"{"model_type": "bert", "vocab_size": 67}"#;
    std::fs::write(out.join("config.json"), hf).unwrap();
    let e = train(&config(dir.path(), &[]), &TrainOptions::default()).unwrap_err().to_string();
    assert!(e.contains("holds a `config.json` that is no `curate train` run's"), "{e}");
    assert_eq!(std::fs::read_to_string(out.join("config.json")).unwrap(), hf);
    std::fs::remove_file(out.join("config.json")).unwrap();
    std::fs::write(out.join("manifest.json"), "{}").unwrap();
    let e = train(&config(dir.path(), &[]), &TrainOptions::default()).unwrap_err().to_string();
    assert!(e.contains("the output of a `curate run` pipeline"), "{e}");
    std::fs::remove_file(out.join("manifest.json")).unwrap();

    // An unfinished run is not started over without being asked: `--resume` goes on from it.
    let c = config(dir.path(), &["checkpoint_every=2"]);
    train(&c, &TrainOptions { stop_after: Some(3), ..Default::default() }).unwrap();
    let e = train(&c, &TrainOptions::default()).unwrap_err().to_string();
    assert!(e.contains("holds an unfinished run (its last checkpoint is at step 2)"), "{e}");
    assert_eq!(curate::train::run::last_checkpoint(&out).unwrap().0, 2, "kept");
    let s = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap();
    assert_eq!((s.resumed_at, s.steps), (2, 6));

    // A finished run has nothing to resume: its last steps are not trained again over its model.
    let model = std::fs::read(out.join("model.bpk")).unwrap();
    let e = train(&c, &TrainOptions { resume: true, ..Default::default() }).unwrap_err().to_string();
    assert!(e.contains("holds a finished run (model.bpk): there is nothing to resume"), "{e}");
    assert_eq!(std::fs::read(out.join("model.bpk")).unwrap(), model);
    // Asked to train again (no `--resume`), it replaces the finished run, as documented.
    train(&c, &TrainOptions::default()).unwrap();
    // An unfinished run of other settings is started over (the advice after a NaN loss: lower
    // the rate and train again).
    train(&c, &TrainOptions { stop_after: Some(3), ..Default::default() }).unwrap();
    let lower = config(dir.path(), &["checkpoint_every=2", "optim.lr=1e-4"]);
    let s = train(&lower, &TrainOptions::default()).unwrap();
    assert_eq!((s.resumed_at, s.steps), (0, 6));
}

#[test]
fn optional_tables_may_be_left_out_and_a_wrong_length_is_one_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("t.toml");
    // BASE without `steps` and without `[model.image]` (every key of it has a default).
    let text: String = BASE
        .lines()
        .filter(|l| !l.starts_with("steps") && *l != "[model.image]" && !l.starts_with("preset"))
        .map(|l| format!("{l}\n"))
        .collect();
    let out = format!("output_dir={}", dir.path().join("out").display());
    std::fs::write(&file, &text).unwrap();
    let c = TrainConfig::load(&file, &[out.clone(), "epochs=1".into()]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.model.image.preset, curate::train::config::ImagePreset::Tiny);
    // `epochs` of a wrong type: that error alone, not also "neither steps nor epochs".
    let e = TrainConfig::load(&file, &[out.clone(), "epochs=\"3\"".into()]).unwrap_err().to_string();
    assert!(e.contains("`epochs`: wrong type") && !e.contains("neither"), "{e}");
    assert!(e.contains("1 configuration error"), "{e}");
    let e = TrainConfig::load(&file, &["output_dir=\"\"".into(), "epochs=1".into()]).unwrap_err().to_string();
    assert!(e.contains("`output_dir`: is empty"), "{e}");
    // Sizes out of range are each reported, beside a wrong value elsewhere in `[model]`.
    let sets = [out, "epochs=1".into(), "model.embed_dim=0".into(), "model.image_size_px=3".into()];
    let sets: Vec<String> = sets.into_iter().chain(["model.text.projection=yes".to_owned()]).collect();
    let e = TrainConfig::load(&file, &sets).unwrap_err().to_string();
    assert!(e.contains("`model.embed_dim`: must be positive") && e.contains("`model.image_size_px`: 3 is below 8"));
    assert!(e.contains("`model.text.projection`: wrong type") && e.contains("3 configuration errors"), "{e}");
}

#[test]
fn ctrl_c_stops_after_the_step_with_a_checkpoint_and_resume_goes_on_from_it() {
    // `CURATE_SIGINT_AT_STEP=N`: the binary sends itself SIGINT as step N ends, as a Ctrl-C
    // would. Checkpoints every 3 of 6 steps.
    let whole = tempfile::tempdir().unwrap();
    train(&config(whole.path(), &[]), &TrainOptions::default()).unwrap();
    let want = losses(&whole.path().join("out"));
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &[]);
    let curate = |out: &str, sigint_at: Option<u64>, resume: bool| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_curate"));
        cmd.arg("train").arg(dir.path().join("train.toml"));
        cmd.args(["--set", &format!("output_dir={}", dir.path().join(out).display()), "--progress", "never"]);
        cmd.args(["--set", r#"data.tables=["data/train_sample/train.parquet"]"#]);
        if resume {
            cmd.arg("--resume");
        }
        cmd.env_remove("CURATE_SIGINT_AT_STEP");
        if let Some(n) = sigint_at {
            cmd.env("CURATE_SIGINT_AT_STEP", n.to_string());
        }
        let run = cmd.output().unwrap();
        (run.status.code(), String::from_utf8_lossy(&run.stderr).into_owned())
    };
    let last = |out: &str| curate::train::run::last_checkpoint(&dir.path().join(out)).map(|c| c.0);

    // Between checkpoints: step 4 gets one of its own; the run stops there, exit status 130.
    let (code, stderr) = curate("between", Some(4), false);
    assert_eq!(code, Some(130), "{stderr}");
    // The message gives the command that goes on, its --set lines included (shell-quoted).
    let resume = format!(
        "interrupted (Ctrl-C) after step 4 of 6: checkpoint written; `curate train {} --set output_dir={} --set \
         'data.tables=[\"data/train_sample/train.parquet\"]' --resume` goes on from it",
        dir.path().join("train.toml").display(),
        dir.path().join("between").display()
    );
    assert!(stderr.contains(&resume), "{stderr}");
    assert_eq!(last("between"), Some(4));
    assert!(!dir.path().join("between/model.bpk").exists(), "an interrupted run has no final model");
    let (code, stderr) = curate("between", None, true);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("trained 2 steps (resumed at step 4)"), "{stderr}");
    assert_eq!(losses(&dir.path().join("between")), want);

    // On a checkpoint's step: that checkpoint serves.
    let (code, stderr) = curate("on", Some(3), false);
    assert_eq!(code, Some(130), "{stderr}");
    assert_eq!(last("on"), Some(3));

    // On the last step: the run finishes as usual.
    let (code, stderr) = curate("last", Some(6), false);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("interrupted"), "{stderr}");
    assert!(dir.path().join("last/model.bpk").exists());
    assert_eq!(losses(&dir.path().join("last")), want);
}

#[test]
fn text_dropout_trains_reproducibly_and_a_resumed_run_draws_the_same_masks() {
    // `model.text.dropout` (the bundled tiny model's config.json says 0): the losses change, and
    // a run stopped and resumed matches the whole run bit for bit (masks seeded per step), with
    // the memory bank's EMA teacher, which runs the tower in train mode too.
    let sets = ["loss.type=memory_bank", "loss.size=16", "loss.momentum=0.9", "model.text.dropout=0.3"];
    let (_whole, want, got) = whole_and_resumed(|d| config_without_teachers(d, &sets), 4);
    assert_eq!(want.len(), 6);
    assert_eq!(got, want, "a resumed run's dropout masks differ");
    let plain = tempfile::tempdir().unwrap();
    train(&config_without_teachers(plain.path(), &sets[..3]), &TrainOptions::default()).unwrap();
    let without = losses(&plain.path().join("out"));
    assert_eq!(without[0].0, 1);
    assert!(without.iter().zip(&want).all(|(a, b)| a.1 != b.1), "dropout changed no loss: {without:?} {want:?}");
    // The evaluation embeddings do not drop: one trained model embeds a caption alike twice.
    let run = curate::train::trained::TrainedRun::load(&_whole.path().join("out"), &Device::flex()).unwrap();
    let a = run.embed_texts(&["a red circle"]).unwrap();
    assert_eq!(a, run.embed_texts(&["a red circle"]).unwrap());
    // A rate outside [0, 1) is refused with the config.
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &[]);
    let out = format!("output_dir={}", dir.path().join("out").display());
    let e = TrainConfig::load(&dir.path().join("train.toml"), &[out, "model.text.dropout=1.0".into()]).unwrap_err();
    assert!(e.to_string().contains("`model.text.dropout`: 1 is not a dropout rate"), "{e}");
}

/// A training file on the bundled sample with CLIP's towers from the tiny open_clip folder
/// (`tests/fixtures/models/tiny_open_clip`, made by `make_open_clip_fixtures.py`).
const CLIP_BASE: &str = r#"
seed = 3
steps = 6
batch_size = 8
log_every = 1
checkpoint_every = 3

[model]
embed_dim = 16
image_size_px = 32

[model.clip]
dir = "tests/fixtures/models/tiny_open_clip"

[data]
tables = ["data/train_sample/train.parquet"]
image_transform = "clip"

[loss]
type = "infonce"

[optim]
optimizer = "adamw"
lr = 1e-3
"#;

fn clip_config(dir: &Path, sets: &[&str]) -> TrainConfig {
    let file = dir.join("clip.toml");
    std::fs::write(&file, CLIP_BASE).unwrap();
    let mut overrides = vec![format!("output_dir={}", dir.join("out").display())];
    overrides.extend(sets.iter().map(|s| s.to_string()));
    TrainConfig::load(&file, &overrides).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn an_open_clip_folder_with_open_clip_pytorch_model_bin_loads_the_same_towers() {
    // open_clip's Hugging Face folders ship `open_clip_pytorch_model.bin` (older ones only that):
    // the tiny CLIP's tensors saved so (torch/make_torch_checkpoints.py) give the same towers.
    let src = Path::new("tests/fixtures/models/tiny_open_clip");
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("clip");
    std::fs::create_dir(&folder).unwrap();
    for f in ["open_clip_config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), folder.join(f)).unwrap();
    }
    std::fs::copy(
        "tests/fixtures/models/torch/tiny_open_clip_pytorch_model.bin",
        folder.join("open_clip_pytorch_model.bin"),
    )
    .unwrap();
    let device = Device::flex();
    let features = |clip_dir: &Path| {
        let c = clip_config(dir.path(), &[&format!("model.clip.dir={}", clip_dir.display())]);
        let m = DualEncoder::init(&c.model, Heads::default(), c.seed, &device).unwrap();
        let x = Tensor::<4>::ones([1, 3, 32, 32], &device);
        m.image_features(x).into_data().try_to_vec::<f32>().unwrap()
    };
    assert_eq!(features(&folder), features(src));
}

#[test]
fn a_bert_tower_with_only_vocab_txt_trains() {
    // The tiny BERT with its WordPiece vocabulary as `vocab.txt` (ids in order, from its
    // tokenizer.json) and no tokenizer.json: the training config accepts the folder, and the run
    // tokenises as the tokenizer.json would (the same loss after two steps).
    let src = Path::new("tests/fixtures/models/tiny_bert");
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("bert");
    std::fs::create_dir(&folder).unwrap();
    for f in ["config.json", "model.safetensors", "sentence_bert_config.json"] {
        std::fs::copy(src.join(f), folder.join(f)).unwrap();
    }
    let tok: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("tokenizer.json")).unwrap()).unwrap();
    let mut vocab: Vec<(&String, u64)> =
        tok["model"]["vocab"].as_object().unwrap().iter().map(|(k, v)| (k, v.as_u64().unwrap())).collect();
    vocab.sort_by_key(|(_, i)| *i);
    assert!(vocab.iter().enumerate().all(|(i, (_, id))| i as u64 == *id), "ids 0..n");
    let lines: Vec<&str> = vocab.iter().map(|(k, _)| k.as_str()).collect();
    std::fs::write(folder.join("vocab.txt"), lines.join("\n") + "\n").unwrap();
    std::fs::write(folder.join("tokenizer_config.json"), r#"{"do_lower_case": true}"#).unwrap();
    let loss = |text_dir: &Path, out: &str| {
        let sets: Vec<String> = vec![
            format!("model.text.dir={}", text_dir.display()),
            "model.text.pretrained=true".into(),
            "model.text.max_tokens=16".into(),
            "steps=2".into(),
            format!("output_dir={}", dir.path().join(out).display()),
        ];
        let c = TrainConfig::load(Path::new("pipelines/train.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
        train(&c, &TrainOptions::default()).unwrap().last_loss
    };
    assert_eq!(loss(&folder, "vocab"), loss(src, "json"));
}

#[test]
fn clip_towers_load_as_open_clip_and_train_and_resume() {
    // The towers' pooled features are open_clip's `encode_image` / `encode_text` of the
    // fixture's inputs (so the checkpoint went where it belongs), with the tokenizer's mask.
    let e: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string("tests/fixtures/models/tiny_open_clip_expected.json").unwrap())
            .unwrap();
    let flat = common::flat_f32;
    let dir = tempfile::tempdir().unwrap();
    let c = clip_config(dir.path(), &[]);
    assert_eq!(c.model.max_tokens(), 16, "the context length, resolved");
    let device = Device::flex();
    let model = DualEncoder::init(&c.model, Heads::default(), c.seed, &device).unwrap();
    let images = Tensor::<4>::from_data(TensorData::new(flat(&e["image_input"]), [2, 3, 32, 32]), &device);
    let got = model.image_features(images).into_data().try_to_vec::<f32>().unwrap();
    for (a, b) in got.iter().zip(flat(&e["image_quick_gelu"])) {
        assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "image {a} vs {b}");
    }
    let ids: Vec<i64> = flat(&e["ids"]).iter().map(|&x| x as i64).collect();
    let lengths: Vec<usize> = e["lengths"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as usize).collect();
    let mask: Vec<i64> = lengths.iter().flat_map(|&n| (0..16).map(move |k| i64::from(k < n))).collect();
    let (b, s) = (lengths.len(), 16);
    let got = model
        .text_features(
            Tensor::<2, Int>::from_data(TensorData::new(ids, [b, s]), &device),
            Tensor::<2, Int>::from_data(TensorData::new(mask, [b, s]), &device),
        )
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    for (a, b) in got.iter().zip(flat(&e["text_quick_gelu"])) {
        assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "text {a} vs {b}");
    }

    // `quick_gelu = false` over the folder's `true`: exact GELU, as open_clip's `quick_gelu=False`.
    let gelu = clip_config(dir.path(), &["model.clip.quick_gelu=false"]);
    let model = DualEncoder::init(&gelu.model, Heads::default(), gelu.seed, &device).unwrap();
    let images = Tensor::<4>::from_data(TensorData::new(flat(&e["image_input"]), [2, 3, 32, 32]), &device);
    let got = model.image_features(images).into_data().try_to_vec::<f32>().unwrap();
    for (a, b) in got.iter().zip(flat(&e["image_gelu"])) {
        assert!((a - b).abs() < 1e-4 * (1.0 + b.abs()), "image (GELU) {a} vs {b}");
    }

    // Training: whole, and stopped and resumed, alike; the finished run embeds.
    let (whole, want, got) = whole_and_resumed(|d| clip_config(d, &[]), 4);
    assert_eq!(want.len(), 6);
    assert!(want.iter().all(|(_, l)| l.is_finite()), "{want:?}");
    assert_eq!(got, want);
    let run = curate::train::trained::TrainedRun::load(&whole.path().join("out"), &device).unwrap();
    let texts = run.embed_texts(&["a red circle", "two blue squares"]).unwrap();
    assert_eq!(texts.len(), 2 * 16);
    let s = run.image_size();
    let pixels: Vec<f32> = (0..3 * s * s).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    assert_eq!(run.embed_images(pixels, 1).unwrap().len(), 16);
}

#[test]
fn clip_towers_take_gpo_and_the_papers_heads() {
    // PCME++ (GPO over the ViT's last-block tokens and the text states, log-variance heads,
    // image token dropping) and CUSA (cross and uni-modal heads with LayerNorm on the pooled
    // CLIP embeddings, teacher features): a few steps each, finite losses.
    for sets in [
        &["loss.type=pcmepp", "model.gpo=true", "model.head_style=pcmepp", "model.image_token_drop=0.2"][..],
        &[
            "loss.type=cusa",
            "model.head_style=cusa",
            "data.teacher_image=[\"data/train_sample/teacher_image.parquet\"]",
            "data.teacher_text=[\"data/train_sample/teacher_text.parquet\"]",
        ][..],
    ] {
        let dir = tempfile::tempdir().unwrap();
        let c = clip_config(dir.path(), &[&["steps=3"], sets].concat());
        train(&c, &TrainOptions::default()).unwrap_or_else(|e| panic!("{sets:?}: {e}"));
        let l = losses(&dir.path().join("out"));
        assert!(l.len() == 3 && l.iter().all(|(_, v)| v.is_finite()), "{sets:?}: {l:?}");
    }
}

#[test]
fn pcmepp_log_variance_branches_run_a_new_block_on_the_states_before_the_last() {
    // `model.log_variance_block`: v = GPO_v(Linear_v(block_v(states before the last block))),
    // by hand against the model's own; the run trains and resumes bit for bit.
    let sets = ["loss.type=pcmepp", "model.gpo=true", "model.head_style=pcmepp", "model.log_variance_block=true"];
    let dir = tempfile::tempdir().unwrap();
    let c = clip_config(dir.path(), &sets);
    let device = Device::flex();
    let heads = Heads { uni: false, log_variance: true };
    let model = DualEncoder::init(&c.model, heads, c.seed, &device).unwrap();
    let (vit, block) = (model.image_vit.as_ref().unwrap(), model.image_log_var_block.as_ref().unwrap());
    assert!(model.text_log_var_block.is_some());
    let pixels: Vec<f32> = (0..2 * 3 * 32 * 32).map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0).collect();
    let images = || Tensor::<4>::from_data(TensorData::new(pixels.clone(), [2, 3, 32, 32]), &device);
    let (_, v) = model.encode_image_with_log_var(images());
    let (mu_tokens, before) = vit.forward_tokens_split(images());
    let tokens = vit.run_block(block, before.clone());
    let n = tokens.dims()[1];
    let gpo = model.image_log_var_gpo.as_ref().unwrap();
    let want = gpo.forward(model.image_log_var.as_ref().unwrap().forward(tokens), &[n, n]);
    let (got, want) =
        (v.unwrap().into_data().try_to_vec::<f32>().unwrap(), want.into_data().try_to_vec::<f32>().unwrap());
    assert_eq!(got, want);
    // Not μ's tokens: the branch differs from the last block's output.
    let shared = gpo.forward(model.image_log_var.as_ref().unwrap().forward(mu_tokens), &[n, n]);
    assert_ne!(got, shared.into_data().try_to_vec::<f32>().unwrap());
    // PCME++'s rates (§3.10): ViT block k of 2 at 0.01 · 0.7^(2 − k), the text tower's at
    // 0.1 · 0.7^(2 − k), each new block as its tower's last; embeddings at the scale, heads whole.
    let oc = curate::train::config::OptimConfig {
        layer_decay: 0.7,
        image_backbone_lr_scale: 0.01,
        text_backbone_lr_scale: 0.1,
        ..Default::default()
    };
    let policy = curate::train::optim::LrGroups::new(model.lr_groups(&oc)).policy(1.0);
    let rates = |m: &dyn Fn(&mut Vec<burn::module::ParamId>)| {
        let mut ids = Vec::new();
        m(&mut ids);
        let r: std::collections::BTreeSet<String> =
            ids.into_iter().map(|id| format!("{:.6}", policy.lr_from_param(id, None))).collect();
        r.into_iter().collect::<Vec<_>>()
    };
    use curate::train::optim::param_ids;
    let text = model.text_clip.as_ref().unwrap();
    let near = |x: f64| format!("{x:.6}");
    for k in 0..2 {
        let decay = 0.7f64.powi(2 - k as i32);
        assert_eq!(rates(&|ids| ids.extend(param_ids(&vit.blocks()[k]))), [near(0.01 * decay)], "ViT block {k}");
        assert_eq!(rates(&|ids| ids.extend(param_ids(&text.blocks()[k]))), [near(0.1 * decay)], "text block {k}");
    }
    assert_eq!(rates(&|ids| ids.extend(param_ids(block))), [near(0.007)]);
    assert_eq!(rates(&|ids| ids.extend(param_ids(model.text_log_var_block.as_ref().unwrap()))), [near(0.07)]);
    assert_eq!(rates(&|ids| ids.extend(param_ids(&model.image_log_var))), [near(1.0)]);

    let (_whole, want, got) = whole_and_resumed(|d| clip_config(d, &sets), 4);
    assert!(want.len() == 6 && want.iter().all(|(_, l)| l.is_finite()), "{want:?}");
    assert_eq!(got, want);
    // Without CLIP's towers it is refused.
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &[]);
    let out = format!("output_dir={}", dir.path().join("out").display());
    let e =
        TrainConfig::load(&dir.path().join("train.toml"), &[out, "model.log_variance_block=true".into()]).unwrap_err();
    assert!(e.to_string().contains("`model.log_variance_block`: is PCME++'s branch on CLIP's towers"), "{e}");
}

#[test]
fn a_clip_folder_that_does_not_say_quick_gelu_gets_a_note() {
    // OpenAI's weights need QuickGELU, and open_clip folders saved from the plain model config
    // leave the key out: the run says which activation it took.
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("clip");
    std::fs::create_dir(&folder).unwrap();
    for f in ["open_clip_model.safetensors", "tokenizer.json"] {
        std::fs::copy(Path::new("tests/fixtures/models/tiny_open_clip").join(f), folder.join(f)).unwrap();
    }
    let config = std::fs::read_to_string("tests/fixtures/models/tiny_open_clip/open_clip_config.json").unwrap();
    assert!(config.contains("\"quick_gelu\": true"));
    std::fs::write(folder.join("open_clip_config.json"), config.replace("\"quick_gelu\": true,", "")).unwrap();
    std::fs::write(dir.path().join("clip.toml"), CLIP_BASE).unwrap();
    let run = |out: &str, extra: &[&str]| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_curate"));
        cmd.arg("train").arg(dir.path().join("clip.toml")).args(["--progress", "never"]);
        for s in
            [format!("output_dir={}", dir.path().join(out).display()), format!("model.clip.dir={}", folder.display())]
                .iter()
                .map(String::as_str)
                .chain(["steps=1"])
                .chain(extra.iter().copied())
        {
            cmd.args(["--set", s]);
        }
        let o = cmd.output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let said = run("a", &[]);
    assert!(said.contains("does not say `quick_gelu`: the towers use exact GELU"), "{said}");
    assert!(!run("b", &["model.clip.quick_gelu=true"]).contains("quick_gelu"));
}

#[test]
fn clip_config_errors_name_their_keys() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("clip.toml");
    std::fs::write(&file, CLIP_BASE).unwrap();
    let load = |sets: &[&str]| {
        let mut o = vec![format!("output_dir={}", dir.path().join("out").display())];
        o.extend(sets.iter().map(|s| s.to_string()));
        TrainConfig::load(&file, &o).unwrap_err().to_string()
    };
    let e = load(&["model.image_size_px=64", "model.image.preset=resnet50", "model.clip.max_tokens=17"]);
    assert!(e.contains("`model.image_size_px`: is 64, and the CLIP ViT's positions are for 32 px"), "{e}");
    assert!(
        e.contains("`model.image`: sets a ResNet or FBNet image tower, and `[model.clip]` brings CLIP's ViT"),
        "{e}"
    );
    assert!(e.contains("`model.clip.max_tokens`: 17 tokens do not fit the text tower"), "{e}");
    let e = load(&["model.text.dir=data/train_sample/text_model"]);
    assert!(e.contains("`model.clip`: brings its own text tower: `[model.text]` is set too"), "{e}");
    let e = load(&["model.clip.dir=data/train_sample"]);
    assert!(e.contains("`model.clip.dir`: `data/train_sample` has no `open_clip_config.json`"), "{e}");
    // Neither tower.
    std::fs::write(&file, CLIP_BASE.replace("[model.clip]\ndir = \"tests/fixtures/models/tiny_open_clip\"\n", ""))
        .unwrap();
    let e = load(&[]);
    assert!(e.contains("`model`: has no text tower"), "{e}");
}

#[test]
fn the_cusa_and_pcmepp_clip_presets_are_valid_training_files() {
    // `pipelines/train_cusa_clip.toml` with the tiny CLIP folder and the bundled sample in place
    // of the checkpoints and COCO it names: every other key as the preset sets it.
    let sets: Vec<String> = [
        "model.clip.dir=tests/fixtures/models/tiny_open_clip",
        "model.image_size_px=32",
        r#"data.tables=["data/train_sample/train.parquet"]"#,
        "eval.retrieval.images=data/train_sample/retrieval_images.parquet",
        "eval.retrieval.captions=data/train_sample/retrieval_captions.parquet",
        r#"data.teacher_image=["data/train_sample/teacher_image.parquet"]"#,
        r#"data.teacher_text=["data/train_sample/teacher_text.parquet"]"#,
    ]
    .map(String::from)
    .to_vec();
    let c = TrainConfig::load(Path::new("pipelines/train_cusa_clip.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.loss.loss_type(), LossType::Cusa);
    assert_eq!((c.batch_size, c.epochs, c.seed), (128, Some(30), 23));
    assert!(c.model.clip.is_some() && c.model.text.is_none() && c.data.pre_caption && c.optim.no_weight_decay_1d);
    assert_eq!(c.model.clip.as_ref().unwrap().quick_gelu, Some(true), "OpenAI's ViT-B/32");
    assert!(c.eval.as_ref().is_some_and(|e| e.select_best && e.images.is_none()), "selection on COCO dev");

    // `pipelines/train_pcmepp_clip.toml` likewise, and it trains: three epochs of 9 batches, the
    // image tower frozen in the first two, SWA from the second, a model selected at each epoch's end.
    let dir = tempfile::tempdir().unwrap();
    let mut sets = sets[..5].to_vec();
    let out = format!("output_dir={}", dir.path().join("out").display());
    sets.extend([out, "epochs=3".into(), "batch_size=64".into(), "optim.swa_start_epoch=1".into()]);
    // (`every_steps = 2` would evaluate every second step: the preset's `every_epochs = 1` wins.)
    sets.push("eval.every_steps=2".into());
    let c = TrainConfig::load(Path::new("pipelines/train_pcmepp_clip.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.loss.loss_type(), LossType::Pcmepp);
    assert!(c.model.gpo && c.model.log_variance_block && c.data.msda.is_some() && c.model.embed_dim == 1024);
    assert!(c.data.caption_augment, "PCME++'s caption augmentation, CLIP's BPE branch");
    let s = train(&c, &TrainOptions::default()).unwrap();
    assert_eq!(s.steps, 27);
    assert!(dir.path().join("out/model_swa.bpk").is_file());
    assert!(s.best.is_some_and(|(step, _)| [9, 18, 27].contains(&step)), "{:?}", s.best);
    let validated: Vec<u64> = std::fs::read_to_string(dir.path().join("out/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("val_rsum").is_some())
        .map(|v| v["step"].as_u64().unwrap())
        .collect();
    assert_eq!(validated, [9, 18, 27], "at each epoch's end");
    assert!(dir.path().join("out/model_best.bpk").is_file());
    assert!(s.last_loss.is_finite(), "{}", s.last_loss);
}

#[test]
fn the_otter_and_fistful_presets_are_valid_training_files_that_train() {
    // `pipelines/train_otter_paper.toml` with tiny stand-ins for the checkpoints and CC3M it
    // names (the tiny ResNet as a `.pth.tar` training checkpoint is not bundled, so the
    // safetensors one; the tiny BERT for DeCLUTR-Sci-base, a BERT too): every other key as the
    // preset sets it, then two steps of the OTTER loss.
    use curate::losses::LossConfig;
    use curate::train::config::Schedule;
    let dir = tempfile::tempdir().unwrap();
    let sets: Vec<String> = [
        "model.image.preset=tiny",
        "model.image.checkpoint=tests/fixtures/models/tiny_resnet.safetensors",
        "model.text.dir=tests/fixtures/models/tiny_bert",
        "model.text.max_tokens=16",
        "model.image_size_px=32",
        r#"data.tables=["data/train_sample/train.parquet"]"#,
    ]
    .map(String::from)
    .to_vec();
    let c = TrainConfig::load(Path::new("pipelines/train_otter_paper.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
    let LossConfig::Otter(o) = &c.loss else { panic!("{:?}", c.loss) };
    assert_eq!((o.alpha, o.gamma_v, o.gamma_t, o.sinkhorn_lambda, o.sinkhorn_iterations), (0.5, 1.0, 1.0, 0.15, 5));
    assert_eq!(o.teacher_momentum, 0.999);
    assert_eq!((c.batch_size, c.epochs, c.optim.lr, c.optim.weight_decay), (512, Some(10), 3e-3, 0.0));
    assert_eq!(c.optim.schedule, Schedule::CosinePerEpoch);
    assert_eq!(c.model.embed_dim, 768);
    // Table 2's FBNetV3 rows, as the header's `--set` lines give them.
    let mut fbnet = sets.clone();
    fbnet[0] = "model.image.preset=tiny_fbnet".into();
    fbnet[1] = "model.image.checkpoint=tests/fixtures/models/fbnet/tiny_fbnet_model.pth".into();
    let f = TrainConfig::load(Path::new("pipelines/train_otter_paper.toml"), &fbnet).unwrap_or_else(|e| panic!("{e}"));
    assert!(f.model.image.preset.fbnet().is_some());
    assert!(std::fs::read_to_string("pipelines/train_otter_paper.toml").unwrap().contains("preset=fbnetv3_a"));
    // Two steps instead of its ten epochs (`steps` and `epochs` exclude each other).
    let file = dir.path().join("otter.toml");
    let text = std::fs::read_to_string("pipelines/train_otter_paper.toml").unwrap();
    assert!(text.contains("epochs = 10\n"));
    std::fs::write(&file, text.replace("epochs = 10\n", "steps = 2\n")).unwrap();
    let mut sets = sets;
    sets.extend([format!("output_dir={}", dir.path().join("out").display()), "batch_size=64".into()]);
    let c = TrainConfig::load(&file, &sets).unwrap_or_else(|e| panic!("{e}"));
    let s = train(&c, &TrainOptions::default()).unwrap();
    assert_eq!(s.steps, 2);
    assert!(s.last_loss.is_finite(), "{}", s.last_loss);

    // The Fistful preset likewise (its `epochs = 20` taken out the same way).
    let text = std::fs::read_to_string("pipelines/train_paper.toml").unwrap();
    assert!(text.contains("epochs = 20\n"));
    let file = dir.path().join("fistful.toml");
    std::fs::write(&file, text.replace("epochs = 20\n", "steps = 2\n")).unwrap();
    sets.push(format!("output_dir={}", dir.path().join("fistful").display()));
    let c = TrainConfig::load(&file, &sets).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.loss.loss_type(), LossType::MemoryBank);
    assert_eq!((c.optim.lr, c.optim.schedule), (3e-3, Schedule::CosinePerEpoch));
    let s = train(&c, &TrainOptions::default()).unwrap();
    assert_eq!(s.steps, 2);
    assert!(s.last_loss.is_finite(), "{}", s.last_loss);
}

#[test]
fn model_image_checkpoint_prefix_reads_the_tower_from_under_it() {
    // The tiny ResNet under `module.encoder_q.` beside a key encoder, as MoCo saves it: with
    // `model.image.checkpoint_prefix` the run's image tower is the bare model's (same pooled
    // features before any step); without it the checkpoint does not fit.
    let src = Path::new("tests/fixtures/models/tiny_resnet.safetensors");
    let bytes = std::fs::read(src).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut parts: Vec<(String, safetensors::tensor::TensorView)> = Vec::new();
    for (n, v) in st.tensors() {
        parts.push((format!("module.encoder_q.{n}"), v.clone()));
        parts.push((format!("module.encoder_k.{n}"), v));
    }
    let dir = tempfile::tempdir().unwrap();
    let moco = dir.path().join("moco.safetensors");
    std::fs::write(&moco, safetensors::serialize(parts, None).unwrap()).unwrap();
    let device = Device::flex();
    let tower = |checkpoint: &Path, prefix: Option<&str>| {
        let mut sets = vec![format!("model.image.checkpoint={}", checkpoint.display())];
        sets.extend(prefix.map(|p| format!("model.image.checkpoint_prefix={p}")));
        let c = TrainConfig::load(Path::new("pipelines/train.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
        DualEncoder::init(&c.model, Heads::default(), c.seed, &device).map(|m| {
            let x = Tensor::<4>::ones([1, 3, 32, 32], &device);
            m.image_features(x).into_data().try_to_vec::<f32>().unwrap()
        })
    };
    let bare = tower(src, None).unwrap();
    assert_eq!(tower(&moco, Some("module.encoder_q.")).unwrap(), bare);
    let e = tower(&moco, None).err().unwrap().to_string();
    assert!(e.contains("does not fit"), "{e}");
}

#[test]
fn zero_shot_labels_name_one_class_by_a_synonym_or_by_number() {
    // A name two classes list (OTTER's GOI list repeats names) would have sent every such label
    // to the first class unsaid; it is refused, and `#N` names a class by its number.
    use arrow_array::{ArrayRef, RecordBatch, StringArray};
    use curate::train::zeroshot::ZeroShot;
    let dir = tempfile::tempdir().unwrap();
    let classes = dir.path().join("classes.txt");
    std::fs::write(&classes, "# three classes\nred circle|disc\nblue square\ndisc|blue circle\n").unwrap();
    let table = |labels: &[&str]| {
        let path = "data/train_sample/images/eval_red_circle_00.png";
        let batch = RecordBatch::try_from_iter([
            ("path", Arc::new(StringArray::from(vec![path; labels.len()])) as ArrayRef),
            ("label", Arc::new(StringArray::from(labels.to_vec())) as ArrayRef),
        ])
        .unwrap();
        let file = dir.path().join("zs.parquet");
        common::write_parquet(&file, &batch);
        let c = config(
            dir.path(),
            &[&format!("eval.images=\"{}\"", file.display()), &format!("eval.classes=\"{}\"", classes.display())],
        );
        ZeroShot::load(&c.eval.unwrap(), &ImageTransform::of_kind(ImageTransformKind::RandomResizedCrop, 16), false)
    };
    let e = table(&["red circle", "disc"]).err().expect("an ambiguous label").to_string();
    assert!(e.contains("label `disc` names 2 classes of `") && e.contains("(#0, #2)"), "{e}");
    assert!(e.contains("give the class by its number: `#N`"), "{e}");
    let z = table(&["red circle", "#2", "blue square|#0"]).unwrap();
    assert_eq!(z.shared_names, ["disc"]);
    let note = curate::train::zeroshot::shared_names_note(&z.shared_names).unwrap();
    assert!(note.starts_with("1 zero-shot class name(s) are listed by more than one class (`disc`)"), "{note}");
    let e = table(&["#3"]).err().expect("past the last class").to_string();
    assert!(e.contains("label `#3` is not a class of") && e.contains("has 3 classes, numbered from #0"), "{e}");
}

#[test]
fn keep_prompts_needs_a_pcmepp_run_and_a_count_within_the_templates() {
    let dir = tempfile::tempdir().unwrap();
    config(dir.path(), &[]);
    let file = dir.path().join("train.toml");
    let load = |sets: &[&str]| {
        let mut all = vec![
            format!("output_dir={}", dir.path().join("out").display()),
            "eval.images=data/train_sample/zeroshot.parquet".into(),
            "eval.classes=data/train_sample/classes.txt".into(),
            r#"eval.templates=["a {}", "a photo of a {}"]"#.into(),
        ];
        all.extend(sets.iter().map(|s| s.to_string()));
        TrainConfig::load(&file, &all)
    };
    let e = load(&["eval.keep_prompts=1"]).unwrap_err().to_string();
    assert!(e.contains("eval.keep_prompts") && e.contains("this run does not train `pcmepp`"), "{e}");
    for k in ["0", "3"] {
        let e = load(&["loss.type=pcmepp", &format!("eval.keep_prompts={k}")]).unwrap_err().to_string();
        assert!(e.contains("must be from 1 to the number of templates (2)"), "{k}: {e}");
    }
    let c = load(&["loss.type=pcmepp", "eval.keep_prompts=1"]).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.eval.unwrap().keep_prompts, Some(1));
}

#[test]
fn an_fbnetv3_image_tower_starts_from_its_model_zoo_checkpoint_and_trains() {
    // `model.image.preset = "tiny_fbnet"` with mobile-vision's model zoo `model.pth` form (the
    // moving average and the trained weights under `module.`): the tower before any step is
    // `FbNet::load`'s (the average), it trains, and the saved run gives the trained tower's
    // features back. `width`/`layers` (a ResNet's sizes) and GPO (no grid) are refused.
    use curate::models::fbnet::{FbNet, FbNetConfig};
    let pth = Path::new("tests/fixtures/models/fbnet/tiny_fbnet_model.pth");
    let device = Device::flex();
    let dir = tempfile::tempdir().unwrap();
    let sets = [
        "model.image.preset=tiny_fbnet".to_string(),
        format!("model.image.checkpoint={}", pth.display()),
        format!("output_dir={}", dir.path().join("out").display()),
        "steps=3".into(),
        "checkpoint_every=3".into(),
    ];
    let c = TrainConfig::load(Path::new("pipelines/train.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
    let x = || {
        Tensor::<4>::from_data(
            TensorData::new(
                (0..2 * 3 * 32 * 32).map(|i| ((i % 29) as f32 - 14.0) / 9.0).collect::<Vec<_>>(),
                [2, 3, 32, 32],
            ),
            &device,
        )
    };
    let init = DualEncoder::init(&c.model, Heads::default(), c.seed, &device).unwrap();
    let direct = FbNet::load(pth, &FbNetConfig::tiny(), &device).unwrap();
    let start = init.image_features(x()).into_data().try_to_vec::<f32>().unwrap();
    assert_eq!(start, direct.forward(x()).into_data().try_to_vec::<f32>().unwrap());
    assert_eq!(start.len(), 2 * 64);
    let s = train(&c, &TrainOptions::default()).unwrap();
    assert_eq!(s.steps, 3);
    assert!(s.last_loss.is_finite(), "{}", s.last_loss);
    let run = curate::train::trained::TrainedRun::load(&dir.path().join("out"), &device).unwrap();
    let pixels = x().into_data().try_to_vec::<f32>().unwrap();
    let (end, width) = run.image_features(pixels, 2).unwrap();
    assert_eq!(width, 64);
    assert!(end.iter().zip(&start).any(|(a, b)| (a - b).abs() > 1e-4), "the tower trained");

    for (set, want) in [
        ("model.image.width=16", "`model.image.width`: sizes a ResNet; an FBNetV3 preset is one fixed"),
        ("model.image.layers=[1, 1, 1, 1]", "`model.image.layers`: sizes a ResNet"),
        ("model.gpo=true", "FBNetV3 pools inside its head"),
        ("model.image_size_px=24", "24 pixels are too few for FBNetV3: its strided convolutions need at least 25"),
    ] {
        let mut sets = sets.to_vec();
        sets.push(set.into());
        let Err(e) = TrainConfig::load(Path::new("pipelines/train.toml"), &sets) else { panic!("{set} was taken") };
        let e = e.to_string();
        assert!(e.contains(want), "{set}: {e}");
    }
}

#[test]
fn a_finished_run_is_evaluated_without_the_checkpoints_it_started_from() {
    // A run from a pretrained image checkpoint and a pretrained BERT folder: once it has
    // finished, its model.bpk holds every tensor, so loading it reads neither checkpoint. With
    // both removed (the BERT folder keeps its config.json and tokenizer.json), the run gives
    // the same embeddings as before.
    let dir = tempfile::tempdir().unwrap();
    let bert = dir.path().join("bert");
    std::fs::create_dir(&bert).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(Path::new("tests/fixtures/models/tiny_bert").join(f), bert.join(f)).unwrap();
    }
    let image = dir.path().join("resnet.safetensors");
    std::fs::copy("tests/fixtures/models/tiny_resnet.safetensors", &image).unwrap();
    let sets = [
        format!("model.image.checkpoint={}", image.display()),
        format!("model.text.dir={}", bert.display()),
        "model.text.pretrained=true".into(),
        "model.text.max_tokens=16".into(),
        format!("output_dir={}", dir.path().join("out").display()),
        "steps=2".into(),
    ];
    let c = TrainConfig::load(Path::new("pipelines/train.toml"), &sets).unwrap_or_else(|e| panic!("{e}"));
    train(&c, &TrainOptions::default()).unwrap();
    let device = Device::flex();
    let pixels: Vec<f32> = (0..2 * 3 * 32 * 32).map(|i| ((i % 23) as f32 - 11.0) / 7.0).collect();
    let embed = || {
        let run = curate::train::trained::TrainedRun::load(&dir.path().join("out"), &device).unwrap();
        (run.embed_images(pixels.clone(), 2).unwrap(), run.embed_texts(&["a red circle", "two blue squares"]).unwrap())
    };
    let before = embed();
    std::fs::remove_file(&image).unwrap();
    std::fs::remove_file(bert.join("model.safetensors")).unwrap();
    assert_eq!(embed(), before);
}

/// A parameter's gradient in two sets, flat; `None` where a set has none.
type GradientPair = (Option<Vec<f32>>, Option<Vec<f32>>);

/// Every parameter gradient of `model` in `a` and in `b`, in the module's order.
fn paired_gradients(model: &DualEncoder, a: &GradientsParams, b: &GradientsParams) -> Vec<GradientPair> {
    struct Pair<'a> {
        a: &'a GradientsParams,
        b: &'a GradientsParams,
        out: Vec<GradientPair>,
    }
    impl burn::module::ModuleVisitor for Pair<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            let flat = |g: Option<Tensor<D>>| g.map(|g| g.into_data().try_to_vec::<f32>().unwrap());
            self.out.push((flat(self.a.get::<D>(param.id)), flat(self.b.get::<D>(param.id))));
        }
    }
    let mut v = Pair { a, b, out: Vec::new() };
    model.visit(&mut v);
    v.out
}

/// A loss on every embedding there is, each used more than once (as the papers' losses do).
fn loss_on_all(e: curate::train::dual_encoder::Embeddings, device: &Device) -> Tensor<1> {
    let scale = || curate::losses::common::scalar(10.0, device);
    let mut loss = infonce(e.image.clone(), e.text.clone(), scale(), DirectionReduction::Mean)
        + e.image.clone().mul(e.text.clone()).sum().mul_scalar(1e-3);
    if let (Some(i), Some(t)) = (e.image_uni, e.text_uni) {
        loss = loss + infonce(i.clone(), t, scale(), DirectionReduction::Mean) + i.square().mean();
    }
    if let (Some(i), Some(t)) = (e.image_log_var, e.text_log_var) {
        loss = loss + (i.exp().mean() + t.exp().mean()).mul_scalar(0.5);
    }
    loss
}

/// On the CPU `curate train` cuts the graph at the embeddings and runs the towers' backward
/// passes side by side (`Embeddings::cut`, `TowerCut::backward`): every parameter gets the
/// gradient of one backward pass through everything — bit for bit where each tower's output is
/// one embedding, to rounding where the heads share a tower's features (the sums at the shared
/// features are added in another order) — and a frozen image tower gets none while its heads do.
#[test]
fn the_towers_backward_passes_give_one_passs_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let (c, inputs) = first_batch(dir.path(), &device);
    for heads in [Heads::default(), Heads { uni: true, log_variance: true }] {
        let model = DualEncoder::init(&c.model, heads, 0, &device).unwrap();
        let (images, ids, mask) = inputs();
        let whole =
            GradientsParams::from_grads(loss_on_all(model.forward(images, ids, mask), &device).backward(), &model);
        let cut_grads = |freeze_image: bool| {
            let (images, ids, mask) = inputs();
            let (leaves, cut) = model.forward(images, ids, mask).cut();
            let grads = loss_on_all(leaves, &device).backward();
            let mut into = GradientsParams::new();
            cut.backward(&grads, freeze_image, &model, &mut into);
            into
        };
        let cut = cut_grads(false);
        let pairs = paired_gradients(&model, &whole, &cut);
        assert!(pairs.iter().filter(|(a, _)| a.is_some()).count() > 20, "too few parameters with gradients");
        for (i, (a, b)) in pairs.iter().enumerate() {
            let (Some(a), Some(b)) = (a, b) else {
                assert_eq!(a.is_some(), b.is_some(), "parameter {i}: a gradient on one side only ({heads:?})");
                continue;
            };
            let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
            let worst = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
            if heads == Heads::default() {
                assert!(a == b, "parameter {i}: gradients differ by up to {worst} (of {scale})");
            } else {
                assert!(worst <= 1e-5 * scale + 1e-12, "parameter {i}: gradients differ by up to {worst} (of {scale})");
            }
        }
        // PCME++'s frozen image tower: none for the tower's own parameters, the same for the rest.
        let frozen = cut_grads(true);
        let tower: std::collections::HashSet<_> = model.image_tower_ids().into_iter().collect();
        struct Check<'a> {
            tower: &'a std::collections::HashSet<burn::module::ParamId>,
            frozen: &'a GradientsParams,
            cut: &'a GradientsParams,
            seen: [usize; 2],
        }
        impl burn::module::ModuleVisitor for Check<'_> {
            fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
                let (f, c) = (self.frozen.get::<D>(param.id), self.cut.get::<D>(param.id));
                if self.tower.contains(&param.id) {
                    assert!(f.is_none(), "a frozen image tower's parameter has a gradient");
                    self.seen[0] += c.is_some() as usize;
                } else {
                    assert_eq!(f.is_some(), c.is_some());
                    if let (Some(f), Some(c)) = (f, c) {
                        assert_eq!(
                            f.into_data().try_to_vec::<f32>().unwrap(),
                            c.into_data().try_to_vec::<f32>().unwrap()
                        );
                        self.seen[1] += 1;
                    }
                }
            }
        }
        let mut check = Check { tower: &tower, frozen: &frozen, cut: &cut, seen: [0, 0] };
        model.visit(&mut check);
        assert!(check.seen[0] > 5 && check.seen[1] > 5, "{:?}", check.seen);
    }
}

/// A BatchNorm's running statistics come out the same whichever threads run the training
/// forward passes (the towers run on pool threads on the CPU; burn keeps an update per thread).
#[test]
fn running_statistics_do_not_depend_on_the_forward_passes_threads() {
    let dir = tempfile::tempdir().unwrap();
    let device = Device::flex().autodiff();
    let (c, inputs) = first_batch(dir.path(), &device);
    let one = DualEncoder::init(&c.model, Heads::default(), 0, &device).unwrap();
    let two = DualEncoder::init(&c.model, Heads::default(), 0, &device).unwrap();
    for _ in 0..2 {
        let _ = one.image_features(inputs().0);
    }
    for _ in 0..2 {
        let images = inputs().0;
        std::thread::scope(|s| {
            s.spawn(|| two.image_features(images).into_data());
        });
    }
    let (_, eval_inputs) = first_batch(dir.path(), &Device::flex());
    let (images, _, _) = eval_inputs();
    let encode = |m: &DualEncoder| m.valid().encode_image(images.clone()).into_data().try_to_vec::<f32>().unwrap();
    let (a, b) = (encode(&one), encode(&two));
    let init = DualEncoder::init(&c.model, Heads::default(), 0, &device).unwrap();
    assert_ne!(a, encode(&init), "the training passes changed no running statistics");
    assert!(a == b, "the running statistics depend on the threads that ran the forward passes");
}

/// A run's losses do not depend on the number of threads. On the CPU the two towers run side by
/// side, and so do the EMA teacher's forward pass and the trainee's where no dropout draws random
/// numbers (with dropout the teacher's pass goes first, so that the draws keep their order).
#[test]
fn training_gives_the_same_losses_on_one_thread_and_on_three() {
    for sets in
        [&["loss.type=memory_bank"][..], &["loss.type=memory_bank", "model.text.dropout=0.1"], &["loss.type=pcmepp"]]
    {
        let run = |threads: usize| {
            let dir = tempfile::tempdir().unwrap();
            let mut all = vec!["steps=4"];
            all.extend_from_slice(sets);
            let c = config(dir.path(), &all);
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| train(&c, &TrainOptions::default())).unwrap();
            losses(&dir.path().join("out"))
        };
        let one = run(1);
        assert_eq!(one.len(), 4, "{sets:?}");
        assert_eq!(one, run(3), "{sets:?}");
    }
}
