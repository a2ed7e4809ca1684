//! The CLIP-style dual encoder that `curate train` optimises (spec `bow-and-otter.md` §4, §5.8):
//! a ResNet image tower (global-average-pooled; or OTTER's FBNetV3-A/C, 1984-d) with a new
//! linear projection to `embed_dim` (the paper: ResNet-50, 2048 → 768), and a BERT-family text tower with mean pooling over the
//! attention mask and an optional projection (none in the paper: DistilBERT is 768-d). Loss
//! specific heads sit beside the projections: CUSA's uni-modal heads (`cusa-and-pcmepp.md`
//! §2.1) and PCME++'s log-variance heads (§3.1; one linear layer on μ's tokens, or, with
//! `[model.clip]` and `model.log_variance_block`, on a new block's, as the reference's). With
//! `model.gpo`, the embeddings and log-variances are projected from
//! every token (grid cell, text token) and pooled by GPO ([`crate::models::gpo`]), as PCME++'s
//! heads; otherwise the pooled features are projected.
//!
//! With `[model.clip]` the towers are CLIP's instead (the CUSA and PCME++ students, spec
//! `cusa-and-pcmepp.md` §2.1, §3.1): the ViT, whose pooled feature is `encode_image` (class
//! token → `ln_post` → `proj`) and whose GPO tokens are the last block's states (no `ln_post`,
//! no projection), and the text transformer, pooled at its end-of-text token
//! (`encode_text`), its GPO tokens the states after `ln_final`. The heads sit on them as on the
//! ResNet and BERT towers.
//!
//! Towers come from published checkpoints ([`Weights::from_checkpoint`]) or from
//! [`Weights::random`] (training from scratch); the new heads are always random, seeded.
//! Exactly one tower of each kind is there: `image`, `image_fbnet` or `image_vit`, `text` or
//! `text_clip`
//! (optional fields leave the checkpoint paths of the ResNet + BERT runs as they were).

use burn::module::Module;
use burn::nn::{LayerNorm, Linear};
use burn::optim::GradientsParams;
use burn::tensor::{Device, Gradients, Int, Tensor};

use super::config::{HeadStyle, ImagePreset, ModelConfig};
use crate::error::Result;
use crate::models::bert::{Bert, BertConfig};
use crate::models::clip_text::ClipText;
use crate::models::fbnet::FbNet;
use crate::models::gpo::{Gpo, TokenDrop};
use crate::models::pooling::{pool, Pooling};
use crate::models::resnet::{ResNet, ResNetConfig};
use crate::models::vit::{FreshInit, Vit, VitBlock};
use crate::models::weights::{LinearInit, Weights};

/// Which extra heads the loss needs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Heads {
    /// CUSA: a second, uni-modal projection per modality.
    pub uni: bool,
    /// PCME++: a log-variance head per modality.
    pub log_variance: bool,
}

#[derive(Module, Debug)]
pub struct DualEncoder {
    /// The ResNet image tower (absent with `[model.clip]`).
    pub image: Option<ResNet>,
    /// CLIP's ViT (`[model.clip]`).
    pub image_vit: Option<Vit>,
    /// An FBNetV3 image tower (`model.image.preset = "fbnetv3_a"`, ...), in `image`'s place.
    pub image_fbnet: Option<FbNet>,
    pub image_proj: Linear,
    /// The BERT-family text tower (absent with `[model.clip]`).
    pub text: Option<Bert>,
    /// CLIP's text transformer (`[model.clip]`).
    pub text_clip: Option<ClipText>,
    pub text_proj: Option<Linear>,
    pub image_uni: Option<Linear>,
    pub text_uni: Option<Linear>,
    pub image_log_var: Option<Linear>,
    pub text_log_var: Option<Linear>,
    /// `model.gpo`: the GPOs of the embeddings and of PCME++'s log-variances.
    pub image_gpo: Option<Gpo>,
    pub text_gpo: Option<Gpo>,
    pub image_log_var_gpo: Option<Gpo>,
    pub text_log_var_gpo: Option<Gpo>,
    /// `model.log_variance_block` (CLIP towers): PCME++'s log-variance branches, a new block
    /// each in place of the tower's last, on the states before it.
    pub image_log_var_block: Option<VitBlock>,
    pub text_log_var_block: Option<VitBlock>,
    /// `model.head_style = "cusa"`: the LayerNorms before the cross-modal and uni-modal heads.
    pub image_proj_norm: Option<LayerNorm>,
    pub text_proj_norm: Option<LayerNorm>,
    pub image_uni_norm: Option<LayerNorm>,
    pub text_uni_norm: Option<LayerNorm>,
    #[module(skip)]
    pub pooling: Pooling,
}

