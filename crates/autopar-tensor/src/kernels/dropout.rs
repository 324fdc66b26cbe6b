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

/// Dropout backward: `dy * mask`.
pub fn dropout_backward(ctx: &ExecCtx, dy: &Tensor, mask: &Tensor) -> Result<Tensor> {
    let op = "dropout_backward";
    same_dtype(op, "mask", dy, mask)?;
    super::same_shape(op, dy.shape(), mask.shape(), "mask must have the gradient's shape")?;
    float_dispatch!(op, dy.dtype(), T => {
        Ok(Tensor::from_array(map2(ctx, dy.shape(), &dy.typed::<T>(op, "output gradient")?, &mask.typed::<T>(op, "mask")?, |a, b| a * b)))
    })
}
