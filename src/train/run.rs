//! The training loop of `curate train`: builds the dual encoder and the loss's learnable
//! scalars, writes the resolved config to `output_dir/config.json` before anything else, then
//! steps through batches from [`super::data::Loader`], logging `metrics.jsonl` (one JSON object
//! per line: training lines with `step`, `loss`, `lr`, `samples_per_s`; evaluation lines with
//! `step`, `zeroshot_top1`, `_top2`, `_top5`, `_top10`, `zeroshot_classes`), writing checkpoints
//! atomically (a `step-N.tmp` folder renamed into place) and the final model.
//!
//! A checkpoint holds everything the next step depends on — model and loss parameters (with
//! their parameter ids, which key the optimiser state), both optimisers' state, the EMA teacher,
//! the memory bank, the EMA update count and the step. The data position is the step itself
//! (batches are a pure function of seed and step, see [`super::data`]), so `--resume`
//! reproduces an uninterrupted run's losses exactly. A NaN or infinite loss stops the run before
//! the optimiser applies it; the last checkpoint written stays the last good one.
//!
//! EMA teachers (memory bank, KD, OTTER): a copy of the student at initialisation, updated at
//! the start of every step, before the teacher forward (spec `bow-and-otter.md` §4 step 2, §5.6),
//! in training mode (BatchNorm on batch statistics, as the reference). The teacher's BatchNorm
//! running statistics are its own (`ema_teacher`; burn's `clone` would share the student's, and
//! the teacher's forwards would move them) and are not averaged.
//!
//! On the CPU a step runs its independent halves side by side on rayon's pool: the two towers
//! (`DualEncoder::forward_dropping`), their backward passes from the graph cut at the embeddings
//! (`Embeddings::cut`, `TowerCut::backward`: the same gradients as one pass) and, where no dropout
//! draws random numbers, the EMA teacher's forward beside the trainee's. Losses do not depend on
//! the number of threads.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::{Device, Int, Tensor, TensorData};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::config::{ClipScope, OptimConfig, TrainConfig};
use super::data::{Batch, BatchMaker, Loader, TrainSet};
use super::dual_encoder::{merge_gradients, DualEncoder, Embeddings, Heads};
use super::optim::{clip_global, linear_weights, LrGroups};
use super::zeroshot::{ZeroShot, ZeroShotScores};
use crate::error::{Error, Result};
use crate::losses::common::{l2_normalize, LogitScale};
use crate::losses::cusa::{cusa, CusaBatch, CusaTemperatures};
use crate::losses::memory_bank::{ema_decay, ema_teacher, ema_update, ema_update_trainable, MemoryBank};
use crate::losses::pcmepp::{msda_labels, pair_labels, pcmepp, MatchScale};
use crate::losses::{infonce, kd, label_smoothing, otter, LossConfig};

/// Held from seeding the device's random stream to the step's last dropout mask.
static DROPOUT_STREAM: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runtime knobs (flags, not config: they do not change the result).
#[derive(Debug, Clone)]
pub struct TrainOptions {
    /// Continue from the newest checkpoint in `output_dir`.
    pub resume: bool,
    /// Data worker threads.
    pub workers: usize,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// Where to train (an autodiff device is made from it).
    pub device: Device,
    /// Stop (as if killed) after this many steps in total, without the final model (tests of
    /// `--resume`).
    pub stop_after: Option<u64>,
    /// Ctrl-C during the loop stops the run after its step, with a checkpoint there
    /// ([`super::interrupt`]; `curate train` sets it). Off, SIGINT is left as it is.
    pub stop_on_ctrl_c: bool,
    /// Replace the loss of this step (1-based) by NaN (tests of the NaN guard).
    pub inject_nan_at: Option<u64>,
    /// Print where each step's time goes on stderr, one line per step (`curate train
    /// --trace-steps`).
    pub trace_steps: bool,
    /// Write a sampling profile of steps 4 to 10 here (`curate train --sample-profile`; needs
    /// the `sampling-profile` build feature).
    pub sample_profile: Option<PathBuf>,
}

/// Runs `say` (a line to stderr) with the progress bar, if there is one, out of its way.
fn above_bar(bar: &Option<indicatif::ProgressBar>, say: impl FnOnce()) {
    match bar {
        Some(b) => b.suspend(say),
        None => say(),
    }
}

/// Where a training step's wall time goes, for `curate train --trace-steps`: one stderr line per
/// step with the milliseconds of each phase, in order: `batch` (waiting for the data workers),
/// `upload` (the batch to the device), `teacher` (EMA update and teacher forward; on the CPU
/// without dropout the teacher's forward runs beside the trainee's, in `forward`), `forward`
/// (the forward pass and the loss; on a GPU, launching their kernels, which returns before they
/// finish unless something waits for them), `loss_read` (waiting for the loss value), `backward`,
/// `optim`, and `drain` (waiting for the device to finish the step: only when tracing, so a
/// traced run is slightly slower). Checkpoints and evaluations fall between steps, outside it.
struct StepTrace {
    on: bool,
    last: Instant,
    laps: Vec<(&'static str, f64)>,
}

impl StepTrace {
    fn new(on: bool) -> StepTrace {
        StepTrace { on, last: Instant::now(), laps: Vec::new() }
    }

    /// Ends phase `name` now.
    fn lap(&mut self, name: &'static str) {
        if self.on {
            let now = Instant::now();
            self.laps.push((name, (now - self.last).as_secs_f64() * 1e3));
            self.last = now;
        }
    }

    /// The step's line (`batch 3.2, upload 51.5, …`).
    fn take(&mut self) -> String {
        let line: Vec<String> = self.laps.drain(..).map(|(n, ms)| format!("{n} {ms:.1}")).collect();
        line.join(", ")
    }

