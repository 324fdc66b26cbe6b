//! MatMul (with transpose flags) and BatchMatMul (broadcast batch dims), forward and gradients.
//! Every product goes through the backend GEMM; transposes are stride swaps, never copies.

use ndarray::{ArrayD, ArrayView2, ArrayViewD, Axis, Ix2, IxDyn};
use rayon::prelude::*;

use super::{float_dispatch, same_dtype};
use crate::kernels::elementwise::reduce_to_shape_impl;
use crate::tensor::broadcast_shapes;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

fn as2<'a, T>(a: ArrayViewD<'a, T>, t: bool) -> ArrayView2<'a, T> {
    let m = a.into_dimensionality::<Ix2>().expect("rank checked");
    if t {
        m.reversed_axes()
    } else {
        m
    }
}

fn check_rank(op: &'static str, what: &'static str, t: &Tensor, rank: usize) -> Result<()> {
    if t.rank() != rank {
        return Err(TensorError::BadShape { op, what, shape: t.shape().to_vec(), expected: format!("rank {rank}") });
    }
    Ok(())
}

/// The contraction sizes `k` of `op(a)` and `op(b)` agree, else [`TensorError::InnerDimMismatch`].
fn inner_dims_agree(a: &Tensor, b: &Tensor, (k_lhs, k_rhs): (usize, usize), (transpose_a, transpose_b): (bool, bool)) -> Result<()> {
    if k_lhs == k_rhs {
        return Ok(());
    }
    Err(TensorError::InnerDimMismatch {
        op: "matmul",
        lhs: a.shape().to_vec(),
        rhs: b.shape().to_vec(),
        k_lhs,
        k_rhs,
        transpose_a,
        transpose_b,
    })
}

/// `op(a) @ op(b)` where `op` transposes when the flag is set. `a`, `b` are 2-D: f32, f64, or
/// bf16 (accumulated in f32 by [`super::bf16_gemm`], the result rounded to bf16).
pub fn matmul(ctx: &ExecCtx, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    let op = "matmul";
    same_dtype(op, "rhs", a, b)?;
    check_rank(op, "lhs", a, 2)?;
    check_rank(op, "rhs", b, 2)?;
    if a.dtype() == crate::DType::BF16 {
        let x = as2(a.typed::<half::bf16>(op, "lhs")?, transpose_a);
        let y = as2(b.typed::<half::bf16>(op, "rhs")?, transpose_b);
        inner_dims_agree(a, b, (x.ncols(), y.nrows()), (transpose_a, transpose_b))?;
        let c = super::bf16_gemm::gemm_bf16(ctx, x, y);
        return Ok(Tensor::from_array(c.mapv(half::bf16::from_f32).into_dyn()));
    }
    float_dispatch!(op, a.dtype(), T => {
        let x = as2(a.typed::<T>(op, "lhs")?, transpose_a);
        let y = as2(b.typed::<T>(op, "rhs")?, transpose_b);
        inner_dims_agree(a, b, (x.ncols(), y.nrows()), (transpose_a, transpose_b))?;
        Ok(Tensor::from_array(ctx.gemm_new(x, y).into_dyn()))
    })
}

/// Gradient of [`matmul`] w.r.t. `a` (same shape as `a`).
pub fn matmul_grad_a(ctx: &ExecCtx, b: &Tensor, dy: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    // C = op(A) op(B):  d op(A) = dC op(B)^T;  dA = (d op(A))^T if transpose_a.
    match (transpose_a, transpose_b) {
        (false, false) => matmul(ctx, dy, b, false, true),
        (false, true) => matmul(ctx, dy, b, false, false),
        (true, false) => matmul(ctx, b, dy, false, true),
        (true, true) => matmul(ctx, b, dy, true, true),
    }
}

/// Gradient of [`matmul`] w.r.t. `b` (same shape as `b`).
pub fn matmul_grad_b(ctx: &ExecCtx, a: &Tensor, dy: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    match (transpose_a, transpose_b) {
        (false, false) => matmul(ctx, a, dy, true, false),
        (false, true) => matmul(ctx, dy, a, true, false),
        (true, false) => matmul(ctx, a, dy, false, false),
        (true, true) => matmul(ctx, dy, a, true, true),
    }
}

