//! The losses of `src/losses/` against their PyTorch transcriptions: values and input gradients
//! from `tests/fixtures/losses/make_loss_fixtures.py` (float64 reference on float32 inputs),
//! plus the spec's own test vectors (`cusa-and-pcmepp.md` §2.9, §3.13) and small cases worked
//! out by hand in the comments.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use burn::tensor::{Device, Tensor, TensorData};
use curate::losses::common::{scalar, value, DirectionReduction};
use curate::losses::infonce::infonce;
use serde_json::Value;

/// Relative tolerance of every comparison: `|got − want| ≤ RTOL · (|want| + max|want|)`, the
/// second term so that near-zero gradient entries are judged on the scale of their tensor.
const RTOL: f64 = 1e-5;

fn fixtures() -> &'static Value {
    static F: OnceLock<Value> = OnceLock::new();
    F.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/losses/loss_fixtures.json");
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    })
}

fn cases(loss: &str) -> Vec<&'static Value> {
    let all: Vec<&Value> = fixtures()["cases"].as_array().unwrap().iter().filter(|c| c["loss"] == loss).collect();
    assert!(!all.is_empty(), "no fixture cases for `{loss}`");
    all
}

fn device() -> Device {
    Device::flex().autodiff()
}

/// Flattens nested JSON arrays into (values, shape).
fn flat(v: &Value) -> (Vec<f64>, Vec<usize>) {
    match v {
        Value::Array(items) => {
            let mut data = Vec::new();
            let mut inner = Vec::new();
            for item in items {
                let (d, s) = flat(item);
                data.extend(d);
                inner = s;
            }
            let mut shape = vec![items.len()];
            shape.extend(inner);
            (data, shape)
        }
        Value::Number(n) => (vec![n.as_f64().unwrap()], vec![]),
        other => panic!("not a number array: {other}"),
    }
}

fn tensor<const D: usize>(v: &Value, grad: bool) -> Tensor<D> {
    let (data, shape) = flat(v);
    let data: Vec<f32> = data.into_iter().map(|x| x as f32).collect();
    let t = Tensor::<D>::from_data(TensorData::new(data, shape), &device());
    if grad {
        t.require_grad()
    } else {
        t
    }
}

/// Largest error of `got` against `want`, absolute and relative to the tolerance scale; panics
/// past [`RTOL`].
fn check(got: &[f32], want: &Value, what: &str) -> f64 {
    let (want, _) = flat(want);
    assert_eq!(got.len(), want.len(), "{what}: size");
    let scale = want.iter().fold(0f64, |m, x| m.max(x.abs()));
    let mut worst = 0f64;
    for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
        let err = (g as f64 - w).abs() / (w.abs() + scale).max(f64::MIN_POSITIVE);
        assert!(err <= RTOL, "{what}[{i}]: {g} vs {w} (relative error {err:.2e})");
        worst = worst.max(err);
    }
    worst
}

fn data<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().try_to_vec::<f32>().unwrap()
}

/// Records the worst relative errors per loss (printed with `--nocapture`).
#[derive(Default)]
struct Report(BTreeMap<String, (f64, f64)>);

impl Report {
    fn value(&mut self, c: &Value, key: &str, got: &Tensor<1>) {
        let e = check(&[value(got)], &c["values"][key], &format!("{} {key}", c["name"]));
        let entry = self.0.entry(c["loss"].as_str().unwrap().to_string()).or_default();
        entry.0 = entry.0.max(e);
    }
    fn grad<const D: usize>(&mut self, c: &Value, key: &str, got: Option<Tensor<D>>) {
        let got = got.unwrap_or_else(|| panic!("{}: no gradient for `{key}`", c["name"]));
        let e = check(&data(got), &c["grads"][key], &format!("{} d/d{key}", c["name"]));
        let entry = self.0.entry(c["loss"].as_str().unwrap().to_string()).or_default();
        entry.1 = entry.1.max(e);
    }
}

impl Drop for Report {
    fn drop(&mut self) {
        for (loss, (v, g)) in &self.0 {
            println!("{loss}: max relative error value {v:.2e}, gradients {g:.2e}");
        }
    }
}

fn reduction(c: &Value) -> DirectionReduction {
    serde_json::from_value(c["params"]["reduction"].clone()).unwrap()
}

#[test]
fn infonce_matches_pytorch() {
    // def infonce(image, text, theta, reduction):
    //     a = theta.exp().clamp(1, 100) * normalize(image) @ normalize(text).T
    //     i2t, t2i = F.cross_entropy(a, arange(B)), F.cross_entropy(a.T, arange(B))
    //     return (i2t + t2i) / 2 if reduction == "mean" else i2t + t2i
    let mut report = Report::default();
    for c in cases("infonce") {
        let image = tensor::<2>(&c["inputs"]["image"], true);
        let text = tensor::<2>(&c["inputs"]["text"], true);
        let theta = tensor::<1>(&c["inputs"]["theta"], true);
        let scale = theta.clone().exp().clamp(1.0, 100.0);
        let loss = infonce(image.clone(), text.clone(), scale, reduction(c));
        report.value(c, "loss", &loss);
        let grads = loss.backward();
        report.grad(c, "image", image.grad(&grads));
        report.grad(c, "text", text.grad(&grads));
        report.grad(c, "theta", theta.grad(&grads));
    }
}

#[test]
fn infonce_two_pairs_by_hand() {
    // B = 2, U = [[1, 0], [0, 1]], V = [[1, 0], [0.6, 0.8]], s = 10:
    // A = 10·U Vᵀ = [[10, 6], [0, 8]].
    // i2t rows: ln(1 + e⁻⁴) = 0.0181499, ln(1 + e⁻⁸) = 0.000335406 → mean 0.00924266
    // t2i rows (Aᵀ = [[10, 0], [6, 8]]): ln(1 + e⁻¹⁰) = 4.53989e-5, ln(1 + e⁻²) = 0.126928 → 0.0634868
    // mean of the directions: 0.0363647
    let d = Device::flex();
    let u = Tensor::<2>::from_data(TensorData::new(vec![1f32, 0.0, 0.0, 1.0], [2, 2]), &d);
    let v = Tensor::<2>::from_data(TensorData::new(vec![1f32, 0.0, 0.6, 0.8], [2, 2]), &d);
    let i2t = ((1f64 + (-4f64).exp()).ln() + (1f64 + (-8f64).exp()).ln()) / 2.0;
    let t2i = ((1f64 + (-10f64).exp()).ln() + (1f64 + (-2f64).exp()).ln()) / 2.0;
    let l = infonce(u, v, scalar(10.0, &d), DirectionReduction::Mean);
    assert!((value(&l) as f64 - (i2t + t2i) / 2.0).abs() < 1e-7, "{}", value(&l));
    assert!(((i2t + t2i) / 2.0 - 0.0363647).abs() < 1e-6);
}
