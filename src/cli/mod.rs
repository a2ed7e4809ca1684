//! Command line: argument parsing (clap) and the mapping of results to messages and exit codes
//! (0 success, 1 a declared check failed, 2 error). The only place `anyhow` is used; nothing
//! in the library imports this module.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::pipeline::{self, RunOptions};

#[derive(Debug, Parser)]
#[command(name = "curate", version, about = "Curate image-text collections into training-ready Parquet.")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// One value, parsed once per process: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a pipeline file: read, transform, write Parquet + report.
    Run(RunArgs),
    /// Only check a pipeline file (config, input files, columns); read no data. Takes `run`'s
    /// flags too (checked, then unused), so a `run` command line can become a `validate` one.
    Validate(RunArgs),
    /// Benchmarks that print figures (not tests).
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Train a dual encoder (training file: model, data, loss, optimiser, zero-shot eval).
    Train(TrainArgs),
    /// Retrieval metrics (COCO 5K/1K, CxC, ECCV Caption) of a trained run or precomputed embeddings.
    Eval(EvalArgs),
    /// OTTER's dataset-noise diagnostic (Table 1): paired / unpaired softmax mass of a frozen
    /// model's image and caption embeddings over random batches.
    Noise(NoiseArgs),
    /// The transfer linear probe (BoW paper Table 11) of features computed beforehand: a
    /// multinomial logistic regression, its weight decay chosen on validation, scored on test.
    Probe(ProbeArgs),
}