/// A tower's output: its pooled features, and with GPO its tokens and their counts (and, with
/// PCME++'s log-variance blocks, the log-variance branch's tokens, counted alike).
struct TowerOut {
    pooled: Tensor<2>,
    tokens: Option<(Tensor<3>, Vec<usize>)>,
    log_var_tokens: Option<Tensor<3>>,
}

impl TowerOut {
    /// A log-variance head: on the log-variance branch's tokens where there are some, else as
    /// [`TowerOut::head`] without a norm.
    fn log_var_head(&self, linear: &Linear, gpo: Option<&Gpo>) -> Tensor<2> {
        match (gpo, &self.log_var_tokens, &self.tokens) {
            (Some(g), Some(v), Some((_, lengths))) => g.forward(linear.forward(v.clone()), lengths),
            _ => self.head(None, Some(linear), gpo),
        }
    }

    /// A head (`None`: the identity), after `norm` where there is one, on the pooled features,
    /// or on every token then pooled by `gpo`.
    fn head(&self, norm: Option<&LayerNorm>, linear: Option<&Linear>, gpo: Option<&Gpo>) -> Tensor<2> {
        fn apply<const D: usize>(x: Tensor<D>, norm: Option<&LayerNorm>, linear: Option<&Linear>) -> Tensor<D> {
            let x = match norm {
                Some(n) => n.forward(x),
                None => x,
            };
            match linear {
                Some(l) => l.forward(x),
                None => x,
            }
        }
        match (gpo, &self.tokens) {
            (Some(g), Some((t, lengths))) => g.forward(apply(t.clone(), norm, linear), lengths),
            _ => apply(self.pooled.clone(), norm, linear),
        }
    }
}

/// Embeddings of one batch (not normalised).
#[derive(Debug, Clone)]
pub struct Embeddings {
    /// `[B, embed_dim]`: the cross-modal embedding (μ for PCME++).
    pub image: Tensor<2>,
    pub text: Tensor<2>,
    /// CUSA's uni-modal embeddings, `[B, embed_dim]`.
    pub image_uni: Option<Tensor<2>>,
    pub text_uni: Option<Tensor<2>>,
    /// PCME++ log-variances, `[B, embed_dim]`.
    pub image_log_var: Option<Tensor<2>>,
    pub text_log_var: Option<Tensor<2>>,
}

/// One tower's half of [`Embeddings`].
#[derive(Clone)]
struct Side {
    main: Tensor<2>,
    uni: Option<Tensor<2>>,
    log_var: Option<Tensor<2>>,
}

impl Side {
    fn tensors(&self) -> impl Iterator<Item = &Tensor<2>> {
        std::iter::once(&self.main).chain(&self.uni).chain(&self.log_var)
    }

    fn map(self, f: impl Fn(Tensor<2>) -> Tensor<2>) -> Side {
        Side { main: f(self.main), uni: self.uni.map(&f), log_var: self.log_var.map(&f) }
    }
}

impl Embeddings {
    fn from_sides(image: Side, text: Side) -> Embeddings {
        Embeddings {
            image: image.main,
            text: text.main,
            image_uni: image.uni,
            text_uni: text.uni,
            image_log_var: image.log_var,
            text_log_var: text.log_var,
        }
    }

    fn into_sides(self) -> (Side, Side) {
        (
            Side { main: self.image, uni: self.image_uni, log_var: self.image_log_var },
            Side { main: self.text, uni: self.text_uni, log_var: self.text_log_var },
        )
    }

    /// Cuts the autodiff graph at the embeddings. The embeddings returned have the same values
    /// as new leaves (detached, requiring gradients), so that the loss's backward pass stops
    /// there; [`TowerCut::backward`] then carries their gradients through the two towers, side
    /// by side. Each tower's pass starts from `Σ sum(output ⊙ g)`, whose gradient at each
    /// output is its leaf's gradient `g` bit for bit, so the parameters get the gradients of
    /// one pass through everything.
    pub fn cut(self) -> (Embeddings, TowerCut) {
        let (image, text) = self.into_sides();
        let leaf = |t: Tensor<2>| t.detach().require_grad();
        let leaves = Embeddings::from_sides(image.clone().map(leaf), text.clone().map(leaf));
        (leaves.clone(), TowerCut { image, text, leaves })
    }
}

