//! Fused scaled dot-product attention, forward and backward, in blocks of query rows: the
//! `[T, S]` score and probability matrices are never held whole, only `ROWS x S` of them per
//! worker, so memory grows with the sequence, not with its square. The backward pass recomputes
//! each block's probabilities from `q` and `k` (as FlashAttention does) instead of saving them.
//!
//! Layout (grouped-query attention without repeating keys and values): `q [N, KV, G, T, D]` (the
//! `G` query heads of each of the `KV` key/value heads), `k [N, KV, S, D]`, `v [N, KV, S, E]`;
//! the output is `[N, KV, G, T, E]`. With `causal`, query row `t` (position `row_offset + t`)
//! sees keys `0..=row_offset + t` only.

use ndarray::{s, Array2, ArrayView2, ArrayViewMut2};

use super::float_dispatch;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// Query rows per block.
const ROWS: usize = 64;

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Geometry {
    /// Heads: batch x key/value heads (each a `[S, D]` key and `[S, E]` value matrix).
    heads: usize,
    /// Query heads per key/value head.
    g: usize,
    t: usize,
    s: usize,
    d: usize,
    e: usize,
}

fn geometry(op: &'static str, q: &Tensor, k: &Tensor, v: &Tensor) -> Result<Geometry> {
    let bad =
        |what: &'static str, t: &Tensor, expected: String| Err(TensorError::BadShape { op, what, shape: t.shape().to_vec(), expected });
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if qs.len() != 5 {
        return bad("query", q, "[N, KV, G, T, D]".into());
    }
    if ks.len() != 4 || ks[..2] != qs[..2] || ks[3] != qs[4] {
        return bad("key", k, format!("[{}, {}, S, {}] (the query's batch, key/value heads and head size)", qs[0], qs[1], qs[4]));
    }
    if vs.len() != 4 || vs[..3] != ks[..3] {
        return bad("value", v, format!("[{}, {}, {}, E] (the key's batch, heads and length)", ks[0], ks[1], ks[2]));
    }
    super::same_dtype(op, "key", q, k)?;
    super::same_dtype(op, "value", q, v)?;
    Ok(Geometry { heads: qs[0] * qs[1], g: qs[2], t: qs[3], s: ks[2], d: qs[4], e: vs[3] })
}

/// How many keys query rows `first..first + rows` see: all `s`, or causally up to the last row's
/// position.
fn keys_seen(s: usize, rows: usize, causal: Option<usize>) -> usize {
    causal.map_or(s, |first| (first + rows).min(s))
}

/// The probabilities of query rows `q_rows` (`[B, D]`, the first at position `first`) over the
/// first `p.ncols()` keys of `k [S, D]` (all the rows see, [`keys_seen`]), into `p`:
/// `softmax(scale · q kᵀ)` with the causal mask applied.
fn probabilities<T: Float>(
    ctx: &ExecCtx,
    q_rows: ArrayView2<'_, T>,
    k: ArrayView2<'_, T>,
    mut p: ArrayViewMut2<'_, T>,
    scale: T,
    causal: Option<usize>,
) {
    let seen_by_block = p.ncols();
    ctx.gemm_serial(q_rows, k.slice(s![..seen_by_block, ..]).t(), p.view_mut(), false);
    for (r, mut row) in p.rows_mut().into_iter().enumerate() {
        let row = row.as_slice_mut().expect("a fresh row-major block");
        let seen = causal.map_or(row.len(), |first| (first + r + 1).min(row.len()));
        let mut max = T::neg_infinity();
        for x in &mut row[..seen] {
            *x *= scale;
            max = max.max(*x);
        }
        let mut sum = T::zero();
        for x in &mut row[..seen] {
            *x = (*x - max).exp();
            sum += *x;
        }
        let inv = T::one() / sum;
        for x in &mut row[..seen] {
            *x *= inv;
        }
        row[seen..].fill(T::zero());
    }
}