/// `curate probe FEATURES LABELS`: the probe of `curate eval --probe`, on feature tables.
#[derive(Debug, Args)]
pub struct ProbeArgs {
    /// Image features: Parquet with `sample_id` and `embedding` (a file or a pattern), as the
    /// `encode_image` stage writes them, from any frozen encoder.
    #[arg(value_name = "FEATURES")]
    pub features: String,
    /// Parquet with `sample_id`, `label` (string or integer) and `split` (`train`, `val`,
    /// `test`; without `val` rows 20% of `train` is held out, the rows `ssl-transfer` holds out when
    /// the train rows are in the data set's order). Every row needs features.
    #[arg(value_name = "LABELS")]
    pub labels: PathBuf,
    /// The validation score that chooses the weight decay.
    #[arg(long, value_enum, default_value_t = crate::eval::linear_probe::ProbeMetric::Accuracy)]
    pub metric: crate::eval::linear_probe::ProbeMetric,
    /// L-BFGS iterations per fit at most.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub max_iter: usize,
    /// Also write the result and settings as JSON here.
    #[arg(long, value_name = "FILE.json")]
    pub out: Option<PathBuf>,
    /// Where the products run (`cpu`, `ndarray`, `cuda[:N]`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// `curate noise IMAGE_FEATURES TEXT_FEATURES`: the embeddings as `encode_image` and
/// `encode_text` write them (`sample_id`, `embedding`; files or patterns), joined by `sample_id`.
/// Prints the figures and writes them as JSON with `--out`.
#[derive(Debug, Args)]
pub struct NoiseArgs {
    /// Image embeddings: Parquet with `sample_id` and `embedding` (a file or a pattern).
    #[arg(value_name = "IMAGE_FEATURES")]
    pub image_features: String,
    /// Caption embeddings of the same samples, from the same model's text tower.
    #[arg(value_name = "TEXT_FEATURES")]
    pub text_features: String,
    /// Pairs per batch (OTTER: 512, 1024, 2048).
    #[arg(long, default_value_t = 1024)]
    pub batch_size: usize,
    /// Random batches averaged over (OTTER: 1000).
    #[arg(long, default_value_t = 1000)]
    pub batches: usize,
    /// The softmax scale (OTTER: 100, CLIP's temperature).
    #[arg(long, default_value_t = 100.0)]
    pub scale: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Also write the figures and settings as JSON here.
    #[arg(long, value_name = "FILE.json")]
    pub out: Option<PathBuf>,
    /// Where the products run (`cpu`, `ndarray`, `cuda[:N]`).
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// `curate eval RUN_DIR [--images IMAGES.parquet --captions CAPTIONS.parquet] [--out OUT_DIR]`
/// embeds a retrieval set with a trained run's model (plus the run's zero-shot classification,
/// and CUSA's uni-modal image retrieval and STS with `--uni-images`/`--sts`);
/// `curate eval --image-embeddings ... --caption-embeddings ... --out OUT_DIR` scores
/// precomputed embeddings. Both write the same files.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("input").required(true).args(["run", "image_embeddings"])))]
pub struct EvalArgs {
    /// A `curate train` run directory (config.json, model.bpk): its model embeds the retrieval
    /// set (`--images`/`--captions`, else the run config's `eval.retrieval`), and the run
    /// config's zero-shot set when it has one.
    #[arg(value_name = "RUN_DIR", conflicts_with_all = ["image_embeddings", "caption_embeddings"])]
    pub run: Option<PathBuf>,
    /// With RUN_DIR: Parquet with `coco_image_id` (int64) and `path` (an image file); its row
    /// order defines the COCO 1K folds. Default: the run config's `eval.retrieval.images`.
    #[arg(long, value_name = "IMAGES.parquet", requires_all = ["run", "captions"])]
    pub images: Option<PathBuf>,
    /// With RUN_DIR: Parquet with `coco_caption_id`, `coco_image_id` (int64) and `caption`.
    #[arg(long, value_name = "CAPTIONS.parquet", requires_all = ["run", "images"])]
    pub captions: Option<PathBuf>,
    /// With RUN_DIR: the folder image paths are relative to, for the retrieval set,
    /// `--uni-images`, `--probe` and `--compose` (default: the run config's `eval.retrieval.image_root` for its set, else as
    /// stored).
    #[arg(long, value_name = "DIR", requires = "run")]
    pub image_root: Option<PathBuf>,
    /// With RUN_DIR: CUSA's uni-modal image retrieval R@1 (CUB, SOP, In-Shop, iNaturalist) with
    /// the run's uni-modal image head (a run without one: its cross-modal embeddings). Parquet
    /// with `path` and `label` (string or integer); an optional `split` column (`query` /
    /// `gallery`) selects In-Shop's protocol, else every image is ranked against all the others.
    /// With it (or `--sts`) the retrieval set is optional.
    #[arg(long, value_name = "TABLE.parquet", requires = "run")]
    pub uni_images: Option<PathBuf>,
    /// With `--uni-images`: the folder its relative paths are relative to (default: `--image-root`).
    #[arg(long, value_name = "DIR", requires = "uni_images")]
    pub uni_images_root: Option<PathBuf>,
    /// With RUN_DIR: STS Spearman's ρ of the cosine of the run's uni-modal text head (a run
    /// without one: its cross-modal embeddings) against gold scores. Parquet with `sentence1`,
    /// `sentence2` (strings) and `score` (a number).
    #[arg(long, value_name = "TABLE.parquet", requires = "run")]
    pub sts: Option<PathBuf>,
    /// With RUN_DIR: the transfer linear probe (BoW paper Table 11, BYOL's protocol): a
    /// multinomial logistic regression on the run's frozen image-tower features, its weight
    /// decay chosen on `val` (else 20% of `train` held out) over 45 values in [1e-6, 1e5], then
    /// fitted on train + val and scored on test. Parquet with `path`, `label` (string or
    /// integer) and `split` (`train`, `val`, `test`). With it the retrieval set is optional.
    #[arg(long, value_name = "TABLE.parquet", requires = "run")]
    pub probe: Option<PathBuf>,
    /// With `--probe`: the folder its relative paths are relative to (default: `--image-root`).
    #[arg(long, value_name = "DIR", requires = "probe")]
    pub probe_image_root: Option<PathBuf>,
    /// With `--probe`: the validation score that chooses the weight decay (`mean-per-class` for
    /// Aircraft, Caltech-101, Flowers and Pets in that protocol). Both scores are reported.
    #[arg(long, value_enum, default_value_t = crate::eval::linear_probe::ProbeMetric::Accuracy, requires = "probe")]
    pub probe_metric: crate::eval::linear_probe::ProbeMetric,
    /// With `--probe`: L-BFGS iterations per fit at most (a fit stopped by it is counted and
    /// warned of). Weakly regularised fits of separable features (more dimensions than images)
    /// are the slow ones.
    #[arg(long, value_name = "N", default_value_t = 1000, requires = "probe")]
    pub probe_max_iter: usize,
    /// With RUN_DIR: OTTER's image-text compositionality benchmark (App. D, Table 7): image
    /// embedding + embedding of the text naming another image's extra attributes -> nearest
    /// image; OR / IOR / TOR overlap rates beside a random image's. Parquet with `path` and
    /// `attributes` (a list of attribute names, written as a text tower should read them).
    #[arg(long, value_name = "TABLE.parquet", requires = "run")]
    pub compose: Option<PathBuf>,
    /// With `--compose`: the folder its relative paths are relative to (default: `--image-root`).
    #[arg(long, value_name = "DIR", requires = "compose")]
    pub compose_image_root: Option<PathBuf>,
    /// With `--compose`: queries drawn (OTTER: 1,000,000; at least 1).
    #[arg(long, value_name = "N", default_value_t = 10_000, requires = "compose")]
    pub compose_queries: usize,
    /// With `--compose`: attributes the two images of a query share at least (OTTER: 10).
    #[arg(long, value_name = "N", default_value_t = 10, requires = "compose")]
    pub compose_min_shared: usize,
    /// With `--compose`: the seed of the query draws.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "compose")]
    pub compose_seed: u64,
    /// Parquet with `coco_image_id` (int64) and `embedding`; its row order defines the COCO 1K
    /// folds.
    #[arg(long, value_name = "IMAGES.parquet", requires_all = ["caption_embeddings", "out"])]
    pub image_embeddings: Option<PathBuf>,
    /// Parquet with `coco_caption_id`, `coco_image_id` (int64) and `embedding`.
    #[arg(long, value_name = "CAPTIONS.parquet", requires = "image_embeddings")]
    pub caption_embeddings: Option<PathBuf>,
    /// The eccv-caption package's `data/` folder (CxC and ECCV Caption positive pairs); without
    /// it only the COCO metrics are computed.
    #[arg(long, value_name = "DIR")]
    pub eccv_annotations: Option<PathBuf>,
    /// Output folder: config.json, metrics.json, metrics.md, recall_at_k.svg. Default with
    /// RUN_DIR: `RUN_DIR/eval`; required with the embedding flags.
    #[arg(long, value_name = "OUT_DIR")]
    pub out: Option<PathBuf>,
    /// How an image and a caption are scored. Default: `csd` for a PCME++ run (RUN_DIR with
    /// log-variance heads), else `cosine`. With the embedding flags, `csd` reads each table's
    /// `uncertainty` column (‖σ²‖₁).
    #[arg(long, value_enum)]
    pub similarity: Option<crate::eval::Similarity>,
    /// With RUN_DIR: score the run's SWA average (`model_swa.bpk`, `optim.swa_start_epoch`)
    /// instead of its final model; default output `RUN_DIR/eval_swa`.
    #[arg(long, requires = "run")]
    pub swa: bool,
    /// With RUN_DIR: score the model the run selected on its validation set (`model_best.bpk`,
    /// `eval.select_best`) instead of its final model; default output `RUN_DIR/eval_best`.
    #[arg(long, requires = "run", conflicts_with = "swa")]
    pub best: bool,
    /// Float type of the scores: `f32` (eccv-caption's; the default) or `f64` (PCME++'s
    /// evaluation; always for `csd`). Exact ranks either way.
    #[arg(long, value_enum)]
    pub precision: Option<crate::eval::Precision>,
    /// Worker threads, 1 to 1024 (default, or 0: all cores). Does not change the output.
    #[arg(long, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// With RUN_DIR: where the model runs, as for `curate train` (`cpu`, `ndarray`,
    /// `cuda[:N]`). Does not change the output beyond float rounding.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

#[derive(Debug, Args)]
pub struct PipelineArgs {
    /// The file: a pipeline file for `run` and `validate`, a training file for `train`; TOML,
    /// or JSON with the layout of a run's `config.json` (which repeats that run).
    pub file: PathBuf,
    /// Override a key: `--set bow.rm_top_freq=500` (a pipeline), `--set optim.lr=0.001` (a
    /// training file), `--set output_dir=out/x` (repeatable).
    #[arg(long = "set", value_name = "KEY.PATH=VALUE")]
    pub overrides: Vec<String>,
    /// Where models run: `cpu` (burn's flex backend), `ndarray`, or `cuda[:N]` (built with
    /// `--features cuda`). Does not change the output beyond float rounding.
    #[arg(long, default_value = "cpu")]
    pub device: String,
}

/// The burn device named by `--device`.
fn device(name: &str) -> anyhow::Result<burn::tensor::Device> {
    use burn::tensor::Device;
    match name {
        "cpu" | "flex" => Ok(Device::flex()),
        // burn 0.22 deprecates ndarray in favour of flex; kept for the backend comparison.
        #[cfg(feature = "ndarray")]
        #[allow(deprecated)]
        "ndarray" => Ok(Device::ndarray()),
        #[cfg(feature = "cuda")]
        cuda if cuda == "cuda" || cuda.starts_with("cuda:") => {
            let index: usize = cuda.strip_prefix("cuda:").unwrap_or("0").parse()?;
            start_cuda(cuda, index)
        }
        other if other.starts_with("cuda") => {
            anyhow::bail!("`--device {other}`: this curate was built without CUDA; rebuild with `--features cuda`")
        }
        #[cfg(not(feature = "ndarray"))]
        "ndarray" => {
            anyhow::bail!(
                "`--device ndarray`: this curate was built without it; rebuild with `--features ndarray`, or use `cpu`"
            )
        }
        other => anyhow::bail!("unknown device `{other}`; use `cpu`, `ndarray` or `cuda[:N]`"),
    }
}

/// `Device::cuda(index)`, started at once. burn starts the CUDA runtime on first use; without a
/// driver, that GPU or NVRTC it panics then, on its own thread and then on this one
/// (`RecvError`), each with a backtrace. One tiny round trip here, with the panics' messages
/// caught, turns that into one error that says what is missing.
#[cfg(feature = "cuda")]
fn start_cuda(name: &str, index: usize) -> anyhow::Result<burn::tensor::Device> {
    let device = burn::tensor::Device::cuda(index);
    let first_panic = std::sync::Arc::new(std::sync::Mutex::new(None::<String>));
    let seen = first_panic.clone();
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let mut first = seen.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            let message = info.payload().downcast_ref::<&str>().map(|s| s.to_string());
            *first = message.or_else(|| info.payload().downcast_ref::<String>().cloned());
        }
    }));
    let probe = device.clone();
    let started = std::panic::catch_unwind(move || {
        let one = burn::tensor::TensorData::new(vec![1f32], [1]);
        burn::tensor::Tensor::<1>::from_data(one, &probe).into_data()
    });
    std::panic::set_hook(hook);
    if started.is_err() {
        let why = first_panic.lock().unwrap_or_else(|e| e.into_inner()).take().unwrap_or_default();
        anyhow::bail!(
            "`--device {name}`: CUDA device {index} cannot be started (no NVIDIA driver, no GPU {index}, or no \
             libnvrtc): {why}"
        );
    }
    Ok(device)
}