/// The towers' outputs behind the leaves of [`Embeddings::cut`].
pub struct TowerCut {
    image: Side,
    text: Side,
    leaves: Embeddings,
}

impl TowerCut {
    /// The towers' backward passes from the leaves' gradients in `grads` (the loss's backward
    /// pass), on two threads, their parameter gradients added to `into`. With `freeze_image`
    /// (PCME++'s first epochs) the image tower's own parameters get none; its heads do.
    pub fn backward(self, grads: &Gradients, freeze_image: bool, encoder: &DualEncoder, into: &mut GradientsParams) {
        let (image_leaves, text_leaves) = self.leaves.into_sides();
        // Each output with its leaf's gradient (none where the loss did not use it).
        let seeds = |outputs: &Side, leaves: &Side| -> Vec<(Tensor<2>, Tensor<2>)> {
            outputs
                .tensors()
                .zip(leaves.tensors())
                .filter_map(|(out, leaf)| leaf.grad(grads).map(|g| (out.clone(), Tensor::from_inner(g))))
                .collect()
        };
        let (image_seeds, text_seeds) = (seeds(&self.image, &image_leaves), seeds(&self.text, &text_leaves));
        let pass = |seeds: Vec<(Tensor<2>, Tensor<2>)>, freeze: bool| {
            let surrogate = seeds.into_iter().map(|(out, g)| (out * g).sum()).reduce(|a, b| a + b)?;
            let mut grads = surrogate.backward();
            if freeze {
                encoder.drop_image_tower_gradients(&mut grads);
            }
            Some(GradientsParams::from_grads(grads, encoder))
        };
        let (i, t) = rayon::join(|| pass(image_seeds, freeze_image), || pass(text_seeds, false));
        for g in [i, t].into_iter().flatten() {
            merge_gradients(into, g, encoder);
        }
    }
}

/// Moves `from`'s gradients of `module`'s parameters into `into`, added where both have one.
pub fn merge_gradients<M: Module>(into: &mut GradientsParams, from: GradientsParams, module: &M) {
    struct Merge<'a> {
        into: &'a mut GradientsParams,
        from: GradientsParams,
    }
    impl burn::module::ModuleVisitor for Merge<'_> {
        fn visit_float<const D: usize>(&mut self, param: &burn::module::Param<Tensor<D>>) {
            if let Some(g) = self.from.remove::<D>(param.id) {
                let g = match self.into.remove::<D>(param.id) {
                    Some(earlier) => earlier + g,
                    None => g,
                };
                self.into.register(param.id, g);
            }
        }
    }
    module.visit(&mut Merge { into, from });
}

/// The ResNet sizes of an image preset, with the config's overrides.
fn resnet_config(c: &super::config::ImageModelConfig) -> ResNetConfig {
    {
        let mut r = match c.preset {
            ImagePreset::Tiny => ResNetConfig::tiny(),
            ImagePreset::Resnet50 => ResNetConfig::resnet50(),
            ImagePreset::Resnet101 => ResNetConfig::resnet101(),
            ImagePreset::Resnet18 => ResNetConfig::resnet18(),
            ImagePreset::Resnet34 => ResNetConfig::resnet34(),
            ImagePreset::WideResnet50_2 => ResNetConfig::wide_resnet50_2(),
            ImagePreset::FbnetV3A | ImagePreset::FbnetV3C | ImagePreset::TinyFbnet => {
                unreachable!("FBNetV3 presets are built by `FbNet`")
            }
        };
        if let Some(l) = c.layers {
            r.layers = l;
        }
        if let Some(w) = c.width {
            r.width = w;
        }
        r
    }
}

/// A PCME++ log-variance head with its bias set to `model.log_variance_bias`.
fn log_var_bias(mut head: Linear, c: &ModelConfig, device: &Device) -> Linear {
    let bias = Tensor::<1>::full([c.embed_dim], c.log_variance_bias, device);
    head.bias = Some(burn::module::Param::from_tensor(bias));
    head
}

