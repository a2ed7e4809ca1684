//! Checkpoint tensors by name, read from a safetensors file (Hugging Face, torchvision and CLIP
//! checkpoints all ship them) or a PyTorch `torch.save` file ([`torch_checkpoint`]: `.pt`,
//! `.pth`, `pytorch_model.bin`), handed to model constructors one at a time. Every tensor that is
//! missing, mis-shaped or left unused is recorded, and [`Weights::finish`] refuses the
//! checkpoint with the complete list (the first 20 of each kind, and how many more) — a model
//! never runs on half-loaded weights. Nothing of the size a config names is allocated for a
//! tensor the checkpoint cannot give, so a config with absurd sizes is refused fast.
//!
//! PyTorch stores a `Linear` weight as `[out, in]`; burn's is `[in, out]`: [`Weights::linear`]
//! transposes on load.
//!
//! [`Weights::random`] is the other source: no checkpoint, every tensor drawn from a seeded
//! stream keyed by its name, with PyTorch's default initialisation for its kind (Linear and
//! Conv weights and biases uniform in ±1/√fan_in, LayerNorm and BatchNorm weight 1 and bias 0,
//! running statistics 0 and 1, other tensors — embeddings — N(0, 0.02), other biases 0), so a
//! model built from it trains from scratch, and the same seed rebuilds the same model whatever
//! order the constructor asks for the tensors in.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use burn::module::Param;
use burn::module::RunningState;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, LayerNorm, LayerNormConfig, Linear, PaddingConfig2d};
use burn::tensor::{Device, Tensor, TensorData};

use crate::error::{Error, Result};
use crate::models::torch_checkpoint;

/// The error for a checkpoint that is not there, naming a sharded checkpoint beside it (an
/// `*.index.json` of several files), which a model folder is read as but a single file is not.
fn not_found(path: &Path) -> Error {
    let dir = path.parent().unwrap_or(Path::new("."));
    let index =
        ["model.safetensors.index.json", "pytorch_model.bin.index.json"].into_iter().find(|f| dir.join(f).is_file());
    match index {
        Some(index) => Error::Model {
            message: format!("`{}` does not exist; the folder holds a sharded checkpoint (`{index}`)", path.display()),
            hint: Some("name the model folder, not a file in it: its shards are read together".into()),
        },
        None => Error::io(
            "cannot read checkpoint",
            path,
            std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory"),
        ),
    }
}

/// The weights file of a Hugging Face model folder: `model.safetensors`, else
/// `pytorch_model.bin` (older models ship only that, DeCLUTR among them), else the index of a
/// sharded checkpoint (`model.safetensors.index.json`, `pytorch_model.bin.index.json`);
/// `model.safetensors` when none is there, for the error to name. [`Weights::from_folder_file`]
/// reads any of them.
pub fn hf_weights_file(dir: &Path) -> std::path::PathBuf {
    first_present(
        dir,
        &["model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json"],
    )
}

/// The weights file of an open_clip model folder: `open_clip_model.safetensors`, else
/// `open_clip_pytorch_model.bin` (as open_clip's Hugging Face repositories ship them).
pub fn open_clip_weights_file(dir: &Path) -> std::path::PathBuf {
    first_present(dir, &["open_clip_model.safetensors", "open_clip_pytorch_model.bin"])
}

/// The index and shard files of a sharded checkpoint in model folder `dir` (none for a folder
/// without one, or an index that does not parse): what a run's resume stamps must cover.
pub fn shard_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let index = hf_weights_file(dir);
    if !index.to_string_lossy().ends_with(".index.json") || !index.is_file() {
        return Vec::new();
    }
    let shards: Vec<String> = std::fs::read_to_string(&index)
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| {
            v["weight_map"].as_object().map(|m| m.values().filter_map(|f| f.as_str().map(str::to_owned)).collect())
        })
        .unwrap_or_default();
    let mut files = vec![index];
    for s in shards {
        let p = dir.join(s);
        if !files.contains(&p) {
            files.push(p);
        }
    }
    files
}

fn first_present(dir: &Path, names: &[&str]) -> std::path::PathBuf {
    names.iter().map(|n| dir.join(n)).find(|p| p.is_file()).unwrap_or_else(|| dir.join(names[0]))
}

/// Shape of a square 2-D convolution.
#[derive(Debug, Clone, Copy)]
pub struct ConvSpec {
    pub d_in: usize,
    pub d_out: usize,
    pub kernel: usize,
    pub stride: usize,
    pub padding: usize,
}

/// One stored tensor, converted to f32.
struct Stored {
    shape: Vec<usize>,
    data: Vec<f32>,
}

/// The tensors of a checkpoint and the bookkeeping of which were taken.
pub struct Weights {
    source: String,
    tensors: BTreeMap<String, Stored>,
    /// Tensors of a type curate does not read as weights (integers, booleans, 8-bit and smaller
    /// floats), by name: their type and shape. Integer buffers such as BERT's `position_ids` are
    /// never asked for and are passed over; one a model asks for is reported with its type.
    other_dtypes: BTreeMap<String, (String, Vec<usize>)>,
    wrong_dtype: RefCell<Problems>,
    used: RefCell<BTreeSet<String>>,
    missing: RefCell<Problems>,
    misshaped: RefCell<Problems>,
    /// `Some(seed)`: no checkpoint, every tensor is initialised at random (see [`Init`]).
    random: Option<u64>,
    /// Whether the reader removed a `module.` from every name ([`torch_checkpoint`]).
    stripped_module: bool,
}

