//! Checkpoint tensors by name, read from a safetensors file (Hugging Face, torchvision and CLIP
//! checkpoints all ship them), handed to model constructors one at a time. Every tensor that is
//! missing, mis-shaped or left unused is recorded, and [`Weights::finish`] refuses the
//! checkpoint with the complete list — a model never runs on half-loaded weights.
//!
//! PyTorch stores a `Linear` weight as `[out, in]`; burn's is `[in, out]`: [`Weights::linear`]
//! transposes on load.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use burn::module::Param;
use burn::module::RunningState;
use burn::nn::conv::{Conv2d, Conv2dConfig};
use burn::nn::{BatchNorm, BatchNormConfig, LayerNorm, LayerNormConfig, Linear, PaddingConfig2d};
use burn::tensor::{Device, Tensor, TensorData};

use crate::error::{Error, Result};

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
    used: RefCell<BTreeSet<String>>,
    missing: RefCell<Vec<String>>,
    misshaped: RefCell<Vec<String>>,
}

impl Weights {
    /// Reads every floating-point tensor of a safetensors file (F32, F16, BF16 → f32). Integer
    /// tensors are buffers such as BERT's `position_ids`, never weights: they are skipped.
    pub fn from_safetensors(path: &Path) -> Result<Weights> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("cannot read checkpoint", path, e))?;
        let st = safetensors::SafeTensors::deserialize(&bytes).map_err(|e| Error::Model {
            message: format!("`{}` is not a safetensors file: {e}", path.display()),
            hint: Some("curate loads `model.safetensors` checkpoints".into()),
        })?;
        let mut tensors = BTreeMap::new();
        for (name, view) in st.tensors() {
            let raw = view.data();
            let data: Vec<f32> = match view.dtype() {
                safetensors::Dtype::F32 => {
                    raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
                }
                safetensors::Dtype::F16 => {
                    raw.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
                }
                safetensors::Dtype::BF16 => {
                    raw.chunks_exact(2).map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32()).collect()
                }
                _ => continue,
            };
            tensors.insert(name, Stored { shape: view.shape().to_vec(), data });
        }
        Ok(Weights::new(path.display().to_string(), tensors))
    }

    fn new(source: String, tensors: BTreeMap<String, Stored>) -> Weights {
        Weights {
            source,
            tensors,
            used: Default::default(),
            missing: Default::default(),
            misshaped: Default::default(),
        }
    }

    /// From in-memory `(name, shape, values)` triples (tests).
    pub fn from_parts(parts: Vec<(String, Vec<usize>, Vec<f32>)>) -> Weights {
        let tensors = parts.into_iter().map(|(n, shape, data)| (n, Stored { shape, data })).collect();
        Weights::new("memory".into(), tensors)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name`, which must have `shape`. A missing or mis-shaped tensor is recorded and
    /// zeros stand in, so that loading goes on and every problem is reported at once.
    pub fn tensor<const D: usize>(&self, name: &str, shape: [usize; D], device: &Device) -> Tensor<D> {
        self.used.borrow_mut().insert(name.to_owned());
        match self.tensors.get(name) {
            Some(t) if t.shape == shape => Tensor::from_data(TensorData::new(t.data.clone(), shape), device),
            Some(t) => {
                self.misshaped.borrow_mut().push(format!("{name}: {:?}, expected {shape:?}", t.shape));
                Tensor::zeros(shape, device)
            }
            None => {
                self.missing.borrow_mut().push(format!("{name} {shape:?}"));
                Tensor::zeros(shape, device)
            }
        }
    }

    pub fn param<const D: usize>(&self, name: &str, shape: [usize; D], device: &Device) -> Param<Tensor<D>> {
        Param::from_tensor(self.tensor(name, shape, device))
    }

    /// A PyTorch `nn.Linear` stored as `{prefix}.weight` `[out, in]` and `{prefix}.bias` `[out]`.
    pub fn linear(&self, prefix: &str, d_in: usize, d_out: usize, device: &Device) -> Linear {
        self.linear_named(&format!("{prefix}.weight"), Some(&format!("{prefix}.bias")), d_in, d_out, device)
    }

    /// A linear map from explicitly named tensors: `weight` `[out, in]` and, when given, `bias`
    /// `[out]` (`nn.MultiheadAttention`'s `in_proj_weight`/`in_proj_bias`, `Linear(bias=False)`).
    pub fn linear_named(&self, weight: &str, bias: Option<&str>, d_in: usize, d_out: usize, device: &Device) -> Linear {
        let w = self.tensor(weight, [d_out, d_in], device).transpose();
        let b = bias.map(|b| self.param(b, [d_out], device));
        Linear { weight: Param::from_tensor(w), bias: b }
    }

    /// A PyTorch `nn.LayerNorm` stored as `{prefix}.weight` and `{prefix}.bias`.
    pub fn layer_norm(&self, prefix: &str, d: usize, eps: f64, device: &Device) -> LayerNorm {
        let mut ln = LayerNormConfig::new(d).with_epsilon(eps).init(device);
        ln.gamma = self.param(&format!("{prefix}.weight"), [d], device);
        ln.beta = Some(self.param(&format!("{prefix}.bias"), [d], device));
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
        let ConvSpec { d_in, d_out, kernel, stride, padding } = spec;
        let mut conv = Conv2dConfig::new([d_in, d_out], [kernel, kernel])
            .with_stride([stride, stride])
            .with_padding(PaddingConfig2d::Explicit(padding, padding, padding, padding))
            .with_bias(bias)
            .init(device);
        conv.weight = self.param(&format!("{prefix}.weight"), [d_out, d_in, kernel, kernel], device);
        if bias {
            conv.bias = Some(self.param(&format!("{prefix}.bias"), [d_out], device));
        }
        conv
    }

    /// A PyTorch `nn.BatchNorm1d`/`nn.BatchNorm2d` (eval mode: running statistics),
    /// `{prefix}.weight`, `.bias`, `.running_mean`, `.running_var` (`num_batches_tracked` is an
    /// integer buffer, skipped).
    pub fn batch_norm(&self, prefix: &str, channels: usize, eps: f64, device: &Device) -> BatchNorm {
        let mut bn = BatchNormConfig::new(channels).with_epsilon(eps).init(device);
        bn.gamma = self.param(&format!("{prefix}.weight"), [channels], device);
        bn.beta = self.param(&format!("{prefix}.bias"), [channels], device);
        bn.running_mean = RunningState::new(self.tensor(&format!("{prefix}.running_mean"), [channels], device));
        bn.running_var = RunningState::new(self.tensor(&format!("{prefix}.running_var"), [channels], device));
        bn
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
        let misshaped = self.misshaped.into_inner();
        if missing.is_empty() && misshaped.is_empty() && unexpected.is_empty() {
            return Ok(());
        }
        let mut message = format!("checkpoint `{}` does not fit the model", self.source);
        for (title, list) in [("missing", &missing), ("mis-shaped", &misshaped), ("unexpected", &unexpected)] {
            if !list.is_empty() {
                message.push_str(&format!("\n  {} {title}:", list.len()));
                for item in list.iter().take(20) {
                    message.push_str(&format!("\n    {item}"));
                }
                if list.len() > 20 {
                    message.push_str(&format!("\n    ... and {} more", list.len() - 20));
                }
            }
        }
        Err(Error::Model {
            message,
            hint: Some(
                "check that config.json describes this checkpoint (architecture, sizes) and that the file is complete"
                    .into(),
            ),
        })
    }
}
