//! An image encoder: an architecture name (`resnet18`, `resnet34`, `resnet50`, `resnet101`,
//! `wide_resnet50_2`, `tiny_resnet`, `fbnetv3_a`, `fbnetv3_c`, `tiny_fbnet`, `vit_b32_clip`,
//! `vit_b32_unicom`), a checkpoint
//! (safetensors or PyTorch) and its preprocessing preset, giving one feature vector per image. Used by the `encode_image` stage (frozen ResNet-50
//! features, spec `bow-and-otter.md` §4; the Unicom image teacher, `cusa-and-pcmepp.md` §1.1).
//!
//! Adding an architecture is one [`ImageArch`] variant and one line in [`ImageArch::spec`]
//! (plus, for a new model family, a [`Family`] and a [`Net`] variant).

use std::path::Path;

use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

use super::fbnet::{FbNet, FbNetConfig};
use super::preprocess::{Preprocess, PreprocessPreset};
use super::resnet::{ResNet, ResNetConfig};
use super::vit::{Vit, VitConfig};
use crate::error::{Error, Result};

/// Image encoder architectures (the `arch` key of `encode_image`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ImageArch {
    /// torchvision ResNet-18 (512-d pooled features).
    Resnet18,
    /// torchvision ResNet-34 (512-d; OTTER's RN34).
    Resnet34,
    /// torchvision ResNet-50 (2048-d).
    Resnet50,
    /// torchvision ResNet-101 (2048-d).
    Resnet101,
    /// torchvision Wide ResNet-50-2 (2048-d; OTTER's WRN50-2).
    #[serde(rename = "wide_resnet50_2")]
    WideResnet50_2,
    /// The tiny ResNet of the test fixtures (one block per stage, width 8: 256-d).
    TinyResnet,
    /// mobile-vision's FBNetV3-A (1984-d; OTTER's FBNetV3-A).
    #[serde(rename = "fbnetv3_a")]
    FbnetV3A,
    /// mobile-vision's FBNetV3-C (1984-d; OTTER's FBNetV3-C).
    #[serde(rename = "fbnetv3_c")]
    FbnetV3C,
    /// The tiny FBNetV3 of the test fixtures (64-d).
    TinyFbnet,
    /// OpenAI CLIP ViT-B/32 image tower (512-d; a whole CLIP state dict is accepted).
    VitB32Clip,
    /// Unicom ViT-B/32, CUSA's image teacher (512-d).
    VitB32Unicom,
}

/// A model family with its size configuration.
#[derive(Debug, Clone)]
pub enum Family {
    ResNet(ResNetConfig),
    FbNet(FbNetConfig),
    Vit(VitConfig),
}

impl ImageArch {
    /// Family, size and default preprocessing of each architecture.
    pub fn spec(self) -> (Family, PreprocessPreset) {
        match self {
            ImageArch::Resnet18 => (Family::ResNet(ResNetConfig::resnet18()), PreprocessPreset::Imagenet),
            ImageArch::Resnet34 => (Family::ResNet(ResNetConfig::resnet34()), PreprocessPreset::Imagenet),
            ImageArch::Resnet50 => (Family::ResNet(ResNetConfig::resnet50()), PreprocessPreset::Imagenet),
            ImageArch::WideResnet50_2 => (Family::ResNet(ResNetConfig::wide_resnet50_2()), PreprocessPreset::Imagenet),
            ImageArch::Resnet101 => (Family::ResNet(ResNetConfig::resnet101()), PreprocessPreset::Imagenet),
            ImageArch::TinyResnet => (Family::ResNet(ResNetConfig::tiny()), PreprocessPreset::Imagenet),
            ImageArch::FbnetV3A => (Family::FbNet(FbNetConfig::fbnetv3_a()), PreprocessPreset::Imagenet),
            ImageArch::FbnetV3C => (Family::FbNet(FbNetConfig::fbnetv3_c()), PreprocessPreset::Imagenet),
            ImageArch::TinyFbnet => (Family::FbNet(FbNetConfig::tiny()), PreprocessPreset::Imagenet),
            ImageArch::VitB32Clip => (Family::Vit(VitConfig::vit_b32_clip()), PreprocessPreset::Clip),
            ImageArch::VitB32Unicom => (Family::Vit(VitConfig::vit_b32_unicom()), PreprocessPreset::Clip),
        }
    }

