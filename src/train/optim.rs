//! Optimisers and the learning-rate schedule (spec `bow-and-otter.md` §4, §5.8;
//! `cusa-and-pcmepp.md` §3.10): SGD with momentum (the papers: lr 3e-3, momentum 0.9, no weight
//! decay), AdamW, or AdamP (PCME++'s, [`super::adamp`]); linear warm-up then cosine decay to
//! `min_lr` (per step or per epoch), PCME++'s step decay, or a constant rate; PCME++'s frozen
//! image tower and loss warm-up ([`image_freeze`]); its per-tower rates and layer-wise decay
//! ([`LrGroups`]); gradient-norm clipping over all the gradients ([`clip_global`], PyTorch's
//! `clip_grad_norm_`) or per tensor. The trainer keeps two optimisers: one for the encoders
//! (with weight decay) and one for the loss's temperatures and scales (never decayed, as OTTER's
//! and PCME++'s references).

use burn::grad_clipping::GradientClippingConfig;
use burn::lr_scheduler::module_lr_scheduler::{ModuleLearningRate, ModuleLrScheduler};
use burn::module::{Module, ModuleVisitor, Param, ParamGroup, ParamId};
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig, GradientsParams, ModuleOptimizer, SgdConfig};
use burn::tensor::Tensor;

use super::adamp::AdamP;
use super::config::{ClipScope, OptimConfig, OptimizerKind, Schedule};

/// The learning rate of step `step` (0-based) of `total`, with `steps_per_epoch` steps an
/// epoch: linear warm-up over `warmup_steps` (step 0 gets `lr / warmup`), then the schedule
/// (see [`Schedule`]): cosine from `lr` towards `min_lr` at `t = (step − warmup) / (total −
/// warmup)`, PyTorch's `CosineAnnealingLR` with `T_max` the steps after warm-up (the last step is
/// one short of `min_lr`); one cosine value per epoch (`e = 0..E−1`, so the last epoch stays
/// above `min_lr`, as OTTER's per-epoch annealing); `lr` times `step_factor` per milestone epoch
/// reached; or `lr`.
pub fn learning_rate(c: &OptimConfig, step: u64, total: u64, steps_per_epoch: u64) -> f64 {
    if step < c.warmup_steps {
        return c.lr * (step + 1) as f64 / c.warmup_steps as f64;
    }
    let cosine = |t: f64| c.min_lr + 0.5 * (c.lr - c.min_lr) * (1.0 + (std::f64::consts::PI * t).cos());
    let per_epoch = steps_per_epoch.max(1);
    let epoch = step / per_epoch;
    match c.schedule {
        Schedule::Constant => c.lr,
        Schedule::Cosine => {
            let span = total.saturating_sub(c.warmup_steps).max(1) as f64;
            cosine(((step - c.warmup_steps) as f64 / span).min(1.0))
        }
        Schedule::CosinePerEpoch => {
            let epochs = total.div_ceil(per_epoch).max(1);
            cosine(epoch.min(epochs - 1) as f64 / epochs as f64)
        }
        Schedule::Step => {
            let reached = c.step_epochs.iter().filter(|&&e| epoch >= e).count();
            c.lr * c.step_factor.powi(reached as i32)
        }
    }
}

/// PCME++'s start (spec `cusa-and-pcmepp.md` §3.10, `optim.freeze_image_epochs = F`) at step
/// `step`: whether the image tower is frozen (epochs `0..F`), and the factor of the loss (in
/// epoch `F`, `(step_in_epoch + 1) / steps_per_epoch`; otherwise 1).
pub fn image_freeze(c: &OptimConfig, step: u64, steps_per_epoch: u64) -> (bool, f64) {
    let per_epoch = steps_per_epoch.max(1);
    let (epoch, in_epoch) = (step / per_epoch, step % per_epoch);
    let f = c.freeze_image_epochs;
    let scale = if f > 0 && epoch == f { (in_epoch + 1) as f64 / per_epoch as f64 } else { 1.0 };
    (epoch < f, scale)
}