/// Problems of one kind: how many, and the first [`Problems::SHOWN`] of them, which is all the
/// report lists. A config.json with absurd sizes (200,000 layers) names millions of missing
/// tensors; keeping only a count of the rest keeps refusing it cheap.
#[derive(Default)]
struct Problems {
    shown: Vec<String>,
    count: usize,
}

impl Problems {
    const SHOWN: usize = 20;

    fn push(&mut self, item: impl FnOnce() -> String) {
        if self.count < Self::SHOWN {
            self.shown.push(item());
        }
        self.count += 1;
    }
}

/// How [`Weights::random`] fills a tensor of a given kind.
#[derive(Debug, Clone, Copy)]
enum Init {
    /// By name: `*bias` → 0, anything else (embeddings, class tokens) → N(0, 0.02), as BERT's
    /// `initializer_range`.
    ByName,
    /// Uniform in `[-bound, bound]` (PyTorch's Linear/Conv default: `bound = 1/√fan_in`).
    Uniform(f64),
    /// N(0, std²).
    Normal(f64),
    Const(f32),
}

/// How [`Weights::linear_init`] draws a new Linear layer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum LinearInit {
    /// PyTorch's default: weight and bias uniform in `±1/√fan_in`.
    PyTorch,
    /// Weight ~ N(0, std²), bias PyTorch's default.
    Normal(f64),
    /// Weight Xavier-uniform (`±√(6/(fan_in + fan_out))`), bias 0.
    XavierUniform,
}

impl Weights {
    /// Reads a model folder's weights file ([`hf_weights_file`]): one checkpoint, or the shards
    /// a Hugging Face `*.index.json` lists (its `weight_map`), read one after another into one
    /// set of tensors; a tensor in two shards is refused.
    pub fn from_folder_file(path: &Path) -> Result<Weights> {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if !name.ends_with(".index.json") {
            return Self::from_checkpoint(path);
        }
        let bad = |why: String| Error::Model {
            message: format!("`{}` is not a sharded checkpoint's index: {why}", path.display()),
            hint: Some("a Hugging Face index holds `weight_map`: tensor name -> shard file".into()),
        };
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("cannot read checkpoint index", path, e))?;
        let index: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let map = index["weight_map"].as_object().ok_or_else(|| bad("no `weight_map`".into()))?;
        let mut shards: Vec<&str> = Vec::new();
        for file in map.values() {
            let file = file.as_str().ok_or_else(|| bad("a shard that is not a file name".into()))?;
            if !shards.contains(&file) {
                shards.push(file);
            }
        }
        if shards.is_empty() {
            return Err(bad("an empty `weight_map`".into()));
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut all = Weights::new(format!("{} ({} shards)", path.display(), shards.len()), BTreeMap::new());
        for shard in shards {
            let w = Self::from_checkpoint(&dir.join(shard))?;
            for name in w.tensors.keys().chain(w.other_dtypes.keys()) {
                if all.contains(name) {
                    return Err(bad(format!("tensor `{name}` is in two shards (the second: `{shard}`)")));
                }
            }
            all.tensors.extend(w.tensors);
            all.other_dtypes.extend(w.other_dtypes);
        }
        Ok(all)
    }