/// Attention of `q [N, KV, G, T, D]` over `k [N, KV, S, D]`, `v [N, KV, S, E]`:
/// `softmax(scale · q kᵀ) v`, causal when asked (query rows at positions `row_offset..`).
pub fn attention(ctx: &ExecCtx, q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool, row_offset: usize) -> Result<Tensor> {
    let op = "attention";
    let geo = geometry(op, q, k, v)?;
    let Geometry { g, t, s, d, e, .. } = geo;
    float_dispatch!(op, q.dtype(), T => {
        let (qc, kc, vc) = (q.contiguous(), k.contiguous(), v.contiguous());
        let (qs, ks, vs) = (qc.shared::<T>()?, kc.shared::<T>()?, vc.shared::<T>()?);
        let (qs, ks, vs) = (qs.as_slice().expect("contiguous"), ks.as_slice().expect("contiguous"), vs.as_slice().expect("contiguous"));
        let mut out = vec![T::zero(); geo.heads * g * t * e];
        // One query head's rows per call: [T, E] of the output.
        ctx.for_chunks(&mut out, (t * e).max(1), |qh, o| {
            let h = qh / g.max(1);
            let qm = ArrayView2::from_shape((t, d), &qs[qh * t * d..][..t * d]).expect("sizes");
            let km = ArrayView2::from_shape((s, d), &ks[h * s * d..][..s * d]).expect("sizes");
            let vm = ArrayView2::from_shape((s, e), &vs[h * s * e..][..s * e]).expect("sizes");
            let mut om = ArrayViewMut2::from_shape((t, e), o).expect("sizes");
            let mut p = Array2::<T>::zeros((ROWS.min(t).max(1), s));
            for t0 in (0..t).step_by(ROWS) {
                let b = ROWS.min(t - t0);
                let first = causal.then_some(row_offset + t0);
                let seen = keys_seen(s, b, first);
                let mut pb = p.slice_mut(s![..b, ..seen]);
                probabilities(ctx, qm.slice(s![t0..t0 + b, ..]), km, pb.view_mut(), T::c(scale), first);
                ctx.gemm_serial(pb.view(), vm.slice(s![..seen, ..]), om.slice_mut(s![t0..t0 + b, ..]), false);
            }
        });
        Tensor::from_vec(&[q.shape()[0], q.shape()[1], g, t, e], out)
    })
}