/// Both gradients of [`matmul`]: `(da, db)`.
pub fn matmul_grads(ctx: &ExecCtx, a: &Tensor, b: &Tensor, dy: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<(Tensor, Tensor)> {
    Ok((matmul_grad_a(ctx, b, dy, transpose_a, transpose_b)?, matmul_grad_b(ctx, a, dy, transpose_a, transpose_b)?))
}

fn batch_impl<T: Float>(
    ctx: &ExecCtx,
    x: ArrayViewD<'_, T>,
    y: ArrayViewD<'_, T>,
    ta: bool,
    tb: bool,
    shapes: (&[usize], &[usize]),
) -> Result<ArrayD<T>> {
    let op = "batch_matmul";
    let (ra, rb) = (x.ndim(), y.ndim());
    let batch = broadcast_shapes(&x.shape()[..ra - 2], &y.shape()[..rb - 2]).ok_or_else(|| TensorError::IncompatibleShapes {
        op,
        lhs: shapes.0.to_vec(),
        rhs: shapes.1.to_vec(),
        reason: "batch dimensions are not broadcastable",
    })?;
    let (m, k) = if ta { (x.shape()[ra - 1], x.shape()[ra - 2]) } else { (x.shape()[ra - 2], x.shape()[ra - 1]) };
    let (k2, n) = if tb { (y.shape()[rb - 1], y.shape()[rb - 2]) } else { (y.shape()[rb - 2], y.shape()[rb - 1]) };
    if k != k2 {
        return Err(TensorError::InnerDimMismatch {
            op,
            lhs: shapes.0.to_vec(),
            rhs: shapes.1.to_vec(),
            k_lhs: k,
            k_rhs: k2,
            transpose_a: ta,
            transpose_b: tb,
        });
    }
    let mut xs = batch.clone();
    xs.extend_from_slice(&x.shape()[ra - 2..]);
    let mut ys = batch.clone();
    ys.extend_from_slice(&y.shape()[rb - 2..]);
    let xb = x.broadcast(IxDyn(&xs)).expect("checked");
    let yb = y.broadcast(IxDyn(&ys)).expect("checked");
    let nb: usize = batch.iter().product();
    let mut out_shape = batch.clone();
    out_shape.extend_from_slice(&[m, n]);
    let mut out = ArrayD::<T>::zeros(IxDyn(&out_shape));
    let bdims = batch.len();
    fn sub<'v, T: Float>(v: &ArrayViewD<'v, T>, batch: &[usize], mut i: usize) -> ArrayViewD<'v, T> {
        let bdims = batch.len();
        let mut s = v.clone();
        for d in (0..bdims).rev() {
            let size = batch[d];
            s.collapse_axis(Axis(d), i % size);
            i /= size;
        }
        s
    }
    let work: Vec<(ArrayViewD<'_, T>, ArrayViewD<'_, T>)> = (0..nb).map(|i| (sub(&xb, &batch, i), sub(&yb, &batch, i))).collect();
    let mut flat = out.view_mut().into_shape_with_order(IxDyn(&[nb, m, n])).expect("fresh array");
    let one = |(pa, pb): &(ArrayViewD<'_, T>, ArrayViewD<'_, T>), mut o: ndarray::ArrayViewMut2<'_, T>, serial: bool| {
        let a2 = squeeze2(pa.clone(), bdims, ta);
        let b2 = squeeze2(pb.clone(), bdims, tb);
        if serial {
            ctx.gemm_serial(a2, b2, o.view_mut(), false)
        } else {
            ctx.gemm(a2, b2, o.view_mut(), false)
        }
    };
    if nb > 1 && ctx.is_parallel() && rayon::current_num_threads() > 1 {
        flat.axis_iter_mut(Axis(0)).into_par_iter().zip(work.par_iter()).for_each(|(o, w)| {
            one(w, o.into_dimensionality::<Ix2>().expect("2-D"), true);
        });
    } else {
        for (o, w) in flat.axis_iter_mut(Axis(0)).zip(work.iter()) {
            one(w, o.into_dimensionality::<Ix2>().expect("2-D"), nb > 1);
        }
    }
    Ok(out)
}

