//! A finished `curate train` run, loaded frozen for inference: its resolved `config.json`, the
//! final `model.bpk` and the text tower's tokenizer. It embeds captions and preprocessed images
//! exactly as the trainer's zero-shot evaluation does (L2-normalised cross-modal embeddings), for
//! pseudo-BoW mining (`stages::mine_pseudo_bow`) and `curate eval RUN_DIR`.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{Device, Int, Tensor, TensorData};
use tokenizers::Tokenizer;

use super::config::TrainConfig;
use super::data::{load_tokenizer, tokenize};
use super::dual_encoder::DualEncoder;
use super::run::heads;
use crate::error::{Error, Result};
use crate::models::pooling::l2_normalize;

/// Captions per text forward pass.
const TEXT_BATCH: usize = 256;

pub struct TrainedRun {
    pub dir: PathBuf,
    pub config: TrainConfig,
    pub model: DualEncoder,
    pub tokenizer: Tokenizer,
    device: Device,
}

impl TrainedRun {
    /// A run's model as it stands mid-training (the trainer's validation for
    /// `eval.select_best`): `model` an inference copy on `device`.
    pub fn from_model(
        dir: &Path,
        config: &TrainConfig,
        model: DualEncoder,
        tokenizer: Tokenizer,
        device: &Device,
    ) -> TrainedRun {
        TrainedRun { dir: dir.to_owned(), config: config.clone(), model, tokenizer, device: device.clone() }
    }
}

/// `‖σ²‖₁ = Σ_k exp(v_k)` of each row of log-variances `v` (`[rows * width]`), as PCME++'s
/// evaluation computes it: `exp` in float32 (`torch.exp`), widened, summed in float64.
pub fn uncertainties(v: &[f32], width: usize) -> Vec<f64> {
    v.chunks(width).map(|row| row.iter().map(|&x| f64::from(x.exp())).sum()).collect()
}

fn to_vec(t: Tensor<2>) -> Result<Vec<f32>> {
    t.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))
}

impl TrainedRun {
    /// Loads `dir/config.json` and `dir/model.bpk` (written when a run finishes all its steps).
    pub fn load(dir: &Path, device: &Device) -> Result<TrainedRun> {
        TrainedRun::load_weights(dir, device, false)
    }

    /// [`TrainedRun::load`] with the SWA average (`model_swa.bpk`, `optim.swa_start_epoch`)
    /// instead of the final model when `swa`.
    pub fn load_weights(dir: &Path, device: &Device, swa: bool) -> Result<TrainedRun> {
        TrainedRun::load_file(dir, device, if swa { "model_swa.bpk" } else { "model.bpk" })
    }

    /// [`TrainedRun::load`] with the model the run selected on its validation set
    /// (`model_best.bpk`, `eval.select_best`).
    pub fn load_best(dir: &Path, device: &Device) -> Result<TrainedRun> {
        if dir.join("config.json").is_file() && !dir.join("model_best.bpk").is_file() {
            return Err(Error::Data {
                message: format!("`{}` has no selected model (model_best.bpk)", dir.display()),
                hint: Some(
                    "train with `eval.select_best = true` (and `[eval.retrieval]`), or leave out `--best`".into(),
                ),
            });
        }
        TrainedRun::load_file(dir, device, "model_best.bpk")
    }

