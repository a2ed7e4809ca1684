//! The transfer linear evaluation (spec `bow-and-otter.md` §6.4, the BoW paper's Table 11): a
//! linear classifier on a frozen image tower's pooled features, "exactly as MSF", which reports
//! BYOL's linear-evaluation protocol (that of SimCLR and of Kornblith et al. 2019, and of
//! Ericsson et al.'s `ssl-transfer`): an L2-regularised multinomial logistic regression, fitted
//! by L-BFGS on features of images resized and centre-cropped without augmentation; its weight
//! decay chosen on a validation split from 45 values spaced logarithmically over `[1e-6, 1e5]`
//! (the table's `val` rows, else the 20% of its train rows `ssl-transfer` holds out, drawn with
//! NumPy's generator as it draws them: [`train_val_rows`]); then fitted again on train +
//! validation and scored on the test split. It owns the table
//! ([`ProbeTable`]: `path`, `label`, `split`), the solver ([`fit`], [`lbfgs`]), the protocol
//! ([`probe`]) and its [`ProbeMetrics`]; `curate eval RUN_DIR --probe TABLE`
//! ([`super::trained`]) embeds the table with the run's image tower.
//!
//! The objective, for `n` training rows, features `x_i`, labels `y_i`, weights `W` (`[C, d]`)
//! and biases `b` (not penalised):
//!
//! `L(W, b) = (1/n) Σ_i −log softmax(W x_i + b)_{y_i} + wd/(2n) · ‖W‖²_F`
//!
//! the minimiser of scikit-learn's multinomial `LogisticRegression(C = 1/wd)` (`C Σ_i CE_i +
//! ½‖W‖²`), which `ssl-transfer` fits with `C = 1/wd` over the same grid
//! (`tests/fixtures/eval/linear_probe.json` holds scikit-learn's fits to compare). For two
//! classes this is the multinomial form `ssl-transfer` asks for (`multi_class="multinomial"`,
//! a row of weights per class, both penalised); scikit-learn ≥ 1.5's binary model is the
//! binomial one, the same classifier at `C = 2/wd`. The products of a fit (`X Wᵀ`, `Xᵀ(P − Y)`)
//! run on the run's device in float32, over features centred by the fit rows' mean (the same
//! minimiser, see [`Problem`]); L-BFGS itself runs in float64 on the host. Each fit starts from
//! zero and runs to a gradient tolerance (1e-6 on `L`), not to scikit-learn's default of 100
//! iterations. At weak decays on separable features the gradient falls below any tolerance
//! long before the weights settle, so those fits, here as in scikit-learn at the same
//! tolerance, stop short of the exact minimiser; their scores are those of the stopping point.
//!
//! Scores: top-1 accuracy, and the mean over the test split's classes of each class's recall
//! ("mean per-class accuracy", which `ssl-transfer` reports for Aircraft, Caltech-101,
//! Flowers and Pets). Both are reported; `metric` says which one chose the weight decay.

use std::path::{Path, PathBuf};

use burn::tensor::activation::log_softmax;
use burn::tensor::{Device, Tensor, TensorData};
use rustc_hash::FxHashMap;
use serde::Serialize;

use super::trained::{embed_image_paths, IMAGE_BATCH};
use crate::error::{Error, Result};
use crate::rng::NumpyLegacy;
use crate::train::trained::TrainedRun;

/// The score that chooses the weight decay on the validation split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ProbeMetric {
    /// Top-1 accuracy (Food-101, CIFAR, SUN397, DTD, Cars in `ssl-transfer`).
    #[default]
    Accuracy,
    /// Mean per-class accuracy (Aircraft, Caltech-101, Flowers, Pets).
    MeanPerClass,
}

impl ProbeMetric {
    pub fn name(self) -> &'static str {
        match self {
            ProbeMetric::Accuracy => "accuracy",
            ProbeMetric::MeanPerClass => "mean_per_class",
        }
    }

    fn score(self, pred: &[u32], truth: &[u32]) -> f64 {
        match self {
            ProbeMetric::Accuracy => accuracy(pred, truth),
            ProbeMetric::MeanPerClass => mean_per_class_accuracy(pred, truth),
        }
    }
}

/// How to fit and choose.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeConfig {
    pub metric: ProbeMetric,
    /// The weight decays to try (`wd`; scikit-learn's `C = 1/wd`).
    pub grid: Vec<f64>,
    /// A fit has converged when no gradient component of `L` exceeds this.
    pub tol: f64,
    /// L-BFGS iterations per fit at most.
    pub max_iter: usize,
    /// Share of the train rows held out for validation when the table has no `val` rows
    /// (`ssl-transfer`'s 20%), drawn as `ssl-transfer` draws it with NumPy seeded by `seed`
    /// (its `random_seed = 0`); see [`train_val_rows`].
    pub holdout: f64,
    pub seed: u32,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        ProbeConfig {
            metric: ProbeMetric::Accuracy,
            grid: log_grid(),
            tol: 1e-6,
            max_iter: 1000,
            holdout: 0.2,
            seed: 0,
        }
    }
}

/// `logspace(-6, 5, 45)`: the weight decays of BYOL's and `ssl-transfer`'s search, ascending.
pub fn log_grid() -> Vec<f64> {
    (0..45).map(|i| 10f64.powf(-6.0 + 11.0 * i as f64 / 44.0)).collect()
}

/// Top-1 accuracy: the share of rows predicted right.
pub fn accuracy(pred: &[u32], truth: &[u32]) -> f64 {
    if truth.is_empty() {
        return 0.0;
    }
    pred.iter().zip(truth).filter(|(p, t)| p == t).count() as f64 / truth.len() as f64
}

/// The mean over the classes present in `truth` of each one's recall (the diagonal of the
/// confusion matrix over its row sums, `ssl-transfer`'s "mean per-class accuracy").
pub fn mean_per_class_accuracy(pred: &[u32], truth: &[u32]) -> f64 {
    let mut per: FxHashMap<u32, (usize, usize)> = FxHashMap::default();
    for (p, t) in pred.iter().zip(truth) {
        let e = per.entry(*t).or_default();
        e.0 += usize::from(p == t);
        e.1 += 1;
    }
    if per.is_empty() {
        return 0.0;
    }
    per.values().map(|&(hit, all)| hit as f64 / all as f64).sum::<f64>() / per.len() as f64
}

// ------------------------------------------------------------------------------------------
// The solver
// ------------------------------------------------------------------------------------------