/// The towers of a config and their widths.
struct Towers {
    image: Option<ResNet>,
    image_vit: Option<Vit>,
    image_fbnet: Option<FbNet>,
    text: Option<Bert>,
    text_clip: Option<ClipText>,
    /// Pooled image features, and the image tokens GPO pools.
    image_dims: (usize, usize),
    /// Pooled text features, and the text tokens GPO pools.
    text_dims: (usize, usize),
    projection: Option<bool>,
    pooling: Pooling,
}

impl Towers {
    fn resnet_bert(
        c: &ModelConfig,
        text: &super::config::TextModelConfig,
        seed: u64,
        device: &Device,
    ) -> Result<Towers> {
        let prefix = c.image.checkpoint_prefix.as_deref();
        let (image, image_fbnet, fi) = match c.image.preset.fbnet() {
            Some(fc) => {
                let fbnet = match &c.image.checkpoint {
                    Some(path) => FbNet::load_under(path, prefix, &fc, device)?,
                    None => FbNet::from_weights(&fc, &Weights::random(seed), device),
                };
                (None, Some(fbnet), fc.feature_dim)
            }
            None => {
                let rc = resnet_config(&c.image);
                let resnet = match &c.image.checkpoint {
                    Some(path) => ResNet::load_under(path, prefix, &rc, device)?,
                    None => ResNet::from_weights(&rc, &Weights::random(seed), device),
                };
                (Some(resnet), None, rc.feature_dim())
            }
        };
        let bc = BertConfig::from_file(&text.dir.join("config.json"))?;
        let bert = if text.pretrained {
            Bert::load(&text.dir, device)?.0
        } else {
            Bert::from_weights(&bc, &Weights::random(seed), device)
        };
        let bert = match text.dropout {
            Some(p) => bert.with_dropout(p, p),
            None => bert,
        };
        let ft = bc.hidden_size;
        Ok(Towers {
            image,
            image_vit: None,
            image_fbnet,
            text: Some(bert),
            text_clip: None,
            image_dims: (fi, fi),
            text_dims: (ft, ft),
            projection: text.projection,
            pooling: text.pooling,
        })
    }

    fn clip(clip: &super::config::ClipModelConfig, seed: u64, device: &Device) -> Result<Towers> {
        let oc = clip.open_clip()?;
        let (vit, text) = if clip.pretrained {
            let w = Weights::from_checkpoint(&crate::models::weights::open_clip_weights_file(&clip.dir))?;
            let vit = Vit::from_weights(&oc.vision, &w, device);
            let text = ClipText::from_weights(&oc.text, &w, device);
            // Each tower takes its own tensors; the rest is CLIP's logit scale.
            w.finish(&["logit_scale"])?;
            (vit, text)
        } else {
            // Apart streams: the towers share tensor names (`transformer.resblocks.N.*`).
            let vit = Vit::from_weights(&oc.vision, &Weights::random(seed), device);
            (vit, ClipText::from_weights(&oc.text, &Weights::random(seed ^ 0x7465_7874), device))
        };
        Ok(Towers {
            image_dims: (vit.output_dim(), oc.vision.width),
            text_dims: (text.output_dim(), text.width()),
            image: None,
            image_vit: Some(vit),
            image_fbnet: None,
            text: None,
            text_clip: Some(text),
            // CLIP's embeddings are the towers' own; the heads project them as any tower's.
            projection: None,
            pooling: Pooling::Mean,
        })
    }
}

