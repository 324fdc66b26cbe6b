//! Dropout with a seeded, counter-based mask: element `i` is kept iff
//! `uniform01(seed, i) >= p`, so a given seed gives the same mask serially, in parallel and on
//! every run. Kept elements are scaled by `1 / (1 - p)` (inverted dropout).

use super::{float_dispatch, map2, same_dtype};
use crate::random::uniform01;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// Dropout forward with drop probability `p` in `[0, 1)`: `(y, mask)`, where `mask` holds 0 or
/// `1/(1-p)` per element (same shape and dtype as `x`).
pub fn dropout(ctx: &ExecCtx, x: &Tensor, p: f64, seed: u64) -> Result<(Tensor, Tensor)> {
    let op = "dropout";
    if !(0.0..1.0).contains(&p) {
        return Err(TensorError::InvalidArgument { op, name: "p", value: p.to_string(), expected: "a drop probability in [0, 1)" });
    }
    float_dispatch!(op, x.dtype(), T => {
        let scale = T::c(1.0 / (1.0 - p));
        let n = x.numel();
        let mut mask = vec![T::zero(); n];
        ctx.for_chunks(&mut mask, 4096, |c, m| {
            for (j, v) in m.iter_mut().enumerate() {
                let i = (c * 4096 + j) as u64;
                *v = if uniform01(seed, i) >= p { scale } else { T::zero() };
            }
        });
        let mask = Tensor::from_vec(x.shape(), mask)?;
        let y = map2(ctx, x.shape(), &x.typed::<T>(op, "input")?, &mask.typed::<T>(op, "mask")?, |a, b| a * b);
        Ok((Tensor::from_array(y), mask))
    })
}

/// Dropout of one block of a larger (sharded) tensor: element `i` of `x` uses the mask value of
/// its position in the full tensor of shape `global_shape`, where `x` starts at `begin`. So
/// every rank of a sharded run draws exactly the mask the unsharded tensor would get.
pub fn dropout_slice(ctx: &ExecCtx, x: &Tensor, p: f64, seed: u64, global_shape: &[usize], begin: &[usize]) -> Result<(Tensor, Tensor)> {
    let op = "dropout";
    if !(0.0..1.0).contains(&p) {
        return Err(TensorError::InvalidArgument { op, name: "p", value: p.to_string(), expected: "a drop probability in [0, 1)" });
    }
    let fits = global_shape.len() == x.rank()
        && begin.len() == x.rank()
        && x.shape().iter().zip(begin).zip(global_shape).all(|((d, b), g)| b.checked_add(*d).is_some_and(|end| end <= *g));
    let fits = fits && global_shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).is_some();
    if !fits {
        return Err(TensorError::BadShape {
            op,
            what: "block",
            shape: x.shape().to_vec(),
            expected: format!("a block at {begin:?} inside the global shape {global_shape:?}"),
        });
    }
    let n = x.rank();
    let mut gstride = vec![1usize; n];
    for d in (0..n.saturating_sub(1)).rev() {
        gstride[d] = gstride[d + 1] * global_shape[d + 1];
    }
    let base: usize = begin.iter().zip(&gstride).map(|(b, s)| b * s).sum();
    let local = x.shape().to_vec();
    let last = local.last().copied().unwrap_or(1).max(1);
    float_dispatch!(op, x.dtype(), T => {
        let scale = T::c(1.0 / (1.0 - p));
        let mut mask = vec![T::zero(); x.numel()];
        // One local row (last axis) per chunk: its global start is computed from the row index.
        ctx.for_chunks(&mut mask, last, |row, m| {
            let (mut r, mut off) = (row, base);
            for d in (0..n.saturating_sub(1)).rev() {
                off += (r % local[d]) * gstride[d];
                r /= local[d];
            }
            for (j, v) in m.iter_mut().enumerate() {
                *v = if uniform01(seed, (off + j) as u64) >= p { scale } else { T::zero() };
            }
        });
        let mask = Tensor::from_vec(x.shape(), mask)?;
        let y = map2(ctx, x.shape(), &x.typed::<T>(op, "input")?, &mask.typed::<T>(op, "mask")?, |a, b| a * b);
        Ok((Tensor::from_array(y), mask))
    })
}

/// Dropout backward: `dy * mask`.
pub fn dropout_backward(ctx: &ExecCtx, dy: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let op = "dropout_backward";
    same_dtype(op, "mask", dy, mask)?;
    super::same_shape(op, dy.shape(), mask.shape(), "mask must have the gradient's shape")?;
    float_dispatch!(op, dy.dtype(), T => {
        Ok(Tensor::from_array(map2(ctx, dy.shape(), &dy.typed::<T>(op, "output gradient")?, &mask.typed::<T>(op, "mask")?, |a, b| a * b)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn dropout_drops_about_p_and_scales_the_rest() {
        let cx = ExecCtx::serial();
        let x = Tensor::ones(&[100, 100], DType::F32);
        let (y, mask) = dropout(&cx, &x, 0.3, 7).unwrap();
        let yv = y.to_vec::<f32>().unwrap();
        let dropped = yv.iter().filter(|&&v| v == 0.).count() as f64 / 1e4;
        assert!((0.28..0.32).contains(&dropped), "dropped {dropped}");
        assert!(yv.iter().all(|&v| v == 0. || (v - 1. / 0.7).abs() < 1e-6));
        assert!(mask.bit_eq(&dropout(&cx, &x, 0.3, 7).unwrap().1), "same seed, same mask");
        assert!(!mask.bit_eq(&dropout(&cx, &x, 0.3, 8).unwrap().1), "other seed, other mask");
        assert!(dropout_backward(&cx, &x, &mask).unwrap().bit_eq(&y));
        assert!(dropout(&cx, &x, 0.0, 1).unwrap().0.bit_eq(&x));
        assert!(matches!(dropout(&cx, &x, 1.0, 1), Err(TensorError::InvalidArgument { name: "p", .. })));
    }

    #[test]
    fn a_block_of_a_sharded_tensor_gets_the_mask_of_the_full_tensor() {
        let cx = ExecCtx::serial();
        let full = crate::random::uniform(&[4, 6, 5], -1., 1., 3, DType::F32);
        let (y, mask) = dropout(&cx, &full, 0.5, 11).unwrap();
        let begin = [1, 2, 1];
        let block = crate::kernels::shape::slice(&full, &begin, &[2, 3, 4]).unwrap();
        let (yb, mb) = dropout_slice(&cx, &block, 0.5, 11, &[4, 6, 5], &begin).unwrap();
        assert!(mb.bit_eq(&crate::kernels::shape::slice(&mask, &begin, &[2, 3, 4]).unwrap().contiguous()));
        assert!(yb.bit_eq(&crate::kernels::shape::slice(&y, &begin, &[2, 3, 4]).unwrap().contiguous()));
        assert!(dropout_slice(&cx, &block, 0.5, 11, &[4, 6, 5], &[3, 0, 0]).is_err());
    }
}
