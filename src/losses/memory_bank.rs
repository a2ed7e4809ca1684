//! Memory-bank InfoNCE of "A Fistful of Words" (spec `bow-and-otter.md` §4, eqs. 1–3): MoCo-style
//! FIFO queues `Q_u`, `Q_v` of `K` L2-normalised features from the EMA (momentum) encoders, the
//! loss of the online features against them, and [`ema_update`], the parameter average that keeps
//! the momentum encoders (and OTTER's / KD's EMA teacher, §5.6) following any burn [`Module`].
//!
//! Per step (spec §4): online `u_i = norm(f(x_i))`, `v_i = norm(g(y_i))`; EMA update; momentum
//! features `u'_i`, `v'_i` are [`MemoryBank::enqueue`]d (overwriting the oldest `B` slots; `K mod
//! B = 0`); then
//!
//! ```text
//! L_i^img = −log [ exp(u_i·v'_i/τ) / Σ_{j∈Q_v} exp(u_i·v'_j/τ) ]
//! L_i^txt = −log [ exp(v_i·u'_i/τ) / Σ_{j∈Q_u} exp(v_i·u'_j/τ) ]
//! L = (1/(2B)) Σ_i (L_i^img + L_i^txt)                    (direction_reduction = mean)
//! ```
//!
//! The positive `v'_i` is the slot the current batch was just written to, so the denominator has
//! exactly `K` terms once the bank is full. Until then the unwritten slots are left out (spec A16:
//! mask, not random vectors). Gradients reach only `u_i` and `v_i`; the bank is detached. Defaults:
//! `K = 8192`, `τ = 0.02` fixed (A7), EMA momentum 0.999 without warm-up (A8).

use std::ops::Range;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use super::bank_log_sum_exp::log_sum_exp;
use super::common::{l2_normalize, DirectionReduction, LogitScale};
use crate::error::{Error, Result};

/// `loss.type = "memory_bank"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryBankConfig {
    /// Slots per bank `K`; must be a multiple of the batch size (spec §4: 8192).
    #[serde(default = "default_size")]
    pub size: usize,
    /// Temperature τ (spec §4: 0.02, fixed).
    #[serde(default = "default_temperature")]
    pub temperature: f64,
    /// Learn τ as a clamped log logit scale (spec A7 option; off in the paper).
    #[serde(default)]
    pub learnable_temperature: bool,
    /// Momentum `m` of the EMA encoders, `θ' ← m·θ' + (1−m)·θ` (spec A8: 0.999).
    #[serde(default = "default_momentum")]
    pub momentum: f64,
    /// `mean` (the paper's `1/(2B)`) or `sum` of the two directions.
    #[serde(default)]
    pub direction_reduction: DirectionReduction,
}

fn default_size() -> usize {
    8192
}
fn default_temperature() -> f64 {
    0.02
}
pub(crate) fn default_momentum() -> f64 {
    0.999
}

impl Default for MemoryBankConfig {
    fn default() -> Self {
        MemoryBankConfig {
            size: default_size(),
            temperature: default_temperature(),
            learnable_temperature: false,
            momentum: default_momentum(),
            direction_reduction: DirectionReduction::Mean,
        }
    }
}

impl MemoryBankConfig {
    /// The logit scale `1/τ` (clamped to [1, 100] when learnable, as CLIP/OTTER).
    pub fn init_scale(&self, device: &Device) -> LogitScale {
        LogitScale::from_temperature(self.temperature, self.learnable_temperature, 1.0, 100.0, device)
    }
}

/// The two FIFO banks (`Q_u` of momentum image features, `Q_v` of momentum text features).
#[derive(Debug, Clone)]
pub struct MemoryBank {
    image: Tensor<2>,
    text: Tensor<2>,
    /// Slots written so far, at most `K`; slots `0..filled` hold features.
    filled: usize,
    /// Next slot to overwrite.
    next: usize,
    /// Slots of the most recent batch (where the positives are).
    last: Option<Range<usize>>,
}

impl MemoryBank {
    /// Empty banks of `size` slots of width `dim`.
    pub fn new(size: usize, dim: usize, device: &Device) -> MemoryBank {
        MemoryBank {
            image: Tensor::zeros([size, dim], device),
            text: Tensor::zeros([size, dim], device),
            filled: 0,
            next: 0,
            last: None,
        }
    }

    /// `K`.
    pub fn size(&self) -> usize {
        self.image.dims()[0]
    }

    /// Slots holding features.
    pub fn filled(&self) -> usize {
        self.filled
    }

    /// The bank's state for a checkpoint: `(image, text, filled, next, last)` (see
    /// [`MemoryBank::from_state`]).
    #[allow(clippy::type_complexity)]
    pub fn state(&self) -> (Tensor<2>, Tensor<2>, usize, usize, Option<Range<usize>>) {
        (self.image.clone(), self.text.clone(), self.filled, self.next, self.last.clone())
    }

