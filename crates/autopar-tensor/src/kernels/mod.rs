//! The kernels, one file per op family. Each public function takes `&ExecCtx` and `&Tensor`s and
//! returns fresh tensors (or zero-copy views where noted). Backward pieces are separate functions
//! named `<op>_backward*` / `<op>_grads`, taking exactly what the forward saved.

pub mod attention;
pub mod bf16_gemm;
pub mod conv;
pub mod dropout;
pub mod elementwise;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod reduce;
pub mod rotary;
pub mod routing;
pub mod shape;

use ndarray::{ArrayD, ArrayViewD, IxDyn, Zip};

use crate::{ExecCtx, Float};

/// Runs `$body` with `$T` bound to f32 or f64 according to `$dtype`; other dtypes are an error.
macro_rules! float_dispatch {
    ($op:expr, $dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::DType::F32 => {
                type $T = f32;
                #[allow(unused_imports)]
                use num_traits::{Float as _, One as _, Zero as _};
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                #[allow(unused_imports)]
                use num_traits::{Float as _, One as _, Zero as _};
                $body
            }
            d => Err($crate::TensorError::UnsupportedDType { op: $op, dtype: d, expected: "f32 or f64" }),
        }
    };
}
pub(crate) use float_dispatch;

/// `f` over every element into a fresh row-major array.
pub(crate) fn map<T: Float, F>(ctx: &ExecCtx, x: &ArrayViewD<'_, T>, f: F) -> ArrayD<T>
where
    F: Fn(T) -> T + Sync + Send,
{
    if let Some(xs) = x.as_slice() {
        return ArrayD::from_shape_vec(
            x.raw_dim(),
            map_slices(ctx, xs.len(), |i, o: &mut [T]| {
                let n = o.len();
                for (o, &a) in o.iter_mut().zip(&xs[i..i + n]) {
                    *o = f(a);
                }
            }),
        )
        .expect("same element count");
    }
    let mut out = ArrayD::<T>::zeros(x.raw_dim());
    let z = Zip::from(&mut out).and(x);
    if ctx.par(x.len()) {
        z.par_for_each(|o, &a| *o = f(a));
    } else {
        z.for_each(|o, &a| *o = f(a));
    }
    out
}

/// `f(a, b)` element-wise with both inputs broadcast to `shape`.
pub(crate) fn map2<T: Float, F>(ctx: &ExecCtx, shape: &[usize], a: &ArrayViewD<'_, T>, b: &ArrayViewD<'_, T>, f: F) -> ArrayD<T>
where
    F: Fn(T, T) -> T + Sync + Send,
{
    if let (Some(xs), Some(ys), true) = (a.as_slice(), b.as_slice(), a.shape() == shape && b.shape() == shape) {
        return ArrayD::from_shape_vec(
            IxDyn(shape),
            map_slices(ctx, xs.len(), |i, o: &mut [T]| {
                let n = o.len();
                for ((o, &x), &y) in o.iter_mut().zip(&xs[i..i + n]).zip(&ys[i..i + n]) {
                    *o = f(x, y);
                }
            }),
        )
        .expect("same element count");
    }
    // One operand whole, the other a block repeated along the leading axes (a bias, a mask).
    if let (Some(xs), true, Some(ys)) = (a.as_slice(), a.shape() == shape, repeating_suffix(b, shape)) {
        return ArrayD::from_shape_vec(IxDyn(shape), map_slices(ctx, xs.len(), |i, o: &mut [T]| repeat_rows(i, o, xs, ys, &f)))
            .expect("same element count");
    }
    if let (Some(ys), true, Some(xs)) = (b.as_slice(), b.shape() == shape, repeating_suffix(a, shape)) {
        let g = |y: T, x: T| f(x, y);
        return ArrayD::from_shape_vec(IxDyn(shape), map_slices(ctx, ys.len(), |i, o: &mut [T]| repeat_rows(i, o, ys, xs, &g)))
            .expect("same element count");
    }
    let mut out = ArrayD::<T>::zeros(IxDyn(shape));
    let z = Zip::from(&mut out).and_broadcast(a).and_broadcast(b);
    if ctx.par(out_len(shape)) {
        z.par_for_each(|o, &x, &y| *o = f(x, y));
    } else {
        z.for_each(|o, &x, &y| *o = f(x, y));
    }
    out
}

/// The values of `b` when, broadcast to `shape`, it is one contiguous block repeated along the
/// leading axes: its shape without leading 1s is a suffix of `shape`.
fn repeating_suffix<'a, T>(b: &'a ArrayViewD<'_, T>, shape: &[usize]) -> Option<&'a [T]> {
    let dims = b.shape();
    let lead = dims.iter().take_while(|&&d| d == 1).count();
    let rest = &dims[lead..];
    if rest.is_empty() || !shape.ends_with(rest) {
        return None;
    }
    b.as_slice().filter(|v| !v.is_empty())
}

/// `o[k] = f(xs[i + k], ys[(i + k) % ys.len()])`, in runs that start where `ys` starts over.
fn repeat_rows<T: Float, F: Fn(T, T) -> T>(i: usize, o: &mut [T], xs: &[T], ys: &[T], f: &F) {
    let inner = ys.len();
    let (mut pos, mut j) = (0, i % inner);
    while pos < o.len() {
        let n = (inner - j).min(o.len() - pos);
        for ((o, &x), &y) in o[pos..pos + n].iter_mut().zip(&xs[i + pos..i + pos + n]).zip(&ys[j..j + n]) {
            *o = f(x, y);
        }
        pos += n;
        j = 0;
    }
}

/// `f(a, b, c)` element-wise over three same-shaped (or broadcastable) inputs.
pub(crate) fn map3<T: Float, F>(
    ctx: &ExecCtx,
    shape: &[usize],
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
    c: &ArrayViewD<'_, T>,
    f: F,
) -> ArrayD<T>
where
    F: Fn(T, T, T) -> T + Sync + Send,
{
    let mut out = ArrayD::<T>::zeros(IxDyn(shape));
    let z = Zip::from(&mut out).and_broadcast(a).and_broadcast(b).and_broadcast(c);
    if ctx.par(out_len(shape)) {
        z.par_for_each(|o, &x, &y, &w| *o = f(x, y, w));
    } else {
        z.for_each(|o, &x, &y, &w| *o = f(x, y, w));
    }
    out
}

/// As [`map`], for a function whose loop pays to compile for the CPU's vector unit
/// ([`crate::simd`]: transcendental functions; a loop that only moves memory does not gain).
pub(crate) fn map_vec<T: Float, F: crate::simd::UnaryFn<T>>(ctx: &ExecCtx, x: &ArrayViewD<'_, T>, f: F) -> ArrayD<T> {
    match x.as_slice() {
        Some(xs) => {
            ArrayD::from_shape_vec(x.raw_dim(), map_slices(ctx, xs.len(), |i, o: &mut [T]| crate::simd::map1(o, &xs[i..i + o.len()], f)))
                .expect("same element count")
        }
        None => map(ctx, x, |v| f.apply(v)),
    }
}

/// As [`map2`], for a function whose loop pays to compile for the CPU's vector unit.
pub(crate) fn map2_vec<T: Float, F: crate::simd::BinaryFn<T>>(
    ctx: &ExecCtx,
    shape: &[usize],
    a: &ArrayViewD<'_, T>,
    b: &ArrayViewD<'_, T>,
    f: F,
) -> ArrayD<T> {
    match (a.as_slice(), b.as_slice(), a.shape() == shape && b.shape() == shape) {
        (Some(xs), Some(ys), true) => ArrayD::from_shape_vec(
            IxDyn(shape),
            map_slices(ctx, xs.len(), |i, o: &mut [T]| {
                let n = o.len();
                crate::simd::map2(o, &xs[i..i + n], &ys[i..i + n], f)
            }),
        )
        .expect("same element count"),
        _ => map2(ctx, shape, a, b, |x, y| f.apply(x, y)),
    }
}

/// A fresh vector of `len` elements filled by `fill(start, chunk)` over consecutive chunks
/// (several threads when `ctx` says so; element-wise work, so the result never depends on it).
fn map_slices<T: Float, F>(ctx: &ExecCtx, len: usize, fill: F) -> Vec<T>
where
    F: Fn(usize, &mut [T]) + Sync + Send,
{
    const CHUNK: usize = 1 << 14;
    let mut out = vec![T::zero(); len];
    if ctx.par(len) && len > CHUNK {
        use rayon::prelude::*;
        out.par_chunks_mut(CHUNK).enumerate().for_each(|(k, o)| fill(k * CHUNK, o));
    } else {
        fill(0, &mut out);
    }
    out
}

pub(crate) fn out_len(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Checks that two tensors have the same shape.
pub(crate) fn same_shape(op: &'static str, a: &[usize], b: &[usize], reason: &'static str) -> crate::Result<()> {
    if a != b {
        return Err(crate::TensorError::IncompatibleShapes { op, lhs: a.to_vec(), rhs: b.to_vec(), reason });
    }
    Ok(())
}

/// Checks that two tensors have the same dtype.
pub(crate) fn same_dtype(op: &'static str, what: &'static str, a: &crate::Tensor, b: &crate::Tensor) -> crate::Result<()> {
    if a.dtype() != b.dtype() {
        return Err(crate::TensorError::DTypeMismatch { op, what, expected: a.dtype(), got: b.dtype() });
    }
    Ok(())
}