    /// A run whose finished model is `dir/file`.
    fn load_file(dir: &Path, device: &Device, file: &str) -> Result<TrainedRun> {
        let swa = file == "model_swa.bpk";
        let config_path = dir.join("config.json");
        let model_path = dir.join(file);
        let hint = || Some(format!("train it first (`curate train FILE --set output_dir={}`)", dir.display()));
        if dir.is_file() {
            let folder = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
            return Err(Error::Data {
                message: format!("`{}` is a file; a `curate train` run is named by its folder", dir.display()),
                hint: Some(format!("name the run's folder (`{}`)", folder.display())),
            });
        }
        if !config_path.is_file() {
            return Err(Error::Data {
                message: format!("`{}` is not a `curate train` run: it has no config.json", dir.display()),
                hint: hint(),
            });
        }
        let text = std::fs::read_to_string(&config_path).map_err(|e| Error::io("cannot read", &config_path, e))?;
        let json = serde_json::from_str::<serde_json::Value>(&text).ok();
        // A pipeline's output folder has a config.json too: its stages.
        if json.as_ref().is_some_and(|v| v.get("stage").is_some()) {
            return Err(Error::Data {
                message: format!(
                    "`{}` is the output of `curate run` (a pipeline), not a `curate train` run",
                    dir.display()
                ),
                hint: Some("name the `output_dir` of a `curate train` run".into()),
            });
        }
        // So has a model's folder (Hugging Face's `config.json`), and anything else: a training
        // run's has its `model`, `data` and `loss` tables.
        if !json
            .as_ref()
            .is_some_and(|v| ["model", "data", "loss"].iter().all(|k| v.get(k).is_some_and(|t| t.is_object())))
        {
            return Err(Error::Data {
                message: format!(
                    "`{}` is not a `curate train` run: its config.json is no training config (no `model`, `data` \
                     and `loss` tables)",
                    dir.display()
                ),
                hint: Some("name the `output_dir` of a `curate train` run".into()),
            });
        }
        if swa && !model_path.is_file() && dir.join("model.bpk").is_file() {
            return Err(Error::Data {
                message: format!("`{}` has no SWA average (model_swa.bpk)", dir.display()),
                hint: Some(
                    "train with `optim.swa_start_epoch` at an epoch the run completes (a run that ends \
                     before one writes none), or leave out `--swa`"
                        .into(),
                ),
            });
        }
        if !model_path.is_file() {
            return Err(Error::Data {
                message: format!("`{}` has no final model (model.bpk): the run did not finish", dir.display()),
                hint: Some("finish it with `curate train FILE --resume`".into()),
            });
        }
        let config: TrainConfig = serde_json::from_str(&text).map_err(|e| Error::Data {
            message: format!("`{}` is not a curate training config: {e}", config_path.display()),
            hint: Some("it was written by another curate version; train again".into()),
        })?;
        // The saved weights replace every tensor: the towers' checkpoints are not read.
        let model = DualEncoder::init(&config.model.architecture_only(), heads(&config.loss), config.seed, device)?
            .try_load_file(&model_path)
            .map_err(|e| {
                let hint = match e {
                    burn::store::RecordError::Io(_) => {
                        "it cannot be read as a model file (cut short, damaged, or from another burn version)"
                    }
                    _ => "the model does not match the run's config.json",
                };
                Error::Model {
                    message: format!("cannot load `{}`: {e}", model_path.display()),
                    hint: Some(hint.into()),
                }
            })?;
        let tokenizer = load_tokenizer(config.model.tokenizer_dir(), config.model.max_tokens())?;
        Ok(TrainedRun { dir: dir.to_owned(), config, model, tokenizer, device: device.clone() })
    }