#[derive(Debug, Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Continue from the newest checkpoint in `output_dir` (the same config is required).
    #[arg(long)]
    pub resume: bool,
    /// Threads that decode and augment batches ahead of the model. Does not change the result.
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Progress bar on stderr (auto: when stderr is a terminal).
    #[arg(long, value_enum, default_value_t = When::Auto)]
    pub progress: When,
    /// Print each step's time by phase on stderr (ms: batch, upload, teacher, forward (and
    /// loss), loss_read, backward, optim, drain). The device is drained after each step, so a traced
    /// run is slightly slower; the result is the same.
    #[arg(long)]
    pub trace_steps: bool,
    /// Write a sampling profile of the host's threads over steps 4 to 10 to this file (text:
    /// per thread, the functions by samples; for a step that waits on the host). Needs a build
    /// with the `sampling-profile` feature.
    #[arg(long, value_name = "FILE")]
    pub sample_profile: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, ValueEnum, Default)]
pub enum When {
    #[default]
    Auto,
    Always,
    Never,
}

impl When {
    /// Whether progress is shown: `auto` where stderr is a terminal.
    fn on(self) -> bool {
        match self {
            When::Always => true,
            When::Never => false,
            When::Auto => std::io::IsTerminal::is_terminal(&std::io::stderr()),
        }
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub pipeline: PipelineArgs,
    /// Worker threads, 1 to 1024 (default, or 0: all cores). Does not change the output.
    #[arg(long, value_parser = parse_threads)]
    pub threads: Option<usize>,
    /// Progress bars on stderr (auto: when stderr is a terminal).
    #[arg(long, value_enum, default_value_t = When::Auto)]
    pub progress: When,
    /// Memory (MiB) for keeping the parsed input between passes, so a stage that fits first
    /// (bow) does not make the input be read twice; a larger input is read again. 0 = never.
    /// Does not change the output.
    #[arg(long, default_value_t = crate::pipeline::execute::DEFAULT_CACHE_BYTES >> 20)]
    pub cache_mib: usize,
    /// Start over, even where a killed run of the same pipeline, settings and inputs left its
    /// finished shards and a checkpoint in `output_dir` (by default the run goes on from them).
    #[arg(long)]
    pub restart: bool,
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The default BoW cascade on a CC3M-format TSV against the I/O floor (read the TSV, write
    /// its caption column to Parquet), each in a child process; prints captions/s, the ratio
    /// and peak memory.
    Bow(crate::bench::BowBenchArgs),
    /// Sentence embeddings per second of a text encoder on captions from a TSV file
    /// (`benches/text_encoder_bench.py` runs it beside sentence-transformers).
    Text(crate::bench::TextBenchArgs),
    /// Exact top-k inner-product search (`knn::exact_top_k`) on f32 matrices from files; prints
    /// queries/s (`benches/knn_bench.py` runs it beside faiss).
    Knn(crate::bench::KnnBenchArgs),
    /// The I/O floor alone (used by `bench bow`).
    #[command(hide = true)]
    IoFloor { input: PathBuf, output: PathBuf },
    /// The BoW stage of a pipeline alone: its input parsed into memory first (untimed), then
    /// the fit passes and the deformation of every chunk, in parallel, writing nothing; prints
    /// the time (`bench bow` runs it on its input).
    BowStage {
        /// A pipeline file with a `bow` stage (its reader gives the input; its writer is unused).
        pipeline: PathBuf,
    },
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // Library errors render themselves (`error: ...`, location, `hint: ...`).
            if let Some(lib) = e.downcast_ref::<crate::Error>() {
                match lib {
                    crate::Error::Config(_) => say!("{lib}"),
                    _ => say!("error: {lib}"),
                }
            } else {
                say!("error: {e:#}");
            }
            2
        }
    }
}

