//! Rotary position embedding (RoPE, as Llama and Hugging Face's `transformers` apply it): the
//! last dimension `D` of `x [..., T, D]` is two halves, and element `i < D/2` of position `p`
//! is rotated with element `i + D/2` by the angle `p · θ^(-2i/D)`:
//!
//! ```text
//! y[i]       = x[i] · cos − x[i + D/2] · sin
//! y[i + D/2] = x[i + D/2] · cos + x[i] · sin
//! ```
//!
//! The rotation is orthogonal, so its backward is the rotation by the opposite angle
//! (`inverse`). Angles are formed as `transformers` forms them, in f32 (`inv_freq = 1 /
//! θ^(2i/D)`, then `p · inv_freq`), and their cosine and sine taken in f64.

use super::float_dispatch;
use crate::{ExecCtx, Float, Result, Tensor, TensorError};

/// The cosine and sine tables, `[positions, D/2]` each, for positions `offset..offset + positions`.
pub fn rotary_tables(positions: usize, offset: usize, dim: usize, theta: f64) -> (Vec<f64>, Vec<f64>) {
    let half = dim / 2;
    let inv_freq: Vec<f32> = (0..half).map(|i| 1.0f32 / (theta as f32).powf((2 * i) as f32 / dim as f32)).collect();
    let mut cos = Vec::with_capacity(positions * half);
    let mut sin = Vec::with_capacity(positions * half);
    for p in offset..offset + positions {
        for &f in &inv_freq {
            let angle = (p as f32 * f) as f64;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    (cos, sin)
}

/// Rotates `x [..., T, D]` (rank >= 2, `D` even) by its positions `offset..offset + T` along
/// dimension -2; `inverse` rotates by the opposite angles (the backward).
pub fn rotary_embedding(ctx: &ExecCtx, x: &Tensor, theta: f64, offset: usize, inverse: bool) -> Result<Tensor> {
    let op = "rotary_embedding";
    let shape = x.shape();
    if shape.len() < 2 || !shape[shape.len() - 1].is_multiple_of(2) {
        return Err(TensorError::BadShape {
            op,
            what: "input",
            shape: shape.to_vec(),
            expected: "rank >= 2 [..., T, D] with D even".into(),
        });
    }
    if theta.is_nan() || theta <= 1.0 {
        return Err(TensorError::InvalidArgument { op, name: "theta", value: theta.to_string(), expected: "a base greater than 1" });
    }
    let (t, d) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let half = d / 2;
    let (cos, sin) = rotary_tables(t, offset, d, theta);
    let sign = if inverse { -1.0 } else { 1.0 };
    float_dispatch!(op, x.dtype(), T => {
        let xc = x.contiguous();
        let xs = xc.shared::<T>()?.as_slice().expect("contiguous");
        let cos: Vec<T> = cos.iter().map(|&c| T::c(c)).collect();
        let sin: Vec<T> = sin.iter().map(|&s| T::c(sign * s)).collect();
        let mut y = vec![T::zero(); xs.len()];
        ctx.for_chunks(&mut y, d.max(1), |row, out| {
            let p = row % t.max(1);
            let (c, s) = (&cos[p * half..][..half], &sin[p * half..][..half]);
            let xr = &xs[row * d..][..d];
            let (x1, x2) = xr.split_at(half);
            let (o1, o2) = out.split_at_mut(half);
            for i in 0..half {
                o1[i] = x1[i] * c[i] - x2[i] * s[i];
                o2[i] = x2[i] * c[i] + x1[i] * s[i];
            }
        });
        Tensor::from_vec(shape, y)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::DType;

    #[test]
    fn the_inverse_rotation_undoes_the_rotation_and_keeps_norms() {
        let x = crate::random::uniform(&[2, 3, 5, 8], -1., 1., 4, DType::F64);
        let ctx = ExecCtx::serial();
        let y = rotary_embedding(&ctx, &x, 10000.0, 3, false).unwrap();
        let back = rotary_embedding(&ctx, &y, 10000.0, 3, true).unwrap();
        for (a, b) in x.to_f64_vec().iter().zip(back.to_f64_vec()) {
            assert!((a - b).abs() < 1e-12);
        }
        let norm = |t: &Tensor| t.to_f64_vec().iter().map(|v| v * v).sum::<f64>();
        assert!((norm(&x) - norm(&y)).abs() < 1e-9);
        assert!(!x.bit_eq(&y));
    }

    #[test]
    fn position_zero_is_unchanged_and_an_offset_continues_the_positions() {
        let x = crate::random::uniform(&[1, 6, 4], -1., 1., 5, DType::F32);
        let ctx = ExecCtx::serial();
        let whole = rotary_embedding(&ctx, &x, 500.0, 0, false).unwrap().to_f64_vec();
        assert_eq!(&whole[..4], &x.to_f64_vec()[..4]);
        let tail = crate::kernels::shape::slice_axis(&x, 1, 2, 6).unwrap();
        let part = rotary_embedding(&ctx, &tail, 500.0, 2, false).unwrap().to_f64_vec();
        assert_eq!(&whole[8..], &part[..]);
    }

    #[test]
    fn odd_widths_and_bad_bases_are_refused() {
        let ctx = ExecCtx::serial();
        assert!(rotary_embedding(&ctx, &Tensor::zeros(&[2, 3], DType::F32), 1e4, 0, false).is_err());
        assert!(rotary_embedding(&ctx, &Tensor::zeros(&[2, 4], DType::F32), 0.5, 0, false).is_err());
    }
}