    /// The next step starts now (what came between two steps is left out).
    fn restart(&mut self) {
        self.last = Instant::now();
    }
}

impl Default for TrainOptions {
    fn default() -> Self {
        TrainOptions {
            resume: false,
            workers: 2,
            progress: false,
            device: Device::flex(),
            stop_after: None,
            stop_on_ctrl_c: false,
            inject_nan_at: None,
            trace_steps: false,
            sample_profile: None,
        }
    }
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct TrainSummary {
    /// The step the run ended at.
    pub steps: u64,
    /// The steps of the whole run (`steps`, or `epochs` in steps).
    pub total_steps: u64,
    /// The step it started from (0, or a resumed checkpoint's).
    pub resumed_at: u64,
    /// The step of `first_zeroshot` (0, or a resumed run's first evaluation).
    pub first_zeroshot_step: u64,
    pub last_loss: f32,
    pub first_zeroshot: Option<ZeroShotScores>,
    pub last_zeroshot: Option<ZeroShotScores>,
    pub output_dir: PathBuf,
    pub seconds: f64,
    pub rows: usize,
    /// Training images met in this run's batches that cannot be decoded (each left out).
    pub undecodable_images: usize,
    /// The rows naming them that came up in those batches (several rows may name one image).
    pub undecodable_rows: usize,
    /// Stopped by Ctrl-C at `steps`, with a checkpoint there (no final model).
    pub interrupted: bool,
    /// `eval.select_best`: the selected model's step and validation RSUM (`model_best.bpk`).
    pub best: Option<(u64, f64)>,
}

/// The loss's learnable scalars.
#[derive(Module, Debug)]
pub struct LossParams {
    /// InfoNCE-family logit scale (InfoNCE, memory bank, LS, and the NCE term of KD / OTTER).
    pub scale: Option<LogitScale>,
    /// The distillation scale of KD / OTTER (absent when tied).
    pub distill_scale: Option<LogitScale>,
    pub cusa: Option<CusaTemperatures>,
    pub pcme: Option<MatchScale>,
}

impl LossParams {
    fn init(loss: &LossConfig, device: &Device) -> LossParams {
        let mut p = LossParams { scale: None, distill_scale: None, cusa: None, pcme: None };
        let learnable = |log: f64, min: f64, max: f64| LogitScale::from_log_scale(log, true, min, max, device);
        match loss {
            LossConfig::Infonce(c) => p.scale = Some(c.init_scale(device)),
            LossConfig::MemoryBank(c) => p.scale = Some(c.init_scale(device)),
            LossConfig::LabelSmoothing(c) => {
                p.scale = Some(learnable(c.init_log_scale, c.min_logit_scale, c.max_logit_scale))
            }
            LossConfig::Kd(c) => {
                p.scale = Some(learnable(c.init_log_scale, c.min_logit_scale, c.max_logit_scale));
                p.distill_scale = Some(learnable(c.init_log_scale, c.min_logit_scale, c.max_logit_scale));
            }
            LossConfig::Otter(c) => {
                p.scale = Some(learnable(c.init_log_scale, c.min_logit_scale, c.max_logit_scale));
                if !c.tie_temperatures {
                    p.distill_scale = Some(learnable(c.init_log_scale, c.min_logit_scale, c.max_logit_scale));
                }
            }
            LossConfig::Cusa(c) => p.cusa = Some(CusaTemperatures::init(c, device)),
            LossConfig::Pcmepp(c) => p.pcme = Some(MatchScale::init(c, device)),
        }
        p
    }
}

/// Student and loss parameters: one record per checkpoint.
#[derive(Module, Debug)]
pub struct Trainee {
    pub encoder: DualEncoder,
    pub loss: LossParams,
}

/// The EMA momentum of a loss with a teacher, and whether it warms up (OTTER's schedule).
fn teacher_momentum(loss: &LossConfig) -> Option<(f64, bool)> {
    match loss {
        LossConfig::MemoryBank(c) => Some((c.momentum, false)),
        LossConfig::Kd(c) => Some((c.teacher_momentum, true)),
        LossConfig::Otter(c) => Some((c.teacher_momentum, true)),
        _ => None,
    }
}

pub(crate) fn heads(loss: &LossConfig) -> Heads {
    Heads { uni: matches!(loss, LossConfig::Cusa(_)), log_variance: matches!(loss, LossConfig::Pcmepp(_)) }
}

/// Checkpoint bookkeeping stored in `state.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    step: u64,
    loss: f32,
    ema_updates: u64,
    bank: Option<BankState>,
    /// Epoch ends averaged into the SWA weights so far (`swa.bpk`).
    #[serde(default)]
    swa_snapshots: u64,
    /// `eval.select_best`: the selected step and RSUM so far (the checkpoint keeps its
    /// `model_best.bpk`), so that a resumed run selects from the checkpoint's past only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    best: Option<(u64, f64)>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct BankState {
    size: usize,
    dim: usize,
    filled: usize,
    next: usize,
    last: Option<(usize, usize)>,
}

/// Everything that changes from step to step.
struct Run {
    trainee: Trainee,
    teacher: Option<DualEncoder>,
    bank: Option<MemoryBank>,
    optim_encoder: ModuleOptimizer,
    optim_loss: ModuleOptimizer,
    ema_updates: u64,
    /// PCME++'s SWA: the running mean of the trainee at the epoch ends so far, and their count.
    swa: Option<Trainee>,
    swa_snapshots: u64,
}

fn record_err(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Model { message: format!("cannot {what} `{}`: {e}", path.display()), hint: None }
}

fn tensor_bytes(t: Tensor<2>) -> Result<Vec<u8>> {
    let v = t.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?;
    Ok(v.iter().flat_map(|x| x.to_le_bytes()).collect())
}

fn tensor_from_bytes(bytes: &[u8], shape: [usize; 2], device: &Device) -> Tensor<2> {
    let v: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    Tensor::from_data(TensorData::new(v, shape), device)
}

fn checkpoint_dir(output: &Path, step: u64) -> PathBuf {
    output.join("checkpoints").join(format!("step-{step:08}"))
}

/// Refuses an output folder a training run would write over without being asked: one whose
/// `config.json` is no training run's (a pipeline's output, a model folder, someone's own), or one
/// that holds a `curate run` output, and, without `--resume`, one holding an unfinished run of
/// this very config (`--resume` forgotten: starting over would delete its checkpoints). An
/// unfinished run of other settings is started over, with a note (the advice after a NaN loss).
fn check_output_folder(out: &Path, resume: bool, config_now: &TrainConfig) -> Result<()> {
    let path = out.join("config.json");
    let bytes = match std::fs::read(&path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(Error::io("cannot read", &path, e)),
    };
    // Not UTF-8 is no run's either: taken for no file, it would be written over.
    let config = bytes.map(String::from_utf8);
    let foreign = match &config {
        Some(Err(_)) => Some("a `config.json` that is not UTF-8 text, so no `curate train` run's".to_owned()),
        Some(Ok(text)) => {
            read_earlier_config(text).err().map(|e| format!("a `config.json` that is no `curate train` run's ({e})"))
        }
        None if out.join("manifest.json").is_file() => {
            Some("the output of a `curate run` pipeline (manifest.json)".to_owned())
        }
        None => None,
    };
    let config = config.and_then(|c| c.ok());
    if let Some(what) = foreign {
        return Err(Error::Data {
            message: format!("`{}` holds {what}: training would write over it", out.display()),
            hint: Some("train into a folder of its own (`--set output_dir=out/train_...`)".into()),
        });
    }
    let same_config = config.as_deref().and_then(earlier_config).is_some_and(|b| b.resolved() == *config_now);
    if !resume && same_config && !out.join("model.bpk").is_file() {
        if let Some((step, _)) = last_checkpoint(out) {
            return Err(Error::Data {
                message: format!(
                    "`{}` holds an unfinished run (its last checkpoint is at step {step}): training from step 0 \
                     would delete it",
                    out.display()
                ),
                hint: Some(
                    "add `--resume` to go on from it, train into a new `output_dir`, or remove its `checkpoints/` to \
                     start over"
                        .into(),
                ),
            });
        }
    }
    Ok(())
}

/// The note for an earlier run in `output` that a run from step 0 removes (one of other
/// settings, or a finished one: `--resume` goes on from neither): its `checkpoints`, whether it
/// has a final `model` and `eval/` results.
fn earlier_run_note(output: &Path, checkpoints: usize, model: bool, evals: bool) -> String {
    let mut parts = Vec::new();
    if checkpoints > 0 {
        parts.push(format!("{checkpoints} checkpoint(s)"));
    }
    if model {
        parts.push("final model".to_owned());
    }
    if evals {
        parts.push("`eval/` results".to_owned());
    }
    let what = match parts.split_last() {
        Some((last, [])) => last.clone(),
        Some((last, rest)) => format!("{} and {last}", rest.join(", ")),
        None => "files".to_owned(),
    };
    // One thing: the model alone, or one checkpoint alone.
    let verb = if parts.len() == 1 && (model || checkpoints == 1) { "is" } else { "are" };
    format!(
        "note: `{}` holds an earlier run: its {what} {verb} removed (train into a new `output_dir` to keep them)",
        output.display()
    )
}

/// `eval.select_best`: the selected model's step and RSUM, beside `model_best.bpk`.
const BEST_FILE: &str = "best.json";

/// On resume, the selection as the checkpoint `checkpoint` knew it: its `model_best.bpk` and
/// `best.json` put back in `output`, or none (a selection after the checkpoint's step belongs
/// to steps the run takes again).
fn restore_best(output: &Path, checkpoint: &Path, best: Option<(u64, f64)>) -> Result<Option<(u64, f64)>> {
    let (model, file) = (output.join("model_best.bpk"), output.join(BEST_FILE));
    match best {
        Some((step, rsum)) => {
            let kept = checkpoint.join("model_best.bpk");
            let tmp = crate::io::tmp_path(&model);
            std::fs::copy(&kept, &tmp).map_err(|e| Error::io("cannot copy", &kept, e))?;
            std::fs::rename(&tmp, &model).map_err(|e| Error::io("cannot rename into place", &model, e))?;
            crate::io::write_atomic(&file, json!({"step": step, "rsum": rsum}).to_string().as_bytes())?;
        }
        None => {
            for p in [&model, &file] {
                match std::fs::remove_file(p) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io("cannot remove", p, e)),
                    _ => {}
                }
            }
        }
    }
    Ok(best)
}

