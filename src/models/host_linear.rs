//! A linear layer, `x·W + b`, on burn's CPU backend as one operation (with autodiff, one autodiff
//! operation): the output, the input's gradient and the weights' gradient are one matrix product
//! each, on rayon's threads, with the bias added (and its gradient summed) on the host. burn's
//! `linear` is a product, whose output buffer burn-flex zeroes and copies, then a broadcast
//! addition, each allocating. See the `probe` test for figures. Used by the transformers' linear
//! layers (BERT, MPNet, ViT, CLIP's text tower) through [`apply`].
//!
//! The values do not depend on the number of threads (tested), and a row's output does not depend
//! on the other rows.

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::NoCheckpointing;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::flex::FlexTensor;
use burn::backend::{Autodiff, Flex};
use burn::nn::Linear;
use burn::tensor::{DType, Tensor, TensorData};
use rayon::prelude::*;

use super::host_autodiff::{contiguous, parallel_product_new, primitive};

/// `x·weight + bias` over the last axis of `x` (`[.., d_in]`, `weight` `[d_in, d_out]`, burn's
/// `Linear` layout), when every tensor is an `f32` tensor of burn's CPU backend, with autodiff
/// (`Device::flex().autodiff()`) or without (`Device::flex()`); `None` otherwise, so that the
/// caller takes burn's `linear`.
pub fn linear<const D: usize>(x: &Tensor<D>, weight: &Tensor<2>, bias: Option<&Tensor<1>>) -> Option<Tensor<D>> {
    let dims = x.dims();
    let [d_in, d_out] = weight.dims();
    if dims[D - 1] != d_in || bias.is_some_and(|b| b.dims() != [d_out]) {
        return None;
    }
    let rows = dims[..D - 1].iter().product::<usize>();
    let shape = Shape { rows, d_in, d_out };
    let mut out_dims = dims;
    out_dims[D - 1] = d_out;
    let plain = |t: FlexTensor| (t.dtype() == DType::F32).then(|| contiguous(&t));
    if let (Ok(xp), Ok(wp)) = (x.clone().try_into_primitive::<Flex>(), weight.clone().try_into_primitive::<Flex>()) {
        if wp.dtype() != DType::F32 {
            return None;
        }
        let (input, weights) = (plain(xp)?, Weights::new(wp));
        let bias = match bias {
            Some(b) => Some(plain(b.clone().try_into_primitive::<Flex>().ok()?)?),
            None => None,
        };
        let out = forward(values(&input), weights.matrix(), bias.as_ref().map(values), shape);
        return Some(Tensor::from_primitive::<Flex>(FlexTensor::from_data(TensorData::new(out, out_dims))));
    }
    let (xa, wa) = (primitive(x)?, primitive(weight)?);
    let ba = match bias {
        Some(b) => Some(primitive(b)?),
        None => None,
    };
    let (input, weights) = (contiguous(xa.primitive()), Weights::new(wa.primitive().clone()));
    let bias_values = ba.as_ref().map(|b| contiguous(b.primitive()));
    let out = forward(values(&input), weights.matrix(), bias_values.as_ref().map(values), shape);
    let out = FlexTensor::from_data(TensorData::new(out, out_dims));
    let output = match ba {
        Some(ba) => match HostLinear::<3>
            .prepare::<NoCheckpointing>([xa.node(), wa.node(), ba.node()])
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish(State { input, weights, shape }, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
        None => match HostLinear::<2>.prepare::<NoCheckpointing>([xa.node(), wa.node()]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => prep.finish(State { input, weights, shape }, out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        },
    };
    Some(Tensor::from_primitive::<Autodiff<Flex>>(output))
}

/// `l` applied to `x`: [`linear`] on burn's CPU backend, burn's `Linear::forward` elsewhere.
pub fn apply<const D: usize>(l: &Linear, x: Tensor<D>) -> Tensor<D> {
    let bias = l.bias.as_ref().map(|b| b.val());
    linear(&x, &l.weight.val(), bias.as_ref()).unwrap_or_else(|| l.forward(x))
}

/// `rows` rows of `d_in` values in, `d_out` out.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    d_in: usize,
    d_out: usize,
}

/// Rows per group of the bias's loops, fixed so that its gradient's sums do not depend on the
/// number of threads.
const ROWS: usize = 256;

fn values(t: &FlexTensor) -> &[f32] {
    t.as_slice::<f32>().expect("contiguous")
}

/// The weights as stored, read through their strides: `models::weights` loads a `Linear`
/// contiguous (rows are read fastest), but one built otherwise may hold a transposed view, and a
/// copy per call took a tenth of a MiniLM encoder's time. Copied only where a stride is not
/// positive.
#[derive(Debug, Clone)]
struct Weights {
    tensor: FlexTensor,
    offset: usize,
    row_stride: usize,
    col_stride: usize,
}

impl Weights {
    fn new(tensor: FlexTensor) -> Weights {
        let layout = tensor.layout();
        if let [rs, cs] = layout.strides() {
            if *rs > 0 && *cs > 0 {
                let (offset, row_stride, col_stride) = (layout.start_offset(), *rs as usize, *cs as usize);
                return Weights { tensor, offset, row_stride, col_stride };
            }
        }
        let tensor = contiguous(&tensor);
        let d_out = tensor.layout().shape()[1];
        Weights { tensor, offset: 0, row_stride: d_out, col_stride: 1 }
    }

    /// `(values from the first element, row stride, column stride)`.
    fn matrix(&self) -> (&[f32], usize, usize) {
        (&self.tensor.storage::<f32>()[self.offset..], self.row_stride, self.col_stride)
    }

    /// The transpose's [`Weights::matrix`].
    fn transposed(&self) -> (&[f32], usize, usize) {
        let (values, rs, cs) = self.matrix();
        (values, cs, rs)
    }
}

/// `x·W + b`, `[rows, d_out]`: one product on rayon's threads, then the bias.
fn forward(x: &[f32], w: (&[f32], usize, usize), bias: Option<&[f32]>, s: Shape) -> Vec<f32> {
    let mut out = parallel_product_new(s.rows, s.d_out, s.d_in, (x, s.d_in, 1), w);
    if let Some(b) = bias {
        out.par_chunks_mut(ROWS * s.d_out.max(1)).for_each(|out| {
            for row in out.chunks_exact_mut(s.d_out) {
                row.iter_mut().zip(b).for_each(|(o, b)| *o += b);
            }
        });
    }
    out
}

/// The backward step of [`linear`], with (`N = 3`) or without (`N = 2`) a bias.
#[derive(Debug)]
struct HostLinear<const N: usize>;

/// What the backward pass needs: the input (contiguous) and the weights.
#[derive(Debug, Clone)]
struct State {
    input: FlexTensor,
    weights: Weights,
    shape: Shape,
}

impl<const N: usize> Backward<Flex, N> for HostLinear<N> {
    type State = State;

    /// `∂x = g·Wᵀ`, `∂W = xᵀ·g` and `∂b = Σ_rows g`.
    fn backward(self, ops: Ops<State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let parents = ops.parents;
        let grad = contiguous(&grads.consume::<Flex>(&ops.node));
        let State { input, weights, shape: s } = ops.state;
        let (g, x) = (values(&grad), values(&input));
        if let Some(node) = &parents[0] {
            let gx = parallel_product_new(s.rows, s.d_in, s.d_out, (g, s.d_out, 1), weights.transposed());
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(gx, input.layout().shape().clone())));
        }
        let weight_node = &parents[1];
        let bias_node = if N == 3 { parents[2].as_ref() } else { None };
        let gw = weight_node.as_ref().map(|_| {
            // xᵀ: element (i, r) of `[d_in, rows]` at r·d_in + i.
            parallel_product_new(s.d_in, s.d_out, s.rows, (x, 1, s.d_in), (g, s.d_out, 1))
        });
        // ∂b: per group of rows its column sums, added in group order.
        let gb = bias_node.map(|_| {
            let shares: Vec<Vec<f32>> = g
                .par_chunks(ROWS * s.d_out.max(1))
                .map(|g| {
                    let mut gb = vec![0f32; s.d_out];
                    for row in g.chunks_exact(s.d_out) {
                        gb.iter_mut().zip(row).for_each(|(b, g)| *b += g);
                    }
                    gb
                })
                .collect();
            let mut gb = vec![0f32; s.d_out];
            for share in shares {
                gb.iter_mut().zip(share).for_each(|(a, v)| *a += v);
            }
            gb
        });
        if let (Some(node), Some(gw)) = (weight_node, gw) {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(gw, [s.d_in, s.d_out])));
        }
        if let (Some(node), Some(gb)) = (bias_node, gb) {
            grads.register::<Flex>(node.id, FlexTensor::from_data(TensorData::new(gb, [s.d_out])));
        }
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, Distribution, Tensor};

    use crate::models::test_support::{assert_close, values};

    /// The output and the gradients of the input, the weights and the bias (of a weighted sum of
    /// the output) equal burn's `linear`: with and without a bias, 2-d and 3-d inputs, one group
    /// of rows and several (the last one short), a strided (transposed) input and weights, an
    /// input without a gradient; and without autodiff, the output alone.
    #[test]
    fn equals_burns_linear() {
        for autodiff in [true, false] {
            let device = if autodiff { Device::flex().autodiff() } else { Device::flex() };
            for (batch, tokens, d_in, d_out, with_bias, transposed, grad_x) in [
                (3, 1, 5, 4, true, false, true),
                (2, 7, 6, 3, false, false, true),
                (9, 70, 16, 24, true, false, true),
                (5, 3, 8, 8, true, true, true),
                (4, 100, 12, 5, true, false, false),
            ] {
                let rows = [batch, tokens, d_in];
                let x = if transposed {
                    Tensor::<3>::random([batch, d_in, tokens], Distribution::Normal(0.0, 1.0), &device).swap_dims(1, 2)
                } else {
                    Tensor::<3>::random(rows, Distribution::Normal(0.0, 1.0), &device)
                };
                let x = if grad_x && autodiff { x.detach().require_grad() } else { x };
                let w = if transposed {
                    Tensor::<2>::random([d_out, d_in], Distribution::Normal(0.0, 0.5), &device).transpose()
                } else {
                    Tensor::<2>::random([d_in, d_out], Distribution::Normal(0.0, 0.5), &device)
                };
                let w = if autodiff { w.detach().require_grad() } else { w };
                let b = Tensor::<1>::random([d_out], Distribution::Normal(0.0, 0.5), &device);
                let b = if autodiff { b.require_grad() } else { b };
                let bias = with_bias.then_some(&b);
                let what = format!("[{batch}, {tokens}, {d_in}] -> {d_out} bias {with_bias} transposed {transposed} autodiff {autodiff}");
                let got = super::linear(&x, &w, bias).expect("the host path on the flex device");
                let want = burn::tensor::module::linear(x.clone(), w.clone(), bias.cloned());
                assert_close(&values(got.clone()), &values(want.clone()), 1e-5, &format!("output {what}"));
                // A row's output does not depend on the other rows.
                let alone = super::linear(&x.clone().slice([batch - 1..batch, 0..tokens, 0..d_in]), &w, bias).unwrap();
                assert_eq!(values(alone), values(got.clone().slice([batch - 1..batch, 0..tokens, 0..d_out])), "{what}");
                if !autodiff {
                    continue;
                }
                let weights = Tensor::<3>::random(want.dims(), Distribution::Normal(0.0, 1.0), &device);
                let gradients = |out: Tensor<3>| {
                    let g = (out * weights.clone()).sum().backward();
                    [
                        x.grad(&g).map(values),
                        w.grad(&g).map(values),
                        with_bias.then(|| b.grad(&g).map(values)).flatten(),
                    ]
                };
                for (name, (a, e)) in
                    ["x", "weight", "bias"].iter().zip(gradients(got).into_iter().zip(gradients(want)))
                {
                    assert_eq!(a.is_some(), e.is_some(), "{name} gradient present {what}");
                    if let (Some(a), Some(e)) = (a, e) {
                        assert_close(&a, &e, 1e-4, &format!("{name} gradient {what}"));
                    }
                }
            }
        }
    }

    /// Weights of another width, a bias of another length and tensors that are not `f32` are
    /// declined, and [`super::apply`] then takes burn's `Linear::forward`.
    #[test]
    fn declines_what_it_does_not_cover() {
        for device in [Device::flex(), Device::flex().autodiff()] {
            let x = Tensor::<2>::random([3, 4], Distribution::Normal(0.0, 1.0), &device);
            let w = Tensor::<2>::random([4, 2], Distribution::Normal(0.0, 1.0), &device);
            let b = Tensor::<1>::random([2], Distribution::Normal(0.0, 1.0), &device);
            assert!(super::linear(&x, &w, Some(&b)).is_some());
            assert!(super::linear(&x, &w.clone().slice([0..3, 0..2]), Some(&b)).is_none());
            assert!(super::linear(&x, &w, Some(&b.clone().narrow(0, 0, 1))).is_none());
            let half = burn::tensor::DType::F16;
            assert!(super::linear(&x.clone().cast(half), &w.clone().cast(half), None).is_none());
        }
    }

    /// The output and every gradient are the same, bit for bit, on 1 and on 3 threads (gemm
    /// splits the products among the threads by output tiles), on shapes large enough for gemm to
    /// split them.
    #[test]
    fn values_do_not_depend_on_the_thread_count() {
        let device = Device::flex().autodiff();
        let x = Tensor::<2>::random([700, 300], Distribution::Normal(0.0, 1.0), &device).require_grad();
        let w = Tensor::<2>::random([300, 500], Distribution::Normal(0.0, 0.1), &device).require_grad();
        let b = Tensor::<1>::random([500], Distribution::Normal(0.0, 0.1), &device).require_grad();
        let weights = Tensor::<2>::random([700, 500], Distribution::Normal(0.0, 1.0), &device);
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            pool.install(|| {
                let out = super::linear(&x, &w, Some(&b)).unwrap();
                let g = (out.clone() * weights.clone()).sum().backward();
                [values(out), values(x.grad(&g).unwrap()), values(w.grad(&g).unwrap()), values(b.grad(&g).unwrap())]
            })
        };
        assert!(run(1) == run(3), "values differ between 1 and 3 threads");
    }

    /// Timing probe (not a test of anything): the demo text tower's linear layers (batch 64, 32
    /// tokens, width 64, feed-forward 256) and MiniLM's (width 384, feed-forward 1536), forward
    /// and backward, then forward alone without autodiff, this operation against burn's `linear`: `cargo test --release --lib
    /// host_linear::tests::probe -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn probe() {
        for training in [true, false] {
            let device = if training { Device::flex().autodiff() } else { Device::flex() };
            for (rows, d_in, d_out) in [(2048, 64, 64), (2048, 64, 256), (2048, 256, 64), (4096, 384, 1536)] {
                let tracked = |t: Tensor<2>| if training { t.require_grad() } else { t };
                let x = tracked(Tensor::<2>::random([rows, d_in], Distribution::Normal(0.0, 1.0), &device));
                let w = tracked(Tensor::<2>::random([d_in, d_out], Distribution::Normal(0.0, 0.1), &device));
                let b = Tensor::<1>::random([d_out], Distribution::Normal(0.0, 0.1), &device);
                let b = if training { b.require_grad() } else { b };
                for host in [true, false, true, false] {
                    let t = std::time::Instant::now();
                    let iters = 20;
                    for _ in 0..iters {
                        let out = if host {
                            super::linear(&x, &w, Some(&b)).unwrap()
                        } else {
                            burn::tensor::module::linear(x.clone(), w.clone(), Some(b.clone()))
                        };
                        if training {
                            let g = out.sum().backward();
                            let _ = w.grad(&g);
                        }
                    }
                    let ms = t.elapsed().as_secs_f64() * 1e3 / iters as f64;
                    eprintln!("[{rows}, {d_in}] -> {d_out} training {training} host {host}: {ms:.3} ms");
                }
            }
        }
    }
}