    /// Reads a checkpoint file of either kind curate knows, told apart by its first bytes: a
    /// PyTorch `torch.save` file (zip or legacy: [`torch_checkpoint`]) or safetensors.
    pub fn from_checkpoint(path: &Path) -> Result<Weights> {
        let mut head = Vec::with_capacity(64);
        std::fs::File::open(path)
            .and_then(|f| std::io::Read::read_to_end(&mut std::io::Read::take(f, 64), &mut head))
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => not_found(path),
                _ => Error::io("cannot read checkpoint", path, e),
            })?;
        if torch_checkpoint::looks_like_torch(&head) {
            return Self::from_torch(path);
        }
        let text = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let not_weights = |what: &str, hint: &str| Error::Model {
            message: format!("`{}` is {what}, not model weights", path.display()),
            hint: Some(hint.into()),
        };
        if text.starts_with("version https://git-lfs") {
            return Err(not_weights("a Git LFS pointer", "fetch the file itself: `git lfs pull` in its repository"));
        }
        if text.trim_start().starts_with("<!doctype html") || text.trim_start().starts_with("<html") {
            return Err(not_weights("an HTML page (a failed download?)", "download the file again"));
        }
        Self::from_safetensors(path)
    }

    /// Reads every floating-point tensor of a safetensors file (F64, F32, F16, BF16 → f32: a
    /// model saved in double precision loads as it would in PyTorch after `.float()`). Tensors
    /// of other types are kept aside by name: integer ones are buffers such as BERT's
    /// `position_ids`, never weights, and a model that asks for one gets it reported with its
    /// type (not as missing).
    pub fn from_safetensors(path: &Path) -> Result<Weights> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("cannot read checkpoint", path, e))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::Model {
            message: format!("`{}` is neither a safetensors file nor a PyTorch checkpoint: {e}", path.display()),
            hint: Some(
                "curate loads safetensors checkpoints and PyTorch `torch.save` files (`.pt`, `.pth`, `.bin`)".into(),
            ),
        })?;
        let mut w = Weights::new(path.display().to_string(), BTreeMap::new());
        for (name, view) in st.tensors() {
            w.insert(path, name, view.dtype(), view.shape().to_vec(), view.data())?;
        }
        Ok(w)
    }

    /// Reads the tensors of a PyTorch checkpoint ([`torch_checkpoint`]: a state dict, the one a
    /// training checkpoint holds, a pickled module or a TorchScript archive), by their state-dict
    /// names, as [`Weights::from_safetensors`] reads its file.
    pub fn from_torch(path: &Path) -> Result<Weights> {
        let c = torch_checkpoint::read(path)?;
        // A training checkpoint with a moving average of its weights: which set is read is said.
        if let Some(e) = c.entry.as_deref().filter(|e| matches!(*e, "model_ema" | "state_dict_ema")) {
            say!("note: `{}`: the weights' moving average (its `{e}`) is read", path.display());
        }
        let mut source = path.display().to_string();
        match (&c.entry, c.stripped_module) {
            (Some(e), true) => source += &format!(" (its `{e}`, `module.` removed)"),
            (Some(e), false) => source += &format!(" (its `{e}`)"),
            (None, true) => source += " (`module.` removed)",
            (None, false) => {}
        }
        let mut w = Weights::new(source, BTreeMap::new());
        w.stripped_module = c.stripped_module;
        for (name, t) in c.tensors {
            use safetensors::Dtype as D;
            use torch_checkpoint::TorchDtype as T;
            let Some(dtype) = t.dtype else {
                // A type curate does not read: an error only if a model asks for it.
                w.other_dtypes.insert(name, (t.type_name, t.shape));
                continue;
            };
            let dtype = match dtype {
                T::F64 => D::F64,
                T::F32 => D::F32,
                T::F16 => D::F16,
                T::BF16 => D::BF16,
                T::I64 => D::I64,
                T::I32 => D::I32,
                T::I16 => D::I16,
                T::I8 => D::I8,
                T::U8 => D::U8,
                T::Bool => D::BOOL,
            };
            w.insert(path, name, dtype, t.shape, &t.bytes)?;
        }
        Ok(w)
    }

    /// Keeps one stored tensor (little-endian `raw`): a floating-point one converted to f32, one
    /// of another type aside by name.
    fn insert(
        &mut self,
        path: &Path,
        name: String,
        dtype: safetensors::Dtype,
        shape: Vec<usize>,
        raw: &[u8],
    ) -> Result<()> {
        let data: Vec<f32> = match dtype {
            safetensors::Dtype::F32 => {
                raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
            }
            safetensors::Dtype::F16 => {
                raw.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            safetensors::Dtype::BF16 => {
                raw.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
            }
            safetensors::Dtype::F64 => {
                let wide = raw.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")));
                // A finite double past f32's range would load as ±inf without a word.
                if let Some(v) = wide.clone().find(|v| v.is_finite() && (*v as f32).is_infinite()) {
                    return Err(Error::Model {
                        message: format!(
                            "`{}`: F64 tensor `{name}` holds {v:e}, past what float32 holds (±{:e})",
                            path.display(),
                            f32::MAX
                        ),
                        hint: Some("curate computes in float32: rescale or retrain the weight".into()),
                    });
                }
                wide.map(|v| v as f32).collect()
            }
            other => {
                self.other_dtypes.insert(name, (format!("{other:?}"), shape));
                return Ok(());
            }
        };
        self.tensors.insert(name, Stored { shape, data });
        Ok(())
    }

    fn new(source: String, tensors: BTreeMap<String, Stored>) -> Weights {
        Weights {
            source,
            tensors,
            other_dtypes: Default::default(),
            wrong_dtype: Default::default(),
            used: Default::default(),
            missing: Default::default(),
            misshaped: Default::default(),
            random: None,
            stripped_module: false,
        }
    }

    /// A source without a checkpoint: every tensor a model asks for is drawn at random from a
    /// stream keyed by `(seed, name)`, with PyTorch's default initialisation for its kind.
    /// [`Weights::finish`] always succeeds.
    pub fn random(seed: u64) -> Weights {
        let mut w = Weights::new(format!("random(seed={seed})"), BTreeMap::new());
        w.random = Some(seed);
        w
    }

    /// Whether this source initialises at random instead of reading a checkpoint.
    pub fn is_random(&self) -> bool {
        self.random.is_some()
    }

    /// From in-memory `(name, shape, values)` triples (tests).
    pub fn from_parts(parts: Vec<(String, Vec<usize>, Vec<f32>)>) -> Weights {
        let tensors = parts.into_iter().map(|(n, shape, data)| (n, Stored { shape, data })).collect();
        Weights::new("memory".into(), tensors)
    }

    /// Whether the checkpoint holds `name`, of any type (layouts are told apart by names).
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name) || self.other_dtypes.contains_key(name)
    }

    /// How many of the `n` numbered blocks `{prefix}{i}.` (a transformer's layers) a model should
    /// build: all of them from a random source, else those up to the last one the checkpoint
    /// holds anything of. The blocks past it are recorded as one missing entry rather than built
    /// from placeholders tensor by tensor: a config.json asking for 200,000 layers (or 10¹²) of a
    /// 2-layer checkpoint is refused at once, not after building (or failing to allocate) them.
    pub fn blocks(&self, prefix: &str, n: usize, what: &str) -> usize {
        if self.is_random() {
            return n;
        }
        let stored = self
            .tensors
            .keys()
            .chain(self.other_dtypes.keys())
            .filter_map(|k| k.strip_prefix(prefix)?.split_once('.')?.0.parse::<usize>().ok())
            .filter(|&i| i < n)
            .max()
            .map_or(0, |i| i + 1);
        if stored < n {
            self.missing.borrow_mut().push(|| {
                format!(
                    "{prefix}{stored}.* to {prefix}{}.*: {} {what}, none in the checkpoint (it has {stored})",
                    n - 1,
                    n - stored
                )
            });
        }
        stored
    }

    /// The tensor `name`, which must have `shape`. A missing or mis-shaped tensor is recorded and
    /// zeros stand in, so that loading goes on and every problem is reported at once. The zeros
    /// are one element broadcast to the shape, a view on the CPU backend: nothing of the size
    /// config.json names is allocated for a tensor the checkpoint lacks, so a config with absurd
    /// sizes (`intermediate_size` 20,000,000) is refused at once and in little memory, not after
    /// allocating gigabytes of zeros. The model they stand in is never run: [`Weights::finish`]
    /// refuses the checkpoint.
    pub fn tensor<const D: usize>(&self, name: &str, shape: [usize; D], device: &Device) -> Tensor<D> {
        self.tensor_init(name, shape, Init::ByName, device)
    }

    fn tensor_init<const D: usize>(&self, name: &str, shape: [usize; D], init: Init, device: &Device) -> Tensor<D> {
        match self.values_init(name, shape, init) {
            Some(values) => Tensor::from_data(TensorData::new(values, shape), device),
            None => placeholder(shape),
        }
    }

    /// The values of the tensor `name` of `shape`, row-major: drawn as `init` says when random,
    /// the checkpoint's otherwise; `None` (and the problem recorded for `finish`) when the
    /// checkpoint lacks it or holds it in another shape or type.
    fn values_init<const D: usize>(&self, name: &str, shape: [usize; D], init: Init) -> Option<Vec<f32>> {
        if let Some(seed) = self.random {
            return Some(random_values(seed, name, shape.iter().product(), init));
        }
        // Only checkpoint names matter to `finish`'s unused list; recording the names of
        // missing tensors too would grow with the config's sizes.
        if self.contains(name) {
            self.used.borrow_mut().insert(name.to_owned());
        }
        match self.tensors.get(name) {
            Some(t) if t.shape == shape => return Some(t.data.clone()),
            Some(t) => self.misshaped.borrow_mut().push(|| format!("{name}: {:?}, expected {shape:?}", t.shape)),
            None => match self.other_dtypes.get(name) {
                Some((dtype, stored)) => self.wrong_dtype.borrow_mut().push(|| format!("{name}: {dtype} {stored:?}")),
                None => self.missing.borrow_mut().push(|| format!("{name} {shape:?}")),
            },
        }
        None
    }

    pub fn param<const D: usize>(&self, name: &str, shape: [usize; D], device: &Device) -> Param<Tensor<D>> {
        Param::from_tensor(self.tensor(name, shape, device))
    }

    fn param_init<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        init: Init,
        device: &Device,
    ) -> Param<Tensor<D>> {
        Param::from_tensor(self.tensor_init(name, shape, init, device))
    }

    /// A tensor that starts uniform in `[-bound, bound]` when random (PyTorch's default for
    /// `nn.GRU`'s weights and biases, `bound = 1/√hidden`).
    pub fn tensor_uniform<const D: usize>(
        &self,
        name: &str,
        shape: [usize; D],
        bound: f64,
        device: &Device,
    ) -> Tensor<D> {
        self.tensor_init(name, shape, Init::Uniform(bound), device)
    }

    /// A PyTorch `nn.Linear` stored as `{prefix}.weight` `[out, in]` and `{prefix}.bias` `[out]`.
    pub fn linear(&self, prefix: &str, d_in: usize, d_out: usize, device: &Device) -> Linear {
        self.linear_named(&format!("{prefix}.weight"), Some(&format!("{prefix}.bias")), d_in, d_out, device)
    }

    /// A linear map from explicitly named tensors: `weight` `[out, in]` and, when given, `bias`
    /// `[out]` (`nn.MultiheadAttention`'s `in_proj_weight`/`in_proj_bias`, `Linear(bias=False)`).
    pub fn linear_named(&self, weight: &str, bias: Option<&str>, d_in: usize, d_out: usize, device: &Device) -> Linear {
        let bound = Init::Uniform((d_in as f64).sqrt().recip());
        self.linear_with(weight, bias, [d_in, d_out], [bound, bound], device)
    }

    /// A linear map `{prefix}.weight`, `{prefix}.bias` drawn as `init` says (when random; a
    /// checkpoint's values otherwise).
    pub fn linear_init(&self, prefix: &str, d_in: usize, d_out: usize, init: LinearInit, device: &Device) -> Linear {
        let default = Init::Uniform((d_in as f64).sqrt().recip());
        let inits = match init {
            LinearInit::PyTorch => [default, default],
            LinearInit::Normal(std) => [Init::Normal(std), default],
            LinearInit::XavierUniform => [Init::Uniform((6.0 / (d_in + d_out) as f64).sqrt()), Init::Const(0.0)],
        };
        let (weight, bias) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        self.linear_with(&weight, Some(&bias), [d_in, d_out], inits, device)
    }

    fn linear_with(
        &self,
        weight: &str,
        bias: Option<&str>,
        [d_in, d_out]: [usize; 2],
        [weight_init, bias_init]: [Init; 2],
        device: &Device,
    ) -> Linear {
        // PyTorch's `[out, in]` values transposed on the host into a contiguous `[in, out]`
        // weight, whether drawn or loaded: a fresh model, a loaded checkpoint and a trained
        // model (whose optimiser steps write contiguous weights) take the same product path, and
        // the product reads its right-hand matrix by rows (a transposed view made the ViT's
        // `3072 → 768` products ~15% slower).
        if self.random.is_some() {
            self.used.borrow_mut().insert(weight.to_owned());
        }
        let w = match self.values_init(weight, [d_out, d_in], weight_init) {
            Some(v) => Tensor::from_data(TensorData::new(transposed(&v, d_out, d_in), [d_in, d_out]), device),
            None => placeholder([d_in, d_out]),
        };
        let b = bias.map(|b| self.param_init(b, [d_out], bias_init, device));
        Linear { weight: Param::from_tensor(w), bias: b }
    }

    /// A PyTorch `nn.LayerNorm` stored as `{prefix}.weight` and `{prefix}.bias`.
    pub fn layer_norm(&self, prefix: &str, d: usize, eps: f64, device: &Device) -> LayerNorm {
        let mut ln = LayerNormConfig::new(d).with_epsilon(eps).init(device);
        ln.gamma = self.param_init(&format!("{prefix}.weight"), [d], Init::Const(1.0), device);
        ln.beta = Some(self.param_init(&format!("{prefix}.bias"), [d], Init::Const(0.0), device));
        ln
    }

    /// A PyTorch `nn.Conv2d` without bias, `{prefix}.weight` `[out, in, k, k]`.
    pub fn conv2d(&self, prefix: &str, spec: ConvSpec, device: &Device) -> Conv2d {
        self.conv2d_inner(prefix, spec, false, device)
    }

    /// A PyTorch `nn.Conv2d` with bias, `{prefix}.weight` `[out, in, k, k]` and `{prefix}.bias`.
    pub fn conv2d_with_bias(&self, prefix: &str, spec: ConvSpec, device: &Device) -> Conv2d {
        self.conv2d_inner(prefix, spec, true, device)
    }

    fn conv2d_inner(&self, prefix: &str, spec: ConvSpec, bias: bool, device: &Device) -> Conv2d {
        self.conv2d_grouped(prefix, spec, 1, bias, device)
    }

    /// A PyTorch `nn.Conv2d` of `groups` groups (`groups = d_in = d_out`: a depthwise
    /// convolution), weight `[out, in / groups, k, k]`, with `{prefix}.bias` when `bias`.
    pub fn conv2d_grouped(&self, prefix: &str, spec: ConvSpec, groups: usize, bias: bool, device: &Device) -> Conv2d {
        let ConvSpec { d_in, d_out, kernel, stride, padding } = spec;
        let mut conv = Conv2dConfig::new([d_in, d_out], [kernel, kernel])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(padding, padding, padding, padding))
            .with_groups(groups)
            .with_bias(bias)
            .init(device);
        let per_group = d_in / groups;
        let bound = Init::Uniform(((per_group * kernel * kernel) as f64).sqrt().recip());
        conv.weight = self.param_init(&format!("{prefix}.weight"), [d_out, per_group, kernel, kernel], bound, device);
        if bias {
            conv.bias = Some(self.param_init(&format!("{prefix}.bias"), [d_out], bound, device));
        }
        conv
    }

    /// A PyTorch `nn.BatchNorm1d`/`nn.BatchNorm2d` (eval mode: running statistics),
    /// `{prefix}.weight`, `.bias`, `.running_mean`, `.running_var` (`num_batches_tracked` is an
    /// integer buffer, skipped).
    pub fn batch_norm(&self, prefix: &str, channels: usize, eps: f64, device: &Device) -> BatchNorm {
        let mut bn = BatchNormConfig::new(channels).with_epsilon(eps).init(device);
        let (one, zero) = (Init::Const(1.0), Init::Const(0.0));
        bn.gamma = self.param_init(&format!("{prefix}.weight"), [channels], one, device);
        bn.beta = self.param_init(&format!("{prefix}.bias"), [channels], zero, device);
        bn.running_mean =
            RunningState::new(self.tensor_init(&format!("{prefix}.running_mean"), [channels], zero, device));
        bn.running_var = RunningState::new(self.tensor_init(&format!("{prefix}.running_var"), [channels], one, device));
        bn
    }

    /// The tensors under `prefix` (`module.encoder_q.` in a MoCo checkpoint, `online_backbone.`
    /// in some BYOL conversions), named without it; the others are left out, not reported as
    /// unused. A `module.` the reader removed from every name (see [`torch_checkpoint`]) need
    /// not be repeated: `module.encoder_q.` also finds `encoder_q.` there (and `module.` all of
    /// it); in a checkpoint that had no `module.`, `module.` is a prefix like any other.
    pub fn under_prefix(mut self, prefix: &str) -> Result<Weights> {
        let take = |names: Vec<&String>| -> Option<String> {
            let alt = prefix.strip_prefix("module.").filter(|_| self.stripped_module);
            [Some(prefix), alt]
                .into_iter()
                .flatten()
                .find(|p| names.iter().any(|n| n.starts_with(p)))
                .map(str::to_owned)
        };
        let Some(found) = take(self.tensors.keys().chain(self.other_dtypes.keys()).collect()) else {
            // The names' first parts (one or two, never the tensor's own name), to choose a
            // prefix from.
            let mut heads: Vec<String> = self
                .tensors
                .keys()
                .filter_map(|n| {
                    let parts: Vec<&str> = n.split('.').collect();
                    let depth = 2.min(parts.len() - 1);
                    (depth > 0).then(|| parts[..depth].join(".") + ".")
                })
                .collect();
            heads.dedup();
            heads.truncate(12);
            return Err(Error::Model {
                message: format!("checkpoint `{}` has no tensor under `{prefix}`", self.source),
                hint: Some(format!("its names start with: {}", heads.join(", "))),
            });
        };
        fn strip<V>(m: BTreeMap<String, V>, prefix: &str) -> BTreeMap<String, V> {
            m.into_iter().filter_map(|(n, v)| n.strip_prefix(prefix).map(|s| (s.to_owned(), v))).collect()
        }
        self.tensors = strip(std::mem::take(&mut self.tensors), &found);
        self.other_dtypes = strip(std::mem::take(&mut self.other_dtypes), &found);
        self.source = format!("{} (under `{found}`)", self.source);
        Ok(self)
    }

    /// A model built by `build` from the checkpoint `path` (safetensors or PyTorch; with
    /// `prefix`, the tensors under it: [`Weights::under_prefix`]), checked by
    /// [`Weights::finish`] with the names `ignored` gives for it.
    pub fn load_model<M>(
        path: &Path,
        prefix: Option<&str>,
        build: impl FnOnce(&Weights) -> M,
        ignored: impl FnOnce(&M) -> &'static [&'static str],
    ) -> Result<M> {
        let mut w = Weights::from_checkpoint(path)?;
        if let Some(prefix) = prefix {
            w = w.under_prefix(prefix)?;
        }
        let model = build(&w);
        w.finish(ignored(&model))?;
        Ok(model)
    }

    /// Refuses the checkpoint if a tensor was missing or mis-shaped, or if a tensor was not
    /// used, unless its name starts with one of `ignored` (parts of the checkpoint this model
    /// deliberately leaves out, such as BERT's pooler).
    pub fn finish(self, ignored: &[&str]) -> Result<()> {
        let used = self.used.into_inner();
        let unexpected: Vec<String> = self
            .tensors
            .keys()
            .filter(|k| !used.contains(*k) && !ignored.iter().any(|p| k.starts_with(p)))
            .cloned()
            .collect();
        let missing = self.missing.into_inner();
        // The model under a prefix of the checkpoint (an SSL training checkpoint's encoder): an
        // unused tensor named as a missing one, with something before it.
        let under: Vec<String> = match missing.shown.first().and_then(|m| m.split(' ').next()) {
            Some(name) => unexpected
                .iter()
                .filter(|k| k.ends_with(&format!(".{name}")))
                .map(|k| k[..k.len() - name.len()].to_owned())
                .collect(),
            None => Vec::new(),
        };
        let mut unexpected_problems = Problems::default();
        for k in unexpected {
            unexpected_problems.push(|| k);
        }
        let unexpected = unexpected_problems;
        let misshaped = self.misshaped.into_inner();
        let wrong_dtype = self.wrong_dtype.into_inner();
        if missing.count + misshaped.count + unexpected.count + wrong_dtype.count == 0 {
            return Ok(());
        }
        let mut message = format!("checkpoint `{}` does not fit the model", self.source);
        let not_float = "not of a float type curate reads (F64, F32, F16, BF16)";
        for (title, list) in
            [("missing", &missing), ("mis-shaped", &misshaped), (not_float, &wrong_dtype), ("unexpected", &unexpected)]
        {
            if list.count > 0 {
                message.push_str(&format!("\n  {} {title}:", list.count));
                for item in &list.shown {
                    message.push_str(&format!("\n    {item}"));
                }
                if list.count > list.shown.len() {
                    message.push_str(&format!("\n    ... and {} more", list.count - list.shown.len()));
                }
            }
        }
        let mut hint = Vec::new();
        let prefix_hint = match &under[..] {
            [] => None,
            [p] => {
                Some(format!("the checkpoint holds the model under `{p}`: read it with `checkpoint_prefix = \"{p}\"`"))
            }
            more => Some(format!(
                "the checkpoint holds the model under {}: read one with `checkpoint_prefix` (MoCo's query encoder is \
                 `encoder_q.`)",
                more.iter().map(|p| format!("`{p}`")).collect::<Vec<_>>().join(", ")
            )),
        };
        if let Some(h) = &prefix_hint {
            hint.push(h.as_str());
        }
        if wrong_dtype.count > 0 {
            hint.push("save the weights as floats (`model.float()` before saving, or a dequantised checkpoint)");
        }
        if missing.count + misshaped.count + unexpected.count > 0 {
            hint.push(
                "check that the model's settings (`arch`, or config.json's sizes) describe this checkpoint and that the \
                 file is complete",
            );
        }
        Err(Error::Model { message, hint: Some(hint.join("; ")) })
    }
}