/// The model selection so far (`best.json`), if the run has one.
fn read_best(output: &Path) -> Option<(u64, f64)> {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(output.join(BEST_FILE)).ok()?).ok()?;
    Some((v["step"].as_u64()?, v["rsum"].as_f64()?))
}

/// Removes what an earlier run left in `output` that this one, starting at step 0, would
/// otherwise keep beside its own: checkpoints (a later `--resume` would go on from another
/// run's), the final model (`curate eval` would score it under this run's config) and the
/// `eval/` folder `curate eval RUN_DIR` wrote (the scores of the model being replaced, which
/// would otherwise sit beside the new one as if they were its own). `metrics.jsonl` and
/// `config.json` are written anew; other files stay. (`model_swa.bpk`, the SWA average, and
/// `model_best.bpk` + `best.json`, the selected model, go with the final model.)
fn clear_earlier_run(output: &Path) -> Result<()> {
    let dir = output.join("checkpoints");
    let steps: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with("step-"))
            .map(|e| e.path())
            .collect(),
        Err(_) => Vec::new(),
    };
    let model = output.join("model.bpk");
    let evals = [output.join("eval"), output.join("eval_swa"), output.join("eval_best")];
    let swa = output.join("model_swa.bpk");
    let best = [output.join("model_best.bpk"), output.join(BEST_FILE)];
    let (models, results) = (model.exists() || swa.exists() || best[0].exists(), evals.iter().any(|e| e.is_dir()));
    if !steps.is_empty() || models || results {
        say!("{}", earlier_run_note(output, steps.len(), models, results));
    }
    for p in steps {
        std::fs::remove_dir_all(&p).map_err(|e| Error::io("cannot remove", &p, e))?;
    }
    for eval in evals.iter().filter(|e| e.is_dir()) {
        std::fs::remove_dir_all(eval).map_err(|e| Error::io("cannot remove", eval, e))?;
    }
    // An earlier run's SWA average and selected model go with its final model.
    for p in std::iter::once(&swa).chain(&best) {
        match std::fs::remove_file(p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io("cannot remove", p, e)),
            _ => {}
        }
    }
    match std::fs::remove_file(&model) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io("cannot remove", &model, e)),
        _ => Ok(()),
    }
}

/// The newest complete checkpoint folder and its step.
pub fn last_checkpoint(output: &Path) -> Option<(u64, PathBuf)> {
    let dir = output.join("checkpoints");
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(&dir)
        .ok()?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse::<u64>().ok()?;
            Some((step, e.path()))
        })
        .filter(|(_, p)| p.join("state.json").is_file())
        .collect();
    found.sort();
    found.pop()
}

/// burn keeps a BatchNorm's last running-statistics update pending (per thread) until the
/// next training step reads the statistics; a saved model would hold the step before's.
/// curate's training BatchNorm folds its own updates in at once (`resnet::batch_norm`); this
/// makes sure of it for any other: `valid()` folds pending updates in, in place (the module's
/// running states are shared by its clones), and changes nothing else.
fn fold_pending_running_stats(model: &DualEncoder) {
    let _ = model.valid();
}

impl Run {
    fn save(&self, output: &Path, step: u64, loss: f32, keep: usize, best: Option<(u64, f64)>) -> Result<()> {
        let final_dir = checkpoint_dir(output, step);
        let tmp = final_dir.with_extension("tmp");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io("cannot create", &tmp, e))?;
        fold_pending_running_stats(&self.trainee.encoder);
        if let Some(t) = &self.teacher {
            fold_pending_running_stats(t);
        }
        let p = tmp.join("model.bpk");
        self.trainee.clone().save_file(&p).map_err(|e| record_err("write", &p, e))?;
        let p = tmp.join("optim_encoder.bpk");
        self.optim_encoder.save(&p).map_err(|e| record_err("write", &p, e))?;
        let p = tmp.join("optim_loss.bpk");
        self.optim_loss.save(&p).map_err(|e| record_err("write", &p, e))?;
        if let Some(t) = &self.teacher {
            let p = tmp.join("teacher.bpk");
            t.clone().save_file(&p).map_err(|e| record_err("write", &p, e))?;
        }
        if let Some(s) = &self.swa {
            let p = tmp.join("swa.bpk");
            s.clone().save_file(&p).map_err(|e| record_err("write", &p, e))?;
        }
        let bank = match &self.bank {
            Some(b) => {
                let (image, text, filled, next, last) = b.state();
                let [size, dim] = image.dims();
                let mut bytes = tensor_bytes(image)?;
                bytes.extend(tensor_bytes(text)?);
                let p = tmp.join("bank.bin");
                std::fs::write(&p, bytes).map_err(|e| Error::io("cannot write", &p, e))?;
                Some(BankState { size, dim, filled, next, last: last.map(|r| (r.start, r.end)) })
            }
            None => None,
        };
        // The selected model as it is now (a link: a better one later is a new file).
        if best.is_some() {
            let (from, to) = (output.join("model_best.bpk"), tmp.join("model_best.bpk"));
            if std::fs::hard_link(&from, &to).is_err() {
                std::fs::copy(&from, &to).map_err(|e| Error::io("cannot copy", &from, e))?;
            }
        }
        let state = State { step, loss, ema_updates: self.ema_updates, bank, swa_snapshots: self.swa_snapshots, best };
        let p = tmp.join("state.json");
        std::fs::write(&p, serde_json::to_vec_pretty(&state).expect("serialisable"))
            .map_err(|e| Error::io("cannot write", &p, e))?;
        let _ = std::fs::remove_dir_all(&final_dir);
        std::fs::rename(&tmp, &final_dir).map_err(|e| Error::io("cannot rename into place", &final_dir, e))?;
        // Keep the newest `keep` checkpoints.
        let dir = output.join("checkpoints");
        let mut all: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map_err(|e| Error::io("cannot list", &dir, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("step-")) && p.extension().is_none()
            })
            .collect();
        all.sort();
        let drop = all.len().saturating_sub(keep.max(1));
        for old in &all[..drop] {
            let _ = std::fs::remove_dir_all(old);
        }
        Ok(())
    }

    fn load(mut self, dir: &Path, optim: &OptimConfig, device: &Device) -> Result<(Run, State)> {
        let p = dir.join("state.json");
        let text = std::fs::read_to_string(&p).map_err(|e| Error::io("cannot read", &p, e))?;
        let state: State = serde_json::from_str(&text).map_err(|e| record_err("parse", &p, e))?;
        let p = dir.join("model.bpk");
        self.trainee = self.trainee.try_load_file(&p).map_err(|e| record_err("read", &p, e))?;
        // The loaded parameters carry the checkpoint's ids: AdamP's `Linear` group is made anew
        // from them, before the optimisers' state is sorted into groups.
        (self.optim_encoder, self.optim_loss) = optimisers(optim, &self.trainee.encoder, &self.trainee.loss);
        let p = dir.join("optim_encoder.bpk");
        self.optim_encoder = self.optim_encoder.load(&p).map_err(|e| record_err("read", &p, e))?;
        let p = dir.join("optim_loss.bpk");
        self.optim_loss = self.optim_loss.load(&p).map_err(|e| record_err("read", &p, e))?;
        if let Some(t) = self.teacher.take() {
            let p = dir.join("teacher.bpk");
            self.teacher = Some(t.try_load_file(&p).map_err(|e| record_err("read", &p, e))?.no_grad());
        }
        if let (Some(bank), Some(b)) = (&self.bank, &state.bank) {
            let p = dir.join("bank.bin");
            let bytes = std::fs::read(&p).map_err(|e| Error::io("cannot read", &p, e))?;
            // Checked before it is used: an edited or foreign state would write outside the bank.
            let [k, d] = bank.state().0.dims();
            let consistent = b.size == k
                && b.dim == d
                && bytes.len() == 2 * k * d * 4
                && b.filled <= k
                && match b.last {
                    // The last batch written, and the next slot after it (the bank holds whole batches).
                    Some((s, e)) => s < e && e <= k && k % (e - s) == 0 && s % (e - s) == 0 && b.next == e % k,
                    None => b.next == 0 && b.filled == 0,
                };
            if !consistent {
                return Err(Error::Data {
                    message: format!(
                        "`{}` and `{}` do not hold a memory bank of this run ({k} slots of {d})",
                        dir.join("state.json").display(),
                        p.display()
                    ),
                    hint: Some("resume from the run's own checkpoints (or remove this one)".into()),
                });
            }
            let half = b.size * b.dim * 4;
            let image = tensor_from_bytes(&bytes[..half], [b.size, b.dim], device);
            let text = tensor_from_bytes(&bytes[half..], [b.size, b.dim], device);
            self.bank = Some(MemoryBank::from_state(image, text, b.filled, b.next, b.last.map(|(s, e)| s..e)));
        }
        self.ema_updates = state.ema_updates;
        self.swa_snapshots = state.swa_snapshots;
        if state.swa_snapshots > 0 {
            let p = dir.join("swa.bpk");
            // (Its parameters keep `require_grad`, by which the average tells them apart.)
            self.swa = Some(self.trainee.clone().try_load_file(&p).map_err(|e| record_err("read", &p, e))?);
        }
        Ok((self, state))
    }
}

