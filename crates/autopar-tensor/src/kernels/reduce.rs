//! Reductions over axes (sum, mean, max) and their backward, softmax and log-softmax.
//!
//! A reduction permutes the kept axes in front of the reduced ones and reduces each row of the
//! resulting matrix on one thread in a fixed order, so serial and parallel results are equal.

use ndarray::{ArrayD, ArrayViewD, IxDyn};

use super::{float_dispatch, same_dtype};
use crate::tensor::{normalize_axis, to_standard};
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// Which reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// The sum.
    Sum,
    /// The arithmetic mean.
    Mean,
    /// The largest element.
    Max,
}

impl ReduceOp {
    fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "reduce_sum",
            ReduceOp::Mean => "reduce_mean",
            ReduceOp::Max => "reduce_max",
        }
    }
}

/// Normalises `axes` (negative allowed); an empty list means every axis (MindSpore's `axis=()`).
pub fn normalize_axes(op: &'static str, axes: &[isize], rank: usize) -> Result<Vec<usize>> {
    if axes.is_empty() {
        return Ok((0..rank).collect());
    }
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let n = normalize_axis(op, a, rank)?;
        if out.contains(&n) {
            return Err(TensorError::InvalidArgument { op, name: "axes", value: format!("{axes:?}"), expected: "distinct axes" });
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// Output shape of a reduction.
pub fn reduced_shape(shape: &[usize], axes: &[usize], keep_dims: bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(shape.len());
    for (i, &d) in shape.iter().enumerate() {
        if axes.contains(&i) {
            if keep_dims {
                out.push(1);
            }
        } else {
            out.push(d);
        }
    }
    out
}

/// Reduces rows of the kept-then-reduced layout with `f(row) -> value`; output has the kept dims.
pub(crate) fn reduce_rows<T: Float, F>(ctx: &ExecCtx, x: ArrayViewD<'_, T>, axes: &[usize], f: F) -> ArrayD<T>
where
    F: Fn(&[T]) -> T + Sync + Send,
{
    let kept: Vec<usize> = (0..x.ndim()).filter(|i| !axes.contains(i)).collect();
    let out_shape: Vec<usize> = kept.iter().map(|&i| x.shape()[i]).collect();
    let inner: usize = axes.iter().map(|&a| x.shape()[a]).product();
    let mut perm = kept.clone();
    perm.extend_from_slice(axes);
    let xs = to_standard(&x.permuted_axes(IxDyn(&perm)));
    let data = xs.as_slice().expect("standard layout");
    let rows: usize = out_shape.iter().product();
    let mut out = vec![T::zero(); rows];
    if inner == 0 {
        out.iter_mut().for_each(|o| *o = f(&[]));
    } else {
        let per_row = |i: usize, o: &mut [T]| o[0] = f(&data[i * inner..(i + 1) * inner]);
        if ctx.par(rows * inner) && rows > 1 {
            use rayon::prelude::*;
            out.par_chunks_mut(1).enumerate().for_each(|(i, o)| per_row(i, o));
        } else {
            out.chunks_mut(1).enumerate().for_each(|(i, o)| per_row(i, o));
        }
    }
    ArrayD::from_shape_vec(IxDyn(&out_shape), out).expect("rows")
}

/// Rows summed side by side, this many at a time (see [`lockstep_sums`]).
pub(crate) const LOCKSTEP: usize = 8;

/// `acc[i] += f(i, rows[i][j])` for `j = 0, 1, ..` in order, for every row `i` at once (rows of
/// one length, at most [`LOCKSTEP`] of them). Each running sum takes its elements in the order
/// a one-row-at-a-time fold does, so the sums are bitwise that fold's; but the rows' adds do not
/// wait on each other, so they overlap instead of each waiting out the one before.
#[inline(always)]
pub(crate) fn lockstep_sums<T: Float>(acc: &mut [T], rows: &[&[T]], f: impl Fn(usize, T) -> T) {
    lockstep_sums2(acc, rows, rows, |i, v, _| f(i, v))
}

/// [`lockstep_sums`] of `f(i, a[i][j], b[i][j])`, two rows of each channel walked together
/// (`b`'s rows at least as long as `a`'s).
#[inline(always)]
#[allow(clippy::needless_range_loop)] // `j` walks every row at once
pub(crate) fn lockstep_sums2<T: Float>(acc: &mut [T], a: &[&[T]], b: &[&[T]], f: impl Fn(usize, T, T) -> T) {
    let len = a.first().map_or(0, |r| r.len());
    if a.len() == LOCKSTEP && b.len() == LOCKSTEP && acc.len() == LOCKSTEP {
        let a: [&[T]; LOCKSTEP] = std::array::from_fn(|i| &a[i][..len]);
        let b: [&[T]; LOCKSTEP] = std::array::from_fn(|i| &b[i][..len]);
        let mut s: [T; LOCKSTEP] = std::array::from_fn(|i| acc[i]);
        for j in 0..len {
            for i in 0..LOCKSTEP {
                s[i] += f(i, a[i][j], b[i][j]);
            }
        }
        acc.copy_from_slice(&s);
    } else {
        for j in 0..len {
            for (i, (ra, rb)) in a.iter().zip(b).enumerate() {
                acc[i] += f(i, ra[j], rb[j]);
            }
        }
    }
}

/// Runs `f(first, piece)` over consecutive pieces of `out` of at most [`LOCKSTEP`] entries
/// (`first`: the piece's offset), on several threads when the `work` (elements read) is worth
/// it, in pieces small enough then that every thread gets some. Each entry is computed alone,
/// so the pieces never change a result.
pub(crate) fn in_lockstep_groups<V: Send>(ctx: &ExecCtx, work: usize, out: &mut [V], f: impl Fn(usize, &mut [V]) + Sync + Send) {
    if ctx.par(work) && out.len() > 1 {
        use rayon::prelude::*;
        let size = out.len().div_ceil(rayon::current_num_threads()).clamp(1, LOCKSTEP);
        out.par_chunks_mut(size).enumerate().for_each(|(gi, o)| f(gi * size, o));
    } else {
        out.chunks_mut(LOCKSTEP).enumerate().for_each(|(gi, o)| f(gi * LOCKSTEP, o));
    }
}

/// `row(i)` for `i < w` (at most [`LOCKSTEP`]; the rest empty), without allocating.
#[inline(always)]
pub(crate) fn lockstep_rows<'a, T>(w: usize, row: impl Fn(usize) -> &'a [T]) -> [&'a [T]; LOCKSTEP] {
    std::array::from_fn(|i| if i < w { row(i) } else { &[] })
}

/// Sums over the axes around one block of kept axes of a standard-layout `x` viewed as
/// `[outer, kept, inner]`: `out[k] = Σ_a Σ_b x[a, k, b]`, each in the order of the generic path
/// (`a` outer, `b` inner), several `k` side by side.
fn sum_around<T: Float>(ctx: &ExecCtx, data: &[T], outer: usize, kept: usize, inner: usize) -> Vec<T> {
    let mut out = vec![T::zero(); kept];
    in_lockstep_groups(ctx, data.len(), &mut out, |k0, acc| {
        let w = acc.len();
        for a in 0..outer {
            let rows = lockstep_rows(w, |i| &data[(a * kept + k0 + i) * inner..][..inner]);
            lockstep_sums(acc, &rows[..w], |_, v| v);
        }
    });
    out
}

/// Sum over `axes` (sorted, distinct), dropping them.
pub(crate) fn sum_axes<T: Float>(ctx: &ExecCtx, x: ArrayViewD<'_, T>, axes: &[usize]) -> ArrayD<T> {
    // Leading axes of a contiguous tensor (a bias gradient, the backward of broadcasting over
    // the batch): add whole rows into the output, in the same order as the generic path.
    let lead = axes.iter().enumerate().all(|(i, &a)| i == a);
    if lead && !axes.is_empty() && axes.len() < x.ndim() && x.is_standard_layout() {
        let out_shape = &x.shape()[axes.len()..];
        let cols: usize = out_shape.iter().product();
        let rows: usize = x.shape()[..axes.len()].iter().product();
        let data = x.as_slice().expect("standard layout");
        let mut out = vec![T::zero(); cols];
        let chunk = if ctx.par(rows * cols) { cols.div_ceil(rayon::current_num_threads() * 4).max(256) } else { cols.max(1) };
        ctx.for_chunks(&mut out, chunk, |ci, o| {
            let (c0, len) = (ci * chunk, o.len());
            for r in 0..rows {
                for (acc, &v) in o.iter_mut().zip(&data[r * cols + c0..r * cols + c0 + len]) {
                    *acc += v;
                }
            }
        });
        return ArrayD::from_shape_vec(IxDyn(out_shape), out).expect("count");
    }
    // The kept axes one block with reduced axes after it (a bias or BatchNorm beta gradient over
    // [N, C, H, W]): sum in place rather than transposing the tensor first.
    let kept: Vec<usize> = (0..x.ndim()).filter(|i| !axes.contains(i)).collect();
    if let (Some(&first), Some(&last)) = (kept.first(), kept.last()) {
        if last - first + 1 == kept.len() && last + 1 < x.ndim() && x.is_standard_layout() {
            let shape = x.shape();
            let (outer, k, inner) =
                (shape[..first].iter().product(), shape[first..=last].iter().product(), shape[last + 1..].iter().product::<usize>());
            if inner > 0 {
                let out = sum_around(ctx, x.as_slice().expect("standard layout"), outer, k, inner);
                return ArrayD::from_shape_vec(IxDyn(&shape[first..=last]), out).expect("count");
            }
        }
    }
    reduce_rows(ctx, x, axes, |r| r.iter().fold(T::zero(), |a, &b| a + b))
}

fn reduce_impl<T: Float>(ctx: &ExecCtx, op: ReduceOp, x: ArrayViewD<'_, T>, axes: &[usize]) -> ArrayD<T> {
    match op {
        ReduceOp::Sum => sum_axes(ctx, x, axes),
        ReduceOp::Mean => {
            let n: usize = axes.iter().map(|&a| x.shape()[a]).product();
            let inv = T::c(1.0 / n as f64);
            reduce_rows(ctx, x, axes, move |r| r.iter().fold(T::zero(), |a, &b| a + b) * inv)
        }
        ReduceOp::Max => reduce_rows(ctx, x, axes, |r| r.iter().fold(T::neg_infinity(), |a, &b| if b > a || b.is_nan() { b } else { a })),
    }
}

/// ReduceSum / ReduceMean / ReduceMax over `axes` (empty = all), keeping reduced dims as 1 if
/// `keep_dims`. Max of an empty set is an error.
pub fn reduce(ctx: &ExecCtx, op: ReduceOp, x: &Tensor, axes: &[isize], keep_dims: bool) -> Result<Tensor> {
    let name = op.name();
    let ax = normalize_axes(name, axes, x.rank())?;
    if op != ReduceOp::Sum && ax.iter().any(|&a| x.shape()[a] == 0) {
        return Err(TensorError::BadShape {
            op: name,
            what: "input",
            shape: x.shape().to_vec(),
            expected: "non-empty reduced axes".into(),
        });
    }
    let out_shape = reduced_shape(x.shape(), &ax, keep_dims);
    float_dispatch!(name, x.dtype(), T => {
        let r = reduce_impl(ctx, op, x.typed::<T>(name, "input")?, &ax);
        Ok(Tensor::from_array(r.into_shape_with_order(IxDyn(&out_shape)).expect("same count")))
    })
}

/// ReduceSum.
pub fn reduce_sum(ctx: &ExecCtx, x: &Tensor, axes: &[isize], keep_dims: bool) -> Result<Tensor> {
    reduce(ctx, ReduceOp::Sum, x, axes, keep_dims)
}
/// ReduceMean.
pub fn reduce_mean(ctx: &ExecCtx, x: &Tensor, axes: &[isize], keep_dims: bool) -> Result<Tensor> {
    reduce(ctx, ReduceOp::Mean, x, axes, keep_dims)
}
/// ReduceMax.
pub fn reduce_max(ctx: &ExecCtx, x: &Tensor, axes: &[isize], keep_dims: bool) -> Result<Tensor> {
    reduce(ctx, ReduceOp::Max, x, axes, keep_dims)
}

/// Reshapes a reduction's gradient to the kept-dims shape so that it broadcasts to the input.
fn dy_keepdims<'a, T: Float>(name: &'static str, dy: &'a Tensor, in_shape: &[usize], ax: &[usize]) -> Result<ArrayViewD<'a, T>> {
    let kd = reduced_shape(in_shape, ax, true);
    let g = dy.typed::<T>(name, "output gradient")?;
    let count: usize = kd.iter().product();
    if g.len() != count || (g.shape() != kd.as_slice() && g.shape() != reduced_shape(in_shape, ax, false).as_slice()) {
        return Err(TensorError::BadShape {
            op: name,
            what: "output gradient",
            shape: g.shape().to_vec(),
            expected: format!("{:?} or {:?}", reduced_shape(in_shape, ax, false), kd),
        });
    }
    let g = if g.is_standard_layout() { g } else { return Err(non_contig(name)) };
    Ok(g.into_shape_with_order(IxDyn(&kd)).expect("same count"))
}

fn non_contig(name: &'static str) -> TensorError {
    TensorError::InvalidArgument {
        op: name,
        name: "dy",
        value: "a strided view".into(),
        expected: "a contiguous tensor (call Tensor::contiguous)",
    }
}

/// Backward of ReduceSum / ReduceMean: broadcasts `dy` back to `input_shape` (divided by the
/// reduced count for Mean). `dy` may have kept or dropped dims.
pub fn reduce_backward(ctx: &ExecCtx, op: ReduceOp, dy: &Tensor, input_shape: &[usize], axes: &[isize]) -> Result<Tensor> {
    let name = op.name();
    if op == ReduceOp::Max {
        return Err(TensorError::InvalidArgument {
            op: name,
            name: "op",
            value: "Max".into(),
            expected: "Sum or Mean (use reduce_max_backward)",
        });
    }
    let ax = normalize_axes(name, axes, input_shape.len())?;
    let dyc = dy.contiguous();
    float_dispatch!(name, dy.dtype(), T => {
        let g = dy_keepdims::<T>(name, &dyc, input_shape, &ax)?;
        let n: usize = ax.iter().map(|&a| input_shape[a]).product();
        let s = if op == ReduceOp::Mean { T::c(1.0 / n.max(1) as f64) } else { T::one() };
        let one = ArrayD::<T>::zeros(IxDyn(&[]));
        Ok(Tensor::from_array(super::map2(ctx, input_shape, &g, &one.view(), move |d, _| d * s)))
    })
}

/// Backward of ReduceMax: `dy` goes to the first position holding the maximum of each reduced
/// group (ties: first in row-major order), zero elsewhere.
pub fn reduce_max_backward(ctx: &ExecCtx, x: &Tensor, dy: &Tensor, axes: &[isize]) -> Result<Tensor> {
    let name = "reduce_max";
    same_dtype(name, "output gradient", x, dy)?;
    let ax = normalize_axes(name, axes, x.rank())?;
    let dyc = dy.contiguous();
    float_dispatch!(name, x.dtype(), T => {
        let g = dy_keepdims::<T>(name, &dyc, x.shape(), &ax)?;
        let xv = x.typed::<T>(name, "input")?;
        let kept: Vec<usize> = (0..xv.ndim()).filter(|i| !ax.contains(i)).collect();
        let mut perm = kept.clone();
        perm.extend_from_slice(&ax);
        let xs = to_standard(&xv.view().permuted_axes(IxDyn(&perm)));
        let data = xs.as_slice().expect("standard");
        let inner: usize = ax.iter().map(|&a| x.shape()[a]).product();
        let gs = g.as_standard_layout();
        let gd = gs.as_slice().expect("standard");
        let mut out = vec![T::zero(); data.len()];
        ctx.for_chunks(&mut out, inner.max(1), |i, row| {
            let xr = &data[i * inner..(i + 1) * inner];
            let mut best = 0;
            for (j, &v) in xr.iter().enumerate() {
                if v > xr[best] || (v.is_nan() && !xr[best].is_nan()) {
                    best = j;
                }
            }
            row[best] = gd[i];
        });
        // Undo the permutation.
        let permuted_shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
        let arr = ArrayD::from_shape_vec(IxDyn(&permuted_shape), out).expect("count");
        let mut inv = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        Ok(Tensor::from_array(to_standard(&arr.view().permuted_axes(IxDyn(&inv)))))
    })
}

/// ArgMax along `axis` (first maximum on ties; NaN counts as the maximum): an i64 tensor with
/// that axis removed (or kept as 1). Not differentiable; used for accuracy metrics.
pub fn argmax(ctx: &ExecCtx, x: &Tensor, axis: isize, keep_dims: bool) -> Result<Tensor> {
    let op = "argmax";
    let ax = normalize_axis(op, axis, x.rank())?;
    if x.shape()[ax] == 0 {
        return Err(TensorError::BadShape { op, what: "input", shape: x.shape().to_vec(), expected: format!("a non-empty axis {ax}") });
    }
    let out_shape = reduced_shape(x.shape(), &[ax], keep_dims);
    let xf = x.cast(crate::DType::F64);
    let xv = xf.typed::<f64>(op, "input")?;
    let idx = reduce_rows(ctx, xv, &[ax], |r| {
        let mut best = 0;
        for (j, &v) in r.iter().enumerate() {
            if v > r[best] || (v.is_nan() && !r[best].is_nan()) {
                best = j;
            }
        }
        best as f64
    });
    Tensor::from_vec(&out_shape, idx.iter().map(|&v| v as i64).collect())
}

/// Moves `axis` last, runs `f(in_row, out_row)` per row, moves it back.
fn along_axis<T: Float, F>(ctx: &ExecCtx, x: ArrayViewD<'_, T>, y: Option<ArrayViewD<'_, T>>, axis: usize, f: F) -> ArrayD<T>
where
    F: Fn(&[T], Option<&[T]>, &mut [T]) + Sync + Send,
{
    let n = x.ndim();
    let len = x.shape()[axis];
    let mut perm: Vec<usize> = (0..n).filter(|&i| i != axis).collect();
    perm.push(axis);
    let xs = to_standard(&x.permuted_axes(IxDyn(&perm)));
    let ys = y.map(|y| to_standard(&y.permuted_axes(IxDyn(&perm))));
    let xd = xs.as_slice().expect("standard");
    let yd = ys.as_ref().map(|a| a.as_slice().expect("standard"));
    let mut out = vec![T::zero(); xd.len()];
    ctx.for_chunks(&mut out, len.max(1), |i, o| {
        let r = i * len..(i + 1) * len;
        f(&xd[r.clone()], yd.map(|y| &y[r]), o)
    });
    let arr = ArrayD::from_shape_vec(xs.raw_dim(), out).expect("count");
    let mut inv = vec![0; n];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    if axis == n - 1 {
        arr
    } else {
        to_standard(&arr.view().permuted_axes(IxDyn(&inv)))
    }
}

/// One row of (log-)softmax, as a vector loop.
struct SoftmaxRow<'a, T> {
    x: &'a [T],
    o: &'a mut [T],
    log: bool,
}

impl<T: Float> crate::simd::VectorLoop for SoftmaxRow<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let SoftmaxRow { x, o, log } = self;
        let m = crate::simd::max(x);
        for (oi, &xi) in o.iter_mut().zip(x) {
            *oi = (xi - m).vexp();
        }
        let s = crate::simd::sum(o);
        if log {
            let ls = s.ln();
            for (oi, &xi) in o.iter_mut().zip(x) {
                *oi = xi - m - ls;
            }
        } else {
            let inv = T::one() / s;
            o.iter_mut().for_each(|v| *v *= inv);
        }
    }
}

