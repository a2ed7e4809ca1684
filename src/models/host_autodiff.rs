//! What the host operations (`host_batch_norm`, `host_conv`) share: a tensor of burn's CPU backend
//! under autodiff taken as its primitive (the values and the autodiff node), and a primitive's
//! values in one contiguous run.

use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor};

/// A float tensor of burn's CPU backend under autodiff (without gradient checkpointing).
pub(super) type Primitive = FloatTensor<Autodiff<Flex>>;

/// `t`'s primitive when `t` is an `f32` tensor of burn's CPU backend under autodiff (what
/// `Device::flex().autodiff()` makes); `None` otherwise (another device, no autodiff, another
/// type), so that the caller takes burn's operation.
pub(super) fn primitive<const D: usize>(t: &Tensor<D>) -> Option<Primitive> {
    let p = t.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    (p.primitive().dtype() == DType::F32).then_some(p)
}

/// `t` with its values in one contiguous run (a copy only where `t` is a strided view).
pub(super) fn contiguous(t: &FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t.clone()
    } else {
        t.to_contiguous()
    }
}