/// The batch's model inputs on `device`: images `[b, 3, size, size]`, token ids and mask
/// `[b, seq]`. The buffers move out of the batch rather than being copied (the images of a batch
/// of 128 at 224 px are 77 MB), and a step uploads them once, its EMA teacher and the trainee
/// sharing the tensors.
fn upload(batch: &mut Batch, size: usize, device: &Device) -> (Tensor<4>, Tensor<2, Int>, Tensor<2, Int>) {
    let (b, seq) = (batch.rows.len(), batch.seq);
    let take = |v: &mut Vec<i64>| TensorData::new(std::mem::take(v), [b, seq]);
    let images = Tensor::<4>::from_data(TensorData::new(std::mem::take(&mut batch.images), [b, 3, size, size]), device);
    let ids = Tensor::<2, Int>::from_data(take(&mut batch.ids), device);
    let mask = Tensor::<2, Int>::from_data(take(&mut batch.mask), device);
    (images, ids, mask)
}

fn features(v: &Option<Vec<f32>>, b: usize, device: &Device) -> Result<Tensor<2>> {
    let v = v.as_ref().ok_or_else(|| Error::data("the loss needs teacher features and the batch has none"))?;
    Ok(Tensor::from_data(TensorData::new(v.clone(), [b, v.len() / b]), device))
}

/// The loss of one batch (shape `[1]`).
fn loss_of(
    config: &LossConfig,
    params: &LossParams,
    e: Embeddings,
    teacher: Option<Embeddings>,
    bank: Option<&mut MemoryBank>,
    batch: &Batch,
    device: &Device,
) -> Result<Tensor<1>> {
    let scale = || params.scale.as_ref().expect("initialised for this loss").scale();
    let distill = || params.distill_scale.as_ref().map(LogitScale::scale).unwrap_or_else(scale);
    let teacher_pair = || {
        let t = teacher.clone().expect("teacher for this loss");
        (t.image.detach(), t.text.detach())
    };
    Ok(match config {
        LossConfig::Infonce(c) => infonce::infonce(e.image, e.text, scale(), c.direction_reduction),
        LossConfig::MemoryBank(c) => {
            let bank = bank.expect("bank for memory_bank");
            let (ti, tt) = teacher_pair();
            bank.enqueue(ti, tt)?;
            bank.loss(e.image, e.text, scale(), c.direction_reduction)
        }
        LossConfig::LabelSmoothing(c) => label_smoothing::label_smoothing(e.image, e.text, scale(), c.alpha),
        LossConfig::Kd(c) => {
            let (ti, tt) = teacher_pair();
            kd::kd(e.image, e.text, ti, tt, scale(), distill(), c.alpha, c.teacher_temperature, c.intra_modal)
        }
        LossConfig::Otter(c) => {
            let (ti, tt) = teacher_pair();
            otter::otter(e.image, e.text, ti, tt, scale(), distill(), c).loss
        }
        LossConfig::Cusa(c) => {
            let b = batch.rows.len();
            let temps = params.cusa.as_ref().expect("cusa temperatures");
            let terms = cusa(
                CusaBatch {
                    image_cross: e.image,
                    text_cross: e.text,
                    image_uni: e.image_uni.expect("uni head"),
                    text_uni: e.text_uni.expect("uni head"),
                    teacher_image: features(&batch.teacher_image, b, device)?,
                    teacher_text: features(&batch.teacher_text, b, device)?,
                    image_ids: &batch.image_ids,
                },
                temps,
                c,
            );
            terms.loss
        }
        LossConfig::Pcmepp(c) => {
            let m = params.pcme.as_ref().expect("match scale");
            let labels = match &batch.lambdas {
                Some(l) => {
                    let dups = c.keep_duplicate_positives.then_some(batch.image_ids.as_slice());
                    msda_labels(l, c.label_smoothing, dups, device)
                }
                None => pair_labels(&batch.image_ids, c.label_smoothing, device),
            };
            let terms = pcmepp(
                l2_normalize(e.image),
                e.image_log_var.expect("log-variance head"),
                l2_normalize(e.text),
                e.text_log_var.expect("log-variance head"),
                m.a.val(),
                m.b.val(),
                labels,
                c,
            );
            terms.loss
        }
    })
}

/// Appends lines to `metrics.jsonl`.
struct Metrics(std::fs::File);

impl Metrics {
    /// Opens the log; on resume, drops the lines of steps after `keep_through`, and says
    /// whether a zero-shot line and a validation line of step `keep_through` are among those
    /// kept.
    fn open(path: &Path, keep_through: Option<u64>) -> Result<(Metrics, [bool; 2])> {
        let mut kept_lines = [false; 2];
        if let Some(step) = keep_through {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let kept: String = text
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v["step"].as_u64())
                        .is_some_and(|s| s <= step)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            let at_step: Vec<serde_json::Value> = kept
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .filter(|v| v["step"].as_u64() == Some(step))
                .collect();
            for (k, key) in ["zeroshot_top1", "val_rsum"].into_iter().enumerate() {
                kept_lines[k] = at_step.iter().any(|v| v.get(key).is_some());
            }
            crate::io::write_atomic(path, kept.as_bytes())?;
        } else {
            std::fs::write(path, b"").map_err(|e| Error::io("cannot write", path, e))?;
        }
        let f = std::fs::OpenOptions::new().append(true).open(path).map_err(|e| Error::io("cannot open", path, e))?;
        Ok((Metrics(f), kept_lines))
    }

    fn line(&mut self, v: serde_json::Value) -> Result<()> {
        writeln!(self.0, "{v}").map_err(|e| Error::io("cannot write", "metrics.jsonl", e))
    }
}

fn zeroshot_line(step: u64, s: &ZeroShotScores) -> serde_json::Value {
    json!({
        "step": step,
        "zeroshot_top1": s.top1,
        "zeroshot_top2": s.top2,
        "zeroshot_top5": s.top5,
        "zeroshot_top10": s.top10,
        "zeroshot_classes": s.classes
    })
}