/// Where L-BFGS stopped.
#[derive(Debug, Clone, PartialEq)]
pub struct Minimum {
    pub x: Vec<f64>,
    pub value: f64,
    /// The largest gradient component at `x`.
    pub grad_max: f64,
    pub iterations: usize,
    /// `grad_max <= tol`.
    pub converged: bool,
    /// Stopped because no step along even the steepest descent was acceptable (the rounding of
    /// `f` reached), not by the iteration limit.
    pub stalled: bool,
}

/// Minimises a smooth convex function by limited-memory BFGS (`m` correction pairs, the
/// two-loop recursion with the initial scaling `sᵀy / yᵀy`) and the line search of
/// [`wolfe_step`]. `f` returns the value and gradient at a point. It stops when no gradient
/// component exceeds `tol`, after `max_iter` iterations, or when even a steepest-descent step
/// finds no acceptable point.
pub fn lbfgs(
    mut f: impl FnMut(&[f64]) -> Result<(f64, Vec<f64>)>,
    x0: Vec<f64>,
    tol: f64,
    max_iter: usize,
    m: usize,
) -> Result<Minimum> {
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let inf_norm = |g: &[f64]| g.iter().fold(0.0f64, |a, v| a.max(v.abs()));
    let mut x = x0;
    let (mut value, mut grad) = f(&x)?;
    let mut history: std::collections::VecDeque<(Vec<f64>, Vec<f64>, f64)> = Default::default();
    let (mut iterations, mut stalled) = (0, false);
    while inf_norm(&grad) > tol && iterations < max_iter {
        if !value.is_finite() {
            return Err(Error::Model { message: "the linear probe's objective is not finite".into(), hint: None });
        }
        // Two-loop recursion: direction = -H grad.
        let mut q = grad.clone();
        let mut alphas = Vec::with_capacity(history.len());
        for (s, y, rho) in history.iter().rev() {
            let a = rho * dot(s, &q);
            q.iter_mut().zip(y).for_each(|(qi, yi)| *qi -= a * yi);
            alphas.push(a);
        }
        let gamma = history.back().map_or_else(|| 1.0 / inf_norm(&grad).max(1.0), |(s, y, _)| dot(s, y) / dot(y, y));
        q.iter_mut().for_each(|v| *v *= gamma);
        for ((s, y, rho), a) in history.iter().zip(alphas.iter().rev()) {
            let b = rho * dot(y, &q);
            q.iter_mut().zip(s).for_each(|(qi, si)| *qi += (a - b) * si);
        }
        let mut dir: Vec<f64> = q.into_iter().map(|v| -v).collect();
        let mut slope = dot(&grad, &dir);
        if slope >= 0.0 || !slope.is_finite() {
            // Not a descent direction (rounding): start again from steepest descent.
            history.clear();
            let scale = 1.0 / inf_norm(&grad).max(1.0);
            dir = grad.iter().map(|g| -g * scale).collect();
            slope = dot(&grad, &dir);
        }
        let accepted = wolfe_step(&mut f, &x, value, &dir, slope)?;
        let Some((next, next_value, next_grad)) = accepted else {
            if history.is_empty() {
                stalled = true;
                break;
            }
            // The quasi-Newton direction failed: one more try from steepest descent.
            history.clear();
            continue;
        };
        let s: Vec<f64> = next.iter().zip(&x).map(|(a, b)| a - b).collect();
        let y: Vec<f64> = next_grad.iter().zip(&grad).map(|(a, b)| a - b).collect();
        let sy = dot(&s, &y);
        if sy > 1e-12 * dot(&y, &y).sqrt() * dot(&s, &s).sqrt() && sy > 0.0 {
            if history.len() == m {
                history.pop_front();
            }
            history.push_back((s, y, 1.0 / sy));
        }
        (x, value, grad) = (next, next_value, next_grad);
        iterations += 1;
    }
    let grad_max = inf_norm(&grad);
    Ok(Minimum { x, value, grad_max, iterations, converged: grad_max <= tol, stalled })
}

/// A point with its value and gradient.
type Point = (Vec<f64>, f64, Vec<f64>);

/// A step `α` along the descent direction `dir` from `x` (value `value`, slope `gᵀdir` =
/// `slope` < 0) that meets Wolfe's strong curvature condition `|φ'(α)| ≤ 0.9 |φ'(0)|` and
/// Armijo's decrease `φ(α) ≤ φ(0) + 1e-4 · α φ'(0)` up to the rounding of `φ` (`1e-6 · |φ(0)|`):
/// the probe's objective is summed in float32, so near the minimum its decreases are below its
/// rounding, while its slope (a gradient dotted with the direction) stays exact enough to steer
/// by. `φ` being convex along the line, `φ'` grows with `α`: too steep a slope doubles the step
/// (or bisects towards the last overshoot), a slope past the curvature bound or a value above
/// the bound bisects back. `None` when 40 trials find no such step.
fn wolfe_step(
    f: &mut impl FnMut(&[f64]) -> Result<(f64, Vec<f64>)>,
    x: &[f64],
    value: f64,
    dir: &[f64],
    slope: f64,
) -> Result<Option<Point>> {
    let (mut lo, mut hi, mut step) = (0.0, f64::INFINITY, 1.0);
    let noise = 1e-6 * value.abs().max(1e-12);
    for _ in 0..40 {
        let trial: Vec<f64> = x.iter().zip(dir).map(|(xi, di)| xi + step * di).collect();
        let (v, g) = f(&trial)?;
        let d: f64 = g.iter().zip(dir).map(|(a, b)| a * b).sum();
        let decreased = v.is_finite() && v <= value + 1e-4 * step * slope + noise;
        if !decreased || d > -0.9 * slope {
            hi = step;
        } else if d < 0.9 * slope {
            lo = step;
        } else {
            return Ok(Some((trial, v, g)));
        }
        step = if hi.is_finite() { 0.5 * (lo + hi) } else { 2.0 * step };
    }
    Ok(None)
}

/// Features and labels of one fit, on the device: `x` `[n, d]` less its column means, `y`
/// class indices `0..classes`.
///
/// Centring changes nothing but the conditioning: the biases are not penalised, so `W x + b`
/// and `W (x − μ) + (b + W μ)` are the same classifier at the same penalty, and the minimiser
/// over centred features is the minimiser over raw ones with its bias moved. Without it, features
/// far from zero on average (a ResNet's pooled features are all positive) tie the weights to the
/// biases and L-BFGS crawls. Rows to predict are centred by the same `μ`.
pub struct Problem {
    x: Tensor<2>,
    mean: Vec<f32>,
    onehot: Tensor<2>,
    pub n: usize,
    pub dim: usize,
    pub classes: usize,
}