/// The `cols × rows` transpose of the row-major `rows × cols` matrix `v`, 16 rows at a time: a
/// column's 16 values are one cache line of the transpose, written whole (a value at a time, ViT-B's
/// `3072 × 768` weights went at ~1 GB/s; this way ~1.8, 2026-11-28).
fn transposed(v: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const ROWS: usize = 16;
    let mut t = vec![0f32; v.len()];
    for r0 in (0..rows).step_by(ROWS) {
        let n = ROWS.min(rows - r0);
        let band = &v[r0 * cols..(r0 + n) * cols];
        for c in 0..cols {
            let line = &mut t[c * rows + r0..c * rows + r0 + n];
            for (i, x) in line.iter_mut().enumerate() {
                *x = band[i * cols + c];
            }
        }
    }
    t
}

/// Zeros of `shape` that stand in for a tensor the checkpoint cannot give: one element broadcast
/// (`expand`), on the CPU backend whatever the model's device, where a broadcast is a stride-0
/// view rather than a copy (the ndarray backend, and a GPU, would allocate the whole shape).
fn placeholder<const D: usize>(shape: [usize; D]) -> Tensor<D> {
    // burn cannot broadcast to a size of 0 (`hidden_size = 0` in config.json); such a shape
    // holds nothing to allocate.
    if shape.contains(&0) {
        return Tensor::<D>::zeros(shape, &Device::flex());
    }
    Tensor::<D>::zeros([1; D], &Device::flex()).expand(shape)
}