/// An optimiser from the config; `weight_decay` is the config's for the encoders and 0 for the
/// loss parameters. `linear_weights` are the module's `Linear` weights ([`linear_weights`]),
/// which AdamP reads in PyTorch's row layout; `no_decay` the parameters that get the same
/// optimiser without weight decay (`optim.no_weight_decay_1d`: [`one_dimensional`]).
pub fn build(
    c: &OptimConfig,
    weight_decay: f64,
    linear_weights: Vec<ParamId>,
    no_decay: Vec<ParamId>,
) -> ModuleOptimizer {
    let mut o = build_all(c, weight_decay, linear_weights);
    if !no_decay.is_empty() && weight_decay > 0.0 {
        let clip = clip_config(c).map(|c| c.init());
        let group = ParamGroup::from_ids(no_decay);
        o = match c.optimizer {
            OptimizerKind::Sgd => o.with_group(group, sgd(c, 0.0).build(), clip),
            OptimizerKind::Adamw => o.with_group(group, adamw(c, 0.0).build(), clip),
            OptimizerKind::Adamp => o.with_group(group, adamp(c, 0.0), clip),
        };
    }
    o
}

fn clip_config(c: &OptimConfig) -> Option<GradientClippingConfig> {
    match c.grad_clip_scope {
        ClipScope::Tensor => c.grad_clip_norm.map(|n| GradientClippingConfig::Norm(n as f32)),
        // Applied by the trainer over every gradient at once: `clip_global`.
        ClipScope::Global => None,
    }
}

fn sgd(c: &OptimConfig, weight_decay: f64) -> SgdConfig {
    SgdConfig::new()
        // PyTorch's SGD: no dampening.
        .with_momentum((c.momentum > 0.0).then(|| MomentumConfig::new().with_momentum(c.momentum).with_dampening(0.0)))
        .with_weight_decay((weight_decay > 0.0).then(|| WeightDecayConfig::new(weight_decay as f32)))
        .with_gradient_clipping(clip_config(c))
}

fn adamw(c: &OptimConfig, weight_decay: f64) -> AdamWConfig {
    AdamWConfig::new()
        .with_beta_1(c.betas[0] as f32)
        .with_beta_2(c.betas[1] as f32)
        .with_epsilon(1e-8)
        .with_weight_decay(weight_decay as f32)
        .with_grad_clipping(clip_config(c))
}

fn adamp(c: &OptimConfig, weight_decay: f64) -> AdamP {
    AdamP {
        beta_1: c.betas[0],
        beta_2: c.betas[1],
        epsilon: 1e-8,
        weight_decay,
        delta: c.adamp_delta,
        wd_ratio: c.adamp_wd_ratio,
        linear_layout: false,
    }
}

/// The ids of `module`'s parameters of one dimension (biases, norms' weights).
pub fn one_dimensional<M: Module>(module: &M) -> Vec<ParamId> {
    struct Ids(Vec<ParamId>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            if D == 1 {
                self.0.push(param.id);
            }
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}

fn build_all(c: &OptimConfig, weight_decay: f64, linear_weights: Vec<ParamId>) -> ModuleOptimizer {
    let clip = clip_config(c);
    match c.optimizer {
        OptimizerKind::Sgd => sgd(c, weight_decay).init(),
        OptimizerKind::Adamw => adamw(c, weight_decay).init(),
        OptimizerKind::Adamp => {
            let adamp = adamp(c, weight_decay);
            let clip = clip.map(|c| c.init());
            let mut o = ModuleOptimizer::from(adamp);
            if let Some(clip) = &clip {
                o = o.with_grad_clipping(clip.clone());
            }
            if !linear_weights.is_empty() {
                let linear = AdamP { linear_layout: true, ..adamp };
                o = o.with_group(ParamGroup::from_ids(linear_weights), linear, clip);
            }
            o
        }
    }
}

/// Every parameter id of `module`.
pub fn param_ids<M: Module>(module: &M) -> Vec<ParamId> {
    struct Ids(Vec<ParamId>);
    impl ModuleVisitor for Ids {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0.push(param.id);
        }
    }
    let mut ids = Ids(Vec::new());
    module.visit(&mut ids);
    ids.0
}

/// The ids of the weights of `module`'s burn `Linear` layers (stored `[in, out]`, where PyTorch
/// stores `[out, in]`).
pub fn linear_weights<M: Module>(module: &M) -> Vec<ParamId> {
    #[derive(Default)]
    struct Linears {
        inside: Vec<bool>,
        ids: Vec<ParamId>,
    }
    impl ModuleVisitor for Linears {
        fn enter_module(&mut self, _name: &str, container_type: &str) {
            self.inside.push(container_type == "Struct:Linear");
        }
        fn exit_module(&mut self, _name: &str, _container_type: &str) {
            self.inside.pop();
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            // A Linear's 2-D parameter is its weight (its bias is 1-D).
            if D == 2 && self.inside.last() == Some(&true) {
                self.ids.push(param.id);
            }
        }
    }
    let mut l = Linears::default();
    module.visit(&mut l);
    l.ids
}