impl Problem {
    /// # Shapes
    /// `x`: `[y.len() * dim]`, row-major; every `y < classes`.
    pub fn new(x: &[f32], y: &[u32], dim: usize, classes: usize, device: &Device) -> Problem {
        let n = y.len();
        assert_eq!(x.len(), n * dim, "features are not rows x dim");
        let mut onehot = vec![0f32; n * classes];
        for (i, &c) in y.iter().enumerate() {
            onehot[i * classes + c as usize] = 1.0;
        }
        let mut sums = vec![0f64; dim];
        for row in x.chunks(dim) {
            sums.iter_mut().zip(row).for_each(|(s, &v)| *s += f64::from(v));
        }
        let mean: Vec<f32> = sums.iter().map(|s| (s / n.max(1) as f64) as f32).collect();
        Problem {
            x: Tensor::<2>::from_data(TensorData::new(centred(x, &mean), [n, dim]), device),
            mean,
            onehot: Tensor::<2>::from_data(TensorData::new(onehot, [n, classes]), device),
            n,
            dim,
            classes,
        }
    }

    /// `L` and its gradient at `theta` = `W` (`[classes, dim]`, row-major) then `b`.
    fn objective(&self, theta: &[f64], wd: f64) -> Result<(f64, Vec<f64>)> {
        let (c, d, n) = (self.classes, self.dim, self.n as f64);
        let device = self.x.device();
        let (w, b) = theta.split_at(c * d);
        let wt: Vec<f32> = (0..d).flat_map(|j| (0..c).map(move |k| w[k * d + j] as f32)).collect();
        let wt = Tensor::<2>::from_data(TensorData::new(wt, [d, c]), &device);
        let bias = Tensor::<2>::from_data(TensorData::new(b.iter().map(|&v| v as f32).collect(), [1, c]), &device);
        let logp = log_softmax(self.x.clone().matmul(wt) + bias, 1);
        let ce = (logp.clone() * self.onehot.clone()).sum().neg();
        let residual = logp.exp() - self.onehot.clone();
        let gwt = self.x.clone().transpose().matmul(residual.clone());
        let gb = residual.sum_dim(0);
        let ce = f64::from(ce.into_scalar::<f32>());
        let gwt = gwt.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?;
        let gb = gb.into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?;
        let penalty = w.iter().map(|v| v * v).sum::<f64>();
        let value = ce / n + wd / (2.0 * n) * penalty;
        let mut grad = Vec::with_capacity(theta.len());
        for k in 0..c {
            grad.extend((0..d).map(|j| f64::from(gwt[j * c + k]) / n + wd / n * w[k * d + j]));
        }
        grad.extend(gb.iter().map(|&g| f64::from(g) / n));
        Ok((value, grad))
    }

    /// `theta` of a fit in the coordinates of the raw features: the same `W`, the bias `b − W μ`
    /// (what scikit-learn reports for the same data).
    pub fn uncentred(&self, theta: &[f64]) -> Vec<f64> {
        let (c, d) = (self.classes, self.dim);
        let (w, b) = theta.split_at(c * d);
        let mut out = w.to_vec();
        out.extend(
            (0..c).map(|k| {
                b[k] - w[k * d..(k + 1) * d].iter().zip(&self.mean).map(|(w, &m)| w * f64::from(m)).sum::<f64>()
            }),
        );
        out
    }

    /// `rows` (`[n * dim]`) on the device, centred as the fit's features, for [`Self::predict`].
    pub fn rows(&self, rows: &[f32]) -> Tensor<2> {
        let n = rows.len() / self.dim.max(1);
        Tensor::<2>::from_data(TensorData::new(centred(rows, &self.mean), [n, self.dim]), &self.x.device())
    }

    /// The class of each row of `x` ([`Self::rows`]) under `theta`: the highest logit, ties to
    /// the lower class (NumPy's `argmax`, scikit-learn's `predict`).
    pub fn predict(&self, x: &Tensor<2>, theta: &[f64]) -> Result<Vec<u32>> {
        let (c, d) = (self.classes, self.dim);
        let device = x.device();
        let (w, b) = theta.split_at(c * d);
        let wt: Vec<f32> = (0..d).flat_map(|j| (0..c).map(move |k| w[k * d + j] as f32)).collect();
        let wt = Tensor::<2>::from_data(TensorData::new(wt, [d, c]), &device);
        let bias = Tensor::<2>::from_data(TensorData::new(b.iter().map(|&v| v as f32).collect(), [1, c]), &device);
        let z =
            (x.clone().matmul(wt) + bias).into_data().try_to_vec::<f32>().map_err(|e| Error::data(format!("{e:?}")))?;
        Ok(z.chunks(c)
            .map(|row| {
                let mut best = 0;
                for (k, &v) in row.iter().enumerate() {
                    if v > row[best] {
                        best = k;
                    }
                }
                best as u32
            })
            .collect())
    }
}

/// Each row of `x` (`[n * dim]`) less `mean`.
fn centred(x: &[f32], mean: &[f32]) -> Vec<f32> {
    x.chunks(mean.len().max(1)).flat_map(|row| row.iter().zip(mean).map(|(v, m)| v - m)).collect()
}

/// One fit of the probe at weight decay `wd`, from zero (scikit-learn's start), in the centred
/// coordinates of its [`Problem`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    pub wd: f64,
    /// `W` (`[classes, dim]`, row-major) then `b`.
    pub theta: Vec<f64>,
    pub iterations: usize,
    pub converged: bool,
    /// Stopped at the rounding of the float32 objective rather than by the iteration limit.
    pub stalled: bool,
    pub grad_max: f64,
}

/// Each fit starts from zero, so that it depends on nothing but its problem and `wd`: a fit
/// started from its neighbour on the grid would already meet the tolerance at weak decays,
/// where the penalty's gradient is below it, and keep its neighbour's weights.
pub fn fit(problem: &Problem, wd: f64, c: &ProbeConfig) -> Result<Fit> {
    let x0 = vec![0.0; problem.classes * (problem.dim + 1)];
    let m = lbfgs(|theta| problem.objective(theta, wd), x0, c.tol, c.max_iter, 10)?;
    Ok(Fit {
        wd,
        theta: m.x,
        iterations: m.iterations,
        converged: m.converged,
        stalled: m.stalled,
        grad_max: m.grad_max,
    })
}