impl DualEncoder {
    /// Builds the towers (checkpoints or random from `seed`) and the new heads (random).
    pub fn init(c: &ModelConfig, heads: Heads, seed: u64, device: &Device) -> Result<DualEncoder> {
        let towers = match (&c.text, &c.clip) {
            (Some(text), _) => Towers::resnet_bert(c, text, seed, device)?,
            (None, Some(clip)) => Towers::clip(clip, seed, device)?,
            (None, None) => {
                return Err(crate::Error::Model {
                    message: "the model has no text tower".into(),
                    hint: Some("add `[model.text]` or `[model.clip]`".into()),
                })
            }
        };
        // The heads' inputs: with GPO the cross-modal and log-variance heads project tokens,
        // else the pooled features; CUSA's uni-modal heads always the pooled features.
        let pick = |(pooled, tokens): (usize, usize)| (if c.gpo { tokens } else { pooled }, pooled);
        let ((fi, fi_pooled), (ft, ft_pooled), d) = (pick(towers.image_dims), pick(towers.text_dims), c.embed_dim);
        let style = c.head_style;
        let project_text = towers.projection.unwrap_or(ft != d || style != HeadStyle::Linear);
        if !project_text && ft != d {
            return Err(crate::Error::Model {
                message: format!("the text tower is {ft}-d but `model.embed_dim` is {d}"),
                hint: Some("set `model.text.projection = true` or `model.embed_dim` to the text width".into()),
            });
        }
        // New heads: their own seeded stream, so they do not depend on the towers' source.
        let w = Weights::random(seed ^ 0x6865_6164);
        let (image_init, text_init) = match style {
            HeadStyle::Linear => (LinearInit::PyTorch, LinearInit::PyTorch),
            HeadStyle::Cusa => (LinearInit::Normal(0.02), LinearInit::Normal(0.02)),
            HeadStyle::Pcmepp => (LinearInit::XavierUniform, LinearInit::PyTorch),
        };
        let image_head = |name: &str| w.linear_init(name, fi, d, image_init, device);
        let text_head = |name: &str| w.linear_init(name, ft, d, text_init, device);
        let image_uni = |name: &str| w.linear_init(name, fi_pooled, d, image_init, device);
        let text_uni = |name: &str| w.linear_init(name, ft_pooled, d, text_init, device);
        // PyTorch's LayerNorm defaults (ε 1e-5), as the CUSA reference's.
        let norm = |name: &str, width: usize| {
            (style == HeadStyle::Cusa).then(|| w.layer_norm(&format!("{name}_norm"), width, 1e-5, device))
        };
        let log_var = heads.log_variance;
        // PCME++'s log-variance branches need CLIP's towers and GPO (checked with the config).
        let branches = c.log_variance_block && log_var && c.gpo;
        let image_log_var_block = towers.image_vit.as_ref().filter(|_| branches).map(|vit| {
            VitBlock::fresh(&w, "image_log_var_block.", vit.width(), vit.mlp_dim(), FreshInit::PyTorch, device)
        });
        let text_log_var_block = towers.text_clip.as_ref().filter(|_| branches).map(|clip| {
            let init = FreshInit::ClipText { layers: clip.layers() };
            VitBlock::fresh(&w, "text_log_var_block.", clip.width(), 4 * clip.width(), init, device)
        });
        Ok(DualEncoder {
            image: towers.image,
            image_vit: towers.image_vit,
            image_fbnet: towers.image_fbnet,
            image_proj: image_head("image_proj"),
            text: towers.text,
            text_clip: towers.text_clip,
            text_proj: project_text.then(|| text_head("text_proj")),
            image_uni: heads.uni.then(|| image_uni("image_uni")),
            text_uni: heads.uni.then(|| text_uni("text_uni")),
            image_log_var: log_var.then(|| log_var_bias(image_head("image_log_var"), c, device)),
            text_log_var: log_var.then(|| log_var_bias(text_head("text_log_var"), c, device)),
            image_gpo: c.gpo.then(|| Gpo::from_weights(&w, "image_gpo", device)),
            text_gpo: c.gpo.then(|| Gpo::from_weights(&w, "text_gpo", device)),
            image_log_var_gpo: (c.gpo && heads.log_variance)
                .then(|| Gpo::from_weights(&w, "image_log_var_gpo", device)),
            text_log_var_gpo: (c.gpo && heads.log_variance).then(|| Gpo::from_weights(&w, "text_log_var_gpo", device)),
            image_log_var_block,
            text_log_var_block,
            image_proj_norm: norm("image_proj", fi),
            text_proj_norm: if project_text { norm("text_proj", ft) } else { None },
            image_uni_norm: if heads.uni { norm("image_uni", fi_pooled) } else { None },
            text_uni_norm: if heads.uni { norm("text_uni", ft_pooled) } else { None },
            pooling: towers.pooling,
        })
    }

    /// Takes the image tower's own parameters' gradients out of `grads` (its heads' stay):
    /// PCME++'s frozen image tower.
    pub fn drop_image_tower_gradients(&self, grads: &mut Gradients) {
        let _ = GradientsParams::from_module(grads, &self.image);
        let _ = GradientsParams::from_module(grads, &self.image_vit);
        let _ = GradientsParams::from_module(grads, &self.image_fbnet);
    }