/// Parameter groups whose learning rate is a multiple of the schedule's: PCME++'s per-tower
/// rates and layer-wise decay (spec `cusa-and-pcmepp.md` §3.10). Parameters in no group get the
/// schedule's rate; a parameter in several gets the last group's multiple.
#[derive(Clone, Default)]
pub struct LrGroups(Vec<(ParamGroup, f64)>);

impl LrGroups {
    /// Groups of `(parameter ids, multiple)`, later ones taking precedence; none at all when
    /// every multiple is 1.
    pub fn new(groups: Vec<(Vec<ParamId>, f64)>) -> LrGroups {
        if groups.iter().all(|(_, m)| *m == 1.0) {
            return LrGroups::default();
        }
        LrGroups(
            groups
                .into_iter()
                .filter(|(ids, _)| !ids.is_empty())
                .map(|(ids, m)| (ParamGroup::from_ids(ids), m))
                .collect(),
        )
    }

    /// The rate of each parameter when the schedule's is `lr`.
    pub fn policy(&self, lr: f64) -> ModuleLearningRate {
        if self.0.is_empty() {
            return lr.into();
        }
        let mut s = ModuleLrScheduler::new(lr);
        for (group, m) in &self.0 {
            s = s.with_group(group.clone(), lr * m);
        }
        s.step()
    }
}

/// PyTorch's `clip_grad_norm_(parameters, max_norm)` over the gradients of `parts` (each a set
/// of gradients with the module they belong to): with `n` the L2 norm of all of them together,
/// each is multiplied by `min(1, max_norm / (n + 1e-6))`. Runs on the device (no read-back).
pub fn clip_global(max_norm: f64, parts: &mut [(&mut GradientsParams, &dyn ClipTarget)]) {
    let mut total: Option<Tensor<1>> = None;
    for (grads, module) in parts.iter() {
        if let Some(s) = module.square_sum(grads) {
            total = Some(match total {
                Some(t) => t + s,
                None => s,
            });
        }
    }
    let Some(total) = total else { return };
    let coef = total.sqrt().add_scalar(1e-6).recip().mul_scalar(max_norm).clamp_max(1.0);
    for (grads, module) in parts.iter_mut() {
        module.scale(grads, coef.clone());
    }
}

/// A module whose gradients [`clip_global`] can measure and scale.
pub trait ClipTarget {
    /// The sum of the squares of this module's gradients in `grads`, if it has any.
    fn square_sum(&self, grads: &GradientsParams) -> Option<Tensor<1>>;
    /// Multiplies this module's gradients in `grads` by `coef` (`[1]`).
    fn scale(&self, grads: &mut GradientsParams, coef: Tensor<1>);
}