// ------------------------------------------------------------------------------------------
// The protocol
// ------------------------------------------------------------------------------------------

/// Which split a row of the probe table is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    Train,
    Val,
    Test,
}

impl Split {
    /// As the table writes it.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Val => "val",
            Split::Test => "test",
        }
    }
}

/// The probe's table: `path` (`curate eval --probe`: an image) or `sample_id` (`curate probe`:
/// a row of a features table), `label` (a string or an integer) and `split` (`train`, `val` or
/// `test`; without `val` rows, part of `train` is held out). Rows with a null are left out and
/// counted.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeTable {
    pub file: PathBuf,
    /// Each kept row's `path` or `sample_id`.
    pub keys: Vec<String>,
    /// Class index of each kept row (labels numbered as first met).
    pub labels: Vec<u32>,
    pub split: Vec<Split>,
    /// The label of each class index.
    pub names: Vec<String>,
    pub skipped: usize,
    /// The key column: `path` or `sample_id`.
    pub key: &'static str,
}

impl ProbeTable {
    /// Reads and checks `file`, its rows keyed by the column `key` (`path` or `sample_id`): its
    /// columns (every missing one at once), each `split` value, and that train has two classes
    /// and test a row.
    pub fn read(file: &Path, key: &'static str) -> Result<ProbeTable> {
        super::unimodal::check_columns(file, &[key, "label", "split"], "")?;
        let batches = crate::io::parquet::read_file(file)?;
        let paths = if key == "path" {
            super::unimodal::strings(file, &batches, key)?
        } else {
            super::unimodal::text_or_integers(file, &batches, key, "`sample_id` names a row of the features tables")?
        };
        let labels = super::unimodal::labels(file, &batches)?;
        let splits = super::unimodal::strings(file, &batches, "split")?;
        let mut t = ProbeTable {
            file: file.to_owned(),
            keys: Vec::new(),
            labels: Vec::new(),
            split: Vec::new(),
            names: Vec::new(),
            skipped: 0,
            key,
        };
        let mut classes: FxHashMap<String, u32> = FxHashMap::default();
        for (row, ((path, label), split)) in paths.into_iter().zip(labels).zip(splits).enumerate() {
            let (Some(path), Some(label), Some(split)) = (path, label, split) else {
                t.skipped += 1;
                continue;
            };
            let split =
                match split.as_str() {
                    "train" => Split::Train,
                    "val" => Split::Val,
                    "test" => Split::Test,
                    other => return Err(Error::Data {
                        message: format!("`{}`: row {row} has `split` = `{other}`", file.display()),
                        hint: Some(
                            "`split` is `train`, `val` or `test` (without `val` rows, 20% of `train` is held out to \
                             choose the weight decay)"
                                .into(),
                        ),
                    }),
                };
            let next = classes.len() as u32;
            let class = *classes.entry(label.clone()).or_insert_with(|| {
                t.names.push(label);
                next
            });
            t.keys.push(path);
            t.labels.push(class);
            t.split.push(split);
        }
        t.refuse_repeated_keys()?;
        let count = |s: Split| t.split.iter().filter(|&&x| x == s).count();
        let train_classes = {
            let mut seen: Vec<u32> =
                t.labels.iter().zip(&t.split).filter(|(_, &s)| s == Split::Train).map(|(&l, _)| l).collect();
            seen.sort_unstable();
            seen.dedup();
            seen.len()
        };
        if train_classes < 2 || count(Split::Test) == 0 {
            return Err(Error::Data {
                message: format!(
                    "`{}` has {} train row(s) of {train_classes} class(es) and {} test row(s){}: a linear probe is \
                     fitted on train (at least 2 classes) and scored on test",
                    file.display(),
                    count(Split::Train),
                    count(Split::Test),
                    match t.skipped {
                        0 => String::new(),
                        n => format!(" ({n} row(s) left out for a null `{key}`, `label` or `split`)"),
                    }
                ),
                hint: Some("mark rows `split` = `train`, `val` (optional) and `test`".into()),
            });
        }
        Ok(t)
    }

    /// Refuses a key (an image) listed twice: in two splits the probe would be scored on images
    /// it was fitted on, and in one it counts an image twice.
    fn refuse_repeated_keys(&self) -> Result<()> {
        let mut first: FxHashMap<&str, usize> = FxHashMap::default();
        for (r, k) in self.keys.iter().enumerate() {
            if let Some(&q) = first.get(k.as_str()) {
                let distinct = self.keys.iter().map(String::as_str).collect::<std::collections::HashSet<_>>().len();
                let (a, b) = (self.split[q].name(), self.split[r].name());
                let where_ = if a == b { format!("twice in {a}") } else { format!("in {a} and in {b}") };
                return Err(Error::Data {
                    message: format!(
                        "`{}` lists `{}` `{k}` more than once ({where_}; {} rows, {} distinct)",
                        self.file.display(),
                        self.key,
                        self.keys.len(),
                        distinct
                    ),
                    hint: Some(
                        "one row per image: an image in train and test is scored on what it was fitted on".into(),
                    ),
                });
            }
            first.insert(k, r);
        }
        Ok(())
    }
}

/// The probe's result: `metrics.json`'s `"linear_probe"` object.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProbeMetrics {
    /// Test top-1 accuracy of the classifier fitted on train + validation.
    pub accuracy: f64,
    /// Test mean per-class accuracy of the same classifier.
    pub mean_per_class_accuracy: f64,
    /// The score that chose the weight decay on the validation split.
    pub metric: ProbeMetric,
    /// The weight decay chosen (scikit-learn's `C = 1/wd`).
    pub wd: f64,
    /// Its validation score (`metric`).
    pub val_score: f64,
    /// `table` (its `val` rows) or `holdout` (a share of the train rows).
    pub val_from: &'static str,
    pub train: usize,
    pub val: usize,
    pub test: usize,
    /// Classes of the final fit (those with train or validation rows).
    pub classes: usize,
    pub feature_dim: usize,
    /// Test rows of a class without train or validation rows (always wrong).
    pub test_unseen_class: usize,
    /// Validation rows of a class without train rows (always wrong while the weight decay is
    /// chosen).
    pub val_unseen_class: usize,
    pub rows_skipped: usize,
    /// Fits (the grid, then the final one) and those that stopped before the tolerance: by the
    /// iteration limit, or stalled where the float32 objective's rounding stops the line search
    /// (more iterations do not help those).
    pub fits: usize,
    pub fits_not_converged: usize,
    pub fits_at_iteration_limit: usize,
    pub fits_stalled: usize,
    /// Of those stalled, the fits that took no step at all from zero: features far from unit
    /// scale (~1e15) leave the float32 line search no step it can accept.
    pub fits_without_a_step: usize,
    /// The largest final gradient component among the fits that stopped short (0 if none).
    pub worst_grad_max: f64,
}