fn squeeze2<T: Float>(v: ArrayViewD<'_, T>, bdims: usize, t: bool) -> ArrayView2<'_, T> {
    let mut v = v;
    for _ in 0..bdims {
        v = v.index_axis_move(Axis(0), 0);
    }
    as2(v, t)
}

/// Output shape of [`batch_matmul`]: broadcast batch dims, then `[m, n]`.
pub fn batch_matmul_shape(a: &[usize], b: &[usize], transpose_a: bool, transpose_b: bool) -> Result<Vec<usize>> {
    let op = "batch_matmul";
    for (what, s) in [("lhs", a), ("rhs", b)] {
        if s.len() < 2 {
            return Err(TensorError::BadShape { op, what, shape: s.to_vec(), expected: "rank >= 2".into() });
        }
    }
    let (ra, rb) = (a.len(), b.len());
    let (m, k) = if transpose_a { (a[ra - 1], a[ra - 2]) } else { (a[ra - 2], a[ra - 1]) };
    let (k2, n) = if transpose_b { (b[rb - 1], b[rb - 2]) } else { (b[rb - 2], b[rb - 1]) };
    if k != k2 {
        return Err(TensorError::InnerDimMismatch { op, lhs: a.to_vec(), rhs: b.to_vec(), k_lhs: k, k_rhs: k2, transpose_a, transpose_b });
    }
    let mut out = broadcast_shapes(&a[..ra - 2], &b[..rb - 2]).ok_or_else(|| TensorError::IncompatibleShapes {
        op,
        lhs: a.to_vec(),
        rhs: b.to_vec(),
        reason: "batch dimensions are not broadcastable",
    })?;
    out.extend_from_slice(&[m, n]);
    Ok(out)
}

/// BatchMatMul: `op(a) @ op(b)` over the trailing two dims, batch dims broadcast (NumPy rules).
pub fn batch_matmul(ctx: &ExecCtx, a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor> {
    let op = "batch_matmul";
    same_dtype(op, "rhs", a, b)?;
    for (what, t) in [("lhs", a), ("rhs", b)] {
        if t.rank() < 2 {
            return Err(TensorError::BadShape { op, what, shape: t.shape().to_vec(), expected: "rank >= 2".into() });
        }
    }
    float_dispatch!(op, a.dtype(), T => {
        let out = batch_impl(ctx, a.typed::<T>(op, "lhs")?, b.typed::<T>(op, "rhs")?, transpose_a, transpose_b, (a.shape(), b.shape()))?;
        Ok(Tensor::from_array(out))
    })
}

/// Both gradients of [`batch_matmul`], reduced over broadcast batch dims to the inputs' shapes.
pub fn batch_matmul_grads(
    ctx: &ExecCtx,
    a: &Tensor,
    b: &Tensor,
    dy: &Tensor,
    transpose_a: bool,
    transpose_b: bool,
) -> Result<(Tensor, Tensor)> {
    let op = "batch_matmul";
    same_dtype(op, "rhs", a, b)?;
    same_dtype(op, "output gradient", a, dy)?;
    let expected = batch_matmul_shape(a.shape(), b.shape(), transpose_a, transpose_b)?;
    super::same_shape(op, &expected, dy.shape(), "output gradient must have the output's shape")?;
    float_dispatch!(op, a.dtype(), T => {
        let (x, y, g) = (a.typed::<T>(op, "lhs")?, b.typed::<T>(op, "rhs")?, dy.typed::<T>(op, "output gradient")?);
        let (ga, gb) = match (transpose_a, transpose_b) {
            (false, false) => (batch_impl(ctx, g.clone(), y, false, true, (dy.shape(), b.shape()))?, batch_impl(ctx, x, g, true, false, (a.shape(), dy.shape()))?),
            (false, true) => (batch_impl(ctx, g.clone(), y, false, false, (dy.shape(), b.shape()))?, batch_impl(ctx, g, x, true, false, (dy.shape(), a.shape()))?),
            (true, false) => (batch_impl(ctx, y, g.clone(), false, true, (b.shape(), dy.shape()))?, batch_impl(ctx, x, g, false, false, (a.shape(), dy.shape()))?),
            (true, true) => (batch_impl(ctx, y, g.clone(), true, true, (b.shape(), dy.shape()))?, batch_impl(ctx, g, x, true, true, (dy.shape(), a.shape()))?),
        };
        Ok((
            Tensor::from_array(reduce_to_shape_impl(ctx, ga.view(), a.shape())),
            Tensor::from_array(reduce_to_shape_impl(ctx, gb.view(), b.shape())),
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::shape::{slice_axis, transpose};

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::from_vec(shape, v.to_vec()).unwrap()
    }
    fn cx() -> ExecCtx {
        ExecCtx::serial()
    }

    #[test]
    fn matmul_matches_the_hand_product_for_every_transpose_flag() {
        let a = t(&[2, 2], &[1., 2., 3., 4.]);
        let b = t(&[2, 2], &[5., 6., 7., 8.]);
        let c = |ta, tb| matmul(&cx(), &a, &b, ta, tb).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(c(false, false), vec![19., 22., 43., 50.]);
        assert_eq!(c(true, false), vec![26., 30., 38., 44.]);
        assert_eq!(c(false, true), vec![17., 23., 39., 53.]);
        assert_eq!(c(true, true), vec![23., 31., 34., 46.]);
    }

    #[test]
    fn matmul_matches_a_naive_product_for_operands_large_enough_to_be_repacked() {
        let (m, k, n) = (40, 30, 20);
        let a = crate::random::uniform(&[m, k], -1., 1., 1, crate::DType::F64);
        let b = crate::random::uniform(&[k, n], -1., 1., 2, crate::DType::F64);
        let (av, bv) = (a.to_vec::<f64>().unwrap(), b.to_vec::<f64>().unwrap());
        let mut want = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] = (0..k).map(|p| av[i * k + p] * bv[p * n + j]).sum();
            }
        }
        let at = transpose(&a, &[1, 0]).unwrap().contiguous();
        let bt = transpose(&b, &[1, 0]).unwrap().contiguous();
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            let x = if ta { &at } else { &a };
            let y = if tb { &bt } else { &b };
            let got = matmul(&cx(), x, y, ta, tb).unwrap().to_vec::<f64>().unwrap();
            assert!(got.iter().zip(&want).all(|(p, q)| (p - q).abs() < 1e-12), "ta={ta} tb={tb}");
        }
    }

    #[test]
    fn matmul_reads_strided_views_without_copying_them_first() {
        let big = crate::random::uniform(&[6, 8], -1., 1., 3, crate::DType::F64);
        let a = slice_axis(&transpose(&big, &[1, 0]).unwrap(), 0, 2, 7).unwrap(); // [5, 6], strided
        let b = crate::random::uniform(&[6, 3], -1., 1., 4, crate::DType::F64);
        let strided = matmul(&cx(), &a, &b, false, false).unwrap();
        let dense = matmul(&cx(), &a.contiguous(), &b, false, false).unwrap();
        assert!(strided.allclose(&dense, 1e-12, 1e-12));
    }

    #[test]
    fn matmul_reports_differing_inner_dimensions() {
        let e = matmul(&cx(), &t(&[2, 3], &[0.; 6]), &t(&[2, 3], &[0.; 6]), false, false).unwrap_err();
        assert!(matches!(e, TensorError::InnerDimMismatch { op: "matmul", k_lhs: 3, k_rhs: 2, .. }));
        assert!(e.to_string().starts_with("matmul: inner dimensions 3 and 2 differ"));
        assert!(matmul(&cx(), &t(&[2, 3], &[0.; 6]), &t(&[2, 3], &[0.; 6]), false, true).is_ok());
        assert!(matches!(matmul(&cx(), &t(&[6], &[0.; 6]), &t(&[6], &[0.; 6]), false, false), Err(TensorError::BadShape { .. })));
    }

    #[test]
    fn batch_matmul_broadcasts_batch_dimensions() {
        let a = t(&[2, 1, 1, 2], &[1., 2., 3., 4.]);
        let b = t(&[3, 2, 1], &[1., 0., 0., 1., 1., 1.]);
        let c = batch_matmul(&cx(), &a, &b, false, false).unwrap();
        assert_eq!(c.shape(), &[2, 3, 1, 1]);
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![1., 2., 3., 3., 4., 7.]);
        assert_eq!(batch_matmul_shape(&[2, 1, 1, 2], &[3, 2, 1], false, false).unwrap(), vec![2, 3, 1, 1]);
        assert!(batch_matmul_shape(&[2, 2, 3], &[3, 3, 2], false, false).is_err());
        assert!(batch_matmul(&cx(), &a, &t(&[3, 3, 1], &[0.; 9]), false, false).is_err());
    }

    #[test]
    fn empty_inner_dimension_gives_zeros() {
        let c =
            matmul(&cx(), &Tensor::zeros(&[2, 0], crate::DType::F32), &Tensor::zeros(&[0, 3], crate::DType::F32), false, false).unwrap();
        assert_eq!(c.to_vec::<f32>().unwrap(), vec![0.; 6]);
    }
}