/// The encoders' optimiser (with the config's weight decay) and the loss parameters' (none),
/// AdamP's `Linear` group made from these parameters' ids.
fn optimisers(optim: &OptimConfig, encoder: &DualEncoder, loss: &LossParams) -> (ModuleOptimizer, ModuleOptimizer) {
    let build = super::optim::build;
    let no_decay = if optim.no_weight_decay_1d { super::optim::one_dimensional(encoder) } else { Vec::new() };
    (
        build(optim, optim.weight_decay, linear_weights(encoder), no_decay),
        build(optim, 0.0, linear_weights(loss), Vec::new()),
    )
}

/// Settings of the schedule that a run of `total` steps (`per_epoch` an epoch) cannot carry out,
/// said before it starts: a warm-up as long as the run (the rate never reaches `lr`), an image
/// tower frozen for every epoch, an SWA that no epoch end feeds. With `epochs` these are config
/// errors; with `steps` the epochs are known only once the data is read, and a short run (a
/// smoke test of a paper's file) may mean them, so they are notes.
fn schedule_notes(o: &OptimConfig, total: u64, per_epoch: u64) -> Vec<String> {
    let epochs = total.div_ceil(per_epoch);
    let mut notes = Vec::new();
    // The last step's rate is `lr · min(1, total / warmup)`.
    if o.warmup_steps > total {
        notes.push(format!(
            "note: `optim.warmup_steps = {}` is longer than the run's {total} steps: the rate never reaches `optim.lr`",
            o.warmup_steps
        ));
    }
    if o.freeze_image_epochs > 0 && o.freeze_image_epochs >= epochs {
        notes.push(format!(
            "note: `optim.freeze_image_epochs = {}` covers all {epochs} epoch(s) of the run ({per_epoch} steps an \
             epoch): the image tower is not trained",
            o.freeze_image_epochs
        ));
    }
    // Snapshots are taken at the ends of the epochs after `swa_start_epoch`.
    if let Some(first) = o.swa_start_epoch.filter(|&first| first.saturating_add(1).saturating_mul(per_epoch) > total) {
        notes.push(format!(
            "note: `optim.swa_start_epoch = {first}`: no epoch after it ends within the run's {total} steps \
             ({per_epoch} an epoch), so there will be no SWA average"
        ));
    }
    notes
}

