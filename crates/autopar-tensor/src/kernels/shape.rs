//! Shape kernels: Reshape, Transpose, Flatten, Slice (zero-copy views along any dimension),
//! Concat, Gather (embedding lookup) with its scatter-add backward, OneHot, BroadcastTo.

use ndarray::{ArrayD, Axis, IxDyn, Slice};

use super::{float_dispatch, same_dtype};
use crate::tensor::{map_storage, normalize_axis, Storage};
use crate::{DType, ExecCtx, Index, Result, Tensor, TensorError};

/// Resolves a target shape with at most one `-1` against `numel`.
pub fn infer_shape(op: &'static str, shape: &[isize], numel: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(shape.len());
    let mut hole = None;
    let mut known = 1usize;
    for (i, &d) in shape.iter().enumerate() {
        if d == -1 {
            if hole.is_some() {
                return Err(TensorError::InvalidArgument { op, name: "shape", value: format!("{shape:?}"), expected: "at most one -1" });
            }
            hole = Some(i);
            out.push(1);
        } else if d < 0 {
            return Err(TensorError::InvalidArgument {
                op,
                name: "shape",
                value: format!("{shape:?}"),
                expected: "sizes >= 0 or a single -1",
            });
        } else {
            known *= d as usize;
            out.push(d as usize);
        }
    }
    if let Some(h) = hole {
        if known == 0 || !numel.is_multiple_of(known) {
            return Err(TensorError::ElementCount { op, shape: out, expected: known, len: numel });
        }
        out[h] = numel / known;
    }
    let total: usize = out.iter().product();
    if total != numel {
        return Err(TensorError::ElementCount { op, shape: out, expected: total, len: numel });
    }
    Ok(out)
}

/// Reshape (row-major). Zero-copy when `x` is contiguous; `-1` infers one dimension.
pub fn reshape(x: &Tensor, shape: &[isize]) -> Result<Tensor> {
    let target = infer_shape("reshape", shape, x.numel())?;
    let src = x.contiguous();
    Ok(Tensor { s: map_storage!(&src.s, a => a.clone().into_shape_with_order(IxDyn(&target)).expect("contiguous, same count")) })
}

/// Reshape to an exact shape (the backward of any reshape is a reshape to the input shape).
pub fn reshape_to(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let s: Vec<isize> = shape.iter().map(|&d| d as isize).collect();
    reshape(x, &s)
}

/// Flatten: `[N, ...] -> [N, prod(...)]` (MindSpore keeps the batch dimension). Backward:
/// [`reshape_to`] the input shape.
pub fn flatten(x: &Tensor) -> Result<Tensor> {
    if x.rank() == 0 {
        return Err(TensorError::BadShape { op: "flatten", what: "input", shape: vec![], expected: "rank >= 1".into() });
    }
    let n = x.shape()[0] as isize;
    let rest: usize = x.shape()[1..].iter().product();
    reshape(x, &[n, rest as isize])
}

/// Checks a permutation.
fn check_perm(op: &'static str, perm: &[usize], rank: usize) -> Result<()> {
    let mut seen = vec![false; rank];
    if perm.len() != rank || perm.iter().any(|&p| p >= rank || std::mem::replace(&mut seen[p], true)) {
        return Err(TensorError::InvalidArgument { op, name: "perm", value: format!("{perm:?}"), expected: "a permutation of 0..rank" });
    }
    Ok(())
}

/// Transpose by `perm` (output dim `i` = input dim `perm[i]`). Zero-copy view.
pub fn transpose(x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    check_perm("transpose", perm, x.rank())?;
    Ok(Tensor { s: map_storage!(&x.s, a => a.clone().permuted_axes(IxDyn(perm))) })
}