    /// The files `load` reads: the run's `config.json` and `model.bpk`, and its text tower's
    /// tokenizer (`tokenizer.json`, with the pad id from that folder's `config.json`), which
    /// lies outside the run folder. For a pipeline's checkpoint stamps.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        let mut files = crate::io::model_files(&self.dir, &["config.json", "model.bpk"]);
        let dir = self.config.model.tokenizer_dir();
        files.extend(crate::io::model_files(
            dir,
            &["tokenizer.json", "vocab.txt", "tokenizer_config.json", "config.json", "open_clip_config.json"],
        ));
        files
    }

    /// The device the model runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    pub fn image_size(&self) -> usize {
        self.config.model.image_size_px
    }

    /// The image transform the model was trained with (its evaluation view prepares images
    /// for it).
    pub fn transform(&self) -> super::transform::ImageTransform {
        super::transform::ImageTransform::new(&self.config.data, self.image_size())
    }

    /// Width of the cross-modal embeddings.
    pub fn dim(&self) -> usize {
        self.config.model.embed_dim
    }

    /// L2-normalised text embeddings, `[texts.len(), dim]` row-major.
    pub fn embed_texts(&self, texts: &[&str]) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(texts.len() * self.dim());
        for chunk in texts.chunks(TEXT_BATCH) {
            let (ids, mask) = self.token_tensors(chunk)?;
            out.extend(to_vec(l2_normalize(self.model.encode_text(ids, mask)))?);
        }
        Ok(out)
    }

    /// CUSA's uni-modal text embeddings (`forward`'s `text_uni`, not normalised), `[texts.len(),
    /// dim]` row-major; `None` for a model without the uni-modal text head.
    pub fn embed_texts_uni(&self, texts: &[&str]) -> Result<Option<Vec<f32>>> {
        if self.model.text_uni.is_none() {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(texts.len() * self.dim());
        for chunk in texts.chunks(TEXT_BATCH) {
            let (ids, mask) = self.token_tensors(chunk)?;
            out.extend(to_vec(self.model.encode_text_uni(ids, mask).expect("the head is there"))?);
        }
        Ok(Some(out))
    }

    /// CUSA's uni-modal image embeddings of `n` preprocessed images, as
    /// [`TrainedRun::embed_texts_uni`].
    pub fn embed_images_uni(&self, pixels: Vec<f32>, n: usize) -> Result<Option<Vec<f32>>> {
        if self.model.image_uni.is_none() {
            return Ok(None);
        }
        if n == 0 {
            return Ok(Some(Vec::new()));
        }
        let e = self.model.encode_image_uni(self.image_tensor(pixels, n)).expect("the head is there");
        Ok(Some(to_vec(e)?))
    }

    /// Whether the model has PCME++'s log-variance heads, so that each item has an uncertainty
    /// `‖σ²‖₁` and retrieval can score by CSD.
    pub fn has_uncertainty(&self) -> bool {
        self.model.image_log_var.is_some() && self.model.text_log_var.is_some()
    }

    /// [`TrainedRun::embed_texts`] and each text's `‖σ²‖₁ = Σ_k exp(v_k)` (`exp` of the head's
    /// float32 `v` in float32, summed in float64, as PCME++'s evaluation code; spec
    /// `cusa-and-pcmepp.md` §3.11). Needs [`TrainedRun::has_uncertainty`].
    pub fn embed_texts_uncertain(&self, texts: &[&str]) -> Result<(Vec<f32>, Vec<f64>)> {
        let mut out = (Vec::with_capacity(texts.len() * self.dim()), Vec::with_capacity(texts.len()));
        for chunk in texts.chunks(TEXT_BATCH) {
            let (ids, mask) = self.token_tensors(chunk)?;
            let (e, v) = self.model.encode_text_with_log_var(ids, mask);
            out.0.extend(to_vec(l2_normalize(e))?);
            out.1.extend(self.uncertainty(v)?);
        }
        Ok(out)
    }

    fn token_tensors(&self, texts: &[&str]) -> Result<(Tensor<2, Int>, Tensor<2, Int>)> {
        let (ids, mask, seq) = tokenize(&self.tokenizer, texts)?;
        let shape = [texts.len(), seq];
        let ids = Tensor::<2, Int>::from_data(TensorData::new(ids, shape), &self.device);
        let mask = Tensor::<2, Int>::from_data(TensorData::new(mask, shape), &self.device);
        Ok((ids, mask))
    }

    /// `Σ_k exp(v_k)` per row, in float64.
    fn uncertainty(&self, v: Option<Tensor<2>>) -> Result<Vec<f64>> {
        let v = v.ok_or_else(|| {
            Error::data(format!("`{}` has no log-variance heads (not a PCME++ run)", self.dir.display()))
        })?;
        Ok(uncertainties(&to_vec(v)?, self.dim()))
    }

    fn image_tensor(&self, pixels: Vec<f32>, n: usize) -> Tensor<4> {
        let s = self.image_size();
        Tensor::<4>::from_data(TensorData::new(pixels, [n, 3, s, s]), &self.device)
    }

    /// L2-normalised image embeddings of `n` preprocessed images (`[n, 3, size, size]` CHW,
    /// as [`super::transform::ImageTransform`] makes them), `[n, dim]` row-major.
    pub fn embed_images(&self, pixels: Vec<f32>, n: usize) -> Result<Vec<f32>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        to_vec(l2_normalize(self.model.encode_image(self.image_tensor(pixels, n))))
    }

    /// The image tower's pooled features of `n` preprocessed images, before any head and not
    /// normalised (what a linear probe reads off a frozen tower), `[n, width]` row-major, and
    /// their width.
    pub fn image_features(&self, pixels: Vec<f32>, n: usize) -> Result<(Vec<f32>, usize)> {
        if n == 0 {
            return Ok((Vec::new(), 0));
        }
        let f = self.model.image_features(self.image_tensor(pixels, n));
        let width = f.dims()[1];
        Ok((to_vec(f)?, width))
    }

    /// [`TrainedRun::embed_images`] and each image's `‖σ²‖₁`, as
    /// [`TrainedRun::embed_texts_uncertain`].
    pub fn embed_images_uncertain(&self, pixels: Vec<f32>, n: usize) -> Result<(Vec<f32>, Vec<f64>)> {
        if n == 0 {
            return Ok((Vec::new(), Vec::new()));
        }
        let (e, v) = self.model.encode_image_with_log_var(self.image_tensor(pixels, n));
        Ok((to_vec(l2_normalize(e))?, self.uncertainty(v)?))
    }
}