/// Whether `file` reads as a training file (no `[[stage]]`, a `[model]`), so that `validate`
/// checks it as one; with syntax errors, as far as its other lines read; a file that does not
/// read at all is left to the pipeline check's messages.
fn is_training_file(file: &std::path::Path, overrides: &[String]) -> bool {
    use pipeline::config::ConfigDoc;
    ConfigDoc::load(file, overrides)
        .ok()
        .or_else(|| ConfigDoc::load_recovered(file, overrides).map(|(doc, _)| doc))
        .is_some_and(|doc| !doc.root.contains_key("stage") && doc.root.contains_key("model"))
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Validate(RunArgs { pipeline: args, .. }) => {
            // A training file is checked as `curate train` checks it before it reads data.
            if is_training_file(&args.file, &args.overrides) {
                let c = crate::train::TrainConfig::load(&args.file, &args.overrides)?;
                let length = match (c.steps, c.epochs) {
                    (Some(s), _) => format!("{s} steps"),
                    (None, Some(e)) => format!("{e} epochs"),
                    _ => "no length".into(),
                };
                say!(
                    "ok: `{}` is a valid training file: loss `{}`, {length}, output to `{}` (its tables are read \
                     when it trains)",
                    args.file.display(),
                    c.loss.loss_type().name(),
                    c.output_dir.display()
                );
                return Ok(0);
            }
            let plan = pipeline::plan::compile_on(&args.file, &args.overrides, &device(&args.device)?)?;
            say!(
                "ok: `{}` is valid: {} stage(s), output to `{}`",
                args.file.display(),
                plan.transforms.len() + 2,
                plan.output_dir.display()
            );
            Ok(0)
        }
        Command::Run(args) => {
            if let Some(n) = args.threads {
                // 0: rayon picks all cores.
                rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
            }
            let progress = args.progress.on();
            let plan = pipeline::plan::compile_on(
                &args.pipeline.file,
                &args.pipeline.overrides,
                &device(&args.pipeline.device)?,
            )?;
            let out = plan.output_dir.clone();
            let data_dir = out.join(&plan.write.dir);
            let opts =
                RunOptions { progress, cache_bytes: args.cache_mib.saturating_mul(1 << 20), restart: args.restart };
            let s = pipeline::run(plan, &opts)?;
            say!(
                "wrote {} rows to `{}` ({} shard(s)); {} rejected, {} skipped; {:.2} s",
                s.rows_written,
                data_dir.display(),
                s.data_shards.len(),
                s.rejected(),
                s.skipped.values().sum::<u64>(),
                s.timings_s.get("total").copied().unwrap_or(0.0)
            );
            for (reason, n) in &s.rejects {
                say!("  rejected {reason}: {n}");
            }
            for (reason, n) in &s.skipped {
                say!("  skipped {reason}: {n}");
            }
            for w in s.warnings() {
                say!("warning: {w}");
            }
            say!("report: `{}`", out.join("report.md").display());
            Ok(0)
        }
        Command::Noise(args) => {
            if let Some(out) = &args.out {
                create_parent(out)?;
            }
            let expand = |p: &str| crate::io::PathPatterns(vec![p.to_owned()]).expand().map_err(anyhow::Error::msg);
            let (images, texts) = (expand(&args.image_features)?, expand(&args.text_features)?);
            let c = crate::eval::noise::NoiseConfig {
                batch_size: args.batch_size,
                batches: args.batches,
                scale: args.scale,
                seed: args.seed,
            };
            let r = crate::eval::noise::run(&images, &texts, &c, &device(&args.device)?)?;
            outln!(
                "paired {:.3}, unpaired avg {:.3}, unpaired max {:.3} ({} batches of {} of {} pairs; {} image and {} \
                 caption rows without the other left out)",
                r.paired,
                r.unpaired_avg,
                r.unpaired_max,
                c.batches,
                c.batch_size,
                r.pairs,
                r.unmatched[0],
                r.unmatched[1]
            );
            if let Some(path) = &args.out {
                let json = serde_json::to_string_pretty(&serde_json::json!({"config": c, "result": r}))?;
                crate::io::write_atomic(path, format!("{json}\n").as_bytes())?;
            }
            Ok(0)
        }
        Command::Probe(args) => {
            if let Some(out) = &args.out {
                create_parent(out)?;
            }
            let features = crate::io::PathPatterns(vec![args.features.clone()]).expand().map_err(anyhow::Error::msg)?;
            let c = crate::eval::linear_probe::ProbeConfig {
                metric: args.metric,
                max_iter: args.max_iter,
                ..Default::default()
            };
            let note = |m: String| say!("{m}");
            let r =
                crate::eval::linear_probe::run_on_features(&features, &args.labels, &c, &device(&args.device)?, &note)?;
            outln!(
                "linear probe: test accuracy {:.2}%, mean per-class accuracy {:.2}% ({} test rows, {} classes; wd \
                 {:.4e} chosen by validation {} {:.2}% over {} rows)",
                100.0 * r.accuracy,
                100.0 * r.mean_per_class_accuracy,
                r.test,
                r.classes,
                r.wd,
                r.metric.name(),
                100.0 * r.val_score,
                r.val
            );
            for w in crate::eval::linear_probe::warnings(&r, "sample_id") {
                say!("warning: {w}");
            }
            if let Some(path) = &args.out {
                let json = serde_json::to_string_pretty(&serde_json::json!({"config": c, "result": r}))?;
                crate::io::write_atomic(path, format!("{json}\n").as_bytes())?;
            }
            Ok(0)
        }
        Command::Eval(args) => {
            // The evaluation's `config.json` records its inputs and output as JSON text: a path
            // that is not UTF-8 cannot be written there, so it is refused before any work.
            if let Some(bad) = std::env::args_os().find(|a| a.to_str().is_none()) {
                anyhow::bail!(
                    "`{}` is not valid UTF-8: `curate eval` records its inputs in `config.json`, which holds text \
                     only; rename the file or folder",
                    bad.to_string_lossy()
                );
            }
            if let Some(n) = args.threads {
                // 0: rayon picks all cores.
                rayon::ThreadPoolBuilder::new().num_threads(n).build_global()?;
            }
            if let Some(run_dir) = args.run {
                let run = crate::eval::trained::RunEval {
                    run: run_dir,
                    images: args.images,
                    captions: args.captions,
                    image_root: args.image_root,
                    eccv_annotations: args.eccv_annotations,
                    out: args.out,
                    similarity: args.similarity,
                    precision: args.precision,
                    swa: args.swa,
                    best: args.best,
                    progress: true,
                    uni_images: args.uni_images,
                    uni_images_root: args.uni_images_root,
                    sts: args.sts,
                    probe: args.probe,
                    probe_image_root: args.probe_image_root,
                    probe_config: crate::eval::linear_probe::ProbeConfig {
                        metric: args.probe_metric,
                        max_iter: args.probe_max_iter,
                        ..Default::default()
                    },
                    compose: args.compose,
                    compose_image_root: args.compose_image_root,
                    compose_config: crate::eval::compositionality::ComposeConfig {
                        queries: args.compose_queries,
                        min_shared: args.compose_min_shared,
                        seed: args.compose_seed,
                    },
                };
                let ev = crate::eval::trained::run_trained(&run, &device(&args.device)?)?;
                out!("{}", crate::eval::report::markdown_table(&ev));
                for w in crate::eval::report::warnings(&ev) {
                    say!("warning: {w}");
                }
                let total: f64 = ev.timings_s.iter().map(|t| t.1).sum();
                say!("wrote `{}` ({total:.2} s)", run.out_dir().join("metrics.json").display());
                return Ok(0);
            }
            // clap's `requires = "run"` on these is not enforced against the positional RUN_DIR
            // (in a group with `--image-embeddings`), so they are checked here.
            let run_only: Vec<&str> = [
                ("--images", args.images.is_some()),
                ("--captions", args.captions.is_some()),
                ("--image-root", args.image_root.is_some()),
                ("--uni-images", args.uni_images.is_some()),
                ("--sts", args.sts.is_some()),
                ("--probe", args.probe.is_some()),
                ("--compose", args.compose.is_some()),
                ("--swa", args.swa),
                ("--best", args.best),
            ]
            .into_iter()
            .filter_map(|(name, given)| given.then_some(name))
            .collect();
            if !run_only.is_empty() {
                return Err(crate::error::Error::Data {
                    message: format!(
                        "{} need(s) RUN_DIR, a trained run whose model embeds the tables; precomputed embeddings \
                         (`--image-embeddings`) are scored for retrieval only",
                        run_only.join(", ")
                    ),
                    hint: Some("pass the `curate train` output folder instead of the embedding tables".into()),
                }
                .into());
            }
            let (Some(image_embeddings), Some(caption_embeddings), Some(out)) =
                (args.image_embeddings, args.caption_embeddings, args.out)
            else {
                anyhow::bail!("pass RUN_DIR, or --image-embeddings, --caption-embeddings and --out");
            };
            let similarity = args.similarity.unwrap_or_default();
            let run = crate::eval::EmbeddingsRun {
                image_embeddings,
                caption_embeddings,
                eccv_annotations: args.eccv_annotations,
                out,
                similarity,
                precision: crate::eval::trained::resolve_precision(similarity, args.precision)?,
            };
            let ev = crate::eval::run_embeddings(&run)?;
            out!("{}", crate::eval::report::markdown_table(&ev));
            for w in crate::eval::report::warnings(&ev) {
                say!("warning: {w}");
            }
            let total: f64 = ev.timings_s.iter().map(|t| t.1).sum();
            say!("wrote `{}` ({total:.2} s)", run.out.join("metrics.json").display());
            Ok(0)
        }
        Command::Train(args) => {
            let config = crate::train::TrainConfig::load(&args.pipeline.file, &args.pipeline.overrides)?;
            let progress = args.progress.on();
            let opts = crate::train::TrainOptions {
                resume: args.resume,
                workers: args.workers,
                progress,
                device: device(&args.pipeline.device)?,
                trace_steps: args.trace_steps,
                sample_profile: args.sample_profile,
                stop_on_ctrl_c: true,
                ..Default::default()
            };
            let s = crate::train::train(&config, &opts)?;
            if s.interrupted {
                let mut resume = vec!["curate".to_owned(), "train".into(), args.pipeline.file.display().to_string()];
                for o in &args.pipeline.overrides {
                    resume.extend(["--set".to_owned(), o.clone()]);
                }
                if args.pipeline.device != "cpu" {
                    resume.extend(["--device".to_owned(), args.pipeline.device.clone()]);
                }
                resume.push("--resume".into());
                let resume: Vec<String> = resume.iter().map(|w| shell_word(w)).collect();
                say!(
                    "interrupted (Ctrl-C) after step {} of {}: checkpoint written; `{}` goes on from it",
                    s.steps,
                    s.total_steps,
                    resume.join(" ")
                );
                // The shell's convention for a run ended by SIGINT.
                return Ok(130);
            }
            let zs = |z: Option<crate::train::zeroshot::ZeroShotScores>| {
                z.map(|z| {
                    format!("top-1 {:.3}, top-5 {:.3}, top-10 {:.3} ({} classes)", z.top1, z.top5, z.top10, z.classes)
                })
                .unwrap_or_else(|| "not configured".into())
            };
            let resumed = match s.resumed_at {
                0 => String::new(),
                at => format!(" (resumed at step {at})"),
            };
            say!(
                "trained {} steps{resumed} on {} pairs in {:.1} s; last loss {:.4}",
                s.steps - s.resumed_at,
                s.rows,
                s.seconds,
                s.last_loss
            );
            if config.eval.as_ref().is_some_and(|e| e.images.is_some()) {
                say!(
                    "zero-shot at step {}: {}; at the end: {}",
                    s.first_zeroshot_step,
                    zs(s.first_zeroshot),
                    zs(s.last_zeroshot)
                );
            }
            if s.undecodable_images > 0 {
                say!(
                    "{} training image(s) could not be decoded (named in the notes above): the {} row(s) naming them \
                     that came up were left out, other rows taking their places",
                    s.undecodable_images,
                    s.undecodable_rows
                );
            }
            if let Some((step, rsum)) = s.best {
                say!(
                    "selected on the validation set: step {step} (RSUM {rsum:.1}), `model_best.bpk`; `curate eval {} \
                     --best` scores it",
                    s.output_dir.display()
                );
            }
            // What is there: a run shorter than `checkpoint_every` keeps no checkpoint, an
            // interrupted one no final model.
            let kept: Vec<String> = ["config.json", "metrics.jsonl", "checkpoints", "model.bpk", "model_best.bpk"]
                .iter()
                .map(|name| s.output_dir.join(name))
                .filter(|p| p.exists())
                .map(|p| {
                    let name = p.file_name().map_or(String::new(), |n| n.to_string_lossy().into_owned());
                    if p.is_dir() {
                        format!("{name}/")
                    } else {
                        name
                    }
                })
                .collect();
            say!("output: `{}` ({})", s.output_dir.display(), kept.join(", "));
            Ok(0)
        }
        Command::Bench(BenchCommand::Bow(args)) => {
            crate::bench::bow(&args)?;
            Ok(0)
        }
        Command::Bench(BenchCommand::Text(args)) => {
            crate::bench::text(&args, &device(&args.device)?)?;
            Ok(0)
        }
        Command::Bench(BenchCommand::Knn(args)) => {
            let device = args.device.as_deref().map(device).transpose()?;
            crate::bench::knn(&args, device.as_ref())?;
            Ok(0)
        }
        Command::Bench(BenchCommand::IoFloor { input, output }) => {
            let rows = crate::bench::io_floor(&input, &output)?;
            outln!("{rows}");
            Ok(0)
        }
        Command::Bench(BenchCommand::BowStage { pipeline }) => {
            crate::bench::bow_stage(&pipeline)?;
            Ok(0)
        }
    }
}

