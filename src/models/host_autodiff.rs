//! What the host operations (`host_batch_norm`, `host_conv`, `losses::bank_log_sum_exp`) share: a
//! tensor of burn's CPU backend under autodiff taken as its primitive (the values and the autodiff
//! node), a primitive's values in one contiguous run, and a matrix product on the calling thread
//! (and, for `host_linear`, on rayon's threads).

use std::mem::MaybeUninit;

use burn::backend::flex::FlexTensor;
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Flex};
use burn::tensor::{DType, Tensor};

/// A float tensor of burn's CPU backend under autodiff (without gradient checkpointing).
pub(crate) type Primitive = FloatTensor<Autodiff<Flex>>;

/// `t`'s primitive when `t` is an `f32` tensor of burn's CPU backend under autodiff (what
/// `Device::flex().autodiff()` makes); `None` otherwise (another device, no autodiff, another
/// type), so that the caller takes burn's operation.
pub(crate) fn primitive<const D: usize>(t: &Tensor<D>) -> Option<Primitive> {
    let p = t.clone().try_into_primitive::<Autodiff<Flex>>().ok()?;
    (p.primitive().dtype() == DType::F32).then_some(p)
}

/// `t` with its values in one contiguous run (a copy only where `t` is a strided view).
pub(crate) fn contiguous(t: &FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t.clone()
    } else {
        t.to_contiguous()
    }
}

/// `dst (m×n, rows dst_rs apart) = a (m×k) · b (k×n)`, `a` and `b` given by their row and
/// column strides, on the calling thread.
pub(crate) fn product(
    dst: &mut [f32],
    dst_rs: usize,
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
) {
    product_on(gemm::Parallelism::None, as_uninit(dst), dst_rs, m, n, k, a, b)
}

/// [`product`] on rayon's threads, into a new dense `m × n` vector: gemm splits the output into
/// tiles among the threads, and each tile sums over the whole inner dimension in the same blocks,
/// so the values do not depend on the number of threads (tested in `host_linear`). The vector is
/// not zeroed first, as every value is written by the product (or is 0 when `k` is 0): zeroing a
/// fresh output took 3% of a MiniLM encoder's CPU samples.
pub(crate) fn parallel_product_new(
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
) -> Vec<f32> {
    let len = m * n;
    let mut out = Vec::with_capacity(len);
    product_on(gemm::Parallelism::Rayon(0), &mut out.spare_capacity_mut()[..len], n, m, n, k, a, b);
    // SAFETY: with rows `n` apart, `product_on` wrote all `m·n` values (see there).
    unsafe { out.set_len(len) };
    out
}

/// `dst` as a slice of possibly uninitialised values, for [`product_on`], which writes only
/// initialised `f32` values into it.
fn as_uninit(dst: &mut [f32]) -> &mut [MaybeUninit<f32>] {
    // SAFETY: `MaybeUninit<f32>` has `f32`'s layout; the only writer (`product_on`) stores
    // initialised values, so `dst` stays initialised.
    unsafe { &mut *(dst as *mut [f32] as *mut [MaybeUninit<f32>]) }
}

/// `dst (m×n, rows dst_rs apart) = a · b`: each of the `m·n` values written, none read.
#[allow(clippy::too_many_arguments)]
fn product_on(
    parallelism: gemm::Parallelism,
    dst: &mut [MaybeUninit<f32>],
    dst_rs: usize,
    m: usize,
    n: usize,
    k: usize,
    a: (&[f32], usize, usize),
    b: (&[f32], usize, usize),
) {
    let last = |rows: usize, cols: usize, rs: usize, cs: usize| (rows - 1) * rs + (cols - 1) * cs;
    if m == 0 || n == 0 {
        return;
    }
    assert!(last(m, n, dst_rs, 1) < dst.len(), "product: dst out of bounds");
    if k == 0 {
        for r in 0..m {
            dst[r * dst_rs..r * dst_rs + n].fill(MaybeUninit::new(0.0));
        }
        return;
    }
    assert!(last(m, k, a.1, a.2) < a.0.len() && last(k, n, b.1, b.2) < b.0.len(), "product: an operand out of bounds");
    // SAFETY: every element gemm reads (a: r·a_rs + i·a_cs, b: i·b_rs + j·b_cs) and writes (dst:
    // r·dst_rs + j) lies within its slice by the asserts above; `dst` is a distinct `&mut` and so
    // aliases neither operand; it is written only (read_dst = false, so alpha is ignored).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr().cast::<f32>(),
            1,
            dst_rs as isize,
            false,
            a.0.as_ptr(),
            a.2 as isize,
            a.1 as isize,
            b.0.as_ptr(),
            b.2 as isize,
            b.1 as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

#[cfg(test)]
mod tests {
    /// A new product's every value is written: equal to a naive product, on shapes gemm tiles
    /// unevenly (and after a freed buffer of garbage that the allocator may hand back), and all
    /// zeros over an empty inner dimension.
    #[test]
    fn a_new_product_writes_every_value() {
        for (m, n, k) in [(1, 1, 1), (7, 5, 3), (33, 17, 9), (64, 48, 1), (5, 6, 0)] {
            drop(vec![f32::NAN; m * n]);
            let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.5).collect();
            let got = super::parallel_product_new(m, n, k, (&a, k, 1), (&b, n, 1));
            let want: Vec<f32> =
                (0..m * n).map(|i| (0..k).map(|t| a[(i / n) * k + t] * b[t * n + i % n]).sum()).collect();
            assert_eq!(got, want, "{m}×{n}×{k}");
        }
    }
}