impl<M: Module> ClipTarget for M {
    fn square_sum(&self, grads: &GradientsParams) -> Option<Tensor<1>> {
        struct Sum<'a> {
            grads: &'a GradientsParams,
            total: Option<Tensor<1>>,
        }
        impl ModuleVisitor for Sum<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if let Some(g) = self.grads.get::<D>(param.id) {
                    let s = g.square().sum();
                    self.total = Some(match self.total.take() {
                        Some(t) => t + s,
                        None => s,
                    });
                }
            }
        }
        let mut sum = Sum { grads, total: None };
        self.visit(&mut sum);
        sum.total
    }

    fn scale(&self, grads: &mut GradientsParams, coef: Tensor<1>) {
        struct Scale<'a> {
            grads: &'a mut GradientsParams,
            coef: Tensor<1>,
        }
        impl ModuleVisitor for Scale<'_> {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                if let Some(g) = self.grads.remove::<D>(param.id) {
                    let coef = self.coef.clone().reshape([1; D]);
                    self.grads.register::<D>(param.id, g * coef);
                }
            }
        }
        self.visit(&mut Scale { grads, coef });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{Device, TensorData};

    /// With `no_weight_decay_1d`, a bias keeps its value under a zero gradient where the weight
    /// decays; without, both decay (SGD's L2 and AdamW's decoupled decay both halve a weight at
    /// rate 1 and decay 0.5; AdamP's 1-D parameters decay in full).
    #[test]
    fn one_dimensional_parameters_can_be_kept_from_weight_decay() {
        use burn::nn::LinearConfig;
        let d = Device::default().autodiff();
        for kind in [OptimizerKind::Sgd, OptimizerKind::Adamw, OptimizerKind::Adamp] {
            for excluded in [false, true] {
                let c = OptimConfig { optimizer: kind, weight_decay: 0.5, momentum: 0.0, ..Default::default() };
                let mut fc = LinearConfig::new(3, 2).init(&d);
                fc.bias = Some(Param::from_tensor(Tensor::ones([2], &d)));
                let w0 = fc.weight.val().into_data().try_to_vec::<f32>().unwrap();
                let no_decay = if excluded { one_dimensional(&fc) } else { Vec::new() };
                assert_eq!(one_dimensional(&fc).len(), 1, "{kind:?}: the bias alone is 1-D");
                let mut o = build(&c, c.weight_decay, linear_weights(&fc), no_decay);
                // Zero gradients, through a backward pass.
                let loss = fc.forward(Tensor::<2>::ones([1, 3], &d)).mul_scalar(0.0).sum();
                let grads = GradientsParams::from_grads(loss.backward(), &fc);
                let fc = o.step(1.0, fc, grads);
                let b = fc.bias.unwrap().val().into_data().try_to_vec::<f32>().unwrap();
                assert_eq!(b, if excluded { vec![1.0, 1.0] } else { vec![0.5, 0.5] }, "{kind:?} excluded {excluded}");
                if kind != OptimizerKind::Adamp {
                    let w = fc.weight.val().into_data().try_to_vec::<f32>().unwrap();
                    assert!(w.iter().zip(&w0).all(|(a, b)| (a - 0.5 * b).abs() < 1e-7), "{kind:?}: the weight halves");
                }
            }
        }
    }

    #[derive(Module, Debug)]
    struct Two {
        a: Param<Tensor<2>>,
        b: Param<Tensor<1>>,
    }

    #[derive(Module, Debug)]
    struct One {
        c: Param<Tensor<4>>,
    }

    /// PyTorch's `clip_grad_norm_(max_norm = 2)` on three gradients of total norm ~5, split over
    /// two modules as the trainer's encoder and loss parameters are
    /// (`tests/fixtures/optim/make_adamp_fixture.py`).
    #[test]
    fn global_clipping_matches_pytorch_over_two_modules() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/optim/adamp_reference.json");
        let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let clip = &f["clip"];
        let floats = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        };
        let d = Device::default();
        let two =
            Two { a: Param::from_tensor(Tensor::zeros([6, 5], &d)), b: Param::from_tensor(Tensor::zeros([6], &d)) };
        let one = One { c: Param::from_tensor(Tensor::zeros([4, 3, 2, 2], &d)) };
        let (mut g2, mut g1) = (GradientsParams::new(), GradientsParams::new());
        let g = |k: usize| floats(&clip["grads"][k]);
        g2.register(two.a.id, Tensor::<2>::from_data(TensorData::new(g(0), [6, 5]), &d));
        g2.register(two.b.id, Tensor::<1>::from_data(TensorData::new(g(1), [6]), &d));
        g1.register(one.c.id, Tensor::<4>::from_data(TensorData::new(g(2), [4, 3, 2, 2]), &d));
        let before = (two.square_sum(&g2).unwrap() + one.square_sum(&g1).unwrap()).into_scalar::<f32>().sqrt();
        assert!((before as f64 - clip["total_norm"].as_f64().unwrap()).abs() < 1e-5, "{before}");
        clip_global(clip["max_norm"].as_f64().unwrap(), &mut [(&mut g2, &two), (&mut g1, &one)]);
        let got = [
            g2.get::<2>(two.a.id).unwrap().into_data().try_to_vec::<f32>().unwrap(),
            g2.get::<1>(two.b.id).unwrap().into_data().try_to_vec::<f32>().unwrap(),
            g1.get::<4>(one.c.id).unwrap().into_data().try_to_vec::<f32>().unwrap(),
        ];
        for (k, got) in got.iter().enumerate() {
            for (a, b) in got.iter().zip(floats(&clip["clipped"][k])) {
                assert!((a - b).abs() <= 1e-6, "grad {k}: {a} against PyTorch's {b}");
            }
        }
        // Below the bound, nothing changes.
        let kept = got[1].clone();
        clip_global(100.0, &mut [(&mut g2, &two), (&mut g1, &one)]);
        assert_eq!(g2.get::<1>(two.b.id).unwrap().into_data().try_to_vec::<f32>().unwrap(), kept);
    }

    /// `optim.optimizer = "sgd" | "adamw"` against PyTorch's `SGD` (momentum without dampening,
    /// L2 weight decay) and `AdamW` (decoupled decay, eps 1e-8) over 6 steps with a changing
    /// rate (`tests/fixtures/optim/make_sgd_adamw_fixture.py`).
    #[test]
    fn sgd_and_adamw_match_pytorch() {
        let p = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/optim/sgd_adamw_reference.json");
        let f: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
        let floats = |v: &serde_json::Value| -> Vec<f32> {
            v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect()
        };
        let d = Device::default().autodiff();
        let cases = f["cases"].as_object().unwrap();
        assert_eq!(cases.len(), 4);
        for (name, case) in cases {
            let kind = match case["optimizer"].as_str().unwrap() {
                "sgd" => OptimizerKind::Sgd,
                _ => OptimizerKind::Adamw,
            };
            let betas = case.get("betas").map_or([0.9, 0.999], |b| [b[0].as_f64().unwrap(), b[1].as_f64().unwrap()]);
            let c = OptimConfig {
                optimizer: kind,
                momentum: case.get("momentum").map_or(0.0, |m| m.as_f64().unwrap()),
                weight_decay: case["weight_decay"].as_f64().unwrap(),
                betas,
                ..Default::default()
            };
            let mut two = Two {
                a: Param::from_tensor(Tensor::from_data(TensorData::new(floats(&f["init"]["w"]), [3, 4]), &d)),
                b: Param::from_tensor(Tensor::from_data(TensorData::new(floats(&f["init"]["b"]), [5]), &d)),
            };
            let mut o = build(&c, c.weight_decay, Vec::new(), Vec::new());
            for (step, lr) in f["lrs"].as_array().unwrap().iter().enumerate() {
                let g = &f["grads"][step];
                // Gradients through a backward pass: d(sum(a ⊙ G_a) + sum(b ⊙ G_b)) = (G_a, G_b).
                let ga = Tensor::<2>::from_data(TensorData::new(floats(&g["w"]), [3, 4]), &d);
                let gb = Tensor::<1>::from_data(TensorData::new(floats(&g["b"]), [5]), &d);
                let loss = (two.a.val() * ga).sum() + (two.b.val() * gb).sum();
                let grads = GradientsParams::from_grads(loss.backward(), &two);
                two = o.step(lr.as_f64().unwrap(), two, grads);
                let want = &case["after"][step];
                for (got, want, what) in [
                    (two.a.val().into_data().try_to_vec::<f32>().unwrap(), floats(&want["w"]), "w"),
                    (two.b.val().into_data().try_to_vec::<f32>().unwrap(), floats(&want["b"]), "b"),
                ] {
                    for (x, y) in got.iter().zip(&want) {
                        assert!((x - y).abs() <= 2e-6 * (1.0 + y.abs()), "{name} step {step} {what}: {x} against {y}");
                    }
                }
            }
        }
    }

    #[test]
    fn lr_groups_give_each_parameter_its_multiple_and_later_groups_win() {
        let d = Device::default();
        let two =
            Two { a: Param::from_tensor(Tensor::zeros([2, 2], &d)), b: Param::from_tensor(Tensor::zeros([2], &d)) };
        let one = One { c: Param::from_tensor(Tensor::zeros([1, 1, 1, 1], &d)) };
        // `a` is in both groups: the later one's multiple.
        let groups = LrGroups::new(vec![(param_ids(&two), 0.1), (vec![two.a.id], 0.5)]);
        let p = groups.policy(2.0);
        assert_eq!(p.lr_from_param(two.a.id, None), 1.0);
        assert_eq!(p.lr_from_param(two.b.id, None), 0.2);
        assert_eq!(p.lr_from_param(one.c.id, None), 2.0, "in no group: the schedule's rate");
        // A later group whose multiple is 1 still overrides an earlier one.
        let p = LrGroups::new(vec![(param_ids(&two), 0.1), (vec![two.a.id], 1.0)]).policy(2.0);
        assert_eq!(p.lr_from_param(two.a.id, None), 2.0);
        // All ones: no groups.
        assert!(LrGroups::new(vec![(param_ids(&two), 1.0)]).0.is_empty());
    }

    #[test]
    fn linear_weights_are_the_2d_parameters_of_linear_layers() {
        use burn::nn::LinearConfig;
        #[derive(Module, Debug)]
        struct Net {
            fc: burn::nn::Linear,
            table: Param<Tensor<2>>,
        }
        let d = Device::default();
        let net = Net { fc: LinearConfig::new(3, 4).init(&d), table: Param::from_tensor(Tensor::zeros([5, 3], &d)) };
        assert_eq!(linear_weights(&net), vec![net.fc.weight.id]);
        assert_eq!(param_ids(&net).len(), 3);
    }

    #[test]
    fn warmup_then_cosine() {
        let c = OptimConfig { lr: 1.0, warmup_steps: 4, min_lr: 0.0, ..Default::default() };
        let lr: Vec<f64> = (0..14).map(|s| learning_rate(&c, s, 14, 7)).collect();
        assert_eq!(&lr[..4], &[0.25, 0.5, 0.75, 1.0]);
        assert!((lr[4] - 1.0).abs() < 1e-12);
        // Halfway through the 10 decay steps: cos(π/2) → 0.5.
        assert!((lr[9] - 0.5).abs() < 1e-12);
        assert!(lr.windows(2).skip(4).all(|w| w[1] <= w[0]));
        let c = OptimConfig { schedule: Schedule::Constant, ..c };
        assert_eq!(learning_rate(&c, 10, 14, 7), 1.0);
    }

    #[test]
    fn per_epoch_cosine_is_constant_within_an_epoch_and_steps_multiply_at_milestones() {
        // OTTER: lr_e = ½ lr (1 + cos(π e / E)), e = 0..E−1; 4 epochs of 3 steps.
        let c = OptimConfig { lr: 2.0, schedule: Schedule::CosinePerEpoch, ..Default::default() };
        let lr: Vec<f64> = (0..12).map(|s| learning_rate(&c, s, 12, 3)).collect();
        let want = |e: f64| 0.5 * 2.0 * (1.0 + (std::f64::consts::PI * e / 4.0).cos());
        for (s, v) in lr.iter().enumerate() {
            assert!((v - want((s / 3) as f64)).abs() < 1e-12, "step {s}: {v}");
        }
        assert_eq!(lr[0], 2.0);
        assert!(lr[11] > 0.0, "the last epoch stays above min_lr (e = E − 1)");
        // PCME++: constant, then x0.1 from epoch 15 (0-based) of 25.
        let c = OptimConfig { lr: 5e-4, schedule: Schedule::Step, ..Default::default() };
        assert_eq!((c.step_epochs.clone(), c.step_factor), (vec![15], 0.1));
        let at = |epoch: u64| learning_rate(&c, epoch * 10 + 3, 250, 10);
        assert_eq!((at(0), at(14)), (5e-4, 5e-4));
        assert!((at(15) - 5e-5).abs() < 1e-18 && (at(24) - 5e-5).abs() < 1e-18);
        let c = OptimConfig { step_epochs: vec![2, 4], ..c };
        assert!((learning_rate(&c, 45, 60, 10) - 5e-6).abs() < 1e-18, "two milestones: x0.01");
    }

    #[test]
    fn the_image_tower_is_frozen_then_the_loss_warms_up_over_one_epoch() {
        // The reference: frozen in epochs 0 and 1, the loss scaled up over epoch 2; 4 steps an epoch.
        let c = OptimConfig { freeze_image_epochs: 2, ..Default::default() };
        let got: Vec<(bool, f64)> = (0..14).map(|s| image_freeze(&c, s, 4)).collect();
        assert!(got[..8].iter().all(|&(f, k)| f && k == 1.0));
        assert_eq!(&got[8..12], &[(false, 0.25), (false, 0.5), (false, 0.75), (false, 1.0)]);
        assert!(got[12..].iter().all(|&g| g == (false, 1.0)));
        let off = OptimConfig::default();
        assert!((0..14).all(|s| image_freeze(&off, s, 4) == (false, 1.0)));
    }
}