/// `word` as a POSIX shell reads it back: as it is when it holds nothing the shell treats
/// specially, else in single quotes.
fn shell_word(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// `--threads`: at most [`MAX_THREADS`], so that a slip of the keyboard (`--threads 100000`)
/// is an error instead of a machine buried under threads; 0 means all cores.
fn parse_threads(s: &str) -> std::result::Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| crate::error::whole_number_problem(s))?;
    if n > MAX_THREADS {
        return Err(format!("{n} threads is more than {MAX_THREADS}; use 0 (or leave it out) for all cores"));
    }
    Ok(n)
}

const MAX_THREADS: usize = 1024;

/// Checks that `file` (`--out`) can be written and creates the folder it goes in, before the
/// work that ends in writing it.
fn create_parent(file: &std::path::Path) -> anyhow::Result<()> {
    if file.is_dir() {
        let example = file.join("result.json");
        anyhow::bail!("`--out` `{}` is a folder; give the file to write, e.g. `{}`", file.display(), example.display());
    }
    if let Some(parent) = file.parent().filter(|p| !p.as_os_str().is_empty()) {
        if let Some(file_above) = parent.ancestors().find(|a| a.exists()).filter(|a| !a.is_dir()) {
            anyhow::bail!("cannot write `--out` `{}`: `{}` is not a folder", file.display(), file_above.display());
        }
        std::fs::create_dir_all(parent)
            .map_err(|e| anyhow::anyhow!("cannot create `{}` for `--out`: {e}", parent.display()))?;
    }
    Ok(())
}