/// The inverse permutation (Transpose's backward is a transpose by it).
pub fn inverse_permutation(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// Zero-copy slice `[start, end)` along one axis.
pub fn slice_axis(x: &Tensor, axis: isize, start: usize, end: usize) -> Result<Tensor> {
    let ax = normalize_axis("slice", axis, x.rank())?;
    let dim = x.shape()[ax];
    if start > end || end > dim {
        return Err(TensorError::InvalidArgument {
            op: "slice",
            name: "range",
            value: format!("{start}..{end} on axis {ax} of size {dim}"),
            expected: "start <= end <= size",
        });
    }
    Ok(Tensor {
        s: map_storage!(&x.s, a => {
            let mut v = a.clone();
            v.slice_axis_inplace(Axis(ax), Slice::from(start..end));
            v
        }),
    })
}

/// MindSpore Slice: zero-copy view of `size[i]` elements from `begin[i]` on every dim
/// (`size[i] = -1` means to the end).
pub fn slice(x: &Tensor, begin: &[usize], size: &[isize]) -> Result<Tensor> {
    if begin.len() != x.rank() || size.len() != x.rank() {
        return Err(TensorError::InvalidArgument {
            op: "slice",
            name: "begin/size",
            value: format!("begin {begin:?}, size {size:?} for shape {:?}", x.shape()),
            expected: "one entry per dimension",
        });
    }
    let mut out = x.clone();
    for (i, (&b, &s)) in begin.iter().zip(size).enumerate() {
        let dim = x.shape()[i];
        let end = if s == -1 {
            dim
        } else if s < 0 {
            usize::MAX
        } else {
            b.saturating_add(s as usize)
        };
        if b > dim || end > dim {
            return Err(TensorError::InvalidArgument {
                op: "slice",
                name: "begin/size",
                value: format!("begin {b}, size {s} on dimension {i} of size {dim}"),
                expected: "begin + size <= size of the dimension",
            });
        }
        out = slice_axis(&out, i as isize, b, end)?;
    }
    Ok(out)
}

/// Backward of [`slice()`]: `dy` placed at `begin` inside zeros of `input_shape`.
pub fn slice_backward(dy: &Tensor, input_shape: &[usize], begin: &[usize]) -> Result<Tensor> {
    if begin.len() != input_shape.len()
        || dy.rank() != input_shape.len()
        || begin.iter().zip(dy.shape()).zip(input_shape).any(|((b, d), s)| b + d > *s)
    {
        return Err(TensorError::BadShape {
            op: "slice_backward",
            what: "output gradient",
            shape: dy.shape().to_vec(),
            expected: format!("a block at {begin:?} inside {input_shape:?}"),
        });
    }
    Ok(Tensor {
        s: map_storage!(&dy.s, a => {
            let mut out = ArrayD::from_elem(IxDyn(input_shape), Default::default());
            let mut view = out.view_mut();
            for (i, (&b, &d)) in begin.iter().zip(a.shape()).enumerate() {
                view.slice_axis_inplace(Axis(i), Slice::from(b..b + d));
            }
            view.assign(a);
            out.into_shared()
        }),
    })
}

/// Concatenates along `axis` (all inputs share dtype and every other dimension).
pub fn concat(xs: &[&Tensor], axis: isize) -> Result<Tensor> {
    let first = xs.first().ok_or(TensorError::InvalidArgument {
        op: "concat",
        name: "inputs",
        value: "[]".into(),
        expected: "at least one tensor",
    })?;
    let ax = normalize_axis("concat", axis, first.rank())?;
    for t in xs {
        same_dtype("concat", "input", first, t)?;
        let ok = t.rank() == first.rank() && t.shape().iter().zip(first.shape()).enumerate().all(|(i, (a, b))| i == ax || a == b);
        if !ok {
            return Err(TensorError::IncompatibleShapes {
                op: "concat",
                lhs: first.shape().to_vec(),
                rhs: t.shape().to_vec(),
                reason: "all dimensions except the concat axis must match",
            });
        }
    }
    fn cat<T: crate::Element>(xs: &[&Tensor], ax: usize) -> Tensor {
        // Row-major inputs: for each index of the axes before `ax`, each input's block in turn
        // (memcpy-sized pieces instead of an element-by-element copy).
        let slices: Option<Vec<&[T]>> = xs.iter().map(|t| t.as_slice::<T>()).collect();
        if let Some(slices) = slices {
            let mut shape = xs[0].shape().to_vec();
            shape[ax] = xs.iter().map(|t| t.shape()[ax]).sum();
            let outer: usize = shape[..ax].iter().product();
            let inner: usize = shape[ax + 1..].iter().product();
            let mut out = Vec::with_capacity(shape.iter().product());
            for o in 0..outer {
                for (s, t) in slices.iter().zip(xs) {
                    let block = t.shape()[ax] * inner;
                    out.extend_from_slice(&s[o * block..(o + 1) * block]);
                }
            }
            return Tensor::from_vec(&shape, out).expect("sized");
        }
        let views: Vec<_> = xs.iter().map(|t| T::unwrap(t).expect("dtype checked").view()).collect();
        Tensor::from_array(ndarray::concatenate(Axis(ax), &views).expect("shapes checked"))
    }
    Ok(match first.dtype() {
        DType::F32 => cat::<f32>(xs, ax),
        DType::F64 => cat::<f64>(xs, ax),
        DType::F16 => cat::<half::f16>(xs, ax),
        DType::BF16 => cat::<half::bf16>(xs, ax),
        DType::I32 => cat::<i32>(xs, ax),
        DType::I64 => cat::<i64>(xs, ax),
    })
}

/// Backward of [`concat()`]: zero-copy slices of `dy` with the inputs' sizes along `axis`.
pub fn concat_backward(dy: &Tensor, sizes: &[usize], axis: isize) -> Result<Vec<Tensor>> {
    let ax = normalize_axis("concat_backward", axis, dy.rank())?;
    if sizes.iter().sum::<usize>() != dy.shape()[ax] {
        return Err(TensorError::BadShape {
            op: "concat_backward",
            what: "output gradient",
            shape: dy.shape().to_vec(),
            expected: format!("size {} on axis {ax} (sum of {sizes:?})", sizes.iter().sum::<usize>()),
        });
    }
    let mut start = 0;
    sizes
        .iter()
        .map(|&s| {
            let t = slice_axis(dy, ax as isize, start, start + s);
            start += s;
            t
        })
        .collect()
}

/// Splits into `parts` equal zero-copy slices along `axis` (what sharding a dimension does).
pub fn split(x: &Tensor, axis: isize, parts: usize) -> Result<Vec<Tensor>> {
    let ax = normalize_axis("split", axis, x.rank())?;
    let dim = x.shape()[ax];
    if parts == 0 || !dim.is_multiple_of(parts) {
        return Err(TensorError::InvalidArgument {
            op: "split",
            name: "parts",
            value: format!("{parts} for size {dim}"),
            expected: "a divisor of the dimension",
        });
    }
    concat_backward(x, &vec![dim / parts; parts], ax as isize)
}

fn indices_i64(op: &'static str, idx: &Tensor) -> Result<Vec<i64>> {
    match idx.dtype() {
        DType::I32 => Ok(idx.typed::<i32>(op, "indices")?.iter().map(|&v| v.as_i64()).collect()),
        DType::I64 => Ok(idx.typed::<i64>(op, "indices")?.iter().copied().collect()),
        d => Err(TensorError::UnsupportedDType { op, dtype: d, expected: "i32 or i64 indices" }),
    }
}

fn check_indices(op: &'static str, idx: &[i64], bound: usize) -> Result<()> {
    if let Some((position, &index)) = idx.iter().enumerate().find(|(_, &v)| v < 0 || v as usize >= bound) {
        return Err(TensorError::IndexOutOfRange { op, what: "index", index, position, bound });
    }
    Ok(())
}

/// Gather: `params` indexed by `indices` along `axis`. Output shape
/// `params[..axis] ++ indices.shape ++ params[axis+1..]`. With `axis = 0` this is the embedding
/// lookup. Any dtype for `params`; indices i32/i64, each in `[0, params.shape[axis])`.
pub fn gather(ctx: &ExecCtx, params: &Tensor, indices: &Tensor, axis: isize) -> Result<Tensor> {
    let ax = normalize_axis("gather", axis, params.rank())?;
    gather_rows(ctx, params, indices, axis, 0, params.shape()[ax])
}

/// Gather from a table split along `axis`: `params` holds rows `start..start + len` of a table
/// of `total` rows. Indices are checked against `total`; an index outside this block gathers
/// zeros, so summing the blocks' results gives the gather from the whole table.
pub fn gather_rows(ctx: &ExecCtx, params: &Tensor, indices: &Tensor, axis: isize, start: usize, total: usize) -> Result<Tensor> {
    let op = "gather";
    let ax = normalize_axis(op, axis, params.rank())?;
    let idx = indices_i64(op, indices)?;
    let v = params.shape()[ax];
    check_block(op, start, v, total)?;
    check_indices(op, &idx, total)?;
    let outer: usize = params.shape()[..ax].iter().product();
    let inner: usize = params.shape()[ax + 1..].iter().product();
    let mut out_shape = params.shape()[..ax].to_vec();
    out_shape.extend_from_slice(indices.shape());
    out_shape.extend_from_slice(&params.shape()[ax + 1..]);
    let p = params.contiguous();
    fn run<T: crate::Element>(
        ctx: &ExecCtx,
        a: &ndarray::ArcArray<T, IxDyn>,
        idx: &[i64],
        outer: usize,
        (start, v): (usize, usize),
        inner: usize,
        shape: &[usize],
    ) -> ndarray::ArcArray<T, IxDyn> {
        let src = a.as_slice().expect("contiguous");
        let n = idx.len();
        let mut out = vec![T::default(); outer * n * inner];
        ctx.for_chunks(&mut out, (n * inner).max(1), |o, chunk| {
            for (j, &i) in idx.iter().enumerate() {
                // Indices were checked non-negative; rows outside this block stay zero.
                let Some(row) = (i as usize).checked_sub(start).filter(|&r| r < v) else { continue };
                let s = (o * v + row) * inner;
                chunk[j * inner..(j + 1) * inner].copy_from_slice(&src[s..s + inner]);
            }
        });
        ArrayD::from_shape_vec(IxDyn(shape), out).expect("count").into_shared()
    }
    Ok(Tensor { s: map_storage!(&p.s, a => run(ctx, a, &idx, outer, (start, v), inner, &out_shape)) })
}

fn check_block(op: &'static str, start: usize, len: usize, total: usize) -> Result<()> {
    if start.checked_add(len).is_none_or(|end| end > total) {
        return Err(TensorError::InvalidArgument {
            op,
            name: "rows",
            value: format!("{start}..{}", start + len),
            expected: "a block of rows within the table",
        });
    }
    Ok(())
}

/// Backward of [`gather`] w.r.t. `params`: scatter-add of `dy` into zeros of `params_shape`
/// (repeated indices accumulate, in index order, so results are deterministic).
pub fn gather_backward(ctx: &ExecCtx, dy: &Tensor, indices: &Tensor, params_shape: &[usize], axis: isize) -> Result<Tensor> {
    let ax = normalize_axis("gather_backward", axis, params_shape.len())?;
    gather_rows_backward(ctx, dy, indices, params_shape, axis, 0, params_shape[ax])
}

/// Backward of [`gather_rows`] w.r.t. this block of rows (`params_shape`, rows
/// `start..start + len` of `total`): indices outside the block contribute nothing.
pub fn gather_rows_backward(
    ctx: &ExecCtx,
    dy: &Tensor,
    indices: &Tensor,
    params_shape: &[usize],
    axis: isize,
    start: usize,
    total: usize,
) -> Result<Tensor> {
    let op = "gather_backward";
    let ax = normalize_axis(op, axis, params_shape.len())?;
    let idx = indices_i64(op, indices)?;
    let v = params_shape[ax];
    check_block(op, start, v, total)?;
    check_indices(op, &idx, total)?;
    let outer: usize = params_shape[..ax].iter().product();
    let inner: usize = params_shape[ax + 1..].iter().product();
    let mut expected = params_shape[..ax].to_vec();
    expected.extend_from_slice(indices.shape());
    expected.extend_from_slice(&params_shape[ax + 1..]);
    super::same_shape(op, &expected, dy.shape(), "output gradient must have gather's output shape")?;
    let n = idx.len();
    float_dispatch!(op, dy.dtype(), T => {
        let g = dy.contiguous();
        let gd = g.shared::<T>()?.as_slice().expect("contiguous");
        let mut out = vec![<T as num_traits::Zero>::zero(); outer * v * inner];
        ctx.for_chunks(&mut out, (v * inner).max(1), |o, chunk| {
            for (j, &i) in idx.iter().enumerate() {
                let Some(row) = (i as usize).checked_sub(start).filter(|&r| r < v) else { continue };
                let s = (o * n + j) * inner;
                let d = row * inner;
                for (c, &x) in chunk[d..d + inner].iter_mut().zip(&gd[s..s + inner]) {
                    *c += x;
                }
            }
        });
        Ok(Tensor::from_array(ArrayD::from_shape_vec(IxDyn(params_shape), out).expect("count")))
    })
}

/// OneHot: `indices` (i32/i64, any shape) to `indices.shape ++ [depth]` of `dtype` with `on` at
/// the index and `off` elsewhere. An index outside `[0, depth)` gives an all-`off` row
/// (MindSpore's behaviour for out-of-range labels); negative indices likewise.
pub fn one_hot(indices: &Tensor, depth: usize, on: f64, off: f64, dtype: DType) -> Result<Tensor> {
    let idx = indices_i64("one_hot", indices)?;
    let mut shape = indices.shape().to_vec();
    shape.push(depth);
    let mut vals = vec![off; idx.len() * depth];
    for (r, &i) in idx.iter().enumerate() {
        if i >= 0 && (i as usize) < depth {
            vals[r * depth + i as usize] = on;
        }
    }
    Tensor::from_vec(&shape, vals).map(|t| t.cast(dtype))
}

/// Broadcasts to `shape` (NumPy rules) into a fresh contiguous tensor.
pub fn broadcast_to(x: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let err = || TensorError::IncompatibleShapes {
        op: "broadcast_to",
        lhs: x.shape().to_vec(),
        rhs: shape.to_vec(),
        reason: "not broadcastable",
    };
    let s = match &x.s {
        Storage::F32(a) => Storage::F32(a.broadcast(IxDyn(shape)).ok_or_else(err)?.to_owned().into_shared()),
        Storage::F64(a) => Storage::F64(a.broadcast(IxDyn(shape)).ok_or_else(err)?.to_owned().into_shared()),
        Storage::F16(a) => Storage::F16(a.broadcast(IxDyn(shape)).ok_or_else(err)?.to_owned().into_shared()),
        Storage::BF16(a) => Storage::BF16(a.broadcast(IxDyn(shape)).ok_or_else(err)?.to_owned().into_shared()),
        Storage::I32(a) => Storage::I32(a.broadcast(IxDyn(shape)).ok_or_else(err)?.to_owned().into_shared()),
        Storage::I64(a) => Storage::I64(a.broadcast(IxDyn(shape)).ok_or_else(err)?.to_owned().into_shared()),
    };
    Ok(Tensor { s })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ar(shape: &[usize]) -> Tensor {
        let n: usize = shape.iter().product();
        Tensor::from_vec(shape, (0..n).map(|i| i as f32).collect()).unwrap()
    }
    fn v(t: &Tensor) -> Vec<f32> {
        t.to_vec::<f32>().unwrap()
    }

    #[test]
    fn reshape_infers_one_dimension_and_shares_storage() {
        let x = ar(&[2, 3, 4]);
        let y = reshape(&x, &[4, -1]).unwrap();
        assert_eq!(y.shape(), &[4, 6]);
        assert!(y.overlaps(&x));
        assert_eq!(v(&y), v(&x));
        assert!(matches!(reshape(&x, &[5, -1]), Err(TensorError::ElementCount { .. })));
        assert!(matches!(reshape(&x, &[-1, -1]), Err(TensorError::InvalidArgument { .. })));
        assert_eq!(flatten(&x).unwrap().shape(), &[2, 12]);
    }

    #[test]
    fn transpose_is_a_view_with_permuted_values() {
        let x = ar(&[2, 3]);
        let y = transpose(&x, &[1, 0]).unwrap();
        assert!(y.overlaps(&x) && !y.is_contiguous());
        assert_eq!(y.shape(), &[3, 2]);
        assert_eq!(v(&y), vec![0., 3., 1., 4., 2., 5.]);
        assert_eq!(inverse_permutation(&[2, 0, 1]), vec![1, 2, 0]);
        assert!(transpose(&x, &[0, 0]).is_err());
        // Reshaping a strided view copies it into row-major order first.
        assert_eq!(v(&reshape(&y, &[6]).unwrap()), vec![0., 3., 1., 4., 2., 5.]);
    }

    #[test]
    fn slice_along_any_dimension_is_zero_copy() {
        let x = ar(&[4, 3, 2]);
        for axis in 0..3 {
            let s = slice_axis(&x, axis, 1, 2).unwrap();
            assert!(s.overlaps(&x), "axis {axis}");
        }
        let s = slice(&x, &[1, 1, 0], &[2, -1, 1]).unwrap();
        assert_eq!(s.shape(), &[2, 2, 1]);
        assert_eq!(v(&s), vec![8., 10., 14., 16.]);
        assert!(slice(&x, &[3, 0, 0], &[2, 1, 1]).is_err());
        assert!(slice_axis(&x, 1, 2, 4).is_err());
    }

    #[test]
    fn slice_backward_places_the_gradient_in_zeros() {
        let dy = Tensor::from_vec(&[1, 2], vec![1f32, 2.]).unwrap();
        assert_eq!(v(&slice_backward(&dy, &[2, 3], &[1, 1]).unwrap()), vec![0., 0., 0., 0., 1., 2.]);
        assert!(slice_backward(&dy, &[2, 3], &[1, 2]).is_err());
    }

    #[test]
    fn concat_of_row_major_inputs_is_ndarrays_concatenate_on_every_axis() {
        for ax in 0..3 {
            let mut shapes = vec![vec![2, 3, 4]; 3];
            shapes[1][ax] = 1;
            shapes[2][ax] = 5;
            let xs: Vec<Tensor> = shapes
                .iter()
                .enumerate()
                .map(|(k, s)| crate::kernels::elementwise::scale(&ExecCtx::serial(), &ar(s), k as f64 + 1.5).unwrap())
                .collect();
            let refs: Vec<&Tensor> = xs.iter().collect();
            let views: Vec<_> = xs.iter().map(|t| t.shared::<f32>().unwrap().view()).collect();
            let want = ndarray::concatenate(Axis(ax), &views).unwrap();
            let got = concat(&refs, ax as isize).unwrap();
            assert_eq!(got.shape(), want.shape(), "axis {ax}");
            assert_eq!(v(&got), want.iter().copied().collect::<Vec<_>>(), "axis {ax}");
            // A strided input takes the element-wise path, with the same result.
            let t = transpose(&transpose(&xs[0], &[2, 1, 0]).unwrap().contiguous(), &[2, 1, 0]).unwrap();
            assert!(!t.is_contiguous());
            assert_eq!(v(&concat(&[&t, &xs[1], &xs[2]], ax as isize).unwrap()), v(&got), "axis {ax}");
        }
    }

    #[test]
    fn concat_joins_and_its_backward_splits_into_views() {
        let a = ar(&[2, 1]);
        let b = ar(&[2, 2]);
        let c = concat(&[&a, &b], 1).unwrap();
        assert_eq!(v(&c), vec![0., 0., 1., 1., 2., 3.]);
        let parts = concat_backward(&c, &[1, 2], 1).unwrap();
        assert_eq!(v(&parts[0]), v(&a));
        assert_eq!(v(&parts[1]), v(&b));
        assert!(parts[1].overlaps(&c));
        assert!(concat(&[&a, &ar(&[3, 1])], 1).is_err());
        assert!(concat(&[], 0).is_err());
        let halves = split(&ar(&[4, 2]), 0, 2).unwrap();
        assert_eq!(v(&halves[1]), vec![4., 5., 6., 7.]);
        assert!(split(&ar(&[3, 2]), 0, 2).is_err());
    }

    #[test]
    fn gather_from_a_split_table_sums_to_the_whole_gather() {
        let cx = ExecCtx::serial();
        let table = ar(&[6, 2]);
        let idx = Tensor::from_vec(&[5], vec![5i64, 0, 3, 3, 1]).unwrap();
        let want = gather(&cx, &table, &idx, 0).unwrap().to_f64_vec();
        let dy = ar(&[5, 2]);
        let want_grad = gather_backward(&cx, &dy, &idx, &[6, 2], 0).unwrap().to_f64_vec();
        let mut sum = vec![0.0; want.len()];
        let mut grads = Vec::new();
        for start in [0, 2, 4] {
            let block = slice(&table, &[start, 0], &[2, 2]).unwrap();
            for (s, g) in sum.iter_mut().zip(gather_rows(&cx, &block, &idx, 0, start, 6).unwrap().to_f64_vec()) {
                *s += g;
            }
            grads.extend(gather_rows_backward(&cx, &dy, &idx, &[2, 2], 0, start, 6).unwrap().to_f64_vec());
        }
        assert_eq!(sum, want);
        assert_eq!(grads, want_grad);
        // Indices are checked against the whole table, blocks against its rows.
        let block = slice(&table, &[4, 0], &[2, 2]).unwrap();
        let far = Tensor::from_vec(&[1], vec![6i64]).unwrap();
        assert!(matches!(gather_rows(&cx, &block, &far, 0, 4, 6), Err(TensorError::IndexOutOfRange { bound: 6, .. })));
        assert!(matches!(gather_rows(&cx, &block, &idx, 0, 5, 6), Err(TensorError::InvalidArgument { name: "rows", .. })));
    }

    #[test]
    fn gather_looks_up_rows_and_scatter_adds_repeats() {
        let cx = ExecCtx::serial();
        let table = ar(&[4, 2]);
        let idx = Tensor::from_vec(&[3], vec![3i64, 0, 3]).unwrap();
        let y = gather(&cx, &table, &idx, 0).unwrap();
        assert_eq!(v(&y), vec![6., 7., 0., 1., 6., 7.]);
        let ones = Tensor::ones(&[3, 2], DType::F32);
        assert_eq!(v(&gather_backward(&cx, &ones, &idx, &[4, 2], 0).unwrap()), vec![1., 1., 0., 0., 0., 0., 2., 2.]);
        let cols = gather(&cx, &table, &Tensor::from_vec(&[1], vec![1i32]).unwrap(), 1).unwrap();
        assert_eq!((cols.shape(), v(&cols)), (&[4usize, 1][..], vec![1., 3., 5., 7.]));
        let e = gather(&cx, &table, &Tensor::from_vec(&[2], vec![0i64, 4]).unwrap(), 0).unwrap_err();
        assert_eq!(e, TensorError::IndexOutOfRange { op: "gather", what: "index", index: 4, position: 1, bound: 4 });
        assert!(matches!(gather(&cx, &table, &table, 0), Err(TensorError::UnsupportedDType { .. })));
    }

    #[test]
    fn one_hot_sets_on_values_and_leaves_out_of_range_rows_off() {
        let idx = Tensor::from_vec(&[3], vec![1i32, 0, 5]).unwrap();
        let y = one_hot(&idx, 3, 1.0, 0.0, DType::F32).unwrap();
        assert_eq!(y.shape(), &[3, 3]);
        assert_eq!(v(&y), vec![0., 1., 0., 1., 0., 0., 0., 0., 0.]);
    }

    #[test]
    fn broadcast_to_expands_size_one_dimensions() {
        let y = broadcast_to(&ar(&[2, 1]), &[2, 3]).unwrap();
        assert_eq!(v(&y), vec![0., 0., 0., 1., 1., 1.]);
        assert!(broadcast_to(&ar(&[2, 2]), &[2, 3]).is_err());
    }
}