fn softmax_row<T: Float>(x: &[T], o: &mut [T], log: bool) {
    crate::simd::vectorized(SoftmaxRow { x, o, log })
}

/// One row of the (log-)softmax backward, as a vector loop.
struct SoftmaxGradRow<'a, T> {
    g: &'a [T],
    y: &'a [T],
    o: &'a mut [T],
    log: bool,
}

impl<T: Float> crate::simd::VectorLoop for SoftmaxGradRow<'_, T> {
    type Output = ();
    #[inline(always)]
    fn run(self) {
        let SoftmaxGradRow { g, y, o, log } = self;
        if log {
            let s = crate::simd::sum(g);
            for ((oi, &gi), &yi) in o.iter_mut().zip(g).zip(y) {
                *oi = gi - yi.vexp() * s;
            }
        } else {
            let s = crate::simd::dot(g, y);
            for ((oi, &gi), &yi) in o.iter_mut().zip(g).zip(y) {
                *oi = yi * (gi - s);
            }
        }
    }
}

/// Softmax along `axis` (max-subtracted).
pub fn softmax(ctx: &ExecCtx, x: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = normalize_axis("softmax", axis, x.rank())?;
    float_dispatch!("softmax", x.dtype(), T => {
        Ok(Tensor::from_array(along_axis(ctx, x.typed::<T>("softmax", "input")?, None, ax, |r, _, o| softmax_row(r, o, false))))
    })
}