/// The warnings `p` calls for (on stderr, and in `metrics.json` for `curate eval --probe`), of a
/// table keyed by `key` (`path` or `sample_id`).
pub fn warnings(p: &ProbeMetrics, key: &str) -> Vec<String> {
    let mut out = Vec::new();
    if p.fits_not_converged > 0 {
        out.push(short_fits(p));
    }
    if p.val_unseen_class > 0 {
        out.push(format!(
            "{} validation row(s) of a class without train rows (never right while the weight decay is chosen; \
             labels are matched exactly as text)",
            p.val_unseen_class
        ));
    }
    if p.test_unseen_class > 0 {
        out.push(format!(
            "{} test row(s) of a class without train or validation rows (never predicted right, still counted)",
            p.test_unseen_class
        ));
    }
    if p.rows_skipped > 0 {
        out.push(format!("{} row(s) left out for a null `{key}`, `label` or `split`", p.rows_skipped));
    }
    out
}

/// What the fits that stopped short of the tolerance say (for a warning; `fits_not_converged`
/// > 0).
pub fn short_fits(p: &ProbeMetrics) -> String {
    let mut parts = Vec::new();
    if p.fits_at_iteration_limit > 0 {
        parts.push(format!("{} stopped by the iteration limit (raise it)", p.fits_at_iteration_limit));
    }
    if p.fits_stalled > 0 {
        parts.push(format!(
            "{} stalled where the float32 objective's rounding stops the line search (more iterations do not help)",
            p.fits_stalled
        ));
    }
    let mut s = format!(
        "{} of {} fit(s) stopped before the gradient tolerance: {}; the largest gradient left is {:.1e}, and their \
         scores are those of the stopping point",
        p.fits_not_converged,
        p.fits,
        parts.join(", "),
        p.worst_grad_max
    );
    if p.fits_without_a_step > 0 {
        s += &format!(
            "; {} of them took no step from zero at all, as with features far from unit scale: rescale them \
             (L2-normalise, or divide by a constant)",
            p.fits_without_a_step
        );
    }
    s
}

/// Rows of `x` (`[rows * dim]`) picked by `rows`.
fn gather(x: &[f32], dim: usize, rows: &[usize]) -> Vec<f32> {
    rows.iter().flat_map(|&r| x[r * dim..(r + 1) * dim].iter().copied()).collect()
}

/// Labels renumbered `0..k` over the classes of `rows` (in class order), with the map back.
fn local_classes(labels: &[u32], rows: &[usize]) -> (Vec<u32>, FxHashMap<u32, u32>) {
    let mut classes: Vec<u32> = rows.iter().map(|&r| labels[r]).collect();
    classes.sort_unstable();
    classes.dedup();
    let index: FxHashMap<u32, u32> = classes.iter().enumerate().map(|(i, &c)| (c, i as u32)).collect();
    (rows.iter().map(|&r| index[&labels[r]]).collect(), index)
}

/// The fit's class of each of `rows`; a class the fit has not seen gets an index of its own past
/// the fit's classes (it is never predicted, and counts as a class of its own for the mean
/// per-class accuracy).
fn truth_of(labels: &[u32], rows: &[usize], index: &FxHashMap<u32, u32>) -> Vec<u32> {
    let k = index.len() as u32;
    rows.iter().map(|&r| index.get(&labels[r]).copied().unwrap_or(k + labels[r])).collect()
}

/// The train and validation rows of `table`: its `val` rows, or `floor(holdout · train)` of its
/// train rows drawn exactly as `ssl-transfer`'s `get_train_valid_loader` draws them for the
/// data sets without a validation split (Food-101, CIFAR, SUN397, Pets, Caltech-101, Cars):
/// `indices = list(range(num_train))`, `np.random.seed(seed)`, `np.random.shuffle(indices)`,
/// the first `floor(holdout · num_train)` held out ([`NumpyLegacy`]). With the train rows listed
/// in the data set's own order (torchvision's), these are the very rows `ssl-transfer` holds out.
pub fn train_val_rows(table: &ProbeTable, holdout: f64, seed: u32) -> (Vec<usize>, Vec<usize>, &'static str) {
    let rows = |s: Split| -> Vec<usize> { (0..table.split.len()).filter(|&r| table.split[r] == s).collect() };
    let (train, val) = (rows(Split::Train), rows(Split::Val));
    if !val.is_empty() {
        return (train, val, "table");
    }
    let mut order = train;
    NumpyLegacy::seed(seed).shuffle(&mut order);
    let held = (holdout * order.len() as f64).floor() as usize;
    let mut val = order[..held].to_vec();
    let mut train = order[held..].to_vec();
    val.sort_unstable();
    train.sort_unstable();
    (train, val, "holdout")
}

