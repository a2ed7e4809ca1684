//! Optimisers and the learning-rate schedule (spec `bow-and-otter.md` §4, §5.8): SGD with
//! momentum (the papers: lr 3e-3, momentum 0.9, no weight decay) or AdamW, built on burn's
//! optimisers; linear warm-up then cosine decay to `min_lr` (per step or per epoch), PCME++'s
//! step decay, or a constant rate; PCME++'s frozen image tower and loss warm-up
//! ([`image_freeze`]); optional per-tensor gradient-norm clipping. The trainer keeps two optimisers: one for the encoders (with weight decay) and one
//! for the loss's temperatures and scales (never decayed, as OTTER's reference).

use burn::grad_clipping::GradientClippingConfig;
use burn::optim::decay::WeightDecayConfig;
use burn::optim::momentum::MomentumConfig;
use burn::optim::{AdamWConfig, ModuleOptimizer, SgdConfig};

use super::config::{OptimConfig, OptimizerKind, Schedule};

/// The learning rate of step `step` (0-based) of `total`, with `steps_per_epoch` steps an
/// epoch: linear warm-up over `warmup_steps` (step 0 gets `lr / warmup`), then the schedule
/// (see [`Schedule`]): cosine from `lr` down to `min_lr` at the last step; one cosine value per
/// epoch (`e = 0..E−1`, so the last epoch stays above `min_lr`, as OTTER's per-epoch annealing);
/// `lr` times `step_factor` per milestone epoch reached; or `lr`.
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
/// loss parameters.
pub fn build(c: &OptimConfig, weight_decay: f64) -> ModuleOptimizer {
    let clip = c.grad_clip_norm.map(|n| GradientClippingConfig::Norm(n as f32));
    match c.optimizer {
        OptimizerKind::Sgd => SgdConfig::new()
            // PyTorch's SGD: no dampening.
            .with_momentum(
                (c.momentum > 0.0).then(|| MomentumConfig::new().with_momentum(c.momentum).with_dampening(0.0)),
            )
            .with_weight_decay((weight_decay > 0.0).then(|| WeightDecayConfig::new(weight_decay as f32)))
            .with_gradient_clipping(clip)
            .init(),
        OptimizerKind::Adamw => AdamWConfig::new()
            .with_beta_1(c.betas[0] as f32)
            .with_beta_2(c.betas[1] as f32)
            .with_epsilon(1e-8)
            .with_weight_decay(weight_decay as f32)
            .with_grad_clipping(clip)
            .init(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