    /// A bank restored from [`MemoryBank::state`] (a resumed training run).
    pub fn from_state(
        image: Tensor<2>,
        text: Tensor<2>,
        filled: usize,
        next: usize,
        last: Option<Range<usize>>,
    ) -> Self {
        MemoryBank { image, text, filled, next, last }
    }

    /// Writes the L2-normalised momentum features of one batch over the oldest slots.
    ///
    /// # Shapes
    /// - `image`, `text`: `[B, D]`, `B` dividing `K`
    pub fn enqueue(&mut self, image: Tensor<2>, text: Tensor<2>) -> Result<()> {
        let [b, d] = image.dims();
        let [k, dim] = self.image.dims();
        if text.dims() != [b, d] || d != dim {
            return Err(Error::data(format!(
                "memory bank of width {dim}: got image features {:?} and text features {:?}",
                image.dims(),
                text.dims()
            )));
        }
        if b == 0 || k % b != 0 {
            return Err(Error::Data {
                message: format!("memory bank size {k} is not a multiple of the batch size {b}"),
                hint: Some("choose `loss.size` as a multiple of the batch size (spec: K mod B = 0)".into()),
            });
        }
        let slots = self.next..self.next + b;
        self.image = self.image.clone().slice_assign([slots.clone(), 0..d], l2_normalize(image.detach()));
        self.text = self.text.clone().slice_assign([slots.clone(), 0..d], l2_normalize(text.detach()));
        self.filled = self.filled.max(slots.end);
        self.next = slots.end % k;
        self.last = Some(slots);
        Ok(())
    }

    /// The written part of the banks, `(Q_u, Q_v)`.
    ///
    /// # Shapes
    /// - output: two `[filled, D]` tensors
    pub fn contents(&self) -> (Tensor<2>, Tensor<2>) {
        let dim = self.image.dims()[1];
        (self.image.clone().slice([0..self.filled, 0..dim]), self.text.clone().slice([0..self.filled, 0..dim]))
    }

    /// Eqs. 1–3 for the online features of the batch enqueued last.
    ///
    /// # Shapes
    /// - `image`, `text`: `[B, D]` (online, any norm), `scale`: `[1]` (`1/τ`) → `[1]`
    pub fn loss(
        &self,
        image: Tensor<2>,
        text: Tensor<2>,
        scale: Tensor<1>,
        reduction: DirectionReduction,
    ) -> Tensor<1> {
        let last = self.last.clone().expect("MemoryBank::loss before the first enqueue");
        assert_eq!(image.dims()[0], last.len(), "the online batch must be the batch enqueued last");
        let (bank_image, bank_text) = self.contents();
        memory_bank_infonce(image, text, bank_image, bank_text, last.start, scale, reduction)
    }
}

/// Eqs. 1–3 against given banks: online row `i`'s positive is bank row `positive_start + i`.
///
/// # Shapes
/// - `image`, `text`: `[B, D]` (normalised here); `bank_image`, `bank_text`: `[N, D]`
///   (already normalised, no gradient); `scale`: `[1]` → `[1]`
pub fn memory_bank_infonce(
    image: Tensor<2>,
    text: Tensor<2>,
    bank_image: Tensor<2>,
    bank_text: Tensor<2>,
    positive_start: usize,
    scale: Tensor<1>,
    reduction: DirectionReduction,
) -> Tensor<1> {
    let [b, d] = image.dims();
    let n = bank_image.dims()[0];
    assert!(positive_start + b <= n, "positives {positive_start}..{} outside a bank of {n}", positive_start + b);
    // −log softmax at the positive: the log-sum-exp over the bank less the positive's logit,
    // `s·q_i·k_{start+i}` (the positives are consecutive slots, so no one-hot matrix is needed).
    let direction = |q: Tensor<2>, bank: Tensor<2>| {
        let q = l2_normalize(q);
        let positives = bank.clone().detach().slice([positive_start..positive_start + b, 0..d]);
        let positive_logits = (q.clone() * positives).sum_dim(1).reshape([b]) * scale.clone();
        (log_sum_exp(q, bank, scale.clone()) - positive_logits).mean()
    };
    reduction.combine(direction(image, bank_text), direction(text, bank_image))
}

/// OTTER's EMA decay with warm-up, `min(momentum, (1+n)/(10+n))` after `n` updates (spec §5.6);
/// `warmup = false` gives the constant `momentum` (BoW memory bank, spec A8).
pub fn ema_decay(updates: u64, momentum: f64, warmup: bool) -> f64 {
    if warmup {
        momentum.min((1.0 + updates as f64) / (10.0 + updates as f64))
    } else {
        momentum
    }
}