/// The keys whose values differ between two configs (as JSON), each as "`path`: then → now",
/// at most 8 of them.
fn config_differences(then: &serde_json::Value, now: &serde_json::Value) -> Vec<String> {
    fn walk(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        match (a, b) {
            (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
                let mut keys: Vec<&String> = x.keys().chain(y.keys()).collect();
                keys.sort();
                keys.dedup();
                for k in keys {
                    let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                    let null = serde_json::Value::Null;
                    walk(&p, x.get(k).unwrap_or(&null), y.get(k).unwrap_or(&null), out);
                }
            }
            _ if a != b => out.push(format!("`{path}`: {a} then, {b} now")),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", then, now, &mut out);
    if out.len() > 8 {
        let more = out.len() - 8;
        out.truncate(8);
        out.push(format!("and {more} more"));
    }
    out
}

/// The config an earlier run recorded in its `config.json`, read as that build meant it: one
/// written before `optim.grad_clip_scope` existed clipped each tensor on its own, one written
/// before `model.text.dropout` trained without dropout.
fn earlier_config(text: &str) -> Option<TrainConfig> {
    read_earlier_config(text).ok()
}

/// [`earlier_config`], or why `text` is no config (serde's message).
fn read_earlier_config(text: &str) -> std::result::Result<TrainConfig, String> {
    let mut v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    if let Some(o) = v.get_mut("optim").and_then(|o| o.as_object_mut()) {
        if o.get("grad_clip_norm").is_some_and(|n| !n.is_null()) && !o.contains_key("grad_clip_scope") {
            o.insert("grad_clip_scope".into(), json!("tensor"));
        }
    }
    // Before `model.text.dropout`, the text tower trained without dropout whatever its folder
    // said: such a run (its `model` has no `log_variance_block` either, which every later
    // config.json has) goes on without (`--set model.text.dropout=0` resumes it).
    let before_dropout = v.pointer("/model/log_variance_block").is_none();
    if let Some(t) = v.pointer_mut("/model/text").and_then(|t| t.as_object_mut()).filter(|_| before_dropout) {
        t.entry("dropout").or_insert(json!(0.0));
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Trains as `config` says. See the module documentation for what lands in `output_dir`.
///
/// The run goes on a large stack of its own (allocated for it, on the caller's thread, so that
/// the caller's rayon pool stays the one it uses): a debug build's frames of this function and
/// of burn's derived module code (loading a CLIP tower) take more than the 2 MiB of a test's or
/// a library caller's thread.
pub fn train(config: &TrainConfig, opts: &TrainOptions) -> Result<TrainSummary> {
    stacker::grow(32 << 20, || train_here(config, opts))
}

fn train_here(config: &TrainConfig, opts: &TrainOptions) -> Result<TrainSummary> {
    let started = Instant::now();
    let mut sampler = opts.sample_profile.clone().map(super::sampling_profile::Sampler::new).transpose()?;
    let out = config.output_dir.clone();
    std::fs::create_dir_all(&out).map_err(|e| Error::io("cannot create", &out, e))?;
    // One run at a time in a folder: two would interleave their metrics and checkpoints.
    let _lock = crate::io::lock_folder(&out)?;
    let resolved = serde_json::to_string_pretty(config).expect("serialisable config");
    let config_path = out.join("config.json");
    check_output_folder(&out, opts.resume, config)?;
    let resume_from = if opts.resume { last_checkpoint(&out) } else { None };
    if resume_from.is_some() {
        // (A `config.json` there is a run's: [`check_output_folder`] refused others.)
        if !config_path.is_file() {
            return Err(Error::Data {
                message: format!(
                    "--resume: `{}` holds checkpoints but no `config.json`, so the config they were trained with is \
                     unknown",
                    out.display()
                ),
                hint: Some(
                    "put back that run's `config.json`, or train into a new `output_dir` (or remove its \
                     `checkpoints/` to start over)"
                        .into(),
                ),
            });
        }
        // Compared as configs, not as text: a key a later curate added, at its default, is no
        // difference (an earlier build's `config.json` lacks it).
        let before = std::fs::read_to_string(&config_path).unwrap_or_default();
        let same = before == resolved || earlier_config(&before).is_some_and(|b| b.resolved() == *config);
        if !same {
            let clipped_per_tensor = earlier_config(&before)
                .is_some_and(|b| b.optim.grad_clip_scope == ClipScope::Tensor && !before.contains("grad_clip_scope"));
            let hint = if clipped_per_tensor {
                "that run clipped each gradient on its own, as curate did before `optim.grad_clip_scope`: resume \
                 with `--set optim.grad_clip_scope=tensor`"
            } else {
                "resume with the same file and `--set` values, or train into a new `output_dir`"
            };
            let changed = earlier_config(&before)
                .map(|b| config_differences(&serde_json::json!(b.resolved()), &serde_json::json!(config)))
                .filter(|d| !d.is_empty())
                .map_or(String::new(), |d| format!(": {}", d.join("; ")));
            return Err(Error::Data {
                message: format!("the config differs from the one `{}` was trained with{changed}", out.display()),
                hint: Some(hint.into()),
            });
        }
    }

    if opts.resume && out.join("model.bpk").is_file() {
        // A finished run: starting over would remove what `--resume` asked to keep, and going on
        // from a checkpoint it kept would train its last steps again over its model.
        let kept = if resume_from.is_none() { " and no checkpoint to go on from" } else { "" };
        return Err(Error::Data {
            message: format!(
                "--resume: `{}` holds a finished run (model.bpk){kept}: there is nothing to resume",
                out.display()
            ),
            hint: Some(
                "leave out `--resume` to train again from step 0 (it replaces that run), or train into a new \
                 `output_dir`"
                    .into(),
            ),
        });
    }
    // The data is loaded before an earlier run's files are cleared: a wrong path or an empty
    // table then leaves that run as it was.
    let set = Arc::new(TrainSet::load(config)?);
    let rows = set.samples.len();
    if set.incomplete_rows > 0 {
        say!(
            "note: {} training row(s) left out: a null `sample_id`, a null or blank caption, or no image named (no \
             path, no shard and key)",
            set.incomplete_rows
        );
    }
    if config.data.noise_ratio > 0.0 {
        say!(
            "note: `data.noise_ratio = {}`: the captions of {} of {} rows were shuffled among them ({} moved)",
            config.data.noise_ratio,
            ((config.data.noise_ratio * set.samples.len() as f64).floor() as usize).min(set.samples.len()),
            set.samples.len(),
            set.noisy_rows
        );
    }
    if set.emptied_captions > 0 {
        say!(
            "note: {} training row(s) left out: `data.pre_caption` leaves nothing of their caption",
            set.emptied_captions
        );
    }
    if set.missing_images > 0 {
        say!(
            "note: {} training row(s) left out: their image file is not there (paths are relative to the working \
             directory, or to `data.image_root`); training on {rows} pairs",
            set.missing_images
        );
    }
    if config.eval.as_ref().is_some_and(|e| e.images.is_none() && !e.select_best) {
        say!(
            "note: `[eval]` has no zero-shot set and `eval.select_best` is off: nothing is evaluated while \
             training (`curate eval RUN_DIR` scores `[eval.retrieval]` afterwards)"
        );
    }
    if let Some(clip) = &config.model.clip {
        use crate::models::clip_text::OpenClipConfig;
        if clip.quick_gelu.is_none() && !OpenClipConfig::names_quick_gelu(&clip.dir.join(OpenClipConfig::FILE)) {
            say!(
                "note: `{}` does not say `quick_gelu`: the towers use exact GELU, open_clip's default; OpenAI's CLIP \
                 weights need `model.clip.quick_gelu = true`",
                clip.dir.join(OpenClipConfig::FILE).display()
            );
        }
    }
    let shared = set.shared_captions();
    if shared > 0 {
        say!(
            "note: {shared} of {rows} training rows ({:.1}%) share their caption with a row of another image: \
             negatives of the same text (kept; BoW captions make them common)",
            100.0 * shared as f64 / rows.max(1) as f64
        );
    }
    let total = config.total_steps(rows)?;
    // At least 1: the set holds a batch (checked at load).
    let per_epoch = set.steps_per_epoch(config.batch_size).max(1);
    for note in schedule_notes(&config.optim, total, per_epoch) {
        say!("{note}");
    }
    let maker = Arc::new(BatchMaker::new(set.clone(), config)?);
    let transform = super::transform::ImageTransform::new(&config.data, config.model.image_size_px);
    let zeroshot = config
        .eval
        .as_ref()
        .filter(|e| e.images.is_some())
        .map(|e| ZeroShot::load(e, &transform, config.data.pre_caption))
        .transpose()?;
    // `eval.select_best`: the validation set, read (and checked) before the first step.
    let validation = match config.eval.as_ref().filter(|e| e.select_best).and_then(|e| e.retrieval.as_ref()) {
        Some(r) => Some(crate::eval::trained::RetrievalSet::read(
            &r.images,
            &r.captions,
            r.image_root.as_deref(),
            config.data.pre_caption,
        )?),
        None => None,
    };
    if let Some(z) = zeroshot.as_ref().filter(|z| z.skipped > 0) {
        say!("note: {} zero-shot row(s) left out: their image path or label is null", z.skipped);
    }
    if let Some(text) = zeroshot.as_ref().and_then(|z| super::zeroshot::shared_names_note(&z.shared_names)) {
        say!("note: {text}");
    }

    // The towers too (a pretrained checkpoint that does not load leaves the earlier run be).
    let device = opts.device.clone().autodiff();
    let encoder = DualEncoder::init(&config.model, heads(&config.loss), config.seed, &device)?;

    if resume_from.is_none() {
        if opts.resume {
            say!("note: --resume: `{}` has no complete checkpoint; training from step 0", out.display());
        }
        clear_earlier_run(&out)?;
        crate::io::write_atomic(&config_path, resolved.as_bytes())?;
    }

    let ema = teacher_momentum(&config.loss);
    let teacher = ema.map(|_| ema_teacher(&encoder));
    let bank = match &config.loss {
        LossConfig::MemoryBank(c) => Some(MemoryBank::new(c.size, config.model.embed_dim, &device)),
        _ => None,
    };
    let loss_params = LossParams::init(&config.loss, &device);
    let (optim_encoder, optim_loss) = optimisers(&config.optim, &encoder, &loss_params);
    let mut run = Run {
        teacher,
        bank,
        optim_encoder,
        optim_loss,
        trainee: Trainee { encoder, loss: loss_params },
        ema_updates: 0,
        swa: None,
        swa_snapshots: 0,
    };
    let mut start = 0;
    let mut resumed_best = None;
    if let Some((step, dir)) = &resume_from {
        let (r, state) = run.load(dir, &config.optim, &device)?;
        run = r;
        start = state.step;
        // An edited or foreign `state.json`: its step must be the checkpoint's, within the run.
        if start != *step || start > total {
            return Err(Error::Data {
                message: format!(
                    "checkpoint `{}` is not one of this run: its state.json is at step {start}, its name at step \
                     {step}, and the run has {total} steps",
                    dir.display()
                ),
                hint: Some("resume from the run's own checkpoints (or remove this one)".into()),
            });
        }
        resumed_best = restore_best(&out, dir, state.best)?;
    }
    // PCME++'s per-tower rates and layer-wise decay (none by default).
    let lr_groups = LrGroups::new(run.trainee.encoder.lr_groups(&config.optim));
    let (mut metrics, [zeroshot_logged, validation_logged]) =
        Metrics::open(&out.join("metrics.jsonl"), resume_from.as_ref().map(|(s, _)| *s))?;

    let mut first_zeroshot = None;
    let mut first_zeroshot_step = 0;
    let mut last_zeroshot = None;
    // Model selection (`eval.select_best`): the best step and RSUM so far, from `best.json` when
    // resuming (a run from step 0 removed an earlier one's).
    let best = std::cell::Cell::new(resumed_best);
    let similarity =
        if heads(&config.loss).log_variance { crate::eval::Similarity::Csd } else { crate::eval::Similarity::Cosine };
    let precision = crate::eval::trained::resolve_precision(similarity, None)?;
    // Either part of an evaluation may be skipped: a resumed run's checkpoint step that logged it.
    let mut evaluate =
        |run: &Run, step: u64, metrics: &mut Metrics, [zeroshot_done, validation_done]: [bool; 2]| -> Result<()> {
            // A resumed run's checkpoint step that logged its line is scored again (the same
            // model, the same RSUM) without a second line: the checkpoint was written before the
            // step's evaluation, so its selection may not have seen that step yet.
            if let (Some(v), true) = (&validation, step > 0) {
                let model = crate::train::trained::TrainedRun::from_model(
                    &out,
                    config,
                    run.trainee.encoder.valid(),
                    maker.tokenizer.clone(),
                    &opts.device,
                );
                let ev = v.evaluate(&model, similarity, precision, None, &|_| {})?;
                let rsum = crate::eval::trained::rsum(&ev);
                let mut line = json!({"step": step, "val_rsum": rsum});
                for (name, pair) in ev.metrics.iter().filter(|(n, _)| n.starts_with("coco_5k_r")) {
                    let k = name.trim_start_matches("coco_5k_");
                    line[format!("val_{k}_i2t")] = json!(pair.i2t);
                    line[format!("val_{k}_t2i")] = json!(pair.t2i);
                }
                if !validation_done {
                    metrics.line(line)?;
                }
                if best.get().is_none_or(|(_, b)| rsum > b) {
                    let p = out.join("model_best.bpk");
                    let tmp = crate::io::tmp_path(&p);
                    fold_pending_running_stats(&run.trainee.encoder);
                    run.trainee.encoder.clone().save_file(&tmp).map_err(|e| record_err("write", &tmp, e))?;
                    std::fs::rename(&tmp, &p).map_err(|e| Error::io("cannot rename into place", &p, e))?;
                    let b = out.join(BEST_FILE);
                    crate::io::write_atomic(&b, json!({"step": step, "rsum": rsum}).to_string().as_bytes())?;
                    best.set(Some((step, rsum)));
                }
            }
            if let (Some(z), false) = (&zeroshot, zeroshot_done) {
                let s = z.evaluate(&run.trainee.encoder.valid(), &maker.tokenizer)?;
                metrics.line(zeroshot_line(step, &s))?;
                if first_zeroshot.is_none() {
                    (first_zeroshot, first_zeroshot_step) = (Some(s), step);
                }
                last_zeroshot = Some(s);
            }
            Ok(())
        };
    // A checkpoint is written before its step's zero-shot evaluation, so a run killed between
    // the two resumes without that line: evaluate the checkpoint's step again (the model is
    // the same, so is the line), and the log matches an uninterrupted run's.
    let due = |step: u64| config.eval.as_ref().is_some_and(|e| e.due(step, per_epoch) && step < total);
    if start == 0 || (due(start) && !(zeroshot_logged && validation.is_none())) {
        evaluate(&run, start, &mut metrics, [zeroshot_logged, validation_logged])?;
    }

    // Where stderr is no terminal (a log file, a scheduler's output), `--progress always` is a
    // line every 10 s instead of a bar, which would draw nothing there.
    let log_lines = opts.progress && !std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut last_line = Instant::now();
    let bar = (opts.progress && !log_lines).then(|| {
        let b = indicatif::ProgressBar::new(total);
        b.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} step {pos}/{len} loss {msg} ETA {eta}")
                .expect("valid template"),
        );
        b.set_position(start);
        b
    });
    let end = opts.stop_after.map_or(total, |s| s.min(total));
    let loader = Loader::new(maker.clone(), start, end, opts.workers);
    let size = config.model.image_size_px;
    let mut last_loss = f32::NAN;
    let mut window = (Instant::now(), 0usize);
    let mut step_started = Instant::now();
    let mut undecodable = std::collections::HashSet::new();
    let mut trace = StepTrace::new(opts.trace_steps);
    let ctrl_c = super::interrupt::Listener::new(opts.stop_on_ctrl_c);
    let dropout = run.trainee.encoder.text_dropout() != (0.0, 0.0);
    let mut interrupted_at = None;
    for batch in loader {
        let mut batch = batch?;
        trace.lap("batch");
        if let Some(s) = &mut sampler {
            s.step_starts()?;
        }
        for (name, error) in &batch.undecodable {
            if undecodable.insert(name.clone()) {
                above_bar(&bar, || {
                    say!("note: training image `{name}` cannot be decoded ({error}): left out, another row takes its place")
                });
            }
        }
        let step = batch.step + 1; // steps completed after this one
        let lr = super::optim::learning_rate(&config.optim, batch.step, total, per_epoch);
        let (images, ids, mask) = upload(&mut batch, size, &device);
        trace.lap("upload");
        // The text tower's dropout masks (teacher and trainee) come from the device's random
        // stream: seeded per step, so that a resumed run draws the masks an uninterrupted one
        // would. The stream is the backend's, one per process: trainings that share a process
        // (tests, library callers) take turns from the seed to the last mask.
        let masks = dropout.then(|| {
            let guard = DROPOUT_STREAM.lock().unwrap_or_else(|e| e.into_inner());
            device.seed(crate::rng::row_key(config.seed, "dropout", &batch.step.to_string()));
            guard
        });
        // EMA teacher first (spec §4 step 2, §5.6), then its forward without gradient.
        let teacher = match (&mut run.teacher, ema) {
            (Some(t), Some((m, warmup))) => {
                run.ema_updates += 1;
                let decay = ema_decay(run.ema_updates, m, warmup);
                *t = ema_update(t.clone(), &run.trainee.encoder, decay);
                Some(&*t)
            }
            _ => None,
        };
        let teacher_forward = |t: &DualEncoder, images: Tensor<4>, ids: Tensor<2, Int>, mask: Tensor<2, Int>| {
            let e = t.forward(images, ids, mask);
            Embeddings { image: e.image.detach(), text: e.text.detach(), ..e }
        };
        if let (Some(c), LossConfig::Cusa(cc)) = (run.trainee.loss.cusa.take(), &config.loss) {
            run.trainee.loss.cusa = Some(c.clamp(cc));
        }
        let drop = (config.model.image_token_drop > 0.0).then_some(crate::models::gpo::TokenDrop {
            rate: config.model.image_token_drop,
            seed: config.seed,
            step: batch.step,
        });
        let (trainee, host) = (&run.trainee.encoder, crate::models::activation::is_host(&device));
        // On the CPU, and where no dropout draws random numbers (their order would depend on the
        // threads), the teacher's forward pass runs beside the trainee's.
        let (teacher_emb, emb) = match teacher {
            Some(t) if !dropout && host => {
                let inputs = (images.clone(), ids.clone(), mask.clone());
                trace.lap("teacher");
                let (te, e) = rayon::join(
                    || teacher_forward(t, inputs.0, inputs.1, inputs.2),
                    || trainee.forward_dropping(images, ids, mask, drop.as_ref()),
                );
                (Some(te), e)
            }
            _ => {
                let te = teacher.map(|t| teacher_forward(t, images.clone(), ids.clone(), mask.clone()));
                trace.lap("teacher");
                (te, trainee.forward_dropping(images, ids, mask, drop.as_ref()))
            }
        };
        // On the CPU the graph is cut at the embeddings, so that the two towers' backward passes
        // can run side by side (`TowerCut`); the gradients are the same.
        let (emb, cut) = if host {
            let (emb, cut) = emb.cut();
            (emb, Some(cut))
        } else {
            (emb, None)
        };
        // The step's last mask is drawn.
        std::mem::drop(masks);
        let loss = loss_of(&config.loss, &run.trainee.loss, emb, teacher_emb, run.bank.as_mut(), &batch, &device)?;
        trace.lap("forward");
        let mut value = loss.clone().into_scalar::<f32>();
        trace.lap("loss_read");
        if opts.inject_nan_at == Some(step) {
            value = f32::NAN;
        }
        if !value.is_finite() {
            if let Some(b) = &bar {
                b.abandon();
            }
            let kept = last_checkpoint(&out)
                .map(|(s, p)| format!("the last good checkpoint is `{}` (step {s})", p.display()))
                .unwrap_or_else(|| "no checkpoint was written yet".into());
            return Err(Error::Data {
                message: format!("the loss is {value} at step {step}; training stopped and {kept}"),
                hint: Some(
                    "lower `optim.lr`, add warm-up or `optim.grad_clip_norm`, and train again (a run with other \
                     settings starts at step 0: `--resume` goes on only with the same ones)"
                        .into(),
                ),
            });
        }
        // PCME++'s start (§3.10): the image tower frozen for `freeze_image_epochs`, then the loss
        // warmed up over the first epoch after (the logged value stays the loss itself).
        let (frozen, loss_scale) = super::optim::image_freeze(&config.optim, batch.step, per_epoch);
        let loss = if loss_scale != 1.0 { loss.mul_scalar(loss_scale) } else { loss };
        let mut grads = loss.backward();
        let mut g_enc = GradientsParams::new();
        if let Some(cut) = cut {
            cut.backward(&grads, frozen, &run.trainee.encoder, &mut g_enc);
        }
        trace.lap("backward");
        if frozen {
            // Taken out of `grads` and dropped: the image tower gets no update.
            run.trainee.encoder.drop_image_tower_gradients(&mut grads);
        }
        let g = GradientsParams::from_module(&mut grads, &run.trainee.encoder);
        merge_gradients(&mut g_enc, g, &run.trainee.encoder);
        let mut g_loss = GradientsParams::from_module(&mut grads, &run.trainee.loss);
        if let (Some(max), ClipScope::Global) = (config.optim.grad_clip_norm, config.optim.grad_clip_scope) {
            let Trainee { encoder, loss } = &run.trainee;
            clip_global(max, &mut [(&mut g_enc, encoder), (&mut g_loss, loss)]);
        }
        let Trainee { encoder, loss: params } = run.trainee;
        let encoder = run.optim_encoder.step(lr_groups.policy(lr), encoder, g_enc);
        let params = run.optim_loss.step(lr, params, g_loss);
        run.trainee = Trainee { encoder, loss: params };
        trace.lap("optim");
        if trace.on {
            // Wait for the device, so that its outstanding work shows here and not in a later step.
            device.sync().map_err(|e| Error::data(format!("the device failed: {e:?}")))?;
            trace.lap("drain");
            let line = trace.take();
            above_bar(&bar, || say!("step {step} ms: {line}"));
        }
        last_loss = value;
        window.1 += batch.rows.len();

        if step % config.log_every == 0 || step == total {
            let secs = window.0.elapsed().as_secs_f64().max(1e-9);
            metrics.line(json!({"step": step, "loss": value, "lr": lr, "samples_per_s": window.1 as f64 / secs}))?;
            window = (Instant::now(), 0);
        }
        if let Some(b) = &bar {
            b.set_position(step);
            let rate = batch.rows.len() as f64 / step_started.elapsed().as_secs_f64().max(1e-9);
            b.set_message(format!("{value:.4} · {rate:.0} samples/s"));
        }
        if log_lines && (last_line.elapsed().as_secs() >= 10 || step == end) {
            let rate = batch.rows.len() as f64 / step_started.elapsed().as_secs_f64().max(1e-9);
            say!("step {step}/{total} loss {value:.4} · {rate:.0} samples/s");
            last_line = Instant::now();
        }
        // PCME++'s SWA: at the end of each epoch from `swa_start_epoch`, the trainee joins the
        // running mean of the snapshots (`θ̄ ← n/(n+1) θ̄ + 1/(n+1) θ`).
        if let Some(first) = config.optim.swa_start_epoch {
            if step % per_epoch == 0 && step / per_epoch > first {
                fold_pending_running_stats(&run.trainee.encoder);
                let n = run.swa_snapshots as f64;
                // Trainable parameters only: BatchNorm's running statistics are shared between
                // a model's copies in burn, and mapping them would round the trainee's own.
                let base = run.swa.take().unwrap_or_else(|| run.trainee.clone());
                run.swa = Some(ema_update_trainable(base, &run.trainee, n / (n + 1.0)));
                run.swa_snapshots += 1;
            }
        }
        let checkpointed = config.checkpoint_every > 0 && step % config.checkpoint_every == 0 && step < total;
        if checkpointed {
            run.save(&out, step, value, config.keep_checkpoints, best.get())?;
        }
        if let Some(e) = &config.eval {
            if e.due(step, per_epoch) && step < total {
                evaluate(&run, step, &mut metrics, [false; 2])?;
            }
        }
        ctrl_c.step_ended(step);
        if ctrl_c.requested() && step < total {
            // Ctrl-C: this step's checkpoint (unless it has one already), then stop; the last
            // step finishes the run instead.
            if !checkpointed {
                run.save(&out, step, value, config.keep_checkpoints, best.get())?;
            }
            interrupted_at = Some(step);
            break;
        }
        if opts.stop_after == Some(step) && step < total {
            break;
        }
        // The bar's rate: one batch over the wall time of a whole step, waiting included.
        step_started = Instant::now();
        trace.restart();
    }
    // From here Ctrl-C ends the process again.
    drop(ctrl_c);
    if let Some(s) = &mut sampler {
        s.finish()?;
    }
    let end = interrupted_at.unwrap_or(end);
    let done = end == total;
    if done {
        evaluate(&run, total, &mut metrics, [false; 2])?;
        let p = out.join("model.bpk");
        let tmp = crate::io::tmp_path(&p);
        fold_pending_running_stats(&run.trainee.encoder);
        run.trainee.encoder.clone().save_file(&tmp).map_err(|e| record_err("write", &tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| Error::io("cannot rename into place", &p, e))?;
        if run.swa.is_none() && config.optim.swa_start_epoch.is_some() {
            say!(
                "note: SWA: no epoch from `optim.swa_start_epoch = {}` ended within the {total} steps ({per_epoch} an \
                 epoch); no model_swa.bpk",
                config.optim.swa_start_epoch.unwrap_or(0)
            );
        }
        if let Some(swa) = &run.swa {
            let p = out.join("model_swa.bpk");
            let tmp = crate::io::tmp_path(&p);
            swa.encoder.clone().save_file(&tmp).map_err(|e| record_err("write", &tmp, e))?;
            std::fs::rename(&tmp, &p).map_err(|e| Error::io("cannot rename into place", &p, e))?;
            say!("SWA: the average of {} epoch ends written to `{}`", run.swa_snapshots, p.display());
        }
    }
    if let Some(b) = &bar {
        b.finish();
    }
    Ok(TrainSummary {
        steps: end,
        total_steps: total,
        resumed_at: resume_from.as_ref().map_or(0, |(step, _)| *step),
        first_zeroshot_step,
        last_loss,
        first_zeroshot,
        last_zeroshot,
        output_dir: out,
        seconds: started.elapsed().as_secs_f64(),
        rows,
        undecodable_images: undecodable.len(),
        undecodable_rows: maker.undecodable.lock().map_or(0, |rows| rows.len()),
        interrupted: interrupted_at.is_some(),
        best: validation.is_some().then(|| read_best(&config.output_dir)).flatten(),
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::{schedule_notes, OptimConfig};

    #[test]
    fn a_schedule_a_short_run_cannot_carry_out_is_said() {
        // 20 steps of 9: 3 epochs (the last one short), epoch ends at steps 9 and 18.
        let base = OptimConfig::default();
        assert!(schedule_notes(&base, 20, 9).is_empty());
        let o = OptimConfig { warmup_steps: 21, freeze_image_epochs: 3, swa_start_epoch: Some(2), ..base.clone() };
        let notes = schedule_notes(&o, 20, 9);
        assert_eq!(notes.len(), 3, "{notes:?}");
        assert!(notes[0].contains("warmup_steps = 21") && notes[1].contains("all 3 epoch(s)"), "{notes:?}");
        assert!(notes[2].contains("swa_start_epoch = 2"), "{notes:?}");
        // Just within: the warm-up ends at the last step, two of three epochs frozen, SWA fed at 18.
        let o = OptimConfig { warmup_steps: 20, freeze_image_epochs: 2, swa_start_epoch: Some(1), ..base.clone() };
        assert!(schedule_notes(&o, 20, 9).is_empty());
        // No overflow on an absurd epoch.
        let o = OptimConfig { swa_start_epoch: Some(u64::MAX), ..base };
        assert_eq!(schedule_notes(&o, 20, 9).len(), 1);
    }

    #[test]
    fn the_earlier_run_note_offers_no_resume() {
        // The runs it is said of (other settings, or finished) cannot be resumed.
        let with = super::earlier_run_note(Path::new("out"), 2, true, true);
        assert!(with.contains("its 2 checkpoint(s), final model and `eval/` results are removed"), "{with}");
        assert!(!with.contains("--resume"), "{with}");
        // Only what is there is named.
        let without = super::earlier_run_note(Path::new("out"), 0, true, false);
        assert!(without.contains("`out` holds an earlier run: its final model is removed ("), "{without}");
        let one = super::earlier_run_note(Path::new("out"), 1, false, true);
        assert!(one.contains("its 1 checkpoint(s) and `eval/` results are removed ("), "{one}");
        let some = super::earlier_run_note(Path::new("out"), 3, false, false);
        assert!(some.contains("its 3 checkpoint(s) are removed (") && !some.contains("--resume"), "{some}");
    }
}