    pub fn name(self) -> String {
        serde_json::to_value(self).ok().and_then(|v| v.as_str().map(str::to_owned)).unwrap_or_default()
    }
}

/// The loaded network.
pub enum Net {
    ResNet(Box<ResNet>),
    FbNet(Box<FbNet>),
    Vit(Box<Vit>),
}

impl Net {
    /// Loads a checkpoint of `family`; refuses one whose tensors do not fit.
    pub fn load(family: &Family, path: &Path, prefix: Option<&str>, device: &Device) -> Result<Net> {
        Ok(match family {
            Family::ResNet(c) => Net::ResNet(Box::new(ResNet::load_under(path, prefix, c, device)?)),
            Family::FbNet(c) => Net::FbNet(Box::new(FbNet::load_under(path, prefix, c, device)?)),
            Family::Vit(c) => Net::Vit(Box::new(Vit::load_under(path, prefix, c, device)?)),
        })
    }

    pub fn feature_dim(&self) -> usize {
        match self {
            Net::ResNet(m) => m.feature_dim(),
            Net::FbNet(m) => m.feature_dim(),
            Net::Vit(m) => m.output_dim(),
        }
    }

    /// # Shapes
    /// - `images`: `[batch, 3, side, side]` (normalised)
    /// - output: `[batch, feature_dim]`
    pub fn forward(&self, images: Tensor<4>) -> Tensor<2> {
        match self {
            Net::ResNet(m) => m.forward(images),
            Net::FbNet(m) => m.forward(images),
            Net::Vit(m) => m.forward(images),
        }
    }
}

pub struct ImageEncoder {
    net: Net,
    pub arch: ImageArch,
    pub preprocess: Preprocess,
    device: Device,
    /// Width of the features.
    pub dim: usize,
}

impl ImageEncoder {
    /// Loads `arch` from a checkpoint (safetensors or PyTorch), preprocessing with `preset`
    /// (default: the architecture's own).
    pub fn load(path: &Path, arch: ImageArch, preset: Option<PreprocessPreset>, device: &Device) -> Result<Self> {
        Self::load_under(path, None, arch, preset, device)
    }

    /// [`ImageEncoder::load`] of the checkpoint's tensors under `prefix`
    /// ([`super::weights::Weights::under_prefix`]: an SSL checkpoint's encoder).
    pub fn load_under(
        path: &Path,
        prefix: Option<&str>,
        arch: ImageArch,
        preset: Option<PreprocessPreset>,
        device: &Device,
    ) -> Result<Self> {
        let (family, default_preset) = arch.spec();
        let preprocess = preset.unwrap_or(default_preset).build();
        // A ViT's learned position table fixes its input size; a ResNet or FBNet pools any size.
        if let Family::Vit(c) = &family {
            if c.image_size != preprocess.crop_px {
                return Err(Error::Model {
                    message: format!(
                        "`{}` takes {1}x{1} images, the preprocessing crops {2}x{2}",
                        arch.name(),
                        c.image_size,
                        preprocess.crop_px
                    ),
                    hint: Some("use the architecture's own `preprocess` (leave the key out)".into()),
                });
            }
        }
        let net = Net::load(&family, path, prefix, device)?;
        let dim = net.feature_dim();
        Ok(ImageEncoder { net, arch, preprocess, device: device.clone(), dim })
    }

    /// Features of preprocessed images, `[n, dim]` row-major.
    ///
    /// # Shapes
    /// - `pixels`: `n` images of `[3, crop_px, crop_px]`, concatenated
    /// - output: `[n, dim]` flattened
    pub fn encode(&self, pixels: Vec<f32>) -> Result<Vec<f32>> {
        let side = self.preprocess.crop_px;
        let per = self.preprocess.len();
        if pixels.is_empty() {
            return Ok(Vec::new());
        }
        if !pixels.len().is_multiple_of(per) {
            return Err(Error::data(format!("{} values are not whole {side}x{side} images", pixels.len())));
        }
        let n = pixels.len() / per;
        let x = Tensor::<4>::from_data(TensorData::new(pixels, [n, 3, side, side]), &self.device);
        self.net
            .forward(x)
            .into_data()
            .try_to_vec::<f32>()
            .map_err(|e| Error::Model { message: format!("reading image features: {e:?}"), hint: None })
    }
}