/// `θ' ← m·θ' + (1−m)·θ` for every float parameter of `target`, paired in traversal order with
/// the parameters of `online` (two instances of the same module type), except BatchNorm's running
/// statistics: the teacher's buffers are its own, and are not averaged (spec §5.6). The new values
/// carry no graph; each parameter keeps its `require_grad` setting. Integer and boolean tensors
/// are left as they are. `target` should come from [`ema_teacher`]: a plain clone would share
/// its running statistics with `online`.
pub fn ema_update<M: Module>(target: M, online: &M, momentum: f64) -> M {
    average(target, online, momentum, Keep::RunningStats)
}

/// A copy of `student` to be its EMA teacher: the same parameter values and ids, no gradient, and
/// BatchNorm running statistics of its own. burn's `clone` shares a module's running statistics
/// between the copies, so that a teacher forward in training mode (the reference's, spec §5.6)
/// would also move the student's, which its evaluation then uses.
pub fn ema_teacher<M: Module>(student: &M) -> M {
    // `valid` and `train` each rebuild every running state from its value.
    student.clone().valid().train().no_grad()
}

/// [`ema_update`] of the parameters of `target` that require a gradient only; the others
/// (BatchNorm's running statistics, which burn shares between a module's copies, so that
/// mapping them would also round the online module's) are left as they are. SWA's average.
pub fn ema_update_trainable<M: Module>(target: M, online: &M, momentum: f64) -> M {
    average(target, online, momentum, Keep::Untrainable)
}

/// What an average leaves as it is.
#[derive(Clone, Copy, PartialEq)]
enum Keep {
    /// BatchNorm's running statistics (found by their field names in a `BatchNorm`).
    RunningStats,
    /// Every tensor of `target` that requires no gradient.
    Untrainable,
}

fn average<M: Module>(target: M, online: &M, momentum: f64, keep: Keep) -> M {
    let mut collect = Collect(Vec::new());
    online.visit(&mut collect);
    let mut mapper = Average { online: collect.0.into_iter(), momentum, keep, field: Vec::new() };
    let target = target.map(&mut mapper);
    assert!(mapper.online.next().is_none(), "EMA target has fewer parameters than the online module");
    target
}

/// Every float parameter, flattened, without graph.
struct Collect(Vec<Tensor<1>>);

impl ModuleVisitor for Collect {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let t = param.base().detach();
        let n = t.shape().num_elements();
        self.0.push(t.reshape([n]));
    }
}

struct Average {
    online: std::vec::IntoIter<Tensor<1>>,
    momentum: f64,
    keep: Keep,
    /// The fields entered, with the type of the struct holding each.
    field: Vec<(String, String)>,
}

impl Average {
    fn in_running_stat(&self) -> bool {
        matches!(self.field.last(), Some((name, holder))
            if holder == "Struct:BatchNorm" && (name == "running_mean" || name == "running_var"))
    }
}