/// `n` values for the tensor `name` of a random source: a SplitMix64 stream keyed by
/// `(seed, name)` (uniform: 24-bit mantissas; normal: Box–Muller).
fn random_values(seed: u64, name: &str, n: usize, init: Init) -> Vec<f32> {
    let init = match init {
        Init::ByName if name.ends_with("bias") => Init::Const(0.0),
        // BERT's `initializer_range`.
        Init::ByName => Init::Normal(0.02),
        other => other,
    };
    let mut rng = crate::rng::RowRng::new(seed, "init", name);
    let mut unit = move || ((rng.next_u64() >> 40) as f64 + 0.5) / (1u64 << 24) as f64;
    match init {
        Init::Const(v) => vec![v; n],
        Init::Uniform(bound) => (0..n).map(|_| ((2.0 * unit() - 1.0) * bound) as f32).collect(),
        Init::Normal(std) => (0..n)
            .map(|_| {
                let (u1, u2) = (unit(), unit());
                ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos() * std) as f32
            })
            .collect(),
        Init::ByName => unreachable!("resolved above"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_the_reader_removed_module_from_still_finds_its_tensors() {
        // A `torch.save` checkpoint of a DataParallel MoCo reads as `encoder_q.*` (`module.`
        // removed from every name); the prefix as its script names it still finds them.
        let parts = || {
            Weights::from_parts(vec![
                ("encoder_q.a".into(), vec![1], vec![1.0]),
                ("encoder_k.a".into(), vec![1], vec![2.0]),
                ("bias".into(), vec![1], vec![3.0]),
            ])
        };
        let stripped = || Weights { stripped_module: true, ..parts() };
        let w = stripped().under_prefix("module.encoder_q.").unwrap();
        assert_eq!(w.tensors.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(w.tensors["a"].data, [1.0]);
        assert!(w.source.ends_with("(under `encoder_q.`)"), "{}", w.source);
        assert_eq!(stripped().under_prefix("module.").unwrap().tensors.len(), 3);
        // In a checkpoint that never had `module.`, it is a prefix like any other: absent. The
        // hint names the names' first parts, not whole tensor names.
        for prefix in ["module.", "module.encoder_q."] {
            let e = parts().under_prefix(prefix).err().unwrap().to_string();
            assert!(e.contains(&format!("has no tensor under `{prefix}`")), "{e}");
            assert!(e.contains("its names start with: encoder_k., encoder_q.") && !e.contains("bias"), "{e}");
        }
    }

    #[test]
    fn pytorch_checkpoints_load_as_safetensors_do() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/models");
        let pt = Weights::from_checkpoint(&dir.join("torch/tiny_unicom.pt")).unwrap();
        let st = Weights::from_checkpoint(&dir.join("tiny_unicom.safetensors")).unwrap();
        assert!(!pt.tensors.is_empty());
        assert_eq!(pt.tensors.len(), st.tensors.len());
        for (name, t) in &st.tensors {
            let p = &pt.tensors[name];
            assert_eq!((&p.shape, &p.data), (&t.shape, &t.data), "{name}");
        }
        // Every type: float ones as f32, others aside with their type.
        let w = Weights::from_checkpoint(&dir.join("torch/special.pt")).unwrap();
        assert_eq!(w.tensors["f16_transposed"].data, [0.0, 0.75, 0.25, 1.0, 0.5, 1.25]);
        assert_eq!(w.tensors["f16_transposed"].shape, [3, 2]);
        assert_eq!(w.tensors["f64"].data, [0.1f64 as f32, -1e-3f64 as f32]);
        assert_eq!(w.other_dtypes["num_batches_tracked"], ("I64".to_string(), vec![]));
        assert_eq!(w.other_dtypes["mask"], ("BOOL".to_string(), vec![3]));
        // A type curate does not read is set aside with its name, as integer buffers are.
        let w = Weights::from_checkpoint(&dir.join("torch/odd_types.pt")).unwrap();
        assert_eq!(w.tensors["w"].shape, [2, 2]);
        assert_eq!(w.other_dtypes["u16"], ("uint16".to_string(), vec![3]));
        assert!(w.other_dtypes["expanded"].0.contains("expanded"), "{:?}", w.other_dtypes["expanded"]);
        // The source names the entry a training checkpoint's tensors came from.
        let w = Weights::from_checkpoint(&dir.join("torch/train_checkpoint.pth.tar")).unwrap();
        assert!(w.source.ends_with("(its `state_dict`, `module.` removed)"), "{}", w.source);
        assert!(w.contains("0.weight") && w.contains("1.num_batches_tracked"));
        // Neither kind: named as such.
        let junk = tempfile::tempdir().unwrap();
        let path = junk.path().join("x.pt");
        std::fs::write(&path, b"not a checkpoint at all").unwrap();
        let e = Weights::from_checkpoint(&path).err().unwrap().to_string();
        assert!(e.contains("neither a safetensors file nor a PyTorch checkpoint"), "{e}");
        // Common mistakes are named.
        std::fs::write(&path, b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n").unwrap();
        let e = Weights::from_checkpoint(&path).err().unwrap().to_string();
        assert!(e.contains("is a Git LFS pointer"), "{e}");
        std::fs::write(&path, b"\n<!DOCTYPE html><html><body>Not found</body></html>").unwrap();
        let e = Weights::from_checkpoint(&path).err().unwrap().to_string();
        assert!(e.contains("is an HTML page"), "{e}");
        std::fs::write(junk.path().join("pytorch_model.bin.index.json"), b"{}").unwrap();
        let e = Weights::from_checkpoint(&junk.path().join("model.safetensors")).err().unwrap().to_string();
        assert!(e.contains("sharded checkpoint (`pytorch_model.bin.index.json`)"), "{e}");
    }

    #[test]
    fn linear_weights_are_held_contiguous_in_burns_layout() {
        // PyTorch's `[out, in]` → burn's `[in, out]`, copied into row-major order (not a
        // transposed view), loaded or drawn, so the product reads the weight by rows.
        let d = Device::flex();
        let strides = |t: Tensor<2>| t.try_into_primitive::<burn::backend::Flex>().unwrap().layout().strides().to_vec();
        let w = Weights::from_parts(vec![
            ("fc.weight".into(), vec![3, 2], vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]),
            ("fc.bias".into(), vec![3], vec![0.5, 0.25, 0.125]),
        ]);
        let lin = w.linear("fc", 2, 3, &d);
        assert_eq!(lin.weight.val().dims(), [2, 3]);
        assert_eq!(lin.weight.val().into_data().try_to_vec::<f32>().unwrap(), [0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
        assert_eq!(strides(lin.weight.val()), [3, 1]);
        assert!(w.finish(&[]).is_ok());
        let drawn = Weights::random(3).linear("fc", 5, 4, &d);
        assert_eq!(strides(drawn.weight.val()), [4, 1]);
        // A weight the checkpoint lacks is reported, with PyTorch's shape.
        let missing = Weights::from_parts(vec![]);
        let _ = missing.linear_named("g.weight", None, 2, 3, &d);
        let e = missing.finish(&[]).err().unwrap().to_string();
        assert!(e.contains("g.weight [3, 2]"), "{e}");
    }

    #[test]
    fn transposed_swaps_rows_and_columns() {
        // Shapes within one band of 16 rows, across several, and with a partial last band.
        for (rows, cols) in [(3, 4), (1, 70), (70, 1), (33, 65), (64, 32), (16, 16), (17, 3)] {
            let v: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = transposed(&v, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(t[c * rows + r], v[r * cols + c], "{rows}×{cols} at ({r}, {c})");
                }
            }
            assert_eq!(transposed(&t, cols, rows), v);
        }
    }

    #[test]
    fn random_source_is_seeded_by_name_and_follows_pytorch_defaults() {
        let d = Device::flex();
        let w = Weights::random(7);
        let lin = w.linear("fc", 16, 4, &d);
        let bound = 0.25f32; // 1/sqrt(16)
        let v = lin.weight.val().into_data().try_to_vec::<f32>().unwrap();
        assert!(v.iter().all(|x| x.abs() <= bound) && v.iter().any(|x| x.abs() > bound / 2.0));
        let ln = w.layer_norm("ln", 4, 1e-5, &d);
        assert_eq!(ln.gamma.val().into_data().try_to_vec::<f32>().unwrap(), vec![1.0; 4]);
        let emb = w.tensor("emb.weight", [200, 10], &d).into_data().try_to_vec::<f32>().unwrap();
        let sd = (emb.iter().map(|x| x * x).sum::<f32>() / emb.len() as f32).sqrt();
        assert!((sd - 0.02).abs() < 0.002, "{sd}");
        // Same seed and name → same values, whatever else was drawn before.
        let again = Weights::random(7).tensor("emb.weight", [200, 10], &d).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(emb, again);
        let other = Weights::random(8).tensor("emb.weight", [200, 10], &d).into_data().try_to_vec::<f32>().unwrap();
        assert_ne!(emb, other);
        assert!(w.finish(&[]).is_ok());
    }

    #[test]
    fn f64_tensors_are_read_and_other_types_reported_by_name_and_type() {
        use safetensors::tensor::{Dtype, TensorView};
        // A double-precision weight (torch.save of a `.double()` model) is read as f32, not
        // reported missing; an integer tensor the model asks for is named with its type, and
        // an integer buffer nobody asks for (BERT's `position_ids`) is passed over.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("model.safetensors");
        let f64s: Vec<u8> = [0.5f64, -1.25, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let i64s: Vec<u8> = [0i64, 1, 2].iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = vec![
            ("double.weight", TensorView::new(Dtype::F64, vec![3], &f64s).unwrap()),
            ("int.weight", TensorView::new(Dtype::I64, vec![3], &i64s).unwrap()),
            ("position_ids", TensorView::new(Dtype::I64, vec![1, 3], &i64s).unwrap()),
        ];
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let d = Device::flex();

        let w = Weights::from_safetensors(&path).unwrap();
        let t = w.tensor("double.weight", [3], &d).into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(t, [0.5, -1.25, 3.0]);
        assert!(w.contains("int.weight"));
        assert!(w.finish(&[]).is_ok(), "the unasked integer tensors are buffers");

        let w = Weights::from_safetensors(&path).unwrap();
        w.tensor("double.weight", [3], &d);
        w.tensor("int.weight", [3], &d);
        let e = w.finish(&[]).unwrap_err().to_string();
        assert!(
            e.contains("1 not of a float type curate reads (F64, F32, F16, BF16):\n    int.weight: I64 [3]"),
            "{e}"
        );
        assert!(!e.contains("missing"), "{e}");
        assert!(e.contains("hint: save the weights as floats"), "{e}");

        // A finite double past float32's range is refused by name, not loaded as inf.
        let big: Vec<u8> = [0.5f64, 1e300].iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = vec![("big.weight", TensorView::new(Dtype::F64, vec![2], &big).unwrap())];
        safetensors::serialize_to_file(views, None, &path).unwrap();
        let e = Weights::from_safetensors(&path).err().expect("refused").to_string();
        assert!(e.contains("F64 tensor `big.weight` holds 1e300, past what float32 holds"), "{e}");
    }
}