/// Runs the protocol on `features` (`[table rows * dim]`, one row per kept table row, in
/// order). `note` hears each fit.
pub fn probe(
    table: &ProbeTable,
    features: &[f32],
    dim: usize,
    c: &ProbeConfig,
    device: &Device,
    note: &dyn Fn(String),
) -> Result<ProbeMetrics> {
    assert_eq!(features.len(), table.labels.len() * dim, "one feature row per table row");
    if let Some(i) = features.iter().position(|v| !v.is_finite()) {
        return Err(Error::Model {
            message: format!("the probe's feature of row {} (`{}`) is not finite", i / dim, table.keys[i / dim]),
            hint: None,
        });
    }
    let (train, val, val_from) = train_val_rows(table, c.holdout, c.seed);
    let test: Vec<usize> = (0..table.split.len()).filter(|&r| table.split[r] == Split::Test).collect();
    if val.is_empty() {
        return Err(Error::data(format!(
            "`{}` has no `val` rows and too few train rows ({}) to hold {:.0}% out to choose the weight decay",
            table.file.display(),
            train.len(),
            c.holdout * 100.0
        )));
    }
    let (mut fits, mut at_limit, mut stalled, mut no_step, mut worst) = (0, 0, 0, 0, 0.0f64);
    let mut count = |f: &Fit| {
        fits += 1;
        if !f.converged {
            at_limit += usize::from(!f.stalled);
            stalled += usize::from(f.stalled);
            no_step += usize::from(f.stalled && f.iterations == 0);
            worst = worst.max(f.grad_max);
        }
    };

    // Choose the weight decay: fit on train, score on validation.
    let (y, index) = local_classes(&table.labels, &train);
    if index.len() < 2 {
        return Err(Error::data(format!(
            "the train rows of `{}` left after holding out the validation rows have one class",
            table.file.display()
        )));
    }
    let problem = Problem::new(&gather(features, dim, &train), &y, dim, index.len(), device);
    let val_x = problem.rows(&gather(features, dim, &val));
    let val_truth = truth_of(&table.labels, &val, &index);
    let val_unseen_class = val_truth.iter().filter(|&&t| t as usize >= index.len()).count();
    if val_unseen_class == val.len() {
        let mut shown: Vec<&str> = Vec::new();
        for &r in &val {
            let name = table.names[table.labels[r] as usize].as_str();
            if shown.len() < 3 && !shown.contains(&name) {
                shown.push(name);
            }
        }
        return Err(Error::Data {
            message: format!(
                "no validation row of `{}` has a class that train has (e.g. `{}`): every weight decay would score 0",
                table.file.display(),
                shown.join("`, `")
            ),
            hint: Some("labels are matched exactly as text: spell each class the same in every split".into()),
        });
    }
    let mut scores = Vec::with_capacity(c.grid.len());
    for &wd in &c.grid {
        let f = fit(&problem, wd, c)?;
        count(&f);
        let score = c.metric.score(&problem.predict(&val_x, &f.theta)?, &val_truth);
        scores.push(score);
        note(format!(
            "linear probe: wd {:.3e}: validation {} {:.4} ({} iterations{})",
            f.wd,
            c.metric.name(),
            score,
            f.iterations,
            match (f.converged, f.stalled) {
                (true, _) => String::new(),
                (false, false) => format!(", stopped by the iteration limit, max gradient {:.1e}", f.grad_max),
                (false, true) => format!(", stalled at the float32 rounding, max gradient {:.1e}", f.grad_max),
            }
        ));
    }
    // The best score; ties to the smallest weight decay (`ssl-transfer` scans the ascending grid
    // and keeps the first best).
    let best = (0..c.grid.len())
        .max_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(c.grid[b].total_cmp(&c.grid[a])))
        .ok_or_else(|| Error::data("the linear probe's weight-decay grid is empty"))?;
    let wd = c.grid[best];

    // Fit again on train + validation and score on test.
    let mut all: Vec<usize> = train.iter().chain(&val).copied().collect();
    all.sort_unstable();
    let (y, index) = local_classes(&table.labels, &all);
    let problem = Problem::new(&gather(features, dim, &all), &y, dim, index.len(), device);
    let f = fit(&problem, wd, c)?;
    count(&f);
    let test_x = problem.rows(&gather(features, dim, &test));
    let truth = truth_of(&table.labels, &test, &index);
    let pred = problem.predict(&test_x, &f.theta)?;
    Ok(ProbeMetrics {
        accuracy: accuracy(&pred, &truth),
        mean_per_class_accuracy: mean_per_class_accuracy(&pred, &truth),
        metric: c.metric,
        wd,
        val_score: scores[best],
        val_from,
        train: train.len(),
        val: val.len(),
        test: test.len(),
        classes: index.len(),
        feature_dim: dim,
        test_unseen_class: truth.iter().filter(|&&t| t as usize >= index.len()).count(),
        val_unseen_class,
        rows_skipped: table.skipped,
        fits,
        fits_not_converged: at_limit + stalled,
        fits_at_iteration_limit: at_limit,
        fits_stalled: stalled,
        fits_without_a_step: no_step,
        worst_grad_max: worst,
    })
}

/// Embeds `table`'s images (under `root` when given) with `run`'s frozen image tower (its pooled
/// features, through the evaluation view of its transform, no augmentation) and runs [`probe`].
pub fn evaluate(
    run: &TrainedRun,
    table: &ProbeTable,
    root: Option<&Path>,
    c: &ProbeConfig,
    note: &dyn Fn(String),
) -> Result<ProbeMetrics> {
    note(format!("linear probe: embedding {} images (`{}`)", table.keys.len(), table.file.display()));
    let (mut dim, mut done) = (0, 0);
    let features = embed_image_paths(run, &table.keys, root, |pixels, n| {
        let (f, width) = run.image_features(pixels, n)?;
        dim = width;
        done += n;
        if done % (IMAGE_BATCH * 64) == 0 {
            note(format!("linear probe: {done} / {} images", table.keys.len()));
        }
        Ok(f)
    })?;
    probe(table, &features, dim, c, run.device(), note)
}