impl ModuleMapper for Average {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.field.push((name.to_string(), container_type.to_string()));
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.field.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let online = self.online.next().expect("EMA target has more parameters than the online module");
        let m = self.momentum;
        let keep = self.keep;
        let running_stat = self.in_running_stat();
        param.map(|t| {
            let require_grad = t.is_require_grad();
            let kept = match keep {
                Keep::RunningStats => running_stat,
                Keep::Untrainable => !require_grad,
            };
            if kept {
                return t;
            }
            let shape = t.shape();
            assert_eq!(online.dims()[0], shape.num_elements(), "EMA parameter shapes differ");
            let online: Tensor<D> = online.reshape(shape);
            // A fresh leaf (a tracked parameter must be one).
            (t.detach().mul_scalar(m) + online.mul_scalar(1.0 - m)).detach().set_require_grad(require_grad)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::losses::common::{scalar, value};
    use burn::nn::LinearConfig;
    use burn::tensor::TensorData;

    #[test]
    fn fifo_wraps_and_masks_unwritten_slots() {
        let d = Device::flex();
        let mut bank = MemoryBank::new(4, 2, &d);
        let batch = |x: f32| Tensor::<2>::from_data(TensorData::new(vec![x, 0.0, 0.0, x], [2, 2]), &d);
        bank.enqueue(batch(1.0), batch(1.0)).unwrap();
        assert_eq!((bank.filled(), bank.next, bank.last.clone()), (2, 2, Some(0..2)));
        bank.enqueue(batch(2.0), batch(2.0)).unwrap();
        bank.enqueue(batch(-3.0), batch(-3.0)).unwrap();
        assert_eq!((bank.filled(), bank.next, bank.last.clone()), (4, 2, Some(0..2)));
        // Normalised on the way in; the third batch overwrote slots 0..2.
        let (q_u, _) = bank.contents();
        assert_eq!(q_u.into_data().try_to_vec::<f32>().unwrap(), vec![-1.0, 0.0, 0.0, -1.0, 1.0, 0.0, 0.0, 1.0]);
        assert!(bank.enqueue(Tensor::zeros([3, 2], &d), Tensor::zeros([3, 2], &d)).is_err());
    }

    #[test]
    fn one_step_bank_by_hand() {
        // After one enqueue of the batch itself (B = 2, K = 4, orthonormal features), the bank
        // holds exactly the two positives: logits [[1/τ, 0], [0, 1/τ]], loss ln(1 + e^{-1/τ}).
        let d = Device::flex();
        let mut bank = MemoryBank::new(4, 2, &d);
        let e = Tensor::<2>::eye(2, &d);
        bank.enqueue(e.clone(), e.clone()).unwrap();
        let l = bank.loss(e.clone(), e, scalar(5.0, &d), DirectionReduction::Mean);
        assert!((value(&l) as f64 - (1.0 + (-5f64).exp()).ln()).abs() < 1e-6);
    }

    #[test]
    fn ema_moves_every_parameter_towards_the_online_module() {
        let d = Device::flex();
        let online = LinearConfig::new(3, 2).init(&d);
        let target = LinearConfig::new(3, 2).init(&d);
        let (w_o, w_t) = (online.weight.val(), target.weight.val());
        let (b_o, b_t) = (online.bias.as_ref().unwrap().val(), target.bias.as_ref().unwrap().val());
        let target = ema_update(target, &online, 0.9);
        let want_w = w_t.mul_scalar(0.9) + w_o.mul_scalar(0.1);
        let want_b = b_t.mul_scalar(0.9) + b_o.mul_scalar(0.1);
        let diff = (target.weight.val() - want_w).abs().max().into_scalar::<f32>();
        let diff_b = (target.bias.unwrap().val() - want_b).abs().max().into_scalar::<f32>();
        assert!(diff < 1e-7 && diff_b < 1e-7, "{diff} {diff_b}");
    }

    #[derive(Module, Debug)]
    struct Normed {
        fc: burn::nn::Linear,
        bn: burn::nn::BatchNorm,
    }

    fn normed(d: &Device) -> Normed {
        Normed { fc: LinearConfig::new(2, 2).init(d), bn: burn::nn::BatchNormConfig::new(2).init(d) }
    }

    fn running_mean(m: &Normed) -> Vec<f32> {
        m.bn.running_mean.value_sync().into_data().try_to_vec::<f32>().unwrap()
    }

    /// A teacher forward in training mode moves the teacher's running statistics, not the
    /// student's (a plain `clone` would move both: burn shares them between copies).
    #[test]
    fn the_teacher_has_running_statistics_of_its_own() {
        let d = Device::flex().autodiff();
        let x = Tensor::<4>::from_data(TensorData::new(vec![1.0f32, 5.0, 3.0, 9.0], [2, 2, 1, 1]), &d);
        let student = normed(&d);
        let teacher = ema_teacher(&student);
        let _ = teacher.bn.forward(x.clone());
        assert_eq!(running_mean(&student), vec![0.0, 0.0], "the student's statistics moved");
        assert_eq!(running_mean(&teacher), vec![0.2, 0.7], "the teacher's moved by momentum 0.1");
        assert_eq!(teacher.fc.weight.id, student.fc.weight.id);
        assert!(!teacher.fc.weight.is_require_grad() && student.fc.weight.is_require_grad());
        let shared = student.clone();
        let _ = shared.bn.forward(x);
        assert_eq!(running_mean(&student), vec![0.2, 0.7], "burn's clone shares them (why ema_teacher exists)");
    }

    /// The EMA averages BatchNorm's weights and leaves its running statistics (spec §5.6).
    #[test]
    fn ema_leaves_running_statistics_and_averages_the_rest() {
        let d = Device::flex();
        let online = normed(&d);
        let mut target = ema_teacher(&normed(&d));
        target.bn.gamma = target.bn.gamma.map(|t| t.mul_scalar(3.0));
        target.bn.running_mean = burn::module::RunningState::new(Tensor::from_floats([4.0, 8.0], &d));
        let target = ema_update(target, &online, 0.5);
        assert_eq!(running_mean(&target), vec![4.0, 8.0]);
        let gamma = target.bn.gamma.val().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(gamma, vec![2.0, 2.0], "(3 + 1) / 2");
        let v = target.bn.running_var.value_sync().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(v, vec![1.0, 1.0]);
    }

    #[test]
    fn otter_decay_warms_up_to_the_momentum() {
        assert!((ema_decay(1, 0.999, true) - 2.0 / 11.0).abs() < 1e-12);
        assert_eq!(ema_decay(100_000, 0.999, true), 0.999);
        assert_eq!(ema_decay(1, 0.999, false), 0.999);
    }
}