    /// The parameters of the image tower (not its heads).
    pub fn image_tower_ids(&self) -> Vec<burn::module::ParamId> {
        let mut ids = super::optim::param_ids(&self.image);
        ids.extend(super::optim::param_ids(&self.image_vit));
        ids.extend(super::optim::param_ids(&self.image_fbnet));
        ids
    }

    /// The text tower's dropout rates in training (hidden, attention); CLIP's has none.
    pub fn text_dropout(&self) -> (f64, f64) {
        self.text.as_ref().map_or((0.0, 0.0), Bert::dropout)
    }

    /// The learning-rate multiples of the towers' parameters (spec `cusa-and-pcmepp.md` §3.10):
    /// each tower at its `*_backbone_lr_scale`, and block `k` of a transformer tower of `L`
    /// blocks (the text tower, CLIP's ViT) at that times `layer_decay^(L − k)`; PCME++'s new
    /// log-variance blocks as their tower's last block. A ResNet has no blocks and gets its
    /// scale alone. The projections and heads are in no group (the whole rate). Later groups
    /// take precedence, so the blocks come after the tower.
    pub fn lr_groups(&self, c: &super::config::OptimConfig) -> Vec<(Vec<burn::module::ParamId>, f64)> {
        use super::optim::param_ids;
        let mut text = param_ids(&self.text);
        text.extend(param_ids(&self.text_clip));
        let mut groups = vec![(self.image_tower_ids(), c.image_backbone_lr_scale), (text, c.text_backbone_lr_scale)];
        let text_blocks: Vec<Vec<burn::module::ParamId>> = match (&self.text, &self.text_clip) {
            (Some(bert), _) => bert.layers().iter().map(param_ids).collect(),
            (None, Some(clip)) => clip.blocks().iter().map(param_ids).collect(),
            (None, None) => Vec::new(),
        };
        let image_blocks: Vec<Vec<burn::module::ParamId>> =
            self.image_vit.iter().flat_map(|vit| vit.blocks().iter().map(param_ids)).collect();
        for (blocks, scale, branch) in [
            (image_blocks, c.image_backbone_lr_scale, &self.image_log_var_block),
            (text_blocks, c.text_backbone_lr_scale, &self.text_log_var_block),
        ] {
            let n = blocks.len();
            for (k, block) in blocks.into_iter().enumerate() {
                groups.push((block, scale * c.layer_decay.powi((n - k) as i32)));
            }
            if let Some(b) = branch {
                groups.push((param_ids(b), scale * c.layer_decay));
            }
        }
        groups
    }

    /// Pooled image features before any head.
    ///
    /// # Shapes
    /// - `images`: `[B, 3, H, W]` → `[B, feature_dim]`
    pub fn image_features(&self, images: Tensor<4>) -> Tensor<2> {
        match (&self.image, &self.image_vit, &self.image_fbnet) {
            (Some(resnet), _, _) => resnet.forward(images),
            (None, Some(vit), _) => vit.forward(images),
            (None, None, Some(fbnet)) => fbnet.forward(images),
            (None, None, None) => unreachable!("a dual encoder has an image tower"),
        }
    }

    /// CUSA's uni-modal image embeddings (`forward`'s `image_uni`: the head on the pooled
    /// features), for the uni-modal evaluation (`cusa-and-pcmepp.md` §2.7); `None` without the
    /// head.
    ///
    /// # Shapes
    /// - `images`: `[B, 3, H, W]` → `[B, embed_dim]`
    pub fn encode_image_uni(&self, images: Tensor<4>) -> Option<Tensor<2>> {
        let head = self.image_uni.as_ref()?;
        let pooled = TowerOut { pooled: self.image_features(images), tokens: None, log_var_tokens: None };
        Some(pooled.head(self.image_uni_norm.as_ref(), Some(head), None))
    }