/// `curate probe FEATURES LABELS`: the probe of features computed beforehand (the
/// `encode_image` stage's `sample_id` + `embedding` tables, from any frozen encoder: the
/// paper's BYOL initialisation, say), joined to `labels` (`sample_id`, `label`, `split`) by
/// `sample_id`. Every labelled row needs features; feature rows without a label are ignored.
pub fn run_on_features(
    features: &[PathBuf],
    labels: &Path,
    c: &ProbeConfig,
    device: &Device,
    note: &dyn Fn(String),
) -> Result<ProbeMetrics> {
    let table = ProbeTable::read(labels, "sample_id")?;
    let (by_id, dim) = crate::train::data::read_features(features)?;
    let missing: Vec<&String> = table.keys.iter().filter(|k| !by_id.contains_key(*k)).collect();
    if !missing.is_empty() && missing.len() == table.keys.len() && !by_id.is_empty() {
        let shown = |ids: Vec<&String>| ids.iter().take(3).map(|k| format!("`{k}`")).collect::<Vec<_>>().join(", ");
        let mut theirs: Vec<&String> = by_id.keys().collect();
        theirs.sort_unstable();
        return Err(Error::Data {
            message: format!(
                "none of the {} labelled rows of `{}` has features: its ids are e.g. {}, the features tables' {} ids \
                 e.g. {}",
                table.keys.len(),
                labels.display(),
                shown(missing),
                by_id.len(),
                shown(theirs)
            ),
            hint: Some(
                "both tables must hold the same `sample_id`s, written the same way: ids are compared as text, so an \
                 integer id written as a float (`0.0`, as pandas writes a column with a null) is another id"
                    .into(),
            ),
        });
    }
    if !missing.is_empty() {
        let shown: Vec<String> = missing.iter().take(3).map(|k| format!("`{k}`")).collect();
        return Err(Error::Data {
            message: format!(
                "{} of the {} labelled rows of `{}` have no features (e.g. {}); the features tables hold {} ids",
                missing.len(),
                table.keys.len(),
                labels.display(),
                shown.join(", "),
                by_id.len()
            ),
            hint: Some("encode every image the labels name (the `encode_image` stage over the same rows)".into()),
        });
    }
    let labelled: std::collections::HashSet<&String> = table.keys.iter().collect();
    let rows: Vec<f32> = table.keys.iter().flat_map(|k| by_id[k].iter().copied()).collect();
    note(format!(
        "linear probe: {} labelled rows, {dim}-d features ({} feature rows without a label ignored)",
        table.keys.len(),
        by_id.len() - labelled.len()
    ));
    probe(&table, &rows, dim, c, device, note)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lbfgs_finds_the_minimum_of_an_ill_conditioned_quadratic() {
        // f(x) = ½ Σ_i a_i (x_i − c_i)², curvatures 1e-3 … 1e3: the minimum is c.
        let a = [1e-3, 0.1, 1.0, 10.0, 1e3];
        let c = [1.0, -2.0, 3.0, 0.5, -0.25];
        let f = |x: &[f64]| -> Result<(f64, Vec<f64>)> {
            let v = x.iter().zip(&a).zip(&c).map(|((x, a), c)| 0.5 * a * (x - c) * (x - c)).sum();
            Ok((v, x.iter().zip(&a).zip(&c).map(|((x, a), c)| a * (x - c)).collect()))
        };
        let m = lbfgs(f, vec![0.0; 5], 1e-10, 200, 10).unwrap();
        assert!(m.converged && m.grad_max <= 1e-10, "{m:?}");
        for (x, c) in m.x.iter().zip(&c) {
            // |g_i| = a_i |x_i − c_i| ≤ 1e-10, so the flattest coordinate is within 1e-7.
            assert!((x - c).abs() < 1e-7, "{:?}", m.x);
        }
        // A start at the minimum takes no iteration.
        let m = lbfgs(f, c.to_vec(), 1e-10, 200, 10).unwrap();
        assert_eq!((m.iterations, m.converged), (0, true));
        // Too few iterations: stopped, and says so.
        let m = lbfgs(f, vec![0.0; 5], 1e-10, 2, 10).unwrap();
        assert_eq!((m.iterations, m.converged, m.stalled), (2, false, false));
        // A gradient that points the wrong way (as rounding can make it): no step is acceptable,
        // and the stop says it stalled rather than ran out of iterations.
        let wrong = |x: &[f64]| -> Result<(f64, Vec<f64>)> { Ok((1.0 + x[0] * x[0], vec![-2.0 * x[0] - 1.0])) };
        let m = lbfgs(wrong, vec![0.0], 1e-10, 200, 10).unwrap();
        assert_eq!((m.iterations, m.converged, m.stalled), (0, false, true), "{m:?}");
    }

    #[test]
    fn lbfgs_steers_by_the_slope_below_the_rounding_of_the_value() {
        // The value rounded to 1e-4 (relative ~1e-4, far above `wolfe_step`'s 1e-6 allowance),
        // the gradient exact: an Armijo search on values alone stalls once the decreases fall
        // below the rounding; the slope still leads to the minimum, as the probe's float32
        // objective needs.
        let f = |x: &[f64]| -> Result<(f64, Vec<f64>)> {
            let v: f64 = 1.0 + x.iter().enumerate().map(|(i, x)| (i + 1) as f64 * (x - 1.0).powi(2)).sum::<f64>();
            let g = x.iter().enumerate().map(|(i, x)| 2.0 * (i + 1) as f64 * (x - 1.0)).collect();
            Ok(((v * 1e4).round() / 1e4, g))
        };
        let m = lbfgs(f, vec![0.0; 4], 1e-9, 100, 10).unwrap();
        assert!(m.converged, "{m:?}");
        assert!(m.x.iter().all(|x| (x - 1.0).abs() < 1e-9), "{:?}", m.x);
    }

    #[test]
    fn scores_by_hand() {
        // Truth: class 0 ×4, class 1 ×2, class 7 ×1; predictions right for 3 of class 0, 1 of
        // class 1, none of class 7: accuracy 4/7; per class 3/4, 1/2, 0 → mean 5/12.
        let truth = [0, 0, 0, 0, 1, 1, 7];
        let pred = [0, 0, 0, 1, 1, 0, 1];
        assert!((accuracy(&pred, &truth) - 4.0 / 7.0).abs() < 1e-15);
        assert!((mean_per_class_accuracy(&pred, &truth) - 5.0 / 12.0).abs() < 1e-15);
        // A class only predicted (never true) does not count as a class.
        assert!((mean_per_class_accuracy(&[2, 2], &[2, 3]) - 0.5).abs() < 1e-15);
        assert_eq!((accuracy(&[], &[]), mean_per_class_accuracy(&[], &[])), (0.0, 0.0));
        let g = log_grid();
        assert_eq!(g.len(), 45);
        assert!((g[0] - 1e-6).abs() < 1e-18 && (g[44] / 1e5 - 1.0).abs() < 1e-12 && (g[4] / 1e-5 - 1.0).abs() < 1e-12);
    }

    fn table(labels: &[u32], split: &[Split]) -> ProbeTable {
        ProbeTable {
            file: "t.parquet".into(),
            keys: (0..labels.len()).map(|i| format!("{i}.jpg")).collect(),
            labels: labels.to_vec(),
            split: split.to_vec(),
            names: Vec::new(),
            skipped: 0,
            key: "path",
        }
    }

    #[test]
    fn an_image_listed_twice_is_refused_saying_where() {
        use Split::*;
        let mut t = table(&[0, 1, 0, 1], &[Train, Train, Test, Val]);
        assert!(t.refuse_repeated_keys().is_ok());
        t.keys[2] = t.keys[0].clone();
        let e = t.refuse_repeated_keys().unwrap_err().to_string();
        assert!(e.contains("lists `path` `0.jpg` more than once (in train and in test; 4 rows, 3 distinct)"), "{e}");
        t.keys[2] = "2.jpg".into();
        t.keys[1] = t.keys[0].clone();
        let e = t.refuse_repeated_keys().unwrap_err().to_string();
        assert!(e.contains("(twice in train; 4 rows, 3 distinct)"), "{e}");
    }

    #[test]
    fn validation_rows_of_classes_train_lacks_are_counted_or_refused() {
        use Split::*;
        // Two well-separated classes in train and test; validation rows of class 0 and of a
        // class (2) that train lacks.
        let labels = [0, 1, 0, 1, 0, 2, 0, 1];
        let split = [Train, Train, Train, Train, Val, Val, Test, Test];
        let mut t = table(&labels, &split);
        t.names = vec!["a".into(), "b".into(), "c".into()];
        let features: Vec<f32> = labels.iter().flat_map(|&l| [l as f32, 1.0 - l as f32]).collect();
        let c = ProbeConfig { grid: vec![1e-3, 1e-1], ..ProbeConfig::default() };
        let m = probe(&t, &features, 2, &c, &Device::flex(), &|_| {}).unwrap();
        assert_eq!((m.val_unseen_class, m.test_unseen_class), (1, 0));
        let w = warnings(&m, "sample_id");
        assert!(w.iter().any(|w| w.starts_with("1 validation row(s) of a class without train rows")), "{w:?}");
        // Every validation row of a class train lacks: no weight decay can be chosen.
        t.labels[4] = 2;
        let e = probe(&t, &features, 2, &c, &Device::flex(), &|_| {}).unwrap_err().to_string();
        assert!(e.contains("no validation row of `t.parquet` has a class that train has (e.g. `c`):"), "{e}");
    }

    #[test]
    fn validation_is_the_tables_or_a_seeded_share_of_train() {
        use Split::*;
        let t = table(&[0, 1, 0, 1, 0], &[Train, Val, Test, Train, Val]);
        assert_eq!(train_val_rows(&t, 0.2, 0), (vec![0, 3], vec![1, 4], "table"));
        // No `val` rows: floor(0.2 · 13) = 2 train rows held out, the rest train; test untouched.
        let mut split = vec![Train; 13];
        split.push(Test);
        let t = table(&[0; 14], &split);
        let (train, val, from) = train_val_rows(&t, 0.2, 0);
        assert_eq!((train.len(), val.len(), from), (11, 2, "holdout"));
        let mut all: Vec<usize> = train.iter().chain(&val).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..13).collect::<Vec<_>>());
        assert_eq!(train_val_rows(&t, 0.2, 0), (train.clone(), val.clone(), "holdout"), "seeded");
        let others: Vec<Vec<usize>> = (1..6).map(|s| train_val_rows(&t, 0.2, s).1).collect();
        assert!(others.iter().any(|v| *v != val), "the seed draws the rows: {val:?} {others:?}");

        // `ssl-transfer`'s rows: `np.random.seed(0)` shuffles `list(range(10))` into
        // [2, 8, 4, 9, 1, 6, 7, 3, 0, 5] (tests/fixtures/eval/numpy_shuffle.json) and holds out
        // the first floor(0.2 · 10) = 2, the 3rd and 9th train rows, whatever the test rows
        // between them.
        let split = [Test, Train, Train, Train, Test, Train, Train, Train, Train, Train, Test, Train, Train];
        let t = table(&[0; 13], &split);
        let train_rows: Vec<usize> = (0..13).filter(|&r| split[r] == Train).collect();
        let (train, val, _) = train_val_rows(&t, 0.2, 0);
        assert_eq!(val, vec![train_rows[2], train_rows[8]]);
        assert_eq!(
            train,
            train_rows.iter().enumerate().filter(|(i, _)| ![2, 8].contains(i)).map(|(_, &r)| r).collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_test_class_never_fitted_is_a_class_of_its_own() {
        // Fitted classes 3 and 5 -> 0 and 1; test labels 9 and 4 are unseen: each gets its own
        // index past the fit's, so two unseen classes do not pool into one.
        let (y, index) = local_classes(&[5, 3, 5, 9, 4], &[0, 1, 2]);
        assert_eq!(y, [1, 0, 1]);
        let truth = truth_of(&[5, 3, 5, 9, 4], &[3, 4, 0], &index);
        assert_eq!(truth, [2 + 9, 2 + 4, 1]);
        // Predicting 1 everywhere: one of three right; per class 0, 0, 1 -> 1/3.
        assert!((mean_per_class_accuracy(&[1, 1, 1], &truth) - 1.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn the_probe_separates_separable_classes_and_reports_its_choice() {
        // Three classes at the corners of a triangle, tiny noise: any reasonable weight decay
        // classifies every row; the tie across the grid goes to the smallest decay.
        use Split::*;
        let centres = [[4.0f32, 0.0], [0.0, 4.0], [-4.0, -4.0]];
        let (mut x, mut labels, mut split) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..60 {
            let c = i % 3;
            let jitter = ((i * 7919) % 13) as f32 / 13.0 - 0.5;
            x.extend([centres[c][0] + jitter, centres[c][1] - jitter]);
            labels.push(c as u32);
            split.push([Train, Train, Train, Val, Test][(i / 3) % 5]);
        }
        let t = table(&labels, &split);
        let c = ProbeConfig { grid: vec![1e-3, 1e-2, 1e-1], ..ProbeConfig::default() };
        let m = probe(&t, &x, 2, &c, &Device::flex(), &|_| {}).unwrap();
        assert_eq!((m.accuracy, m.mean_per_class_accuracy, m.val_score, m.wd), (1.0, 1.0, 1.0, 1e-3));
        assert_eq!((m.train, m.val, m.test, m.classes, m.feature_dim, m.fits), (36, 12, 12, 3, 2, 4));
        assert_eq!((m.fits_not_converged, m.fits_without_a_step), (0, 0));
        // Classes that overlap (the minimiser is finite) times 1e15: no step from zero is
        // accepted, which the warning says (not only "float32 rounding", which at a stopping
        // point near the minimum it is).
        let far: Vec<f32> =
            x.iter().enumerate().map(|(i, v)| (v / 4.0 + ((i * 7919) % 17) as f32 / 8.0 - 1.0) * 1e15).collect();
        let m = probe(&t, &far, 2, &c, &Device::flex(), &|_| {}).unwrap();
        assert_eq!((m.fits_stalled, m.fits_without_a_step), (4, 4), "{m:?}");
        let w = warnings(&m, "sample_id");
        assert!(
            w.iter().any(|w| w.contains("4 of them took no step from zero at all") && w.contains("rescale")),
            "{w:?}"
        );
        // A non-finite feature is refused, naming its row.
        let mut bad = x.clone();
        bad[7] = f32::NAN;
        let e = probe(&t, &bad, 2, &c, &Device::flex(), &|_| {}).unwrap_err().to_string();
        assert!(e.contains("row 3 (`3.jpg`)"), "{e}");
    }
}