/// Backward of [`attention`] from the output's gradient `dy [N, KV, G, T, E]`: `(dq, dk, dv)`,
/// each the shape of its input. The probabilities are recomputed block by block.
#[allow(clippy::too_many_arguments)]
pub fn attention_backward(
    ctx: &ExecCtx,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    dy: &Tensor,
    scale: f64,
    causal: bool,
    row_offset: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let op = "attention_backward";
    let geo = geometry(op, q, k, v)?;
    let Geometry { heads, g, t, s, d, e } = geo;
    let out_shape = [q.shape()[0], q.shape()[1], g, t, e];
    super::same_dtype(op, "output gradient", q, dy)?;
    super::same_shape(op, &out_shape, dy.shape(), "the output gradient has the attention output's shape")?;
    float_dispatch!(op, q.dtype(), T => {
        let (qc, kc, vc, dc) = (q.contiguous(), k.contiguous(), v.contiguous(), dy.contiguous());
        let (qs, ks, vs, ds) = (qc.shared::<T>()?, kc.shared::<T>()?, vc.shared::<T>()?, dc.shared::<T>()?);
        let qs = qs.as_slice().expect("contiguous");
        let (ks, vs, ds) = (ks.as_slice().expect("contiguous"), vs.as_slice().expect("contiguous"), ds.as_slice().expect("contiguous"));
        let scale = T::c(scale);
        // Per key/value head: its query heads' dq, and its dk and dv (summed over its query heads).
        let per_head = g * t * d + s * d + s * e;
        let mut grads = vec![T::zero(); heads * per_head];
        ctx.for_chunks(&mut grads, per_head.max(1), |h, out| {
            let (dq, rest) = out.split_at_mut(g * t * d);
            let (dk, dv) = rest.split_at_mut(s * d);
            let km = ArrayView2::from_shape((s, d), &ks[h * s * d..][..s * d]).expect("sizes");
            let vm = ArrayView2::from_shape((s, e), &vs[h * s * e..][..s * e]).expect("sizes");
            let mut dkm = ArrayViewMut2::from_shape((s, d), dk).expect("sizes");
            let mut dvm = ArrayViewMut2::from_shape((s, e), dv).expect("sizes");
            let rows = ROWS.min(t).max(1);
            let (mut p, mut dp) = (Array2::<T>::zeros((rows, s)), Array2::<T>::zeros((rows, s)));
            for gi in 0..g {
                let qh = h * g + gi;
                let qm = ArrayView2::from_shape((t, d), &qs[qh * t * d..][..t * d]).expect("sizes");
                let dym = ArrayView2::from_shape((t, e), &ds[qh * t * e..][..t * e]).expect("sizes");
                let mut dqm = ArrayViewMut2::from_shape((t, d), &mut dq[gi * t * d..][..t * d]).expect("sizes");
                for t0 in (0..t).step_by(ROWS) {
                    let b = ROWS.min(t - t0);
                    let (qb, dyb) = (qm.slice(s![t0..t0 + b, ..]), dym.slice(s![t0..t0 + b, ..]));
                    let first = causal.then_some(row_offset + t0);
                    let seen = keys_seen(s, b, first);
                    let mut pb = p.slice_mut(s![..b, ..seen]);
                    probabilities(ctx, qb, km, pb.view_mut(), scale, first);
                    // Over the keys the block sees: dv += pᵀ dy; dp = dy vᵀ; ds = p (dp - Σ p dp) · scale.
                    ctx.gemm_serial(pb.t(), dyb, dvm.slice_mut(s![..seen, ..]), true);
                    let mut dpb = dp.slice_mut(s![..b, ..seen]);
                    ctx.gemm_serial(dyb, vm.slice(s![..seen, ..]).t(), dpb.view_mut(), false);
                    for (pr, mut dr) in pb.rows().into_iter().zip(dpb.rows_mut()) {
                        let delta: T = pr.iter().zip(dr.iter()).map(|(&a, &b)| a * b).sum();
                        for (x, &pv) in dr.iter_mut().zip(pr.iter()) {
                            *x = pv * (*x - delta) * scale;
                        }
                    }
                    // dq = ds k; dk += dsᵀ q.
                    ctx.gemm_serial(dpb.view(), km.slice(s![..seen, ..]), dqm.slice_mut(s![t0..t0 + b, ..]), false);
                    ctx.gemm_serial(dpb.t(), qb, dkm.slice_mut(s![..seen, ..]), true);
                }
            }
        });
        let mut dq = Vec::with_capacity(heads * g * t * d);
        let mut dk = Vec::with_capacity(heads * s * d);
        let mut dv = Vec::with_capacity(heads * s * e);
        for chunk in grads.chunks(per_head.max(1)).take(heads) {
            dq.extend_from_slice(&chunk[..g * t * d]);
            dk.extend_from_slice(&chunk[g * t * d..][..s * d]);
            dv.extend_from_slice(&chunk[g * t * d + s * d..]);
        }
        Ok((Tensor::from_vec(q.shape(), dq)?, Tensor::from_vec(k.shape(), dk)?, Tensor::from_vec(v.shape(), dv)?))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    /// The unfused reference: scores, mask, softmax and product, one query head at a time.
    fn naive(q: &Tensor, k: &Tensor, v: &Tensor, scale: f64, causal: bool, offset: usize) -> Vec<f64> {
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        let (n, kv, g, t, d, s, e) = (qs[0], qs[1], qs[2], qs[3], qs[4], ks[2], vs[3]);
        let (q, k, v) = (q.to_f64_vec(), k.to_f64_vec(), v.to_f64_vec());
        let mut out = Vec::new();
        for h in 0..n * kv {
            for gi in 0..g {
                for ti in 0..t {
                    let qr = &q[((h * g + gi) * t + ti) * d..][..d];
                    let seen = if causal { (offset + ti + 1).min(s) } else { s };
                    let sc: Vec<f64> =
                        (0..seen).map(|j| scale * qr.iter().zip(&k[(h * s + j) * d..][..d]).map(|(a, b)| a * b).sum::<f64>()).collect();
                    let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let ex: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = ex.iter().sum();
                    for c in 0..e {
                        out.push((0..seen).map(|j| ex[j] / z * v[(h * s + j) * e + c]).sum());
                    }
                }
            }
        }
        out
    }

    fn inputs(shape_q: &[usize], s: usize, e: usize, seed: u64) -> (Tensor, Tensor, Tensor) {
        let (n, kv, d) = (shape_q[0], shape_q[1], shape_q[4]);
        (
            crate::random::uniform(shape_q, -1., 1., seed, DType::F64),
            crate::random::uniform(&[n, kv, s, d], -1., 1., seed + 1, DType::F64),
            crate::random::uniform(&[n, kv, s, e], -1., 1., seed + 2, DType::F64),
        )
    }

    #[test]
    fn attention_equals_the_unfused_computation_causal_or_not_across_row_blocks() {
        for (qshape, s, e, causal, offset) in [
            (vec![2, 2, 3, 5, 4], 5, 3, true, 0),
            (vec![1, 1, 2, 70, 8], 70, 8, true, 0),
            (vec![1, 3, 1, 4, 2], 9, 5, false, 0),
            (vec![1, 1, 1, 3, 2], 8, 2, true, 5),
        ] {
            let (q, k, v) = inputs(&qshape, s, e, 7);
            for ctx in [ExecCtx::serial(), ExecCtx::parallel().with_min_parallel_len(1)] {
                let got = attention(&ctx, &q, &k, &v, 0.7, causal, offset).unwrap();
                let want = naive(&q, &k, &v, 0.7, causal, offset);
                for (a, b) in got.to_f64_vec().iter().zip(&want) {
                    assert!((a - b).abs() < 1e-12, "{qshape:?} causal {causal}: {a} vs {b}");
                }
            }
        }
    }

    #[test]
    fn the_backward_matches_finite_differences_of_the_forward() {
        for (qshape, s, causal, offset) in
            [(vec![1, 2, 2, 3, 2], 3, true, 0), (vec![2, 1, 1, 2, 3], 4, false, 0), (vec![1, 1, 2, 2, 2], 5, true, 2)]
        {
            let (q, k, v) = inputs(&qshape, s, 2, 3);
            let ctx = ExecCtx::serial();
            let y = attention(&ctx, &q, &k, &v, 0.9, causal, offset).unwrap();
            let dy = crate::random::uniform(y.shape(), -1., 1., 11, DType::F64);
            let (dq, dk, dv) = attention_backward(&ctx, &q, &k, &v, &dy, 0.9, causal, offset).unwrap();
            let loss = |q: &Tensor, k: &Tensor, v: &Tensor| -> f64 {
                attention(&ctx, q, k, v, 0.9, causal, offset).unwrap().to_f64_vec().iter().zip(dy.to_f64_vec()).map(|(a, b)| a * b).sum()
            };
            let h = 1e-6;
            for (which, grad) in [(0, &dq), (1, &dk), (2, &dv)] {
                let base = [&q, &k, &v][which];
                let vals = base.to_f64_vec();
                for (i, &g) in grad.to_f64_vec().iter().enumerate() {
                    let bump = |delta: f64| {
                        let mut w = vals.clone();
                        w[i] += delta;
                        let t = Tensor::from_vec(base.shape(), w).unwrap();
                        let mut args = [q.clone(), k.clone(), v.clone()];
                        args[which] = t;
                        loss(&args[0], &args[1], &args[2])
                    };
                    let fd = (bump(h) - bump(-h)) / (2.0 * h);
                    assert!((fd - g).abs() < 1e-6, "input {which}[{i}] of {qshape:?}: {g} vs finite difference {fd}");
                }
            }
        }
    }

    #[test]
    fn mismatched_shapes_are_refused() {
        let ctx = ExecCtx::serial();
        let (q, k, v) = inputs(&[1, 2, 1, 3, 4], 3, 4, 1);
        assert!(attention(&ctx, &q, &k, &Tensor::zeros(&[1, 2, 4, 4], DType::F64), 1.0, false, 0).is_err());
        assert!(attention(&ctx, &q, &Tensor::zeros(&[1, 1, 3, 4], DType::F64), &v, 1.0, false, 0).is_err());
        assert!(attention(&ctx, &k, &k, &v, 1.0, false, 0).is_err());
    }
}