    /// CUSA's uni-modal text embeddings (`forward`'s `text_uni`), as [`Self::encode_image_uni`].
    ///
    /// # Shapes
    /// - `ids`, `mask`: `[B, S]` → `[B, embed_dim]`
    pub fn encode_text_uni(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Option<Tensor<2>> {
        let head = self.text_uni.as_ref()?;
        let pooled = TowerOut { pooled: self.text_features(ids, mask), tokens: None, log_var_tokens: None };
        Some(pooled.head(self.text_uni_norm.as_ref(), Some(head), None))
    }

    /// Pooled text features before any head.
    ///
    /// # Shapes
    /// - `ids`, `mask`: `[B, S]` → `[B, hidden]`
    pub fn text_features(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<2> {
        self.text_out_with(ids, mask, false).pooled
    }

    /// The image tower's output: with GPO, its grid cells as `[B, h·w, C]` tokens too (their
    /// mean is the pooled features).
    /// With `drop`, the grid cells each image keeps come first and GPO pools those alone (the
    /// pooled features, which CUSA's uni-modal heads see, keep every cell).
    fn image_out(&self, images: Tensor<4>, drop: Option<&TokenDrop>) -> TowerOut {
        if self.image_gpo.is_none() {
            return TowerOut { pooled: self.image_features(images), tokens: None, log_var_tokens: None };
        }
        let (tokens, pooled, log_var) = match (&self.image, &self.image_vit) {
            (Some(resnet), _) => {
                let grid = resnet.forward_grid(images);
                let [b, c, h, w] = grid.dims();
                let tokens = grid.reshape([b, c, h * w]).swap_dims(1, 2);
                let pooled = tokens.clone().mean_dim(1).reshape([b, c]);
                (tokens, pooled, None)
            }
            // The class token and the patches, before `ln_post` (PCME++'s GPO input); the
            // pooled feature is CLIP's embedding of the same states.
            (None, Some(vit)) => {
                let (tokens, before) = vit.forward_tokens_split(images);
                let log_var = self.image_log_var_block.as_ref().map(|block| vit.run_block(block, before));
                (tokens.clone(), vit.pool(tokens), log_var)
            }
            (None, None) => unreachable!("GPO on an FBNetV3 tower is a config error"),
        };
        let [b, n, _] = tokens.dims();
        // Both branches keep the same tokens (the drops are drawn per row, not per tensor).
        let log_var_tokens = log_var.map(|v| match drop {
            Some(d) => d.apply(v).0,
            None => v,
        });
        let tokens = match drop {
            Some(d) => d.apply(tokens),
            None => (tokens, vec![n; b]),
        };
        TowerOut { pooled, tokens: Some(tokens), log_var_tokens }
    }

    /// The text tower's output: with GPO, its token states too, with the count of each row's
    /// tokens (the mask's ones, which come first).
    fn text_out(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> TowerOut {
        self.text_out_with(ids, mask, self.text_gpo.is_some())
    }

    /// [`DualEncoder::text_out`], with the token states only when `tokens`.
    fn text_out_with(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>, tokens: bool) -> TowerOut {
        let lengths = |mask: Tensor<2, Int>| -> Vec<usize> {
            let n = mask.sum_dim(1).into_data().convert::<i64>().try_to_vec::<i64>().expect("token counts");
            n.into_iter().map(|n| (n as usize).max(1)).collect()
        };
        match (&self.text, &self.text_clip) {
            (Some(bert), _) => {
                let states = bert.forward(ids, mask.clone());
                let pooled = pool(states.clone(), mask.clone(), self.pooling);
                TowerOut { pooled, tokens: tokens.then(|| (states, lengths(mask))), log_var_tokens: None }
            }
            // Causal attention: padding needs no mask; each row ends at its end-of-text token.
            (None, Some(clip)) => {
                let n = lengths(mask);
                let (states, before) = clip.forward_tokens_split(ids);
                let pooled = clip.pool(states.clone(), &n);
                let log_var_tokens =
                    self.text_log_var_block.as_ref().filter(|_| tokens).map(|block| clip.run_block(block, before));
                TowerOut { pooled, tokens: tokens.then_some((states, n)), log_var_tokens }
            }
            (None, None) => unreachable!("a dual encoder has a text tower"),
        }
    }

    /// The cross-modal image embedding (what zero-shot and retrieval use).
    ///
    /// # Shapes
    /// - `images`: `[B, 3, H, W]` → `[B, embed_dim]`
    pub fn encode_image(&self, images: Tensor<4>) -> Tensor<2> {
        self.image_out(images, None).head(
            self.image_proj_norm.as_ref(),
            Some(&self.image_proj),
            self.image_gpo.as_ref(),
        )
    }

    /// The cross-modal image embedding and, with PCME++'s heads, its log-variance `v`.
    ///
    /// # Shapes
    /// - `images`: `[B, 3, H, W]` → (`[B, embed_dim]`, `[B, embed_dim]`)
    pub fn encode_image_with_log_var(&self, images: Tensor<4>) -> (Tensor<2>, Option<Tensor<2>>) {
        let o = self.image_out(images, None);
        let v = self.image_log_var.as_ref().map(|h| o.log_var_head(h, self.image_log_var_gpo.as_ref()));
        (o.head(self.image_proj_norm.as_ref(), Some(&self.image_proj), self.image_gpo.as_ref()), v)
    }

    /// The cross-modal text embedding and, with PCME++'s heads, its log-variance `v`.
    ///
    /// # Shapes
    /// - `ids`, `mask`: `[B, S]` → (`[B, embed_dim]`, `[B, embed_dim]`)
    pub fn encode_text_with_log_var(
        &self,
        ids: Tensor<2, Int>,
        mask: Tensor<2, Int>,
    ) -> (Tensor<2>, Option<Tensor<2>>) {
        let o = self.text_out(ids, mask);
        let v = self.text_log_var.as_ref().map(|h| o.log_var_head(h, self.text_log_var_gpo.as_ref()));
        (o.head(self.text_proj_norm.as_ref(), self.text_proj.as_ref(), self.text_gpo.as_ref()), v)
    }

    /// The cross-modal text embedding.
    ///
    /// # Shapes
    /// - `ids`, `mask`: `[B, S]` → `[B, embed_dim]`
    pub fn encode_text(&self, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Tensor<2> {
        self.text_out(ids, mask).head(self.text_proj_norm.as_ref(), self.text_proj.as_ref(), self.text_gpo.as_ref())
    }

    /// Everything the losses need from one batch.
    ///
    /// # Shapes
    /// - `images`: `[B, 3, H, W]`, `ids`, `mask`: `[B, S]` → [`Embeddings`] of `[B, embed_dim]`
    pub fn forward(&self, images: Tensor<4>, ids: Tensor<2, Int>, mask: Tensor<2, Int>) -> Embeddings {
        self.forward_dropping(images, ids, mask, None)
    }

    /// [`DualEncoder::forward`] with PCME++'s image token dropping (`model.image_token_drop`,
    /// with GPO; training only).
    pub fn forward_dropping(
        &self,
        images: Tensor<4>,
        ids: Tensor<2, Int>,
        mask: Tensor<2, Int>,
        drop: Option<&TokenDrop>,
    ) -> Embeddings {
        let device = images.device();
        // CUSA's uni-modal heads project the pooled features (no GPO).
        let uni = |n: &Option<LayerNorm>, h: &Option<Linear>, o: &TowerOut| {
            h.as_ref().map(|h| o.head(n.as_ref(), Some(h), None))
        };
        let image_side = || {
            let i = self.image_out(images, drop);
            Side {
                main: i.head(self.image_proj_norm.as_ref(), Some(&self.image_proj), self.image_gpo.as_ref()),
                uni: uni(&self.image_uni_norm, &self.image_uni, &i),
                log_var: self.image_log_var.as_ref().map(|h| i.log_var_head(h, self.image_log_var_gpo.as_ref())),
            }
        };
        let text_side = || {
            let t = self.text_out(ids, mask);
            Side {
                main: t.head(self.text_proj_norm.as_ref(), self.text_proj.as_ref(), self.text_gpo.as_ref()),
                uni: uni(&self.text_uni_norm, &self.text_uni, &t),
                log_var: self.text_log_var.as_ref().map(|h| t.log_var_head(h, self.text_log_var_gpo.as_ref())),
            }
        };
        // On the CPU the towers run side by side on the pool: a small model's step is mostly
        // per-operation overhead, which one operation's threads do not share out. Only the text
        // tower draws random numbers (dropout), so the draws keep their order; BatchNorm's
        // running statistics do not depend on the thread (`resnet::batch_norm`).
        let (i, t) = if crate::models::activation::is_host(&device) {
            rayon::join(image_side, text_side)
        } else {
            (image_side(), text_side())
        };
        Embeddings::from_sides(i, t)
    }
}