/// LogSoftmax along `axis`.
pub fn log_softmax(ctx: &ExecCtx, x: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = normalize_axis("log_softmax", axis, x.rank())?;
    float_dispatch!("log_softmax", x.dtype(), T => {
        Ok(Tensor::from_array(along_axis(ctx, x.typed::<T>("log_softmax", "input")?, None, ax, |r, _, o| softmax_row(r, o, true))))
    })
}

/// Softmax backward from the forward output `y`: `dx = y * (dy - sum(dy * y, axis))`.
pub fn softmax_backward(ctx: &ExecCtx, y: &Tensor, dy: &Tensor, axis: isize) -> Result<Tensor> {
    softmax_like_backward(ctx, "softmax", y, dy, axis, false)
}

/// LogSoftmax backward from the forward output `y`: `dx = dy - exp(y) * sum(dy, axis)`.
pub fn log_softmax_backward(ctx: &ExecCtx, y: &Tensor, dy: &Tensor, axis: isize) -> Result<Tensor> {
    softmax_like_backward(ctx, "log_softmax", y, dy, axis, true)
}

fn softmax_like_backward(ctx: &ExecCtx, name: &'static str, y: &Tensor, dy: &Tensor, axis: isize, log: bool) -> Result<Tensor> {
    same_dtype(name, "output gradient", y, dy)?;
    super::same_shape(name, y.shape(), dy.shape(), "output and output gradient must have the same shape")?;
    let ax = normalize_axis(name, axis, y.rank())?;
    float_dispatch!(name, y.dtype(), T => {
        let (yv, gv) = (y.typed::<T>(name, "output")?, dy.typed::<T>(name, "output gradient")?);
        Ok(Tensor::from_array(along_axis(ctx, gv, Some(yv), ax, move |g, y, o| {
            crate::simd::vectorized(SoftmaxGradRow { g, y: y.expect("output given"), o, log })
        })))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m() -> Tensor {
        Tensor::from_vec(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]).unwrap()
    }
    fn v(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }
    fn cx() -> ExecCtx {
        ExecCtx::serial()
    }

    #[test]
    fn sums_around_a_kept_block_are_bitwise_the_generic_ones() {
        // Values whose sums round differently in another order.
        let shape = [3usize, 11, 4, 37];
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1013) as f32 * 1.37e-3 + 1e4 * ((i % 3) as f32 - 1.0)).collect();
        let x = ndarray::ArrayD::from_shape_vec(IxDyn(&shape), data).unwrap();
        for axes in [&[0usize, 2, 3][..], &[2, 3], &[0, 3], &[3], &[0, 1, 3], &[2]] {
            let want = reduce_rows(&cx(), x.view(), axes, |r| r.iter().fold(0f32, |a, &b| a + b));
            for ctx in [cx(), ExecCtx::parallel().with_min_parallel_len(0)] {
                let got = sum_axes(&ctx, x.view(), axes);
                assert_eq!(got.shape(), want.shape(), "axes {axes:?}");
                let bits = |a: &ndarray::ArrayD<f32>| a.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "axes {axes:?}");
            }
        }
    }

    #[test]
    fn reduce_sum_over_rows_columns_and_everything() {
        assert_eq!(v(&reduce_sum(&cx(), &m(), &[0], false).unwrap()), vec![5., 7., 9.]);
        let r = reduce_sum(&cx(), &m(), &[1], true).unwrap();
        assert_eq!((r.shape(), v(&r)), (&[2usize, 1][..], vec![6., 15.]));
        let all = reduce_sum(&cx(), &m(), &[], false).unwrap();
        assert_eq!((all.shape(), v(&all)), (&[][..], vec![21.]));
    }

    #[test]
    fn summing_leading_axes_of_a_contiguous_tensor_matches_the_generic_path() {
        let x = crate::random::uniform(&[3, 4, 5, 6], -1., 1., 1, crate::DType::F32);
        let xv = x.array::<f32>().unwrap();
        for axes in [vec![0], vec![0, 1], vec![0, 1, 2]] {
            let fast = sum_axes(&cx(), xv.view(), &axes);
            let generic = reduce_rows(&cx(), xv.view(), &axes, |r| r.iter().fold(0.0, |a, &b| a + b));
            assert_eq!(fast, generic, "axes {axes:?}");
        }
        // A strided view takes the generic path and gives the same sums.
        let t = crate::kernels::shape::transpose(&x, &[1, 0, 2, 3]).unwrap();
        let s = reduce_sum(&cx(), &t, &[1], false).unwrap();
        assert!(s.bit_eq(&reduce_sum(&cx(), &x, &[0], false).unwrap()));
    }

    #[test]
    fn reduce_mean_and_max_over_the_last_axis() {
        assert_eq!(v(&reduce_mean(&cx(), &m(), &[-1], false).unwrap()), vec![2., 5.]);
        assert_eq!(v(&reduce_max(&cx(), &m(), &[-1], false).unwrap()), vec![3., 6.]);
        assert_eq!(v(&reduce_max(&cx(), &m(), &[0, 1], true).unwrap()), vec![6.]);
    }

    #[test]
    fn reduce_backward_broadcasts_and_scales_for_mean() {
        let dy = Tensor::from_vec(&[2], vec![1f32, 2.]).unwrap();
        assert_eq!(v(&reduce_backward(&cx(), ReduceOp::Sum, &dy, &[2, 3], &[1]).unwrap()), vec![1., 1., 1., 2., 2., 2.]);
        let g = v(&reduce_backward(&cx(), ReduceOp::Mean, &dy, &[2, 3], &[1]).unwrap());
        assert!((g[0] - 1. / 3.).abs() < 1e-7 && (g[5] - 2. / 3.).abs() < 1e-7);
    }

    #[test]
    fn reduce_max_backward_routes_to_the_first_maximum() {
        let x = Tensor::from_vec(&[2, 3], vec![1f32, 5., 5., 7., 0., 7.]).unwrap();
        let dy = Tensor::from_vec(&[2], vec![1f32, 2.]).unwrap();
        assert_eq!(v(&reduce_max_backward(&cx(), &x, &dy, &[1]).unwrap()), vec![0., 1., 0., 2., 0., 0.]);
    }

    #[test]
    fn argmax_picks_the_first_maximum_along_an_axis() {
        let x = Tensor::from_vec(&[2, 3], vec![1f32, 7., 7., 9., 0., 2.]).unwrap();
        assert_eq!(argmax(&cx(), &x, -1, false).unwrap().to_vec::<i64>().unwrap(), vec![1, 0]);
        let cols = argmax(&cx(), &x, 0, true).unwrap();
        assert_eq!((cols.shape(), cols.to_vec::<i64>().unwrap()), (&[1usize, 3][..], vec![1, 0, 0]));
        let labels = Tensor::from_vec(&[3], vec![4i64, -1, 2]).unwrap();
        assert_eq!(argmax(&cx(), &labels, 0, false).unwrap().to_vec::<i64>().unwrap(), vec![0]);
        assert!(argmax(&cx(), &Tensor::zeros(&[2, 0], crate::DType::F32), 1, false).is_err());
    }

    #[test]
    fn bad_axes_are_errors() {
        assert!(matches!(reduce_sum(&cx(), &m(), &[2], false), Err(TensorError::AxisOutOfRange { axis: 2, rank: 2, .. })));
        assert!(matches!(reduce_sum(&cx(), &m(), &[1, -1], false), Err(TensorError::InvalidArgument { name: "axes", .. })));
        let empty = Tensor::zeros(&[0, 2], crate::DType::F32);
        assert!(reduce_max(&cx(), &empty, &[0], false).is_err());
        assert_eq!(v(&reduce_sum(&cx(), &empty, &[0], false).unwrap()), vec![0., 0.]);
    }

    #[test]
    fn softmax_and_log_softmax_match_hand_values() {
        let x = Tensor::from_vec(&[1, 2], vec![0f64, 2f64.ln()]).unwrap();
        let s = softmax(&cx(), &x, -1).unwrap().to_vec::<f64>().unwrap();
        assert!((s[0] - 1. / 3.).abs() < 1e-12 && (s[1] - 2. / 3.).abs() < 1e-12);
        let l = log_softmax(&cx(), &x, 1).unwrap().to_vec::<f64>().unwrap();
        assert!((l[0] - (1f64 / 3.).ln()).abs() < 1e-12);
        // Along axis 0 of a column: each column sums to one.
        let c = softmax(&cx(), &m(), 0).unwrap();
        let col = v(&reduce_sum(&cx(), &c, &[0], false).unwrap());
        assert!(col.iter().all(|s| (s - 1.).abs() < 1e-6));
    }

    #[test]
    fn softmax_is_stable_for_large_logits() {
        let x = Tensor::from_vec(&[2], vec![1000f32, 1000.]).unwrap();
        assert_eq!(v(&softmax(&cx(), &x, 0).unwrap()), vec![0.5, 0.5]);
    }
}
